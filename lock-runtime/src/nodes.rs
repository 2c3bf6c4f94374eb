//! The Redis servers a service uses, each with its role and health, for operators: what
//! [`LockService::nodes`](crate::LockService::nodes) returns.

use std::fmt;
use std::time::Duration;

/// The servers of the configured topology, from [`LockService::nodes`](crate::LockService::nodes):
/// the data nodes (and, in sentinel mode, the sentinels), each with its role and whether it
/// answers now.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let topology = locks.nodes().await?;
/// if !topology.all_healthy() {
///     for node in topology.nodes.iter().filter(|n| !n.healthy) {
///         eprintln!("{} {} {}", node.role, node.address, node.detail.as_deref().unwrap_or(""));
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisNodes {
    /// The configured mode, as written in the config file (`redis.mode`): `"single"`,
    /// `"master-slave"`, `"sentinel"` or `"cluster"`.
    pub mode: &'static str,
    /// The servers: the master first, then its replicas (master-slave: in the configured
    /// order), then the sentinels; in a cluster each master followed by its replicas, by
    /// address.
    pub nodes: Vec<NodeStatus>,
}

impl RedisNodes {
    /// Whether every node is healthy.
    pub fn all_healthy(&self) -> bool {
        self.nodes.iter().all(|n| n.healthy)
    }

    /// The nodes of `role`.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::NodeRole;
    ///
    /// let topology = locks.nodes().await?;
    /// let masters = topology.with_role(NodeRole::Master).count();
    /// # let _ = masters;
    /// # Ok(()) }
    /// ```
    pub fn with_role(&self, role: NodeRole) -> impl Iterator<Item = &NodeStatus> {
        self.nodes.iter().filter(move |n| n.role == role)
    }
}

/// One server of a [`RedisNodes`] view.
///
/// `healthy` means the server answers and does its part: a master that answers as a master, a
/// replica whose link to its master is up, a sentinel that answers `PING`, a cluster node that
/// no node flags as failing and whose cluster link is connected. What is wrong with an
/// unhealthy one is in [`detail`](Self::detail).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStatus {
    /// `host:port` as configured or as the servers name each other (`[v6]:port` for an IPv6
    /// host); never a user or a password.
    pub address: String,
    /// The server's role: what it says it is when it answers, else what the configuration or
    /// the other servers say it should be.
    pub role: NodeRole,
    /// Whether it answers and does its part (see above).
    pub healthy: bool,
    /// The round trip of the command that probed it (`ROLE`, `PING` or `CLUSTER NODES`, not
    /// counting connecting); `None` for a server that was not asked itself (a replica its
    /// master lists, a cluster node another node describes) or did not answer.
    pub latency: Option<Duration>,
    /// The `host:port` of the master a replica follows, when known.
    pub replica_of: Option<String>,
    /// What is notable about it: why it is unhealthy (`"not reachable: ..."`, `"fail"`,
    /// `"pfail"`, `"handshake"`, `"noaddr"`, `"link down"`, `"replication link down
    /// (connecting)"`, a role other than the expected one), or how far a replica is behind its
    /// master (`"1024 bytes behind its master"`; replicas acknowledge about once a second, so
    /// a few hundred bytes are normal while the master takes writes). `None` when there is
    /// nothing to say.
    pub detail: Option<String>,
}

impl NodeStatus {
    pub(crate) fn new(address: String, role: NodeRole) -> NodeStatus {
        NodeStatus {
            address,
            role,
            healthy: true,
            latency: None,
            replica_of: None,
            detail: None,
        }
    }

    /// This node as unhealthy for `why`.
    pub(crate) fn failing(mut self, why: impl Into<String>) -> NodeStatus {
        self.healthy = false;
        self.detail = Some(why.into());
        self
    }
}

/// What a server is in the topology.
///
/// ```
/// assert_eq!(lock_runtime::NodeRole::Replica.to_string(), "replica");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeRole {
    /// A master: lock operations go there (in a cluster, those of its slots).
    Master,
    /// A replica of a master.
    Replica,
    /// A Redis Sentinel (sentinel mode).
    Sentinel,
    /// A cluster node whose role the cluster does not know yet (still in handshake).
    Unknown,
}

impl NodeRole {
    /// The name: `master`, `replica`, `sentinel` or `unknown`.
    pub const fn as_str(self) -> &'static str {
        match self {
            NodeRole::Master => "master",
            NodeRole::Replica => "replica",
            NodeRole::Sentinel => "sentinel",
            NodeRole::Unknown => "unknown",
        }
    }
}

impl fmt::Display for NodeRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
