//! Read-write locks against real Redis: readers share, a writer excludes readers and writers,
//! a waiting writer stops new readers (writers do not starve; a reader still re-enters its own
//! share), downgrade inside a write body, upgrades refused, one lease per reader, a crashed
//! reader's share runs out, wake-ups (a write release wakes every waiting reader or one writer
//! head per service; readers kept out sleep until woken; waiters stay registered behind long
//! leases), write fencing tokens, cancellation, extend after a loss, and exclusion through a
//! faulty network.
//!
//! Exclusion is checked on a shared resource with concurrency counters (`Room`), never by
//! timing. The exclusion, writer-preference and wake-up checks run on every topology (see
//! `topology_tests!` at the end).
//!
//! On Redis a read-write lock `k` is the hash `lock:rw:{k}` (see `scripts/rw/state.lua`): one
//! field `r:<grant id>` -> `<expiry ms> <token> <owner>` per read share, `w:<owner>` for the writer; the
//! services waiting are the zset `lock:rw:{k}:wq`, the services with a writer waiting the zset
//! `lock:rw:{k}:turn`. A few checks below read those to know when a waiter is registered.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Fixture, Monitor, Worker, eventually, script_call};
use lock_runtime::{
    ErrorKind, LockConfig, LockKind, LockService, OwnerId, ReadGuard, WriteGuard, owner,
};
use lock_tests::harness::{Proxy, Topology, unique_key};

const LONG: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(20);

/// The hash of the read-write lock `key` (keys without `{`, `}` or `%`).
fn rw_key(key: &str) -> String {
    format!("lock:rw:{{{key}}}")
}

/// The services with a writer waiting for `key` (writer preference).
fn writers_key(key: &str) -> String {
    format!("{}:turn", rw_key(key))
}

/// The services waiting for `key`.
fn waiting_key(key: &str) -> String {
    format!("{}:wq", rw_key(key))
}

/// ZCARD of `redis_key`, asked of the node serving it.
fn zcard(fx: &Fixture, redis_key: &str) -> i64 {
    redis::cmd("ZCARD")
        .arg(redis_key)
        .query(&mut fx.conn_for(redis_key))
        .unwrap()
}

/// The read shares of `key` that are in force by the server's clock (expired ones stay in the
/// hash until the next script call on the lock drops them).
fn live_shares(fx: &Fixture, key: &str) -> usize {
    let lock = rw_key(key);
    let mut con = fx.conn_for(&lock);
    let fields: HashMap<String, String> = redis::cmd("HGETALL").arg(&lock).query(&mut con).unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let now = secs * 1000 + micros / 1000;
    fields
        .iter()
        .filter(|(f, v)| {
            f.starts_with("r:")
                && v.split(' ')
                    .next()
                    .and_then(|exp| exp.parse::<u64>().ok())
                    .is_some_and(|exp| exp > now)
        })
        .count()
}

/// The critical section the lock protects, with concurrency counters: how many readers and
/// writers are inside now, the most readers seen inside at once, and every moment a writer was
/// inside together with anyone else. A side that enters counts itself in, then looks at the
/// other side (sequentially consistent): of two that are inside together, at least one sees
/// the other.
#[derive(Default)]
struct Room {
    readers: AtomicUsize,
    writers: AtomicUsize,
    max_readers: AtomicUsize,
    overlaps: AtomicUsize,
    reads: AtomicUsize,
    writes: AtomicUsize,
}

impl Room {
    fn enter_read(&self) {
        let n = self.readers.fetch_add(1, SeqCst) + 1;
        self.max_readers.fetch_max(n, SeqCst);
        if self.writers.load(SeqCst) > 0 {
            self.overlaps.fetch_add(1, SeqCst);
        }
    }

    fn leave_read(&self) {
        self.reads.fetch_add(1, SeqCst);
        self.readers.fetch_sub(1, SeqCst);
    }

    fn enter_write(&self) {
        let others = self.writers.fetch_add(1, SeqCst);
        if others > 0 || self.readers.load(SeqCst) > 0 {
            self.overlaps.fetch_add(1, SeqCst);
        }
    }

