//! Configuration: which Redis topology to use and how locks behave, from a TOML file or code.
//!
//! ```toml
//! [redis]
//! mode = "single"                   # "single" | "cluster" | "sentinel" | "master-slave"
//! url = "redis://127.0.0.1:6379"    # single
//! # nodes = ["redis://127.0.0.1:7000", ...]          cluster
//! # master_name = "mymaster"                          sentinel
//! # sentinels = ["redis://127.0.0.1:26379", ...]      sentinel
//! # master = "redis://127.0.0.1:6380"                 master-slave
//! # replicas = ["redis://127.0.0.1:6381"]             master-slave
//! # username = "app"      # optional in every mode; else $LOCK_REDIS_USERNAME
//! # password = "secret"   # optional in every mode; else $LOCK_REDIS_PASSWORD
//! connect_timeout = "3s"    # how long connecting may take before it fails
//! response_timeout = "3s"   # how long one Redis operation may take before it fails
//! # sync_replicas = 1       # cluster/sentinel/master-slave: replicas that must acknowledge
//! # sync_timeout = "1s"     #   each grant within this time, else it is given back
//!
//! # [redis.tls]             # feature "tls"; the URLs say rediss:// (every one of them)
//! # ca_file = "ca.pem"      # the CA that signed the servers' certificates (else system roots)
//! # cert_file = "client.pem"  # a client certificate and its key, for servers that ask for one
//! # key_file = "client.key"   #   (tls-auth-clients yes); both or neither
//!
//! [lock]
//! prefix = "lock:"          # prepended to every key
//! # instance_name = "shop-7f9c"  # names this service to operators (default: hostname:pid)
//! watchdog_timeout = "30s"  # lease of locks taken without one; renewed every third of it
//! default_wait = "3s"       # how long annotated fns wait; "forever" to wait without limit
//! # fence_idle_ttl = "5m"   # accepted (range-checked) and no longer used: fencing counters
//!                           #   are one per cluster slot and never expire
//! ```
//!
//! Every key is optional except `mode` and the address fields of the chosen mode. Unknown keys,
//! fields of another mode and malformed values are [`ErrorKind::Config`] errors that name the
//! file, the field and what was expected.
//!
//! # Durations
//!
//! Every duration is checked when the configuration is loaded, and the same checks run for a
//! configuration built in code (when [`LockService::connect`](crate::LockService::connect)
//! starts): a value outside its range is a `Config` error naming the field, the value and the
//! range.
//!
//! | field | range | why |
//! |---|---|---|
//! | `redis.connect_timeout`, `redis.response_timeout`, `redis.sync_timeout` | 1ms to 1h | zero fails every call; no answer is worth waiting an hour for |
//! | `lock.watchdog_timeout` | 30ms to 3650d | a lease: at most the longest lease a lock takes (about ten years); renewed every third, and a renewal needs its 10 ms |
//! | `lock.default_wait` | 0ms to 365d, or `"forever"` | zero tries once; a longer wait is a mistake or meant as `"forever"` |
//! | `lock.fence_idle_ttl` | 1m to 3650d, or `"never"` | see [`LockConfig::with_fence_idle_ttl`] |
//!
//! With `sync_replicas` set, `sync_timeout` must also be shorter than `response_timeout`.
//!
//! # Environment
//!
//! These variables replace the value of a file (or of [nested settings](#in-an-applications-settings)),
//! so that one file serves every environment (12-factor deployments); a list is comma-separated:
//!
//! | variable | replaces |
//! |---|---|
//! | `LOCK_REDIS_MODE` | `redis.mode` |
//! | `LOCK_REDIS_URL` | `redis.url` (single) |
//! | `LOCK_REDIS_NODES` | `redis.nodes` (cluster) |
//! | `LOCK_REDIS_MASTER_NAME`, `LOCK_REDIS_SENTINELS` | `redis.master_name`, `redis.sentinels` (sentinel) |
//! | `LOCK_REDIS_MASTER`, `LOCK_REDIS_REPLICAS` | `redis.master`, `redis.replicas` (master-slave) |
//! | `LOCK_PREFIX` | `lock.prefix` |
//! | `LOCK_INSTANCE_NAME` | `lock.instance_name` |
//!
//! A variable of another mode than the one in effect is a `Config` error naming it, as a field
//! of another mode is. The credentials work the other way round: `LOCK_REDIS_USERNAME` and
//! `LOCK_REDIS_PASSWORD` fill in a `username` / `password` the configuration does not give
//! (so that the secret need not be written in the file), and one written there wins.
//! [`LockConfig::from_env`] builds a configuration from the variables alone; the global service
//! falls back to it when no config file is found and `LOCK_REDIS_MODE` is set.
//!
//! # In an application's settings
//!
//! `LockConfig` implements `serde::Deserialize` for the same tables, so it can be one value of
//! an application's own settings (a `[locks]` table of its TOML, a figment or config-rs
//! profile), with the same checks, variables and messages:
//!
//! ```
//! #[derive(serde::Deserialize)]
//! struct Settings {
//!     listen: String,
//!     locks: lock_runtime::LockConfig,
//! }
//!
//! let settings: Settings = toml::from_str(r#"
//!     listen = "0.0.0.0:8080"
//!     [locks.redis]
//!     mode = "single"
//!     url = "redis://127.0.0.1:6379"
//!     [locks.lock]
//!     prefix = "shop:"
//! "#).unwrap();
//! assert_eq!(settings.locks.prefix(), "shop:");
//! ```
//!
//! Relative TLS paths in nested settings are relative to the working directory (there is no
//! file to be relative to).
//!
//! # Secrets
//!
//! A configured `username` / `password` (also from `$LOCK_REDIS_USERNAME` /
//! `$LOCK_REDIS_PASSWORD`) replaces one written in a URL (`redis://app:pw@host`). No message
//! and no `Debug` shows a password: [`LockConfig`]'s and [`Topology`]'s `Debug` and every error
//! show a URL without the password of its user part (`redis://app:***@host`) and without the
//! values of its query parameters other than `db` and `protocol` (`?password=***`). A mistake in
//! a file is reported with its line, column and what was wrong, never with the file's text
//! (neither in the message nor in the error's `Debug` or sources). An [`ErrorKind::Auth`] error
//! names the user the connection logged in as: the configured one, else the one in the URL,
//! else the default user.
//!
//! # TLS
//!
//! Connections use TLS where the URLs say `rediss://`: then every URL of the configuration must
//! (a mix of `redis://` and `rediss://` is a `Config` error), and in sentinel mode the master the
//! sentinels name is reached over TLS as well. `[redis.tls]` ([`TlsConfig`]) names the files:
//! a CA to trust instead of the system's roots, and a client certificate with its key for
//! servers that check clients (mutual TLS). Relative paths in a file are relative to the file's
//! directory. The files are read when the service connects (and again when sentinel mode
//! switches masters); a file that cannot be read or holds no PEM certificate / key is a
//! `Config` error naming the field and the path, never the contents. Certificates are always
//! verified, host names included: there is no switch to turn that off (a URL ending in
//! `#insecure` is refused); for self-signed servers, give their CA as `ca_file`. A server whose
//! certificate is not trusted or has expired, one that refuses the client certificate, and one
//! that does not speak TLS are [`ErrorKind::Tls`] errors naming the server. TLS needs the
//! crate's `tls` feature (rustls; no OpenSSL): without it a `rediss://` URL or `[redis.tls]` is a
//! `Config` error that says so.

