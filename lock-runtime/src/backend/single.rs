//! One server (single mode, a static master, or the master a sentinel names): auto-reconnecting
//! RESP3 connections.

use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{IntoConnectionInfo, ProtocolVersion};

use super::manager::Manager;
use super::{PushSink, probe};
use crate::config::{LockConfig, redacted};
use crate::error::{ErrorKind, LockError};

/// Connections to one server: commands, the shared subscriber, and (with `sync_replicas`) one
/// for grants followed by `WAIT`, so a slow `WAIT` does not hold up releases and renewals.
pub(super) struct Single {
    pub(super) commands: Manager,
    pub(super) subscriber: Manager,
    synced: Option<Manager>,
}

impl Single {
    pub(super) async fn connect(
        url: &str,
        config: &LockConfig,
        push: PushSink,
        synced: bool,
    ) -> Result<Single, LockError> {
        let client = client(url, config)?;
        let connect = async {
            let commands = Manager::connect(client.clone(), manager_config(config)).await?;
            let subscriber = Manager::connect(
                client.clone(),
                manager_config(config)
                    .set_push_sender(super::push_sender(&push))
                    .set_automatic_resubscription(),
            )
            .await?;
            let synced = match synced {
                true => Some(Manager::connect(client, manager_config(config)).await?),
                false => None,
            };
            Ok::<_, redis::RedisError>(Single {
                commands,
                subscriber,
                synced,
            })
        };
        let deadline = tokio::time::Instant::now() + config.connect_timeout();
        let connect = tokio::time::timeout_at(deadline, connect);
        match probe::unless_plaintext(&[url], connect).await? {
            Ok(Ok(single)) => Ok(single),
            Ok(Err(e)) => match probe::wrong_scheme_after(&[url], &e, deadline).await {
                Some(wrong_scheme) => Err(wrong_scheme),
                None => Err(LockError::backend(
                    &format!("cannot connect to {}", redacted(url)),
                    e,
                )),
            },
            Err(_) => Err(LockError::new(
                ErrorKind::Backend,
                format!(
                    "cannot connect to {} within {:?} (redis.connect_timeout)",
                    redacted(url),
                    config.connect_timeout()
                ),
            )),
        }
    }

    /// The connection for grants that wait for replicas.
    pub(super) fn synced_connection(&self) -> Manager {
        self.synced.as_ref().unwrap_or(&self.commands).clone()
    }

    /// Fails unless the server is a master: locks must never be written to a replica. Asks
    /// within `timeout`.
    pub(super) async fn ensure_master(
        &self,
        url: &str,
        timeout: Duration,
    ) -> Result<(), LockError> {
        let asked = tokio::time::timeout(timeout, role(&mut self.commands.clone())).await;
        let role = asked
            .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()))
            .map_err(|e| {
                LockError::backend(&format!("cannot ask {} for its role", redacted(url)), e)
            })?;
        if role != "master" {
            return Err(LockError::new(
                ErrorKind::Backend,
                format!(
                    "{} is a {role}, not a master: lock operations must go to the master \
                     (master-slave mode does not fail over; point `redis.master` at the current \
                     master or use sentinel mode)",
                    redacted(url)
                ),
            ));
        }
        Ok(())
    }
}

/// The first element of `ROLE`: "master", "slave" or "sentinel".
pub(super) async fn role(con: &mut Manager) -> redis::RedisResult<String> {
    let reply: redis::Value = redis::cmd("ROLE").query_async(con).await?;
    match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
            Some(redis::Value::SimpleString(s)) => Ok(s.clone()),
            _ => Ok(String::new()),
        },
        _ => Ok(String::new()),
    }
}

/// Reconnect quickly (10-100 ms backoff) and fail each attempt after our timeouts. No response
/// timeout of the client's own: every call on these connections is bounded by the backend's
/// (`response_timeout`, see `Backend::run`), so one timer per call is enough.
fn manager_config(config: &LockConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout()))
        .set_response_timeout(None)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100))
        .set_number_of_retries(6)
}

/// A RESP3 client for `url` with the configured credentials (and TLS files, for `rediss://`).
pub(super) fn client(url: &str, config: &LockConfig) -> Result<redis::Client, LockError> {
    let info = url
        .into_connection_info()
        .map_err(|e| invalid_url(url, config, e))?;
    let mut settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    if let Some(user) = config.username() {
        settings = settings.set_username(user);
    }
    if let Some(password) = config.password() {
        settings = settings.set_password(password);
    }
    open(url, info.set_redis_settings(settings), config)
}

/// A client for `info` as it is (the sentinels: no credentials), with the TLS files for
/// `rediss://`.
pub(super) fn open(
    url: &str,
    info: redis::ConnectionInfo,
    config: &LockConfig,
) -> Result<redis::Client, LockError> {
    #[cfg(feature = "tls")]
    if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        let certificates = super::tls::certificates(config)?;
        return redis::Client::build_with_tls(info, certificates)
            .map_err(|e| invalid_url(url, config, e));
    }
    redis::Client::open(info).map_err(|e| invalid_url(url, config, e))
}

/// The user written in `url` (`redis://app:pw@host`), if any.
pub(super) fn url_user(url: &str) -> Option<String> {
    let info = url.into_connection_info().ok()?;
    info.redis_settings().username().map(str::to_owned)
}

fn invalid_url(url: &str, config: &LockConfig, e: redis::RedisError) -> LockError {
    LockError::config(format!(
        "{}: invalid redis URL {}: {e}",
        config.origin(),
        redacted(url)
    ))
    .with_source(e)
}