    fn leave_write(&self) {
        self.writes.fetch_add(1, SeqCst);
        self.writers.fetch_sub(1, SeqCst);
    }

    fn overlaps(&self) -> usize {
        self.overlaps.load(SeqCst)
    }

    fn max_readers(&self) -> usize {
        self.max_readers.load(SeqCst)
    }
}

fn spawn_read(
    service: &LockService,
    key: &str,
) -> tokio::task::JoinHandle<Result<ReadGuard, lock_runtime::LockError>> {
    let (service, key) = (service.clone(), key.to_owned());
    tokio::spawn(async move { service.read(&key).wait(WAIT).await })
}

fn spawn_write(
    service: &LockService,
    key: &str,
) -> tokio::task::JoinHandle<Result<WriteGuard, lock_runtime::LockError>> {
    let (service, key) = (service.clone(), key.to_owned());
    tokio::spawn(async move { service.write(&key).wait(WAIT).await })
}

/// Awaits a spawned acquire that must succeed within `within`.
async fn granted<G>(
    what: &str,
    task: tokio::task::JoinHandle<Result<G, lock_runtime::LockError>>,
    within: Duration,
) -> G {
    tokio::time::timeout(within, task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not granted within {within:?}"))
        .unwrap()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The lock `key` is free: no hash on Redis, and another service gets a write hold and then a
/// read hold at once. Waits up to `within` for that (a give-back or a repeated release runs in
/// the background).
async fn ends_up_free(fx: &Fixture, service: &LockService, key: &str, within: Duration) {
    eventually(
        &format!("{key} is free for writers and readers"),
        within,
        || async {
            if fx.exists(&rw_key(key)) {
                return false;
            }
            let Ok(w) = service.write(key).try_once().await else {
                return false;
            };
            w.release().await.unwrap();
            let Ok(r) = service.read(key).try_once().await else {
                return false;
            };
            r.release().await.unwrap();
            true
        },
    )
    .await;
    assert!(
        !fx.exists(&rw_key(key)),
        "{key}: released holds leave no hash"
    );
}

// ---------------------------------------------------------------------------------------------
// On every topology
// ---------------------------------------------------------------------------------------------

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

/// Downgrade: a read inside a write body re-enters the call chain's owner and is granted at
/// once, although a writer and a reader of other services wait; when the write is released,
/// the read share stays and keeps the writer out until it is released too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_inside_a_write_body_is_granted_at_once() {
    let fx = Fixture::single().await;
    let (a, b, c) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );
    let key = unique_key("downgrade");
    let (share, other_writer, other_reader) = a
        .write(&key)
        .run_nested(|held| {
            let (a, b, c, fx, key) = (&a, &b, &c, &fx, key.clone());
            async move {
                let other_writer = spawn_write(b, &key);
                let other_reader = spawn_read(c, &key);
                eventually(
                    "a writer and a reader of other services wait",
                    Duration::from_secs(5),
                    || async {
                        zcard(fx, &writers_key(&key)) == 1 && zcard(fx, &waiting_key(&key)) == 2
                    },
                )
                .await;
                let plain =
                    tokio::time::timeout(Duration::from_secs(2), a.read(&key).into_future())
                        .await
                        .expect("a read inside the write body does not wait")
                        .unwrap();
                plain.release().await.unwrap();
                let share = a
                    .read(&key)
                    .try_once()
                    .await
                    .expect("a read inside the write body is granted at once");
                assert_eq!(share.fence(), held.fence(), "it shares the write's token");
                (share, other_writer, other_reader)
            }
        })
        .await
        .unwrap();
    // the write is released, the read share holds on
    let e = c.write(&key).try_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(!other_writer.is_finished() && !other_reader.is_finished());
    share.release().await.unwrap();
    let w = granted("the other writer", other_writer, Duration::from_secs(5)).await;
    assert!(!other_reader.is_finished());
    w.release().await.unwrap();
    granted("the other reader", other_reader, Duration::from_secs(5))
        .await
        .release()
        .await
        .unwrap();
    ends_up_free(&fx, &a, &key, Duration::from_secs(5)).await;
}

