//! The servers of the topology, each with its role and health (`LockService::nodes`).
//!
//! | mode | asked |
//! |---|---|
//! | single | the server: `ROLE` on the service's connection; the replicas its reply lists |
//! | master-slave | the master the same way (its list is not used); each configured replica: `ROLE` on a connection of its own |
//! | sentinel | the current master as in single mode; each configured sentinel: `PING` on a connection of its own |
//! | cluster | `CLUSTER NODES`, sent at once through the cluster client to every node it knows and to each seed on a connection of its own; the first answer is parsed |
//!
//! Every probe, connecting included, ends after `redis.response_timeout`, and the probes of one
//! call run at once. A server that does not answer is listed with the reason; the call fails
//! only when no server answered at all.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{AsyncConnectionConfig, IntoConnectionInfo, Value};

use super::{Backend, Conn, probe, single};
use crate::config::{LockConfig, Topology, redacted};
use crate::error::{ErrorKind, LockError};
use crate::nodes::{NodeRole, NodeStatus, RedisNodes};

/// A probe's reply and the round trip of its command, or why there is none (for
/// [`NodeStatus::detail`]).
type Probed = Result<(Value, Duration), String>;

impl Backend {
    /// The servers of `config`'s topology (the one this backend was connected with), each with
    /// its role and health; fails only when no server answered.
    pub(crate) async fn nodes(&self, config: &LockConfig) -> Result<RedisNodes, LockError> {
        let timeout = self.response_timeout;
        let nodes = match (&self.conn, config.topology()) {
            (Conn::Single(s), Topology::Single { url }) => {
                let role = ask(s.commands.clone(), "ROLE", timeout).await;
                server(address(url), role)
            }
            (Conn::Single(s), Topology::MasterSlave { master, replicas }) => {
                let probes = replicas
                    .iter()
                    .map(|url| probe_once(single::client(url, config), "ROLE", timeout))
                    .collect();
                let (role, replies) =
                    tokio::join!(ask(s.commands.clone(), "ROLE", timeout), all(probes));
                let master_offset = match role.as_ref().map(|(reply, _)| parse_role(reply)) {
                    Ok(Role::Master { offset, .. }) => Some(offset),
                    _ => None,
                };
                let mut nodes = vec![status(address(master), NodeRole::Master, role, None)];
                for (url, reply) in replicas.iter().zip(replies) {
                    nodes.push(status(
                        address(url),
                        NodeRole::Replica,
                        reply,
                        master_offset,
                    ));
                }
                nodes
            }
            (Conn::Sentinel(s), Topology::Sentinel { sentinels, .. }) => {
                let master = s.current();
                let probes = sentinels
                    .iter()
                    .map(|url| probe_once(sentinel_client(url, config), "PING", timeout))
                    .collect();
                let (role, pings) =
                    tokio::join!(ask(master.commands.clone(), "ROLE", timeout), all(probes));
                if role.is_err() {
                    // the master may have changed: the monitor asks the sentinels at once
                    s.poke();
                }
                let mut nodes = server(master.addr().to_owned(), role);
                for (url, ping) in sentinels.iter().zip(pings) {
                    let sentinel = NodeStatus::new(address(url), NodeRole::Sentinel);
                    nodes.push(match ping {
                        Ok((_, latency)) => NodeStatus {
                            latency: Some(latency),
                            ..sentinel
                        },
                        Err(why) => sentinel.failing(why),
                    });
                }
                nodes
            }
            (Conn::Cluster(c), Topology::Cluster { nodes: seeds }) => {
                let mut con = c.commands.clone();
                let routed = async move {
                    let everyone = RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllNodes,
                        Some(ResponsePolicy::OneSucceeded),
                    ));
                    let cmd = redis::cmd("CLUSTER").arg("NODES").clone();
                    let started = Instant::now();
                    let call = async {
                        let reply = con.route_command(cmd, everyone).await?.extract_error()?;
                        Ok::<_, redis::RedisError>(redis::from_redis_value::<String>(reply)?)
                    };
                    match tokio::time::timeout(timeout, call).await {
                        Ok(Ok(text)) => Ok((text, started.elapsed())),
                        Ok(Err(e)) => Err(format!(
                            "through the cluster client: {}",
                            failed("CLUSTER NODES", &e)
                        )),
                        Err(_) => Err(format!(
                            "through the cluster client: {}",
                            no_answer(timeout)
                        )),
                    }
                };
                let mut asked = tokio::task::JoinSet::new();
                asked.spawn(routed);
                for url in seeds {
                    let probe = probe_once(single::client(url, config), "CLUSTER NODES", timeout);
                    let seed = address(url);
                    asked.spawn(async move {
                        let (reply, latency) =
                            probe.await.map_err(|why| format!("{seed}: {why}"))?;
                        let text = redis::from_redis_value::<String>(reply)
                            .map_err(|e| format!("{seed}: CLUSTER NODES: {e}"))?;
                        Ok((text, latency))
                    });
                }
                // the first node that answers describes the cluster; one stopped or slow node
                // does not hold the call up
                let mut why = Vec::new();
                loop {
                    match asked.join_next().await {
                        Some(Ok(Ok((text, latency)))) => break cluster_nodes(&text, latency),
                        Some(Ok(Err(e))) => why.push(e),
                        Some(Err(e)) => why.push(e.to_string()),
                        None => {
                            return Err(LockError::new(
                                ErrorKind::Backend,
                                format!(
                                    "no redis cluster node answered CLUSTER NODES ({})",
                                    why.join("; ")
                                ),
                            )
                            .naming_user(self.username.as_deref()));
                        }
                    }
                }
            }
            _ => {
                return Err(LockError::new(
                    ErrorKind::Backend,
                    "the connections were made for another topology than the configured one",
                ));
            }
        };
        // only a server that answered has a latency
        if nodes.iter().all(|n| n.latency.is_none()) {
            let why: Vec<String> = nodes
                .iter()
                .map(|n| format!("{}: {}", n.address, n.detail.as_deref().unwrap_or("?")))
                .collect();
            return Err(LockError::new(
                ErrorKind::Backend,
                format!("no redis server answered ({})", why.join("; ")),
            ));
        }
        Ok(RedisNodes {
            mode: config.topology().mode(),
            nodes,
        })
    }
}

