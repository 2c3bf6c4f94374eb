//! A separate OS process that takes locks, for the multi-process tests.
//!
//! ```text
//! lock-worker <redis url | config.toml> counter <lock key> <counter key> <iterations>
//!     each iteration: lock, GET counter, yield, SET counter + 1, release; prints "done"
//! lock-worker <redis url | config.toml> hold <lock key> <lease ms, 0 = watchdog> [watchdog ms]
//!     takes the lock, prints "held <fence>", then sleeps until killed
//! lock-worker <redis url | config.toml> permit <semaphore> <permits> <count> <lease ms, 0 = watchdog>
//!             [watchdog ms]
//!     takes <count> of the semaphore's <permits> permits, prints "held <fence>", then sleeps
//!     until killed
//! lock-worker <redis url | config.toml> hold-read <rw lock key> <lease ms, 0 = watchdog> [watchdog ms]
//!     takes a read hold of the read-write lock, prints "held <fence>", then sleeps until killed
//! lock-worker <redis url | config.toml> hold-write <rw lock key> <lease ms, 0 = watchdog> [watchdog ms]
//!     takes a write hold of the read-write lock (waiting as long as it takes), prints
//!     "held <fence>", then sleeps until killed
//! lock-worker <redis url | config.toml> hold-as <lock key> <owner id>
//!     takes the lock as `OwnerId::across_processes(owner id)`, prints "held <fence>", sleeps
//! lock-worker <config.toml> annotated <key>
//!     starts the global service from the file and calls an annotated fn on "order:<key>" that
//!     calls another one on the same key; prints "ok <fence> <hold count inside>"
//! lock-worker testing-server
//!     starts a `lock_runtime::testing::RedisServer`, prints "port <port>", then sleeps until
//!     killed
//! lock-worker from-env annotated <key>
//!     the same with the global service set up by `init_from_env` (`$LOCK_CONFIG`, else a
//!     `lock.toml` in the working directory or beside the executable)
//! lock-worker <redis url | config.toml> history <lock key> <resource url> <resource key>
//!             <seconds> <lease ms, 0 = watchdog> [work=<ms>] [wait=<ms>] [name=<name>]
//!             [stop-point=<n> stop-window=<ms>]
//!             [kind=mutex | kind=rw writes=<percent> seed=<n> | kind=semaphore permits=<n> count=<k>]
//!     for the history checker (`lock_tests::history`): prints "ready", then loops until
//!     <seconds> passed or a line "stop" arrives on stdin: lock (waiting at most `wait`, default
//!     3000 ms), critical work (sleep `work` ms, default 3, given up if `lost()` fires), check
//!     `is_lost()`, one fenced write of the token to <resource key> on <resource url>
//!     (`history::FENCED_WRITE`), release. Prints per section
//!     "cs <owner> <fence> <start ns> <end ns> <write 1|0|-|e|h|r> <lost 0|1> <hold> <seen>"
//!     (CLOCK_MONOTONIC; write: accepted, rejected as stale, skipped as lost, failed, half
//!     written, a reader's; hold and seen: see `history::Hold` and `history::Seen`), per failure
//!     "err <lock|release|write|read> <kind> <ns> <message>", and "done" at the end.
//!     In its <n>-th section, after the `is_lost()` check and before the write, it prints
//!     "stop-point <fence>" and waits `stop-window` ms (default 300) for the test to SIGSTOP it.
//!     The lock is <lock key> of the kind (default mutex):
//!     * rw: each section is a write hold with probability `writes`% (default 30; drawn from
//!       `seed`, default 1; the stop point's section always writes), else a read share. A
//!       writer writes in two parts, `work` ms apart: `history::FENCED_WRITE`, then
//!       `history::FENCED_WRITE_END` (write `h` when the second was refused); the critical work
//!       before comes first as for a mutex. A reader reads the resource's `fence` and `done` at
//!       once after its grant and again after its work (unless lost by then), and writes
//!       nothing;
//!     * semaphore: `count` (default 1) of the `permits` (default 2) permits of the semaphore
//!       <lock key>; the section is a mutex's otherwise.
//! ```

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{
    LockConfig, LockError, LockGuard, LockService, Permit, ReadGuard, Topology, WriteGuard,
    distributed_lock,
};
use lock_tests::history::{
    FENCED_WRITE, FENCED_WRITE_END, Hold, Seen, Snapshot, Write, monotonic_ns, resource_log_key,
};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = &args[0];
    if url == "testing-server" {
        let server = lock_runtime::testing::RedisServer::start()
            .await
            .expect("start a test redis-server");
        println!("port {}", server.port());
        std::future::pending::<()>().await;
    }
    if url == "from-env" && args[1] == "annotated" {
        lock_runtime::init_from_env()
            .await
            .expect("init from the environment");
        let (fence, count) = checkout(&args[2]).await.expect("annotated call");
        println!("ok {fence} {count}");
        return;
    }
    let watchdog_ms: u64 = match args[1].as_str() {
        "hold" | "hold-read" | "hold-write" => {
            args.get(4).and_then(|a| a.parse().ok()).unwrap_or(30_000)
        }
        "permit" => args.get(6).and_then(|a| a.parse().ok()).unwrap_or(30_000),
        _ => 30_000,
    };
    let config = if url.ends_with(".toml") {
        LockConfig::from_file(url).expect("config file")
    } else {
        LockConfig::single(url.clone()).with_watchdog_timeout(Duration::from_millis(watchdog_ms))
    };
    if args[1] == "annotated" {
        lock_runtime::init_from_file(url)
            .await
            .expect("init from the config file");
        let (fence, count) = checkout(&args[2]).await.expect("annotated call");
        println!("ok {fence} {count}");
        return;
    }
    let locks = LockService::connect(config).await.expect("connect");
    match args[1].as_str() {
        "counter" => {
            counter(
                &locks,
                &args[2],
                &args[3],
                args[4].parse().expect("iterations"),
            )
            .await
        }
        "hold" => hold(&locks, &args[2], args[3].parse().expect("lease ms")).await,
        "hold-read" => hold_read(&locks, &args[2], args[3].parse().expect("lease ms")).await,
        "hold-write" => hold_write(&locks, &args[2], args[3].parse().expect("lease ms")).await,
        "history" => history(&locks, &args[2..]).await,
        "permit" => permit(&locks, &args[2..]).await,
        "hold-as" => {
            let owner = lock_runtime::OwnerId::across_processes(args[3].clone());
            let guard = locks.lock(&args[2]).owner(owner).await.expect("lock");
            println!("held {}", guard.fence());
            std::future::pending::<()>().await;
        }
        other => panic!("unknown mode {other}"),
    }
}

