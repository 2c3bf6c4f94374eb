//! `extend(d)` on every kind of hold (lock, read, write, permit, multi-key) against real Redis:
//! on a live fixed-lease hold it sets the lease to `d` from now, shorter or longer (the key's
//! PTTL and the guard's validity deadline follow); a watched hold stays watched; on a lost hold
//! (its lease ran out, it was removed on Redis, someone else holds the key now) it is
//! `NotHeld` and changes nothing on Redis.

use std::time::{Duration, Instant};

use crate::common::{Fixture, eventually, lock_key};
use lock_runtime::{
    ErrorKind, LockError, LockGuard, LockService, MultiGuard, OwnerId, Permit, ReadGuard,
    WriteGuard,
};
use lock_tests::harness::unique_key;

const LONG: Duration = Duration::from_secs(30);

/// The kinds of hold `extend` is tried on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Lock,
    Read,
    Write,
    Permit,
    Multi,
}

const CASES: [Case; 5] = [
    Case::Lock,
    Case::Read,
    Case::Write,
    Case::Permit,
    Case::Multi,
];

/// A hold of any kind.
#[derive(Debug)]
enum Hold {
    Lock(LockGuard),
    Read(ReadGuard),
    Write(WriteGuard),
    Permit(Permit),
    Multi(MultiGuard),
}

impl Hold {
    /// Takes a hold of `case` on `key` (for a multi-key hold: `key:1` and `key:2`), with
    /// `lease` or watched.
    async fn take(case: Case, locks: &LockService, key: &str, lease: Option<Duration>) -> Hold {
        let wait = Duration::from_secs(5);
        let hold = match (case, lease) {
            (Case::Lock, Some(l)) => locks.lock(key).lease(l).wait(wait).await.map(Hold::Lock),
            (Case::Lock, None) => locks.lock(key).wait(wait).await.map(Hold::Lock),
            (Case::Read, Some(l)) => locks.read(key).lease(l).wait(wait).await.map(Hold::Read),
            (Case::Read, None) => locks.read(key).wait(wait).await.map(Hold::Read),
            (Case::Write, Some(l)) => locks.write(key).lease(l).wait(wait).await.map(Hold::Write),
            (Case::Write, None) => locks.write(key).wait(wait).await.map(Hold::Write),
            (Case::Permit, l) => {
                let sem = locks.semaphore(key, 2);
                match l {
                    Some(l) => sem.acquire().lease(l).wait(wait).await,
                    None => sem.acquire().wait(wait).await,
                }
                .map(Hold::Permit)
            }
            (Case::Multi, l) => {
                let request = locks.lock_all(multi_keys(key)).wait(wait);
                match l {
                    Some(l) => request.lease(l).await,
                    None => request.await,
                }
                .map(Hold::Multi)
            }
        };
        hold.unwrap_or_else(|e| panic!("{case:?} on {key}: {e}"))
    }

    /// Through a shared reference: `extend` takes `&self` on every kind.
    async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        match self {
            Hold::Lock(g) => g.extend(lease).await,
            Hold::Read(g) => g.extend(lease).await,
            Hold::Write(g) => g.extend(lease).await,
            Hold::Permit(g) => g.extend(lease).await,
            Hold::Multi(g) => g.extend(lease).await,
        }
    }

    fn valid_until(&self) -> Instant {
        match self {
            Hold::Lock(g) => g.valid_until(),
            Hold::Read(g) => g.valid_until(),
            Hold::Write(g) => g.valid_until(),
            Hold::Permit(g) => g.valid_until(),
            Hold::Multi(g) => g.guards().iter().map(LockGuard::valid_until).min().unwrap(),
        }
    }

    fn lease(&self) -> Option<Duration> {
        match self {
            Hold::Lock(g) => g.lease(),
            Hold::Read(g) => g.lease(),
            Hold::Write(g) => g.lease(),
            Hold::Permit(g) => g.lease(),
            Hold::Multi(g) => {
                let leases: Vec<_> = g.guards().iter().map(LockGuard::lease).collect();
                assert!(leases.windows(2).all(|w| w[0] == w[1]), "{leases:?}");
                leases[0]
            }
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Hold::Lock(g) => g.is_lost(),
            Hold::Read(g) => g.is_lost(),
            Hold::Write(g) => g.is_lost(),
            Hold::Permit(g) => g.is_lost(),
            Hold::Multi(g) => g.is_lost(),
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Hold::Lock(g) => g.release().await,
            Hold::Read(g) => g.release().await,
            Hold::Write(g) => g.release().await,
            Hold::Permit(g) => g.release().await,
            Hold::Multi(g) => g.release().await,
        }
    }
}

