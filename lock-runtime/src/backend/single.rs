//! Single node (and, later, a static master): auto-reconnecting RESP3 connections.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo};
use tokio::sync::mpsc::UnboundedSender;

use crate::config::LockConfig;
use crate::error::{ErrorKind, LockError};

/// A command connection and a subscriber connection to one server.
pub(super) struct Single {
    pub(super) commands: ConnectionManager,
    pub(super) subscriber: ConnectionManager,
}

impl Single {
    pub(super) async fn connect(
        url: &str,
        config: &LockConfig,
        push: UnboundedSender<PushInfo>,
    ) -> Result<Single, LockError> {
        let client = client(url, config)?;
        let connect = async {
            let commands =
                ConnectionManager::new_with_config(client.clone(), manager_config(config)).await?;
            let subscriber = ConnectionManager::new_with_config(
                client,
                manager_config(config)
                    .set_push_sender(push)
                    .set_automatic_resubscription(),
            )
            .await?;
            Ok::<_, redis::RedisError>(Single {
                commands,
                subscriber,
            })
        };
        match tokio::time::timeout(config.connect_timeout(), connect).await {
            Ok(Ok(single)) => Ok(single),
            Ok(Err(e)) => Err(LockError::backend(
                &format!("cannot connect to {}", redacted(url)),
                e,
            )),
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
}

/// Reconnect quickly (10-100 ms backoff) and fail each attempt after our timeouts.
fn manager_config(config: &LockConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout()))
        .set_response_timeout(Some(config.response_timeout()))
        .set_min_delay(std::time::Duration::from_millis(10))
        .set_max_delay(std::time::Duration::from_millis(100))
        .set_number_of_retries(6)
}

/// A RESP3 client for `url` with the configured credentials.
pub(crate) fn client(url: &str, config: &LockConfig) -> Result<redis::Client, LockError> {
    let info = url.into_connection_info().map_err(|e| {
        LockError::config(format!(
            "{}: invalid redis URL {}: {e}",
            config.origin(),
            redacted(url)
        ))
        .with_source(e)
    })?;
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
    redis::Client::open(info.set_redis_settings(settings)).map_err(|e| {
        LockError::config(format!(
            "{}: invalid redis URL {}: {e}",
            config.origin(),
            redacted(url)
        ))
        .with_source(e)
    })
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