async fn counter(locks: &LockService, key: &str, counter_key: &str, iterations: u32) {
    let mut con = Raw::connect(locks.config().topology()).await;
    let mut last_fence = 0;
    for _ in 0..iterations {
        let guard = locks.lock(key).await.expect("lock");
        assert!(guard.fence() > last_fence, "fencing token went backwards");
        last_fence = guard.fence();
        let value: Option<u64> = con.query(redis::cmd("GET").arg(counter_key)).await;
        tokio::task::yield_now().await;
        let _: () = con
            .query(
                redis::cmd("SET")
                    .arg(counter_key)
                    .arg(value.unwrap_or(0) + 1),
            )
            .await;
        guard.release().await.expect("release");
    }
    println!("done");
}

/// Plain commands on the data the lock protects, on any topology.
enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    async fn connect(topology: &Topology) -> Raw {
        match topology {
            Topology::Single { url } | Topology::MasterSlave { master: url, .. } => Raw::Single(
                redis::Client::open(url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
            ),
            Topology::Cluster { nodes } => Raw::Cluster(
                redis::cluster::ClusterClient::new(nodes.clone())
                    .unwrap()
                    .get_async_connection()
                    .await
                    .unwrap(),
            ),
            Topology::Sentinel {
                master_name,
                sentinels,
            } => {
                let mut sentinel = redis::Client::open(sentinels[0].as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let (host, port): (String, u16) = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(master_name)
                    .query_async(&mut sentinel)
                    .await
                    .unwrap();
                let url = format!("redis://{host}:{port}");
                Raw::Single(
                    redis::Client::open(url)
                        .unwrap()
                        .get_multiplexed_async_connection()
                        .await
                        .unwrap(),
                )
            }
            other => panic!("unsupported topology {other:?}"),
        }
    }

    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            Raw::Single(c) => cmd.query_async(c).await.expect("raw command"),
            Raw::Cluster(c) => cmd.query_async(c).await.expect("raw command"),
        }
    }
}