fn multi_keys(key: &str) -> [String; 2] {
    [format!("{key}:1"), format!("{key}:2")]
}

/// The Redis keys that hold a hold of `case` on `key` (default prefix `lock:`).
fn redis_keys(case: Case, key: &str) -> Vec<String> {
    match case {
        Case::Lock => vec![lock_key(key)],
        Case::Read | Case::Write => vec![format!("lock:rw:{{{key}}}")],
        Case::Permit => vec![format!("lock:sem:{{{key}}}")],
        Case::Multi => multi_keys(key).iter().map(|k| lock_key(k)).collect(),
    }
}

/// The PTTL of `redis_key` in ms, asked of the node serving it (-2: no such key).
fn pttl(fx: &Fixture, redis_key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(redis_key)
        .query(&mut fx.conn_for(redis_key))
        .unwrap()
}

/// Asserts that every key of the hold has a PTTL in `range` (ms).
fn assert_pttl(fx: &Fixture, case: Case, key: &str, range: std::ops::RangeInclusive<i64>) {
    for redis_key in redis_keys(case, key) {
        let ms = pttl(fx, &redis_key);
        assert!(
            range.contains(&ms),
            "{case:?}: PTTL of {redis_key} is {ms} ms, expected {range:?}"
        );
    }
}

fn gone(fx: &Fixture, case: Case, key: &str) -> bool {
    redis_keys(case, key).iter().all(|k| !fx.exists(k))
}

// ---- on every topology ----

/// A fixed lease extended to 1 s (shorter), to 20 s (longer), then to 300 ms, which runs out:
/// each time the key's PTTL is the new lease, and the guard's validity deadline and lease
/// follow; once it ran out, extending is `NotHeld` and creates nothing.
async fn extend_sets_a_fixed_lease_from_now(fx: Fixture) {
    let locks = fx.service(LONG).await;
    for case in CASES {
        let key = unique_key("extend");
        let hold = Hold::take(case, &locks, &key, Some(Duration::from_secs(5))).await;
        assert_pttl(&fx, case, &key, 4000..=5000);
        let taken_until = hold.valid_until();
        for out_of_range in [Duration::ZERO, Duration::from_secs(3651 * 24 * 3600)] {
            let err = hold.extend(out_of_range).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{case:?}: {err}");
        }
        assert_pttl(&fx, case, &key, 4000..=5000);
        assert_eq!(hold.valid_until(), taken_until, "{case:?}");

        hold.extend(Duration::from_secs(1)).await.unwrap();
        let now = Instant::now();
        assert_pttl(&fx, case, &key, 800..=1000);
        assert_eq!(hold.lease(), Some(Duration::from_secs(1)), "{case:?}");
        let until = hold.valid_until();
        assert!(until < taken_until, "{case:?}: the deadline moved back");
        assert!(
            until <= now + Duration::from_secs(1)
                && until + Duration::from_millis(200) > now + Duration::from_secs(1),
            "{case:?}: valid until now + {:?}, extended to 1 s",
            until.saturating_duration_since(now)
        );

        hold.extend(Duration::from_secs(20)).await.unwrap();
        let now = Instant::now();
        assert_pttl(&fx, case, &key, 19_000..=20_000);
        assert_eq!(hold.lease(), Some(Duration::from_secs(20)), "{case:?}");
        let until = hold.valid_until();
        assert!(
            until <= now + Duration::from_secs(20)
                && until + Duration::from_millis(500) > now + Duration::from_secs(20),
            "{case:?}: valid until now + {:?}, extended to 20 s",
            until.saturating_duration_since(now)
        );

        hold.extend(Duration::from_millis(300)).await.unwrap();
        assert_pttl(&fx, case, &key, 1..=300);
        eventually(
            &format!("{case:?}: the 300 ms lease ran out on Redis"),
            Duration::from_secs(3),
            || async { gone(&fx, case, &key) },
        )
        .await;
        assert!(hold.is_lost(), "{case:?}: the guard knows");
        let err = hold.extend(Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld, "{case:?}: {err}");
        assert!(gone(&fx, case, &key), "{case:?}: extend re-created it");
        let err = hold.release().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld, "{case:?}: {err}");
    }
}

