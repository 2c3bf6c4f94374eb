//! The bench's own Redis (one redis-server, or a cluster with `--cluster`), the runtime of the
//! application instances ("peers") the variants run, and the command counters read from Redis.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockConfig, LockService};
use lock_tests::harness::{Spec, Topology};
use serde_json::{Value, json};
use tokio::runtime::{Handle, RuntimeFlavor};

use crate::conn::Endpoint;
use crate::error::Result;

/// The lease every lock of the bench is taken with (ours and the baselines'), except where a
/// variant says it uses the watchdog.
pub(crate) const LEASE: Duration = Duration::from_secs(5);

/// Commands that are not lock traffic: the bench's own (counters, RTT probe, waiter probe) and
/// the replicas' acknowledgements on a cluster. Never charged to a variant.
const OWN: &[&str] = &[
    "info",
    "config|resetstat",
    "ping",
    "type",
    "unlink",
    "replconf",
];

/// How the run was set up, for the header and every JSON line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    pub(crate) quick: bool,
    /// S1-S3 on the harness's cluster of 3 masters (1 replica each) instead of one server.
    pub(crate) cluster: bool,
    /// A current-thread tokio runtime instead of the multi-thread one.
    pub(crate) current_thread: bool,
}

impl Setup {
    pub(crate) fn mode(&self) -> &'static str {
        if self.quick { "quick" } else { "full" }
    }

    pub(crate) fn runtime(&self) -> &'static str {
        if self.current_thread {
            "current-thread"
        } else {
            "multi-thread"
        }
    }

    pub(crate) fn topology(&self) -> &'static str {
        if self.cluster { "cluster" } else { "single" }
    }
}

/// The running Redis, the run's setup and connections for the counters.
pub(crate) struct Ctx {
    pub(crate) redis: Endpoint,
    pub(crate) setup: Setup,
    pub(crate) quick: bool,
    pub(crate) redis_version: String,
    /// The masters' ports (the one server's on a single server).
    pub(crate) masters: Vec<u16>,
    stats: Mutex<Stats>,
    _server: Topology,
}

struct Stats {
    /// One connection to every master: a cluster's counters are the sum over its masters.
    cons: Vec<redis::Connection>,
    /// CPU seconds of this process and of the masters' redis-servers at the last reset.
    cpu_at_reset: (f64, f64),
}

impl Ctx {
    /// Starts a redis-server on a free loopback port, or the harness's cluster of 3 masters with
    /// 1 replica each.
    pub(crate) async fn start(setup: Setup) -> Result<Ctx> {
        let spec = if setup.cluster {
            Spec::cluster()
        } else {
            Spec::Single
        };
        let server = Topology::start(spec).await;
        let (redis, masters) = if setup.cluster {
            let mut masters = Vec::new();
            for port in server.node_ports() {
                let mut con = server.conn(port);
                let info: String =
                    blocking(|| redis::cmd("INFO").arg("replication").query(&mut con))?;
                if info_field(&info, "role") == Some("master") {
                    masters.push(port);
                }
            }
            (Endpoint::cluster(server.node_urls()), masters)
        } else {
            (Endpoint::single(server.url()), vec![server.master_port()])
        };
        let mut cons: Vec<redis::Connection> = masters.iter().map(|p| server.conn(*p)).collect();
        let info: String = blocking(|| redis::cmd("INFO").arg("server").query(&mut cons[0]))?;
        let redis_version = info_field(&info, "redis_version").unwrap_or("?").to_owned();
        Ok(Ctx {
            redis,
            setup,
            quick: setup.quick,
            redis_version,
            masters,
            stats: Mutex::new(Stats {
                cons,
                cpu_at_reset: (0.0, 0.0),
            }),
            _server: server,
        })
    }

    /// The configuration every service of the bench uses.
    pub(crate) fn config(&self) -> LockConfig {
        self.redis.config()
    }

    /// A new service (one application instance) on the current runtime.
    pub(crate) async fn service(&self) -> Result<LockService> {
        Ok(LockService::connect(self.config()).await?)
    }

    /// Where `n` application instances of a variant run. On the multi-thread runtime, and for
    /// one instance, that is the run's own runtime; with `--current-thread`, several instances
    /// get a current-thread runtime each, on a thread of its own, as separate processes would.
    pub(crate) fn peers(&self, n: usize) -> Result<Vec<Peer>> {
        if !self.setup.current_thread || n == 1 {
            return Ok(vec![Peer::here(); n]);
        }
        (0..n).map(Peer::thread).collect()
    }