#[distributed_lock(key = "order:<key>", wait = "5s")]
async fn checkout(key: &str) -> Result<(u64, u32), LockError> {
    reserve_stock(key).await
}

#[distributed_lock(key = "order:<key>", wait = "5s")]
async fn reserve_stock(key: &str) -> Result<(u64, u32), LockError> {
    let locks = lock_runtime::global().await?;
    let info = locks.inspect(&format!("order:{key}")).await?;
    Ok((lock_runtime::current_fence().unwrap_or(0), info.hold_count))
}

async fn hold(locks: &LockService, key: &str, lease_ms: u64) {
    let mut request = locks.lock(key);
    if lease_ms > 0 {
        request = request.lease(Duration::from_millis(lease_ms));
    }
    let guard = request.await.expect("lock");
    println!("held {}", guard.fence());
    std::future::pending::<()>().await;
    drop(guard);
}

async fn permit(locks: &LockService, args: &[String]) {
    let semaphore = locks.semaphore(args[0].as_str(), args[1].parse().expect("permits"));
    let mut request = semaphore.acquire_many(args[2].parse().expect("count"));
    let lease_ms: u64 = args[3].parse().expect("lease ms");
    if lease_ms > 0 {
        request = request.lease(Duration::from_millis(lease_ms));
    }
    let permit = request.await.expect("permit");
    println!("held {}", permit.fence());
    std::future::pending::<()>().await;
    drop(permit);
}

async fn hold_read(locks: &LockService, key: &str, lease_ms: u64) {
    let mut request = locks.read(key);
    if lease_ms > 0 {
        request = request.lease(Duration::from_millis(lease_ms));
    }
    let guard = request.await.expect("read lock");
    println!("held {}", guard.fence());
    std::future::pending::<()>().await;
    drop(guard);
}

async fn hold_write(locks: &LockService, key: &str, lease_ms: u64) {
    let mut request = locks.write(key);
    if lease_ms > 0 {
        request = request.lease(Duration::from_millis(lease_ms));
    }
    let guard = request.await.expect("write lock");
    println!("held {}", guard.fence());
    std::future::pending::<()>().await;
    drop(guard);
}

/// The kind of lock a `history` worker takes.
#[derive(Debug, Clone, Copy)]
enum Family {
    Mutex,
    /// Write holds `writes` percent of the time, read shares otherwise.
    Rw {
        writes: u64,
    },
    /// `count` permits of a semaphore of `permits`.
    Semaphore {
        permits: u32,
        count: u32,
    },
}

/// Settings of the `history` mode.
struct HistoryArgs {
    family: Family,
    seed: u64,
    key: String,
    resource_url: String,
    resource: String,
    run_for: Duration,
    lease: Option<Duration>,
    work: Duration,
    wait: Duration,
    name: String,
    stop_point: Option<u64>,
    stop_window: Duration,
}

impl HistoryArgs {
    fn parse(args: &[String]) -> HistoryArgs {
        let ms = |v: &str| Duration::from_millis(v.parse().expect("milliseconds"));
        let lease_ms: u64 = args[4].parse().expect("lease ms");
        let (mut kind, mut writes, mut permits, mut count) = ("mutex", 30, 2, 1);
        let mut parsed = HistoryArgs {
            family: Family::Mutex,
            seed: 1,
            key: args[0].clone(),
            resource_url: args[1].clone(),
            resource: args[2].clone(),
            run_for: Duration::from_secs_f64(args[3].parse().expect("seconds")),
            lease: (lease_ms > 0).then(|| Duration::from_millis(lease_ms)),
            work: Duration::from_millis(3),
            wait: Duration::from_millis(3000),
            name: format!("pid{}", std::process::id()),
            stop_point: None,
            stop_window: Duration::from_millis(300),
        };
        for option in &args[5..] {
            let (name, value) = option.split_once('=').expect("option name=value");
            match name {
                "work" => parsed.work = ms(value),
                "wait" => parsed.wait = ms(value),
                "name" => parsed.name = value.to_owned(),
                "stop-point" => parsed.stop_point = Some(value.parse().expect("section number")),
                "stop-window" => parsed.stop_window = ms(value),
                "kind" => kind = value,
                "writes" => writes = value.parse().expect("percent"),
                "seed" => parsed.seed = value.parse().expect("seed"),
                "permits" => permits = value.parse().expect("permits"),
                "count" => count = value.parse().expect("permits per grant"),
                other => panic!("unknown history option {other}"),
            }
        }
        parsed.family = match kind {
            "mutex" => Family::Mutex,
            "rw" => Family::Rw { writes },
            "semaphore" => Family::Semaphore { permits, count },
            other => panic!("unknown kind {other}"),
        };
        parsed
    }
}

