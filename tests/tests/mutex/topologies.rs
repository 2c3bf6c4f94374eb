//! The same lock semantics on every topology: single node, static master-slave, sentinel and
//! cluster. Each body below runs once per topology (see `topology_tests!` at the end).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::{Fixture, Monitor, Worker, eventually, lock_key, script_call, waiters_in_line};
use lock_runtime::{ErrorKind, LockConfig, LockKind, LockService, OwnerId, owner};
use lock_tests::harness::{Kind, unique_key};

const WATCHDOG: Duration = Duration::from_millis(300);
const LONG_WATCHDOG: Duration = Duration::from_secs(30);

async fn processes_exclude_each_other_on_a_shared_counter(fx: Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let config = fx.config_file(dir.path(), LONG_WATCHDOG, "");
    let config = config.to_str().unwrap();
    let (key, counter) = (unique_key("proc"), unique_key("counter"));
    let workers: Vec<Worker> = (0..3)
        .map(|_| Worker::spawn(&[config, "counter", &key, &counter, "40"]))
        .collect();
    for mut w in workers {
        assert_eq!(w.line(Duration::from_secs(60)).await, "done");
        assert!(w.success(Duration::from_secs(10)).await);
    }
    assert_eq!(
        fx.raw().await.get(&counter).await,
        Some(3 * 40),
        "lost updates: two holders at once"
    );
}

async fn an_owner_scope_reenters(fx: Fixture) {
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("reentry");
    let (outer, inner) = owner::scope(OwnerId::new(), async {
        let outer = locks.lock(&key).await.unwrap();
        let inner = locks
            .lock(&key)
            .wait(Duration::from_millis(200))
            .await
            .unwrap();
        (outer, inner)
    })
    .await;
    assert_eq!(inner.fence(), outer.fence());
    assert_eq!(locks.inspect(&key).await.unwrap().hold_count, 2);
    assert_eq!(
        locks.try_lock(&key).await.unwrap_err().kind(),
        ErrorKind::Timeout
    );
    inner.release().await.unwrap();
    assert!(locks.is_locked(&key).await.unwrap());
    outer.release().await.unwrap();
    assert!(!locks.is_locked(&key).await.unwrap());
}

async fn the_watchdog_renews_until_release(fx: Fixture) {
    let locks = fx.service(WATCHDOG).await;
    let keys: Vec<String> = (0..5)
        .map(|i| unique_key(&format!("watchdog{i}")))
        .collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(locks.lock(key).await.unwrap());
    }
    tokio::time::sleep(WATCHDOG * 4).await;
    for (key, guard) in keys.iter().zip(&guards) {
        assert!(
            locks.is_locked(key).await.unwrap(),
            "{key} renewed (one batch per slot)"
        );
        assert!(!guard.is_lost());
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    for key in &keys {
        assert!(!locks.is_locked(key).await.unwrap());
    }
}