    /// `CONFIG RESETSTAT` on every master: the counters start from zero; CPU times are noted.
    pub(crate) fn reset(&self) -> Result<()> {
        self.with_stats(|stats| {
            let mut server = 0.0;
            for con in &mut stats.cons {
                redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(con)?;
                let info: String = redis::cmd("INFO").arg("cpu").query(con)?;
                server += server_cpu(&info);
            }
            stats.cpu_at_reset = (process_cpu(), server);
            Ok(())
        })
    }

    /// The counters since the last [`reset`](Self::reset), summed over the masters.
    pub(crate) fn read(&self) -> Result<Counts> {
        self.with_stats(|stats| {
            let mut counts = Counts::default();
            let mut server = 0.0;
            for con in &mut stats.cons {
                let info: String = redis::cmd("INFO")
                    .arg("stats")
                    .arg("commandstats")
                    .arg("cpu")
                    .query(con)?;
                counts.add(&Counts::parse(&info));
                server += server_cpu(&info);
            }
            let (client, server_at_reset) = stats.cpu_at_reset;
            counts.client_cpu_us = ((process_cpu() - client) * 1e6).max(0.0) as u64;
            counts.server_cpu_us = ((server - server_at_reset) * 1e6).max(0.0) as u64;
            Ok(counts)
        })
    }

    /// Runs `phase` between a reset and a read of the counters.
    pub(crate) async fn counted<T>(
        &self,
        phase: impl Future<Output = Result<T>>,
    ) -> Result<(T, Counts)> {
        self.reset()?;
        let value = phase.await?;
        Ok((value, self.read()?))
    }

    fn with_stats<T>(&self, f: impl FnOnce(&mut Stats) -> redis::RedisResult<T>) -> Result<T> {
        let mut stats = self.stats.lock().map_err(|_| "stats connection poisoned")?;
        Ok(blocking(|| f(&mut stats))?)
    }
}

/// How long a measured phase of a contention scenario may take before the bench gives up.
pub(crate) const PHASE_LIMIT: Duration = Duration::from_secs(120);

/// Runs `phase`, which must finish within `limit`; a time-out and the phase's error name it
/// `what`.
pub(crate) async fn within<T>(
    limit: Duration,
    what: impl std::fmt::Display,
    phase: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, phase)
        .await
        .map_err(|_| format!("{what} did not finish within {limit:?}"))?
        .map_err(|e| format!("{what}: {e}").into())
}

/// Runs blocking work (a synchronous Redis call) from async code: through `block_in_place` on
/// the multi-thread runtime, in place on a current-thread runtime (whose one thread waits).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// One application instance's runtime: where its service or connections are made, so that
/// their connection and background tasks run there, and where its tasks are spawned.
#[derive(Clone)]
pub(crate) struct Peer {
    handle: Handle,
    _thread: Option<Arc<PeerThread>>,
}

/// A peer's own thread; it ends (and its runtime with it) when the last clone is dropped.
struct PeerThread {
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Peer {
    /// The runtime this is called on.
    fn here() -> Peer {
        Peer {
            handle: Handle::current(),
            _thread: None,
        }
    }

    /// A current-thread runtime on a new thread.
    fn thread(index: usize) -> Result<Peer> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("bench-peer-{index}"))
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Peer {
            handle,
            _thread: Some(Arc::new(PeerThread { _stop: stop })),
        })
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs `f` on this peer's runtime and waits for it.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.handle.spawn(f).await?
    }
}

/// User + system CPU seconds of this process (all threads).
fn process_cpu() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// User + system CPU seconds of redis-server, from `INFO cpu`.
fn server_cpu(info: &str) -> f64 {
    ["used_cpu_user", "used_cpu_sys"]
        .iter()
        .filter_map(|f| info_field(info, f)?.parse::<f64>().ok())
        .sum()
}

pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// Server-side counters of one or more phases, without the bench's own commands.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counts {
    /// Command name -> (calls, usec), commands run inside scripts included.
    calls: BTreeMap<String, (u64, u64)>,
    /// `total_commands_processed`, less the bench's own commands.
    processed: u64,
    /// Commands the measured variant sends by themselves, not from a script (rslock's `SET`):
    /// round trips too. Commandstats cannot tell; the variant says so, see [`Self::sent_plain`].
    plain: BTreeSet<&'static str>,
    /// CPU time of this process (the clients, every thread) during the phase.
    pub(crate) client_cpu_us: u64,
    /// CPU time of redis-server during the phase.
    pub(crate) server_cpu_us: u64,
}

