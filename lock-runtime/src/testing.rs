//! Test your annotated fns and handlers against a real Redis, in three lines (feature
//! `testing`, for `[dev-dependencies]`):
//!
//! ```no_run
//! use lock_runtime::{LockError, distributed_lock};
//!
//! #[distributed_lock(key = "goods:<id>", wait = "1s")]
//! async fn buy(id: u64) -> Result<String, LockError> {
//!     Ok(format!("bought {id}"))
//! }
//!
//! #[tokio::test]
//! async fn buys() {
//!     lock_runtime::testing::init().await;
//!     assert_eq!(buy(7).await.unwrap(), "bought 7");
//! }
//! ```
//!
//! [`init`] starts a private `redis-server` for the test process - on a free loopback port,
//! without persistence - and sets the global service up on it ([`crate::init`]); later calls
//! in the same process (the other tests of a `cargo test` binary) share both. The server stops
//! when the test process ends, also when it is killed. [`RedisServer`] starts one for you to
//! use otherwise (a [`LockService`] of its own, raw commands), stopped when dropped.
//!
//! `redis-server` is looked for as `$REDIS_SERVER_BIN`, else on the `PATH` (Debian and Ubuntu:
//! `apt install redis-server`; macOS: `brew install redis`). Unix only.

use std::io;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::config::LockConfig;
use crate::error::{ErrorKind, LockError};
use crate::service::LockService;

/// How long a started server may take to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A `redis-server` on a free loopback port, without persistence, for tests; stopped when
/// dropped, and when the process that started it ends (even by `SIGKILL`).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use lock_runtime::LockService;
/// use lock_runtime::testing::RedisServer;
///
/// let server = RedisServer::start().await?; // stopped when dropped
/// let locks = LockService::connect(server.config()).await?;
/// let guard = locks.lock("k").await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// A shell that runs the server and stops it when its stdin (our end of the pipe) closes.
    keeper: Child,
}

impl RedisServer {
    /// Starts a server and waits until it answers.
    ///
    /// # Errors
    /// When `redis-server` cannot be started (not installed: the message says how to get it),
    /// or does not answer within 10 s.
    pub async fn start() -> io::Result<RedisServer> {
        let mut last = None;
        // a free port can be taken by someone else between the probe and the server's bind
        for _ in 0..3 {
            match RedisServer::start_once().await {
                Ok(server) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    async fn start_once() -> io::Result<RedisServer> {
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned());
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        // The shell starts the server, then waits for its stdin to close (this process's end
        // of the pipe closes when it exits, however it exits) and stops the server.
        let script = r#"bin="$1"; shift; "$bin" "$@" & pid=$!; read -r _; kill "$pid" 2>/dev/null; wait "$pid""#;
        let keeper = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--loglevel", "warning", "--logfile", ""])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        let mut server = RedisServer { port, keeper };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if server.answers().await {
                return Ok(server);
            }
            if let Some(status) = server.keeper.try_wait()? {
                return Err(io::Error::other(format!(
                    "{bin} exited ({status}) before it answered on port {port}; is it \
                     installed? (Debian/Ubuntu: apt install redis-server; macOS: brew install \
                     redis; or set $REDIS_SERVER_BIN)"
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{bin} did not answer on port {port} within {READY_WITHIN:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn answers(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut con) = client.get_multiplexed_async_connection().await else {
            return false;
        };
        redis::cmd("PING")
            .query_async::<String>(&mut con)
            .await
            .is_ok()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on (loopback only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A configuration for this server, with the defaults.
    pub fn config(&self) -> LockConfig {
        LockConfig::single(self.url())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // closing the pipe makes the shell stop the server
        drop(self.keeper.stdin.take());
        let _ = self.keeper.wait();
    }
}

/// The test process's server, started by the first [`init`].
static SERVER: OnceCell<RedisServer> = OnceCell::const_new();

/// Starts the test process's private `redis-server` (once) and sets the global service up on
/// it (once); returns the service. Call it first in a test of annotated fns or handlers.
///
/// # Panics
/// When the server cannot be started or the service cannot connect, with the reason (a test
/// cannot go on without them).
pub async fn init() -> &'static LockService {
    match try_init().await {
        Ok(service) => service,
        Err(e) => panic!("lock_runtime::testing::init: {e}"),
    }
}

/// [`init`] returning its error instead of panicking.
///
/// # Errors
/// [`ErrorKind::Backend`] when the server could not be started; the errors of
/// [`crate::init`]; [`ErrorKind::Config`] when the global service was set up already with
/// another configuration.
pub async fn try_init() -> Result<&'static LockService, LockError> {
    let server = SERVER
        .get_or_try_init(RedisServer::start)
        .await
        .map_err(|e| {
            LockError::new(
                ErrorKind::Backend,
                format!("cannot start a test redis-server: {e}"),
            )
        })?;
    crate::init(server.config()).await
}