use std::path::{Path, PathBuf};
use std::time::Duration;

#[cfg(doc)]
use crate::error::ErrorKind;
use crate::error::LockError;

mod file;
#[cfg(test)]
mod tests;
mod validate;

use file::parse;

/// Which Redis deployment the locks live on. `Debug` shows the URLs without their secrets.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One Redis server.
    Single {
        /// `redis://host:port[/db]`
        url: String,
    },
    /// Redis Cluster: any subset of the nodes; the rest is discovered.
    Cluster {
        /// Seed node URLs.
        nodes: Vec<String>,
    },
    /// A master found through Redis Sentinel.
    Sentinel {
        /// The name the sentinels monitor the master under.
        master_name: String,
        /// Sentinel URLs.
        sentinels: Vec<String>,
    },
    /// A static master with replicas; no automatic failover.
    MasterSlave {
        /// The master's URL: all lock operations go there.
        master: String,
        /// Replica URLs (used for replica acknowledgements only).
        replicas: Vec<String>,
    },
}

impl Topology {
    /// The name of the mode as written in the config file.
    pub fn mode(&self) -> &'static str {
        match self {
            Topology::Single { .. } => "single",
            Topology::Cluster { .. } => "cluster",
            Topology::Sentinel { .. } => "sentinel",
            Topology::MasterSlave { .. } => "master-slave",
        }
    }
}

