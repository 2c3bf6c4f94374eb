//! Helpers shared by the lock test suites.
//!
//! The test binaries include this module (first, with `#[macro_use]`, so that
//! [`topology_tests!`] is in scope in its other modules) and uses part of it.
#![allow(dead_code, unreachable_pub, unused_macros)]

use std::future::Future;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lock_runtime::{LockConfig, LockService};
use lock_tests::harness::{Kind, Spec, Topology, shared, spawn_child};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A running topology and how to build lock services on it.
pub struct Fixture {
    topo: Topo,
}

/// A topology shared by the tests of this binary, or one a fixture owns.
enum Topo {
    /// Lives until the process exits (see `harness::shared`).
    Shared(&'static Topology),
    /// Dropped with the fixture: its servers are killed and its directory removed then.
    Owned(Topology),
}

impl Fixture {
    pub async fn single() -> Fixture {
        Fixture::shared(Kind::Single).await
    }

    /// The topology of `kind` shared by the tests of this binary.
    pub async fn shared(kind: Kind) -> Fixture {
        Fixture {
            topo: Topo::Shared(shared(kind).await),
        }
    }

    /// A fixture on a topology of its own (for tests that kill or fail over nodes). Its
    /// processes and directory go away when the fixture is dropped, so declare it before the
    /// services that use it (locals drop in reverse order).
    pub async fn own(spec: Spec) -> Fixture {
        Fixture {
            topo: Topo::Owned(Topology::start(spec).await),
        }
    }

    /// A fixture on a TLS-only topology of its own ([`Topology::start_tls`]); its
    /// configurations carry the CA and the client certificate of `pki`.
    pub async fn own_tls(spec: Spec, pki: lock_tests::harness::Pki) -> Fixture {
        Fixture {
            topo: Topo::Owned(Topology::start_tls(spec, std::sync::Arc::new(pki)).await),
        }
    }

    /// The running topology.
    pub fn topo(&self) -> &Topology {
        match &self.topo {
            Topo::Shared(topo) => topo,
            Topo::Owned(topo) => topo,
        }
    }

    pub fn kind(&self) -> Kind {
        self.topo().spec().kind()
    }

    /// The topology as a lock configuration.
    pub fn topology(&self) -> lock_runtime::Topology {
        match self.kind() {
            Kind::Single => lock_runtime::Topology::Single {
                url: self.topo().url(),
            },
            Kind::MasterReplicas => lock_runtime::Topology::MasterSlave {
                master: self.topo().master_url(),
                replicas: self.topo().replica_urls(),
            },
            Kind::Sentinel => lock_runtime::Topology::Sentinel {
                master_name: self.topo().master_name().to_owned(),
                sentinels: self.topo().sentinel_urls(),
            },
            Kind::Cluster => lock_runtime::Topology::Cluster {
                nodes: self.topo().node_urls(),
            },
        }
    }

    /// A configuration for this topology with the given watchdog timeout.
    pub fn config(&self, watchdog: Duration) -> LockConfig {
        let config = LockConfig::new(self.topology()).with_watchdog_timeout(watchdog);
        match self.topo().tls() {
            Some(pki) => config.with_tls(pki.lock_tls()),
            None => config,
        }
    }

    /// The same configuration as a file in `dir`, the way applications configure the mode.
    pub fn config_file(
        &self,
        dir: &std::path::Path,
        watchdog: Duration,
        extra: &str,
    ) -> std::path::PathBuf {
        let path = dir.join(format!("{}.toml", self.topology().mode()));
        write_config(&path, &self.topology(), watchdog, extra);
        path
    }

    /// A new service (its own connections, watchdog, subscriber and waiter lines), like
    /// another instance of an application.
    pub async fn service(&self, watchdog: Duration) -> LockService {
        LockService::connect(self.config(watchdog))
            .await
            .expect("connect")
    }

    /// A plain connection to the master (single, master-slave, sentinel's first master).
    pub fn redis(&self) -> redis::Connection {
        self.topo().conn(self.topo().master_port())
    }