/// A small seeded generator (splitmix64): the read/write choices of a worker follow its seed.
struct Draw(u64);

impl Draw {
    fn percent(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % 100
    }
}

/// A hold of any kind of the family, as far as a history worker uses it.
enum Held {
    Mutex(LockGuard),
    Read(ReadGuard),
    Write(WriteGuard),
    Permit(Permit),
}

/// Calls the same method on whichever guard it is.
macro_rules! each {
    ($held:expr, $g:ident => $e:expr) => {
        match $held {
            Held::Mutex($g) => $e,
            Held::Read($g) => $e,
            Held::Write($g) => $e,
            Held::Permit($g) => $e,
        }
    };
}

impl Held {
    fn fence(&self) -> u64 {
        each!(self, g => g.fence())
    }

    fn owner(&self) -> String {
        each!(self, g => g.owner().to_string())
    }

    fn is_lost(&self) -> bool {
        each!(self, g => g.is_lost())
    }

    async fn lost(&self) -> LockError {
        each!(self, g => g.lost().await)
    }

    async fn release(self) -> Result<(), LockError> {
        each!(self, g => g.release().await)
    }
}

/// Takes the hold of a history section: `write` chooses between the two holds of a
/// read-write lock.
async fn take(
    locks: &LockService,
    args: &HistoryArgs,
    write: bool,
) -> Result<(Held, Hold), LockError> {
    let key = args.key.as_str();
    macro_rules! ask {
        ($request:expr) => {{
            let mut request = $request.wait(args.wait);
            if let Some(lease) = args.lease {
                request = request.lease(lease);
            }
            request.await?
        }};
    }
    Ok(match args.family {
        Family::Mutex => (Held::Mutex(ask!(locks.lock(key))), Hold::Exclusive),
        Family::Rw { .. } if write => (Held::Write(ask!(locks.write(key))), Hold::Exclusive),
        Family::Rw { .. } => (Held::Read(ask!(locks.read(key))), Hold::Read),
        Family::Semaphore { permits, count } => {
            let semaphore = locks.semaphore(key, permits);
            let permit = ask!(semaphore.acquire_many(count));
            (Held::Permit(permit), Hold::Permits { count, of: permits })
        }
    })
}

/// Prints one line and flushes it at once (stdout is a pipe the test reads as it goes).
fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(line);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// Prints `err <op> <kind> <ns> <message on one line>`.
fn say_error(op: &str, kind: &str, message: impl std::fmt::Display) {
    let at = monotonic_ns();
    let message = message.to_string().replace('\n', " ");
    say(format_args!("err {op} {kind} {at} {message}"));
}

