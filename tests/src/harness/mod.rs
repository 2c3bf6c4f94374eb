//! Real `redis-server` / `redis-sentinel` topologies for integration tests.
//!
//! [`Topology::start`] launches the processes of a [`Spec`] on free loopback ports, each in its
//! own directory under one temporary directory, and returns once the topology is ready (replicas
//! linked, sentinels agreeing, cluster slots all ok). Dropping the [`Topology`] SIGKILLs and
//! reaps every process and removes the directory. Children also get `PR_SET_PDEATHSIG(SIGKILL)`,
//! so they die with the test process even when it aborts or is killed.
//!
//! Tests that only read and write their own keys share one topology per [`Kind`] and test binary
//! through [`shared`], with [`unique_key`] keeping their keys apart. Tests that kill, restart or
//! fail over nodes start a topology of their own.
//!
//! [`Topology::start_tls`] starts a topology that speaks TLS only (mutual TLS with the
//! certificates of a [`Pki`] made at run time; no plaintext port).
//!
//! A [`Proxy`] in front of a node ([`Topology::addr_of`]) injects network faults between a
//! client and that node: latency, a lost reply on a reset connection, a partition, resets.
//! A proxied cluster ([`Spec::proxied_cluster`]) has one in front of every node, announced by
//! the node, so that cluster clients reach the nodes only through them
//! ([`Topology::proxy_for`]).
//!
//! ```no_run
//! use lock_tests::harness::{Spec, Topology};
//!
//! # async fn demo() {
//! let topo = Topology::start(Spec::Single).await;
//! let mut con = topo.conn(topo.ports()[0]);
//! let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
//! topo.kill(topo.ports()[0]);
//! topo.restart(topo.ports()[0]).await;
//! # }
//! ```
//!
//! Environment:
//!
//! | variable | effect |
//! |---|---|
//! | `REDIS_SERVER_BIN`, `REDIS_SENTINEL_BIN`, `REDIS_CLI_BIN` | binaries to run (default: found on `PATH`; sentinels fall back to `redis-server --sentinel`) |
//! | `HARNESS_PORT_BASE` | take ports from a per-process window above this port instead of from the OS |
//! | `HARNESS_READY_TIMEOUT_SECS` | readiness deadline (default 20 s) |

mod clock;
mod cluster;
mod node;
mod ports;
mod process;
mod proxy;
mod replication;
mod roles;
mod sentinel;
mod shared;
mod tls;
mod topology;
mod util;

pub use clock::FakeClock;
pub use proxy::{Faults, Proxy};
pub use shared::{Kind, shared, unique_key};
pub use tls::{Pki, Validity};
pub use topology::Topology;

/// Starts `cmd` as a child process that the kernel SIGKILLs when this process exits, however it
/// exits (panic, abort, SIGKILL on a test timeout), the way the harness starts its servers.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process, so
/// the child is forked by the harness's spawner thread, which lives until the process exits; a
/// child forked from a test or tokio thread would be killed as soon as that thread ends (a
/// blocking-pool thread idles out, a runtime shuts down) or, without the signal, outlive a killed
/// test. A parent that died before the signal was armed is detected too (`getppid` check), and the
/// spawn fails then.
///
/// # Errors
///
/// The error of `Command::spawn`, or of `prctl` in the child.
pub fn spawn_child(cmd: std::process::Command) -> std::io::Result<std::process::Child> {
    process::spawn(cmd)
}

/// The processes a [`Topology`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Spec {
    /// One `redis-server`.
    Single,
    /// A master and `replicas` replicas, linked by `REPLICAOF`; nothing fails over.
    MasterReplicas {
        /// Number of replicas of the master.
        replicas: usize,
    },
    /// A master, `replicas` replicas and `sentinels` sentinels monitoring the master as
    /// `mymaster` with quorum `sentinels / 2 + 1` and `failover-timeout 5000`.
    Sentinel {
        /// Number of replicas of the master.
        replicas: usize,
        /// Number of sentinels.
        sentinels: usize,
        /// `down-after-milliseconds`; below 2000 spurious failovers happen on a loaded 2-core
        /// machine.
        down_after_ms: u64,
    },
    /// A Redis Cluster of `masters` masters (at least 3), each with `replicas_per_master`
    /// replicas.
    ///
    /// With `proxied`, every node has a [`Proxy`] in front of it and announces the proxy's port
    /// (`cluster-announce-ip 127.0.0.1`, `cluster-announce-port`; its bus port stays the real
    /// one, `cluster-announce-bus-port`, so the nodes gossip directly): `CLUSTER SLOTS`,
    /// `CLUSTER SHARDS`, `CLUSTER NODES` and `MOVED` / `ASK` name the proxies, and a cluster
    /// client, whatever seeds it gets (real ports or [`Topology::proxied_node_urls`]), sends
    /// every routed command through them. Faults go on [`Topology::proxy_for`]. Replicas
    /// replicate through their master's proxy too (they follow the announced address), but
    /// its faults spare those links ([`Proxy::spare_replication`]).
    ///
    /// Ports the harness hands out (`node_ports`, `master_for_slot`, ...) stay the real ones,
    /// and the harness's readiness checks and [`Topology::conn`] use them: a raw connection to
    /// a real port bypasses the faults. `redis-cli --cluster create` is given the real ports
    /// (its final check follows the announced ones). The proxies run on the runtime that
    /// started the topology (see [`Topology::start`]). A killed node looks different through
    /// its proxy: connections are accepted, then reset, instead of refused.
    Cluster {
        /// Number of masters; the slots are split evenly between them.
        masters: usize,
        /// Number of replicas of each master.
        replicas_per_master: usize,
        /// `cluster-node-timeout`; a killed master is replaced after about 1.5 times this.
        node_timeout_ms: u64,
        /// Put a [`Proxy`] in front of every node and announce it.
        proxied: bool,
    },
}

impl Spec {
    /// A master with 2 replicas.
    pub const fn master_replicas() -> Spec {
        Spec::MasterReplicas { replicas: 2 }
    }

    /// 1 master, 2 replicas, 3 sentinels, `down-after-milliseconds 2000` (the value that does
    /// not fail over spuriously on CI machines).
    pub const fn sentinel() -> Spec {
        Spec::Sentinel {
            replicas: 2,
            sentinels: 3,
            down_after_ms: 2000,
        }
    }

    /// 3 masters with 1 replica each, `cluster-node-timeout 2000`.
    pub const fn cluster() -> Spec {
        Spec::Cluster {
            masters: 3,
            replicas_per_master: 1,
            node_timeout_ms: 2000,
            proxied: false,
        }
    }

    /// [`Spec::cluster`] with a [`Proxy`] in front of every node, announced by the node (see
    /// [`Spec::Cluster`]).
    pub const fn proxied_cluster() -> Spec {
        Spec::Cluster {
            masters: 3,
            replicas_per_master: 1,
            node_timeout_ms: 2000,
            proxied: true,
        }
    }

    /// The kind of topology this spec describes.
    pub const fn kind(&self) -> Kind {
        match self {
            Spec::Single => Kind::Single,
            Spec::MasterReplicas { .. } => Kind::MasterReplicas,
            Spec::Sentinel { .. } => Kind::Sentinel,
            Spec::Cluster { .. } => Kind::Cluster,
        }
    }
}
