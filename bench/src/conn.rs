//! Where the bench's Redis is (one server or a cluster) and the plain connections the
//! baselines use there.

use std::time::Duration;

use lock_runtime::LockConfig;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, ProtocolVersion, PushInfo, RedisFuture, Value};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::Result;

/// The Redis of the run: one server or a cluster. Cheap to clone, so that futures which run on
/// another peer's runtime can take it along.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// One server: its URL. A cluster: every data node's URL (the seeds).
    urls: Vec<String>,
    cluster: bool,
}

impl Endpoint {
    pub(crate) fn single(url: String) -> Endpoint {
        Endpoint {
            urls: vec![url],
            cluster: false,
        }
    }

    pub(crate) fn cluster(nodes: Vec<String>) -> Endpoint {
        Endpoint {
            urls: nodes,
            cluster: true,
        }
    }

    /// The same Redis reached through another URL (a relay in front of the one server).
    pub(crate) fn via(&self, url: String) -> Endpoint {
        assert!(!self.cluster, "a relay stands in front of one server only");
        Endpoint::single(url)
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The server's URL, or every seed of a cluster.
    pub(crate) fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The server's URL (a cluster: the first seed).
    pub(crate) fn url(&self) -> &str {
        &self.urls[0]
    }

    /// The configuration every service of the bench uses.
    pub(crate) fn config(&self) -> LockConfig {
        let config = if self.cluster {
            LockConfig::new(lock_runtime::Topology::Cluster {
                nodes: self.urls.clone(),
            })
        } else {
            LockConfig::single(self.url())
        };
        config.with_watchdog_timeout(Duration::from_secs(30))
    }

    /// A new plain connection (RESP2): a multiplexed connection to the server, or a cluster
    /// connection that routes each command by its key.
    pub(crate) async fn connection(&self) -> Result<Conn> {
        if self.cluster {
            let client = ClusterClientBuilder::new(self.urls.clone()).build()?;
            Ok(Conn::Cluster(client.get_async_connection().await?))
        } else {
            let client = redis::Client::open(self.url())?;
            Ok(Conn::Single(
                client.get_multiplexed_async_connection().await?,
            ))
        }
    }

    /// A new RESP3 connection whose pub/sub messages go to `push`: for `SUBSCRIBE` on one
    /// server, for `SSUBSCRIBE` (shard channels) on a cluster.
    pub(crate) async fn subscriber(&self, push: UnboundedSender<PushInfo>) -> Result<Conn> {
        if self.cluster {
            let client = ClusterClientBuilder::new(self.urls.clone())
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(push)
                .build()?;
            Ok(Conn::Cluster(client.get_async_connection().await?))
        } else {
            let client = redis::Client::open(format!("{}?protocol=resp3", self.url()))?;
            let config = redis::AsyncConnectionConfig::new().set_push_sender(push);
            Ok(Conn::Single(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            ))
        }
    }
}

/// A plain connection to one server or to a cluster; clones share it.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Subscribes to `channel` (a shard channel on a cluster); returns once Redis confirmed.
    pub(crate) async fn subscribe(&mut self, channel: &str) -> Result<()> {
        match self {
            Conn::Single(con) => con.subscribe(channel).await?,
            Conn::Cluster(con) => con.ssubscribe(channel).await?,
        }
        Ok(())
    }

    /// Unsubscribes from `channel` (a shard channel on a cluster).
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> Result<()> {
        match self {
            Conn::Single(con) => con.unsubscribe(channel).await?,
            Conn::Cluster(con) => con.sunsubscribe(channel).await?,
        }
        Ok(())
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(con) => con.req_packed_command(cmd),
            Conn::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(con) => con.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(con) => con.get_db(),
            Conn::Cluster(con) => con.get_db(),
        }
    }
}
