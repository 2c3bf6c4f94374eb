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
//! watchdog_timeout = "30s"  # lease of locks taken without one; renewed every third of it
//! default_wait = "3s"       # how long annotated fns wait; "forever" to wait without limit
//! fence_idle_ttl = "5m"     # a lock's fencing counter expires after this long without a grant
//!                           #   (the clock takes over); "never" keeps it (one key per lock name)
//! ```
//!
//! Every key is optional except `mode` and the address fields of the chosen mode. Unknown keys,
//! fields of another mode and malformed values are [`ErrorKind::Config`] errors that name the
//! file, the field and what was expected.
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

use serde::Deserialize;

use crate::error::{ErrorKind, LockError};

/// Which Redis deployment the locks live on.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents the certificate chain in `cert_file` (PEM) with the private key in `key_file`
    /// (PEM: PKCS#8, PKCS#1 or SEC1) to servers that check clients (`tls-auth-clients`).
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
    watchdog_timeout: Duration,
    default_wait: DefaultWait,
    fence_idle_ttl: Option<Duration>,
    source: Option<PathBuf>,
}

/// Secrets stay out: the password shows as `***`, and so does one written into a URL.
impl std::fmt::Debug for LockConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls = |urls: &[String]| -> Vec<String> { urls.iter().map(|u| redacted(u)).collect() };
        let topology = match &self.topology {
            Topology::Single { url } => {
                format!("Single {{ url: {:?} }}", redacted(url))
            }
            Topology::Cluster { nodes } => format!("Cluster {{ nodes: {:?} }}", urls(nodes)),
            Topology::Sentinel {
                master_name,
                sentinels,
            } => format!(
                "Sentinel {{ master_name: {master_name:?}, sentinels: {:?} }}",
                urls(sentinels)
            ),
            Topology::MasterSlave { master, replicas } => format!(
                "MasterSlave {{ master: {:?}, replicas: {:?} }}",
                redacted(master),
                urls(replicas)
            ),
        };
        f.debug_struct("LockConfig")
            .field("topology", &format_args!("{topology}"))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("sync_replicas", &self.sync_replicas)
            .field("sync_timeout", &self.sync_timeout)
            .field("prefix", &self.prefix)
            .field("watchdog_timeout", &self.watchdog_timeout)
            .field("default_wait", &self.default_wait)
            .field("fence_idle_ttl", &self.fence_idle_ttl)
            .field("source", &self.source)
            .finish()
    }
}

/// The URL without a password, for messages.
pub(crate) fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_WAIT: Duration = Duration::from_secs(3);
const DEFAULT_PREFIX: &str = "lock:";
const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_FENCE_IDLE_TTL: Duration = Duration::from_secs(5 * 60);
/// The shortest `fence_idle_ttl`: the clock covers for an expired counter only when the counter
/// sat idle for longer than the server clock may ever step back.
const MIN_FENCE_IDLE_TTL: Duration = Duration::from_secs(60);

