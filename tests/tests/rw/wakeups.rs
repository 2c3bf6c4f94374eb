//! Wake-ups: a write release wakes every waiting reader, or one writer head per service - not
//! everyone; a reader kept out by a waiting writer sleeps until it is woken instead of asking
//! Redis again and again; a reader that waits longer than its service stays registered as
//! waiting is still woken by the release. The first body runs on every topology (see
//! `topology_tests!` at the end).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Fixture, Monitor, eventually, script_call};
use crate::support::{
    LONG, Room, WAIT, ends_up_free, granted, rw_key, spawn_read, spawn_write, waiting_key,
    writers_key, zcard,
};
use lock_tests::harness::unique_key;

// ---------------------------------------------------------------------------------------------
// On every topology
// ---------------------------------------------------------------------------------------------

/// The acquire operations on the read-write lock `key` a `MONITOR` line holds (a batched
/// call carries several).
fn acquire_ops(lines: &[String]) -> usize {
    lines
        .iter()
        .map(|l| l.matches(" \"a\" ").count() + l.matches(" \"f\" ").count())
        .sum()
}

/// Waits until the acquires `monitor` sees are at least `at_least` and then stay unchanged
/// for 200 ms: the waiters have tried, subscribed, tried again and sleep.
async fn quiet(monitor: &Monitor, at_least: usize) -> usize {
    let seen = AtomicUsize::new(0);
    eventually(
        &format!("at least {at_least} acquires, then quiet"),
        Duration::from_secs(10),
        || async {
            monitor.sync().await;
            let n = acquire_ops(&monitor.lines());
            tokio::time::sleep(Duration::from_millis(200)).await;
            monitor.sync().await;
            seen.store(acquire_ops(&monitor.lines()), SeqCst);
            n >= at_least && seen.load(SeqCst) == n
        },
    )
    .await;
    seen.load(SeqCst)
}

