//! One `redis-server` or `redis-sentinel` process: its directory, config file, port and child.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::ports;
use super::process::{self, Program};
use super::tls::Pki;
use super::util;

/// How long one readiness probe waits for `INFO server`: whatever holds the port may accept
/// connections and never answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a just-started process may take to answer or exit before a passed deadline counts.
const START_GRACE: Duration = Duration::from_secs(1);

/// What a node runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// A data node (`redis-server`).
    Server,
    /// A `redis-sentinel`.
    Sentinel,
}

/// A server process owned by a topology. Dropping it SIGKILLs and reaps the process.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) kind: NodeKind,
    pub(crate) port: u16,
    /// `cluster-port`, for cluster nodes.
    pub(crate) bus_port: Option<u16>,
    /// `cluster-node-timeout`, for cluster nodes.
    cluster_node_timeout_ms: Option<u64>,
    /// Config lines appended after the common ones (sentinel `monitor` lines and the like).
    extra_conf: String,
    /// The certificates of a TLS-only node (`port 0`, `tls-port`).
    tls: Option<Arc<Pki>>,
    dir: PathBuf,
    conf: PathBuf,
    child: Option<Child>,
    /// Size of the log file when the current child was started: only what follows is its output.
    log_offset: u64,
}

impl Node {
    /// Creates `root/name`, picks free ports, writes the config file and starts the process.
    /// Call [`Node::wait_up`] before using it.
    pub(crate) fn launch(
        root: &Path,
        name: &str,
        kind: NodeKind,
        cluster_node_timeout_ms: Option<u64>,
        extra_conf: String,
        tls: Option<Arc<Pki>>,
    ) -> Node {
        let dir = root.join(name);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let conf = dir.join(match kind {
            NodeKind::Server => "redis.conf",
            NodeKind::Sentinel => "sentinel.conf",
        });
        let mut node = Node {
            name: name.to_owned(),
            kind,
            port: 0,
            bus_port: None,
            cluster_node_timeout_ms,
            extra_conf,
            tls,
            dir,
            conf,
            child: None,
            log_offset: 0,
        };
        node.pick_ports_and_spawn();
        node
    }

    fn pick_ports_and_spawn(&mut self) {
        self.release_ports();
        self.port = ports::pick();
        self.bus_port = self.cluster_node_timeout_ms.map(|_| ports::pick());
        if let Some(pki) = &self.tls {
            util::register_tls(self.port, Arc::clone(pki));
        }
        self.write_conf();
        self.spawn();
    }

    fn release_ports(&mut self) {
        for port in [Some(self.port), self.bus_port.take()]
            .into_iter()
            .flatten()
        {
            if port != 0 {
                ports::release(port);
                util::unregister_tls(port);
            }
        }
    }

    fn write_conf(&self) {
        let dir = self.dir.display();
        let mut conf = match &self.tls {
            Some(pki) => pki.server_conf(self.port, self.cluster_node_timeout_ms.is_some()),
            None => format!("port {}\n", self.port),
        };
        let _ = write!(
            conf,
            "bind 127.0.0.1\ndaemonize no\ndir \"{dir}\"\nlogfile \"{dir}/log\"\n"
        );
        if self.kind == NodeKind::Server {
            conf.push_str(
                "save \"\"\nappendonly no\nrepl-diskless-sync yes\nrepl-diskless-sync-delay 0\n\
                 enable-debug-command local\n",
            );
        }
        if let (Some(timeout), Some(bus)) = (self.cluster_node_timeout_ms, self.bus_port) {
            let _ = write!(
                conf,
                "cluster-enabled yes\ncluster-config-file nodes.conf\n\
                 cluster-node-timeout {timeout}\ncluster-port {bus}\n"
            );
        }
        conf.push_str(&self.extra_conf);
        fs::write(&self.conf, conf)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", self.conf.display()));
    }

    /// Appends config lines and rewrites the config file, for the next start of the process
    /// (the running one is told with `CONFIG SET`, see the cluster's proxies).
    pub(crate) fn append_conf(&mut self, lines: &str) {
        self.extra_conf.push_str(lines);
        self.write_conf();
    }