impl LockConfig {
    /// A configuration for the given topology with every other setting at its default.
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
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            default_wait: DefaultWait::For(DEFAULT_WAIT),
            fence_idle_ttl: Some(DEFAULT_FENCE_IDLE_TTL),
            source: None,
        }
    }

    /// A single-node configuration with defaults.
    pub fn single(url: impl Into<String>) -> Self {
        Self::new(Topology::Single { url: url.into() })
    }

    /// Parses a TOML configuration (see the [module docs](self) for the format).
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field and what was expected.
    pub fn from_toml_str(text: &str) -> Result<Self, LockError> {
        parse(text, "<config string>", None)
    }

    /// Reads and parses a TOML configuration file.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the file, the field and what was expected, also when the file
    /// cannot be read.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, LockError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            LockError::config(format!("cannot read lock config {}: {e}", path.display()))
                .with_source(e)
        })?;
        parse(&text, &path.display().to_string(), Some(path.to_path_buf()))
    }

    /// Sets the key prefix (default `"lock:"`). It must not contain `{` or `}`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the lease of locks taken without one (default 30 s); they are renewed every third.
    pub fn with_watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// Sets how long annotated fns wait by default (default 3 s).
    pub fn with_default_wait(mut self, wait: DefaultWait) -> Self {
        self.default_wait = wait;
        self
    }

    /// Sets how long a lock's fencing counter lives without a grant (default 5 minutes, at least
    /// 1 minute); `None` keeps counters forever.
    ///
    /// Tokens are `max(last token + 1, server clock in microseconds)`. The counter only matters
    /// for grants in the same microsecond and for a server clock that steps back; once it
    /// expired, the clock alone makes the next token larger than every token issued before, as
    /// long as the clock of the server granting it (the master, or a promoted replica) never
    /// reads earlier than it did at the last grant minus this TTL. The TTL bounds what a lock
    /// leaves on Redis after its last hold: nothing, this long after (`order:<id>` locks for a
    /// million orders a day leave no keys behind).
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

    /// Sets how long connecting may take (default 3 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long one Redis operation may take (default 3 s).
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Requires `replicas` replicas to acknowledge every grant within `timeout` (Redis `WAIT`);
    /// a grant they do not acknowledge in time is given back and the caller gets
    /// [`ErrorKind::ReplicaSync`]. 0 (the default) turns it off. Not available in single mode.
    ///
    /// This narrows, but does not close, the window in which a failover loses a grant: see the
    /// crate docs on replication.
    pub fn with_sync_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.sync_replicas = replicas;
        self.sync_timeout = timeout;
        self
    }

    /// Sets the ACL user name and password used for every connection.
    pub fn with_credentials(mut self, username: Option<String>, password: Option<String>) -> Self {
        self.username = username;
        self.password = password;
        self
    }

    /// Sets the files TLS connections use: a CA and a client certificate (see [`TlsConfig`]).
    /// TLS is used where the URLs say `rediss://`; with plaintext URLs this is a `Config` error
    /// at connect. Needs the crate's `tls` feature.
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
    /// The lease of locks taken without one.
    pub fn watchdog_timeout(&self) -> Duration {
        self.watchdog_timeout
    }
    /// The default wait of annotated fns.
    pub fn default_wait(&self) -> DefaultWait {
        self.default_wait
    }
    /// How long a fencing counter lives without a grant (`None`: forever).
    pub fn fence_idle_ttl(&self) -> Option<Duration> {
        self.fence_idle_ttl
    }
    /// The file this configuration was read from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// Checks the values that code (not only files) can get wrong.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        let origin = self.origin();
        if self.prefix.contains(['{', '}']) {
            return Err(LockError::config(format!(
                "{origin}: `lock.prefix` = {:?} must not contain `{{` or `}}` (they are reserved \
                 for the hash tag around the key)",
                self.prefix
            )));
        }
        if self.watchdog_timeout < Duration::from_millis(30) {
            return Err(LockError::config(format!(
                "{origin}: `lock.watchdog_timeout` must be at least 30ms, got {:?}",
                self.watchdog_timeout
            )));
        }
        if let Some(ttl) = self.fence_idle_ttl
            && ttl < MIN_FENCE_IDLE_TTL
        {
            return Err(LockError::config(format!(
                "{origin}: `lock.fence_idle_ttl` must be at least 1m (or \"never\"), got {ttl:?}: \
                 an expired counter is safe only when it sat idle longer than the server clock \
                 may step back"
            )));
        }
        if self.sync_replicas > 0 {
            if let Topology::Single { .. } = self.topology {
                return Err(LockError::config(format!(
                    "{origin}: `redis.sync_replicas` = {} needs replicas, but mode = \"single\" \
                     has none; remove it or use mode \"master-slave\", \"sentinel\" or \"cluster\"",
                    self.sync_replicas
                )));
            }
            if self.sync_timeout >= self.response_timeout {
                return Err(LockError::config(format!(
                    "{origin}: `redis.sync_timeout` ({:?}) must be shorter than \
                     `redis.response_timeout` ({:?})",
                    self.sync_timeout, self.response_timeout
                )));
            }
        }
        self.validate_tls(&origin)?;
        for (field, value) in [
            ("redis.connect_timeout", self.connect_timeout),
            ("redis.response_timeout", self.response_timeout),
            ("redis.sync_timeout", self.sync_timeout),
        ] {
            if value.is_zero() {
                return Err(LockError::config(format!(
                    "{origin}: `{field}` must be greater than zero"
                )));
            }
        }
        Ok(())
    }

    /// Every URL with the field it comes from.
    fn urls(&self) -> Vec<(&'static str, &str)> {
        match &self.topology {
            Topology::Single { url } => vec![("redis.url", url.as_str())],
            Topology::Cluster { nodes } => {
                nodes.iter().map(|u| ("redis.nodes", u.as_str())).collect()
            }
            Topology::Sentinel { sentinels, .. } => sentinels
                .iter()
                .map(|u| ("redis.sentinels", u.as_str()))
                .collect(),
            Topology::MasterSlave { master, replicas } => {
                std::iter::once(("redis.master", master.as_str()))
                    .chain(replicas.iter().map(|u| ("redis.replicas", u.as_str())))
                    .collect()
            }
        }
    }

    /// TLS is all or nothing, needs the feature, and never skips certificate checks.
    fn validate_tls(&self, origin: &str) -> Result<(), LockError> {
        let urls = self.urls();
        if let Some((field, url)) = urls.iter().find(|(_, url)| url.contains("#insecure")) {
            return Err(LockError::config(format!(
                "{origin}: `{field}` = {:?} asks to skip certificate checks (`#insecure`), which \
                 this crate does not do; give the CA that signed the server's certificate as \
                 `redis.tls.ca_file` instead",
                redacted(url)
            )));
        }
        let Some(&(first_field, first_url)) = urls.first() else {
            return Ok(());
        };
        let tls_urls = urls.iter().filter(|(_, url)| is_tls_url(url)).count();
        if tls_urls > 0 && tls_urls < urls.len() {
            let (field, url) = urls
                .iter()
                .copied()
                .find(|(_, url)| !is_tls_url(url))
                .unwrap_or((first_field, first_url));
            return Err(LockError::config(format!(
                "{origin}: `{field}` = {:?} is plaintext (redis://) while other URLs use TLS \
                 (rediss://): use one scheme for every URL",
                redacted(url)
            )));
        }
        if tls_urls == 0 {
            if self.tls.is_some() {
                return Err(LockError::config(format!(
                    "{origin}: `redis.tls` is set but `{first_field}` = {:?} is plaintext: \
                     write rediss:// to connect with TLS (or remove `redis.tls`)",
                    redacted(first_url)
                )));
            }
            return Ok(());
        }
        if !cfg!(feature = "tls") {
            return Err(LockError::config(format!(
                "{origin}: `{first_field}` uses TLS (rediss://), which needs the `tls` feature of \
                 lock-runtime: `lock-runtime = {{ version = \"..\", features = [\"tls\"] }}`"
            )));
        }
        Ok(())
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    redis: Option<RawRedis>,
    #[serde(default)]
    lock: RawLock,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    mode: Option<String>,
    url: Option<String>,
    nodes: Option<Vec<String>>,
    master_name: Option<String>,
    sentinels: Option<Vec<String>>,
    master: Option<String>,
    replicas: Option<Vec<String>>,
    username: Option<String>,
    password: Option<String>,
    tls: Option<RawTls>,
    connect_timeout: Option<ConfigDuration>,
    response_timeout: Option<ConfigDuration>,
    sync_replicas: Option<u32>,
    sync_timeout: Option<ConfigDuration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLock {
    prefix: Option<String>,
    watchdog_timeout: Option<ConfigDuration>,
    default_wait: Option<ConfigWait>,
    fence_idle_ttl: Option<ConfigTtl>,
}

/// A duration written as `"500ms"`, `"5s"`, `"2m"`, `"1h"` or `"7d"`.
struct ConfigDuration(Duration);

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(ConfigDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// A duration or `"forever"`.
struct ConfigWait(DefaultWait);

impl<'de> Deserialize<'de> for ConfigWait {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "forever" {
            return Ok(ConfigWait(DefaultWait::Forever));
        }
        parse_duration(&text)
            .map(|d| ConfigWait(DefaultWait::For(d)))
            .map_err(|e| serde::de::Error::custom(format!("{e}, or \"forever\"")))
    }
}

/// A duration or `"never"`.
struct ConfigTtl(Option<Duration>);

impl<'de> Deserialize<'de> for ConfigTtl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "never" {
            return Ok(ConfigTtl(None));
        }
        parse_duration(&text)
            .map(|d| ConfigTtl(Some(d)))
            .map_err(|e| serde::de::Error::custom(format!("{e}, or \"never\"")))
    }
}

