//! Redis Cluster through the cluster client: scripts are routed by the lock's hash tag, wake-up
//! channels are shard channels (SSUBSCRIBE / SPUBLISH) in the same slot, and the client
//! follows failovers (slot refresh, reconnects, resubscription).

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo};
use tokio::sync::mpsc::UnboundedSender;

use super::probe;
use super::single::redacted;
use crate::config::LockConfig;
use crate::error::{ErrorKind, LockError};

pub(super) struct Cluster {
    pub(super) commands: ClusterConnection,
    pub(super) subscriber: ClusterConnection,
    /// For grants followed by `WAIT` (with `sync_replicas`).
    pub(super) synced: Option<ClusterConnection>,
}

impl Cluster {
    pub(super) async fn connect(
        nodes: &[String],
        config: &LockConfig,
        push: UnboundedSender<PushInfo>,
    ) -> Result<Cluster, LockError> {
        // `retries`: the subscriber's client may repeat its commands (subscribing twice is
        // harmless); the commands' client must not: it would send a script again after a
        // connection dropped while the script was out, and a lock script that runs twice can
        // release a re-entered lock or leave a grant nobody knows of. The backend repeats only
        // calls that Redis certainly did not run (see `not_run_retried`).
        let builder = |retries: u32| {
            let mut b = ClusterClientBuilder::new(nodes.to_vec())
                .use_protocol(ProtocolVersion::RESP3)
                .connection_timeout(config.connect_timeout())
                .response_timeout(config.response_timeout())
                // fail over in ~0.1 s steps instead of the default 1.28 s
                .retries(retries)
                .min_retry_wait(20)
                .max_retry_wait(200)
                .retry_wait_formula(20, 2);
            if let Some(user) = config.username() {
                b = b.username(user);
            }
            if let Some(password) = config.password() {
                b = b.password(password);
            }
            b
        };
        // rediss:// seeds make the client use TLS for every node; these are the files
        #[cfg(feature = "tls")]
        let builder = {
            let certificates = config
                .uses_tls()
                .then(|| super::tls::certificates(config))
                .transpose()?;
            move |retries: u32| match certificates.clone() {
                Some(certificates) => builder(retries).certs(certificates),
                None => builder(retries),
            }
        };
        let invalid = |e: redis::RedisError| {
            LockError::config(format!(
                "{}: invalid `redis.nodes` ({}): {e}",
                config.origin(),
                nodes
                    .iter()
                    .map(|n| redacted(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .with_source(e)
        };
        let commands_client = builder(0).build().map_err(invalid)?;
        let subscriber_client = builder(30).push_sender(push).build().map_err(invalid)?;
        let synced = config.sync_replicas() > 0;
        let connect = async {
            let commands = commands_client.get_async_connection().await?;
            let subscriber = subscriber_client.get_async_connection().await?;
            let synced = match synced {
                true => Some(commands_client.get_async_connection().await?),
                false => None,
            };
            Ok::<_, redis::RedisError>(Cluster {
                commands,
                subscriber,
                synced,
            })
        };
        let seeds = nodes
            .iter()
            .map(|n| redacted(n))
            .collect::<Vec<_>>()
            .join(", ");
        let connect = tokio::time::timeout(config.connect_timeout(), connect);
        match probe::unless_plaintext(nodes, connect).await? {
            Ok(Ok(cluster)) => Ok(cluster),
            Ok(Err(e)) => match probe::wrong_scheme_after(nodes, &e).await {
                Some(wrong_scheme) => Err(wrong_scheme),
                None => Err(LockError::backend(
                    &format!("cannot connect to the redis cluster (seeds {seeds})"),
                    e,
                )),
            },
            Err(_) => Err(LockError::new(
                ErrorKind::Backend,
                format!(
                    "cannot connect to the redis cluster within {:?} (redis.connect_timeout)",
                    config.connect_timeout()
                ),
            )),
        }
    }
}