/// Runs `probes` at once; their outputs in the order of `probes`.
async fn all<T, F>(probes: Vec<F>) -> Vec<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, probe) in probes.into_iter().enumerate() {
        set.spawn(async move { (i, probe.await) });
    }
    let mut outputs = set.join_all().await;
    outputs.sort_by_key(|(i, _)| *i);
    outputs.into_iter().map(|(_, output)| output).collect()
}

/// Sends `command` on the service's own connection `con`, within `timeout`.
async fn ask<C: ConnectionLike + Send>(mut con: C, command: &str, timeout: Duration) -> Probed {
    let cmd = redis::cmd(command);
    let started = Instant::now();
    let call = cmd.query_async::<Value>(&mut con);
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(reply)) => Ok((reply, started.elapsed())),
        Ok(Err(e)) => Err(failed(command, &e)),
        Err(_) => Err(no_answer(timeout)),
    }
}

/// Connects to a server with `client` on a connection of its own and sends `command` (its
/// words separated by spaces) there, all within `timeout`; the connection is closed afterwards.
async fn probe_once(
    client: Result<redis::Client, LockError>,
    command: &'static str,
    timeout: Duration,
) -> Probed {
    let client = client.map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let probe = async {
        let mut con = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| match unreachable(&e) {
                true => format!("not reachable: {e}"),
                false => format!("cannot connect: {e}"),
            })?;
        let mut words = command.split(' ');
        let mut cmd = redis::cmd(words.next().unwrap_or_default());
        for word in words {
            cmd.arg(word);
        }
        let started = Instant::now();
        let reply = cmd
            .query_async::<Value>(&mut con)
            .await
            .map_err(|e| failed(command, &e))?;
        Ok((reply, started.elapsed()))
    };
    tokio::time::timeout(timeout, probe)
        .await
        .unwrap_or_else(|_| Err(no_answer(timeout)))
}

/// A client for the sentinel at `url`, as sentinel mode connects to it: with the credentials
/// of its URL only, and the TLS files for `rediss://`.
fn sentinel_client(url: &str, config: &LockConfig) -> Result<redis::Client, LockError> {
    let info = url.into_connection_info().map_err(|e| {
        LockError::config(format!("invalid sentinel URL {}: {e}", redacted(url))).with_source(e)
    })?;
    single::open(url, info, config)
}

fn unreachable(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() || e.is_timeout()
}

fn failed(command: &str, e: &redis::RedisError) -> String {
    match unreachable(e) {
        true => format!("not reachable: {e}"),
        false => format!("{command} failed: {e}"),
    }
}