    /// An async connection for raw commands on any key of this topology.
    pub async fn raw(&self) -> Raw {
        match self.kind() {
            Kind::Cluster => {
                let client = redis::cluster::ClusterClient::new(self.topo().node_urls()).unwrap();
                Raw::Cluster(client.get_async_connection().await.unwrap())
            }
            Kind::Sentinel => {
                let url = Topology::url_of(self.topo().current_master());
                Raw::Single(
                    redis::Client::open(url)
                        .unwrap()
                        .get_multiplexed_async_connection()
                        .await
                        .unwrap(),
                )
            }
            _ => Raw::Single(
                redis::Client::open(self.topo().master_url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
            ),
        }
    }
}

/// Writes a configuration file for `topology` to `path`: `extra` goes into the `[redis]`
/// table (e.g. `response_timeout = "1s"`).
pub fn write_config(
    path: &std::path::Path,
    topology: &lock_runtime::Topology,
    watchdog: Duration,
    extra: &str,
) {
    let list = |urls: &[String]| {
        format!(
            "[{}]",
            urls.iter()
                .map(|u| format!("{u:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let redis = match topology {
        lock_runtime::Topology::Single { url } => format!("mode = \"single\"\nurl = {url:?}"),
        lock_runtime::Topology::MasterSlave { master, replicas } => {
            format!(
                "mode = \"master-slave\"\nmaster = {master:?}\nreplicas = {}",
                list(replicas)
            )
        }
        lock_runtime::Topology::Sentinel {
            master_name,
            sentinels,
        } => {
            format!(
                "mode = \"sentinel\"\nmaster_name = {master_name:?}\nsentinels = {}",
                list(sentinels)
            )
        }
        lock_runtime::Topology::Cluster { nodes } => {
            format!("mode = \"cluster\"\nnodes = {}", list(nodes))
        }
        other => panic!("unknown topology {other:?}"),
    };
    let text = format!(
        "[redis]\n{redis}\n{extra}\n[lock]\nwatchdog_timeout = \"{}ms\"\n",
        watchdog.as_millis()
    );
    std::fs::write(path, text).unwrap();
}

/// Raw commands on a single server or a cluster.
pub enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    pub async fn get(&mut self, key: &str) -> Option<u64> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        match self {
            Raw::Single(c) => cmd.query_async(c).await.unwrap(),
            Raw::Cluster(c) => cmd.query_async(c).await.unwrap(),
        }
    }

    pub async fn set(&mut self, key: &str, value: u64) {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value);
        let _: () = match self {
            Raw::Single(c) => cmd.query_async(c).await.unwrap(),
            Raw::Cluster(c) => cmd.query_async(c).await.unwrap(),
        };
    }
}

/// Polls `check` every 10 ms until it returns true; panics with `what` after `within`.
/// A server of its own with a fault proxy in front of it, and a service that reaches the server
/// only through the proxy, configured by `configure`.
pub async fn behind_proxy(
    configure: impl FnOnce(LockConfig) -> LockConfig,
) -> (Fixture, lock_tests::harness::Proxy, LockService) {
    let fx = Fixture::own(Spec::Single).await;
    let proxy = lock_tests::harness::Proxy::start(Topology::addr_of(fx.topo().master_port())).await;
    let service = LockService::connect(configure(LockConfig::single(proxy.url())))
        .await
        .unwrap();
    (fx, proxy, service)
}

pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `service` has `n` callers in line for `key`.
pub async fn waiters_in_line(service: &LockService, key: &str, n: usize) {
    eventually(
        &format!("{n} waiters in line for {key}"),
        Duration::from_secs(5),
        || async { service.inspect(key).await.unwrap().local_waiters == n },
    )
    .await;
}

/// Waits until `service` has `n` callers in line for the lock `key` of `kind`.
pub async fn waiters_in_line_of(
    service: &LockService,
    kind: lock_runtime::LockKind,
    key: &str,
    n: usize,
) {
    eventually(
        &format!("{n} waiters in line for the {kind:?} {key}"),
        Duration::from_secs(5),
        || async { service.inspect_kind(kind, key).await.unwrap().local_waiters == n },
    )
    .await;
}

/// A `lock-worker` process (see src/bin/lock-worker.rs). Killed (and reaped) when dropped.
pub struct Worker {
    child: std::process::Child,
    lines: Option<WorkerLines>,
    stdin: Option<std::process::ChildStdin>,
}

/// What a worker prints, line by line.
pub type WorkerLines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

impl Worker {
    /// Starts a worker; call it inside a tokio runtime (its stdout is read through the runtime).
    ///
    /// The worker must not outlive this process, also when the test is killed (a nextest
    /// timeout, Ctrl-C): it gets `PR_SET_PDEATHSIG(SIGKILL)`. That signal follows the *thread*
    /// that forked the child, so it is not set here with `pre_exec` on a command spawned from
    /// the calling thread (a test thread, a runtime worker or a blocking-pool thread may exit
    /// while the worker is still in use, and the kernel would then kill it); nor by the worker
    /// itself after start (same thread problem). The worker is forked by the harness's spawner
    /// thread, which lives until the process exits (`harness::spawn_child`, which also closes
    /// the race of a parent dying before the signal is armed).
    pub fn spawn(args: &[&str]) -> Worker {
        Worker::start(args, false)
    }

