//! Introspection on real Redis: `list` finds the locks of every kind (on every cluster master),
//! `inspect_kind` tells their holders with request ids and per-hold leases, and
//! `force_unlock_kind` removes any kind and says what it removed.

use std::time::Duration;

use crate::common::{Fixture, eventually};
use lock_runtime::{ErrorKind, HoldMode, LockKind, LockService, OwnerId, owner};
use lock_tests::harness::{Kind, unique_key};

const SECS: fn(u64) -> Duration = Duration::from_secs;

async fn every_kind_is_listed(fx: &Fixture) {
    let locks = fx.service(SECS(30)).await;
    let other = fx.service(SECS(30)).await;
    let base = unique_key("insp");
    // keys spread over the slots (every master of a cluster), with characters that are
    // escaped on Redis
    let mutexes: Vec<String> = (0..12).map(|i| format!("{base}:m{{{i}}}%")).collect();
    let mut guards = Vec::new();
    for key in &mutexes {
        let g = owner::chain("req-42", async { locks.lock(key).lease(SECS(20)).await })
            .await
            .unwrap();
        guards.push(g);
    }
    let rw = format!("{base}:rw");
    let r1 = owner::chain("req-1", async { locks.read(&rw).lease(SECS(10)).await })
        .await
        .unwrap();
    let r2 = owner::chain("req-2", async { other.read(&rw).lease(SECS(20)).await })
        .await
        .unwrap();
    let sem_name = format!("{base}:sem");
    let sem = other.semaphore(&sem_name, 5);
    let mesh = OwnerId::across_processes("batch-9");
    let p1 = owner::scope(mesh, async { sem.acquire_many(2).await })
        .await
        .unwrap();
    let p2 = owner::chain("req-3", async { sem.acquire().lease(SECS(5)).await })
        .await
        .unwrap();
    // a fence counter outlives its lock: not listed
    let gone = format!("{base}:gone");
    locks.lock(&gone).await.unwrap().release().await.unwrap();

    let list = locks.list(Some(&format!("{base}*"))).await.unwrap();
    assert_eq!(list.len(), 12 + 2, "{list:#?}");
    for (key, guard) in mutexes.iter().zip(&guards) {
        let info = list
            .iter()
            .find(|i| i.kind == LockKind::Mutex && &i.key == key)
            .unwrap_or_else(|| panic!("{key} missing"));
        assert_eq!(
            info.redis_key,
            locks.redis_key(LockKind::Mutex, key).unwrap()
        );
        assert_eq!(
            locks.parse_redis_key(&info.redis_key),
            Some((LockKind::Mutex, key.clone()))
        );
        let [h] = &info.holders[..] else {
            panic!("{info:#?}")
        };
        assert_eq!(h.owner, guard.owner().as_str());
        assert_eq!(h.request_id.as_deref(), Some("req-42"));
        assert!(h.instance.is_some());
        assert_eq!(h.mode, HoldMode::Exclusive);
        assert!(h.lease_left.unwrap() <= SECS(20));
        assert_eq!(info.fence, Some(guard.fence()));
        assert_eq!(info.holder.as_deref(), Some(&*h.field));
    }
    // a narrower pattern
    let one = locks.list(Some(&format!("{base}:m{{3}}*"))).await.unwrap();
    assert_eq!(one.len(), 1, "{one:#?}");
    assert_eq!(one[0].key, mutexes[3]);

    let info = list.iter().find(|i| i.kind == LockKind::ReadWrite).unwrap();
    assert_eq!(info.key, rw);
    assert_eq!(info.hold_count, 2);
    let owners: Vec<_> = info
        .holders
        .iter()
        .map(|h| h.request_id.as_deref())
        .collect();
    assert_eq!(
        owners,
        [Some("req-2"), Some("req-1")],
        "longest lease first"
    );
    assert!(info.holders.iter().all(|h| h.mode == HoldMode::Read));
    assert!(info.holders[0].lease_left > info.holders[1].lease_left);
    assert_ne!(info.holders[0].instance, None);

    let info = list.iter().find(|i| i.kind == LockKind::Semaphore).unwrap();
    assert_eq!(info.key, sem_name);
    assert_eq!(info.permits, Some(5));
    let mesh_hold = info.holders.iter().find(|h| h.instance.is_none()).unwrap();
    assert_eq!(
        (mesh_hold.owner.as_str(), mesh_hold.permits),
        ("batch-9", Some(2))
    );
    assert_eq!(
        mesh_hold.lease_left.map(|l| l > SECS(20)),
        Some(true),
        "the watchdog's"
    );
    let req = info.holders.iter().find(|h| h.instance.is_some()).unwrap();
    assert_eq!(req.request_id.as_deref(), Some("req-3"));
    assert_eq!(req.permits, Some(1));

    // inspect_kind: the same for one key; a kind nobody holds under that key is free
    let one = locks.inspect_kind(LockKind::ReadWrite, &rw).await.unwrap();
    assert_eq!(one.holders.len(), 2);
    let free = locks.inspect_kind(LockKind::Mutex, &rw).await.unwrap();
    assert!(!free.is_held() && free.holder.is_none());
    let gone = locks.inspect_kind(LockKind::Mutex, &gone).await.unwrap();
    assert!(!gone.is_held());
    assert!(gone.last_fence.is_some());

    // force_unlock_kind: removes any kind, says what it removed; holders lose it
    let removed = other
        .force_unlock_kind(LockKind::Semaphore, &sem_name)
        .await
        .unwrap()
        .expect("held");
    assert_eq!(removed.holders.len(), 2);
    tokio::time::timeout(SECS(1), p1.lost())
        .await
        .expect("a holder in the unlocking service learns it at once");
    assert_eq!(sem.available().await.unwrap(), 5);
    assert_eq!(p2.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    drop(p1);

    let removed = locks
        .force_unlock_kind(LockKind::ReadWrite, &rw)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(removed.kind, LockKind::ReadWrite);
    assert_eq!(removed.holders.len(), 2);
    assert_eq!(r1.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    // the other service's reader learns it when its lease runs out or it releases
    assert_eq!(r2.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    assert!(
        locks
            .force_unlock_kind(LockKind::ReadWrite, &rw)
            .await
            .unwrap()
            .is_none()
    );
    // a fresh write grant works after the force-unlock
    let w = locks.write(&rw).try_once().await.unwrap();
    w.release().await.unwrap();

    for (key, guard) in mutexes.iter().zip(guards) {
        assert!(locks.force_unlock(key).await.unwrap());
        assert_eq!(
            guard.release().await.unwrap_err().kind(),
            ErrorKind::NotHeld
        );
    }
    assert!(
        locks
            .list(Some(&format!("{base}*")))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_lists_every_kind() {
    every_kind_is_listed(&Fixture::single().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_lists_every_kind_on_every_master() {
    every_kind_is_listed(&Fixture::shared(Kind::Cluster).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_lists_on_the_current_master() {
    let fx = Fixture::shared(Kind::Sentinel).await;
    let locks = fx.service(SECS(30)).await;
    let key = unique_key("insp-sentinel");
    let g = locks.write(&key).await.unwrap();
    let list = locks.list(Some(&key)).await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].holders[0].mode, HoldMode::Write);
    assert_eq!(list[0].fence, Some(g.fence()));
    g.release().await.unwrap();
}

/// A watched mutex whose holder is in another service: that service learns of the
/// force-unlock at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_from_another_service_is_seen_at_the_next_renewal() {
    let fx = Fixture::single().await;
    let holder: LockService = fx.service(Duration::from_millis(900)).await;
    let operator = fx.service(SECS(30)).await;
    let key = unique_key("insp-renewal");
    let guard = holder.lock(&key).await.unwrap();
    let removed = operator
        .force_unlock_kind(LockKind::Mutex, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(removed.holders[0].owner, guard.owner().as_str());
    assert_eq!(removed.holders[0].request_id, None);
    let lost = tokio::time::timeout(SECS(3), guard.lost()).await.unwrap();
    assert_eq!(lost.kind(), ErrorKind::Lost);
    eventually("nothing listed", SECS(2), || async {
        operator.list(Some(&key)).await.unwrap().is_empty()
    })
    .await;
}