/// The files TLS connections use (`[redis.tls]` in a file): a CA to trust and a client
/// certificate (mutual TLS). TLS itself is on where the URLs say `rediss://` (see the
/// [module docs](self#tls)); it needs the crate's `tls` feature.
///
/// Only paths are kept here: the files are read when the service connects, and neither the
/// key nor any certificate is ever printed (`Debug` shows the paths).
///
/// ```
/// use lock_runtime::LockConfig;
/// use lock_runtime::config::TlsConfig;
///
/// let config = LockConfig::single("rediss://redis.internal:6380").with_tls(
///     TlsConfig::new()
///         .with_ca_file("/etc/lock/ca.pem")
///         .with_client_cert("/etc/lock/client.pem", "/etc/lock/client.key"),
/// );
/// assert_eq!(config.tls().and_then(|t| t.key_file()).unwrap().to_str(), Some("/etc/lock/client.key"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    ca_file: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
}

impl TlsConfig {
    /// No files: the system's root certificates, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificates (PEM) in `path` instead of the system's roots.
    ///
    /// ```
    /// let tls = lock_runtime::TlsConfig::new().with_ca_file("/etc/lock/ca.pem");
    /// assert!(tls.ca_file().is_some());
    /// ```
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents the certificate chain in `cert_file` (PEM) with the private key in `key_file`
    /// (PEM: PKCS#8, PKCS#1 or SEC1) to servers that check clients (`tls-auth-clients`).
    ///
    /// ```
    /// let tls = lock_runtime::TlsConfig::new()
    ///     .with_ca_file("/etc/lock/ca.pem")
    ///     .with_client_cert("/etc/lock/client.pem", "/etc/lock/client.key"); // mutual TLS
    /// assert!(tls.key_file().is_some());
    /// ```
    pub fn with_client_cert(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.client = Some((cert_file.into(), key_file.into()));
        self
    }

    /// The CA file, if any.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }
    /// The client certificate file, if any.
    pub fn cert_file(&self) -> Option<&Path> {
        self.client.as_ref().map(|(cert, _)| cert.as_path())
    }
    /// The client key file, if any.
    pub fn key_file(&self) -> Option<&Path> {
        self.client.as_ref().map(|(_, key)| key.as_path())
    }
}

/// How long annotated fns (and other callers that ask for the default) wait for a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultWait {
    /// Wait at most this long.
    For(Duration),
    /// Wait until acquired.
    Forever,
}

/// The whole configuration of a [`LockService`](crate::LockService).
///
/// Build it from TOML ([`from_toml_str`](Self::from_toml_str), [`from_file`](Self::from_file))
/// or in code:
///
/// ```
/// use lock_runtime::LockConfig;
/// use std::time::Duration;
///
/// let config = LockConfig::single("redis://127.0.0.1:6379")
///     .with_prefix("shop:lock:")
///     .with_watchdog_timeout(Duration::from_secs(10));
/// assert_eq!(config.prefix(), "shop:lock:");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockConfig {
    topology: Topology,
    username: Option<String>,
    password: Option<String>,
    tls: Option<TlsConfig>,
    connect_timeout: Duration,
    response_timeout: Duration,
    sync_replicas: u32,
    sync_timeout: Duration,
    prefix: String,
    instance_name: Option<String>,
    watchdog_timeout: Duration,
    default_wait: DefaultWait,
    fence_idle_ttl: Option<Duration>,
    source: Option<PathBuf>,
}

/// Secrets stay out: passwords and query parameters written into a URL show as `***`.
impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls = |urls: &[String]| -> Vec<String> { urls.iter().map(|u| redacted(u)).collect() };
        match self {
            Topology::Single { url } => f
                .debug_struct("Single")
                .field("url", &redacted(url))
                .finish(),
            Topology::Cluster { nodes } => f
                .debug_struct("Cluster")
                .field("nodes", &urls(nodes))
                .finish(),
            Topology::Sentinel {
                master_name,
                sentinels,
            } => f
                .debug_struct("Sentinel")
                .field("master_name", master_name)
                .field("sentinels", &urls(sentinels))
                .finish(),
            Topology::MasterSlave { master, replicas } => f
                .debug_struct("MasterSlave")
                .field("master", &redacted(master))
                .field("replicas", &urls(replicas))
                .finish(),
        }
    }
}

