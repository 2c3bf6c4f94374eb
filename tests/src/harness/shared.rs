//! One topology per kind per test binary, unique keys, and the temporary directories.

use std::env;
use std::fs;
use std::hash::{BuildHasher, RandomState};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use tempfile::TempDir;
use tokio::sync::OnceCell;

use super::{Spec, Topology};

/// Prefix of every harness temporary directory: `lock-harness-<pid>-<random>`.
const DIR_PREFIX: &str = "lock-harness-";

/// The kinds of topology [`shared`] keeps, one each per test binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// [`Spec::Single`].
    Single,
    /// [`Spec::master_replicas`]: a master and 2 replicas.
    MasterReplicas,
    /// [`Spec::sentinel`]: 1 master, 2 replicas, 3 sentinels, down-after 2000 ms.
    Sentinel,
    /// [`Spec::cluster`]: 3 masters with 1 replica each.
    Cluster,
}

impl Kind {
    /// Every kind, in declaration order.
    pub const ALL: [Kind; 4] = [
        Kind::Single,
        Kind::MasterReplicas,
        Kind::Sentinel,
        Kind::Cluster,
    ];

    /// The spec [`shared`] starts for this kind.
    pub const fn spec(self) -> Spec {
        match self {
            Kind::Single => Spec::Single,
            Kind::MasterReplicas => Spec::master_replicas(),
            Kind::Sentinel => Spec::sentinel(),
            Kind::Cluster => Spec::cluster(),
        }
    }

    const fn index(self) -> usize {
        match self {
            Kind::Single => 0,
            Kind::MasterReplicas => 1,
            Kind::Sentinel => 2,
            Kind::Cluster => 3,
        }
    }
}

static SHARED: [OnceCell<Topology>; 4] = [const { OnceCell::const_new() }; 4];

/// The topology of `kind` shared by every test of this test binary, started on first use.
///
/// It lives until the process exits: its processes are killed and its directory removed by an
/// exit hook, and `PR_SET_PDEATHSIG` kills the processes even when the process aborts. Do not
/// kill, restart or fail over its nodes; start a [`Topology`] of your own for that. Keep keys
/// apart with [`unique_key`].
///
/// The topology holds no runtime resources, so tests with different tokio runtimes can share
/// it. Under `cargo nextest` every test is its own process, so each test that calls this
/// starts its own copy.
///
/// # Panics
///
/// As [`Topology::start`].
pub async fn shared(kind: Kind) -> &'static Topology {
    SHARED[kind.index()]
        .get_or_init(|| async move {
            register_exit_hook();
            Topology::start(kind.spec()).await
        })
        .await
}

fn register_exit_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registers a plain function with no captured state.
        let _ = unsafe { libc::atexit(shutdown_shared) };
    });
}

extern "C" fn shutdown_shared() {
    for cell in &SHARED {
        if let Some(topology) = cell.get() {
            // Never unwind into C.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| topology.shutdown()));
        }
    }
}

/// A key no other call returns, in this or any concurrent test process:
/// `<prefix>:<pid>:<counter>:<random hex>`. It contains no `{}`, so callers can wrap it in a
/// hash tag for cluster keys.
pub fn unique_key(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Each RandomState gets fresh random keys, so this differs between processes even when a
    // pid is reused.
    let random = RandomState::new().hash_one(n) as u32;
    format!("{prefix}:{}:{n}:{random:08x}", std::process::id())
}

/// A fresh temporary directory for one topology. The first call per process also removes the
/// directories of harness processes that no longer exist (a test binary that was killed never
/// ran its exit hook; its servers died with it through `PR_SET_PDEATHSIG`).
pub(crate) fn temp_root() -> TempDir {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(sweep_stale_dirs);
    tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"))
}

fn sweep_stale_dirs() {
    let Ok(entries) = fs::read_dir(env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
