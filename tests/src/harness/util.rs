//! Small blocking helpers shared by the topology modules: raw connections, `INFO` parsing and
//! deadline-bounded polling.

use std::collections::HashMap;
use std::env;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::tls::{Pki, Validity};

/// How often readiness conditions are polled.
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Default deadline for a topology (or a restarted node) to become ready.
const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The readiness deadline; `HARNESS_READY_TIMEOUT_SECS` overrides the default of 20 s.
pub(crate) fn ready_timeout() -> Duration {
    env::var("HARNESS_READY_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_READY_TIMEOUT, Duration::from_secs)
}

/// The certificates of the TLS-only nodes of this process, by port: the harness reaches them
/// over TLS, and hands out `rediss://` URLs for them.
static TLS_PORTS: Mutex<Option<HashMap<u16, Arc<Pki>>>> = Mutex::new(None);

/// Marks `port` as a TLS-only node with `pki`'s certificates.
pub(crate) fn register_tls(port: u16, pki: Arc<Pki>) {
    TLS_PORTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(port, pki);
}

/// `port` is no TLS node any more.
pub(crate) fn unregister_tls(port: u16) {
    if let Some(ports) = TLS_PORTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
    {
        ports.remove(&port);
    }
}

/// The certificates of the node on `port`, if it speaks TLS only.
pub(crate) fn tls_of(port: u16) -> Option<Arc<Pki>> {
    TLS_PORTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .and_then(|ports| ports.get(&port).cloned())
}

/// `redis://127.0.0.1:PORT` for a loopback port (`rediss://` for a TLS node).
pub(crate) fn url(port: u16) -> String {
    match tls_of(port) {
        Some(_) => format!("rediss://127.0.0.1:{port}"),
        None => format!("redis://127.0.0.1:{port}"),
    }
}

/// A client for the node on `port`: TLS with the client certificate for a TLS node.
pub(crate) fn client(port: u16) -> redis::RedisResult<redis::Client> {
    match tls_of(port) {
        // the readiness checks of a server with an expired certificate (for the tests that
        // check clients refuse it) must not check it
        Some(pki) if pki.server_validity() == Validity::Expired => redis::Client::build_with_tls(
            format!("{}/#insecure", url(port)),
            pki.redis_certificates(),
        ),
        Some(pki) => redis::Client::build_with_tls(url(port), pki.redis_certificates()),
        None => redis::Client::open(url(port)),
    }
}

/// Opens a blocking connection with short connect, read and write timeouts, so that a dead or
/// stopped node makes a poll fail fast instead of hanging.
pub(crate) fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    let client = client(port)?;
    let con = client.get_connection_with_timeout(Duration::from_millis(500))?;
    con.set_read_timeout(Some(Duration::from_secs(2)))?;
    con.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(con)
}

/// Runs one command on a fresh connection to `port`.
pub(crate) fn query<T: redis::FromRedisValue>(
    port: u16,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let mut con = connect(port)?;
    cmd.query(&mut con)
}

/// The `process_id` the node on `port` reports in `INFO server`; `None` if it does not answer
/// within `within` (a process that took the port and accepts connections without answering,
/// or a stopped one, must not hold up a readiness poll for long).
pub(crate) fn process_id(port: u16, within: Duration) -> Option<u32> {
    let client = client(port).ok()?;
    let mut con = client.get_connection_with_timeout(within).ok()?;
    con.set_read_timeout(Some(within)).ok()?;
    con.set_write_timeout(Some(within)).ok()?;
    let text: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
    parse_info(&text).get("process_id")?.parse().ok()
}

/// Parses `INFO` / `CLUSTER INFO` text into `field -> value`.
pub(crate) fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// `INFO <section>` of a node, parsed; `None` if the node does not answer.
pub(crate) fn info(port: u16, section: &str) -> Option<HashMap<String, String>> {
    query::<String>(port, redis::cmd("INFO").arg(section))
        .ok()
        .map(|t| parse_info(&t))
}

/// `CLUSTER INFO` of a node, parsed; `None` if the node does not answer.
pub(crate) fn cluster_info(port: u16) -> Option<HashMap<String, String>> {
    query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))
        .ok()
        .map(|t| parse_info(&t))
}

/// The `role` field of `INFO replication` (`master` / `slave`).
pub(crate) fn role(port: u16) -> Option<String> {
    info(port, "replication").and_then(|mut i| i.remove("role"))
}

/// `true` when the node is a replica whose link to its master is up.
pub(crate) fn replica_linked(port: u16) -> bool {
    info(port, "replication").is_some_and(|i| {
        i.get("role").map(String::as_str) == Some("slave")
            && i.get("master_link_status").map(String::as_str) == Some("up")
    })
}

/// Polls `probe` every few milliseconds until it yields a value or `timeout` passes.
///
/// # Errors
///
/// Returns how long it waited when the deadline passed first.
pub(crate) fn poll_until<T>(
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Result<T, Duration> {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return Ok(v);
        }
        if start.elapsed() >= timeout {
            return Err(start.elapsed());
        }
        thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_info;

    #[test]
    fn parses_info_text() {
        let info = parse_info("# Replication\r\nrole:slave\r\nmaster_link_status:up\r\n\r\n");
        assert_eq!(info["role"], "slave");
        assert_eq!(info["master_link_status"], "up");
        assert_eq!(info.len(), 2);
    }
}
