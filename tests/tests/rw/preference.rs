//! Writer preference: a writer that waits stops new readers of every service (also of the
//! reader's own service), so a stream of overlapping readers does not starve writers - also
//! when the writer waits longer than its service stays registered as waiting; and a dead
//! writer's registration, which still keeps readers out, does not stall a live writer behind
//! them. The first body runs on every topology (see `topology_tests!` at the end).

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Fixture, Worker, eventually};
use crate::support::{
    LONG, Room, WAIT, ends_up_free, granted, spawn_read, spawn_write, waiting_key, writers_key,
    zcard,
};
use lock_runtime::{ErrorKind, LockKind};
use lock_tests::harness::unique_key;

// ---------------------------------------------------------------------------------------------
// On every topology
// ---------------------------------------------------------------------------------------------

/// A writer of one service waits behind a reader of another: from then on new readers of any
/// service wait too (also of the reader's own service), and the writer goes first when the
/// reader leaves. Then: a stream of overlapping readers of two services, which would keep the
/// lock shared forever, lets a writer of a third service in.
async fn a_waiting_writer_stops_new_readers(fx: Fixture) {
    let (a, b, c) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );
    let key = unique_key("prefer");
    let first = a.read(&key).await.unwrap();
    let writer = spawn_write(&b, &key);
    eventually(
        "the writer is registered as waiting",
        Duration::from_secs(5),
        || async { zcard(&fx, &writers_key(&key)) == 1 },
    )
    .await;
    for (name, s) in [("A (the reader's service)", &a), ("C", &c)] {
        let e = s.read(&key).try_once().await.unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::Timeout,
            "a new reader of {name} got in ahead of a waiting writer: {e}"
        );
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let late_reader = {
        let (c, key, order) = (c.clone(), key.clone(), order.clone());
        tokio::spawn(async move {
            let g = c.read(&key).wait(WAIT).await?;
            order.lock().unwrap().push("read");
            Ok::<_, lock_runtime::LockError>(g)
        })
    };
    eventually(
        "the late reader is registered as waiting",
        Duration::from_secs(5),
        || async { zcard(&fx, &waiting_key(&key)) == 2 },
    )
    .await;
    assert!(!writer.is_finished() && !late_reader.is_finished());
    first.release().await.unwrap();
    let w = granted("the waiting writer", writer, Duration::from_secs(5)).await;
    order.lock().unwrap().push("write");
    assert!(
        !late_reader.is_finished(),
        "the late reader got in while the writer holds"
    );
    w.release().await.unwrap();
    let r = granted("the late reader", late_reader, Duration::from_secs(5)).await;
    assert_eq!(*order.lock().unwrap(), ["write", "read"]);
    r.release().await.unwrap();

    // Writers do not starve: four readers of A and C, each holding 100 ms and coming back at
    // once, start 25 ms apart, so that the lock is always shared while they run.
    let room = Arc::new(Room::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for (i, s) in [&a, &c, &a, &c].into_iter().enumerate() {
        let (s, key, room, stop) = (s.clone(), key.clone(), room.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(25) * i as u32).await;
            while !stop.load(SeqCst) {
                let g = s.read(&key).wait(WAIT).await.unwrap();
                room.enter_read();
                tokio::time::sleep(Duration::from_millis(100)).await;
                room.leave_read();
                g.release().await.unwrap();
            }
        }));
    }
    eventually("the readers overlap", Duration::from_secs(5), || async {
        room.max_readers() >= 3
    })
    .await;
    let asked = Instant::now();
    let w = b
        .write(&key)
        .wait(Duration::from_secs(5))
        .await
        .expect("a writer gets in between a stream of readers");
    room.enter_write();
    let waited = asked.elapsed();
    tokio::time::sleep(Duration::from_millis(20)).await;
    room.leave_write();
    w.release().await.unwrap();
    stop.store(true, SeqCst);
    for r in readers {
        tokio::time::timeout(WAIT, r)
            .await
            .expect("readers stop")
            .unwrap();
    }
    println!(
        "{:?}: the writer waited {waited:?} for {} readers",
        fx.kind(),
        room.max_readers()
    );
    assert_eq!(room.overlaps(), 0, "the writer was inside with a reader");
    assert!(room.reads.load(SeqCst) > 4, "the readers ran");
    ends_up_free(&fx, &a, &key, Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------------------------
// On a single node
// ---------------------------------------------------------------------------------------------

/// A waiter's service stays registered as waiting for `min(wait, watchdog_timeout) + 1 s` after
/// each attempt. A writer that waits longer than that behind readers with long fixed leases
/// must still keep new readers out: no reader that asks after the writer is registered gets in
/// before the writer. Readers of two services hold 2 s each with 3 s leases, overlapping; the
/// writer's service has a 300 ms watchdog (registration 1.3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_waiting_past_its_registration_still_stops_new_readers() {
    let fx = Fixture::single().await;
    let writers = fx.service(Duration::from_millis(300)).await;
    let (a, c) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("long-leases");
    let room = Arc::new(Room::default());
    let stop = Arc::new(AtomicBool::new(false));
    // (asked, granted) per read
    let reads = Arc::new(Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    for (i, s) in [&a, &c, &a, &c].into_iter().enumerate() {
        let (s, key, room, stop, reads) = (
            s.clone(),
            key.clone(),
            room.clone(),
            stop.clone(),
            reads.clone(),
        );
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500) * i as u32).await;
            while !stop.load(SeqCst) {
                let asked = Instant::now();
                let g = s
                    .read(&key)
                    .lease(Duration::from_secs(3))
                    .wait(WAIT)
                    .await
                    .unwrap();
                reads.lock().unwrap().push((asked, Instant::now()));
                room.enter_read();
                tokio::time::sleep(Duration::from_secs(2)).await;
                room.leave_read();
                g.release().await.unwrap();
            }
        }));
    }
    eventually("the readers overlap", Duration::from_secs(5), || async {
        room.max_readers() >= 3
    })
    .await;
    let writer = spawn_write(&writers, &key);
    eventually(
        "the writer is registered",
        Duration::from_secs(5),
        || async { zcard(&fx, &writers_key(&key)) == 1 },
    )
    .await;
    let registered = Instant::now();
    let w = granted("the writer", writer, Duration::from_secs(15)).await;
    let got_in = Instant::now();
    room.enter_write();
    room.leave_write();
    w.release().await.unwrap();
    stop.store(true, SeqCst);
    for r in readers {
        tokio::time::timeout(WAIT, r)
            .await
            .expect("readers stop")
            .unwrap();
    }
    let ahead = reads
        .lock()
        .unwrap()
        .iter()
        .filter(|(asked, granted)| *asked > registered && *granted < got_in)
        .count();
    println!(
        "the writer got in {:?} after it was registered",
        got_in - registered
    );
    assert_eq!(
        ahead, 0,
        "readers that asked after the writer got in ahead of it"
    );
    assert_eq!(room.overlaps(), 0);
}