/// Sets the flag when a line "stop" arrives on stdin (end of input does not stop the worker).
fn stop_on_request() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            match line {
                Ok(l) if l.trim() == "stop" => {
                    flag.store(true, Ordering::SeqCst);
                    return;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    stop
}

async fn history(locks: &LockService, args: &[String]) {
    let args = HistoryArgs::parse(args);
    let mut resource = redis::Client::open(args.resource_url.as_str())
        .expect("resource url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the resource");
    let fenced = Fenced {
        first: redis::Script::new(FENCED_WRITE),
        end: redis::Script::new(FENCED_WRITE_END),
        resource: args.resource.clone(),
        log: resource_log_key(&args.resource),
        name: args.name.clone(),
    };
    let mut draw = Draw(args.seed);
    let stop = stop_on_request();
    let until = Instant::now() + args.run_for;
    let mut sections = 0u64;
    say(format_args!("ready"));
    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
        let stop_here = args.stop_point == Some(sections + 1);
        let write = match args.family {
            Family::Rw { writes } => stop_here || draw.percent() < writes,
            _ => true,
        };
        let (guard, hold) = match take(locks, &args, write).await {
            Ok(taken) => taken,
            Err(e) => {
                say_error("lock", &format!("{:?}", e.kind()), &e);
                // do not spin while the servers are unreachable
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let start = monotonic_ns();
        sections += 1;
        let fence = guard.fence();
        let mut seen = None;
        if hold == Hold::Read {
            seen = fenced.look(&mut resource).await;
        }
        let lost_during_work = tokio::select! {
            biased;
            _ = guard.lost() => true,
            () = tokio::time::sleep(args.work) => false,
        };
        let mut write = Write::Skipped;
        if hold == Hold::Read {
            write = Write::Reader;
            if let Some(first) = seen
                && !lost_during_work
                && !guard.is_lost()
            {
                let last = fenced.look(&mut resource).await;
                seen = last.map(|last| Seen {
                    first: first.first,
                    last: Some(last.first),
                });
            }
        } else if !lost_during_work && !guard.is_lost() {
            if stop_here {
                // The worst moment for a pause: the holder has just checked that its lock is
                // valid and is about to write. Only the token can stop a stale write now.
                say(format_args!("stop-point {fence}"));
                tokio::time::sleep(args.stop_window).await;
            }
            write = fenced.write(&mut resource, fence).await;
            if matches!(guard, Held::Write(_)) && write == Write::Accepted {
                // the second part, after a while in which a reader that is not kept out would
                // see the first part alone; finished even when the hold is lost meanwhile (a
                // write under way completes), refused only when a newer writer wrote
                tokio::time::sleep(args.work).await;
                write = fenced.end(&mut resource, fence).await;
            }
        }
        let lost = guard.is_lost();
        let end = monotonic_ns();
        let seen = seen.map_or("-".to_owned(), |s| s.as_string());
        say(format_args!(
            "cs {} {fence} {start} {end} {} {} {} {seen}",
            guard.owner(),
            write.as_str(),
            u8::from(lost),
            hold.as_string(),
        ));
        if let Err(e) = guard.release().await {
            say_error("release", &format!("{:?}", e.kind()), &e);
        }
    }
    say(format_args!("done"));
}

/// The fenced resource of a history worker (see `lock_tests::history`).
struct Fenced {
    first: redis::Script,
    end: redis::Script,
    resource: String,
    log: String,
    name: String,
}

impl Fenced {
    /// The fenced write (a writer's first part): accepted, rejected as stale, or failed.
    async fn write(&self, con: &mut redis::aio::MultiplexedConnection, fence: u64) -> Write {
        match self
            .first
            .key(&self.resource)
            .key(&self.log)
            .arg(fence)
            .arg(&self.name)
            .invoke_async::<i64>(con)
            .await
        {
            Ok(1) => Write::Accepted,
            Ok(_) => Write::Rejected,
            Err(e) => {
                say_error("write", "Redis", &e);
                Write::Failed
            }
        }
    }

    /// A writer's second part, after its first was accepted: accepted, or half written.
    async fn end(&self, con: &mut redis::aio::MultiplexedConnection, fence: u64) -> Write {
        match self
            .end
            .key(&self.resource)
            .arg(fence)
            .invoke_async::<i64>(con)
            .await
        {
            Ok(1) => Write::Accepted,
            Ok(_) => Write::Half,
            Err(e) => {
                say_error("write", "Redis", &e);
                Write::Failed
            }
        }
    }

    /// What a reader sees: both parts at one moment (`first` of the result; `None` when the
    /// resource did not answer).
    async fn look(&self, con: &mut redis::aio::MultiplexedConnection) -> Option<Seen> {
        let parts: redis::RedisResult<(Option<u64>, Option<u64>)> = redis::cmd("HMGET")
            .arg(&self.resource)
            .arg("fence")
            .arg("done")
            .query_async(con)
            .await;
        match parts {
            Ok((fence, done)) => Some(Seen {
                first: Snapshot {
                    fence: fence.unwrap_or(0),
                    done: done.unwrap_or(0),
                },
                last: None,
            }),
            Err(e) => {
                say_error("read", "Redis", &e);
                None
            }
        }
    }
}
