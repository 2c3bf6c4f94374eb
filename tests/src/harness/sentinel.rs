//! Sentinels watching a master with replicas.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::node::{Node, NodeKind};
use super::tls::Pki;
use super::util;

/// The name every harness sentinel monitors the master under.
pub(crate) const MASTER_NAME: &str = "mymaster";

/// How long a failover may take before sentinels try again.
const FAILOVER_TIMEOUT_MS: u64 = 5000;

/// Starts `count` sentinels (`sentinel-0..`) monitoring `master` with quorum `count / 2 + 1`,
/// and waits until each reports the master with flags `master`, `replicas` replicas and
/// `count - 1` other sentinels.
pub(crate) fn start(
    root: &Path,
    master: u16,
    replicas: usize,
    count: usize,
    down_after_ms: u64,
    tls: Option<&Arc<Pki>>,
    timeout: Duration,
) -> Vec<Node> {
    let quorum = count / 2 + 1;
    let conf = format!(
        "sentinel monitor {MASTER_NAME} 127.0.0.1 {master} {quorum}\n\
         sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n\
         sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {MASTER_NAME} 1\n"
    );
    let mut nodes: Vec<Node> = (0..count)
        .map(|i| {
            let name = format!("sentinel-{i}");
            Node::launch(
                root,
                &name,
                NodeKind::Sentinel,
                None,
                conf.clone(),
                tls.cloned(),
            )
        })
        .collect();
    for node in &mut nodes {
        node.wait_up(timeout, true);
    }
    for node in &nodes {
        let ready = util::poll_until(timeout, || {
            let m = master_state(node.port)?;
            let field = |k: &str| m.get(k).map(String::as_str);
            let ok = field("flags") == Some("master")
                && field("num-slaves") == Some(&replicas.to_string())
                && field("num-other-sentinels") == Some(&(count - 1).to_string());
            ok.then_some(())
        });
        if ready.is_err() {
            panic!(
                "sentinel on port {} did not see the master with {replicas} replicas and {} \
                 other sentinels within {timeout:?}; it reports {:?}\n{}",
                node.port,
                count - 1,
                master_state(node.port),
                node.log_tail(30)
            );
        }
    }
    nodes
}

/// `SENTINEL MASTER mymaster` of one sentinel as a map.
pub(crate) fn master_state(sentinel: u16) -> Option<HashMap<String, String>> {
    let flat: Vec<String> = util::query(
        sentinel,
        redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME),
    )
    .ok()?;
    Some(
        flat.chunks_exact(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect(),
    )
}

/// The master port one sentinel reports through `SENTINEL GET-MASTER-ADDR-BY-NAME`.
pub(crate) fn master_addr(sentinel: u16) -> Option<u16> {
    let addr: Option<(String, String)> = util::query(
        sentinel,
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME),
    )
    .ok()?;
    addr?.1.parse().ok()
}

/// The master port named by most of the sentinels that answer; `None` if none answers.
pub(crate) fn vote(sentinels: &[u16]) -> Option<u16> {
    let mut votes: HashMap<u16, usize> = HashMap::new();
    for &s in sentinels {
        if let Some(port) = master_addr(s) {
            *votes.entry(port).or_default() += 1;
        }
    }
    votes
        .into_iter()
        .max_by_key(|&(port, n)| (n, std::cmp::Reverse(port)))
        .map(|(port, _)| port)
}

/// `Some(port)` once every sentinel in `sentinels` names the same master other than `old`, and
/// that server reports `role:master`.
pub(crate) fn agreed_new_master(sentinels: &[u16], old: u16) -> Option<u16> {
    let mut answers = sentinels.iter().map(|&s| master_addr(s));
    let first = answers.next()??;
    if first == old || !answers.all(|a| a == Some(first)) {
        return None;
    }
    (util::role(first).as_deref() == Some("master")).then_some(first)
}

/// `true` once the sentinel on `port` names `master` (if given) as the master and every
/// sentinel in `others` lists it again, without `s_down` or `disconnected` flags: a restarted
/// sentinel answers at once, but counts for a quorum only from then on.
pub(crate) fn rejoined(port: u16, others: &[u16], master: Option<u16>) -> bool {
    if master.is_some() && master_addr(port) != master {
        return false;
    }
    others.iter().all(|&other| {
        let Ok(known) = util::query::<Vec<Vec<String>>>(
            other,
            redis::cmd("SENTINEL").arg("SENTINELS").arg(MASTER_NAME),
        ) else {
            return false;
        };
        known.iter().any(|fields| {
            let field = |k: &str| {
                fields
                    .chunks_exact(2)
                    .find(|kv| kv[0] == k)
                    .map(|kv| kv[1].as_str())
            };
            field("port") == Some(&port.to_string()) && field("flags") == Some("sentinel")
        })
    })
}