/// Secrets stay out: the password shows as `***`, and so do secrets written into a URL.
impl std::fmt::Debug for LockConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockConfig")
            .field("topology", &self.topology)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("sync_replicas", &self.sync_replicas)
            .field("sync_timeout", &self.sync_timeout)
            .field("prefix", &self.prefix)
            .field("instance_name", &self.instance_name)
            .field("watchdog_timeout", &self.watchdog_timeout)
            .field("default_wait", &self.default_wait)
            .field("fence_idle_ttl", &self.fence_idle_ttl)
            .field("source", &self.source)
            .finish()
    }
}

/// The URL for messages, without its secrets: the password of the user part (`redis://app:***@h`;
/// a lone user part, which may be a password, goes whole: `redis://***@h`) and the values of the
/// query parameters other than `db` and `protocol` (`?password=***`).
pub(crate) fn redacted(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end);
    // the authority ends at the path, the query or the fragment
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut out = scheme.to_owned();
    let host = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            match userinfo.split_once(':') {
                Some((user, _)) => out.push_str(&format!("{user}:***@")),
                None => out.push_str("***@"),
            }
            host
        }
        None => authority,
    };
    out.push_str(host);
    let (before_fragment, fragment) = match tail.find('#') {
        Some(i) => tail.split_at(i),
        None => (tail, ""),
    };
    match before_fragment.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((name, _)) if !["db", "protocol"].contains(&name) => {
                        format!("{name}=***")
                    }
                    _ => param.to_owned(),
                })
                .collect();
            out.push_str(&format!("{path}?{}", params.join("&")));
        }
        None => out.push_str(before_fragment),
    }
    out.push_str(fragment);
    out
}

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_WAIT: Duration = Duration::from_secs(3);
const DEFAULT_PREFIX: &str = "lock:";
const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_FENCE_IDLE_TTL: Duration = Duration::from_secs(5 * 60);

impl LockConfig {
    /// A configuration for the given topology with every other setting at its default.
    ///
    /// ```
    /// use lock_runtime::{LockConfig, Topology};
    ///
    /// let config = LockConfig::new(Topology::Cluster {
    ///     nodes: vec!["redis://10.0.0.1:7000".into(), "redis://10.0.0.2:7000".into()],
    /// });
    /// assert_eq!(config.prefix(), "lock:");
    /// ```
    pub fn new(topology: Topology) -> Self {
        LockConfig {
            topology,
            username: None,
            password: None,
            tls: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            sync_replicas: 0,
            sync_timeout: DEFAULT_SYNC_TIMEOUT,
            prefix: DEFAULT_PREFIX.to_owned(),
            instance_name: None,
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            default_wait: DefaultWait::For(DEFAULT_WAIT),
            fence_idle_ttl: Some(DEFAULT_FENCE_IDLE_TTL),
            source: None,
        }
    }

    /// A single-node configuration with defaults.
    ///
    /// ```
    /// let config = lock_runtime::LockConfig::single("redis://127.0.0.1:6379");
    /// assert_eq!(config.prefix(), "lock:");
    /// ```
    pub fn single(url: impl Into<String>) -> Self {
        Self::new(Topology::Single { url: url.into() })
    }

    /// Parses a TOML configuration (see the [module docs](self) for the format).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field and what was expected.
    ///
    /// ```
    /// let config = lock_runtime::LockConfig::from_toml_str(
    ///     "[redis]\nmode = \"single\"\nurl = \"redis://127.0.0.1:6379\"\n",
    /// )?;
    /// # let _ = config;
    /// # Ok::<(), lock_runtime::LockError>(())
    /// ```
    pub fn from_toml_str(text: &str) -> Result<Self, LockError> {
        parse(text, "<config string>", None)
    }

    /// The configuration the [environment variables](self#environment) give alone, without a
    /// file: `$LOCK_REDIS_MODE` and the address variables of that mode are required, every
    /// other setting has its default.
    ///
    /// ```no_run
    /// // LOCK_REDIS_MODE=single LOCK_REDIS_URL=redis://redis.internal:6379 LOCK_PREFIX=shop:
    /// let config = lock_runtime::LockConfig::from_env()?;
    /// # Ok::<(), lock_runtime::LockError>(())
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the missing or invalid variable.
    pub fn from_env() -> Result<Self, LockError> {
        file::from_env()
    }

