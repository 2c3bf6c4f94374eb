//! Redis Cluster through the cluster client: scripts are routed by the lock's hash tag, wake-up
//! channels are shard channels (SSUBSCRIBE / SPUBLISH) in the same slot, and the client
//! follows failovers (slot refresh, reconnects, resubscription).

use redis::ProtocolVersion;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;

use super::{PushSink, probe};
use crate::config::{LockConfig, redacted};
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
        push: PushSink,
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
        let subscriber_client = builder(30)
            .push_sender(super::push_sender(&push))
            .build()
            .map_err(invalid)?;
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
        let deadline = tokio::time::Instant::now() + config.connect_timeout();
        let connect = tokio::time::timeout_at(deadline, connect);
        match probe::unless_plaintext(nodes, connect).await? {
            Ok(Ok(cluster)) => Ok(cluster),
            Ok(Err(e)) => match probe::wrong_scheme_after(nodes, &e, deadline).await {
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

/// The distinct masters (`host`, `port`) in a `CLUSTER SLOTS` reply, as the cluster client
/// names them (it builds its slot map from the same reply). A range whose master address is
/// unknown (`?`, empty) is skipped.
pub(super) fn masters(slots: &redis::Value) -> Vec<(String, u16)> {
    use redis::Value;
    let mut masters: Vec<(String, u16)> = Vec::new();
    let Value::Array(ranges) = slots else {
        return masters;
    };
    for range in ranges {
        let Value::Array(range) = range else { continue };
        let Some(Value::Array(node)) = range.get(2) else {
            continue;
        };
        let host = match node.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = node.get(1) else {
            continue;
        };
        let Ok(port) = u16::try_from(*port) else {
            continue;
        };
        if host.is_empty() || host == "?" || masters.iter().any(|m| m.0 == host && m.1 == port) {
            continue;
        }
        masters.push((host, port));
    }
    masters
}

#[cfg(test)]
mod tests {
    use redis::Value;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn masters_of_a_slots_reply() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("127.0.0.1", 7001),
            ]),
            // a second range of the same master
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(10990),
                node("127.0.0.1", 7000),
            ]),
            Value::Array(vec![Value::Int(10991), Value::Int(16383), node("?", 7002)]),
        ]);
        assert_eq!(
            super::masters(&reply),
            vec![
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001)
            ]
        );
        assert!(super::masters(&Value::Nil).is_empty());
    }
}
