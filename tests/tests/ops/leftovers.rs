//! What locks leave on Redis after their last hold: nothing per lock key, for every kind, but the
//! fence counters of their cluster slots (at most one per slot, never expiring); waiting sets
//! expire within seconds.

use std::time::Duration;

use crate::common::Fixture;
use lock_tests::harness::{Spec, unique_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_keys_leave_only_the_fence_counters_of_their_slots() {
    let fx = Fixture::own(Spec::Single).await;
    let ttl = Duration::from_secs(60);
    let config = fx
        .config(Duration::from_secs(30))
        .with_fence_idle_ttl(Some(ttl));
    let locks = lock_runtime::LockService::connect(config.clone())
        .await
        .unwrap();
    let other = lock_runtime::LockService::connect(config).await.unwrap();
    let mut con = fx.redis();
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    let n = 200;
    for i in 0..n {
        let key = unique_key("order");
        match i % 4 {
            0 => locks.lock(&key).await.unwrap().release().await.unwrap(),
            1 => {
                let r = locks.read(&key).await.unwrap();
                locks.write(&key).try_once().await.unwrap_err();
                r.release().await.unwrap();
                locks.write(&key).await.unwrap().release().await.unwrap();
            }
            2 => {
                let sem = locks.semaphore(&key, 2);
                sem.acquire().await.unwrap().release().await.unwrap();
            }
            _ => {
                // a contended key: another service waited for it
                let held = locks.lock(&key).await.unwrap();
                let waiter = {
                    let (other, key) = (other.clone(), key.clone());
                    tokio::spawn(async move { other.lock(&key).await.unwrap().release().await })
                };
                crate::common::eventually(
                    "the other service waits",
                    Duration::from_secs(5),
                    || async { locks.inspect(&key).await.unwrap().waiting_services > 0 },
                )
                .await;
                held.release().await.unwrap();
                waiter.await.unwrap().unwrap();
            }
        }
    }
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let mut counters = 0;
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        if key.starts_with("lock:fence:{") {
            counters += 1;
            assert_eq!(pttl, -1, "{key}: a fence counter never expires");
        } else {
            // a waiting set or turn marker of a contended key, the services' waiting reports:
            // gone within seconds (-2: gone between KEYS and PTTL)
            assert!(
                pttl == -2 || (pttl > 0 && pttl <= 31_000),
                "{key} is left behind (PTTL {pttl} ms)"
            );
        }
    }
    assert!(
        counters <= n,
        "at most one fence counter per slot of the {n} keys, nothing else lasting: {counters}"
    );
}