    fn spawn(&mut self) {
        self.log_offset = fs::metadata(self.dir.join("log")).map_or(0, |m| m.len());
        let program = match self.kind {
            NodeKind::Server => Program::Server,
            NodeKind::Sentinel => Program::Sentinel,
        };
        self.child = Some(process::spawn_in(program, &self.conf, &self.dir));
    }

    /// The OS process id, while the process is running.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `true` while the process has not exited (and has not been killed by the harness).
    pub(crate) fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILLs the process and waits for it. Does nothing if it is not running.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            process::kill_and_wait(&mut child);
        }
    }

    /// Sends SIGKILL without waiting; [`Node::kill`] reaps it afterwards.
    pub(crate) fn signal_kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
        }
    }

    /// Output of the current run since it started.
    fn current_log(&self) -> String {
        let log = fs::read(self.dir.join("log")).unwrap_or_default();
        let start = usize::try_from(self.log_offset).unwrap_or(0).min(log.len());
        let mut text = String::from_utf8_lossy(&log[start..]).into_owned();
        text.push_str(&fs::read_to_string(self.dir.join("stdout")).unwrap_or_default());
        text
    }

    /// The last `lines` lines of the node's log file and of its stdout/stderr.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for file in ["log", "stdout"] {
            let text = fs::read_to_string(self.dir.join(file)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            if all.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "--- {}/{file} (last {lines} lines)",
                self.dir.display()
            );
            for line in &all[all.len().saturating_sub(lines)..] {
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }

    fn fail(&self, why: &str) -> ! {
        panic!(
            "{} {} on port {}: {why}\n{}",
            match self.kind {
                NodeKind::Server => "redis-server",
                NodeKind::Sentinel => "redis-sentinel",
            },
            self.name,
            self.port,
            self.log_tail(30)
        )
    }

    /// Waits until the node answers on its port, and is the process this node started: a server
    /// of another test process that took the port first answers too, until our process notices
    /// the port is in use and exits. If the process exits early because its port was taken, it
    /// is started again: on new ports when `may_move` is set (first start), otherwise on the same
    /// port once the port is free again.
    ///
    /// # Panics
    ///
    /// If the process exits for another reason, or does not answer within `timeout`; the message
    /// carries the tail of its log.
    pub(crate) fn wait_up(&mut self, timeout: Duration, may_move: bool) {
        let start = Instant::now();
        let mut spawned = start;
        loop {
            let Some(child) = self.child.as_mut() else {
                self.fail("is not running");
            };
            let pid = child.id();
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                if !self.current_log().contains("already in use") {
                    self.fail(&format!("exited during start-up ({status})"));
                }
                if start.elapsed() >= timeout {
                    let port = self.port;
                    self.fail(&if may_move {
                        format!("every port it was given was in use for {timeout:?}")
                    } else {
                        format!(
                            "port {port} was taken by another process while the node was down \
                             and was not freed within {timeout:?} (the node must come back on \
                             its own port)"
                        )
                    });
                }
                if may_move {
                    self.pick_ports_and_spawn();
                } else {
                    thread::sleep(Duration::from_millis(50));
                    self.spawn();
                }
                spawned = Instant::now();
                continue;
            }
            if util::process_id(self.port, PROBE_TIMEOUT) == Some(pid) {
                return;
            }
            // A process started again a moment ago gets a little longer, to answer or to exit
            // (and then say why): deciding at once would blame a port still held by another
            // process on the node.
            if start.elapsed() >= timeout && spawned.elapsed() >= START_GRACE {
                self.fail(&format!(
                    "no answer from its own process within {timeout:?}"
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts the process again with the same directory, config file and port, and waits for
    /// `PING`. A running process is killed first.
    pub(crate) fn restart(&mut self, timeout: Duration) {
        self.kill();
        self.spawn();
        self.wait_up(timeout, false);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        self.release_ports();
    }
}
