//! A master with replicas wired by `REPLICAOF` at runtime (a `--replicaof` on the command line
//! costs up to a second before the first sync attempt).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::node::{Node, NodeKind};
use super::tls::Pki;
use super::util;

/// Starts a master (`server-0`) and `replicas` replicas (`server-1..`), and waits until every
/// replica reports `master_link_status:up`. The master is element 0.
pub(crate) fn start(
    root: &Path,
    replicas: usize,
    tls: Option<&Arc<Pki>>,
    timeout: Duration,
) -> Vec<Node> {
    let mut nodes: Vec<Node> = (0..=replicas)
        .map(|i| {
            Node::launch(
                root,
                &format!("server-{i}"),
                NodeKind::Server,
                None,
                String::new(),
                tls.cloned(),
            )
        })
        .collect();
    for node in &mut nodes {
        node.wait_up(timeout, true);
    }
    let master = nodes[0].port;
    for replica in &nodes[1..] {
        replicate(replica, master);
    }
    for replica in &nodes[1..] {
        wait_linked(replica, timeout);
    }
    wait_acknowledged(&nodes[0], replicas, READY_KEY, timeout);
    nodes
}

/// Key the readiness check of a master-replicas topology writes on its master.
pub(crate) const READY_KEY: &str = "harness:replicas-ready";

/// Waits until `replicas` replicas acknowledge a write of `key` on `master` (`SET` then
/// `WAIT`), which is exactly what a `WAIT` issued by a test needs. A replica the master already
/// lists as `state=online` may not acknowledge anything yet: after a diskless first sync the
/// master streams commands to it only after its first `REPLCONF ACK`, which can take a second.
/// `key` must be served by `master` (in a cluster: one of its slots).
///
/// # Panics
///
/// After `timeout`, with the tail of the master's log.
pub(crate) fn wait_acknowledged(master: &Node, replicas: usize, key: &str, timeout: Duration) {
    let mut round = 0u64;
    let acknowledged = util::poll_until(timeout, || {
        round += 1;
        let mut con = util::connect(master.port).ok()?;
        redis::cmd("SET")
            .arg(key)
            .arg(round)
            .query::<()>(&mut con)
            .ok()?;
        let acks: usize = redis::cmd("WAIT")
            .arg(replicas)
            .arg(100)
            .query(&mut con)
            .ok()?;
        (acks >= replicas).then_some(())
    });
    if acknowledged.is_err() {
        panic!(
            "{replicas} replicas of the master on port {} did not acknowledge a write within \
             {timeout:?}\n{}",
            master.port,
            master.log_tail(30)
        );
    }
}

/// Sends `REPLICAOF 127.0.0.1 <master>` to `replica`.
///
/// # Panics
///
/// If the replica refuses or does not answer.
pub(crate) fn replicate(replica: &Node, master: u16) {
    let reply = util::query::<String>(
        replica.port,
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master),
    );
    if let Err(e) = reply {
        panic!(
            "REPLICAOF 127.0.0.1 {master} on port {} failed: {e}\n{}",
            replica.port,
            replica.log_tail(30)
        );
    }
}

/// Waits until `replica` reports `role:slave` with `master_link_status:up`.
///
/// # Panics
///
/// After `timeout`, with the tail of the replica's log.
pub(crate) fn wait_linked(replica: &Node, timeout: Duration) {
    if util::poll_until(timeout, || util::replica_linked(replica.port).then_some(())).is_err() {
        panic!(
            "replica on port {} did not report master_link_status:up within {timeout:?}\n{}",
            replica.port,
            replica.log_tail(30)
        );
    }
}

/// `true` when the node on `replica` is a replica of `master` with its link up.
pub(crate) fn linked_to(replica: u16, master: u16) -> bool {
    util::info(replica, "replication").is_some_and(|i| {
        i.get("role").map(String::as_str) == Some("slave")
            && i.get("master_port") == Some(&master.to_string())
            && i.get("master_link_status").map(String::as_str) == Some("up")
    })
}
