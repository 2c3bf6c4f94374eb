//! The bench's own redis-server and the command counters read from it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use lock_runtime::{LockConfig, LockService};
use lock_tests::harness::{Spec, Topology};
use serde_json::{Value, json};

/// Any error; the bench stops at the first one.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The bench's result type.
pub(crate) type Result<T> = std::result::Result<T, BoxError>;

/// The lease every lock of the bench is taken with (ours and the baseline's).
pub(crate) const LEASE: Duration = Duration::from_secs(5);

/// Commands the bench itself sends (counters, RTT probe, waiter probe): never charged to a
/// variant.
const OWN: &[&str] = &["info", "config|resetstat", "ping", "type", "unlink"];

/// The running redis-server, the run's mode and a connection for the counters.
pub(crate) struct Ctx {
    pub(crate) url: String,
    pub(crate) quick: bool,
    pub(crate) redis_version: String,
    stats: Mutex<Stats>,
    _server: Topology,
}

struct Stats {
    con: redis::Connection,
    /// CPU seconds of this process and of redis-server at the last reset.
    cpu_at_reset: (f64, f64),
}

impl Ctx {
    /// Starts a redis-server on a free loopback port.
    pub(crate) async fn start(quick: bool) -> Result<Ctx> {
        let server = Topology::start(Spec::Single).await;
        let mut con = server.conn(server.master_port());
        let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
        let redis_version = info_field(&info, "redis_version").unwrap_or("?").to_owned();
        Ok(Ctx {
            url: server.url(),
            quick,
            redis_version,
            stats: Mutex::new(Stats {
                con,
                cpu_at_reset: (0.0, 0.0),
            }),
            _server: server,
        })
    }

    /// The configuration every service of the bench uses.
    pub(crate) fn config(&self) -> LockConfig {
        LockConfig::single(&self.url).with_watchdog_timeout(Duration::from_secs(30))
    }

    /// A new service (one application instance).
    pub(crate) async fn service(&self) -> Result<LockService> {
        Ok(LockService::connect(self.config()).await?)
    }

    /// `CONFIG RESETSTAT`: the counters start from zero; CPU times are noted.
    pub(crate) fn reset(&self) -> Result<()> {
        self.with_stats(|stats| {
            redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query::<()>(&mut stats.con)?;
            let info: String = redis::cmd("INFO").arg("cpu").query(&mut stats.con)?;
            stats.cpu_at_reset = (process_cpu(), server_cpu(&info));
            Ok(())
        })
    }

    /// The counters since the last [`reset`](Self::reset).
    pub(crate) fn read(&self) -> Result<Counts> {
        self.with_stats(|stats| {
            let info: String = redis::cmd("INFO")
                .arg("stats")
                .arg("commandstats")
                .arg("cpu")
                .query(&mut stats.con)?;
            let mut counts = Counts::parse(&info);
            let (client, server) = stats.cpu_at_reset;
            counts.client_cpu_us = ((process_cpu() - client) * 1e6).max(0.0) as u64;
            counts.server_cpu_us = ((server_cpu(&info) - server) * 1e6).max(0.0) as u64;
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
        Ok(tokio::task::block_in_place(|| f(&mut stats))?)
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

fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
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
        self.client_cpu_us += other.client_cpu_us;
        self.server_cpu_us += other.server_cpu_us;
    }

    /// Every command Redis executed, those inside scripts included (INFO commandstats).
    pub(crate) fn commands(&self) -> u64 {
        self.calls.values().map(|(calls, _)| calls).sum()
    }

    /// Commands that came over the network (EVALSHA, SUBSCRIBE, ...): round trips.
    pub(crate) fn requests(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| is_request(name))
            .map(|(_, (calls, _))| calls)
            .sum()
    }

    /// Server time spent in the network commands (a script's time includes its commands).
    pub(crate) fn request_usec(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| is_request(name))
            .map(|(_, (_, usec))| usec)
            .sum()
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
        || name.starts_with("script|")
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
    }
}