    /// [`Worker::spawn`] with a pipe to the worker's stdin ([`Worker::tell`]).
    pub fn spawn_with_stdin(args: &[&str]) -> Worker {
        Worker::start(args, true)
    }

    /// Starts another program of this crate the same way (e.g. `env!("CARGO_BIN_EXE_web-shop")`).
    pub fn spawn_program(exe: &str, args: &[&str]) -> Worker {
        Worker::start_program(exe, args, false)
    }

    /// Starts `exe` with `args` like [`Worker::spawn_program`], in the working directory `cwd`
    /// and without the environment variable `unset`.
    pub fn spawn_program_in(
        exe: &str,
        args: &[&str],
        cwd: &std::path::Path,
        unset: &str,
    ) -> Worker {
        Worker::start_command(exe, args, false, |cmd| {
            cmd.current_dir(cwd).env_remove(unset);
        })
    }

    fn start(args: &[&str], stdin: bool) -> Worker {
        Worker::start_program(env!("CARGO_BIN_EXE_lock-worker"), args, stdin)
    }

    fn start_program(exe: &str, args: &[&str], stdin: bool) -> Worker {
        Worker::start_command(exe, args, stdin, |_| {})
    }

    fn start_command(
        exe: &str,
        args: &[&str],
        stdin: bool,
        configure: impl FnOnce(&mut std::process::Command),
    ) -> Worker {
        let mut cmd = std::process::Command::new(exe);
        configure(&mut cmd);
        cmd.args(args)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped());
        let mut child = spawn_child(cmd).unwrap_or_else(|e| panic!("spawn {exe}: {e}"));
        let stdout = tokio::process::ChildStdout::from_std(child.stdout.take().unwrap())
            .expect("register the worker's stdout with the runtime");
        let lines = BufReader::new(stdout).lines();
        let stdin = child.stdin.take();
        Worker {
            child,
            lines: Some(lines),
            stdin,
        }
    }

    /// The process id of the worker.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes `line` to the worker's stdin (started with [`Worker::spawn_with_stdin`]).
    pub fn tell(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self
            .stdin
            .as_mut()
            .expect("the worker was started with stdin");
        writeln!(stdin, "{line}").expect("write to the worker's stdin");
        stdin.flush().expect("flush the worker's stdin");
    }

    /// Takes the worker's output, to read it elsewhere; [`Worker::line`] cannot be used after.
    pub fn take_lines(&mut self) -> WorkerLines {
        self.lines
            .take()
            .expect("the worker's output was taken already")
    }

    /// The next line the worker prints, within `within`.
    pub async fn line(&mut self, within: Duration) -> String {
        let lines = self.lines.as_mut().expect("the worker's output was taken");
        tokio::time::timeout(within, lines.next_line())
            .await
            .expect("worker printed nothing in time")
            .expect("read worker output")
            .expect("worker exited")
    }

    /// `true` until the worker exits.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILLs the worker and reaps it.
    pub async fn kill(&mut self) {
        self.child.kill().expect("kill worker");
        self.exit_status(Duration::from_secs(10))
            .await
            .expect("a killed worker is reaped in time");
    }

    pub async fn success(mut self, within: Duration) -> bool {
        self.exit_status(within)
            .await
            .expect("worker did not finish in time")
            .success()
    }

