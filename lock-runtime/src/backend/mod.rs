//! One async surface over the Redis topologies: run a script (optionally waiting for replica
//! acknowledgements), subscribe to wake-up channels.
//!
//! | mode | connections |
//! |---|---|
//! | single, master-slave | auto-reconnecting RESP3 connections to one server (the master) |
//! | sentinel | the same, to the master the sentinels name; re-resolved on failover |
//! | cluster | the cluster client: slot routing, topology refresh, sharded pub/sub |
//!
//! `nodes.rs` asks every server of the topology for its role and health, for operators;
//! `invoke.rs` sends one script call (a Redis Function or `EVALSHA`, then `WAIT` if asked).
//!
//! Every operation carries our own timeout (`redis.response_timeout`), because the clients'
//! reconnect logic can otherwise make a call wait out a whole retry budget.

mod cluster;
mod invoke;
mod manager;
mod nodes;
mod probe;
mod sentinel;
mod single;
mod tls;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{FromRedisValue, PushInfo};

use crate::config::{LockConfig, Topology};
use crate::error::{ErrorKind, LockError};
use crate::scripts::ScriptCall;
use invoke::{invoke, with_wait};

/// How many keys one `SCAN` step looks at.
const SCAN_COUNT: u32 = 1000;

/// Connections of one service.
pub(crate) struct Backend {
    conn: Conn,
    response_timeout: Duration,
    /// Named in authentication errors.
    username: Option<String>,
    /// `(replicas, timeout)` every grant must be acknowledged by.
    sync: Option<(u32, Duration)>,
    /// Whether the lock operations go as Redis Functions (`FCALL`): until a server says it has
    /// no Functions (before 7.0) or the user may not load or call them (ACL), then `EVALSHA`
    /// for good (see [`invoke`]).
    functions: AtomicBool,
}

enum Conn {
    Single(single::Single),
    Sentinel(sentinel::Sentinel),
    Cluster(cluster::Cluster),
}

/// Where a connection's pushes (wake-up messages, subscriptions, disconnections) go: called by
/// the connection as each arrives, so it must not block.
pub(crate) type PushSink = Arc<dyn Fn(PushInfo) + Send + Sync>;

/// `sink` as the redis client takes a push sender.
fn push_sender(sink: &PushSink) -> impl redis::aio::AsyncPushSender + Clone {
    let sink = sink.clone();
    move |push| -> Result<(), std::convert::Infallible> {
        sink(push);
        Ok(())
    }
}

/// A script reply, and whether the replicas acknowledged it in time (always `true` when replica
/// acknowledgements are not required).
pub(crate) struct Synced<T> {
    pub(crate) reply: T,
    pub(crate) acknowledged: bool,
}

impl Backend {
    /// Connects within `connect_timeout`; pushes (wake-up messages, disconnections) go to `push`.
    pub(crate) async fn connect(config: &LockConfig, push: PushSink) -> Result<Backend, LockError> {
        let synced = config.sync_replicas() > 0;
        let login = login_user(config);
        let user = login.as_deref();
        let conn = async {
            Ok::<_, LockError>(match config.topology() {
                Topology::Single { url } => {
                    Conn::Single(single::Single::connect(url, config, push, synced).await?)
                }
                Topology::MasterSlave { master, .. } => {
                    let single = single::Single::connect(master, config, push, synced).await?;
                    single
                        .ensure_master(master, config.response_timeout())
                        .await?;
                    Conn::Single(single)
                }
                Topology::Sentinel {
                    master_name,
                    sentinels,
                } => Conn::Sentinel(
                    sentinel::Sentinel::connect(master_name, sentinels, config, push).await?,
                ),
                Topology::Cluster { nodes } => {
                    Conn::Cluster(cluster::Cluster::connect(nodes, config, push).await?)
                }
            })
        }
        .await
        .map_err(|e| e.naming_user(user))?;
        Ok(Backend {
            conn,
            response_timeout: config.response_timeout(),
            username: login.clone(),
            sync: synced.then(|| (config.sync_replicas(), config.sync_timeout())),
            functions: AtomicBool::new(true),
        })
    }