/// A read inside a read body re-enters the share at once, although a writer waits (which keeps
/// every new reader out - also another owner of the same service): writer preference never
/// makes a reader wait for a writer that waits for that reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_re_enters_its_share_while_a_writer_waits() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("re-read");
    let writer = a
        .read(&key)
        .run_nested(|held| {
            let (a, b, fx, key) = (&a, &b, &fx, key.clone());
            async move {
                let writer = spawn_write(b, &key);
                eventually("the writer waits", Duration::from_secs(5), || async {
                    zcard(fx, &writers_key(&key)) == 1
                })
                .await;
                let e = a
                    .read(&key)
                    .owner(OwnerId::new())
                    .try_once()
                    .await
                    .unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Timeout, "a new reader got in: {e}");
                let inner = a
                    .read(&key)
                    .try_once()
                    .await
                    .expect("the body's own share is re-entered at once");
                assert_eq!(inner.fence(), held.fence());
                inner.release().await.unwrap();
                assert!(!writer.is_finished());
                (writer, held.fence())
            }
        })
        .await
        .unwrap();
    let (writer, read_fence) = writer;
    let w = granted("the writer", writer, Duration::from_secs(2)).await;
    assert!(w.fence() > read_fence);
    w.release().await.unwrap();
    ends_up_free(&fx, &a, &key, Duration::from_secs(5)).await;
}

/// Upgrade: a write asked for by the owner that holds the lock for reading would wait for its
/// own share forever; it is refused at once with `WouldDeadlock` - inside a read body, inside
/// an owner scope, with an explicit owner. A write of another owner just waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_refused_at_once() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("upgrade");
    let refused = |e: lock_runtime::LockError, asked: Instant, how: &str| {
        assert_eq!(e.kind(), ErrorKind::WouldDeadlock, "{how}: {e}");
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{how}: refused after {:?}, not at once",
            asked.elapsed()
        );
    };

    let asked = Instant::now();
    let inner = a
        .read(&key)
        .run_nested(|_| async { a.write(&key).wait(Duration::from_secs(5)).await.map(drop) })
        .await
        .expect("the read body ran");
    refused(inner.unwrap_err(), asked, "in a read body");

    owner::scope(OwnerId::new(), async {
        let r = a.read(&key).await.unwrap();
        let asked = Instant::now();
        let e = a
            .write(&key)
            .wait(Duration::from_secs(5))
            .await
            .unwrap_err();
        refused(e, asked, "in an owner scope");
        // the refusal left the share alone
        let busy = b.write(&key).try_once().await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Timeout);
        r.release().await.unwrap();
    })
    .await;

    let me = OwnerId::new();
    let r = a.read(&key).owner(me.clone()).await.unwrap();
    let asked = Instant::now();
    let e = a
        .write(&key)
        .owner(me)
        .wait(Duration::from_secs(5))
        .await
        .unwrap_err();
    refused(e, asked, "with an explicit owner");
    // another owner is no upgrade: it waits for the reader like any writer (in another task:
    // next to the read guard it would wait for a guard held by its own code)
    let (a2, k2) = (a.clone(), key.clone());
    let e = tokio::spawn(async move { a2.write(&k2).wait(Duration::from_millis(300)).await })
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    r.release().await.unwrap();
    ends_up_free(&fx, &b, &key, Duration::from_secs(5)).await;
}

