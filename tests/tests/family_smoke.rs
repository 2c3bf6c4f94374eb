//! Smoke checks of the lock family on a real single-node Redis.

mod common;

use std::time::Duration;

use common::Fixture;
use lock_runtime::ErrorKind;
use lock_tests::harness::unique_key;

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
    let mut w = locks.write(&key).await.unwrap();
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
