//! Permits held as long as their lease: a crashed holder's come back when its lease runs out, a
//! stopped holder's watched permit when the watchdog's lease does (its renewal, once it runs
//! again, does not bring it back); a watched permit is renewed while held, and no longer once
//! dropped. The first body runs on every topology (see `topology_tests!` after it).

use std::time::{Duration, Instant};

use crate::common::{self, Fixture, Worker, eventually, script_call};
use crate::support::{LONG, grants_on_redis, sem_hash};
use lock_runtime::ErrorKind;
use lock_tests::harness::unique_key;

// ---- on every topology ----

/// A permit without a lease outlives several watchdog timeouts while it is held, and is free
/// once released.
async fn a_watched_permit_is_renewed_while_held(fx: Fixture) {
    let watchdog = Duration::from_millis(300);
    let a = fx.service(watchdog).await;
    let b = fx.service(LONG).await;
    let name = unique_key("sem-watched");
    let permit = a.semaphore(&name, 2).acquire().await.unwrap();
    assert_eq!(permit.lease(), None);
    let sb = b.semaphore(&name, 2);
    let until = Instant::now() + watchdog * 5;
    while Instant::now() < until {
        assert_eq!(sb.available().await.unwrap(), 1, "still held");
        assert!(!permit.is_lost());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    permit.release().await.unwrap();
    assert_eq!(sb.available().await.unwrap(), 2);
}

topology_tests!(a_watched_permit_is_renewed_while_held);

// ---- single node ----

/// A holder process crashes (SIGKILL) holding 2 of 3 permits with a 1.5 s lease, next to a
/// permit held for 30 s (so the semaphore's hash outlives the crashed grant): they stay held
/// until the lease runs out, then a waiter of another process gets them, woken by the lease
/// running out rather than by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permits_come_back_with_their_lease() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG).await;
    let name = unique_key("sem-crash");
    let lease = Duration::from_millis(1500);
    let sem = locks.semaphore(&name, 3);
    let long = sem.acquire().lease(LONG).await.unwrap();
    let mut worker = Worker::spawn(&[
        &fx.topo().url(),
        "permit",
        &name,
        "3",
        "2",
        &lease.as_millis().to_string(),
    ]);
    let line = worker.line(Duration::from_secs(30)).await;
    let held_at = Instant::now();
    assert!(line.starts_with("held "), "{line}");
    worker.kill().await;
    assert_eq!(
        sem.available().await.unwrap(),
        0,
        "the crashed holder's permits"
    );
    let err = sem.acquire().try_once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    let both = sem
        .acquire_many(2)
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    let after = held_at.elapsed();
    println!("the crashed holder's permits came back {after:?} after it printed its grant");
    assert!(
        after + Duration::from_millis(100) >= lease,
        "granted {after:?} after the crashed holder's grant, before its lease of {lease:?}"
    );
    assert!(
        after < lease + Duration::from_secs(1),
        "granted only {after:?} after a grant with a lease of {lease:?}"
    );
    both.release().await.unwrap();
    assert_eq!(sem.available().await.unwrap(), 2);
    long.release().await.unwrap();
}

/// SIGSTOPs a process until dropped (SIGCONT).
struct Paused(libc::pid_t);

impl Paused {
    fn pause(pid: u32) -> Paused {
        let pid = libc::pid_t::try_from(pid).unwrap();
        // SAFETY: signals a child process of this test by its pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: signals a child process of this test by its pid.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A holder process with a watched permit (watchdog 1 s) keeps it for several watchdog
/// timeouts while it runs; stopped (SIGSTOP), it keeps it only until the last renewal's lease
/// runs out; continued, its renewal does not bring the permit back. The other of the 2
/// permits is held for 30 s, so the semaphore's hash outlives the stopped holder's grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holders_watched_permit_comes_back_with_the_watchdog_lease() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG).await;
    let name = unique_key("sem-stopped");
    let watchdog = Duration::from_millis(1000);
    let sem = locks.semaphore(&name, 2);
    let long = sem.acquire().lease(LONG).await.unwrap();
    let mut worker = Worker::spawn(&[
        &fx.topo().url(),
        "permit",
        &name,
        "2",
        "1",
        "0",
        &watchdog.as_millis().to_string(),
    ]);
    let line = worker.line(Duration::from_secs(30)).await;
    assert!(line.starts_with("held "), "{line}");
    let until = Instant::now() + watchdog * 5 / 2;
    while Instant::now() < until {
        assert_eq!(sem.available().await.unwrap(), 0, "renewed while running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let paused = Paused::pause(worker.pid());
    let stopped = Instant::now();
    let permit = sem.acquire().wait(Duration::from_secs(10)).await.unwrap();
    let after = stopped.elapsed();
    println!("the stopped holder's permit came back {after:?} after SIGSTOP");
    assert!(
        after < watchdog + Duration::from_millis(500),
        "granted {after:?} after the holder stopped renewing (watchdog {watchdog:?})"
    );
    drop(paused);
    // the continued holder renews, finds its grant gone, and must not take the permit back
    let until = Instant::now() + watchdog;
    while Instant::now() < until {
        assert!(!permit.is_lost());
        assert_eq!(
            grants_on_redis(&fx, &name).len(),
            2,
            "the long one and the new one"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    permit.release().await.unwrap();
    let until = Instant::now() + watchdog;
    while Instant::now() < until {
        assert_eq!(sem.available().await.unwrap(), 1, "re-created by a renewal");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(worker.is_running());
    long.release().await.unwrap();
}

/// A watched permit is renewed (one renewal call naming it every third of the watchdog
/// timeout) while held; dropped, it is released and never renewed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_is_no_longer_renewed() {
    let fx = Fixture::single().await;
    let watchdog = Duration::from_millis(300);
    let a = fx.service(watchdog).await;
    let name = unique_key("sem-drop");
    let hash = sem_hash(&name);
    let renewals = common::Monitor::start(fx.node_for(&hash), {
        let quoted = format!("\"{hash}\"");
        // a renewal names the hash alone; acquires and releases name its fence counter too
        move |line: &str| script_call(line) && line.contains(&quoted) && !line.contains(":fence:{")
    })
    .await;
    let sem = a.semaphore(&name, 2);
    let permit = sem.acquire().await.unwrap();
    eventually("three renewals", Duration::from_secs(3), || async {
        renewals.count() >= 3
    })
    .await;
    assert_eq!(sem.available().await.unwrap(), 1);
    drop(permit);
    eventually(
        "the dropped permit is released",
        Duration::from_secs(2),
        || async { sem.available().await.unwrap() == 2 },
    )
    .await;
    renewals.sync().await;
    let seen = renewals.count();
    tokio::time::sleep(watchdog * 3).await;
    renewals.sync().await;
    assert_eq!(
        renewals.count(),
        seen,
        "renewed after it was dropped: {:#?}",
        renewals.lines()
    );
    assert!(!fx.exists(&hash));
}
