//! The configuration format: the tables as serde reads them (from a TOML file, or nested in an
//! application's own settings through `LockConfig`'s `Deserialize`), the duration fields, the
//! environment variables, and [`build`] turning them into a checked [`LockConfig`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{DefaultWait, LockConfig, TlsConfig, Topology};
use crate::error::{ErrorKind, LockError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    redis: Option<RawRedis>,
    #[serde(default)]
    lock: RawLock,
}

#[derive(Deserialize, Default)]
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
    password: Option<Secret>,
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
    instance_name: Option<String>,
    watchdog_timeout: Option<ConfigDuration>,
    default_wait: Option<ConfigWait>,
    fence_idle_ttl: Option<ConfigTtl>,
}

/// A password: a string, and a value of another type is refused without being shown (the
/// error of the deserializer that read it would quote it).
struct Secret(String);

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        const NOT_SHOWN: &str = "expected a string (the value is not shown)";
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Secret;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Secret, E> {
                Ok(Secret(v.to_owned()))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Secret, E> {
                Err(E::custom(NOT_SHOWN))
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Secret, E> {
                Err(E::custom(NOT_SHOWN))
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Secret, E> {
                Err(E::custom(NOT_SHOWN))
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Secret, E> {
                Err(E::custom(NOT_SHOWN))
            }
            fn visit_bytes<E: serde::de::Error>(self, _: &[u8]) -> Result<Secret, E> {
                Err(E::custom(NOT_SHOWN))
            }
        }
        d.deserialize_string(Visitor)
    }
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

/// Parses a duration with the grammar the attribute uses too (`lock-duration`): `"500ms"`,
/// `"1.5s"`, `"2m"`, `"1h"`, `"7d"`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    lock_duration::parse_millis(text).map(Duration::from_millis)
}

/// What was wrong in a TOML document and where (line and column, from 1), without the document.
#[derive(Debug)]
struct TomlError {
    message: String,
    line: Option<(usize, usize)>,
}

impl TomlError {
    fn new(text: &str, message: &str, span: Option<std::ops::Range<usize>>) -> Self {
        let line = span.and_then(|span| {
            let before = text.get(..span.start)?;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            Some((
                before.matches('\n').count() + 1,
                before[line_start..].chars().count() + 1,
            ))
        });
        TomlError {
            message: message.to_owned(),
            line,
        }
    }
}

impl std::fmt::Display for TomlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some((line, column)) => write!(f, "line {line}, column {column}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for TomlError {}

pub(super) fn parse(
    text: &str,
    origin: &str,
    source: Option<PathBuf>,
) -> Result<LockConfig, LockError> {
    let fail = |field: &str, what: String| {
        LockError::new(
            ErrorKind::Config,
            format!("{origin}: invalid lock config at `{field}`: {what}"),
        )
    };
    // The toml errors carry the whole document (to show the line in their `Display`, and all of
    // it in their `Debug`), passwords included: only their message and position go further.
    let de = toml::Deserializer::parse(text).map_err(|e| {
        let error = TomlError::new(text, e.message(), e.span());
        let at = if error.line.is_some() { " at" } else { ":" };
        LockError::config(format!("{origin}: not valid TOML{at} {error}")).with_source(error)
    })?;
    let raw: RawFile = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = match path.as_str() {
            // serde quotes the value it did not expect: not this one
            "redis.password" => "expected a string (the value is not shown)",
            _ => inner.message(),
        };
        let error = TomlError::new(text, message, inner.span());
        let line = error
            .line
            .map(|(line, _)| format!(" (line {line})"))
            .unwrap_or_default();
        let field = if path == "." { "<top level>" } else { &path };
        fail(field, format!("{message}{line}")).with_source(error)
    })?;
    build(raw, origin, source)
}

