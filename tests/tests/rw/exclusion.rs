//! Readers share the lock and a writer excludes readers and writers: readers of several
//! services hold it together, a writer never holds it beside anyone, on a shared counter on
//! Redis and by concurrency counters (`Room`). The body runs on every topology (see
//! `topology_tests!` at the end).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::Fixture;
use crate::support::{LONG, Room, WAIT, ends_up_free};
use lock_runtime::ErrorKind;
use lock_tests::harness::unique_key;

/// Readers of three services hold the lock together; a writer excludes readers and writers.
/// The shared resource is a counter on Redis: writers increment it with GET then SET (a lost
/// update shows as a missing increment), readers read it twice and see no change in between (a
/// torn read); the room counts readers and writers inside.
async fn readers_share_and_writers_exclude(fx: Fixture) {
    let services = [
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    ];
    let key = unique_key("rw");

    // three services read at once; nobody writes meanwhile
    let mut shares = Vec::new();
    for s in &services {
        shares.push(s.read(&key).try_once().await.expect("readers share"));
    }
    for s in &services {
        let e = s.write(&key).try_once().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "a writer among readers: {e}");
    }
    for share in shares {
        share.release().await.unwrap();
    }
    let w = services[0].write(&key).try_once().await.unwrap();
    for s in &services {
        let e = s.read(&key).try_once().await.unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::Timeout,
            "a reader beside a writer: {e}"
        );
        let e = s.write(&key).try_once().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "two writers: {e}");
    }
    w.release().await.unwrap();

    // all at once, on a shared counter
    let data = unique_key("rw-data");
    let room = Arc::new(Room::default());
    let torn = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let (readers_per_service, reads_each, writes_each) = (3, 12, 8);
    let mut tasks = Vec::new();
    for s in &services {
        for _ in 0..readers_per_service {
            let (s, key, data, room, torn) = (
                s.clone(),
                key.clone(),
                data.clone(),
                room.clone(),
                torn.clone(),
            );
            let mut raw = fx.raw().await;
            tasks.push(tokio::spawn(async move {
                for _ in 0..reads_each {
                    let g = s.read(&key).wait(WAIT).await.unwrap();
                    room.enter_read();
                    let before = raw.get(&data).await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let after = raw.get(&data).await;
                    if before != after {
                        torn.fetch_add(1, SeqCst);
                    }
                    room.leave_read();
                    g.release().await.unwrap();
                }
            }));
        }
        let (s, key, data, room, fences) = (
            s.clone(),
            key.clone(),
            data.clone(),
            room.clone(),
            fences.clone(),
        );
        let mut raw = fx.raw().await;
        tasks.push(tokio::spawn(async move {
            for _ in 0..writes_each {
                let g = s.write(&key).wait(WAIT).await.unwrap();
                room.enter_write();
                fences.lock().unwrap().push(g.fence());
                let value = raw.get(&data).await.unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(2)).await;
                raw.set(&data, value + 1).await;
                room.leave_write();
                g.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the readers and writers finish")
            .unwrap();
    }
    let writes = services.len() * writes_each;
    println!(
        "{:?}: {} reads, {} writes, at most {} readers at once",
        fx.kind(),
        room.reads.load(SeqCst),
        room.writes.load(SeqCst),
        room.max_readers()
    );
    assert_eq!(room.overlaps(), 0, "a writer was inside with someone else");
    assert_eq!(torn.load(SeqCst), 0, "a reader saw a write while it read");
    assert_eq!(
        fx.raw().await.get(&data).await,
        Some(writes as u64),
        "lost updates: two writers at once"
    );
    assert!(room.max_readers() > 1, "readers never shared the lock");
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), writes);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "write tokens in grant order: {fences:?}"
    );
    ends_up_free(&fx, &services[0], &key, Duration::from_secs(5)).await;
}

topology_tests!(readers_share_and_writers_exclude);