fn no_answer(timeout: Duration) -> String {
    format!("not reachable: no answer within {timeout:?} (redis.response_timeout)")
}

/// `host:port` of a configured URL, without its user and password (the redacted URL when it
/// names no TCP address).
fn address(url: &str) -> String {
    match probe::host_port(url) {
        Some((host, port)) => host_port(&host, port),
        None => redacted(url),
    }
}

fn host_port(host: &str, port: impl std::fmt::Display) -> String {
    match host.contains(':') && !host.starts_with('[') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

/// A `ROLE` reply.
#[derive(Debug, PartialEq, Eq)]
enum Role {
    /// Its replication offset, and the replicas linked to it (`host:port`, their offset).
    Master {
        offset: i64,
        replicas: Vec<(String, i64)>,
    },
    /// Its master (`host:port`), the state of its link to it (`connected`, `connecting`,
    /// `sync`, ...) and its replication offset.
    Replica {
        master: String,
        state: String,
        offset: i64,
    },
    Sentinel,
    /// Anything else, as it reads.
    Other(String),
}

fn parse_role(reply: &Value) -> Role {
    let Value::Array(items) = reply else {
        return Role::Other(format!("{reply:?}"));
    };
    let text_at = |i: usize| items.get(i).and_then(text).unwrap_or_default();
    let int_at = |i: usize| items.get(i).and_then(int).unwrap_or(0);
    match text_at(0).as_str() {
        "master" => {
            let replicas = match items.get(2) {
                Some(Value::Array(replicas)) => replicas
                    .iter()
                    .filter_map(|replica| {
                        let Value::Array(fields) = replica else {
                            return None;
                        };
                        let host = text(fields.first()?)?;
                        let port = int(fields.get(1)?)?;
                        let offset = fields.get(2).and_then(int).unwrap_or(0);
                        Some((host_port(&host, port), offset))
                    })
                    .collect(),
                _ => Vec::new(),
            };
            Role::Master {
                offset: int_at(1),
                replicas,
            }
        }
        "slave" => Role::Replica {
            master: host_port(&text_at(1), int_at(2)),
            state: text_at(3),
            offset: int_at(4),
        },
        "sentinel" => Role::Sentinel,
        other => Role::Other(other.to_owned()),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

/// The server at `address` that the service uses for its locks (single mode, the current
/// master of sentinel mode), as its `ROLE` reply says, followed by the replicas it lists.
fn server(address: String, role: Probed) -> Vec<NodeStatus> {
    let listed = match &role {
        Ok((reply, _)) => match parse_role(reply) {
            Role::Master { offset, replicas } => replicas
                .into_iter()
                .map(|(replica, replica_offset)| {
                    let mut node = NodeStatus::new(replica, NodeRole::Replica);
                    node.replica_of = Some(address.clone());
                    node.detail = behind(offset, replica_offset);
                    node
                })
                .collect(),
            _ => Vec::new(),
        },
        Err(_) => Vec::new(),
    };
    let mut nodes = vec![status(address, NodeRole::Master, role, None)];
    nodes.extend(listed);
    nodes
}

/// The status of the server at `address`, configured as `expected`, from its `ROLE` reply;
/// `master_offset` is its master's replication offset, for a replica's lag.
fn status(
    address: String,
    expected: NodeRole,
    role: Probed,
    master_offset: Option<i64>,
) -> NodeStatus {
    let (reply, latency) = match role {
        Ok(answer) => answer,
        Err(why) => return NodeStatus::new(address, expected).failing(why),
    };
    let mut node = match parse_role(&reply) {
        Role::Master { .. } => NodeStatus::new(address, NodeRole::Master),
        Role::Replica {
            master,
            state,
            offset,
        } => {
            let mut node = NodeStatus::new(address, NodeRole::Replica);
            node.replica_of = Some(master);
            if state != "connected" {
                node = node.failing(format!("replication link down ({state})"));
            } else if let Some(master_offset) = master_offset {
                node.detail = behind(master_offset, offset);
            }
            node
        }
        Role::Sentinel => NodeStatus::new(address, NodeRole::Sentinel),
        Role::Other(what) => {
            NodeStatus::new(address, expected).failing(format!("unexpected ROLE reply {what:?}"))
        }
    };
    node.latency = Some(latency);
    if node.role != expected {
        let role = node.role;
        node = node.failing(match expected {
            NodeRole::Master => {
                format!("a {role}, not a master: lock operations fail here")
            }
            _ => format!("configured as a {expected}, but is a {role}"),
        });
    }
    node
}

/// How far a replica at `offset` is behind its master at `master_offset`, if at all.
fn behind(master_offset: i64, offset: i64) -> Option<String> {
    let lag = master_offset - offset;
    (lag > 0).then(|| format!("{lag} bytes behind its master"))
}

/// The nodes a `CLUSTER NODES` reply lists: each master followed by its replicas, by address.
/// `latency` is that of the node that answered (flagged `myself`).
fn cluster_nodes(text: &str, latency: Duration) -> Vec<NodeStatus> {
    // <id> <ip:port@cport[,hostname]> <flags> <master id> <ping-sent> <pong-recv>
    // <config-epoch> <link-state> <slot> ...
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.len() >= 8)
        .collect();
    let address_of = |fields: &[&str]| {
        let addr = fields[1];
        addr.split_once('@')
            .map_or(addr, |(addr, _)| addr)
            .to_owned()
    };
    let addresses: HashMap<&str, String> = lines
        .iter()
        .map(|fields| (fields[0], address_of(fields)))
        .collect();
    let mut nodes: Vec<NodeStatus> = lines
        .iter()
        .map(|fields| {
            let flags: Vec<&str> = fields[2].split(',').collect();
            let role = if flags.contains(&"master") {
                NodeRole::Master
            } else if flags.contains(&"slave") {
                NodeRole::Replica
            } else {
                NodeRole::Unknown
            };
            let myself = flags.contains(&"myself");
            let mut node = NodeStatus::new(address_of(fields), role);
            if role == NodeRole::Replica {
                node.replica_of = addresses.get(fields[3]).cloned();
            }
            let mut problems: Vec<&str> = flags
                .iter()
                .filter_map(|flag| match *flag {
                    "fail" => Some("fail"),
                    "fail?" => Some("pfail"),
                    "handshake" => Some("handshake"),
                    "noaddr" => Some("noaddr"),
                    _ => None,
                })
                .collect();
            if !myself && fields[7] != "connected" {
                problems.push("link down");
            }
            if !problems.is_empty() {
                node = node.failing(problems.join(", "));
            }
            if myself {
                node.latency = Some(latency);
            }
            node
        })
        .collect();
    nodes.sort_by(|a, b| cluster_order(a).cmp(&cluster_order(b)));
    nodes
}

/// Where a cluster node goes: with its master's group, the master first, by address.
fn cluster_order(node: &NodeStatus) -> ((&str, u32), u8, (&str, u32)) {
    let group = node.replica_of.as_deref().unwrap_or(&node.address);
    let rank = match node.role {
        NodeRole::Master => 0,
        NodeRole::Replica => 1,
        _ => 2,
    };
    (address_order(group), rank, address_order(&node.address))
}

/// `host:port` as (host, port), so that ports sort as numbers.
fn address_order(address: &str) -> (&str, u32) {
    match address.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().unwrap_or(0)),
        None => (address, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn role_replies() {
        let master = Value::Array(vec![
            bulk("master"),
            Value::Int(3129659),
            Value::Array(vec![
                Value::Array(vec![bulk("127.0.0.1"), bulk("9001"), bulk("3129242")]),
                Value::Array(vec![bulk("::1"), bulk("9002"), bulk("3129543")]),
            ]),
        ]);
        assert_eq!(
            parse_role(&master),
            Role::Master {
                offset: 3129659,
                replicas: vec![
                    ("127.0.0.1:9001".to_owned(), 3129242),
                    ("[::1]:9002".to_owned(), 3129543)
                ],
            }
        );
        let replica = Value::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Value::Int(9000),
            bulk("connected"),
            Value::Int(3167038),
        ]);
        assert_eq!(
            parse_role(&replica),
            Role::Replica {
                master: "127.0.0.1:9000".to_owned(),
                state: "connected".to_owned(),
                offset: 3167038,
            }
        );
        let sentinel = Value::Array(vec![bulk("sentinel"), Value::Array(vec![bulk("m")])]);
        assert_eq!(parse_role(&sentinel), Role::Sentinel);
    }

    #[test]
    fn a_single_server_and_the_replicas_it_lists() {
        let reply = Value::Array(vec![
            bulk("master"),
            Value::Int(100),
            Value::Array(vec![
                Value::Array(vec![bulk("127.0.0.1"), bulk("7001"), bulk("100")]),
                Value::Array(vec![bulk("127.0.0.1"), bulk("7002"), bulk("60")]),
            ]),
        ]);
        let nodes = server(
            "127.0.0.1:7000".to_owned(),
            Ok((reply, Duration::from_millis(1))),
        );
        let summary: Vec<_> = nodes
            .iter()
            .map(|n| (n.address.as_str(), n.role, n.healthy, n.detail.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                ("127.0.0.1:7000", NodeRole::Master, true, None),
                ("127.0.0.1:7001", NodeRole::Replica, true, None),
                (
                    "127.0.0.1:7002",
                    NodeRole::Replica,
                    true,
                    Some("40 bytes behind its master")
                ),
            ]
        );
        assert_eq!(nodes[0].latency, Some(Duration::from_millis(1)));
        assert_eq!(nodes[1].latency, None);
        assert_eq!(nodes[2].replica_of.as_deref(), Some("127.0.0.1:7000"));
    }

    #[test]
    fn a_configured_replica_that_is_not_one() {
        let reply = Value::Array(vec![bulk("master"), Value::Int(0), Value::Array(vec![])]);
        let node = status(
            "h:1".to_owned(),
            NodeRole::Replica,
            Ok((reply, Duration::ZERO)),
            None,
        );
        assert_eq!(node.role, NodeRole::Master);
        assert!(!node.healthy);
        assert_eq!(
            node.detail.as_deref(),
            Some("configured as a replica, but is a master")
        );
        let down = Value::Array(vec![
            bulk("slave"),
            bulk("h"),
            Value::Int(2),
            bulk("connect"),
            Value::Int(-1),
        ]);
        let node = status(
            "h:1".to_owned(),
            NodeRole::Replica,
            Ok((down, Duration::ZERO)),
            Some(5),
        );
        assert_eq!(
            (node.healthy, node.detail.as_deref()),
            (false, Some("replication link down (connect)"))
        );
        let gone = status(
            "h:1".to_owned(),
            NodeRole::Replica,
            Err("not reachable: refused".to_owned()),
            None,
        );
        assert_eq!(
            (gone.role, gone.healthy, gone.latency),
            (NodeRole::Replica, false, None)
        );
    }

    #[test]
    fn cluster_nodes_lines() {
        let text = "\
b1 127.0.0.1:7004@17004 slave a1 0 1 1 connected
a1 127.0.0.1:7000@17000,host-a myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7001@17001 master,fail? - 1 2 2 connected 5461-10922
a3 127.0.0.1:7002@17002 master - 0 3 3 disconnected 10923-16383
b3 127.0.0.1:7005@17005 slave,fail a3 0 4 3 disconnected
c9 :0@0 handshake,noaddr - 0 0 0 disconnected
";
        let nodes = cluster_nodes(text, Duration::from_millis(3));
        let summary: Vec<_> = nodes
            .iter()
            .map(|n| {
                (
                    n.address.as_str(),
                    n.role,
                    n.replica_of.as_deref(),
                    n.detail.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (
                    ":0",
                    NodeRole::Unknown,
                    None,
                    Some("handshake, noaddr, link down")
                ),
                ("127.0.0.1:7000", NodeRole::Master, None, None),
                (
                    "127.0.0.1:7004",
                    NodeRole::Replica,
                    Some("127.0.0.1:7000"),
                    None
                ),
                ("127.0.0.1:7001", NodeRole::Master, None, Some("pfail")),
                ("127.0.0.1:7002", NodeRole::Master, None, Some("link down")),
                (
                    "127.0.0.1:7005",
                    NodeRole::Replica,
                    Some("127.0.0.1:7002"),
                    Some("fail, link down")
                ),
            ]
        );
        let healthy: Vec<_> = nodes.iter().map(|n| n.healthy).collect();
        assert_eq!(healthy, [false, true, true, false, false, false]);
        let latencies: Vec<_> = nodes.iter().map(|n| n.latency.is_some()).collect();
        assert_eq!(latencies, [false, true, false, false, false, false]);
    }

    #[test]
    fn addresses_carry_no_credentials() {
        assert_eq!(
            address("redis://app:secret@10.0.0.1:6380/2"),
            "10.0.0.1:6380"
        );
        assert_eq!(address("redis://:secret@cache"), "cache:6379");
    }
}
