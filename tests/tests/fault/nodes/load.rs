//! The load of the history scenarios: `lock-worker history` processes that contend for one
//! lock and write to one fenced resource while the test injects faults. The figures the
//! history checker (`lock_tests::history`) makes of what they recorded are in `super::figures`.
//!
//! A scenario starts a [`Load`] (the workers print `ready`), injects its faults while the
//! workers run and records each with [`Load::fault`] (begin and end on the workers' clock,
//! [`monotonic_ns`]), then calls [`Load::finish`], which tells every worker to stop, waits for
//! them, and checks the history and the resource's log into an [`Outcome`]. Workers are
//! killed when the load is dropped (also when the test panics), and they die with the test
//! process (`PR_SET_PDEATHSIG`, see `harness::spawn_child`).
//!
//! The workers take one lock of the family ([`Family`]): a mutex, a read-write lock (reading
//! and writing at random, from a seed) or a semaphore, and [`Outcome`] checks what may overlap
//! for that kind (see `lock_tests::history`). The seed is `HISTORY_SEED` when set, else
//! random, and printed with the figures: a failure names it, and `HISTORY_SEED=<seed>` repeats
//! the workers' choices of read or write (not the timing of the faults).
//!
//! With `HISTORY_DUMP_DIR=<dir>` every scenario also writes what it recorded to
//! `<dir>/<scenario>.txt`: the faults (`fault <begin ns> <end ns> <label>`), the workers' error
//! lines (`<worker> err <op> <kind> <ns> <message>`) and the sections
//! (`cs <worker> <owner> <fence> <start ns> <end ns> <write> <lost> <hold> <seen>`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lock_tests::harness::{Kind, shared, unique_key};
use lock_tests::history::{self, Event, History, LogEntry, monotonic_ns, resource_log_key};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::figures::Outcome;
use crate::common::Worker;

/// How long a worker may take to connect and print `ready`.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How long workers may take to stop after they were told to (a lock call in progress is
/// bounded by its wait and the response timeout).
const DONE_WITHIN: Duration = Duration::from_secs(20);

/// The fenced resource: a hash and its log on the test binary's shared single server, which
/// no fault touches (see `lock_tests::history` for why it does not live on the lock servers).
#[derive(Debug, Clone)]
pub(crate) struct Resource {
    pub(crate) url: String,
    pub(crate) key: String,
}

impl Resource {
    /// A fresh resource key on the shared single server.
    pub(crate) async fn new() -> Resource {
        let topo = shared(Kind::Single).await;
        Resource {
            url: topo.url(),
            key: format!("res:{{{}}}", unique_key("history")),
        }
    }

    /// The resource's log, in the order it saw the writes.
    async fn log(&self) -> Vec<LogEntry> {
        let mut con = redis::Client::open(self.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(resource_log_key(&self.key))
            .arg(0)
            .arg(-1)
            .query_async(&mut con)
            .await
            .unwrap();
        lines
            .iter()
            .map(|l| LogEntry::parse(l).unwrap_or_else(|| panic!("bad log entry {l:?}")))
            .collect()
    }
}

/// The kind of lock the workers of a load take (`lock-worker history kind=...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// `locks.lock(key)`.
    Mutex,
    /// `locks.write(key)` in `writes` percent of the sections, `locks.read(key)` in the others.
    Rw { writes: u32 },
    /// One permit at a time of `locks.semaphore(key, permits)`.
    Semaphore { permits: u32 },
}

impl Family {
    /// The read-write lock of the scenarios: a write in three sections or so, so that readers
    /// share often and writers come between them.
    pub(crate) const RW: Family = Family::Rw { writes: 30 };

    /// The semaphore of the scenarios: two permits for three workers, so that two hold at
    /// once most of the time and the third waits.
    pub(crate) const SEMAPHORE: Family = Family::Semaphore { permits: 2 };

    /// Its name in the figures.
    pub(crate) fn label(self) -> String {
        match self {
            Family::Mutex => "mutex".to_owned(),
            Family::Rw { writes } => format!("rw ({writes}% writes)"),
            Family::Semaphore { permits } => format!("semaphore of {permits}"),
        }
    }

