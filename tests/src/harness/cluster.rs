//! Redis Cluster: nodes with an explicit `cluster-port`, joined by
//! `redis-cli --cluster create ... --cluster-replicas N --cluster-yes`.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::node::{Node, NodeKind};
use super::process::{self, Program};
use super::util;

/// Number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// A started cluster: every node, and the ports of masters and replicas after `create`.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) nodes: Vec<Node>,
    pub(crate) masters: Vec<u16>,
    pub(crate) replicas: Vec<u16>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) port: u16,
    pub(crate) flags: Vec<String>,
    /// Slot ranges (inclusive) this node serves; empty for replicas.
    pub(crate) slots: Vec<(u16, u16)>,
}

impl Entry {
    pub(crate) fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
    }
}

/// Parses `CLUSTER NODES` output. Importing/migrating markers (`[slot->-id]`) are skipped.
pub(crate) fn parse_nodes(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let addr = fields[1].split(['@', ',']).next()?;
            let port = addr.rsplit_once(':')?.1.parse().ok()?;
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(Entry {
                port,
                flags: fields[2].split(',').map(str::to_owned).collect(),
                slots,
            })
        })
        .collect()
}

/// `CLUSTER NODES` as seen by the node on `port`.
pub(crate) fn nodes(port: u16) -> Option<Vec<Entry>> {
    util::query::<String>(port, redis::cmd("CLUSTER").arg("NODES"))
        .ok()
        .map(|t| parse_nodes(&t))
}

/// The master serving `slot` in the view of the node on `view`.
pub(crate) fn slot_owner(view: u16, slot: u16) -> Option<u16> {
    nodes(view)?
        .into_iter()
        .find(|e| e.is_master() && e.serves(slot))
        .map(|e| e.port)
}

/// `true` when the node reports `cluster_state:ok` with every slot ok, knows `known` nodes (if
/// given), and, if it is a replica, its link to the master is up.
pub(crate) fn node_ok(port: u16, known: Option<usize>) -> bool {
    let Some(info) = util::cluster_info(port) else {
        return false;
    };
    let field = |k: &str| info.get(k).map(String::as_str);
    let slots = SLOTS.to_string();
    field("cluster_state") == Some("ok")
        && field("cluster_slots_ok") == Some(slots.as_str())
        && known.is_none_or(|n| field("cluster_known_nodes") == Some(n.to_string().as_str()))
        && match util::role(port).as_deref() {
            Some("master") => true,
            Some("slave") => util::replica_linked(port),
            _ => false,
        }
}

/// Masters serving slots (port, inclusive slot ranges), sorted by port.
pub(crate) type SlotMap = Vec<(u16, Vec<(u16, u16)>)>;

/// The [`SlotMap`] in the view of the node on `port`.
pub(crate) fn slot_map(port: u16) -> Option<SlotMap> {
    let mut map: Vec<_> = nodes(port)?
        .into_iter()
        .filter(|e| e.is_master() && !e.slots.is_empty())
        .map(|e| (e.port, e.slots))
        .collect();
    map.sort_unstable();
    Some(map)
}

/// `true` when the node on `port` sees `masters` masters serving slots and `replicas` replicas:
/// a replica reports `master_link_status:up` before every other node has heard of its new role.
fn view_settled(port: u16, masters: usize, replicas: usize) -> bool {
    nodes(port).is_some_and(|view| {
        let serving = view
            .iter()
            .filter(|e| e.is_master() && !e.slots.is_empty())
            .count();
        let following = view
            .iter()
            .filter(|e| e.flags.iter().any(|f| f == "slave"))
            .count();
        serving == masters && following == replicas
    })
}

