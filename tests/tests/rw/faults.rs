//! Through a faulty network: readers and writers that reach Redis through a fault proxy
//! (delays, dropped replies, reset connections, partitions, pauses) never see a writer inside
//! with anyone among the holds that stayed in force; write tokens follow the sections' order,
//! and every lock ends up free.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Fixture, eventually};
use crate::support::{LONG, Room, ends_up_free};
use lock_runtime::{LockConfig, LockService, ReadGuard, WriteGuard};
use lock_tests::harness::{Proxy, Topology, unique_key};

/// One critical section as it ran: which key, read or write, when (between the acquire's
/// return and the release's call), the write's token, and whether the hold was still in force
/// at its end (not lost: its validity deadline had not passed, nothing found it gone).
struct Section {
    key: usize,
    write: bool,
    start: Instant,
    end: Instant,
    fence: u64,
    valid: bool,
}

/// A read or write hold.
enum Hold {
    Read(ReadGuard),
    Write(WriteGuard),
}

impl Hold {
    fn fence(&self) -> u64 {
        match self {
            Hold::Read(g) => g.fence(),
            Hold::Write(g) => g.fence(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Hold::Read(g) => g.is_lost(),
            Hold::Write(g) => g.is_lost(),
        }
    }

    async fn release(self) -> Result<(), lock_runtime::LockError> {
        match self {
            Hold::Read(g) => g.release().await,
            Hold::Write(g) => g.release().await,
        }
    }
}

/// Readers and writers of two services that reach Redis through one fault proxy, on two keys,
/// while the proxy delays replies and requests, drops replies (resetting their connection),
/// resets every connection, partitions and pauses. No writer's section ever overlaps another
/// section of its key among those whose hold stayed in force; write tokens increase in section
/// order; every lock ends up free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_writer_overlaps_anyone_through_a_faulty_network() {
    let fx = Fixture::single().await;
    let proxy = Proxy::start(Topology::addr_of(fx.topo().master_port())).await;
    let config = LockConfig::single(proxy.url())
        .with_watchdog_timeout(Duration::from_secs(3))
        .with_response_timeout(Duration::from_millis(800));
    let services = [
        LockService::connect(config.clone()).await.unwrap(),
        LockService::connect(config).await.unwrap(),
    ];
    let keys = [unique_key("faulty"), unique_key("faulty")];
    let rooms = [Arc::new(Room::default()), Arc::new(Room::default())];
    let sections = Arc::new(Mutex::new(Vec::<Section>::new()));
    let errors = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for s in &services {
        for (k, key) in keys.iter().enumerate() {
            // a watched reader, a leased reader, a writer
            for role in 0..3 {
                let (s, key, room, sections, errors, stop) = (
                    s.clone(),
                    key.clone(),
                    rooms[k].clone(),
                    sections.clone(),
                    errors.clone(),
                    stop.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    while !stop.load(SeqCst) {
                        let wait = Duration::from_secs(2);
                        let lease = Duration::from_millis(1500);
                        let acquired = match role {
                            0 => s.read(&key).wait(wait).await.map(Hold::Read),
                            1 => s.read(&key).lease(lease).wait(wait).await.map(Hold::Read),
                            _ => s.write(&key).wait(wait).await.map(Hold::Write),
                        };
                        let Ok(hold) = acquired else {
                            errors.fetch_add(1, SeqCst);
                            continue;
                        };
                        let write = matches!(hold, Hold::Write(_));
                        let start = Instant::now();
                        if write {
                            room.enter_write();
                        } else {
                            room.enter_read();
                        }
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        if write {
                            room.leave_write();
                        } else {
                            room.leave_read();
                        }
                        let end = Instant::now();
                        sections.lock().unwrap().push(Section {
                            key: k,
                            write,
                            start,
                            end,
                            fence: hold.fence(),
                            valid: !hold.is_lost(),
                        });
                        // a release that fails is repeated in the background
                        let _ = hold.release().await;
                    }
                }));
            }
        }
    }

    // the faults, one after the other, twice
    let mut rng_ms = {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        move |lo: u64, hi: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Duration::from_millis(lo + x % (hi - lo))
        }
    };
    let pause = |d: Duration| tokio::time::sleep(d);
    for _ in 0..2 {
        proxy.set_latency(rng_ms(200, 400));
        pause(Duration::from_millis(600)).await;
        proxy.set_latency(Duration::ZERO);
        proxy.set_request_latency(rng_ms(100, 300));
        pause(Duration::from_millis(600)).await;
        proxy.set_request_latency(Duration::ZERO);
        let dropped = proxy.replies_dropped();
        proxy.drop_next_reply();
        proxy.drop_next_reply();
        eventually("two replies dropped", Duration::from_secs(5), || async {
            proxy.replies_dropped() >= dropped + 2
        })
        .await;
        pause(Duration::from_millis(300)).await;
        proxy.reset_all().await;
        pause(Duration::from_millis(300)).await;
        // a partition ends with its connections reset: bytes lost inside a TCP connection
        // that lives on would desynchronise every client's replies, which TCP never does
        proxy.blackhole(true);
        pause(rng_ms(200, 500)).await;
        proxy.reset_all().await;
        proxy.blackhole(false);
        pause(Duration::from_millis(300)).await;
        proxy.pause();
        pause(rng_ms(200, 500)).await;
        proxy.resume();
        pause(Duration::from_millis(300)).await;
    }
    proxy.heal();
    stop.store(true, SeqCst);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the workers stop")
            .unwrap();
    }

    let sections = std::mem::take(&mut *sections.lock().unwrap());
    let valid: Vec<&Section> = sections.iter().filter(|s| s.valid).collect();
    let (reads, writes) = (
        valid.iter().filter(|s| !s.write).count(),
        valid.iter().filter(|s| s.write).count(),
    );
    let mut overlaps = Vec::new();
    for w in valid.iter().filter(|s| s.write) {
        for s in &valid {
            if !std::ptr::eq(*w, *s) && s.key == w.key && s.start < w.end && w.start < s.end {
                overlaps.push((w.fence, s.write, s.fence));
            }
        }
    }
    let mut readers_at_once = 0;
    for r in valid.iter().filter(|s| !s.write) {
        let n = valid
            .iter()
            .filter(|s| !s.write && s.key == r.key && s.start <= r.start && r.start < s.end)
            .count();
        readers_at_once = readers_at_once.max(n);
    }
    println!(
        "{} sections ({reads} reads, {writes} writes in force; {} lost), {} acquire errors, \
         {} replies dropped, {} connections; at most {readers_at_once} readers at once; \
         room overlaps {} / {}",
        sections.len(),
        sections.len() - valid.len(),
        errors.load(SeqCst),
        proxy.replies_dropped(),
        proxy.accepted(),
        rooms[0].overlaps(),
        rooms[1].overlaps(),
    );
    assert!(overlaps.is_empty(), "a writer overlapped: {overlaps:?}");
    for k in 0..keys.len() {
        let mut writes: Vec<&&Section> = valid.iter().filter(|s| s.write && s.key == k).collect();
        writes.sort_by_key(|s| s.start);
        assert!(
            writes.windows(2).all(|w| w[0].fence < w[1].fence),
            "write tokens out of order on key {k}"
        );
    }
    assert!(
        reads >= 20 && writes >= 10,
        "too little ran: {reads} reads, {writes} writes"
    );
    assert!(readers_at_once > 1, "readers never shared");
    assert!(proxy.replies_dropped() >= 4);
    let direct = fx.service(LONG).await;
    for key in &keys {
        ends_up_free(&fx, &direct, key, Duration::from_secs(10)).await;
    }
}