/// `rediss://...`: a TLS connection.
pub(crate) fn is_tls_url(url: &str) -> bool {
    url.trim_start()
        .get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
}

/// Parses a duration with the grammar the attribute uses too (`lock-duration`): `"500ms"`,
/// `"1.5s"`, `"2m"`, `"1h"`, `"7d"`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    lock_duration::parse_millis(text).map(Duration::from_millis)
}

fn parse(text: &str, origin: &str, source: Option<PathBuf>) -> Result<LockConfig, LockError> {
    let fail = |field: &str, what: String| {
        LockError::new(
            ErrorKind::Config,
            format!("{origin}: invalid lock config at `{field}`: {what}"),
        )
    };
    let de = toml::Deserializer::parse(text).map_err(|e| {
        LockError::config(format!("{origin}: not valid TOML: {}", e.message())).with_source(e)
    })?;
    let raw: RawFile = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let line = inner
            .span()
            .map(|s| format!(" (line {})", text[..s.start].lines().count().max(1)))
            .unwrap_or_default();
        let field = if path == "." { "<top level>" } else { &path };
        fail(field, format!("{}{line}", inner.message())).with_source(inner)
    })?;
    let r = raw.redis.ok_or_else(|| {
        fail(
            "redis",
            "missing table [redis] (it needs at least `mode` and the address fields of that mode)"
                .to_owned(),
        )
    })?;
    let mode = r.mode.as_deref().ok_or_else(|| {
        fail(
            "redis.mode",
            "missing; expected one of \"single\", \"cluster\", \"sentinel\", \"master-slave\""
                .to_owned(),
        )
    })?;
    let required = |field: &str, value: Option<String>| {
        value.filter(|v| !v.trim().is_empty()).ok_or_else(|| {
            fail(
                &format!("redis.{field}"),
                format!("missing; mode = \"{mode}\" requires it"),
            )
        })
    };
    let required_list = |field: &str, value: Option<Vec<String>>| match value {
        Some(list) if !list.is_empty() => Ok(list),
        _ => Err(fail(
            &format!("redis.{field}"),
            format!("missing or empty; mode = \"{mode}\" requires a list of redis:// URLs"),
        )),
    };
    let (topology, used): (Topology, &[&str]) = match mode {
        "single" => (
            Topology::Single {
                url: required("url", r.url.clone())?,
            },
            &["url"],
        ),
        "cluster" => (
            Topology::Cluster {
                nodes: required_list("nodes", r.nodes.clone())?,
            },
            &["nodes"],
        ),
        "sentinel" => (
            Topology::Sentinel {
                master_name: required("master_name", r.master_name.clone())?,
                sentinels: required_list("sentinels", r.sentinels.clone())?,
            },
            &["master_name", "sentinels"],
        ),
        "master-slave" => (
            Topology::MasterSlave {
                master: required("master", r.master.clone())?,
                replicas: r.replicas.clone().unwrap_or_default(),
            },
            &["master", "replicas"],
        ),
        other => {
            return Err(fail(
                "redis.mode",
                format!(
                    "unknown mode {other:?}; expected one of \"single\", \"cluster\", \
                     \"sentinel\", \"master-slave\""
                ),
            ));
        }
    };
    let present = [
        ("url", r.url.is_some()),
        ("nodes", r.nodes.is_some()),
        ("master_name", r.master_name.is_some()),
        ("sentinels", r.sentinels.is_some()),
        ("master", r.master.is_some()),
        ("replicas", r.replicas.is_some()),
    ];
    if let Some((field, _)) = present.iter().find(|(f, p)| *p && !used.contains(f)) {
        return Err(fail(
            &format!("redis.{field}"),
            format!(
                "does not apply to mode = \"{mode}\" (that mode uses: {})",
                used.join(", ")
            ),
        ));
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut config = LockConfig::new(topology);
    config.source = source;
    config.username = r.username.or_else(|| env("LOCK_REDIS_USERNAME"));
    config.password = r.password.or_else(|| env("LOCK_REDIS_PASSWORD"));
    if let Some(tls) = r.tls {
        // relative to the file's directory, like the file's other references would be read
        let base = config.source.as_deref().and_then(Path::parent);
        let resolve = |p: PathBuf| match base {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p,
        };
        let mut t = TlsConfig::new();
        if let Some(ca) = tls.ca_file {
            t = t.with_ca_file(resolve(ca));
        }
        t = match (tls.cert_file, tls.key_file) {
            (Some(cert), Some(key)) => t.with_client_cert(resolve(cert), resolve(key)),
            (None, None) => t,
            (Some(_), None) => {
                return Err(fail(
                    "redis.tls.key_file",
                    "missing; `cert_file` needs the key of that certificate".to_owned(),
                ));
            }
            (None, Some(_)) => {
                return Err(fail(
                    "redis.tls.cert_file",
                    "missing; `key_file` needs the certificate it belongs to".to_owned(),
                ));
            }
        };
        config.tls = Some(t);
    }
    if let Some(d) = r.connect_timeout {
        config.connect_timeout = d.0;
    }
    if let Some(d) = r.response_timeout {
        config.response_timeout = d.0;
    }
    if let Some(n) = r.sync_replicas {
        config.sync_replicas = n;
    }
    if let Some(d) = r.sync_timeout {
        config.sync_timeout = d.0;
    }
    if let Some(prefix) = raw.lock.prefix {
        config.prefix = prefix;
    }
    if let Some(d) = raw.lock.watchdog_timeout {
        config.watchdog_timeout = d.0;
    }
    if let Some(w) = raw.lock.default_wait {
        config.default_wait = w.0;
    }
    if let Some(t) = raw.lock.fence_idle_ttl {
        config.fence_idle_ttl = t.0;
    }
    config.validate().map_err(|e| {
        if config.source.is_none() {
            LockError::config(e.to_string().replacen("lock config", origin, 1))
        } else {
            e
        }
    })?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        let e = LockConfig::from_toml_str(text).unwrap_err();
        assert!(e.is_config(), "{e:?}");
        e.to_string()
    }

    #[test]
    fn parses_single_with_defaults() {
        let c = LockConfig::from_toml_str("[redis]\nmode = \"single\"\nurl = \"redis://h:1\"\n")
            .unwrap();
        assert_eq!(
            c.topology(),
            &Topology::Single {
                url: "redis://h:1".into()
            }
        );
        assert_eq!(c.prefix(), "lock:");
        assert_eq!(c.watchdog_timeout(), Duration::from_secs(30));
        assert_eq!(c.default_wait(), DefaultWait::For(Duration::from_secs(3)));
        assert_eq!(c.fence_idle_ttl(), Some(Duration::from_secs(300)));
    }

    #[test]
    fn fence_idle_ttl_is_a_duration_or_never() {
        let base = "[redis]\nmode = \"single\"\nurl = \"x\"\n[lock]\n";
        let c = LockConfig::from_toml_str(&format!("{base}fence_idle_ttl = \"never\"\n")).unwrap();
        assert_eq!(c.fence_idle_ttl(), None);
        let c = LockConfig::from_toml_str(&format!("{base}fence_idle_ttl = \"2h\"\n")).unwrap();
        assert_eq!(c.fence_idle_ttl(), Some(Duration::from_secs(7200)));
        let e = err(&format!("{base}fence_idle_ttl = \"10s\"\n"));
        assert!(
            e.contains("`lock.fence_idle_ttl`") && e.contains("1m"),
            "{e}"
        );
        let e = err(&format!("{base}fence_idle_ttl = \"soon\"\n"));
        assert!(
            e.contains("`lock.fence_idle_ttl`") && e.contains("never"),
            "{e}"
        );
    }

    #[test]
    fn parses_every_mode() {
        let c = LockConfig::from_toml_str(
            "[redis]\nmode = \"cluster\"\nnodes = [\"redis://a:1\", \"redis://b:2\"]\n\
             [lock]\nprefix = \"p:\"\nwatchdog_timeout = \"9s\"\ndefault_wait = \"forever\"\n",
        )
        .unwrap();
        assert_eq!(c.topology().mode(), "cluster");
        assert_eq!(c.default_wait(), DefaultWait::Forever);
        let c = LockConfig::from_toml_str(
            "[redis]\nmode = \"sentinel\"\nmaster_name = \"m\"\nsentinels = [\"redis://s:1\"]\n",
        )
        .unwrap();
        assert_eq!(c.topology().mode(), "sentinel");
        let c = LockConfig::from_toml_str(
            "[redis]\nmode = \"master-slave\"\nmaster = \"redis://m:1\"\nreplicas = [\"redis://r:1\"]\n\
             response_timeout = \"250ms\"\n",
        )
        .unwrap();
        assert_eq!(c.response_timeout(), Duration::from_millis(250));
    }

    #[test]
    fn errors_name_field_and_expectation() {
        let e = err("[redis]\nmode = \"single\"\n");
        assert!(e.contains("`redis.url`") && e.contains("requires"), "{e}");
        let e = err("[redis]\nmode = \"raft\"\nurl = \"x\"\n");
        assert!(e.contains("`redis.mode`") && e.contains("\"raft\""), "{e}");
        let e =
            err("[redis]\nmode = \"single\"\nurl = \"x\"\n[lock]\nwatchdog_timeout = \"30 sec\"\n");
        assert!(
            e.contains("`lock.watchdog_timeout`") && e.contains("\"5s\""),
            "{e}"
        );
        assert!(e.contains("line 5"), "{e}");
        let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\nurll = \"y\"\n");
        assert!(e.contains("urll") && e.contains("expected one of"), "{e}");
        let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\nnodes = [\"y\"]\n");
        assert!(
            e.contains("`redis.nodes`") && e.contains("does not apply"),
            "{e}"
        );
        let e = err("[redis]\nmode = \"cluster\"\nnodes = []\n");
        assert!(e.contains("`redis.nodes`"), "{e}");
        let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\n[lock]\nprefix = \"a{b\"\n");
        assert!(
            e.contains("`lock.prefix`") && e.contains("<config string>"),
            "{e}"
        );
        let e = err("redis = 3");
        assert!(e.contains("`redis`"), "{e}");
        let e = err("[lock]\nprefix = \"x\"\n");
        assert!(e.contains("[redis]"), "{e}");
        let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\nsync_replicas = 1\n");
        assert!(
            e.contains("`redis.sync_replicas`") && e.contains("single"),
            "{e}"
        );
        let e = err("[redis]\nmode = \"master-slave\"\nmaster = \"x\"\nsync_replicas = -1\n");
        assert!(e.contains("`redis.sync_replicas`"), "{e}");
    }

    #[test]
    fn file_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("lockcfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock.toml");
        std::fs::write(&path, "[redis]\nmode = \"single\"\n").unwrap();
        let e = LockConfig::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("lock.toml") && e.contains("`redis.url`"), "{e}");
        let e = LockConfig::from_file(dir.join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    const TLS_SINGLE: &str = "[redis]\nmode = \"single\"\nurl = \"rediss://h:1\"\n";

    #[test]
    fn tls_files_are_read_from_the_table() {
        let text = format!(
            "{TLS_SINGLE}[redis.tls]\nca_file = \"/etc/ca.pem\"\ncert_file = \"c.pem\"\n\
             key_file = \"c.key\"\n"
        );
        let parsed = LockConfig::from_toml_str(&text);
        if !cfg!(feature = "tls") {
            let e = parsed.unwrap_err().to_string();
            assert!(
                e.contains("`tls` feature") && e.contains("`redis.url`"),
                "{e}"
            );
            return;
        }
        let c = parsed.unwrap();
        assert!(c.uses_tls());
        let tls = c.tls().unwrap();
        assert_eq!(tls.ca_file(), Some(Path::new("/etc/ca.pem")));
        // no file: relative to the working directory
        assert_eq!(tls.cert_file(), Some(Path::new("c.pem")));
        assert_eq!(tls.key_file(), Some(Path::new("c.key")));
        // a rediss:// URL alone: the system's roots, no client certificate
        let c = LockConfig::from_toml_str(TLS_SINGLE).unwrap();
        assert!(c.uses_tls() && c.tls().is_none());
    }

    #[test]
    fn tls_paths_in_a_file_are_relative_to_it() {
        if !cfg!(feature = "tls") {
            return;
        }
        let dir = std::env::temp_dir().join(format!("lockcfg-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock.toml");
        std::fs::write(
            &path,
            format!("{TLS_SINGLE}[redis.tls]\nca_file = \"certs/ca.pem\"\n"),
        )
        .unwrap();
        let c = LockConfig::from_file(&path).unwrap();
        assert_eq!(
            c.tls().unwrap().ca_file(),
            Some(dir.join("certs/ca.pem").as_path())
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tls_mistakes_name_the_field() {
        let e = err(&format!("{TLS_SINGLE}[redis.tls]\ncert_file = \"c.pem\"\n"));
        assert!(e.contains("`redis.tls.key_file`"), "{e}");
        let e = err(&format!("{TLS_SINGLE}[redis.tls]\nkey_file = \"c.key\"\n"));
        assert!(e.contains("`redis.tls.cert_file`"), "{e}");
        let e = err(&format!(
            "{TLS_SINGLE}[redis.tls]\ninsecure_skip_verify = true\n"
        ));
        assert!(e.contains("insecure_skip_verify"), "{e}");
        // TLS files with a plaintext URL: nothing would use them
        let e = err(
            "[redis]\nmode = \"single\"\nurl = \"redis://h:1\"\n[redis.tls]\nca_file = \"a\"\n",
        );
        assert!(e.contains("`redis.tls`") && e.contains("rediss://"), "{e}");
        // one scheme for every URL
        let e = err("[redis]\nmode = \"cluster\"\nnodes = [\"rediss://a:1\", \"redis://b:2\"]\n");
        assert!(
            e.contains("`redis.nodes`") && e.contains("redis://b:2"),
            "{e}"
        );
        // certificate checks are not switched off
        let e = err("[redis]\nmode = \"single\"\nurl = \"rediss://h:1/#insecure\"\n");
        assert!(e.contains("#insecure") && e.contains("ca_file"), "{e}");
        // the builder gets the same checks, at connect
        let c = LockConfig::single("redis://h:1").with_tls(TlsConfig::new().with_ca_file("a"));
        assert!(c.validate().unwrap_err().is_config());
    }

    #[test]
    fn debug_shows_tls_paths_and_no_secret() {
        let c = LockConfig::single("rediss://app:url-secret@h:1")
            .with_credentials(Some("app".into()), Some("pw-secret".into()))
            .with_tls(
                TlsConfig::new()
                    .with_ca_file("/etc/lock/ca.pem")
                    .with_client_cert("/etc/lock/client.pem", "/etc/lock/client.key"),
            );
        let text = format!("{c:?}");
        assert!(
            !text.contains("url-secret") && !text.contains("pw-secret"),
            "{text}"
        );
        for path in [
            "/etc/lock/ca.pem",
            "/etc/lock/client.pem",
            "/etc/lock/client.key",
        ] {
            assert!(text.contains(path), "{text}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999999999h").is_err());
    }
}
