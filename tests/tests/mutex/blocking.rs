//! `lock_runtime::blocking` from plain threads (no runtime of the caller's): threads exclude
//! each other, a thread re-enters its own hold, `try_once` gives up at once, a dropped guard
//! releases, the family works, and a call from async code is refused instead of stalling it.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::Fixture;
use lock_runtime::ErrorKind;
use lock_runtime::blocking::LockService;
use lock_tests::harness::unique_key;

/// A fixture started on a runtime of its own, and a blocking service on it; the calling thread
/// runs no runtime afterwards.
fn setup() -> (tokio::runtime::Runtime, Fixture, LockService) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fx = rt.block_on(Fixture::single());
    let locks = LockService::connect(fx.config(Duration::from_secs(30))).unwrap();
    (rt, fx, locks)
}

#[test]
fn threads_exclude_each_other_and_a_thread_re_enters_its_own_hold() {
    let (_rt, fx, locks) = setup();
    let (key, counter) = (unique_key("blocking"), unique_key("counter"));
    let client = redis::Client::open(fx.topo().url()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (locks, key, counter, client) =
                (locks.clone(), key.clone(), counter.clone(), client.clone());
            thread::spawn(move || {
                let mut con = client.get_connection().unwrap();
                for _ in 0..25 {
                    let guard = locks.lock(&key).acquire().unwrap();
                    let n: i64 = redis::cmd("GET")
                        .arg(&counter)
                        .query::<Option<i64>>(&mut con)
                        .unwrap()
                        .unwrap_or(0);
                    thread::yield_now();
                    redis::cmd("SET")
                        .arg(&counter)
                        .arg(n + 1)
                        .query::<()>(&mut con)
                        .unwrap();
                    guard.release().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut con = client.get_connection().unwrap();
    let n: i64 = redis::cmd("GET").arg(&counter).query(&mut con).unwrap();
    assert_eq!(
        n, 100,
        "increments were lost: two threads held the lock at once"
    );

    // this thread re-enters its hold; another thread cannot have it meanwhile
    let outer = locks.lock(&key).acquire().unwrap();
    let inner = locks.lock(&key).try_once().acquire().unwrap();
    assert_eq!(inner.fence(), outer.fence());
    assert_eq!(locks.inspect(&key).unwrap().hold_count, 2);
    let other = {
        let (locks, key) = (locks.clone(), key.clone());
        thread::spawn(move || {
            let started = Instant::now();
            let err = locks.lock(&key).try_once().acquire().unwrap_err();
            (err.kind(), started.elapsed())
        })
        .join()
        .unwrap()
    };
    assert_eq!(other.0, ErrorKind::Timeout);
    assert!(
        other.1 < Duration::from_secs(1),
        "try_once waited {:?}",
        other.1
    );
    inner.release().unwrap();
    assert!(locks.is_locked(&key).unwrap(), "the outer hold remains");
    // a dropped guard releases in the background
    drop(outer);
    let deadline = Instant::now() + Duration::from_secs(5);
    while locks.is_locked(&key).unwrap() {
        assert!(
            Instant::now() < deadline,
            "the dropped guard was not released"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_family_works_and_async_code_is_refused() {
    let (rt, fx, locks) = setup();
    let key = unique_key("blocking-family");
    let (r1, r2) = (
        locks.read(&key).acquire().unwrap(),
        locks.read(&key).acquire().unwrap(),
    );
    let write = {
        let (locks, key) = (locks.clone(), key.clone());
        thread::spawn(move || locks.write(&key).try_once().acquire().map(drop))
            .join()
            .unwrap()
    };
    assert_eq!(write.unwrap_err().kind(), ErrorKind::Timeout);
    r1.release().unwrap();
    r2.release().unwrap();
    let w = locks
        .write(&key)
        .lease(Duration::from_secs(5))
        .acquire()
        .unwrap();
    w.extend(Duration::from_secs(10)).unwrap();
    assert!(w.valid_until() > Instant::now() + Duration::from_secs(5));
    w.release().unwrap();

    let sem = locks.semaphore(unique_key("blocking-sem"), 2);
    let both = sem.acquire_many(2).acquire().unwrap();
    let sem_other = Arc::new(sem.clone());
    let third = thread::spawn(move || sem_other.acquire().try_once().acquire().map(drop))
        .join()
        .unwrap();
    assert_eq!(third.unwrap_err().kind(), ErrorKind::Timeout);
    both.release().unwrap();
    assert_eq!(sem.available().unwrap(), 2);

    // from a thread that runs a tokio runtime: refused at once, not a stalled runtime
    let err = rt
        .block_on(async { locks.lock(&key).acquire().map(drop) })
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("async"), "{err}");
    // the global service, from sync code: not set up yet, then the one `init` set up
    let err = LockService::global().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotInitialized, "{err}");
    rt.block_on(lock_runtime::init(fx.config(Duration::from_secs(30))))
        .unwrap();
    let global = LockService::global().unwrap();
    global.lock(&key).acquire().unwrap().release().unwrap();
}