    /// The Redis key of the lock `key` of this kind (default prefix; the hash tag, and so the
    /// cluster slot, is the same for every kind).
    pub(crate) fn redis_key(self, key: &str) -> String {
        match self {
            Family::Mutex => format!("lock:{{{key}}}"),
            Family::Rw { .. } => format!("lock:rw:{{{key}}}"),
            Family::Semaphore { .. } => format!("lock:sem:{{{key}}}"),
        }
    }

    /// The worker's options for this kind.
    fn options(self, seed: u64) -> Vec<String> {
        match self {
            Family::Mutex => vec!["kind=mutex".to_owned()],
            Family::Rw { writes } => vec![
                "kind=rw".to_owned(),
                format!("writes={writes}"),
                format!("seed={seed}"),
            ],
            Family::Semaphore { permits } => {
                vec!["kind=semaphore".to_owned(), format!("permits={permits}")]
            }
        }
    }

    /// Whether holders that keep their leases may still see their writes refused: permit
    /// holders of a semaphore of more than one permit hold together, and an older permit's
    /// write after a newer one's is refused.
    pub(super) fn concurrent_writers(self) -> bool {
        matches!(self, Family::Semaphore { permits } if permits > 1)
    }
}

/// The seed of a load: `HISTORY_SEED`, else random.
fn seed() -> u64 {
    match std::env::var("HISTORY_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("HISTORY_SEED={s:?} is not a number")),
        Err(_) => rand::random::<u32>().into(),
    }
}

/// One worker of a load.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSpec {
    /// Its name in the figures and the resource's log.
    pub(crate) name: String,
    /// Its configuration file.
    pub(crate) config: PathBuf,
    /// The lock key it takes.
    pub(crate) key: String,
    /// Its lease, 0 for the watchdog.
    pub(crate) lease_ms: u64,
    /// More `name=value` options of `lock-worker history`.
    pub(crate) options: Vec<String>,
}

impl WorkerSpec {
    pub(crate) fn new(
        name: &str,
        config: &std::path::Path,
        key: &str,
        lease_ms: u64,
    ) -> WorkerSpec {
        WorkerSpec {
            name: name.to_owned(),
            config: config.to_owned(),
            key: key.to_owned(),
            lease_ms,
            options: Vec::new(),
        }
    }

    pub(crate) fn option(mut self, option: &str) -> WorkerSpec {
        self.options.push(option.to_owned());
        self
    }
}

/// A fault the test injected, on the workers' clock.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) label: String,
    pub(crate) begin: u64,
    pub(crate) end: u64,
    pub(crate) recovery: Recovery,
}

/// How the recovery from a fault is measured.
#[derive(Debug, Clone)]
pub(crate) enum Recovery {
    /// From the end of the fault to the first grant after it (to this worker only, when the
    /// fault hit only it).
    AfterEnd(Option<String>),
    /// From the beginning of the fault to the first grant to a worker other than this one (a
    /// holder was stopped: the lock recovers when someone else can take it).
    OthersAfterBegin(String),
}

/// What the workers printed so far.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) history: History,
    ready: Vec<bool>,
    done: Vec<bool>,
    ended: Vec<bool>,
    /// The stop point a worker reached: its token and when the test read it.
    pub(crate) stop_points: Vec<Option<(u64, u64)>>,
    /// The first message of each error kind.
    samples: BTreeMap<String, String>,
    /// Lines that are no event.
    unparsed: Vec<String>,
    /// Error lines as printed, with the worker's name in front (for `HISTORY_DUMP_DIR`).
    raw_errors: Vec<String>,
}

#[derive(Debug, Default)]
struct Shared {
    seen: Mutex<Seen>,
    changed: Notify,
}

