//! One async surface over the Redis topologies: run a script, subscribe to wake-up channels.
//!
//! Every operation carries our own timeout (`redis.response_timeout`), because the client's
//! reconnect logic can otherwise make a call wait out its whole retry budget.

mod single;

use std::future::Future;
use std::time::Duration;

use redis::{FromRedisValue, PushInfo, ScriptInvocation};
use tokio::sync::mpsc::UnboundedSender;

use crate::config::{LockConfig, Topology};
use crate::error::{ErrorKind, LockError};

/// Connections of one service: commands and the shared subscriber.
pub(crate) struct Backend {
    conn: Conn,
    response_timeout: Duration,
}

enum Conn {
    Single(single::Single),
}

impl Backend {
    /// Connects within `connect_timeout`; pushes (wake-up messages, disconnections) go to `push`.
    pub(crate) async fn connect(
        config: &LockConfig,
        push: UnboundedSender<PushInfo>,
    ) -> Result<Backend, LockError> {
        let conn = match config.topology() {
            Topology::Single { url } => {
                Conn::Single(single::Single::connect(url, config, push).await?)
            }
            other => {
                return Err(LockError::config(format!(
                    "{}: `redis.mode` = \"{}\" is parsed but not yet supported by this version; \
                     use mode = \"single\"",
                    config.origin(),
                    other.mode()
                )));
            }
        };
        Ok(Backend {
            conn,
            response_timeout: config.response_timeout(),
        })
    }

    /// The command that publishes on a wake-up channel from inside a script.
    pub(crate) fn publish_command(&self) -> &'static str {
        match self.conn {
            Conn::Single(_) => "publish",
        }
    }

    /// Runs a script and converts its reply; `what` names the operation in errors.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        what: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        match &self.conn {
            Conn::Single(s) => {
                let mut con = s.commands.clone();
                self.timed(what, invocation.invoke_async(&mut con)).await
            }
        }
    }

    /// Subscribes the shared subscriber connection to `channel`; returns once Redis confirmed.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<(), LockError> {
        match &self.conn {
            Conn::Single(s) => {
                let mut con = s.subscriber.clone();
                self.timed("subscribe", con.subscribe(channel)).await
            }
        }
    }

    /// Unsubscribes the shared subscriber connection from `channels`.
    pub(crate) async fn unsubscribe(&self, channels: &[String]) -> Result<(), LockError> {
        match &self.conn {
            Conn::Single(s) => {
                let mut con = s.subscriber.clone();
                self.timed("unsubscribe", con.unsubscribe(channels)).await
            }
        }
    }

    async fn timed<T>(
        &self,
        what: &str,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.response_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(LockError::backend(&format!("redis {what} failed"), e)),
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
