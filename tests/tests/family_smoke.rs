//! Smoke checks of the lock family on a real single-node Redis.

mod common;

use std::time::Duration;

use common::{Fixture, evalsha_calls};
use lock_runtime::ErrorKind;
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
    let before = evalsha_calls(&mut con);
    let g = locks.lock_all(keys.clone()).await.unwrap();
    assert_eq!(
        evalsha_calls(&mut con) - before,
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
    common::eventually(
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