/// A watched hold extended to 1 s stays watched: no lease, its key's PTTL is 1 s, and the
/// watchdog (450 ms) keeps it held well past that; released, it is gone.
async fn extend_keeps_a_watched_hold_watched(fx: Fixture) {
    let watchdog = Duration::from_millis(450);
    let locks = fx.service(watchdog).await;
    // every case at once: one window of watching instead of one per case
    let mut holds = Vec::new();
    for case in CASES {
        let key = unique_key("extend-watched");
        let hold = Hold::take(case, &locks, &key, None).await;
        hold.extend(Duration::from_secs(1)).await.unwrap();
        assert_eq!(hold.lease(), None, "{case:?} is still watched");
        assert_pttl(&fx, case, &key, 800..=1000);
        holds.push((case, key, hold));
    }
    let until = Instant::now() + Duration::from_millis(1600);
    while Instant::now() < until {
        for (case, key, hold) in &holds {
            assert!(!hold.is_lost(), "{case:?}");
            assert_pttl(&fx, *case, key, 1..=1000);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (case, key, hold) in holds {
        hold.release().await.unwrap();
        assert!(gone(&fx, case, &key), "{case:?}");
    }
}

topology_tests!(
    extend_sets_a_fixed_lease_from_now,
    extend_keeps_a_watched_hold_watched,
);

// ---- single node ----

/// A hold removed on Redis behind the holder's back (another service's force-unlock, or the
/// key deleted): `extend` finds out, is `NotHeld`, creates nothing, and the guard is lost.
/// For a multi-key hold the other key is still extended.
#[tokio::test]
async fn extending_a_hold_removed_on_redis_is_not_held() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    for case in CASES {
        let key = unique_key("extend-removed");
        let hold = Hold::take(case, &a, &key, Some(LONG)).await;
        let keys = redis_keys(case, &key);
        match case {
            Case::Lock => assert!(b.force_unlock(&key).await.unwrap()),
            _ => {
                let _: i64 = redis::cmd("DEL")
                    .arg(&keys[0])
                    .query(&mut fx.redis())
                    .unwrap();
            }
        }
        assert!(!hold.is_lost(), "{case:?}: not known here yet");
        let err = hold.extend(Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld, "{case:?}: {err}");
        assert!(!fx.exists(&keys[0]), "{case:?}: extend re-created it");
        assert!(hold.is_lost(), "{case:?}: the guard learned it is lost");
        if case == Case::Multi {
            let ms = pttl(&fx, &keys[1]);
            assert!(
                (4000..=5000).contains(&ms),
                "the key still held was extended: PTTL {ms}"
            );
        }
        drop(hold);
    }
}

/// After a force-unlock another service holds the key: the old holder's `extend` is
/// `NotHeld` and leaves the new holder's lease alone, shorter or longer.
#[tokio::test]
async fn extending_a_hold_someone_else_took_over_changes_nothing() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("extend-taken");
    let old = a.lock(&key).lease(LONG).await.unwrap();
    assert!(b.force_unlock(&key).await.unwrap());
    let new = b.lock(&key).lease(Duration::from_secs(10)).await.unwrap();
    for lease in [Duration::from_millis(50), Duration::from_secs(60)] {
        let err = old.extend(lease).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
        let ms = pttl(&fx, &lock_key(&key));
        assert!(
            (9000..=10_000).contains(&ms),
            "the new holder's lease was changed to {ms} ms by the old holder's extend({lease:?})"
        );
    }
    assert_eq!(b.inspect(&key).await.unwrap().fence, Some(new.fence()));
    new.release().await.unwrap();
    drop(old);
}

