//! The contention load of the at-most-N checks (`permits`, `faults`): tasks of several services
//! acquiring and releasing permits while a sampler reads `available()`, and the checks every
//! such run ends with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{Fixture, eventually};
use crate::support::sem_hash;
use lock_runtime::{ErrorKind, LockError, LockService};
use rand::Rng;

/// What the contending tasks saw.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) sections: AtomicU64,
    /// Permits held by the tasks right now (counted from the grant to just before the release).
    inside: AtomicI64,
    /// The most permits the tasks held at once.
    max_inside: AtomicI64,
    /// Grants after which the tasks held more permits than the semaphore has.
    over: AtomicU64,
    /// The lowest `available()` a sampler saw while the tasks ran.
    min_available: AtomicI64,
    samples: AtomicU64,
    /// (operation, kind, message) of every error the library returned.
    pub(crate) errors: Mutex<Vec<(&'static str, ErrorKind, String)>>,
}

impl Tally {
    fn error(&self, op: &'static str, e: &LockError) {
        self.errors
            .lock()
            .unwrap()
            .push((op, e.kind(), e.to_string()));
    }

    fn errors_by_kind(&self) -> HashMap<(&'static str, ErrorKind), usize> {
        let mut kinds = HashMap::new();
        for (op, kind, _) in self.errors.lock().unwrap().iter() {
            *kinds.entry((*op, *kind)).or_default() += 1;
        }
        kinds
    }
}

/// The load of [`contend`]: every service runs `tasks` tasks of `rounds` rounds each: acquire
/// (every fourth task two permits at once, every second task watched, the others with `lease`),
/// hold for about `work`, release.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    pub(crate) permits: u32,
    pub(crate) tasks: usize,
    pub(crate) rounds: usize,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) work: Duration,
}

/// Runs `load` on the semaphore `name` in every service of `services`, while a sampler asks
/// `sampler` for `available()`; returns what the tasks saw once all are done.
pub(crate) async fn contend(
    services: &[LockService],
    sampler: &LockService,
    name: &str,
    load: Load,
) -> Arc<Tally> {
    let tally = Arc::new(Tally {
        min_available: AtomicI64::new(i64::MAX),
        ..Tally::default()
    });
    let mut tasks = tokio::task::JoinSet::new();
    for service in services {
        for task in 0..load.tasks {
            let (sem, tally) = (service.semaphore(name, load.permits), tally.clone());
            tasks.spawn(async move {
                let count = if task % 4 == 0 { 2 } else { 1 };
                for _ in 0..load.rounds {
                    let mut request = sem.acquire_many(count).wait(load.wait);
                    if task % 2 == 1 {
                        request = request.lease(load.lease);
                    }
                    let permit = match request.await {
                        Ok(p) => p,
                        Err(e) => {
                            tally.error("acquire", &e);
                            continue;
                        }
                    };
                    assert_eq!(permit.count(), count);
                    let now = tally.inside.fetch_add(i64::from(count), Ordering::SeqCst)
                        + i64::from(count);
                    tally.max_inside.fetch_max(now, Ordering::SeqCst);
                    if now > i64::from(load.permits) {
                        tally.over.fetch_add(1, Ordering::SeqCst);
                    }
                    let jitter = rand::rng().random_range(0..=load.work.as_millis() as u64);
                    tokio::time::sleep(load.work / 2 + Duration::from_millis(jitter)).await;
                    tally.inside.fetch_sub(i64::from(count), Ordering::SeqCst);
                    tally.sections.fetch_add(1, Ordering::SeqCst);
                    if let Err(e) = permit.release().await {
                        tally.error("release", &e);
                    }
                }
            });
        }
    }
    let sem = sampler.semaphore(name, load.permits);
    let sampling = async {
        loop {
            if let Ok(free) = sem.available().await {
                tally.min_available.fetch_min(free, Ordering::SeqCst);
                tally.samples.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let run = async {
        while let Some(joined) = tasks.join_next().await {
            joined.expect("a contending task panicked");
        }
    };
    tokio::select! {
        () = run => {}
        () = sampling => unreachable!(),
    }
    tally
}

/// The checks every contention run ends with: never more than N permits held (by the tasks'
/// count and by Redis's own), the limit reached, and every permit free again afterwards.
pub(crate) async fn assert_at_most_n(
    fx: Option<&Fixture>,
    check: &LockService,
    name: &str,
    load: Load,
    t: &Tally,
) {
    let sections = t.sections.load(Ordering::SeqCst);
    println!(
        "{sections} sections ({} tasks per service x {} rounds, 1 or 2 permits each), most \
         permits held at once {} of {}, lowest available() {} in {} samples, errors {:?}",
        load.tasks,
        load.rounds,
        t.max_inside.load(Ordering::SeqCst),
        load.permits,
        t.min_available.load(Ordering::SeqCst),
        t.samples.load(Ordering::SeqCst),
        t.errors_by_kind()
    );
    assert_eq!(
        t.over.load(Ordering::SeqCst),
        0,
        "more than {} permits held at once (most: {})",
        load.permits,
        t.max_inside.load(Ordering::SeqCst)
    );
    assert!(
        t.max_inside.load(Ordering::SeqCst) <= i64::from(load.permits),
        "more than {} permits held",
        load.permits
    );
    assert_eq!(
        t.max_inside.load(Ordering::SeqCst),
        i64::from(load.permits),
        "the load never held all permits at once: it cannot show the limit"
    );
    assert!(t.samples.load(Ordering::SeqCst) > 0);
    assert!(
        t.min_available.load(Ordering::SeqCst) >= 0,
        "Redis counted more permits held than there are"
    );
    let sem = check.semaphore(name, load.permits);
    eventually(
        "every permit is free once the load is over",
        Duration::from_secs(5),
        || async { sem.available().await.unwrap() == i64::from(load.permits) },
    )
    .await;
    if let Some(fx) = fx {
        eventually(
            "the semaphore's hash is gone with its last grant",
            Duration::from_secs(5),
            || async { !fx.exists(&sem_hash(name)) },
        )
        .await;
    }
}