/// Each reader's hold has its own lease: a short-leased share runs out (lost, then `extend`
/// and `release` say `NotHeld`) while a watched share and a long-leased one stay; the watched
/// one is renewed past many watchdog periods without keeping the expired one alive; a new
/// lease for one share moves only that share's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reader_has_its_own_lease() {
    let fx = Fixture::single().await;
    let watchdog = Duration::from_millis(300);
    let a = fx.service(watchdog).await;
    let b = fx.service(LONG).await;
    let key = unique_key("leases");
    let short = b
        .read(&key)
        .lease(Duration::from_millis(300))
        .await
        .unwrap();
    let watched = a.read(&key).await.unwrap();
    let long = b.read(&key).lease(LONG).await.unwrap();
    let why = tokio::time::timeout(Duration::from_secs(3), short.lost())
        .await
        .expect("the short share runs out");
    assert_eq!(why.kind(), ErrorKind::Lost);
    eventually(
        "Redis dropped the short share only",
        Duration::from_secs(3),
        || async { live_shares(&fx, &key) == 2 },
    )
    .await;
    let e = short.extend(LONG).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    // the watched share lives on through renewals (four watchdog periods)
    assert!(
        tokio::time::timeout(watchdog * 4, watched.lost())
            .await
            .is_err(),
        "the watched share was lost"
    );
    assert!(!long.is_lost());
    assert_eq!(live_shares(&fx, &key), 2);
    let e = short.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");

    // a new, shorter lease for one share: only its deadline moves
    let before = (long.valid_until(), watched.valid_until());
    long.extend(Duration::from_millis(200)).await.unwrap();
    assert!(long.valid_until() < before.0);
    assert!(watched.valid_until() >= before.1);
    tokio::time::timeout(Duration::from_secs(3), long.lost())
        .await
        .expect("the re-leased share runs out");
    // Redis drops it a few ms later: the client counts a lease from when it sent the call,
    // less a margin for clock drift
    eventually(
        "Redis dropped the re-leased share",
        Duration::from_secs(3),
        || async { live_shares(&fx, &key) == 1 },
    )
    .await;
    assert!(!watched.is_lost());
    let busy = b.write(&key).try_once().await.unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Timeout, "the watched share holds");
    // releasing the last live share frees the lock at once: the expired shares count for
    // nothing
    watched.release().await.unwrap();
    b.write(&key)
        .try_once()
        .await
        .expect("free once the last live reader left")
        .release()
        .await
        .unwrap();
    ends_up_free(&fx, &b, &key, Duration::from_secs(5)).await;
}

/// A reader in another process is SIGKILLed while it holds a share (watchdog 500 ms): its
/// share runs out with its lease while a live reader here keeps its own, and when the live
/// reader leaves, the waiting writer gets the lock at once (not at the end of anyone's lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_readers_share_runs_out() {
    let fx = Fixture::single().await;
    let (b, c) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("crash");
    let live = b.read(&key).await.unwrap();
    let url = fx.topo().url();
    let mut worker = Worker::spawn(&[url.as_str(), "hold-read", key.as_str(), "0", "500"]);
    let line = worker.line(Duration::from_secs(30)).await;
    assert!(line.starts_with("held "), "{line}");
    let writer = spawn_write(&c, &key);
    eventually("the writer waits", Duration::from_secs(5), || async {
        zcard(&fx, &writers_key(&key)) == 1
    })
    .await;
    // the worker renews its share: it outlives three of its watchdog periods
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(live_shares(&fx, &key), 2, "the live worker's share ran out");
    assert!(!writer.is_finished());

    let killed = Instant::now();
    worker.kill().await;
    eventually(
        "the crashed reader's share runs out",
        Duration::from_secs(5),
        || async { live_shares(&fx, &key) == 1 },
    )
    .await;
    println!(
        "the crashed share ran out {:?} after SIGKILL",
        killed.elapsed()
    );
    assert!(!writer.is_finished(), "the live reader still holds");
    assert!(!live.is_lost());
    live.release().await.unwrap();
    let w = granted(
        "the writer, once the live reader left",
        writer,
        Duration::from_secs(2),
    )
    .await;
    let fence: u64 = line["held ".len()..].parse().unwrap();
    assert!(w.fence() > fence);
    w.release().await.unwrap();
    ends_up_free(&fx, &b, &key, Duration::from_secs(5)).await;
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

