//! Server binaries and child processes.
//!
//! Every child is forked by one long-lived thread and gets `PR_SET_PDEATHSIG(SIGKILL)`. The
//! kernel sends that signal when the *thread* that forked the child exits, not the process, so
//! forking from a tokio blocking-pool thread (which exits after being idle for a while, or when
//! its runtime shuts down) would kill servers that a shared topology still needs. The spawner
//! thread lives until the process exits, and then the servers die with it.

use std::env;
use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;

/// Which program to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Program {
    /// `redis-server` (`REDIS_SERVER_BIN`).
    Server,
    /// `redis-sentinel` (`REDIS_SENTINEL_BIN`), or `redis-server --sentinel`.
    Sentinel,
    /// `redis-cli` (`REDIS_CLI_BIN`).
    Cli,
}

/// A resolved program: the executable and the arguments that go after the first one.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    exe: PathBuf,
    trailing_args: Vec<&'static str>,
}

impl Resolved {
    /// A command running this program with `first` as its first argument.
    pub(crate) fn command(&self, first: impl Into<OsString>) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.arg(first.into()).args(&self.trailing_args);
        cmd
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn missing(what: &str, var: &str, tried: &str) -> ! {
    panic!(
        "{what} not found (tried {tried:?}; override with {var}). The integration tests need \
         real Redis binaries: run `bash scripts/test.sh`, which installs redis-server, \
         redis-sentinel and redis-tools when they are missing."
    )
}

fn resolve_uncached(program: Program) -> Resolved {
    let server = || {
        let name = env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        find_on_path(&name).unwrap_or_else(|| missing("redis-server", "REDIS_SERVER_BIN", &name))
    };
    match program {
        Program::Server => Resolved {
            exe: server(),
            trailing_args: Vec::new(),
        },
        Program::Sentinel => {
            if let Ok(name) = env::var("REDIS_SENTINEL_BIN") {
                let exe = find_on_path(&name)
                    .unwrap_or_else(|| missing("redis-sentinel", "REDIS_SENTINEL_BIN", &name));
                return Resolved {
                    exe,
                    trailing_args: Vec::new(),
                };
            }
            match find_on_path("redis-sentinel") {
                Some(exe) => Resolved {
                    exe,
                    trailing_args: Vec::new(),
                },
                None => Resolved {
                    exe: server(),
                    trailing_args: vec!["--sentinel"],
                },
            }
        }
        Program::Cli => {
            let name = env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".into());
            Resolved {
                exe: find_on_path(&name)
                    .unwrap_or_else(|| missing("redis-cli", "REDIS_CLI_BIN", &name)),
                trailing_args: Vec::new(),
            }
        }
    }
}

/// Finds a program once per process.
///
/// # Panics
///
/// If the binary is not installed, with a message that points at `scripts/test.sh`.
pub(crate) fn resolve(program: Program) -> Resolved {
    static CACHE: [OnceLock<Resolved>; 3] = [const { OnceLock::new() }; 3];
    let idx = match program {
        Program::Server => 0,
        Program::Sentinel => 1,
        Program::Cli => 2,
    };
    CACHE[idx].get_or_init(|| resolve_uncached(program)).clone()
}

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static mpsc::Sender<SpawnJob> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("harness-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .unwrap_or_else(|e| panic!("cannot start the harness spawner thread: {e}"));
        tx
    })
}

/// Spawns `cmd` from the spawner thread with `PR_SET_PDEATHSIG(SIGKILL)`, so the child is
/// killed by the kernel when this process exits, however it exits.
///
/// # Errors
///
/// The error of `Command::spawn`.
pub(crate) fn spawn(mut cmd: Command) -> io::Result<Child> {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe functions
    // (prctl, getppid); it does not allocate on the success path.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect: then no signal will come.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .send((cmd, tx))
        .map_err(|_| io::Error::other("the harness spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the harness spawner thread is gone"))?
}

/// Environment variables of every `redis-server` started from now on (see `FakeClock`).
static SERVER_ENV: std::sync::Mutex<Vec<(OsString, OsString)>> = std::sync::Mutex::new(Vec::new());

/// Sets the environment variables of every `redis-server` started from now on.
pub(crate) fn set_server_env(vars: Vec<(OsString, OsString)>) {
    *SERVER_ENV
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = vars;
}

/// Starts `program` with `conf` as its first argument, in `dir`, with stdout and stderr appended
/// to `dir/stdout`.
///
/// # Panics
///
/// If the output file cannot be created or the program cannot be started.
pub(crate) fn spawn_in(program: Program, conf: &Path, dir: &Path) -> Child {
    let env = SERVER_ENV
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stdout"))
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.join("stdout").display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("cannot duplicate a file handle: {e}"));
    let resolved = resolve(program);
    let mut cmd = resolved.command(conf);
    if program == Program::Server {
        cmd.envs(env);
    }
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    spawn(cmd).unwrap_or_else(|e| panic!("cannot start {:?} ({program:?}): {e}", resolved.exe))
}

/// SIGKILLs a child and reaps it.
pub(crate) fn kill_and_wait(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}