/// A write release wakes all the readers waiting (of every service; they take their shares
/// together, one attempt each), or the next writer - one head per service tries, not everyone.
/// Waiters sleep on the writer's 30 s lease: only the release message wakes them in time.
async fn a_write_release_wakes_the_readers_or_the_next_writer(fx: Fixture) {
    let holder = fx.service(LONG).await;
    let (r1, r2) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("wake");
    let lock = rw_key(&key);
    let monitor = Monitor::start(fx.node_for(&lock), {
        let quoted = format!("\"{lock}\"");
        move |line: &str| script_call(line) && line.contains(&quoted)
    })
    .await;

    // readers
    let w = holder.write(&key).await.unwrap();
    let together = Arc::new(tokio::sync::Barrier::new(6));
    let mut readers = Vec::new();
    for s in [&r1, &r1, &r1, &r2, &r2, &r2] {
        let (s, key, together) = (s.clone(), key.clone(), together.clone());
        readers.push(tokio::spawn(async move {
            let g = s.read(&key).wait(WAIT).await.unwrap();
            // every reader holds its share until all six hold theirs
            tokio::time::timeout(Duration::from_secs(5), together.wait())
                .await
                .expect("the six readers hold their shares together");
            g.release().await.unwrap();
        }));
    }
    eventually(
        "both reader services subscribed",
        Duration::from_secs(5),
        || async { fx.subscribers(&format!("{lock}:ch")) == 2 },
    )
    .await;
    // each reader has tried (the one that subscribed its service tries again), then all sleep
    let before = quiet(&monitor, 6).await;
    let released = Instant::now();
    w.release().await.unwrap();
    for r in readers {
        tokio::time::timeout(Duration::from_secs(5), r)
            .await
            .expect("the release woke every reader")
            .unwrap();
    }
    let woken_in = released.elapsed();
    monitor.sync().await;
    let attempts = acquire_ops(&monitor.lines()) - before;
    println!(
        "{:?}: six readers in {woken_in:?}, {attempts} attempts",
        fx.kind()
    );
    assert_eq!(attempts, 6, "one attempt per reader after the release");

    // writers: three waiting in W1, one in W2; the head of each tries (and again if it
    // subscribed its service), the others not at all
    let (w1, w2) = (r1, r2);
    let w = holder.write(&key).await.unwrap();
    monitor.sync().await;
    let base = acquire_ops(&monitor.lines());
    let room = Arc::new(Room::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for s in [&w1, &w1, &w1, &w2] {
        let (s, key, room, gate, fences) = (
            s.clone(),
            key.clone(),
            room.clone(),
            gate.clone(),
            fences.clone(),
        );
        writers.push(tokio::spawn(async move {
            let g = s.write(&key).wait(WAIT).await.unwrap();
            room.enter_write();
            fences.lock().unwrap().push(g.fence());
            gate.acquire().await.unwrap().forget();
            room.leave_write();
            g.release().await.unwrap();
        }));
    }
    let before = quiet(&monitor, base + 2).await;
    w.release().await.unwrap();
    eventually("one writer holds", Duration::from_secs(5), || async {
        room.writers.load(SeqCst) == 1
    })
    .await;
    let after = quiet(&monitor, before).await;
    println!(
        "{:?}: {} writer attempts after the release",
        fx.kind(),
        after - before
    );
    assert!(
        after - before <= 2,
        "more than the head of each service tried: {} attempts",
        after - before
    );
    for n in 1..=4 {
        gate.add_permits(1);
        eventually(
            &format!("writer {n} done, the next one in"),
            Duration::from_secs(5),
            || async {
                room.writes.load(SeqCst) == n && (n == 4 || room.writers.load(SeqCst) == 1)
            },
        )
        .await;
    }
    for w in writers {
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(room.overlaps(), 0);
    let fences = fences.lock().unwrap().clone();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    ends_up_free(&fx, &holder, &key, Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------------------------
// On a single node
// ---------------------------------------------------------------------------------------------

/// A reader kept out by a waiting writer (the lock itself is shared by a reader) sleeps until a
/// wake-up instead of asking Redis again and again, and is woken when the writer gives up (its
/// future is dropped) - the share in force does not keep it out, so it gets in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_kept_out_by_a_waiting_writer_sleeps_until_woken() {
    let fx = Fixture::single().await;
    let (a, b, c) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );
    let key = unique_key("no-polling");
    let monitor = Monitor::start(fx.node_for(&rw_key(&key)), {
        let quoted = format!("\"{}\"", rw_key(&key));
        move |line: &str| script_call(line) && line.contains(&quoted)
    })
    .await;
    let share = a.read(&key).await.unwrap();
    let writer = spawn_write(&b, &key);
    eventually("the writer waits", Duration::from_secs(5), || async {
        zcard(&fx, &writers_key(&key)) == 1
    })
    .await;
    let reader = spawn_read(&c, &key);
    eventually("the reader waits", Duration::from_secs(5), || async {
        zcard(&fx, &waiting_key(&key)) == 2
    })
    .await;
    // the reader tries, subscribes, tries again, then sleeps: no attempts for 200 ms
    monitor.sync().await;
    quiet(&monitor, acquire_ops(&monitor.lines())).await;
    assert!(!reader.is_finished());
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    granted(
        "the reader, once the writer stopped waiting",
        reader,
        Duration::from_secs(2),
    )
    .await
    .release()
    .await
    .unwrap();
    share.release().await.unwrap();
    ends_up_free(&fx, &a, &key, Duration::from_secs(5)).await;
}

/// A reader waits behind a writer with a 5 s lease, longer than the reader's registration as
/// waiting (its service's watchdog is 300 ms: 1.3 s); the writer releases after 2 s. The release
/// must wake the reader, not leave it asleep until the writer's lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_waiting_past_its_registration_is_woken_by_the_release() {
    let fx = Fixture::single().await;
    let readers = fx.service(Duration::from_millis(300)).await;
    let holder = fx.service(LONG).await;
    let key = unique_key("woken-late");
    let w = holder
        .write(&key)
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    let reader = spawn_read(&readers, &key);
    eventually("the reader waits", Duration::from_secs(5), || async {
        zcard(&fx, &waiting_key(&key)) == 1
    })
    .await;
    // past the reader's first registration
    tokio::time::sleep(Duration::from_secs(2)).await;
    let released = Instant::now();
    w.release().await.unwrap();
    granted("the reader", reader, Duration::from_secs(1))
        .await
        .release()
        .await
        .unwrap();
    println!(
        "the reader got in {:?} after the release",
        released.elapsed()
    );
}

topology_tests!(a_write_release_wakes_the_readers_or_the_next_writer);