    /// Whether to send the lock operations as Redis Functions (see [`ScriptCall::ops`]).
    pub(crate) fn functions(&self) -> bool {
        self.functions.load(Ordering::Relaxed)
    }

    /// The command that publishes on a wake-up channel from inside a script.
    pub(crate) fn publish_command(&self) -> &'static str {
        match self.conn {
            Conn::Cluster(_) => "spublish",
            _ => "publish",
        }
    }

    /// Whether the subscriber's client subscribes a new connection again by itself after a
    /// reconnection (the cluster client does, on the node that serves each shard channel's slot
    /// then): the service must not send its own subscriptions again meanwhile - sent while the
    /// client reconnects, one can land on another node of the shard (a replica), which then
    /// delivers every message of the channel a second time.
    pub(crate) fn restores_subscriptions(&self) -> bool {
        self.is_cluster()
    }

    /// Whether scripts touching several locks must be split by cluster slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Runs a script and converts its reply; `what` names the operation in errors and in the
    /// script call metrics.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        what: &'static str,
        call: &ScriptCall<'_>,
    ) -> Result<T, LockError> {
        self.run_until(what, call, None).await
    }

    /// [`run`](Self::run), answered by `deadline` (`None`: within `response_timeout` from now).
    pub(crate) async fn run_until<T: FromRedisValue>(
        &self,
        what: &'static str,
        call: &ScriptCall<'_>,
        deadline: Option<Instant>,
    ) -> Result<T, LockError> {
        let result = self.run_unmetered(what, call, deadline).await;
        crate::metrics::script_call(what, result.is_ok());
        result
    }

    async fn run_unmetered<T: FromRedisValue>(
        &self,
        what: &'static str,
        call: &ScriptCall<'_>,
        deadline: Option<Instant>,
    ) -> Result<T, LockError> {
        // Each call's future is boxed: a lock operation's future holds this one at every level
        // from the caller's `lock().await` down (six or seven), and moving or boxing an
        // operation's future copies all of it, so a call future carried unboxed costs each
        // level its size (about 600 bytes) in every copy, more than the allocation.
        match &self.conn {
            Conn::Single(s) => {
                let mut con = s.commands.clone();
                self.timed_until(
                    what,
                    deadline,
                    Box::pin(invoke(&mut con, call, &self.functions)),
                )
                .await
            }
            Conn::Cluster(c) => {
                let attempt = || {
                    let mut con = c.commands.clone();
                    async move { invoke(&mut con, call, &self.functions).await }
                };
                // boxed: its retries would make every call's future the size of theirs
                Box::pin(self.timed_until(what, deadline, not_run_retried(attempt))).await
            }
            Conn::Sentinel(s) => {
                let master = s.current();
                let mut con = master.commands.clone();
                let result = self
                    .timed_until(
                        what,
                        deadline,
                        Box::pin(invoke(&mut con, call, &self.functions)),
                    )
                    .await;
                s.check(&result);
                result
            }
        }
    }

    /// Runs one plain command (not a lock operation: the services' reports and the journal,
    /// see `engine::presence`), on the master, or in a cluster on the master of its key's slot.
    pub(crate) async fn command<T: FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, LockError> {
        match &self.conn {
            Conn::Single(s) => {
                let mut con = s.commands.clone();
                self.timed(what, cmd.query_async(&mut con)).await
            }
            Conn::Cluster(c) => {
                let attempt = || {
                    let mut con = c.commands.clone();
                    async move { cmd.query_async(&mut con).await }
                };
                self.timed(what, not_run_retried(attempt)).await
            }
            Conn::Sentinel(s) => {
                let mut con = s.current().commands.clone();
                let result = self.timed(what, cmd.query_async(&mut con)).await;
                s.check(&result);
                result
            }
        }
    }

    /// Runs a script that may grant a lock; with `sync_replicas` set, `WAIT`s for the replicas
    /// on the same connection in the same round trip. Answered by `deadline` (`None`: within
    /// `response_timeout` from now).
    pub(crate) async fn run_synced_until<T: FromRedisValue>(
        &self,
        what: &'static str,
        call: &ScriptCall<'_>,
        deadline: Option<Instant>,
    ) -> Result<Synced<T>, LockError> {
        let Some((replicas, timeout)) = self.sync else {
            let reply = self.run_until(what, call, deadline).await?;
            return Ok(Synced {
                reply,
                acknowledged: true,
            });
        };
        // boxed, like the cluster's retries: only calls that wait for replicas carry its size
        let result =
            Box::pin(self.waited_for_replicas(what, call, replicas, timeout, deadline)).await;
        crate::metrics::script_call(what, result.is_ok());
        let (reply, acks) = result?;
        Ok(Synced {
            reply,
            acknowledged: acks >= i64::from(replicas),
        })
    }

    /// Runs a script followed by `WAIT replicas timeout`; returns its reply and the replicas
    /// that acknowledged.
    async fn waited_for_replicas<T: FromRedisValue>(
        &self,
        what: &'static str,
        call: &ScriptCall<'_>,
        replicas: u32,
        timeout: Duration,
        deadline: Option<Instant>,
    ) -> Result<(T, i64), LockError> {
        Ok(match &self.conn {
            Conn::Single(s) => {
                let mut con = s.synced_connection();
                self.timed_until(
                    what,
                    deadline,
                    with_wait(&mut con, call, replicas, timeout, &self.functions),
                )
                .await?
            }
            Conn::Cluster(c) => {
                let attempt = || {
                    let mut con = c.synced.clone().unwrap_or_else(|| c.commands.clone());
                    async move { with_wait(&mut con, call, replicas, timeout, &self.functions).await }
                };
                self.timed_until(what, deadline, not_run_retried(attempt))
                    .await?
            }
            Conn::Sentinel(s) => {
                let master = s.current();
                let mut con = master.synced_connection();
                let result = self
                    .timed_until(
                        what,
                        deadline,
                        with_wait(&mut con, call, replicas, timeout, &self.functions),
                    )
                    .await;
                s.check(&result);
                result?
            }
        })
    }

    /// Subscribes the shared subscriber connection to `channel`; returns once Redis confirmed.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<(), LockError> {
        match &self.conn {
            Conn::Single(s) => {
                self.timed("subscribe", s.subscriber.clone().subscribe(channel))
                    .await
            }
            Conn::Cluster(c) => {
                self.timed("ssubscribe", c.subscriber.clone().ssubscribe(channel))
                    .await
            }
            Conn::Sentinel(s) => self.timed("subscribe", s.subscribe(channel)).await,
        }
    }

    /// Unsubscribes the shared subscriber connection from `channels`.
    pub(crate) async fn unsubscribe(&self, channels: &[String]) -> Result<(), LockError> {
        match &self.conn {
            Conn::Single(s) => {
                self.timed("unsubscribe", s.subscriber.clone().unsubscribe(channels))
                    .await
            }
            Conn::Cluster(c) => {
                // shard channels of different slots cannot share one SUNSUBSCRIBE
                for channel in channels {
                    self.timed("sunsubscribe", c.subscriber.clone().sunsubscribe(channel))
                        .await?;
                }
                Ok(())
            }
            Conn::Sentinel(s) => self.timed("unsubscribe", s.unsubscribe(channels)).await,
        }
    }

    /// The keys matching `pattern` (a `SCAN MATCH` glob), each once: on the server of
    /// single and master-slave mode, the current master of sentinel mode, and every master of
    /// a cluster (a cluster `SCAN` covers one node). `SCAN`, never `KEYS`, so the servers keep
    /// serving locks while it runs; each step is bounded by `response_timeout`.
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, LockError> {
        let mut keys = std::collections::BTreeSet::new();
        match &self.conn {
            Conn::Single(s) => {
                let con = s.commands.clone();
                self.scan_node("scan", pattern, &mut keys, |cmd| {
                    let mut con = con.clone();
                    async move { cmd.query_async(&mut con).await }
                })
                .await?;
            }
            Conn::Sentinel(s) => {
                let con = s.current().commands.clone();
                let result = self
                    .scan_node("scan", pattern, &mut keys, |cmd| {
                        let mut con = con.clone();
                        async move { cmd.query_async(&mut con).await }
                    })
                    .await;
                s.check(&result);
                result?;
            }
            Conn::Cluster(c) => {
                let random = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                let slots = self
                    .timed(
                        "cluster slots",
                        c.commands
                            .clone()
                            .route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), random),
                    )
                    .await?;
                for (host, port) in cluster::masters(&slots) {
                    let con = c.commands.clone();
                    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    });
                    let what = format!("scan of the cluster master {host}:{port}");
                    self.scan_node(&what, pattern, &mut keys, |cmd| {
                        let (mut con, node) = (con.clone(), node.clone());
                        async move {
                            let reply = con.route_command(cmd, node).await?;
                            Ok(redis::from_redis_value(reply)?)
                        }
                    })
                    .await?;
                }
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// `SCAN` one node to the end through `send` (which sends one `SCAN` step there).
    async fn scan_node<F, Fut>(
        &self,
        what: &str,
        pattern: &str,
        keys: &mut std::collections::BTreeSet<String>,
        mut send: F,
    ) -> Result<(), LockError>
    where
        F: FnMut(redis::Cmd) -> Fut,
        Fut: Future<Output = redis::RedisResult<(u64, Vec<String>)>>,
    {
        let mut cursor = 0u64;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, found) = self.timed(what, send(cmd)).await?;
            keys.extend(found);
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    async fn timed<T>(
        &self,
        what: &str,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        self.timed_until(what, None, call).await
    }

    /// `call`, failed when it has not answered by `deadline` (`None`: within
    /// `response_timeout`).
    async fn timed_until<T>(
        &self,
        what: &str,
        deadline: Option<Instant>,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.response_timeout);
        match tokio::time::timeout_at(deadline.into(), call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(LockError::backend(&format!("redis {what} failed"), e)
                .naming_user(self.username.as_deref())),
            Err(_) => Err(LockError::new(
                ErrorKind::Backend,
                format!(
                    "redis {what} did not answer within {:?} (redis.response_timeout)",
                    self.response_timeout
                ),
            )),
        }
    }
}