/// Write grants get strictly increasing fencing tokens: across services, after a release, after
/// a lease ran out without a release, with readers in between (each reader's own token lies
/// between the writes before and after it, never equal to one); a read inside a write body gets
/// the write's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_tokens_strictly_increase() {
    let fx = Fixture::single().await;
    let services = [
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    ];
    let key = unique_key("fence");
    let mut tokens = Vec::new();
    for round in 0..9 {
        let s = &services[round % 3];
        if round % 3 == 1 {
            // a write that is never released: its lease runs out
            let w = s
                .write(&key)
                .lease(Duration::from_millis(100))
                .await
                .unwrap();
            tokens.push(w.fence());
            tokio::time::timeout(Duration::from_secs(3), w.lost())
                .await
                .expect("the lease runs out");
            drop(w);
        } else {
            let r = s.read(&key).wait(WAIT).await.unwrap();
            let read = r.fence();
            assert!(
                tokens.last().is_none_or(|t| read > *t),
                "a reader's token is its own, newer than every write before it"
            );
            r.release().await.unwrap();
            let (t, inner) = s
                .write(&key)
                .wait(WAIT)
                .run_nested(|held| {
                    let key = &key;
                    async move {
                        let inner = s.read(key).try_once().await.unwrap();
                        let t = inner.fence();
                        inner.release().await.unwrap();
                        (held.fence(), t)
                    }
                })
                .await
                .unwrap();
            assert_eq!(inner, t, "a downgrade shares the write's token");
            assert!(
                t > read,
                "a write after a read has a newer token than the reader's"
            );
            tokens.push(t);
        }
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    ends_up_free(&fx, &services[0], &key, Duration::from_secs(5)).await;
}

/// Cancelling a read or write that waits gives everything back: its place among the waiting
/// services, and a grant that reached Redis after the caller left. Two ways: the future is
/// dropped while it waits behind a writer (and a writer gives up on its wait), and the future is
/// dropped while Redis's grant is on its way back through a slow proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_read_or_write_gives_everything_back() {
    let fx = Fixture::single().await;
    let (h, b, c, d) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );

    // dropped while waiting
    let key = unique_key("cancel");
    let held = h.write(&key).await.unwrap();
    let reader = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.read(&key).await })
    };
    let writer = {
        let (c, key) = (c.clone(), key.clone());
        tokio::spawn(async move { c.write(&key).await })
    };
    eventually(
        "a reader and a writer wait",
        Duration::from_secs(5),
        || async { zcard(&fx, &waiting_key(&key)) == 2 && zcard(&fx, &writers_key(&key)) == 1 },
    )
    .await;
    // a reader of the writer's service waits behind it: polled once, it is in line
    let mut same_service_reader = Box::pin(c.read(&key).wait(WAIT).into_future());
    tokio::select! {
        biased;
        _ = &mut same_service_reader => panic!("a reader got in beside a writer"),
        () = std::future::ready(()) => {}
    }
    reader.abort();
    writer.abort();
    assert!(reader.await.unwrap_err().is_cancelled());
    assert!(writer.await.unwrap_err().is_cancelled());
    // and a writer that gives up on its wait
    let e = d
        .write(&key)
        .wait(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    eventually(
        "only the reader's service is still registered as waiting, no writer",
        Duration::from_secs(2),
        || async { zcard(&fx, &waiting_key(&key)) == 1 && zcard(&fx, &writers_key(&key)) == 0 },
    )
    .await;
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), same_service_reader)
        .await
        .expect("the reader behind the cancelled writer gets in at once")
        .unwrap()
        .release()
        .await
        .unwrap();
    ends_up_free(&fx, &d, &key, Duration::from_secs(1)).await;

    // dropped while the grant is on its way back
    let proxy = Proxy::start(Topology::addr_of(fx.topo().master_port())).await;
    let slow = LockService::connect(LockConfig::single(proxy.url()).with_watchdog_timeout(LONG))
        .await
        .unwrap();
    proxy.set_latency(Duration::from_millis(500));
    for write in [false, true] {
        let key = unique_key("cancel-late");
        let attempt = async {
            if write {
                slow.write(&key).await.map(drop)
            } else {
                slow.read(&key).await.map(drop)
            }
        };
        tokio::select! {
            _ = attempt => panic!("the reply came before the grant was seen on Redis"),
            () = eventually("granted on Redis", Duration::from_secs(5), || async {
                fx.exists(&rw_key(&key))
            }) => {}
        }
        ends_up_free(&fx, &d, &key, Duration::from_secs(5)).await;
    }
}