impl Shared {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Workers running a scenario.
pub(crate) struct Load {
    family: Family,
    seed: u64,
    specs: Vec<WorkerSpec>,
    workers: Vec<Worker>,
    readers: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
    faults: Mutex<Vec<Fault>>,
    resource: Resource,
    started: u64,
}

impl Load {
    /// Starts the workers, taking locks of `family`, and waits until every one is ready.
    pub(crate) async fn start(resource: &Resource, family: Family, specs: Vec<WorkerSpec>) -> Load {
        let seed = seed();
        let shared = Arc::new(Shared::default());
        {
            let mut seen = shared.seen();
            seen.ready = vec![false; specs.len()];
            seen.done = vec![false; specs.len()];
            seen.ended = vec![false; specs.len()];
            seen.stop_points = vec![None; specs.len()];
        }
        let mut workers = Vec::new();
        let mut readers = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let lease = spec.lease_ms.to_string();
            let name = format!("name={}", spec.name);
            // each worker its own seed, all from the load's
            let kind = family.options(seed.wrapping_mul(31).wrapping_add(i as u64));
            let mut args = vec![
                spec.config.to_str().unwrap(),
                "history",
                &spec.key,
                &resource.url,
                &resource.key,
                "120",
                &lease,
                &name,
            ];
            args.extend(kind.iter().map(String::as_str));
            args.extend(spec.options.iter().map(String::as_str));
            let mut worker = Worker::spawn_with_stdin(&args);
            let mut lines = worker.take_lines();
            let (shared, name, key) = (shared.clone(), spec.name.clone(), spec.key.clone());
            readers.push(tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    let event = history::parse_line(&name, &key, &line);
                    let mut seen = shared.seen();
                    match event {
                        Some(Event::Ready) => seen.ready[i] = true,
                        Some(Event::Done) => seen.done[i] = true,
                        Some(Event::StopPoint { fence }) => {
                            seen.stop_points[i] = Some((fence, monotonic_ns()));
                        }
                        Some(event @ Event::Error { .. }) => {
                            seen.raw_errors.push(format!("{name} {line}"));
                            if let Event::Error { op, kind, .. } = &event {
                                seen.samples
                                    .entry(format!("{op} {kind}"))
                                    .or_insert_with(|| format!("{name}: {line}"));
                            }
                            seen.history.apply(&event);
                        }
                        Some(event) => {
                            seen.history.apply(&event);
                        }
                        None => seen.unparsed.push(format!("{name}: {line}")),
                    }
                    drop(seen);
                    shared.changed.notify_waiters();
                }
                shared.seen().ended[i] = true;
                shared.changed.notify_waiters();
            }));
            workers.push(worker);
        }
        let load = Load {
            family,
            seed,
            specs,
            workers,
            readers,
            shared,
            faults: Mutex::new(Vec::new()),
            resource: resource.clone(),
            started: 0,
        };
        load.until("every worker is ready", READY_WITHIN, |s| {
            s.ready.iter().all(|r| *r).then_some(())
        })
        .await;
        Load {
            started: monotonic_ns(),
            ..load
        }
    }

    /// Waits until `check` finds what it looks for in what the workers printed.
    ///
    /// # Panics
    ///
    /// After `within`, with `what`; or when a worker ended before it said `done`.
    pub(crate) async fn until<T>(
        &self,
        what: &str,
        within: Duration,
        mut check: impl FnMut(&Seen) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let seen = self.shared.seen();
                if let Some(found) = check(&seen) {
                    return found;
                }
                if let Some(i) = (0..self.specs.len()).find(|&i| seen.ended[i] && !seen.done[i]) {
                    panic!(
                        "worker {} exited early (waiting for: {what}); unparsed output: {:?}",
                        self.specs[i].name, seen.unparsed
                    );
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let seen = self.shared.seen();
                let last = seen.raw_errors.len().saturating_sub(5);
                panic!(
                    "not within {within:?}: {what} (grants so far {}, errors {:?}, the last \
                     ones: {:#?}; seed {})",
                    seen.history.grants(),
                    seen.history.errors(),
                    &seen.raw_errors[last..],
                    self.seed
                );
            }
        }
    }

    /// Waits until `n` sections started after `at` (by anyone).
    pub(crate) async fn grants_after(&self, at: u64, n: usize, within: Duration) {
        self.until(&format!("{n} grants after the fault"), within, |s| {
            (s.history.grants_after(at) >= n).then_some(())
        })
        .await;
    }

    /// Waits until the worker `name` was granted the lock after `at`.
    pub(crate) async fn granted_to(&self, name: &str, at: u64, within: Duration) {
        self.until(&format!("a grant to {name} after the fault"), within, |s| {
            s.history.first_grant_after(at, Some(name)).map(|_| ())
        })
        .await;
    }

    /// Waits until every worker was granted the lock after `at`.
    pub(crate) async fn granted_to_each(&self, at: u64, within: Duration) {
        for spec in &self.specs {
            self.granted_to(&spec.name, at, within).await;
        }
    }

    /// Lets the workers run for `d`.
    pub(crate) async fn run_for(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Records a fault that hit everyone (`worker` `None`) or one worker.
    pub(crate) fn fault(&self, label: &str, begin: u64, end: u64, worker: Option<&str>) {
        self.record(
            label,
            begin,
            end,
            Recovery::AfterEnd(worker.map(str::to_owned)),
        );
    }

    /// Records a fault that stopped the holder `worker`.
    pub(crate) fn holder_fault(&self, label: &str, begin: u64, end: u64, worker: &str) {
        self.record(
            label,
            begin,
            end,
            Recovery::OthersAfterBegin(worker.to_owned()),
        );
    }

    fn record(&self, label: &str, begin: u64, end: u64, recovery: Recovery) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Fault {
                label: label.to_owned(),
                begin,
                end,
                recovery,
            });
    }

    /// The process id of the worker `name`.
    pub(crate) fn pid(&self, name: &str) -> u32 {
        let i = self.index(name);
        self.workers[i].pid()
    }

    fn index(&self, name: &str) -> usize {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .unwrap_or_else(|| panic!("no worker {name}"))
    }

    /// Waits until the worker `name` reached its stop point; returns its token and when the
    /// test read the line.
    pub(crate) async fn stop_point(&self, name: &str, within: Duration) -> (u64, u64) {
        let i = self.index(name);
        self.until(&format!("{name} reaches its stop point"), within, |s| {
            s.stop_points[i]
        })
        .await
    }

    /// Tells every worker to stop, waits until they did, and checks what they recorded.
    pub(crate) async fn finish(mut self, scenario: &str) -> Outcome {
        for worker in &mut self.workers {
            worker.tell("stop");
        }
        self.until("every worker is done", DONE_WITHIN, |s| {
            s.done.iter().all(|d| *d).then_some(())
        })
        .await;
        for reader in std::mem::take(&mut self.readers) {
            tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("a worker's output ends after it is done")
                .unwrap();
        }
        let finished = monotonic_ns();
        let (history, samples, unparsed, raw_errors) = {
            let mut seen = self.shared.seen();
            (
                std::mem::take(&mut seen.history),
                std::mem::take(&mut seen.samples),
                std::mem::take(&mut seen.unparsed),
                std::mem::take(&mut seen.raw_errors),
            )
        };
        let faults = std::mem::take(&mut *self.faults.lock().unwrap());
        let scenario = format!("{}: {scenario}", self.family.label());
        if let Some(dir) = std::env::var_os("HISTORY_DUMP_DIR") {
            dump(dir.as_ref(), &scenario, &faults, &raw_errors, &history);
        }
        let log = self.resource.log().await;
        Outcome::new(
            &scenario,
            self.family,
            self.seed,
            history,
            faults,
            &log,
            samples,
            unparsed,
            finished - self.started,
        )
    }
}