/// The user the connections log in as, for messages (`None`: the default user): the configured
/// one, which replaces a user written in the URLs, else the one in the URL (in cluster mode the
/// first seed's, which the cluster client uses for every node). The master that sentinels name
/// is reached with the configured credentials only.
fn login_user(config: &LockConfig) -> Option<String> {
    if let Some(user) = config.username() {
        return Some(user.to_owned());
    }
    let url = match config.topology() {
        Topology::Single { url } => url,
        Topology::MasterSlave { master, .. } => master,
        Topology::Cluster { nodes } => nodes.first()?,
        Topology::Sentinel { .. } => return None,
    };
    single::url_user(url)
}

/// Runs `call` again after errors that say Redis did not run it: a redirect (`MOVED`, `ASK`),
/// a cluster that is not ready (`TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`), a write on a
/// node that was just demoted (`READONLY`: a script fails at its first write), or no connection
/// to send it on. Anything else - above all a connection lost while the call was out - may come
/// after Redis ran it, and a lock script must run at most once per operation: that error goes to
/// the caller (the cluster client's own retries are off, see `cluster.rs`). The caller's
/// `response_timeout` bounds the loop.
async fn not_run_retried<F, Fut, T>(mut call: F) -> redis::RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    let mut pause = Duration::from_millis(10);
    loop {
        match call().await {
            Err(e) if certainly_not_run(&e) => {
                tracing::debug!(error = %e, "redis did not run the call; sending it again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

fn certainly_not_run(e: &redis::RedisError) -> bool {
    use redis::ServerErrorKind as S;
    match e.kind() {
        redis::ErrorKind::Server(
            S::Moved | S::Ask | S::TryAgain | S::ClusterDown | S::MasterDown | S::BusyLoading,
        ) => true,
        redis::ErrorKind::Server(S::ReadOnly) => true,
        redis::ErrorKind::ClusterConnectionNotFound => true,
        _ => e.is_connection_refusal(),
    }
}
