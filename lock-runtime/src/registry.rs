//! The process-wide [`LockService`] that annotated fns use.
//!
//! Set it up once with [`init`] or [`init_from_file`]; or let the first annotated call load
//! the file named by `$LOCK_CONFIG`, else `lock.toml` in the working directory, else `lock.toml`
//! beside the executable.
//!
//! The global service drives its connections, watchdog and subscriber on a small runtime of its
//! own (one thread), so it keeps working when it is used from several tokio runtimes or the
//! runtime that first touched it shuts down (each `#[tokio::test]` has its own runtime).
//!
//! ```no_run
//! # async fn demo() -> Result<(), lock_runtime::LockError> {
//! lock_runtime::init_from_file("config/lock.toml").await?;
//! let locks = lock_runtime::global().await?; // the same service, anywhere in the process
//! # let _ = locks; Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use tokio::sync::OnceCell;

use crate::config::LockConfig;
use crate::driver;
use crate::error::{ErrorKind, LockError};
use crate::service::LockService;

static GLOBAL: OnceCell<LockService> = OnceCell::const_new();

/// The environment variable naming the config file loaded on first use.
pub const CONFIG_ENV: &str = "LOCK_CONFIG";
/// The config file loaded on first use when `$LOCK_CONFIG` is not set: looked for in the working
/// directory, then beside the executable.
pub const DEFAULT_CONFIG_FILE: &str = "lock.toml";

/// Connects the process-wide lock service with `config`.
///
/// Calling it again with an equal configuration returns the existing service.
///
/// # Errors
/// [`ErrorKind::Config`] when a service with a different configuration is already set up (it
/// is never replaced silently), or the errors of [`LockService::connect`].
///
/// ```no_run
/// # async fn start() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::LockConfig;
///
/// lock_runtime::init(LockConfig::single("redis://127.0.0.1:6379")).await?; // once, at start-up
/// # Ok(()) }
/// ```
pub async fn init(config: LockConfig) -> Result<&'static LockService, LockError> {
    let mut ours = false;
    let service = GLOBAL
        .get_or_try_init(|| {
            ours = true;
            driver::run(LockService::connect(config.clone()))
        })
        .await?;
    if !ours && !same_settings(service.config(), &config) {
        return Err(LockError::config(format!(
            "the global lock service is already set up from {} with a different configuration; \
             it is never replaced (init it once, at start-up)",
            service.config().origin()
        )));
    }
    Ok(service)
}

/// [`init`] with a configuration file.
///
/// # Errors
/// As [`LockConfig::from_file`] and [`init`].
///
/// ```no_run
/// # async fn start() -> Result<(), lock_runtime::LockError> {
/// lock_runtime::init_from_file("config/lock.toml").await?;
/// # Ok(()) }
/// ```
pub async fn init_from_file(path: impl AsRef<Path>) -> Result<&'static LockService, LockError> {
    init(LockConfig::from_file(path)?).await
}

/// The process-wide lock service; on first use without [`init`], connects with the file named
/// by `$LOCK_CONFIG`, else `lock.toml` in the working directory, else `lock.toml` beside the
/// executable, else (no file, `$LOCK_REDIS_MODE` set) [`LockConfig::from_env`].
///
/// # Errors
/// [`ErrorKind::NotInitialized`] when neither `init` was called nor a config file exists; the
/// errors of [`LockConfig::from_file`] and [`LockService::connect`] otherwise. A failed first
/// use does not stick: the next call tries again.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// let locks = lock_runtime::global().await?; // the service annotated fns use
/// let guard = locks.lock("goods:7").await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub async fn global() -> Result<&'static LockService, LockError> {
    if let Some(service) = GLOBAL.get() {
        return Ok(service);
    }
    GLOBAL
        .get_or_try_init(|| async {
            let config = match config_path() {
                Ok(path) => LockConfig::from_file(path)?,
                // no file: the environment alone, when it names a mode
                Err(_) if std::env::var_os("LOCK_REDIS_MODE").is_some() => LockConfig::from_env()?,
                Err(missing) => return Err(missing),
            };
            driver::run(LockService::connect(config)).await
        })
        .await
}

/// Sets up the process-wide service from `$LOCK_CONFIG`, else `./lock.toml`, else `lock.toml`
/// beside the executable - what the first
/// annotated call would do - and reports a missing or broken configuration or an unreachable
/// Redis now. Call it at start-up, so that such a mistake stops the service from starting
/// instead of failing every locked request later.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// lock_runtime::init_from_env().await?; // at start-up, before serving requests
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`global`].
pub async fn init_from_env() -> Result<&'static LockService, LockError> {
    global().await
}

/// Shuts the process-wide lock service down (see [`LockService::shutdown`]): its locks are
/// released on Redis, and annotated calls are refused with [`ErrorKind::ShuttingDown`] from
/// then on. Does nothing when the service was never set up; a second call returns at once.
///
/// ```no_run
/// # async fn demo() {
/// // at the end of main, after the server stopped:
/// if let Err(e) = lock_runtime::shutdown().await {
///     eprintln!("lock service shutdown: {e}");
/// }
/// # }
/// ```
///
/// # Errors
/// As [`LockService::shutdown`].
pub async fn shutdown() -> Result<(), LockError> {
    match GLOBAL.get() {
        // on the service's own thread, which drives its connections
        Some(service) => driver::run(service.shutdown()).await,
        None => Ok(()),
    }
}

/// The process-wide lock service if it is set up, without loading anything.
///
/// ```
/// if let Some(locks) = lock_runtime::try_global() {
///     println!("locks under prefix {}", locks.config().prefix());
/// }
/// ```
pub fn try_global() -> Option<&'static LockService> {
    GLOBAL.get()
}

/// Where the configuration is read from when none was given: `$LOCK_CONFIG`; else `lock.toml` in
/// the working directory; else `lock.toml` in the directory of the running executable (a
/// service deployed as a binary with its config file beside it, started from anywhere).
fn config_path() -> Result<PathBuf, LockError> {
    if let Some(path) = std::env::var_os(CONFIG_ENV) {
        return Ok(PathBuf::from(path));
    }
    let in_working_dir = PathBuf::from(DEFAULT_CONFIG_FILE);
    if in_working_dir.exists() {
        return Ok(in_working_dir);
    }
    let mut looked = vec![
        std::env::current_dir()
            .map(|d| d.join(DEFAULT_CONFIG_FILE).display().to_string())
            .unwrap_or_else(|_| format!("./{DEFAULT_CONFIG_FILE}")),
    ];
    let beside_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(DEFAULT_CONFIG_FILE)));
    if let Some(path) = beside_exe {
        if path.exists() {
            return Ok(path);
        }
        looked.push(path.display().to_string());
    }
    Err(LockError::new(
        ErrorKind::NotInitialized,
        format!(
            "no lock service: call lock_runtime::init(..) at start-up, or set ${CONFIG_ENV} to a \
             config file, or create {DEFAULT_CONFIG_FILE} in the working directory or beside \
             the executable (looked for {})",
            looked.join(" and ")
        ),
    ))
}

/// Equal apart from where the configuration was read from.
fn same_settings(a: &LockConfig, b: &LockConfig) -> bool {
    a.clone().without_source() == b.clone().without_source()
}