/// Writes what a scenario recorded to `dir/<scenario>.txt`: its faults, the workers' error
/// lines and the sections, one a line, for a closer look than the table gives.
fn dump(dir: &std::path::Path, scenario: &str, faults: &[Fault], errors: &[String], h: &History) {
    let mut text = String::new();
    for f in faults {
        text.push_str(&format!("fault {} {} {:?}\n", f.begin, f.end, f.label));
    }
    for e in errors {
        text.push_str(&format!("{e}\n"));
    }
    for s in h.sections() {
        text.push_str(&format!(
            "cs {} {} {} {} {} {:?} {} {} {}\n",
            s.worker,
            s.owner,
            s.fence,
            s.start,
            s.end,
            s.write,
            s.lost,
            s.hold.as_string(),
            s.seen.map_or("-".to_owned(), |seen| seen.as_string())
        ));
    }
    let name: String = scenario
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let path = dir.join(format!("{name}.txt"));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// A configuration file for the workers in `dir`, named `name.toml`.
pub(crate) fn config(
    dir: &std::path::Path,
    name: &str,
    topology: &lock_runtime::Topology,
    watchdog: Duration,
    extra: &str,
) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    crate::common::write_config(&path, topology, watchdog, extra);
    path
}

/// Three workers on one key with the same configuration and lease.
pub(crate) fn trio(config: &std::path::Path, key: &str, lease_ms: u64) -> Vec<WorkerSpec> {
    ["w0", "w1", "w2"]
        .iter()
        .map(|n| WorkerSpec::new(n, config, key, lease_ms))
        .collect()
}
