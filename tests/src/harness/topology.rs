//! [`Topology`]: the running processes of a [`Spec`] and what tests do with them.

use std::net::{Ipv4Addr, SocketAddr};
use std::panic;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tempfile::TempDir;

use super::node::{Node, NodeKind};
use super::proxy::Proxy;
use super::tls::Pki;
use super::{Spec, cluster, replication, sentinel, shared, util};

/// Running Redis processes started from a [`Spec`]. Dropping it SIGKILLs and reaps every process
/// and removes their directory.
///
/// Ports never change: [`Topology::restart`] brings a node back on the port it had. Roles do
/// change (failover), so the role accessors (`master_port`, `replica_ports`) describe the
/// topology as it was started; ask [`Topology::current_master`] or
/// [`Topology::master_for_slot`] for the present.
#[derive(Debug)]
pub struct Topology {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) spec: Spec,
    /// The certificates of a TLS topology.
    tls: Option<Arc<Pki>>,
    master: u16,
    replicas: Vec<u16>,
    servers: Vec<u16>,
    pub(super) sentinels: Vec<u16>,
    /// The proxies in front of the data nodes of a proxied cluster, in the order of `servers`
    /// (empty otherwise). Dropped after the processes are killed (`Drop for Inner`).
    proxies: Vec<Proxy>,
    /// Real port by announced (proxy) port; empty unless proxied.
    pub(super) announced: cluster::Announced,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    servers: Vec<Node>,
    sentinels: Vec<Node>,
    dir: Option<TempDir>,
}

/// Runs blocking harness work off the async runtime and re-raises its panic in the caller.
pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => match e.try_into_panic() {
            Ok(payload) => panic::resume_unwind(payload),
            Err(e) => panic!("harness task failed: {e}"),
        },
    }
}

impl Topology {
    /// Starts the processes of `spec` and waits until the topology is ready. The blocking work
    /// runs on tokio's blocking pool.
    ///
    /// A proxied cluster ([`Spec::Cluster`] with `proxied`) runs its proxies on the current
    /// runtime: use it within that runtime only (it cannot be [`shared`](super::shared) between
    /// tests with runtimes of their own).
    ///
    /// # Panics
    ///
    /// If a binary is missing (the message says to run `scripts/test.sh`), or the topology is
    /// not ready within the deadline (20 s, `HARNESS_READY_TIMEOUT_SECS`); the message carries
    /// the tail of the server logs. Processes started so far are killed.
    pub async fn start(spec: Spec) -> Topology {
        blocking(move || Topology::start_blocking(spec)).await
    }

    /// [`Topology::start`] for synchronous code.
    ///
    /// # Panics
    ///
    /// As [`Topology::start`]; for a proxied cluster also outside a tokio runtime (the proxies
    /// need one; call it from `spawn_blocking` or a thread that entered the runtime).
    pub fn start_blocking(spec: Spec) -> Topology {
        Topology::start_blocking_with(spec, None)
    }

    /// [`Topology::start`] with every process speaking TLS only: `port 0` and `tls-port`, the
    /// certificates of `pki`, clients must present a certificate of its CA (`tls-auth-clients
    /// yes`), and the servers talk TLS to each other (`tls-replication yes`, `tls-cluster yes`;
    /// sentinels too). URLs ([`Topology::url`] and the like) are `rediss://`, and the harness's
    /// own connections ([`Topology::conn`]) use the client certificate of `pki`.
    ///
    /// # Panics
    ///
    /// As [`Topology::start`]; for a proxied cluster (not supported with TLS).
    pub async fn start_tls(spec: Spec, pki: Arc<Pki>) -> Topology {
        blocking(move || Topology::start_blocking_with(spec, Some(pki))).await
    }