    /// Polls for the exit without blocking the runtime; `None` if still running after `within`.
    async fn exit_status(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait worker") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SIGKILL, then reap: a killed process exits at once, so the wait is short.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Redis key of the lock `key` under the default prefix `lock:`, for keys without `{`, `}`
/// or `%` (which are escaped inside the hash tag); its waiting set, turn marker and wake-up
/// channel are this followed by `:wq`, `:turn` and `:ch` (its fence counter is the one of its
/// cluster slot: `LockService::fence_key`).
pub fn lock_key(key: &str) -> String {
    format!("lock:{{{key}}}")
}

impl Fixture {
    /// The port of the data node that serves the Redis key `redis_key` now: the master of its
    /// slot (cluster), the master the sentinels name (sentinel), else the master.
    pub fn node_for(&self, redis_key: &str) -> u16 {
        let topo = self.topo();
        match self.kind() {
            Kind::Cluster => topo.master_for_slot(topo.key_slot(redis_key)),
            Kind::Sentinel => topo.current_master(),
            Kind::Single | Kind::MasterReplicas => topo.master_port(),
        }
    }

    /// A blocking connection to the node serving `redis_key` (see [`Fixture::node_for`]).
    pub fn conn_for(&self, redis_key: &str) -> redis::Connection {
        self.topo().conn(self.node_for(redis_key))
    }

    /// Whether `redis_key` exists, asked of the node serving it.
    pub fn exists(&self, redis_key: &str) -> bool {
        let n: i64 = redis::cmd("EXISTS")
            .arg(redis_key)
            .query(&mut self.conn_for(redis_key))
            .unwrap();
        n == 1
    }

    /// How many clients are subscribed to the wake-up channel `channel` on the node serving it:
    /// `PUBSUB NUMSUB`, or `PUBSUB SHARDNUMSUB` in a cluster (wake-ups use sharded pub/sub).
    pub fn subscribers(&self, channel: &str) -> i64 {
        let sub = match self.kind() {
            Kind::Cluster => "SHARDNUMSUB",
            _ => "NUMSUB",
        };
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg(sub)
            .arg(channel)
            .query(&mut self.conn_for(channel))
            .unwrap();
        n
    }

    /// SIGSTOPs the processes on `ports` until the returned value is dropped (SIGCONT).
    pub fn stop(&self, ports: &[u16]) -> Stopped {
        let mut stopped = Stopped { pids: Vec::new() };
        for &port in ports {
            let pid = self
                .topo()
                .pid(port)
                .unwrap_or_else(|| panic!("no process on port {port}"));
            let pid = libc::pid_t::try_from(pid).unwrap();
            // SAFETY: signals a child process of this test by its pid.
            let rc = unsafe { libc::kill(pid, libc::SIGSTOP) };
            assert_eq!(rc, 0, "SIGSTOP {pid}: {}", std::io::Error::last_os_error());
            stopped.pids.push(pid);
        }
        stopped
    }
}

/// Processes stopped with SIGSTOP ([`Fixture::stop`]); dropping it continues them (SIGCONT),
/// also when the test fails while they are stopped.
#[must_use = "dropping it continues the processes at once"]
pub struct Stopped {
    pids: Vec<libc::pid_t>,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: signals a child process of this test by its pid.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }
}

/// The number of script calls the server has run: `EVALSHA`s and `FCALL`s (the lock operations
/// go as a Redis Function; `cmdstat_evalsha` and `cmdstat_fcall` of `INFO commandstats`); panics
/// when neither stat is there (no script ever ran) rather than reading 0.
pub fn script_calls(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let calls = |command: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    match (calls("evalsha"), calls("fcall")) {
        (None, None) => panic!("no script calls in INFO commandstats:\n{info}"),
        (scripts, functions) => scripts.unwrap_or(0) + functions.unwrap_or(0),
    }
}

/// Whether a `MONITOR` line is a script call: an `EVALSHA`, or an `FCALL` of the lock
/// operations' Function.
pub fn script_call(line: &str) -> bool {
    line.contains("\"EVALSHA\"") || line.contains("\"FCALL\"")
}

/// The commands one node runs, seen through `MONITOR` from when [`Monitor::start`] returns
/// until the monitor is dropped: the lines that match a filter are kept.
pub struct Monitor {
    port: u16,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The last `ECHO` seen (see [`Monitor::sync`]).
    echo: std::sync::Arc<std::sync::Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    /// Starts `MONITOR` on the node on `port` and keeps the lines `keep` accepts. Returns once
    /// the server confirmed: every command it runs from then on is seen.
    pub async fn start(port: u16, keep: impl Fn(&str) -> bool + Send + 'static) -> Monitor {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        stream.write_all(b"MONITOR\r\n").await.unwrap();
        let mut lines = BufReader::new(stream).lines();
        let ok = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .expect("MONITOR answered")
            .unwrap();
        assert_eq!(ok.as_deref(), Some("+OK"), "MONITOR on port {port}");
        let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let echo = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (sink, echoed) = (kept.clone(), echo.clone());
        let task = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("\"ECHO\"") {
                    *echoed.lock().unwrap() = line.clone();
                }
                if keep(&line) {
                    sink.lock().unwrap().push(line);
                }
            }
        });
        Monitor {
            port,
            lines: kept,
            echo,
            task,
        }
    }

    /// Returns once every command the node ran before this call has been seen: the monitor's
    /// stream lags behind the replies other clients get.
    pub async fn sync(&self) {
        let marker = lock_tests::harness::unique_key("monitor-sync");
        let mut con = redis::Client::open(Topology::url_of(self.port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: String = redis::cmd("ECHO")
            .arg(&marker)
            .query_async(&mut con)
            .await
            .unwrap();
        eventually("MONITOR caught up", Duration::from_secs(5), || async {
            self.echo.lock().unwrap().contains(&marker)
        })
        .await;
    }

    /// How many lines matched so far.
    pub fn count(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// The lines that matched so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether a `MONITOR` line carries an acquire operation of `ops.lua`: `"a"`, or `"f"`, the
/// first attempt of a service not registered as waiting.
pub fn acquire_op(line: &str) -> bool {
    line.contains(" \"a\" ") || line.contains(" \"f\" ")
}

/// Whether a `MONITOR` line carries a release operation of `ops.lua`: `"r"`, `"k"` (in the
/// releasing service's turn) or `"x"` (a plain release: no next owner, nothing kept).
pub fn release_op(line: &str) -> bool {
    line.contains(" \"r\" ") || line.contains(" \"k\" ") || line.contains(" \"x\" ")
}

/// A `MONITOR` filter: the lock operations (`ops.lua`) that acquire the mutex `key` (see
/// [`acquires_naming`]).
pub fn acquires_of(key: &str) -> impl Fn(&str) -> bool + Send + use<> {
    acquires_naming(&lock_key(key))
}

/// A `MONITOR` filter: the lock operations (`ops.lua`) that acquire the lock whose Redis key is
/// `redis_key` (a mutex's, a semaphore's hash) - a script call ([`script_call`]) naming that key
/// itself with an acquire operation ([`acquire_op`]).
pub fn acquires_naming(redis_key: &str) -> impl Fn(&str) -> bool + Send + use<> {
    let quoted = format!("\"{redis_key}\"");
    move |line: &str| script_call(line) && line.contains(&quoted) && acquire_op(line)
}

/// One `#[tokio::test]` per body and topology, in a module per topology (`single`,
/// `master_slave`, `sentinel`, `cluster`), each calling `super::<body>(fixture)`:
///
/// - `topology_tests!(a, b)`: the bodies run on the topology the tests of the binary share;
/// - `topology_tests!(shared: [a], own: [b])`: `own` bodies run on a topology of their own (for
///   bodies that stop processes or count connections), see [`Fixture::own`].
macro_rules! topology_tests {
    (shared: [$($shared:ident),* $(,)?], own: [$($own:ident),* $(,)?] $(,)?) => {
        topology_tests!(@kind single, Single, [$($shared),*], [$($own),*]);
        topology_tests!(@kind master_slave, MasterReplicas, [$($shared),*], [$($own),*]);
        topology_tests!(@kind sentinel, Sentinel, [$($shared),*], [$($own),*]);
        topology_tests!(@kind cluster, Cluster, [$($shared),*], [$($own),*]);
    };
    (own: [$($own:ident),* $(,)?] $(,)?) => {
        topology_tests!(shared: [], own: [$($own),*]);
    };
    (@kind $module:ident, $kind:ident, [$($shared:ident),*], [$($own:ident),*]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() {
                    super::$shared(
                        $crate::common::Fixture::shared(::lock_tests::harness::Kind::$kind).await,
                    )
                    .await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $own() {
                    super::$own(
                        $crate::common::Fixture::own(::lock_tests::harness::Kind::$kind.spec())
                            .await,
                    )
                    .await;
                }
            )*
        }
    };
    ($($body:ident),* $(,)?) => {
        topology_tests!(shared: [$($body),*], own: []);
    };
}
