//! What a configuration must satisfy, however it was made: [`LockConfig::validate`].

use std::time::Duration;

use super::{DefaultWait, LockConfig, Topology, is_tls_url, redacted};
use crate::error::LockError;
use crate::vocab::MAX_LEASE_MS;

/// The range of `redis.connect_timeout`, `redis.response_timeout` and `redis.sync_timeout`: a
/// zero timeout fails everything, and an hour is far beyond any answer worth waiting for.
pub(super) const TIMEOUTS: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(3600));

/// The range of `lock.watchdog_timeout`. It is a lease, so at most the longest lease the scripts
/// accept; the watchdog renews every third of it, and 30 ms leaves a renewal 10 ms - a round
/// trip to a nearby server and a timer tick - before the next one is due.
pub(super) const WATCHDOG_TIMEOUTS: (Duration, Duration) = (
    Duration::from_millis(30),
    Duration::from_millis(MAX_LEASE_MS),
);

/// The range of `lock.default_wait` (besides `"forever"`): zero tries once; a wait beyond a year
/// is a mistake, or meant as `"forever"`.
pub(super) const DEFAULT_WAITS: (Duration, Duration) =
    (Duration::ZERO, Duration::from_secs(365 * 24 * 3600));

/// The range of `lock.fence_idle_ttl` (besides `"never"`). The clock covers for an expired
/// counter only when the counter sat idle for longer than the server clock may ever step back,
/// hence a minute at least; the longest is that of a lease (for longer, write `"never"`).
pub(super) const FENCE_IDLE_TTLS: (Duration, Duration) =
    (Duration::from_secs(60), Duration::from_millis(MAX_LEASE_MS));

/// A duration the way the file writes it: `"30ms"`, `"5s"`, `"2m"`, `"1h"`, `"3650d"`.
pub(crate) fn written(d: Duration) -> String {
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{d:?}");
    }
    let ms = d.as_millis();
    lock_duration::UNITS
        .iter()
        .rev()
        .find(|(_, size)| ms > 0 && ms.is_multiple_of(u128::from(*size)))
        .map_or_else(
            || format!("{ms}ms"),
            |(unit, size)| format!("{}{unit}", ms / u128::from(*size)),
        )
}

/// A `Config` error unless `min <= value <= max`; `note` follows the range in the message.
fn in_range(
    origin: &str,
    field: &str,
    value: Duration,
    (min, max): (Duration, Duration),
    note: &str,
) -> Result<(), LockError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(LockError::config(format!(
        "{origin}: `{field}` = {} is out of range: allowed {} to {}{note}",
        written(value),
        written(min),
        written(max)
    )))
}

impl LockConfig {
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
        if let Some(name) = &self.instance_name {
            check_instance_name(name).map_err(|why| {
                LockError::config(format!("{origin}: `lock.instance_name` = {name:?} {why}"))
            })?;
        }
        for (field, value) in [
            ("redis.connect_timeout", self.connect_timeout),
            ("redis.response_timeout", self.response_timeout),
            ("redis.sync_timeout", self.sync_timeout),
        ] {
            in_range(&origin, field, value, TIMEOUTS, "")?;
        }
        in_range(
            &origin,
            "lock.watchdog_timeout",
            self.watchdog_timeout,
            WATCHDOG_TIMEOUTS,
            " (a lease, renewed every third of it)",
        )?;
        if let DefaultWait::For(wait) = self.default_wait {
            in_range(
                &origin,
                "lock.default_wait",
                wait,
                DEFAULT_WAITS,
                ", or \"forever\"",
            )?;
        }
        if let Some(ttl) = self.fence_idle_ttl {
            in_range(
                &origin,
                "lock.fence_idle_ttl",
                ttl,
                FENCE_IDLE_TTLS,
                ", or \"never\": an expired counter is safe only when it sat idle longer than \
                 the server clock may step back",
            )?;
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
        self.validate_tls(&origin)
    }

    /// Every URL with the field it comes from.
    pub(super) fn urls(&self) -> Vec<(&'static str, &str)> {
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
}

/// Why `name` cannot name a service instance (see [`LockConfig::with_instance_name`]).
fn check_instance_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.chars().count() > 64 {
        return Err("must be 1 to 64 characters long");
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '~')
    {
        return Err("must not contain whitespace, control characters or `~`");
    }
    if name.starts_with("mesh:") || name.starts_with("done:") {
        return Err("must not start with `mesh:` or `done:` (they mark owners on Redis)");
    }
    Ok(())
}