/// A writer in another process registers as waiting (no deadline, 30 s watchdog: its service
/// stays registered for 31 s) while a third service holds the write lock, and is SIGKILLed. In
/// a live service a reader heads the line and a writer waits behind it. When the holder
/// releases, the reader is refused only because the dead writer is still registered: the live
/// writer behind it must try and get the lock at once, not sit behind the reader until the
/// dead registration runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiting_writer_does_not_stall_a_live_writer_behind_a_reader() {
    let fx = Fixture::single().await;
    let (b, holder) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("dead-writer");
    let w = holder.write(&key).await.unwrap();
    let url = fx.topo().url();
    let mut dead = Worker::spawn(&[url.as_str(), "hold-write", key.as_str(), "0"]);
    eventually(
        "the other process's writer waits",
        Duration::from_secs(30),
        || async { zcard(&fx, &writers_key(&key)) == 1 },
    )
    .await;
    let local_waiters = |n: usize| {
        let (b, key) = (b.clone(), key.clone());
        async move {
            b.inspect_kind(LockKind::ReadWrite, &key)
                .await
                .unwrap()
                .local_waiters
                == n
        }
    };
    let reader = spawn_read(&b, &key);
    eventually("the reader waits", Duration::from_secs(5), || async {
        local_waiters(1).await && zcard(&fx, &waiting_key(&key)) == 2
    })
    .await;
    let writer = spawn_write(&b, &key);
    eventually(
        "the writer waits behind the reader",
        Duration::from_secs(5),
        || local_waiters(2),
    )
    .await;
    dead.kill().await;
    assert_eq!(
        zcard(&fx, &writers_key(&key)),
        1,
        "the dead writer's registration stays"
    );

    let released = Instant::now();
    w.release().await.unwrap();
    let live = granted(
        "the live writer behind the reader, while the dead writer is still registered",
        writer,
        Duration::from_secs(1),
    )
    .await;
    println!(
        "the live writer got in {:?} after the release",
        released.elapsed()
    );
    assert!(!reader.is_finished(), "the reader got in beside the writer");
    live.release().await.unwrap();
    // the reader waits until the dead registration runs out; it is not what this checks
    reader.abort();
    let _ = reader.await;
}

topology_tests!(a_waiting_writer_stops_new_readers);