    fn start_blocking_with(spec: Spec, tls: Option<Arc<Pki>>) -> Topology {
        let dir = shared::temp_root();
        let tls_ref = tls.as_ref();
        let root = dir.path().to_path_buf();
        let timeout = util::ready_timeout();
        let mut proxies = Vec::new();
        let (servers, sentinels, master, replicas) = match spec {
            Spec::Single => {
                let nodes = replication::start(&root, 0, tls_ref, timeout);
                let master = nodes[0].port;
                (nodes, Vec::new(), master, Vec::new())
            }
            Spec::MasterReplicas { replicas } => {
                let nodes = replication::start(&root, replicas, tls_ref, timeout);
                let ports = nodes[1..].iter().map(|n| n.port).collect();
                let master = nodes[0].port;
                (nodes, Vec::new(), master, ports)
            }
            Spec::Sentinel {
                replicas,
                sentinels,
                down_after_ms,
            } => {
                assert!(
                    sentinels > 0,
                    "a sentinel topology needs at least one sentinel"
                );
                let nodes = replication::start(&root, replicas, tls_ref, timeout);
                let ports = nodes[1..].iter().map(|n| n.port).collect();
                let master = nodes[0].port;
                let watchers = sentinel::start(
                    &root,
                    master,
                    replicas,
                    sentinels,
                    down_after_ms,
                    tls_ref,
                    timeout,
                );
                (nodes, watchers, master, ports)
            }
            Spec::Cluster {
                masters,
                replicas_per_master,
                node_timeout_ms,
                proxied,
            } => {
                assert!(
                    !(proxied && tls.is_some()),
                    "a proxied cluster cannot run with TLS"
                );
                let runtime = proxied.then(|| {
                    tokio::runtime::Handle::try_current().unwrap_or_else(|_| {
                        panic!(
                            "a proxied cluster runs its proxies on a tokio runtime: start it \
                             with Topology::start from async code"
                        )
                    })
                });
                let c = cluster::start(
                    &root,
                    masters,
                    replicas_per_master,
                    node_timeout_ms,
                    runtime.as_ref(),
                    tls_ref,
                    timeout,
                );
                proxies = c.proxies;
                (c.nodes, Vec::new(), c.masters[0], c.replicas)
            }
        };
        Topology {
            inner: Arc::new(Inner {
                spec,
                tls,
                master,
                replicas,
                servers: servers.iter().map(|n| n.port).collect(),
                sentinels: sentinels.iter().map(|n| n.port).collect(),
                announced: cluster::announced(&proxies),
                proxies,
                state: Mutex::new(State {
                    servers,
                    sentinels,
                    dir: Some(dir),
                }),
            }),
        }
    }

    /// The spec this topology was started from.
    pub fn spec(&self) -> Spec {
        self.inner.spec
    }

    /// The certificates of a TLS topology ([`Topology::start_tls`]).
    pub fn tls(&self) -> Option<&Arc<Pki>> {
        self.inner.tls.as_ref()
    }

