//! Releases hand their permits to the waiters of their own service in the same call, without
//! acquire calls, and a service keeps no more than its share of the permits while another
//! service waits.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::{self, Fixture, eventually};
use crate::support::{LONG, permits_on_redis, sem_hash};
use lock_runtime::{LockError, LockKind};
use lock_tests::harness::unique_key;

/// A release hands its permit to the next waiter of its own service in the same call: with 4
/// permits held and 8 waiters in line in that service, the 4 releases get 4 of the waiters
/// holding at once within a second, without a single acquire call (a release that freed the
/// permit would need the waiter's attempt to take it, and only the head of the line asks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_hand_permits_to_the_waiters_of_their_service() {
    let fx = Fixture::single().await;
    let service = fx.service(LONG).await;
    let name = unique_key("sem-hand-off");
    let attempts = common::Monitor::start(
        fx.node_for(&sem_hash(&name)),
        common::acquires_naming(&sem_hash(&name)),
    )
    .await;
    let sem = service.semaphore(&name, 4);
    let mut holders = Vec::new();
    for _ in 0..4 {
        holders.push(sem.acquire().lease(LONG).await.unwrap());
    }
    let inside = Arc::new(AtomicI64::new(0));
    let (done, finished) = tokio::sync::watch::channel(false);
    let mut waiters = Vec::new();
    for _ in 0..8 {
        let (sem, inside, mut finished) = (sem.clone(), inside.clone(), finished.clone());
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire().lease(LONG).wait(LONG).await?;
            inside.fetch_add(1, Ordering::SeqCst);
            let _ = finished.wait_for(|done| *done).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            Ok::<_, LockError>(())
        }));
    }
    drop(finished);
    eventually("8 waiters in line", Duration::from_secs(5), || async {
        let info = service
            .inspect_kind(LockKind::Semaphore, &name)
            .await
            .unwrap();
        info.local_waiters == 8
    })
    .await;
    // the head asked Redis (before and after subscribing), then the line went quiet
    eventually("the line went quiet", Duration::from_secs(5), || async {
        attempts.sync().await;
        let n = attempts.count();
        tokio::time::sleep(Duration::from_millis(200)).await;
        attempts.sync().await;
        n > 0 && attempts.count() == n
    })
    .await;
    let before = attempts.count();
    let released = Instant::now();
    let releases: Vec<_> = holders
        .into_iter()
        .map(|p| tokio::spawn(async move { p.release().await }))
        .collect();
    for release in releases {
        release.await.unwrap().unwrap();
    }
    eventually(
        "4 waiters hold a permit at once",
        Duration::from_secs(1),
        || async { inside.load(Ordering::SeqCst) == 4 },
    )
    .await;
    println!(
        "4 waiters held a permit {:?} after the releases",
        released.elapsed()
    );
    attempts.sync().await;
    assert_eq!(
        attempts.count(),
        before,
        "the permits were handed over by the releases, without acquire calls"
    );
    assert_eq!(permits_on_redis(&fx, &name), 4);
    // the other 4 get theirs as the first 4 release
    done.send_replace(true);
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter got a permit and released it")
            .unwrap()
            .unwrap();
    }
    assert_eq!(sem.available().await.unwrap(), 4);
}

/// A service whose waiters keep taking the permits its releases hand over does not keep them
/// from another service: four tasks of A take turns on 2 permits without a pause, while a
/// waiter of B gets one within a second (A keeps no more than its share while B waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_offs_leave_other_services_their_share() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let name = unique_key("sem-share");
    let stop = Arc::new(AtomicU64::new(0));
    let mut busy = Vec::new();
    for _ in 0..4 {
        let (sem, stop) = (a.semaphore(&name, 2), stop.clone());
        busy.push(tokio::spawn(async move {
            while stop.load(Ordering::SeqCst) == 0 {
                let permit = sem.acquire().lease(LONG).wait(LONG).await?;
                tokio::task::yield_now().await;
                permit.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    eventually("A holds both permits", Duration::from_secs(5), || async {
        a.semaphore(&name, 2).available().await.unwrap() <= 0
    })
    .await;
    let asked = Instant::now();
    let permit = b
        .semaphore(&name, 2)
        .acquire()
        .lease(LONG)
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    let waited = asked.elapsed();
    println!("B got a permit after {waited:?}");
    assert!(
        waited < Duration::from_secs(1),
        "B waited {waited:?} while A handed its permits over"
    );
    stop.store(1, Ordering::SeqCst);
    permit.release().await.unwrap();
    for task in busy {
        task.await.unwrap().unwrap();
    }
}
