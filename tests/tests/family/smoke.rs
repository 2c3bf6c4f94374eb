//! Smoke checks of the lock family on a real single-node Redis.

use std::time::Duration;

use crate::common::{Fixture, script_calls};
use lock_runtime::{ErrorKind, LockError};
use lock_tests::harness::{Spec, unique_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn family_basics() {
    let fx = Fixture::single().await;
    let locks = fx.service(Duration::from_secs(30)).await;
    let key = unique_key("rw");
    let r1 = locks.read(&key).await.unwrap();
    let r2 = locks.read(&key).try_once().await.unwrap();
    let e = locks.write(&key).try_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = locks.write(&key).await.unwrap();
    assert!(locks.read(&key).try_once().await.is_err());
    w.extend(Duration::from_secs(5)).await.unwrap();
    assert_eq!(w.lease(), None);
    w.release().await.unwrap();

    let sem = locks.semaphore(unique_key("sem"), 2);
    let p1 = sem.acquire().await.unwrap();
    let p2 = sem.acquire().lease(Duration::from_secs(5)).await.unwrap();
    assert_eq!(sem.available().await.unwrap(), 0);
    assert!(sem.acquire().try_once().await.is_err());
    p1.release().await.unwrap();
    assert_eq!(sem.available().await.unwrap(), 1);
    p2.release().await.unwrap();

    let (a, b) = (unique_key("acct"), unique_key("acct"));
    let g = locks.lock_all([a.clone(), b.clone()]).await.unwrap();
    assert!(g.fence(&a).is_some());
    assert!(locks.try_lock(&b).await.is_err());
    g.release().await.unwrap();
    assert!(!locks.is_locked(&a).await.unwrap());
}

/// lock_all of keys on one node asks for all of them in one script call, and gives back what it
/// was granted when one is held (then takes them one by one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_all_on_one_node_is_one_script_call() {
    let fx = Fixture::own(Spec::Single).await;
    let locks = fx.service(Duration::from_secs(30)).await;
    let other = fx.service(Duration::from_secs(30)).await;
    let keys: Vec<String> = (0..3).map(|_| unique_key("acct")).collect();
    let mut con = fx.redis();
    // loads the script (the first call of a script on a server goes through NOSCRIPT)
    let warm = locks
        .lock_all([unique_key("warm"), unique_key("warm")])
        .await
        .unwrap();
    warm.release().await.unwrap();
    let before = script_calls(&mut con);
    let g = locks.lock_all(keys.clone()).await.unwrap();
    assert_eq!(
        script_calls(&mut con) - before,
        1,
        "one call grants all three"
    );
    for k in &keys {
        assert!(locks.is_locked(k).await.unwrap());
    }
    g.release().await.unwrap();

    // one key held elsewhere: the others are given back, nothing stays held by the caller
    let held = other.lock(&keys[1]).await.unwrap();
    let e = locks
        .lock_all(keys.clone())
        .wait(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    crate::common::eventually(
        "the other keys are given back",
        Duration::from_secs(5),
        || async {
            !locks.is_locked(&keys[0]).await.unwrap() && !locks.is_locked(&keys[2]).await.unwrap()
        },
    )
    .await;
    held.release().await.unwrap();
    let g = locks.lock_all(keys.clone()).await.unwrap();
    g.release().await.unwrap();
}

/// The lock family's snippets from the crate docs and the README, run as written against a
/// real Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_snippets_run() {
    let fx = Fixture::single().await;
    let locks = fx.service(Duration::from_secs(30)).await;
    let conn = redis::Client::open(fx.topo().url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let secs = Duration::from_secs;
    let (catalog, acct1, acct2, pdf, job, stock) = (
        unique_key("catalog"),
        unique_key("account"),
        unique_key("account"),
        unique_key("pdf-render"),
        unique_key("job:nightly"),
        unique_key("stock"),
    );
    async fn work(fence: u64) -> Result<u64, LockError> {
        Ok(fence)
    }

    // read-write: many readers or one writer
    let r = locks.read(&catalog).wait(secs(2)).await.unwrap(); // shared
    r.release().await.unwrap();
    let w = locks.write(&catalog).lease(secs(5)).await.unwrap(); // exclusive, fenced
    w.extend(secs(10)).await.unwrap();
    w.release().await.unwrap();
    // all-or-nothing over several keys
    let g = locks
        .lock_all([acct1.clone(), acct2.clone()])
        .wait(secs(2))
        .await
        .unwrap();
    assert!(g.fence(&acct1).is_some() && g.fence(&acct2).is_some());
    g.release().await.unwrap();
    // a semaphore with expiring permits
    let sem = locks.semaphore(&pdf, 4);
    let p = sem.acquire().lease(secs(30)).wait(secs(5)).await.unwrap();
    let many = sem.acquire_many(3).try_once().await.unwrap();
    assert_eq!(sem.available().await.unwrap(), 0);
    p.release().await.unwrap();
    many.release().await.unwrap();
    // run a closure under a lock; skip when another instance runs it
    let n = locks
        .lock(&job)
        .try_once()
        .run(|g| async move { work(g.fence()).await })
        .await
        .unwrap();
    assert!(n > 0);
    let busy = locks.lock(&job).await.unwrap();
    let skipped = locks
        .lock(&job)
        .try_once()
        .run(|g| async move { work(g.fence()).await })
        .await
        .unwrap_err();
    assert_eq!(skipped.kind(), ErrorKind::Timeout);
    busy.release().await.unwrap();
    // fenced writes: the store rejects a stale holder
    let old = locks.lock(&stock).lease(secs(5)).await.unwrap();
    let old_fence = old.fence();
    old.release().await.unwrap();
    let guard = locks.lock(&stock).await.unwrap();
    let store = lock_runtime::fenced::RedisValue::new(&conn, "stock:7".to_owned() + &stock);
    store.set(&guard, 41).await.unwrap();
    let stale = store.set(&old_fence, 40).await.unwrap_err();
    assert_eq!(stale.kind(), ErrorKind::Stale, "{stale}");
    assert_eq!(store.get::<u32>().await.unwrap(), Some(41));
    guard.release().await.unwrap();
}