    /// Reads and parses a TOML configuration file.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the file, the field and what was expected, also when the file
    /// cannot be read.
    ///
    /// ```no_run
    /// let config = lock_runtime::LockConfig::from_file("/etc/shop/lock.toml")?;
    /// # let _ = config;
    /// # Ok::<(), lock_runtime::LockError>(())
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, LockError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            LockError::config(format!("cannot read lock config {}: {e}", path.display()))
                .with_source(e)
        })?;
        parse(&text, &path.display().to_string(), Some(path.to_path_buf()))
    }

    /// Sets the key prefix (default `"lock:"`). It must not contain `{` or `}`.
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    /// use std::time::Duration;
    ///
    /// let config = LockConfig::single("redis://127.0.0.1:6379").with_prefix("shop:");
    /// assert_eq!(config.prefix(), "shop:");
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Names this service to operators: `inspect`, `lockctl` and its console show it beside
    /// every hold and waiter of the service (default: `hostname:pid`). Stored with every grant,
    /// so keep it short; 1 to 64 characters, no whitespace, control characters or `~`, and not
    /// starting with `mesh:` or `done:`. It names, it does not identify: two services may share
    /// one (each grant still carries the service's random id).
    ///
    /// ```
    /// let config = lock_runtime::LockConfig::single("redis://127.0.0.1:6379")
    ///     .with_instance_name("shop-7f9c");
    /// assert_eq!(config.instance_name(), "shop-7f9c");
    /// ```
    pub fn with_instance_name(mut self, name: impl Into<String>) -> Self {
        self.instance_name = Some(name.into());
        self
    }

    /// Sets the lease of locks taken without one (default 30 s, from 30 ms to 3650 days); they
    /// are renewed every third.
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    /// use std::time::Duration;
    ///
    /// let config = LockConfig::single("redis://127.0.0.1:6379").with_watchdog_timeout(Duration::from_secs(10));
    /// assert_eq!(config.watchdog_timeout(), Duration::from_secs(10));
    /// ```
    pub fn with_watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// Sets how long annotated fns wait by default (default 3 s, at most 365 days, or
    /// [`DefaultWait::Forever`]).
    ///
    /// ```
    /// use lock_runtime::{DefaultWait, LockConfig};
    /// use std::time::Duration;
    ///
    /// let config = LockConfig::single("redis://127.0.0.1:6379")
    ///     .with_default_wait(DefaultWait::For(Duration::from_millis(500)));
    /// assert_eq!(config.default_wait(), DefaultWait::For(Duration::from_millis(500)));
    /// ```
    pub fn with_default_wait(mut self, wait: DefaultWait) -> Self {
        self.default_wait = wait;
        self
    }

    /// Accepted (from 1 minute to 3650 days, or `None`) and no longer used: it set how long a
    /// per-lock fencing counter lived without a grant. Fencing counters are now one per
    /// cluster slot and never expire (tokens keep increasing when the server's clock steps
    /// back, and nothing is left per lock name: see the crate docs' "Data on Redis"); the
    /// setting stays so that existing configurations keep loading.
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    /// use std::time::Duration;
    ///
    /// let config = LockConfig::single("redis://127.0.0.1:6379")
    ///     .with_fence_idle_ttl(Some(Duration::from_secs(24 * 3600)));
    /// assert_eq!(config.fence_idle_ttl(), Some(Duration::from_secs(86_400)));
    /// ```
    pub fn with_fence_idle_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.fence_idle_ttl = ttl;
        self
    }

    /// Sets how long connecting may take (default 3 s, from 1 ms to 1 h).
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    /// use std::time::Duration;
    ///
    /// let config = LockConfig::single("redis://127.0.0.1:6379").with_connect_timeout(Duration::from_secs(1));
    /// assert_eq!(config.connect_timeout(), Duration::from_secs(1));
    /// ```
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long one Redis operation may take (default 3 s, from 1 ms to 1 h).
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    /// use std::time::Duration;
    ///
    /// let config = LockConfig::single("redis://127.0.0.1:6379").with_response_timeout(Duration::from_millis(800));
    /// assert_eq!(config.response_timeout(), Duration::from_millis(800));
    /// ```
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Requires `replicas` replicas to acknowledge every grant within `timeout` (Redis `WAIT`;
    /// from 1 ms to 1 h, and shorter than the response timeout);
    /// a grant they do not acknowledge in time is given back and the caller gets
    /// [`ErrorKind::ReplicaSync`]. 0 (the default) turns it off. Not available in single mode.
    ///
    /// This narrows, but does not close, the window in which a failover loses a grant: see the
    /// crate docs on replication.
    ///
    /// ```
    /// use lock_runtime::LockConfig;
    /// use std::time::Duration;
    ///
    /// // every grant acknowledged by one replica within 500 ms
    /// let config = LockConfig::from_toml_str("[redis]\nmode = \"master-slave\"\nmaster = \"redis://m:6379\"\n")?
    ///     .with_sync_replicas(1, Duration::from_millis(500));
    /// assert_eq!(config.sync_replicas(), 1);
    /// # Ok::<(), lock_runtime::LockError>(())
    /// ```
    pub fn with_sync_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.sync_replicas = replicas;
        self.sync_timeout = timeout;
        self
    }

    /// Sets the ACL user name and password used for every connection.
    ///
    /// ```
    /// let config = lock_runtime::LockConfig::single("redis://127.0.0.1:6379")
    ///     .with_credentials(Some("lock-service".into()), std::env::var("REDIS_PASSWORD").ok());
    /// assert_eq!(config.username(), Some("lock-service"));
    /// ```
    pub fn with_credentials(mut self, username: Option<String>, password: Option<String>) -> Self {
        self.username = username;
        self.password = password;
        self
    }

    /// Sets the files TLS connections use: a CA and a client certificate (see [`TlsConfig`]).
    /// TLS is used where the URLs say `rediss://`; with plaintext URLs this is a `Config` error
    /// at connect. Needs the crate's `tls` feature.
    ///
    /// ```
    /// use lock_runtime::{LockConfig, TlsConfig};
    ///
    /// let config = LockConfig::single("rediss://redis.internal:6380")
    ///     .with_tls(TlsConfig::new().with_ca_file("/etc/lock/ca.pem"));
    /// assert!(config.uses_tls());
    /// ```
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The Redis topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }
    /// The ACL user name, if any.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }
    /// The password, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
    /// The TLS files, if set.
    pub fn tls(&self) -> Option<&TlsConfig> {
        self.tls.as_ref()
    }
    /// Whether the connections use TLS: the URLs say `rediss://`.
    pub fn uses_tls(&self) -> bool {
        self.urls().iter().any(|(_, url)| is_tls_url(url))
    }
    /// How long connecting may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    /// How long one Redis operation may take.
    pub fn response_timeout(&self) -> Duration {
        self.response_timeout
    }
    /// How many replicas must acknowledge each grant (0: none).
    pub fn sync_replicas(&self) -> u32 {
        self.sync_replicas
    }
    /// How long to wait for replica acknowledgements.
    pub fn sync_timeout(&self) -> Duration {
        self.sync_timeout
    }
    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The name this service shows to operators: the one set, else
    /// [`default_instance_name`](Self::default_instance_name).
    pub fn instance_name(&self) -> String {
        match &self.instance_name {
            Some(name) => name.clone(),
            None => Self::default_instance_name(),
        }
    }

    /// `hostname:pid` (the host's name as the kernel, `$HOSTNAME` or `$COMPUTERNAME` gives it),
    /// the instance name of a service whose configuration sets none.
    ///
    /// ```
    /// let name = lock_runtime::LockConfig::default_instance_name();
    /// assert!(name.ends_with(&format!(":{}", std::process::id())));
    /// ```
    pub fn default_instance_name() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .unwrap_or_default();
        let host: String = host
            .trim()
            .chars()
            .filter(|c| !c.is_whitespace() && !c.is_control() && *c != '~')
            .take(48)
            .collect();
        let host = if host.is_empty() {
            "host".to_owned()
        } else {
            host
        };
        format!("{host}:{}", std::process::id())
    }

    /// The lease of locks taken without one.
    pub fn watchdog_timeout(&self) -> Duration {
        self.watchdog_timeout
    }
    /// The default wait of annotated fns.
    pub fn default_wait(&self) -> DefaultWait {
        self.default_wait
    }
    /// The `fence_idle_ttl` setting (no longer used; see [`with_fence_idle_ttl`](Self::with_fence_idle_ttl)).
    pub fn fence_idle_ttl(&self) -> Option<Duration> {
        self.fence_idle_ttl
    }
    /// The file this configuration was read from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    pub(crate) fn without_source(mut self) -> Self {
        self.source = None;
        self
    }

    pub(crate) fn origin(&self) -> String {
        match &self.source {
            Some(path) => path.display().to_string(),
            None => "lock config".to_owned(),
        }
    }
}

/// `rediss://...`: a TLS connection.
pub(crate) fn is_tls_url(url: &str) -> bool {
    url.trim_start()
        .get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
}
