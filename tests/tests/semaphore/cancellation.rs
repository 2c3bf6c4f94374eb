//! Cancelled acquires give back what Redis granted them: a caller that gives up while the reply
//! to its acquire is on its way, or while it waits for a release, leaves no permit held.

use std::time::{Duration, Instant};

use crate::common::behind_proxy;
use crate::common::eventually;
use crate::support::{LONG, grants_on_redis, server_ms, waiting_set};
use lock_runtime::{LockKind, LockService};
use lock_tests::harness::unique_key;

/// Cancelled acquires give back what Redis granted them. The acquire's reply is delayed by the
/// proxy (200 ms) and the caller gives up while it is on its way: Redis made the grant (the
/// fence counter moved), and the permits are free again once the reply arrives, not after the
/// 30 s lease. A caller cancelled while it waits takes nothing either, even when a release
/// wakes it at that moment; each new waiter finds its service the only one registered as
/// waiting, also after the grant that the cancelled waiter of the round before got late made
/// the other service wait for the permits it gave back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_give_their_permits_back() {
    // named, so that the waiting set's members (`<instance name>~<id>`) tell who is who
    let (fx, proxy, a) = behind_proxy(|c| {
        c.with_response_timeout(Duration::from_secs(3))
            .with_instance_name("proxied")
    })
    .await;
    let direct = LockService::connect(fx.config(LONG).with_instance_name("direct"))
        .await
        .unwrap();
    let name = unique_key("sem-cancel");
    let fence_key = direct.fence_key(LockKind::Semaphore, &name).unwrap();
    let fence = || -> Option<u64> {
        redis::cmd("GET")
            .arg(&fence_key)
            .query(&mut fx.redis())
            .unwrap()
    };
    let (sa, sd) = (a.semaphore(&name, 2), direct.semaphore(&name, 2));
    // loads the script, so that the cancelled call is the acquire itself
    sa.acquire().await.unwrap().release().await.unwrap();

    proxy.set_latency(Duration::from_millis(200));
    for round in 0..3 {
        let before = fence();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(50),
            sa.acquire_many(2)
                .lease(LONG)
                .wait(Duration::from_secs(5))
                .into_future(),
        )
        .await;
        assert!(cancelled.is_err(), "round {round}: the reply came early");
        eventually(
            "Redis granted the cancelled acquire",
            Duration::from_secs(2),
            || async { fence() > before },
        )
        .await;
        let given_back = Instant::now();
        eventually(
            "the cancelled acquire's permits are given back",
            Duration::from_secs(3),
            || async { sd.available().await.unwrap() == 2 },
        )
        .await;
        println!(
            "round {round}: given back {:?} after Redis granted it",
            given_back.elapsed()
        );
    }
    proxy.heal();

    // cancelled while waiting, at points around a release that would wake it
    for round in 0..8u64 {
        let held = sd.acquire_many(2).lease(LONG).await.unwrap();
        let waiter = {
            let sa = sa.clone();
            tokio::spawn(
                async move { sa.acquire().lease(LONG).wait(Duration::from_secs(10)).await },
            )
        };
        // the proxied service alone: the direct one got its permits, it waits no more (even
        // when a late grant of the cancelled waiter of the round before made it wait)
        let registered = || {
            let set = waiting_set(&fx, &name);
            set.len() == 1 && set[0].0.starts_with("proxied~")
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !registered() {
            if Instant::now() >= deadline {
                let info = a.inspect_kind(LockKind::Semaphore, &name).await.unwrap();
                panic!(
                    "round {round}: the waiter's service is not the one service registered \
                     as waiting within 5 s: waiting set {:?} (member, registered until in \
                     server ms; server time {}), grants {:?}, waiters of the proxied service \
                     here: {}, waiter finished: {}",
                    waiting_set(&fx, &name),
                    server_ms(&fx),
                    grants_on_redis(&fx, &name),
                    info.local_waiters,
                    waiter.is_finished(),
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let release = held.release();
        let cancel = async {
            tokio::time::sleep(Duration::from_millis(round)).await;
            waiter.abort();
        };
        let (released, ()) = tokio::join!(release, cancel);
        released.unwrap();
        let outcome = waiter.await;
        if let Ok(Ok(permit)) = outcome {
            // granted before the abort reached it: it holds, and gives back on release
            permit.release().await.unwrap();
        }
        eventually(
            "nothing is held once the waiter was cancelled",
            Duration::from_secs(3),
            || async { sd.available().await.unwrap() == 2 },
        )
        .await;
    }
}