/// A watched hold extended to a lease shorter than the watchdog's renewal period stays held:
/// the key never runs out on Redis before the watchdog renews it, and the guard never believes
/// it holds a key Redis has let go of.
#[tokio::test]
async fn a_short_extend_of_a_watched_hold_never_lets_it_expire_unnoticed() {
    let fx = Fixture::single().await;
    // renewals every second
    let locks = fx.service(Duration::from_secs(3)).await;
    for case in CASES {
        let key = unique_key("extend-short-watched");
        let hold = Hold::take(case, &locks, &key, None).await;
        hold.extend(Duration::from_millis(100)).await.unwrap();
        assert_eq!(hold.lease(), None, "{case:?} is still watched");
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            let held = !gone(&fx, case, &key);
            assert!(
                held || hold.is_lost(),
                "{case:?}: gone on Redis while the guard believes it holds it (valid for {:?} \
                 more)",
                hold.valid_until().saturating_duration_since(Instant::now())
            );
            assert!(
                held,
                "{case:?}: a watched hold ran out after extend(100 ms)"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        hold.release().await.unwrap();
    }
}

/// An owner that is the same in every process holds a lock in two services under one shared
/// grant. A shorter `extend` in one of them must not cut the key short under the other, which
/// was never told: after the shorter lease a third service is not granted the lock while the
/// other guard says it is valid. Lengthening still works; once the grant is no longer shared,
/// shortening does too.
#[tokio::test]
async fn a_shorter_extend_never_cuts_a_grant_another_process_shares() {
    let fx = Fixture::single().await;
    let (p1, p2, p3) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );
    let key = unique_key("extend-shared");
    let mesh = OwnerId::across_processes(unique_key("op"));
    let lease = Duration::from_secs(10);
    let g1 = p1
        .lock(&key)
        .owner(mesh.clone())
        .lease(lease)
        .await
        .unwrap();
    let g2 = p2
        .lock(&key)
        .owner(mesh.clone())
        .lease(lease)
        .await
        .unwrap();
    assert_eq!(g1.fence(), g2.fence(), "one shared grant");

    let until = g1.valid_until();
    g1.extend(Duration::from_millis(200)).await.unwrap();
    let shortened = g1.valid_until() < until;
    tokio::time::sleep(Duration::from_millis(400)).await;
    match p3.try_lock(&key).await {
        Ok(third) => panic!(
            "a third service was granted the lock (fence {}) while P2's guard is valid for {:?}",
            third.fence(),
            g2.valid_until().saturating_duration_since(Instant::now())
        ),
        Err(e) => assert_eq!(e.kind(), ErrorKind::Timeout, "{e}"),
    }
    assert!(!g2.is_lost());
    assert!(
        !shortened,
        "P1's guard believes in a shorter lease than the key has"
    );
    let ms = pttl(&fx, &lock_key(&key));
    assert!((9000..=10_000).contains(&ms), "PTTL {ms}");

    // lengthening a shared grant works
    g1.extend(Duration::from_secs(20)).await.unwrap();
    let ms = pttl(&fx, &lock_key(&key));
    assert!((19_000..=20_000).contains(&ms), "PTTL {ms}");

    // no longer shared: a shorter lease applies
    g2.release().await.unwrap();
    g1.extend(Duration::from_millis(300)).await.unwrap();
    let ms = pttl(&fx, &lock_key(&key));
    assert!((1..=300).contains(&ms), "PTTL {ms}");
    eventually(
        "the 300 ms lease ran out",
        Duration::from_secs(3),
        || async { !fx.exists(&lock_key(&key)) },
    )
    .await;
    assert!(g1.is_lost());
    let third = p3.lock(&key).wait(Duration::from_secs(1)).await.unwrap();
    third.release().await.unwrap();
}
