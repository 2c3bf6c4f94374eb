//! A master with replicas wired by `REPLICAOF` at runtime (a `--replicaof` on the command line
//! costs up to a second before the first sync attempt).

use std::path::Path;
use std::time::Duration;

use super::node::{Node, NodeKind};
use super::util;

/// Starts a master (`server-0`) and `replicas` replicas (`server-1..`), and waits until every
/// replica reports `master_link_status:up`. The master is element 0.
pub(crate) fn start(root: &Path, replicas: usize, timeout: Duration) -> Vec<Node> {
    let mut nodes: Vec<Node> = (0..=replicas)
        .map(|i| {
            Node::launch(
                root,
                &format!("server-{i}"),
                NodeKind::Server,
                None,
                String::new(),
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
    wait_online(&nodes[0], replicas, timeout);
    nodes
}

/// Waits until the master counts `replicas` replicas as `state=online`: a replica that just
/// finished its first sync is not counted (for `WAIT`, too) until its first acknowledgement,
/// which can take up to a second.
pub(crate) fn wait_online(master: &Node, replicas: usize, timeout: Duration) {
    if util::poll_until(timeout, || {
        (util::replicas_online(master.port) >= replicas).then_some(())
    })
    .is_err()
    {
        panic!(
            "master on port {} did not see {replicas} replicas online within {timeout:?}\n{}",
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
