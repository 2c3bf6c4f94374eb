//! What an operator sees of a running system on every topology: which instance holds a lock and
//! since when (for every kind), who waits in which service, the journal of force-unlocks and
//! lost holds; and jobs that run once per schedule (`hold_at_least`), kept after their release.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::common::{Fixture, eventually};
use lock_runtime::{HoldMode, JournalKind, LockKind, LockService};
use lock_tests::harness::unique_key;

const SECS: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

async fn named(fx: &Fixture, name: &str, watchdog: Duration) -> LockService {
    LockService::connect(fx.config(watchdog).with_instance_name(name))
        .await
        .expect("connect")
}

async fn who_holds_since_when_and_who_waits(fx: Fixture) {
    // renewed every 200 ms: a renewal must not make a hold look fresh
    let a = named(&fx, "shop-a:101", MS(600)).await;
    let b = named(&fx, "shop-b:202", MS(600)).await;
    let ops = named(&fx, "ops", SECS(30)).await;
    let key = unique_key("who");
    let granted = SystemTime::now();
    let guard = a.lock(&key).await.unwrap();

    // waiting callers: 2 in the holder's own service, 3 in another
    let mut waiting = Vec::new();
    for (service, n) in [(&a, 2), (&b, 3)] {
        for _ in 0..n {
            let (service, key) = (service.clone(), key.clone());
            waiting.push(tokio::spawn(async move {
                drop(service.lock(&key).wait(SECS(20)).await);
            }));
        }
    }
    eventually("both services report their waiters", SECS(10), || async {
        let waiters = ops.inspect(&key).await.unwrap().waiters;
        let count = |name: &str| {
            waiters
                .iter()
                .find(|w| w.instance_name.as_deref() == Some(name))
                .and_then(|w| w.waiting)
        };
        count("shop-a:101") == Some(2) && count("shop-b:202") == Some(3)
    })
    .await;

    eventually("the hold's age passes two renewals", SECS(10), || async {
        let info = ops.inspect(&key).await.unwrap();
        let h = &info.holders[0];
        h.held_for.is_some_and(|d| d >= MS(900))
    })
    .await;
    let info = ops.inspect(&key).await.unwrap();
    let h = &info.holders[0];
    assert_eq!(h.instance_name.as_deref(), Some("shop-a:101"), "{info:#?}");
    assert!(h.field.starts_with("shop-a:101~"), "{info:#?}");
    let at = h.granted_at.expect("a grant time");
    // the server's clock and this machine's are the same clock on loopback
    let off = at.duration_since(granted).unwrap_or_else(|e| e.duration());
    assert!(off < SECS(1), "granted at {at:?}, asked at {granted:?}");

    // every kind says who and since when
    let rw = unique_key("who-rw");
    let read = b.read(&rw).await.unwrap();
    let sem_name = unique_key("who-sem");
    let permit = a.semaphore(&sem_name, 3).acquire().await.unwrap();
    let rw_info = ops.inspect_kind(LockKind::ReadWrite, &rw).await.unwrap();
    let sem_info = ops
        .inspect_kind(LockKind::Semaphore, &sem_name)
        .await
        .unwrap();
    for (info, name, mode) in [
        (&rw_info, "shop-b:202", HoldMode::Read),
        (&sem_info, "shop-a:101", HoldMode::Permits),
    ] {
        let [h] = &info.holders[..] else {
            panic!("{info:#?}")
        };
        assert_eq!((h.instance_name.as_deref(), h.mode), (Some(name), mode));
        assert!(h.granted_at.is_some() && h.held_for.is_some(), "{info:#?}");
    }
    read.release().await.unwrap();
    let write = b.write(&rw).await.unwrap();
    let rw_info = ops.inspect_kind(LockKind::ReadWrite, &rw).await.unwrap();
    assert!(rw_info.holders[0].held_for.is_some(), "{rw_info:#?}");
    write.release().await.unwrap();
    permit.release().await.unwrap();

    // the journal: the operator's force-unlock and the holder's lost hold, told apart
    for task in waiting {
        task.abort();
    }
    assert!(ops.force_unlock(&key).await.unwrap());
    tokio::time::timeout(SECS(10), guard.lost())
        .await
        .expect("the holder learns of the force-unlock");
    eventually("both events are journaled", SECS(10), || async {
        let journal = ops.journal(50).await.unwrap();
        let of = |what: JournalKind| {
            journal
                .iter()
                .find(|e| e.key == key && e.what == what)
                .cloned()
        };
        match (of(JournalKind::ForceUnlocked), of(JournalKind::Lost)) {
            (Some(unlock), Some(lost)) => {
                assert_eq!(unlock.instance_name.as_deref(), Some("ops"), "{unlock:?}");
                assert_eq!(
                    lost.instance_name.as_deref(),
                    Some("shop-a:101"),
                    "{lost:?}"
                );
                assert!(
                    lost.owner
                        .as_deref()
                        .is_some_and(|o| o.starts_with("shop-a:101~")),
                    "{lost:?}"
                );
                assert_eq!(lost.kind, LockKind::Mutex);
                true
            }
            _ => false,
        }
    })
    .await;
    drop(guard);
}