/// Starts `masters * (1 + replicas_per_master)` nodes, creates the cluster and waits until every
/// node reports `cluster_state:ok` with all slots ok and all replicas are linked.
pub(crate) fn start(
    root: &Path,
    masters: usize,
    replicas_per_master: usize,
    node_timeout_ms: u64,
    timeout: Duration,
) -> Started {
    assert!(
        masters >= 3,
        "redis-cli --cluster create needs at least 3 masters, got {masters}"
    );
    let total = masters * (1 + replicas_per_master);
    let mut all: Vec<Node> = (0..total)
        .map(|i| {
            let name = format!("server-{i}");
            Node::launch(
                root,
                &name,
                NodeKind::Server,
                Some(node_timeout_ms),
                String::new(),
            )
        })
        .collect();
    for node in &mut all {
        node.wait_up(timeout, true);
    }
    create(root, &all, replicas_per_master, timeout);
    let replicas = masters * replicas_per_master;
    let ready = util::poll_until(timeout, || {
        all.iter()
            .all(|n| node_ok(n.port, Some(total)) && view_settled(n.port, masters, replicas))
            .then_some(())
    });
    if ready.is_err() {
        let states: Vec<_> = all
            .iter()
            .map(|n| {
                (
                    n.port,
                    util::cluster_info(n.port).and_then(|mut i| i.remove("cluster_state")),
                )
            })
            .collect();
        panic!(
            "cluster did not become ready within {timeout:?}: cluster_state per node {states:?}\n{}",
            all.iter().map(|n| n.log_tail(15)).collect::<String>()
        );
    }
    let view = nodes(all[0].port).unwrap_or_default();
    let mut master_ports: Vec<u16> = view
        .iter()
        .filter(|e| e.is_master())
        .map(|e| e.port)
        .collect();
    let mut replica_ports: Vec<u16> = view
        .iter()
        .filter(|e| !e.is_master())
        .map(|e| e.port)
        .collect();
    master_ports.sort_unstable();
    replica_ports.sort_unstable();
    // a test's WAIT counts a replica only once it has acknowledged something
    for entry in view.iter().filter(|e| e.is_master() && !e.slots.is_empty()) {
        let node = all.iter().find(|n| n.port == entry.port);
        let (Some(node), Some(key)) = (node, served_key(entry)) else {
            panic!("no started node or no key found for cluster master {entry:?}");
        };
        super::replication::wait_acknowledged(node, replicas_per_master, &key, timeout);
    }
    Started {
        nodes: all,
        masters: master_ports,
        replicas: replica_ports,
    }
}

/// A key in one of the slots `master` serves, asking the node for each candidate's slot.
fn served_key(master: &Entry) -> Option<String> {
    (0..1000).map(|i| format!("harness:ready:{i}")).find(|key| {
        util::query::<u16>(master.port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .is_ok_and(|slot| master.serves(slot))
    })
}

/// Runs `redis-cli --cluster create` with a deadline, its output going to `root/cluster-create`.
fn create(root: &Path, nodes: &[Node], replicas_per_master: usize, timeout: Duration) {
    let out_path = root.join("cluster-create");
    let out = fs::File::create(&out_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", out_path.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("cannot duplicate a file handle: {e}"));
    let mut cmd: Command = process::resolve(Program::Cli).command("--cluster");
    cmd.arg("create")
        .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
        .arg("--cluster-replicas")
        .arg(replicas_per_master.to_string())
        .arg("--cluster-yes")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let mut child = process::spawn(cmd)
        .unwrap_or_else(|e| panic!("cannot run redis-cli --cluster create: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if start.elapsed() >= timeout {
            process::kill_and_wait(&mut child);
            break None;
        }
        thread::sleep(Duration::from_millis(10));
    };
    if status.is_none_or(|s| !s.success()) {
        panic!(
            "redis-cli --cluster create {} ({status:?}):\n{}",
            if status.is_none() {
                "timed out"
            } else {
                "failed"
            },
            fs::read_to_string(&out_path).unwrap_or_default()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_nodes;

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
b2 127.0.0.1:7001@17001,host master - 0 1 2 connected 5461-10922 [5461->-a1]\n\
c3 127.0.0.1:7002@17002 slave a1 0 1 1 connected\n\
d4 127.0.0.1:7003@17003 master,fail - 0 1 3 disconnected 10923 10924-16383\n";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].port, 7000);
        assert_eq!(nodes[0].slots, vec![(0, 5460)]);
        assert_eq!(nodes[1].slots, vec![(5461, 10922)]);
        assert!(!nodes[2].is_master());
        assert_eq!(nodes[3].slots, vec![(10923, 10923), (10924, 16383)]);
        assert!(nodes[3].is_master());
    }
}