/// `extend` on a hold that is lost is `NotHeld`, and changes nothing: whether the hold's lease
/// ran out (known here) or the hold vanished on Redis (found out by the call); the same for
/// `release`. On a hold that is in force, `extend` works and the hold outlives its first lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_on_a_lost_hold_is_not_held() {
    let fx = Fixture::single().await;
    let a = fx.service(LONG).await;
    for write in [false, true] {
        // the lease ran out
        let key = unique_key("extend-expired");
        let (mut r, mut w) = (None, None);
        if write {
            w = Some(
                a.write(&key)
                    .lease(Duration::from_millis(200))
                    .await
                    .unwrap(),
            );
        } else {
            r = Some(
                a.read(&key)
                    .lease(Duration::from_millis(200))
                    .await
                    .unwrap(),
            );
        }
        eventually("the lease ran out", Duration::from_secs(3), || async {
            r.as_ref().is_none_or(ReadGuard::is_lost) && w.as_ref().is_none_or(WriteGuard::is_lost)
        })
        .await;
        let e = match (&mut r, &mut w) {
            (Some(r), _) => r.extend(LONG).await.unwrap_err(),
            (_, Some(w)) => w.extend(LONG).await.unwrap_err(),
            _ => unreachable!(),
        };
        assert_eq!(e.kind(), ErrorKind::NotHeld, "write {write}: {e}");
        eventually(
            "the expired hold is gone on Redis: nothing was extended",
            Duration::from_secs(1),
            || async { !fx.exists(&rw_key(&key)) },
        )
        .await;

        // the hold vanished on Redis
        let key = unique_key("extend-gone");
        let (mut r, mut w) = (None, None);
        if write {
            w = Some(a.write(&key).await.unwrap());
        } else {
            r = Some(a.read(&key).await.unwrap());
        }
        let _: i64 = redis::cmd("DEL")
            .arg(rw_key(&key))
            .query(&mut fx.redis())
            .unwrap();
        let e = match (&mut r, &mut w) {
            (Some(r), _) => r.extend(LONG).await.unwrap_err(),
            (_, Some(w)) => w.extend(LONG).await.unwrap_err(),
            _ => unreachable!(),
        };
        assert_eq!(e.kind(), ErrorKind::NotHeld, "write {write}: {e}");
        assert!(!fx.exists(&rw_key(&key)), "extend re-created nothing");
        let lost = match (r, w) {
            (Some(r), _) => {
                assert!(r.is_lost());
                r.release().await.unwrap_err()
            }
            (_, Some(w)) => {
                assert!(w.is_lost());
                w.release().await.unwrap_err()
            }
            _ => unreachable!(),
        };
        assert_eq!(lost.kind(), ErrorKind::NotHeld, "{lost}");

        // in force: extended past its first lease
        let key = unique_key("extend-live");
        let first = Duration::from_millis(300);
        let valid = if write {
            let w = a.write(&key).lease(first).await.unwrap();
            w.extend(Duration::from_secs(5)).await.unwrap();
            assert!(tokio::time::timeout(first * 2, w.lost()).await.is_err());
            w.release().await.map(|()| !fx.exists(&rw_key(&key)))
        } else {
            let r = a.read(&key).lease(first).await.unwrap();
            r.extend(Duration::from_secs(5)).await.unwrap();
            assert!(tokio::time::timeout(first * 2, r.lost()).await.is_err());
            r.release().await.map(|()| !fx.exists(&rw_key(&key)))
        };
        assert!(valid.unwrap(), "released after the extension");
    }
}

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

// ---------------------------------------------------------------------------------------------
// Through a faulty network
// ---------------------------------------------------------------------------------------------

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

topology_tests!(
    readers_share_and_writers_exclude,
    a_waiting_writer_stops_new_readers,
    a_write_release_wakes_the_readers_or_the_next_writer,
);