/// `LockConfig` as one value of an application's own settings (a `[locks]` table of its TOML,
/// a figment or config-rs profile): the same tables, checks, environment variables and
/// messages as the file.
impl<'de> Deserialize<'de> for LockConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawFile::deserialize(d)?;
        build(raw, "lock settings", None).map_err(serde::de::Error::custom)
    }
}

/// The environment variables that replace a value of the configuration (12-factor
/// deployments: one file, an address per environment), with the field each replaces.
pub(crate) const ENV_OVERRIDES: [(&str, &str); 9] = [
    ("LOCK_REDIS_MODE", "redis.mode"),
    ("LOCK_REDIS_URL", "redis.url"),
    ("LOCK_REDIS_NODES", "redis.nodes"),
    ("LOCK_REDIS_MASTER_NAME", "redis.master_name"),
    ("LOCK_REDIS_SENTINELS", "redis.sentinels"),
    ("LOCK_REDIS_MASTER", "redis.master"),
    ("LOCK_REDIS_REPLICAS", "redis.replicas"),
    ("LOCK_PREFIX", "lock.prefix"),
    ("LOCK_INSTANCE_NAME", "lock.instance_name"),
];

/// [`LockConfig::from_env`]: the tables empty, every value from the environment.
pub(super) fn from_env() -> Result<LockConfig, LockError> {
    let raw = RawFile {
        redis: None,
        lock: RawLock::default(),
    };
    if env("LOCK_REDIS_MODE").is_none() {
        return Err(LockError::config(
            "lock config from the environment: $LOCK_REDIS_MODE is not set (\"single\", \
             \"cluster\", \"sentinel\" or \"master-slave\")",
        ));
    }
    build(raw, "lock config from the environment", None)
}

/// A set, non-empty environment variable.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A list from the environment: comma-separated, spaces around items ignored.
fn env_list(name: &str) -> Option<Vec<String>> {
    env(name).map(|v| {
        v.split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// The configuration the tables describe, with the environment's overrides, checked.
fn build(mut raw: RawFile, origin: &str, source: Option<PathBuf>) -> Result<LockConfig, LockError> {
    // the environment replaces what the tables say
    let overridden: Vec<(&str, &str)> = ENV_OVERRIDES
        .iter()
        .copied()
        .filter(|(name, _)| env(name).is_some())
        .collect();
    if !overridden.is_empty() {
        let r = raw.redis.get_or_insert_with(RawRedis::default);
        r.mode = env("LOCK_REDIS_MODE").or(r.mode.take());
        r.url = env("LOCK_REDIS_URL").or(r.url.take());
        r.nodes = env_list("LOCK_REDIS_NODES").or(r.nodes.take());
        r.master_name = env("LOCK_REDIS_MASTER_NAME").or(r.master_name.take());
        r.sentinels = env_list("LOCK_REDIS_SENTINELS").or(r.sentinels.take());
        r.master = env("LOCK_REDIS_MASTER").or(r.master.take());
        r.replicas = env_list("LOCK_REDIS_REPLICAS").or(r.replicas.take());
        raw.lock.prefix = env("LOCK_PREFIX").or(raw.lock.prefix.take());
        raw.lock.instance_name = env("LOCK_INSTANCE_NAME").or(raw.lock.instance_name.take());
    }
    // a value that came from the environment is named by its variable too
    let fail = |field: &str, what: String| {
        let from = overridden
            .iter()
            .find(|(_, f)| *f == field)
            .map(|(name, _)| format!(" (from ${name})"))
            .unwrap_or_default();
        LockError::new(
            ErrorKind::Config,
            format!("{origin}: invalid lock config at `{field}`{from}: {what}"),
        )
    };
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
    let mut config = LockConfig::new(topology);
    config.source = source;
    config.username = r.username.or_else(|| env("LOCK_REDIS_USERNAME"));
    config.password = r
        .password
        .map(|p| p.0)
        .or_else(|| env("LOCK_REDIS_PASSWORD"));
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
    if let Some(name) = raw.lock.instance_name {
        config.instance_name = Some(name);
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