async fn fencing_tokens_strictly_increase(fx: Fixture) {
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("fence");
    let mut tokens = Vec::new();
    for round in 0..3 {
        let g = a.lock(&key).await.unwrap();
        tokens.push(g.fence());
        g.release().await.unwrap();
        // rounds 0 and 2 wait for a lease to run out, round 1 for an operator's force_unlock
        let lease = if round == 1 {
            LONG_WATCHDOG
        } else {
            Duration::from_millis(50)
        };
        let g = b.lock(&key).lease(lease).await.unwrap();
        tokens.push(g.fence());
        if round == 1 {
            assert!(b.force_unlock(&key).await.unwrap());
        }
        let g2 = a.lock(&key).wait(Duration::from_secs(2)).await.unwrap();
        tokens.push(g2.fence());
        g2.release().await.unwrap();
        drop(g);
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

async fn the_annotated_path_runs_from_a_config_file(fx: Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let config = fx.config_file(dir.path(), LONG_WATCHDOG, "");
    let key = unique_key("annotated");
    let mut worker = Worker::spawn(&[config.to_str().unwrap(), "annotated", &key]);
    let line = worker.line(Duration::from_secs(30)).await;
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields[0], "ok", "{line}");
    assert!(
        fields[1].parse::<u64>().unwrap() > 0,
        "a fencing token inside the body: {line}"
    );
    assert_eq!(
        fields[2], "2",
        "the nested annotated call re-entered: {line}"
    );
    assert!(worker.success(Duration::from_secs(10)).await);
    let locks = fx.service(LONG_WATCHDOG).await;
    assert!(
        !locks.is_locked(&format!("order:{key}")).await.unwrap(),
        "released after the call"
    );
}

/// With `sync_replicas`, every grant is followed by `WAIT`, a hand-off to a waiter of the same
/// service included. Runs on a topology of its own: it stops the replicas.
async fn replica_acknowledgements_guard_every_grant(fx: Fixture) {
    let replicas = match fx.kind() {
        Kind::Single => {
            let err = LockService::connect(
                fx.config(LONG_WATCHDOG)
                    .with_sync_replicas(1, Duration::from_millis(100)),
            )
            .await
            .unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::Config,
                "single mode has no replicas: {err}"
            );
            return;
        }
        Kind::Cluster => 1,
        _ => 2,
    };
    let synced: LockService = LockService::connect(
        fx.config(LONG_WATCHDOG)
            .with_sync_replicas(replicas, Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let key = unique_key("synced");

    // Replicas running: a hand-off is delivered to the waiter as a grant.
    let guard = synced.lock(&key).await.unwrap();
    let (s, k) = (synced.clone(), key.clone());
    let next = tokio::spawn(async move { s.lock(&k).wait(Duration::from_secs(5)).await });
    crate::common::waiters_in_line(&synced, &key, 1).await;
    guard.release().await.unwrap();
    let handed = next.await.unwrap().unwrap();
    assert!(!handed.is_lost());

    // Replicas stopped: the same hand-off is made on Redis, but nobody acknowledges it, so it
    // must not reach the waiter as a grant.
    let (s, k) = (synced.clone(), key.clone());
    let next = tokio::spawn(async move { s.lock(&k).wait(Duration::from_secs(5)).await });
    crate::common::waiters_in_line(&synced, &key, 1).await;
    let stopped = fx.stop(&fx.topo().replica_ports());
    handed.release().await.unwrap();
    match next.await.unwrap() {
        Ok(guard) => panic!(
            "a hand-off no replica acknowledged was delivered as a grant (fence {})",
            guard.fence()
        ),
        // the hand-off was given back and the waiter's own attempt was not acknowledged either
        Err(e) => assert_eq!(e.kind(), ErrorKind::ReplicaSync, "{e}"),
    }
    eventually(
        "the unacknowledged hand-off was given back",
        Duration::from_secs(3),
        || async { !synced.is_locked(&key).await.unwrap() },
    )
    .await;
    drop(stopped);

    // more replicas than exist: every grant is given back with a distinct error
    let config: LockConfig = fx
        .config(LONG_WATCHDOG)
        .with_sync_replicas(replicas + 3, Duration::from_millis(100));
    let impossible = LockService::connect(config).await.unwrap();
    let err = impossible
        .lock(&key)
        .wait(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ReplicaSync, "{err}");
    eventually(
        "the unacknowledged grant was given back",
        Duration::from_secs(2),
        || async { !synced.is_locked(&key).await.unwrap() },
    )
    .await;
}

/// A release after the lease ran out is `NotHeld`, never a silent success, and it leaves the
/// next holder's grant alone.
async fn a_release_after_expiry_is_not_held(fx: Fixture) {
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("expired");
    let lease = Duration::from_millis(200);
    let guard = a.lock(&key).lease(lease).await.unwrap();
    eventually(
        "the lease ran out on Redis",
        Duration::from_secs(3),
        || async { !b.is_locked(&key).await.unwrap() },
    )
    .await;
    let err = guard.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");

    // the same after another service took the lock
    let guard = a.lock(&key).lease(lease).await.unwrap();
    let other = b.lock(&key).wait(Duration::from_secs(3)).await.unwrap();
    assert!(other.fence() > guard.fence());
    let err = guard.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let info = b.inspect(&key).await.unwrap();
    assert_eq!(
        info.fence,
        Some(other.fence()),
        "the late release freed the new grant"
    );
    other.release().await.unwrap();
    assert!(!b.is_locked(&key).await.unwrap());
}

/// `lost()` fires when a fixed lease runs out - not before the lease (less the 1% + 2 ms drift
/// margin) counted from before the grant was asked for - and the guard is then `NotHeld` while
/// another service holds the lock. (That it fires before another service's grant is measured
/// with a partitioned holder in `fault/safety.rs`.)
async fn lost_fires_when_the_lease_runs_out(fx: Fixture) {
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("lost");
    let lease = Duration::from_millis(400);
    let asked = Instant::now();
    let guard = a.lock(&key).lease(lease).await.unwrap();
    assert!(!guard.is_lost());
    let why = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fired");
    let fired = asked.elapsed();
    let margin = lease / 100 + Duration::from_millis(2);
    assert!(
        fired >= lease - margin,
        "lost() fired {fired:?} after the grant was asked for, lease {lease:?}"
    );
    assert_eq!(why.kind(), ErrorKind::Lost);
    assert!(why.to_string().contains(&key), "{why}");
    assert!(guard.is_lost());
    let other = b.lock(&key).wait(Duration::from_secs(3)).await.unwrap();
    assert!(other.fence() > guard.fence());
    assert_eq!(
        guard.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    other.release().await.unwrap();
}

/// A cancelled acquire leaves the lock free: a waiter dropped while it waits, and waiters
/// cancelled at varying moments around the release that may hand them the lock (a grant that
/// reaches a cancelled acquire is given back). The lock has a 30 s lease: only a give-back frees
/// it within the 2 s each check waits.
async fn a_cancelled_acquire_leaves_the_lock_free(fx: Fixture) {
    let holder = fx.service(LONG_WATCHDOG).await;
    let other = fx.service(LONG_WATCHDOG).await;
    let check = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("cancel");

    let guard = holder.lock(&key).await.unwrap();
    for service in [&holder, &other] {
        let (l, k) = (service.clone(), key.clone());
        let waiter = tokio::spawn(async move { l.lock(&k).await });
        waiters_in_line(service, &key, 1).await;
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        waiters_in_line(service, &key, 0).await;
    }
    // a service whose last waiter left stops counting as waiting (its `leave` call may still
    // be on its way when its line is empty)
    eventually(
        "no service counts as waiting",
        Duration::from_secs(5),
        || async { check.inspect(&key).await.unwrap().waiting_services == 0 },
    )
    .await;
    guard.release().await.unwrap();
    let g = check.try_lock(&key).await.unwrap();
    g.release().await.unwrap();

    for round in 0u64..60 {
        let guard = holder.lock(&key).await.unwrap();
        let service = if round % 2 == 0 { &holder } else { &other };
        let (l, k) = (service.clone(), key.clone());
        let cancel_after = Duration::from_micros(round * 397 % 3_000);
        let waiter = tokio::spawn(async move {
            tokio::time::timeout(cancel_after, l.lock(&k))
                .await
                .ok()
                .map(Result::unwrap)
        });
        tokio::time::sleep(Duration::from_micros(round * 211 % 2_000)).await;
        guard.release().await.unwrap();
        if let Some(g) = waiter.await.unwrap() {
            g.release().await.unwrap();
        }
        match check.lock(&key).wait(Duration::from_secs(2)).await {
            Ok(g) => g.release().await.unwrap(),
            Err(e) => panic!("round {round}: a cancelled acquire kept the lock: {e}"),
        }
    }
}

/// An empty key is `InvalidKey` for every call, and nothing is written.
async fn an_empty_key_is_invalid(fx: Fixture) {
    let locks = fx.service(LONG_WATCHDOG).await;
    let kinds = [
        locks.lock("").await.map(drop),
        locks.try_lock("").await.map(drop),
        locks.lock("").run_nested(|_| async {}).await,
        locks.is_locked("").await.map(drop),
        locks.inspect("").await.map(drop),
        locks.force_unlock("").await.map(drop),
        locks.is_held_by_current("").await.map(drop),
    ]
    .map(|r| r.unwrap_err().kind());
    assert_eq!(kinds, [ErrorKind::InvalidKey; 7]);
    assert!(!fx.exists(&lock_key("")), "an empty key wrote a lock");
}

/// After a lock is released nothing of it is left on Redis but its fence counter: no lock hash,
/// no waiting set, no turn marker - also after other services waited (one gave up), turns were
/// given and claimed and a hand-off happened. Asked of the node serving the lock.
async fn only_the_fence_counter_outlives_a_released_lock(fx: Fixture) {
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let c = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("leftovers");
    let lock = lock_key(&key);
    let (fence, queue, turn) = (
        a.fence_key(LockKind::Mutex, &key).unwrap(),
        format!("{lock}:wq"),
        format!("{lock}:turn"),
    );
    let held = a.lock(&key).await.unwrap();
    let waiter = |s: &LockService| {
        let (s, k) = (s.clone(), key.clone());
        tokio::spawn(async move {
            let g = s.lock(&k).wait(Duration::from_secs(10)).await.unwrap();
            g.release().await.unwrap();
        })
    };
    let b_waits = waiter(&b);
    let a_waits = waiter(&a);
    waiters_in_line(&b, &key, 1).await;
    waiters_in_line(&a, &key, 1).await;
    let gave_up = c.lock(&key).wait(Duration::from_millis(200)).await;
    assert_eq!(gave_up.unwrap_err().kind(), ErrorKind::Timeout);
    assert!(fx.exists(&lock) && fx.exists(&queue), "held and waited for");
    held.release().await.unwrap();
    b_waits.await.unwrap();
    a_waits.await.unwrap();
    eventually(
        "nothing but the fence counter left",
        Duration::from_secs(3),
        || async { !fx.exists(&lock) && !fx.exists(&queue) && !fx.exists(&turn) },
    )
    .await;
    assert!(
        fx.exists(&fence),
        "the fence counter of the slot outlives the lock"
    );
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{lock}*"))
        .query(&mut fx.conn_for(&lock))
        .unwrap();
    assert!(left.is_empty(), "nothing is left per lock key: {left:?}");
}

/// Counts the clients of every process of the topology by id (`CLIENT LIST`), without the
/// connection asking.
fn clients(fx: &Fixture) -> HashMap<u16, HashMap<String, HashMap<String, String>>> {
    fx.topo()
        .ports()
        .into_iter()
        .map(|port| {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query(&mut fx.topo().conn(port))
                .unwrap();
            let clients = list
                .lines()
                .map(|line| {
                    line.split(' ')
                        .filter_map(|f| f.split_once('='))
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect::<HashMap<_, _>>()
                })
                // not this connection, nor the sentinels' own (they find each other as time goes)
                .filter(|c| c["cmd"] != "client|list" && !c["name"].starts_with("sentinel-"))
                .map(|c| (c["id"].clone(), c))
                .collect();
            (port, clients)
        })
        .collect()
}

/// `n` keys whose locks share one cluster slot (so a cluster renews them in one call as well).
fn keys_in_one_slot(prefix: &str, n: usize) -> Vec<String> {
    use redis::cluster_routing::Slot;
    let base = unique_key(prefix);
    let slot = Slot::for_key(lock_key(&base));
    let mut keys = vec![base.clone()];
    let mut i = 0u64;
    while keys.len() < n {
        i += 1;
        let key = format!("{base}:{i}");
        if Slot::for_key(lock_key(&key)) == slot {
            keys.push(key);
        }
    }
    keys
}

/// One service keeps a fixed set of connections however many locks it holds and waits for: one
/// subscriber connection for all its wake-up channels (per node serving them in a cluster) and
/// one watchdog, which renews all the locks it holds in one call per period (per slot in a
/// cluster). Connections a service opens, counted with `CLIENT LIST` on every process:
///
/// | mode | connections |
/// |---|---|
/// | single | 2 to the server: commands, subscriber |
/// | master-slave | 2 to the master (commands, subscriber), none to the replicas |
/// | sentinel | 2 to the master (commands, subscriber), 1 to each sentinel, none to the replicas |
/// | cluster | 2 to each master (commands, subscriber); none or a few to replicas, for commands the cluster client sends to every node (`SCRIPT LOAD`), never to subscribe |
///
/// Runs on a topology of its own: other tests' connections would be counted.
async fn one_subscriber_connection_and_one_watchdog_per_service(fx: Fixture) {
    let helper = fx.service(LONG_WATCHDOG).await;
    let waited: Vec<String> = (0..8).map(|i| unique_key(&format!("waited{i}"))).collect();
    let mut helper_guards = Vec::new();
    for key in &waited {
        helper_guards.push(helper.lock(key).await.unwrap());
    }
    let before = clients(&fx);

    let locks = fx.service(WATCHDOG).await;
    let held = keys_in_one_slot("held", 8);
    let mut guards = Vec::new();
    for key in &held {
        guards.push(locks.lock(key).await.unwrap());
    }
    let mut waiters = Vec::new();
    for key in &waited {
        let (l, k) = (locks.clone(), key.clone());
        waiters.push(tokio::spawn(async move {
            l.lock(&k).wait(Duration::from_secs(20)).await
        }));
    }
    for key in &waited {
        let channel = format!("{}:ch", lock_key(key));
        eventually(
            &format!("subscribed to {channel}"),
            Duration::from_secs(5),
            || async { fx.subscribers(&channel) == 1 },
        )
        .await;
    }
    let after = clients(&fx);

    let masters: Vec<u16> = match fx.kind() {
        Kind::Cluster => {
            let mut m: Vec<u16> = fx
                .topo()
                .node_ports()
                .into_iter()
                .filter(|&p| !fx.topo().replica_ports().contains(&p))
                .collect();
            m.sort_unstable();
            m
        }
        _ => vec![fx.topo().master_port()],
    };
    let mut subscriptions = 0;
    let mut report = Vec::new();
    for port in fx.topo().ports() {
        let new: Vec<&HashMap<String, String>> = after[&port]
            .iter()
            .filter(|(id, _)| !before[&port].contains_key(*id))
            .map(|(_, c)| c)
            .collect();
        report.push(format!("{port}: {new:#?}"));
        let subscribers: Vec<_> = new
            .iter()
            .filter(|c| c["sub"] != "0" || c["ssub"] != "0")
            .collect();
        assert!(
            subscribers.len() <= 1,
            "port {port}: one subscriber connection per node: {new:#?}"
        );
        subscriptions += subscribers
            .iter()
            .map(|c| c["sub"].parse::<usize>().unwrap() + c["ssub"].parse::<usize>().unwrap())
            .sum::<usize>();
        let expected = if masters.contains(&port) {
            2
        } else if fx.topo().sentinel_ports().contains(&port) {
            1
        } else {
            0
        };
        if fx.kind() == Kind::Cluster && expected == 0 {
            // the cluster client sends some commands (`SCRIPT LOAD`) to every node, replicas
            // included, and may connect to them for that
            assert!(
                new.len() <= 2 && subscribers.is_empty(),
                "connections of one service on replica {port}: {new:#?}"
            );
            continue;
        }
        assert_eq!(
            new.len(),
            expected,
            "connections of one service on port {port} ({:?}): {new:#?}",
            fx.kind()
        );
    }
    assert_eq!(subscriptions, waited.len(), "{report:#?}");

    // The watchdog renews the held locks (one slot) in one call naming them all, every period.
    let renewals = Monitor::start(fx.node_for(&lock_key(&held[0])), {
        let first = format!("\"{}\"", lock_key(&held[0]));
        move |line: &str| script_call(line) && line.contains(&first) && !line.contains(":fence:{")
    })
    .await;
    eventually("three renewal rounds", Duration::from_secs(5), || async {
        renewals.count() >= 3
    })
    .await;
    for line in renewals.lines() {
        for key in &held {
            assert!(
                line.contains(&format!("\"{}\"", lock_key(key))),
                "a renewal call without {key}: {line}"
            );
        }
    }
    for g in guards {
        g.release().await.unwrap();
    }
    drop(helper_guards);
    for w in waiters {
        w.await.unwrap().unwrap().release().await.unwrap();
    }
}

topology_tests!(
    shared: [
        processes_exclude_each_other_on_a_shared_counter,
        an_owner_scope_reenters,
        the_watchdog_renews_until_release,
        fencing_tokens_strictly_increase,
        the_annotated_path_runs_from_a_config_file,
        a_release_after_expiry_is_not_held,
        lost_fires_when_the_lease_runs_out,
        a_cancelled_acquire_leaves_the_lock_free,
        an_empty_key_is_invalid,
        only_the_fence_counter_outlives_a_released_lock,
    ],
    own: [
        replica_acknowledgements_guard_every_grant,
        one_subscriber_connection_and_one_watchdog_per_service,
    ],
);