impl Counts {
    fn parse(info: &str) -> Counts {
        let mut counts = Counts::default();
        let mut own = 0;
        for line in info.lines() {
            let Some((name, fields)) = line
                .strip_prefix("cmdstat_")
                .and_then(|rest| rest.split_once(':'))
            else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (calls, usec) = (field("calls"), field("usec"));
            if OWN.contains(&name) {
                own += calls;
            } else {
                counts.calls.insert(name.to_owned(), (calls, usec));
            }
        }
        let total = info_field(info, "total_commands_processed")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        counts.processed = total.saturating_sub(own);
        counts
    }

    /// Adds the counters of another phase.
    pub(crate) fn add(&mut self, other: &Counts) {
        for (name, (calls, usec)) in &other.calls {
            let entry = self.calls.entry(name.clone()).or_default();
            entry.0 += calls;
            entry.1 += usec;
        }
        self.processed += other.processed;
        self.plain.extend(&other.plain);
        self.client_cpu_us += other.client_cpu_us;
        self.server_cpu_us += other.server_cpu_us;
    }

    /// Marks `commands` as sent over the network by themselves in these counts (a variant that
    /// never sends them from a script): they count as round trips.
    pub(crate) fn sent_plain(&mut self, commands: &[&'static str]) {
        self.plain.extend(commands);
    }

    /// Every command Redis executed, those inside scripts included (INFO commandstats).
    pub(crate) fn commands(&self) -> u64 {
        self.calls.values().map(|(calls, _)| calls).sum()
    }

    /// Commands that came over the network (EVALSHA, SUBSCRIBE, ...): round trips.
    pub(crate) fn requests(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| self.is_request(name))
            .map(|(_, (calls, _))| calls)
            .sum()
    }

    /// Server time spent in the network commands (a script's time includes its commands).
    pub(crate) fn request_usec(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| self.is_request(name))
            .map(|(_, (_, usec))| usec)
            .sum()
    }

    fn is_request(&self, name: &str) -> bool {
        is_request(name) || self.plain.contains(name)
    }

    /// Per-operation figures for the JSON line.
    pub(crate) fn json(&self, ops: u64) -> Value {
        let per = |n: u64| round2(n as f64 / ops.max(1) as f64);
        let by_command: serde_json::Map<String, Value> = self
            .calls
            .iter()
            .map(|(name, (calls, _))| (name.clone(), json!(per(*calls))))
            .collect();
        json!({
            "commands_per_op": per(self.commands()),
            "total_commands_processed_per_op": per(self.processed),
            "requests_per_op": per(self.requests()),
            "server_us_per_op": per(self.request_usec()),
            "client_cpu_us_per_op": per(self.client_cpu_us),
            "redis_cpu_us_per_op": per(self.server_cpu_us),
            "by_command_per_op": by_command,
        })
    }
}

fn is_request(name: &str) -> bool {
    name.starts_with("eval")
        || name.starts_with("fcall")
        || name.starts_with("script|")
        || name.starts_with("function|")
        || name.starts_with("client|")
        || matches!(
            name,
            "subscribe" | "unsubscribe" | "ssubscribe" | "sunsubscribe" | "hello" | "select"
        )
}

/// `x` with two decimals, for JSON.
pub(crate) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commandstats_without_own_commands() {
        let info = "# Stats\r\ntotal_commands_processed:9\r\n# Commandstats\r\n\
            cmdstat_evalsha:calls=2,usec=30,usec_per_call=15.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_set:calls=2,usec=4,usec_per_call=2.00\r\n\
            cmdstat_config|resetstat:calls=1,usec=100,usec_per_call=100.00\r\n\
            cmdstat_type:calls=4,usec=4,usec_per_call=1.00\r\n";
        let c = Counts::parse(info);
        assert_eq!(c.commands(), 4);
        assert_eq!(c.requests(), 2);
        assert_eq!(c.request_usec(), 30);
        assert_eq!(c.processed, 4);
        let mut plain = c.clone();
        plain.sent_plain(&["set"]);
        assert_eq!(plain.requests(), 4);
        assert_eq!(plain.request_usec(), 34);
    }
}
