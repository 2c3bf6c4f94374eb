//! What a configuration must satisfy, however it was made: [`LockConfig::validate`].

use std::time::Duration;

use super::{LockConfig, Topology, is_tls_url, redacted};
use crate::error::LockError;

/// The shortest `fence_idle_ttl`: the clock covers for an expired counter only when the counter
/// sat idle for longer than the server clock may ever step back.
const MIN_FENCE_IDLE_TTL: Duration = Duration::from_secs(60);

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
