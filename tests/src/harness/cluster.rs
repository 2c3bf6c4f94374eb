//! Redis Cluster: nodes with an explicit `cluster-port`, joined by
//! `redis-cli --cluster create ... --cluster-replicas N --cluster-yes`.
//!
//! A proxied cluster puts a [`Proxy`] in front of every node and has the node announce the
//! proxy's port (`cluster-announce-ip`, `cluster-announce-port`) and its real bus port
//! (`cluster-announce-bus-port`): `CLUSTER SLOTS`, `CLUSTER SHARDS`, `CLUSTER NODES` and
//! `MOVED` / `ASK` redirects name the proxies, so every cluster client routes through them,
//! while the nodes gossip with each other directly. The proxies are started once the nodes
//! answer on their (final) ports and before the cluster is created; the nodes learn their
//! announced ports with `CONFIG SET` and keep them in their config file for restarts. Replicas
//! replicate through their master's proxy (they follow its announced address); the proxies
//! spare those links from their faults ([`Proxy::spare_replication`]). The harness itself
//! (readiness checks, raw connections) talks to the real ports and translates announced ports
//! back to real ones ([`Announced`]); `redis-cli --cluster create` gets the real ports, and its
//! final check follows the announced ones through the proxies.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use super::Topology;
use super::node::{Node, NodeKind};
use super::process::{self, Program};
use super::proxy::Proxy;
use super::tls::Pki;
use super::util;

/// Number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The real port of each node of a proxied cluster by the port it announces (its proxy's);
/// empty for a cluster whose nodes announce their real ports.
pub(crate) type Announced = HashMap<u16, u16>;

/// The [`Announced`] map of `proxies` (each in front of one node).
pub(crate) fn announced(proxies: &[Proxy]) -> Announced {
    proxies
        .iter()
        .map(|p| (p.port(), p.upstream().port()))
        .collect()
}

/// A started cluster: every node, the ports of masters and replicas after `create`, and the
/// proxies in front of the nodes (in the order of `nodes`; empty unless proxied).
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) nodes: Vec<Node>,
    pub(crate) masters: Vec<u16>,
    pub(crate) replicas: Vec<u16>,
    pub(crate) proxies: Vec<Proxy>,
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

/// `CLUSTER NODES` as seen by the node on `port`, with the ports the nodes announce.
fn announced_nodes(port: u16) -> Option<Vec<Entry>> {
    util::query::<String>(port, redis::cmd("CLUSTER").arg("NODES"))
        .ok()
        .map(|t| parse_nodes(&t))
}

/// `CLUSTER NODES` as seen by the node on `port`, with real ports (see [`Announced`]).
pub(crate) fn nodes(port: u16, announced: &Announced) -> Option<Vec<Entry>> {
    let mut entries = announced_nodes(port)?;
    for entry in &mut entries {
        if let Some(&real) = announced.get(&entry.port) {
            entry.port = real;
        }
    }
    Some(entries)
}

/// The master serving `slot` in the view of the node on `view`.
pub(crate) fn slot_owner(view: u16, slot: u16, announced: &Announced) -> Option<u16> {
    nodes(view, announced)?
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
pub(crate) fn slot_map(port: u16, announced: &Announced) -> Option<SlotMap> {
    let mut map: Vec<_> = nodes(port, announced)?
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
    announced_nodes(port).is_some_and(|view| {
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

/// `true` when the node on `port` names every node by its announced port: exactly the ports in
/// `announced` (a node a peer met by its real port is named by that until their first ping).
fn announces_proxies(port: u16, announced: &Announced) -> bool {
    announced_nodes(port).is_some_and(|view| {
        let seen: HashSet<u16> = view.iter().map(|e| e.port).collect();
        view.len() == announced.len() && seen.iter().all(|p| announced.contains_key(p))
    })
}

/// Puts a proxy in front of `node` and has the node announce it (see the module docs): now
/// with `CONFIG SET`, and in its config file for restarts.
fn proxy_node(node: &mut Node, runtime: &Handle) -> Proxy {
    let proxy = Proxy::start_in(runtime, Topology::addr_of(node.port));
    // replicas reach their master at the address it announces: through this proxy
    proxy.spare_replication(true);
    let bus = node
        .bus_port
        .unwrap_or_else(|| panic!("cluster node {} has no bus port", node.port));
    let settings = [
        ("cluster-announce-ip", "127.0.0.1".to_owned()),
        ("cluster-announce-port", proxy.port().to_string()),
        ("cluster-announce-bus-port", bus.to_string()),
    ];
    let mut set = redis::cmd("CONFIG");
    set.arg("SET");
    let mut lines = String::new();
    for (name, value) in &settings {
        set.arg(name).arg(value);
        lines.push_str(&format!("{name} {value}\n"));
    }
    node.append_conf(&lines);
    if let Err(e) = util::query::<()>(node.port, &set) {
        panic!(
            "cluster node {}: cannot announce its proxy (CONFIG SET {settings:?}): {e}\n{}",
            node.port,
            node.log_tail(15)
        );
    }
    proxy
}

/// Starts `masters * (1 + replicas_per_master)` nodes, creates the cluster and waits until every
/// node reports `cluster_state:ok` with all slots ok and all replicas are linked. With
/// `proxied`, every node gets a [`Proxy`] on that runtime and announces it, and the cluster is
/// ready once every node names all nodes by their proxies' ports.
pub(crate) fn start(
    root: &Path,
    masters: usize,
    replicas_per_master: usize,
    node_timeout_ms: u64,
    proxied: Option<&Handle>,
    tls: Option<&Arc<Pki>>,
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
                tls.cloned(),
            )
        })
        .collect();
    for node in &mut all {
        node.wait_up(timeout, true);
    }
    // the nodes' ports are final now (a node whose port was taken moved in `wait_up`)
    let proxies: Vec<Proxy> = match proxied {
        Some(runtime) => all.iter_mut().map(|n| proxy_node(n, runtime)).collect(),
        None => Vec::new(),
    };
    let announced = announced(&proxies);
    create(root, &all, replicas_per_master, tls, timeout);
    let replicas = masters * replicas_per_master;
    let ready = util::poll_until(timeout, || {
        all.iter()
            .all(|n| {
                node_ok(n.port, Some(total))
                    && view_settled(n.port, masters, replicas)
                    && (proxies.is_empty() || announces_proxies(n.port, &announced))
            })
            .then_some(())
    });
    if ready.is_err() {
        let states: Vec<_> = all
            .iter()
            .map(|n| {
                (
                    n.port,
                    util::cluster_info(n.port).and_then(|mut i| i.remove("cluster_state")),
                    announced_nodes(n.port).map(|v| v.iter().map(|e| e.port).collect::<Vec<_>>()),
                )
            })
            .collect();
        panic!(
            "cluster did not become ready within {timeout:?}: (port, cluster_state, ports it \
             names) per node {states:?}; proxies (port -> node) {announced:?}\n{}",
            all.iter().map(|n| n.log_tail(15)).collect::<String>()
        );
    }
    let view = nodes(all[0].port, &announced).unwrap_or_default();
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
        proxies,
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
fn create(
    root: &Path,
    nodes: &[Node],
    replicas_per_master: usize,
    tls: Option<&Arc<Pki>>,
    timeout: Duration,
) {
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
        .args(tls.map(|pki| pki.cli_args()).unwrap_or_default())
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