/// Two instances fire the same job 200 ms apart; the job takes 20 ms. With a minimum hold of
/// 2 s the second finds the lock kept and skips: the job runs once.
async fn a_job_fired_200ms_apart_runs_once(fx: Fixture) {
    let a = named(&fx, "worker-a", SECS(30)).await;
    let b = named(&fx, "worker-b", SECS(30)).await;
    let key = unique_key("job");
    let runs = Arc::new(AtomicU32::new(0));
    let fire = |service: LockService, delay: Duration| {
        let (key, runs) = (key.clone(), runs.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await; // the scheduler's offset
            match service.lock(&key).try_once().hold_at_least(SECS(2)).await {
                Ok(guard) => {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(MS(20)).await; // the job
                    let released = Instant::now();
                    guard.release().await.unwrap();
                    Ok((Instant::now() - released, Instant::now()))
                }
                Err(e) if e.is_timeout() => Err(e),
                Err(e) => panic!("{e}"),
            }
        })
    };
    // both instances have been up for a while when the schedule fires (a service's first
    // call connects its script)
    for service in [&a, &b] {
        let warm = unique_key("warm");
        service.lock(&warm).await.unwrap().release().await.unwrap();
    }
    let started = Instant::now();
    let first = fire(a.clone(), Duration::ZERO);
    let second = fire(b.clone(), MS(200));
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{first:?} {second:?}");
    let ran = first.unwrap_or_else(|e| panic!("the first instance did not run the job: {e}"));

    // the release returned at once, and the lock is kept, by nobody, for the rest
    let info = b.inspect(&key).await.unwrap();
    let kept = info.kept.clone().expect("kept after the release");
    assert!(
        info.holders.is_empty() && info.holder.is_none(),
        "{info:#?}"
    );
    assert_eq!(kept.holder.instance_name.as_deref(), Some("worker-a"));
    assert!(kept.left > MS(1000) && kept.left <= SECS(2), "{kept:?}");
    assert!(
        ran.0 < MS(1000),
        "the release held the caller for {:?}",
        ran.0
    );
    assert!(b.is_locked(&key).await.unwrap());
    let listed = b.list(Some(&key)).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert!(listed[0].kept.is_some());

    // the next run of the schedule, after the minimum hold: granted
    let next = b.lock(&key).wait(SECS(10)).await.unwrap();
    assert!(
        started.elapsed() >= SECS(2) - MS(50),
        "granted again {:?} after the first grant",
        started.elapsed()
    );
    next.release().await.unwrap();
    assert!(!b.is_locked(&key).await.unwrap());

    // a kept lock is removed by a force-unlock
    let again = a.lock(&key).hold_at_least(SECS(30)).await.unwrap();
    again.release().await.unwrap();
    assert!(a.is_locked(&key).await.unwrap());
    assert!(
        a.force_unlock(&key).await.unwrap(),
        "the kept lock was removed"
    );
    assert!(!a.is_locked(&key).await.unwrap());
    b.lock(&key)
        .try_once()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A minimum hold beyond the longest lease is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_hold_out_of_range_is_refused() {
    let fx = Fixture::single().await;
    let locks = fx.service(SECS(30)).await;
    let key = unique_key("hold-range");
    for min in [Duration::ZERO, SECS(20 * 365 * 86_400)] {
        let e = locks.lock(&key).hold_at_least(min).await.unwrap_err();
        assert_eq!(e.kind(), lock_runtime::ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("minimum hold"), "{e}");
    }
    assert!(!locks.is_locked(&key).await.unwrap());
}

topology_tests!(
    who_holds_since_when_and_who_waits,
    a_job_fired_200ms_apart_runs_once
);
