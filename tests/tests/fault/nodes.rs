//! Faults on real topologies of their own: a restarted single server, a killed sentinel master
//! (recovery time, duplicated grants with and without replica acknowledgements, tokens across
//! the failover), a killed cluster master, a killed static master, a lock's cluster slot moved
//! to another master under a waiter.
//!
//! The `history_*` tests (module `history`) run the history checker under faults, for each
//! kind of the family.

mod figures;
mod history;
mod load;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Fixture, eventually};
use lock_runtime::{ErrorKind, LockService};
use lock_tests::harness::{Spec, Topology, unique_key};
use redis::Commands;

const LONG_WATCHDOG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_of_a_single_server_clients_reconnect_and_tokens_keep_increasing() {
    let fx = Fixture::own(Spec::Single).await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("restart");
    let mut last = 0;
    for _ in 0..5 {
        let g = locks.lock(&key).await.unwrap();
        last = g.fence();
        g.release().await.unwrap();
    }
    let port = fx.topo().master_port();
    fx.topo().kill(port);
    let err = locks
        .lock(&key)
        .wait(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    fx.topo().restart(port).await; // no persistence: the counter is gone with the data
    let restarted = Instant::now();
    let first = AtomicU64::new(0);
    eventually(
        "locks work again after the restart",
        Duration::from_secs(10),
        || async {
            match locks.lock(&key).wait(Duration::from_millis(500)).await {
                Ok(g) => {
                    first.store(g.fence(), Ordering::SeqCst);
                    g.release().await.unwrap();
                    true
                }
                Err(_) => false,
            }
        },
    )
    .await;
    println!(
        "single restart: locks work again {:?} after the server is back",
        restarted.elapsed()
    );
    assert!(
        first.load(Ordering::SeqCst) > last,
        "tokens never go backwards, even with the counter lost"
    );
}

/// The fixed lease of the contending clients of [`kill_the_sentinel_master`].
const CONTEND_LEASE: Duration = Duration::from_secs(1);

/// One critical section of [`contend`]: from when `lock()` returned until the holder asked for
/// the release (or until its validity deadline, [`valid_until`](lock_runtime::LockGuard::valid_until), when that came
/// first or the release failed). The lock was certainly held by this grant throughout, as far
/// as the library promises.
#[derive(Debug, Clone)]
struct Section {
    key: String,
    task: usize,
    fence: u64,
    start: Instant,
    end: Instant,
}

/// What a run of contending clients saw.
#[derive(Debug, Default)]
struct Tally {
    grants: AtomicU64,
    grants_after_kill: AtomicU64,
    backwards: AtomicU64,
    recovered_after_ms: AtomicU64,
    sections: Mutex<Vec<Section>>,
    /// Failed `lock()` calls by kind, before and after the kill.
    errors_before_kill: Mutex<HashMap<ErrorKind, u64>>,
    errors_after_kill: Mutex<HashMap<ErrorKind, u64>>,
}

impl Tally {
    /// Sections of one key that overlap (the second started before the first ended).
    fn overlaps(&self) -> Vec<(Section, Section)> {
        let mut sections = self.sections.lock().unwrap().clone();
        sections.sort_by_key(|s| (s.key.clone(), s.start));
        let mut found = Vec::new();
        let mut latest: HashMap<&str, &Section> = HashMap::new();
        for s in &sections {
            if let Some(before) = latest.get(s.key.as_str())
                && s.start < before.end
            {
                found.push(((*before).clone(), s.clone()));
            }
            let keep = latest.get(s.key.as_str()).is_none_or(|b| b.end < s.end);
            if keep {
                latest.insert(&s.key, s);
            }
        }
        found
    }
}

/// Two services x three tasks contend for two keys until `stop`, with [`CONTEND_LEASE`];
/// records every critical section, checks that tokens grow, and sorts errors by kind.
async fn contend(
    services: Vec<LockService>,
    keys: Vec<String>,
    killed: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) {
    let max_fence: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for (i, service) in services.iter().enumerate() {
        for t in 0..3 {
            let (service, key) = (service.clone(), keys[(i + t) % keys.len()].clone());
            let (max_fence, killed, stop, tally) = (
                max_fence.clone(),
                killed.clone(),
                stop.clone(),
                tally.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match service
                        .lock(&key)
                        .lease(CONTEND_LEASE)
                        .wait(Duration::from_millis(500))
                        .await
                    {
                        Ok(guard) => {
                            let start = Instant::now();
                            {
                                let mut max = max_fence.lock().unwrap();
                                let m = max.entry(key.clone()).or_default();
                                if guard.fence() <= *m {
                                    tally.backwards.fetch_add(1, Ordering::SeqCst);
                                }
                                *m = (*m).max(guard.fence());
                            }
                            tally.grants.fetch_add(1, Ordering::SeqCst);
                            let killed_at = *killed.lock().unwrap();
                            if let Some(at) = killed_at
                                && tally.grants_after_kill.fetch_add(1, Ordering::SeqCst) == 0
                            {
                                let ms = at.elapsed().as_millis() as u64;
                                tally.recovered_after_ms.store(ms, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            let (fence, valid_until) = (guard.fence(), guard.valid_until());
                            let asked = Instant::now();
                            let end = match guard.release().await {
                                Ok(()) => asked.min(valid_until),
                                // not released: held until its lease runs out
                                Err(_) => valid_until,
                            };
                            tally.sections.lock().unwrap().push(Section {
                                key: key.clone(),
                                task: i * 3 + t,
                                fence,
                                start,
                                end,
                            });
                        }
                        Err(e) => {
                            let errors = if killed.lock().unwrap().is_some() {
                                &tally.errors_after_kill
                            } else {
                                &tally.errors_before_kill
                            };
                            *errors.lock().unwrap().entry(e.kind()).or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// `cmdstat_wait` calls of `INFO commandstats` on the node on `port` (0 when none ran).
fn wait_calls(fx: &Fixture, port: u16) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut fx.topo().conn(port))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Kills the sentinel master under the load of [`contend`] and checks what holds for any
/// `sync_replicas`:
///
/// * No two sections of one key overlap. Replication is asynchronous, so a grant the master
///   acknowledged and did not replicate before it died can be granted again by the promoted
///   replica (README, "Replica acknowledgements and failover"), with or without
///   `sync_replicas`. That cannot happen *while the first holder keeps its lease* here: the
///   sentinels promote a replica at the earliest `down-after-milliseconds` (2 s) after the kill,
///   and every hold the dead master granted ran out [`CONTEND_LEASE`] (1 s) after it was sent
///   at the latest. An overlap would be the library granting twice by itself (in-process
///   hand-off, a write to a replica, a stale master). A lease longer than the failover is not
///   protected this way: see the long hold checked by the `sync_replicas = 1` run.
/// * Tokens never go backwards across the failover.
/// * Errors only of the kinds a failover explains: before the kill, timeouts of the contended
///   waits (and `ReplicaSync` with acknowledgements asked for, when no replica answered within
///   the 100 ms); after it also `Backend` (the master is gone, the sentinels still name it).
///   `ReplicaSync` never without `sync_replicas`.
///
/// Returns the tally, the master's `WAIT` calls made by the services before the kill, and
/// whether a lock held across the failover with a long lease (taken before the load, so both
/// replicas had it for a second before the kill) was still held on the new master.
async fn kill_the_sentinel_master(sync_replicas: u32) -> (Arc<Tally>, u64, bool) {
    let fx = Fixture::own(Spec::sentinel()).await;
    let Spec::Sentinel { down_after_ms, .. } = fx.topo().spec() else {
        unreachable!()
    };
    assert!(
        CONTEND_LEASE < Duration::from_millis(down_after_ms),
        "the overlap check relies on leases shorter than the time to a promotion"
    );
    let mut config = fx
        .config(LONG_WATCHDOG)
        .with_response_timeout(Duration::from_secs(1));
    if sync_replicas > 0 {
        config = config.with_sync_replicas(sync_replicas, Duration::from_millis(100));
    }
    let old = fx.topo().current_master();
    let waits_at_start = wait_calls(&fx, old); // the harness's readiness check used WAIT too
    let services = vec![
        LockService::connect(config.clone()).await.unwrap(),
        LockService::connect(config.clone()).await.unwrap(),
    ];
    let long_key = unique_key("failover-long");
    let long = services[0]
        .lock(&long_key)
        .lease(Duration::from_secs(30))
        .await
        .expect("the long hold");
    let keys = vec![unique_key("failover-a"), unique_key("failover-b")];
    let (killed, stop, tally) = (
        Arc::new(Mutex::new(None)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(Tally::default()),
    );
    let run = tokio::spawn(contend(
        services.clone(),
        keys.clone(),
        killed.clone(),
        stop.clone(),
        tally.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waits = wait_calls(&fx, old) - waits_at_start;
    // marked before the SIGKILL: the calls it breaks fail at once, and must count as after it
    *killed.lock().unwrap() = Some(Instant::now());
    fx.topo().kill(old);
    let new = fx
        .topo()
        .wait_for_new_master(old, Duration::from_secs(20))
        .await;
    eventually(
        "clients grant locks again after the failover",
        Duration::from_secs(20),
        || async { tally.grants_after_kill.load(Ordering::SeqCst) >= 20 },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    run.await.unwrap();
    // Still held on the new master: another service cannot take it, and its hash is there.
    let other = services[1]
        .lock(&long_key)
        .wait(Duration::from_millis(300))
        .await;
    let long_survived = match other {
        Ok(_) => false,
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
            true
        }
    };
    assert_eq!(
        long_survived,
        fx.topo()
            .conn(new)
            .exists::<_, bool>(crate::common::lock_key(&long_key))
            .unwrap(),
        "the service and the new master disagree about the long hold"
    );
    assert!(!long.is_lost(), "its 30 s lease has not run out");
    println!(
        "sentinel failover (master {old} killed, {new} promoted), sync_replicas = {sync_replicas}: \
         first grant {} ms after the kill; grants {} ({} after the kill); errors before the kill \
         {:?}, after {:?}; overlapping sections {}; tokens backwards {}; WAIT calls before the \
         kill {waits}; long hold kept across the failover: {long_survived}",
        tally.recovered_after_ms.load(Ordering::SeqCst),
        tally.grants.load(Ordering::SeqCst),
        tally.grants_after_kill.load(Ordering::SeqCst),
        tally.errors_before_kill.lock().unwrap(),
        tally.errors_after_kill.lock().unwrap(),
        tally.overlaps().len(),
        tally.backwards.load(Ordering::SeqCst),
    );

    let overlaps: Vec<String> = tally
        .overlaps()
        .iter()
        .map(|(a, b)| {
            format!(
                "{}: task {} (token {}) held it until {:?} after task {} (token {}) got it",
                a.key,
                a.task,
                a.fence,
                a.end - b.start,
                b.task,
                b.fence
            )
        })
        .collect();
    assert!(overlaps.is_empty(), "a lock granted twice: {overlaps:#?}");
    assert_eq!(
        tally.backwards.load(Ordering::SeqCst),
        0,
        "tokens never go backwards across the failover"
    );
    let mut before: Vec<ErrorKind> = vec![ErrorKind::Timeout];
    let mut after: Vec<ErrorKind> = vec![ErrorKind::Timeout, ErrorKind::Backend];
    if sync_replicas > 0 {
        before.push(ErrorKind::ReplicaSync);
        after.push(ErrorKind::ReplicaSync);
    }
    let unexplained = |seen: &Mutex<HashMap<ErrorKind, u64>>, allowed: &[ErrorKind]| {
        seen.lock()
            .unwrap()
            .keys()
            .filter(|k| !allowed.contains(k))
            .copied()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        unexplained(&tally.errors_before_kill, &before),
        [],
        "errors before the kill: {:?}",
        tally.errors_before_kill.lock().unwrap()
    );
    assert_eq!(
        unexplained(&tally.errors_after_kill, &after),
        [],
        "errors after the kill: {:?}",
        tally.errors_after_kill.lock().unwrap()
    );
    (tally, waits, long_survived)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_kill_sentinel_master_clients_recover() {
    let (tally, waits, _) = kill_the_sentinel_master(0).await;
    assert!(tally.grants.load(Ordering::SeqCst) > 20);
    assert_eq!(waits, 0, "no WAIT without sync_replicas");
    // Whether the long hold survived is not asserted: the grant was acknowledged by the master
    // alone (README: it "can be granted again by the promoted replica").
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_kill_sentinel_master_with_replica_acknowledgements() {
    let (tally, waits, long_survived) = kill_the_sentinel_master(1).await;
    let grants =
        tally.grants.load(Ordering::SeqCst) - tally.grants_after_kill.load(Ordering::SeqCst);
    assert!(
        waits > 0 && grants > 0,
        "every grant is followed by WAIT: {waits} WAIT calls, {grants} grants before the kill"
    );
    // A replica acknowledged the long hold before it was granted, and the sentinels promote
    // the replica with the largest replication offset: the grant cannot be lost, so nobody
    // else can take the lock while its 30 s lease runs.
    assert!(long_survived, "an acknowledged grant survives the failover");
}

/// Moves `slot` from the master on `from` to the master on `to` the way a resharding does
/// (`CLUSTER SETSLOT ... IMPORTING / MIGRATING`, `MIGRATE` of its keys, `SETSLOT ... NODE` on
/// every master). The master that gives the slot up drops the shard-channel subscriptions of
/// the slot (it sends its subscribers `sunsubscribe`).
fn migrate_slot(topo: &Topology, slot: u16, from: u16, to: u16, masters: &[u16]) {
    let id = |port: u16| -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut topo.conn(port))
            .unwrap()
    };
    let (from_id, to_id) = (id(from), id(to));
    let setslot = |port: u16, args: &[&str]| {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query::<()>(&mut topo.conn(port))
            .unwrap();
    };
    setslot(to, &["IMPORTING", &from_id]);
    setslot(from, &["MIGRATING", &to_id]);
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query(&mut topo.conn(from))
        .unwrap();
    if !keys.is_empty() {
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query::<()>(&mut topo.conn(from))
            .unwrap();
    }
    setslot(to, &["NODE", &to_id]);
    setslot(from, &["NODE", &to_id]);
    for &port in masters.iter().filter(|&&p| p != from && p != to) {
        setslot(port, &["NODE", &to_id]);
    }
}

/// A waiter subscribed to its lock's wake-up channel hears the release after the lock's slot
/// moved to another master: the master that gave the slot up dropped the subscription (a shard
/// channel lives with its slot), and the service subscribes again on the new owner. Without that
/// the waiter would sleep until the holder's lease (30 s here) or its own wait ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_a_locks_slot_and_its_waiter_still_hears_the_release() {
    let fx = Fixture::own(Spec::cluster()).await;
    let holder = fx.service(LONG_WATCHDOG).await;
    let waiter = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("migrating");
    let redis_key = crate::common::lock_key(&key);
    let channel = format!("{redis_key}:ch");
    let topo = fx.topo();
    let slot = topo.key_slot(&redis_key);
    let from = topo.master_for_slot(slot);
    let masters: Vec<u16> = topo
        .node_ports()
        .into_iter()
        .filter(|&p| {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut topo.conn(p)).unwrap();
            matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master")
        })
        .collect();
    let to = *masters.iter().find(|&&p| p != from).unwrap();

    let held = holder.lock(&key).await.unwrap();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.lock(&key).wait(Duration::from_secs(20)).await })
    };
    crate::common::waiters_in_line(&waiter, &key, 1).await;
    eventually("the waiter subscribed", Duration::from_secs(5), || async {
        fx.subscribers(&channel) == 1
    })
    .await;

    migrate_slot(topo, slot, from, to, &masters);
    eventually("the slot moved", Duration::from_secs(10), || async {
        topo.master_for_slot(slot) == to
    })
    .await;
    eventually(
        "the waiter subscribed on the new owner",
        Duration::from_secs(10),
        || async { fx.subscribers(&channel) == 1 },
    )
    .await;

    let released = Instant::now();
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap_or_else(|_| {
            panic!("the waiter did not hear the release within 5 s of it (lease 30 s)")
        })
        .unwrap()
        .unwrap();
    println!(
        "the waiter got the lock {:?} after the release",
        released.elapsed()
    );
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_kill_cluster_master_other_slots_keep_working() {
    let fx = Fixture::own(Spec::cluster()).await;
    let locks = LockService::connect(fx.config(LONG_WATCHDOG))
        .await
        .unwrap();
    // one key on the master that dies, one on another master
    let victim_key = unique_key("victim");
    let victim = fx
        .topo()
        .master_for_slot(fx.topo().key_slot(&format!("lock:{{{victim_key}}}")));
    let steady_key = (0..)
        .map(|i| unique_key(&format!("steady{i}")))
        .find(|k| {
            fx.topo()
                .master_for_slot(fx.topo().key_slot(&format!("lock:{{{k}}}")))
                != victim
        })
        .unwrap();
    let g = locks.lock(&victim_key).await.unwrap();
    let before = g.fence();
    g.release().await.unwrap();

    let slot = fx.topo().key_slot(&format!("lock:{{{victim_key}}}"));
    fx.topo().kill(victim);
    let killed = Instant::now();
    let steady_failures = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let steady = {
        let (locks, key, failures, stop) = (
            locks.clone(),
            steady_key.clone(),
            steady_failures.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut grants = 0u64;
            let mut slowest = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                let asked = Instant::now();
                match locks.lock(&key).wait(Duration::from_secs(1)).await {
                    Ok(g) => {
                        slowest = slowest.max(asked.elapsed());
                        grants += 1;
                        let _ = g.release().await;
                    }
                    Err(e) => {
                        println!("steady-slot failure after {:?}: {e}", killed.elapsed());
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (grants, slowest)
        })
    };
    let new = fx
        .topo()
        .wait_for_new_slot_owner(slot, victim, Duration::from_secs(20))
        .await;
    let promoted = killed.elapsed();
    let after = AtomicU64::new(0);
    eventually(
        "the failed-over slot grants locks again",
        Duration::from_secs(20),
        || async {
            match locks
                .lock(&victim_key)
                .wait(Duration::from_millis(500))
                .await
            {
                Ok(g) => {
                    after.store(g.fence(), Ordering::SeqCst);
                    let _ = g.release().await;
                    true
                }
                Err(_) => false,
            }
        },
    )
    .await;
    let recovered = killed.elapsed();
    stop.store(true, Ordering::SeqCst);
    let (steady_grants, slowest) = steady.await.unwrap();
    let failures = steady_failures.load(Ordering::SeqCst);
    println!(
        "cluster failover: master {victim} killed, {new} promoted after {promoted:?}; the slot grants \
         locks again {recovered:?} after the kill; another slot: {steady_grants} grants (slowest {slowest:?}), {failures} failures meanwhile"
    );
    assert!(steady_grants > 0);
    assert_eq!(
        failures, 0,
        "locks on other slots keep working throughout the failover"
    );
    assert!(
        after.load(Ordering::SeqCst) > before,
        "tokens never go backwards across the failover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_of_a_static_master_fails_clearly_and_never_writes_replicas() {
    let fx = Fixture::own(Spec::master_replicas()).await;
    let locks = LockService::connect(
        fx.config(LONG_WATCHDOG)
            .with_response_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let key = unique_key("static");
    locks.lock(&key).await.unwrap().release().await.unwrap();
    fx.topo().kill(fx.topo().master_port());
    let started = Instant::now();
    let err = locks
        .lock(&key)
        .wait(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the response timeout: {:?}",
        started.elapsed()
    );
    // pointing a service at a replica is refused: locks are never written to replicas
    let replica = fx.topo().replica_urls()[0].clone();
    let config = lock_runtime::LockConfig::new(lock_runtime::Topology::MasterSlave {
        master: replica,
        replicas: vec![],
    });
    let err = LockService::connect(config).await.unwrap_err();
    assert!(
        err.is_backend() && err.to_string().contains("not a master"),
        "{err}"
    );
}
