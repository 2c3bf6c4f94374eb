//! The same lock semantics on every topology: single node, static master-slave, sentinel and
//! cluster. Each body below runs once per topology (see `topology_tests!` at the end).

mod common;

use std::time::Duration;

use common::{Fixture, Monitor, Worker, acquires_of, eventually, lock_key};
use lock_runtime::{ErrorKind, LockConfig, LockService, OwnerId, owner};
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

/// A waiter of another service sleeps until the release message wakes it. Its only other ways
/// to wake are far off: the lock's lease (30 s, the hint it sleeps on) and its own wait (20 s).
/// The release comes only once the waiter is subscribed (`PUBSUB NUMSUB` / `SHARDNUMSUB` on the
/// node serving the channel) and has made the attempt that follows its subscription (its
/// attempts are seen with `MONITOR`): before that, the attempt could take the turn the release
/// gives it without any message.
async fn a_release_wakes_a_waiter_of_another_service(fx: Fixture) {
    let holder = fx.service(LONG_WATCHDOG).await;
    let waiter = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("wake");
    let channel = format!("{}:ch", lock_key(&key));
    let guard = holder.lock(&key).await.unwrap();
    let attempts = Monitor::start(fx.node_for(&lock_key(&key)), acquires_of(&key)).await;
    let (w, k) = (waiter.clone(), key.clone());
    let waiting = tokio::spawn(async move { w.lock(&k).wait(Duration::from_secs(20)).await });
    eventually(
        "the waiter subscribed to the wake-up channel",
        Duration::from_secs(5),
        || async { fx.subscribers(&channel) == 1 },
    )
    .await;
    // Asleep once it has tried again after subscribing (a release before that attempt could
    // hand it the turn without a message) and then stays quiet. Today a waiter makes a third
    // attempt at once after the second: the line's head starts with a stored wake-up permit.
    eventually(
        "the waiter tried again after subscribing, then went quiet",
        Duration::from_secs(5),
        || async {
            attempts.sync().await;
            let n = attempts.count();
            tokio::time::sleep(Duration::from_millis(200)).await;
            attempts.sync().await;
            n >= 2 && attempts.count() == n
        },
    )
    .await;
    let before = attempts.count();
    assert_eq!(holder.inspect(&key).await.unwrap().waiting_services, 1);
    guard.release().await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the waiter still sleeps 10 s after the release: no wake-up message reached it \
                 (acquire attempts: {:#?})",
                attempts.lines()
            )
        });
    let g = woken.unwrap().unwrap();
    attempts.sync().await;
    assert_eq!(
        attempts.count(),
        before + 1,
        "woken once, the waiter claimed its turn in one attempt: {:#?}",
        attempts.lines()
    );
    g.release().await.unwrap();
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
    common::waiters_in_line(&synced, &key, 1).await;
    guard.release().await.unwrap();
    let handed = next.await.unwrap().unwrap();
    assert!(!handed.is_lost());

    // Replicas stopped: the same hand-off is made on Redis, but nobody acknowledges it, so it
    // must not reach the waiter as a grant.
    let (s, k) = (synced.clone(), key.clone());
    let next = tokio::spawn(async move { s.lock(&k).wait(Duration::from_secs(5)).await });
    common::waiters_in_line(&synced, &key, 1).await;
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

/// One `#[tokio::test]` per body and topology, in a module per topology. `shared` bodies run on
/// the topology the tests of this binary share; `own` bodies on one of their own (they stop
/// processes or count connections).
macro_rules! topology_tests {
    (shared: [$($shared:ident),* $(,)?], own: [$($own:ident),* $(,)?] $(,)?) => {
        topology_tests!(@kind single, Kind::Single, [$($shared),*], [$($own),*]);
        topology_tests!(@kind master_slave, Kind::MasterReplicas, [$($shared),*], [$($own),*]);
        topology_tests!(@kind sentinel, Kind::Sentinel, [$($shared),*], [$($own),*]);
        topology_tests!(@kind cluster, Kind::Cluster, [$($shared),*], [$($own),*]);
    };
    (@kind $module:ident, $kind:expr, [$($shared:ident),*], [$($own:ident),*]) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() {
                    super::$shared(Fixture::shared($kind).await).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $own() {
                    super::$own(Fixture::own($kind.spec()).await).await;
                }
            )*
        }
    };
}

topology_tests!(
    shared: [
        processes_exclude_each_other_on_a_shared_counter,
        an_owner_scope_reenters,
        the_watchdog_renews_until_release,
        a_release_wakes_a_waiter_of_another_service,
        fencing_tokens_strictly_increase,
        the_annotated_path_runs_from_a_config_file,
    ],
    own: [replica_acknowledgements_guard_every_grant],
);
