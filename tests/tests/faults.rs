//! Faults on real topologies of their own: a restarted single server, a killed sentinel master
//! (recovery time, duplicated grants with and without replica acknowledgements, tokens across
//! the failover), a killed cluster master, a killed static master.
//!
//! Figures are printed (`cargo nextest run --test faults --no-capture`), never asserted as
//! timings.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Fixture, eventually};
use lock_runtime::{ErrorKind, LockService};
use lock_tests::harness::{Spec, unique_key};

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

/// What a run of contending clients saw.
#[derive(Debug, Default)]
struct Tally {
    grants: AtomicU64,
    grants_after_kill: AtomicU64,
    errors: AtomicU64,
    duplicates: AtomicU64,
    backwards: AtomicU64,
    recovered_after_ms: AtomicU64,
}

/// Two services x three tasks contend for two keys until `stop`; every critical section checks
/// that nobody else is inside and that tokens grow.
async fn contend(
    services: Vec<LockService>,
    keys: Vec<String>,
    killed: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) {
    let inside: Arc<HashMap<String, AtomicU32>> = Arc::new(
        keys.iter()
            .map(|k| (k.clone(), AtomicU32::new(0)))
            .collect(),
    );
    let max_fence: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for (i, service) in services.iter().enumerate() {
        for t in 0..3 {
            let (service, key) = (service.clone(), keys[(i + t) % keys.len()].clone());
            let (inside, max_fence, killed, stop, tally) = (
                inside.clone(),
                max_fence.clone(),
                killed.clone(),
                stop.clone(),
                tally.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match service
                        .lock(&key)
                        .lease(Duration::from_secs(1))
                        .wait(Duration::from_millis(500))
                        .await
                    {
                        Ok(guard) => {
                            let others = inside[&key].fetch_add(1, Ordering::SeqCst);
                            if others > 0 {
                                tally.duplicates.fetch_add(1, Ordering::SeqCst);
                            } else {
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
                            inside[&key].fetch_sub(1, Ordering::SeqCst);
                            let _ = guard.release().await;
                        }
                        Err(_) => {
                            tally.errors.fetch_add(1, Ordering::SeqCst);
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

async fn kill_the_sentinel_master(sync_replicas: u32) -> Arc<Tally> {
    let fx = Fixture::own(Spec::sentinel()).await;
    let mut config = fx
        .config(LONG_WATCHDOG)
        .with_response_timeout(Duration::from_secs(1));
    if sync_replicas > 0 {
        config = config.with_sync_replicas(sync_replicas, Duration::from_millis(100));
    }
    let services = vec![
        LockService::connect(config.clone()).await.unwrap(),
        LockService::connect(config.clone()).await.unwrap(),
    ];
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
    let old = fx.topo().current_master();
    fx.topo().kill(old);
    *killed.lock().unwrap() = Some(Instant::now());
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
    println!(
        "sentinel failover (master {old} killed, {new} promoted), sync_replicas = {sync_replicas}: \
         first grant {} ms after the kill; grants {} ({} after the kill), errors {}, duplicated grants {}, \
         tokens backwards {}",
        tally.recovered_after_ms.load(Ordering::SeqCst),
        tally.grants.load(Ordering::SeqCst),
        tally.grants_after_kill.load(Ordering::SeqCst),
        tally.errors.load(Ordering::SeqCst),
        tally.duplicates.load(Ordering::SeqCst),
        tally.backwards.load(Ordering::SeqCst),
    );
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_kill_sentinel_master_clients_recover() {
    let tally = kill_the_sentinel_master(0).await;
    assert_eq!(
        tally.backwards.load(Ordering::SeqCst),
        0,
        "tokens never go backwards across the failover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_kill_sentinel_master_with_replica_acknowledgements() {
    let tally = kill_the_sentinel_master(1).await;
    assert_eq!(
        tally.backwards.load(Ordering::SeqCst),
        0,
        "tokens never go backwards across the failover"
    );
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