    /// The URL to hand a client: the server (single), the master as started (master-replicas,
    /// sentinel) or the first node (cluster, where any node is a valid seed).
    pub fn url(&self) -> String {
        match self.inner.spec {
            Spec::Cluster { .. } => util::url(self.inner.servers[0]),
            _ => util::url(self.inner.master),
        }
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` with TLS) of the master as started (cluster: the
    /// first master).
    pub fn master_url(&self) -> String {
        util::url(self.inner.master)
    }

    /// Port of the master as started (cluster: the first master by port).
    pub fn master_port(&self) -> u16 {
        self.inner.master
    }

    /// URLs of the replicas as started.
    pub fn replica_urls(&self) -> Vec<String> {
        self.inner.replicas.iter().copied().map(util::url).collect()
    }

    /// Ports of the replicas as started.
    pub fn replica_ports(&self) -> Vec<u16> {
        self.inner.replicas.clone()
    }

    /// URLs of the sentinels (empty unless [`Spec::Sentinel`]).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.inner
            .sentinels
            .iter()
            .copied()
            .map(util::url)
            .collect()
    }

    /// Ports of the sentinels (empty unless [`Spec::Sentinel`]).
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.inner.sentinels.clone()
    }

    /// The name the sentinels monitor the master under: `"mymaster"`.
    pub fn master_name(&self) -> &'static str {
        sentinel::MASTER_NAME
    }

    /// URLs of every data node (`redis-server`), masters and replicas; the cluster seed list.
    pub fn node_urls(&self) -> Vec<String> {
        self.inner.servers.iter().copied().map(util::url).collect()
    }

    /// Ports of every data node, masters and replicas.
    pub fn node_ports(&self) -> Vec<u16> {
        self.inner.servers.clone()
    }

    /// Ports of every process: data nodes, then sentinels.
    pub fn ports(&self) -> Vec<u16> {
        let mut all = self.inner.servers.clone();
        all.extend(&self.inner.sentinels);
        all
    }

    /// `true` for a proxied cluster ([`Spec::Cluster`] with `proxied`).
    pub fn is_proxied(&self) -> bool {
        !self.inner.proxies.is_empty()
    }

    /// The [`Proxy`] in front of the data node on `port` (its real port, as [`node_ports`],
    /// [`master_for_slot`] and the role accessors give it) of a proxied cluster. Faults set on it
    /// hit every client of that node: cluster clients reach the nodes only through the proxies
    /// (see [`Spec::Cluster`]).
    ///
    /// [`node_ports`]: Topology::node_ports
    /// [`master_for_slot`]: Topology::master_for_slot
    ///
    /// # Panics
    ///
    /// If this is not a proxied cluster or `port` is not one of its data nodes.
    pub fn proxy_for(&self, port: u16) -> &Proxy {
        self.inner
            .proxies
            .iter()
            .find(|p| p.upstream().port() == port)
            .unwrap_or_else(|| {
                panic!(
                    "no proxy in front of port {port} ({:?}; proxied nodes: {:?})",
                    self.inner.spec, self.inner.servers
                )
            })
    }

    /// The proxies of a proxied cluster, in the order of [`Topology::node_ports`] (empty
    /// otherwise).
    pub fn proxies(&self) -> &[Proxy] {
        &self.inner.proxies
    }

    /// `redis://127.0.0.1:PROXY_PORT` of every data node of a proxied cluster, in the order of
    /// [`Topology::node_ports`]: the seed list a client that goes through the proxies from its
    /// first connection on gets (empty unless proxied).
    pub fn proxied_node_urls(&self) -> Vec<String> {
        self.inner.proxies.iter().map(Proxy::url).collect()
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://` for a node of a TLS topology of this process.
    pub fn url_of(port: u16) -> String {
        util::url(port)
    }

    /// `127.0.0.1:PORT`, the socket address of a node (e.g. the upstream of a
    /// [`Proxy`](super::Proxy)).
    pub fn addr_of(port: u16) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, port))
    }

    /// A blocking connection to the node on `port`, for raw commands in tests.
    ///
    /// # Panics
    ///
    /// If the node does not accept the connection; the message carries its log tail.
    pub fn conn(&self, port: u16) -> redis::Connection {
        util::connect(port).unwrap_or_else(|e| {
            panic!(
                "cannot connect to port {port}: {e}\n{}",
                self.log_tail(port, 20)
            )
        })
    }

    /// A blocking connection to the node on `port`, or the error.
    ///
    /// # Errors
    ///
    /// Connection failures, e.g. while the node is killed.
    pub fn try_conn(&self, port: u16) -> redis::RedisResult<redis::Connection> {
        util::connect(port)
    }

    /// The OS process id of the node on `port`, `None` while it is killed.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.inner.with_node(port, |n| n.pid())
    }

    /// `true` unless the node on `port` was killed (or died).
    pub fn is_running(&self, port: u16) -> bool {
        self.inner.with_node(port, Node::is_running)
    }

    /// The last `lines` lines of the log of the node on `port`.
    pub fn log_tail(&self, port: u16, lines: usize) -> String {
        self.inner.with_node(port, |n| n.log_tail(lines))
    }

    /// SIGKILLs the process on `port` and waits for it to exit. Killing a killed node does
    /// nothing.
    ///
    /// # Panics
    ///
    /// If `port` does not belong to this topology.
    pub fn kill(&self, port: u16) {
        self.inner.with_node(port, Node::kill);
    }

    /// Starts the process on `port` again, with the same directory, config file and port (a
    /// running one is killed first), and waits until it is ready:
    ///
    /// * always: the node's own new process answers on the port (`INFO server` names its pid).
    ///   If another process took the port while the node was down, the restart waits for it to
    ///   be freed and panics, saying so, when it is not within the deadline;
    /// * single: nothing more (data is gone: nothing is persisted);
    /// * the master of a master-replicas or sentinel topology (still the master the sentinels
    ///   name): every running replica linked to it again and acknowledging a write;
    /// * a sentinel: it names the master the other sentinels name, and each of them lists it
    ///   without `s_down` / `disconnected` flags;
    /// * a replica of a master-replicas or sentinel topology: `REPLICAOF` the current master
    ///   (if that master runs) and `master_link_status:up`;
    /// * a cluster node: it rejoins from its `nodes.conf` and reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// If `port` does not belong to this topology or the node is not ready within the deadline.
    pub async fn restart(&self, port: u16) {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.restart(port)).await;
    }

    /// [`Topology::restart`] for synchronous code.
    ///
    /// # Panics
    ///
    /// As [`Topology::restart`].
    pub fn restart_blocking(&self, port: u16) {
        self.inner.restart(port);
    }

    /// Kills every process and removes the directory now, instead of at drop.
    pub(crate) fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with_node<T>(&self, port: u16, f: impl FnOnce(&mut Node) -> T) -> T {
        let mut state = self.lock();
        let State {
            servers, sentinels, ..
        } = &mut *state;
        let node = servers
            .iter_mut()
            .chain(sentinels.iter_mut())
            .find(|n| n.port == port)
            .unwrap_or_else(|| {
                panic!("port {port} is not part of this topology ({:?})", self.spec)
            });
        f(node)
    }

    pub(super) fn running(&self, kind: NodeKind) -> Vec<u16> {
        let mut state = self.lock();
        let nodes = match kind {
            NodeKind::Server => &mut state.servers,
            NodeKind::Sentinel => &mut state.sentinels,
        };
        nodes
            .iter_mut()
            .filter_map(|n| n.is_running().then_some(n.port))
            .collect()
    }

    pub(super) fn log_tails(&self, kind: NodeKind) -> String {
        let state = self.lock();
        let nodes = match kind {
            NodeKind::Server => &state.servers,
            NodeKind::Sentinel => &state.sentinels,
        };
        nodes.iter().map(|n| n.log_tail(15)).collect()
    }

    fn restart(&self, port: u16) {
        let timeout = util::ready_timeout();
        let started = Instant::now();
        let kind = self.with_node(port, |n| {
            n.restart(timeout);
            n.kind
        });
        let left = timeout.saturating_sub(started.elapsed());
        if kind == NodeKind::Sentinel {
            let others: Vec<u16> = self
                .running(NodeKind::Sentinel)
                .into_iter()
                .filter(|&p| p != port)
                .collect();
            let master = sentinel::vote(&others);
            if util::poll_until(left, || {
                sentinel::rejoined(port, &others, master).then_some(())
            })
            .is_err()
            {
                panic!(
                    "restarted sentinel {port} did not rejoin within {timeout:?}: it names {:?} \
                     (the others {master:?}), or not every other sentinel lists it as healthy\n{}",
                    sentinel::master_addr(port),
                    self.with_node(port, |n| n.log_tail(30))
                );
            }
            return;
        }
        let master = match self.spec {
            Spec::Single => return,
            Spec::MasterReplicas { .. } => self.master,
            Spec::Sentinel { .. } => sentinel::vote(&self.sentinels).unwrap_or(self.master),
            Spec::Cluster { .. } => {
                // A restarted master's nodes.conf still says it serves its slots; wait until it
                // agrees with the rest of the cluster (it is demoted if it was failed over).
                let others: Vec<u16> = self
                    .running(NodeKind::Server)
                    .into_iter()
                    .filter(|&p| p != port)
                    .collect();
                let announced = &self.announced;
                let settled = util::poll_until(left, || {
                    let mine = cluster::slot_map(port, announced)?;
                    let agreed = cluster::node_ok(port, None)
                        && others
                            .first()
                            .is_none_or(|&o| cluster::slot_map(o, announced) == Some(mine));
                    agreed.then_some(())
                });
                if settled.is_err() {
                    panic!(
                        "cluster node {port} did not rejoin (cluster_state:ok, same slot map as \
                         the other nodes) within {timeout:?} after restart\n{}",
                        self.with_node(port, |n| n.log_tail(30))
                    );
                }
                return;
            }
        };
        if master == port {
            // The replicas reconnect to the restarted master by themselves (within about a
            // second) and sync again; ready once every running one acknowledges a write.
            let replicas: Vec<u16> = self
                .running(NodeKind::Server)
                .into_iter()
                .filter(|&p| p != port)
                .collect();
            let relinked = util::poll_until(left, || {
                replicas
                    .iter()
                    .all(|&r| replication::linked_to(r, port))
                    .then_some(())
            });
            if relinked.is_err() {
                panic!(
                    "the replicas {replicas:?} did not link to the restarted master {port} within \
                     {timeout:?}\n{}",
                    self.log_tails(NodeKind::Server)
                );
            }
            let left = timeout.saturating_sub(started.elapsed());
            let state = self.lock();
            if let Some(node) = state.servers.iter().find(|n| n.port == port) {
                replication::wait_acknowledged(node, replicas.len(), replication::READY_KEY, left);
            }
            return;
        }
        if !self.running(NodeKind::Server).contains(&master) {
            return;
        }
        let state = self.lock();
        let node = state.servers.iter().find(|n| n.port == port);
        if let Some(node) = node {
            replication::replicate(node, master);
            replication::wait_linked(node, left);
        }
    }

    fn shutdown(&self) {
        // try_lock: this also runs at process exit, where a lock held by a dying thread must
        // not hang the exit; PR_SET_PDEATHSIG still kills the processes then.
        if let Ok(mut state) = self.state.try_lock() {
            state.tear_down();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.state
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .tear_down();
    }
}

impl State {
    /// SIGKILLs every process (sentinels first, so none reacts to the others' deaths), reaps
    /// them, then removes the directory.
    fn tear_down(&mut self) {
        let State {
            servers,
            sentinels,
            dir,
        } = self;
        for node in sentinels.iter_mut().chain(servers.iter_mut()) {
            node.signal_kill();
        }
        for node in sentinels.iter_mut().chain(servers.iter_mut()) {
            node.kill();
        }
        drop(dir.take());
    }
}
