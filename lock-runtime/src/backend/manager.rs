//! A connection manager that also comes back from a refused login.
//!
//! The redis crate's `ConnectionManager` reconnects after I/O errors, but a reconnect that Redis
//! refuses (`WRONGPASS` after a password rotation, a user switched off, `NOAUTH`) leaves it
//! holding that error: every later call gets it again and nothing connects any more, until the
//! process restarts. [`Manager`] puts a new `ConnectionManager` in place after such an error - at
//! most once per backoff step, 50 ms doubling up to 2 s, back to 50 ms once a call goes through -
//! and sends the call again on it (a refused login sent nothing), so a service recovers by
//! itself once Redis accepts its credentials again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, ToRedisArgs, Value};

/// The first pause between two new managers after refused logins.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two new managers.
const LONGEST_PAUSE: Duration = Duration::from_secs(2);

/// A `ConnectionManager` replaced by a new one when Redis refuses its login; cloning shares it.
#[derive(Clone)]
pub(super) struct Manager(Arc<Inner>);

struct Inner {
    client: redis::Client,
    config: ConnectionManagerConfig,
    current: RwLock<ConnectionManager>,
    /// A login was refused since the last call that went through.
    refused: AtomicBool,
    /// When the next new manager may be made, and the pause after that one.
    retry: Mutex<(Instant, Duration)>,
}

impl Manager {
    /// Connects a manager (errors as `ConnectionManager::new_with_config` gives them).
    pub(super) async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Manager> {
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Manager(Arc::new(Inner {
            client,
            config,
            current: RwLock::new(manager),
            refused: AtomicBool::new(false),
            retry: Mutex::new((Instant::now(), FIRST_PAUSE)),
        })))
    }

    /// The manager to send on now.
    fn current(&self) -> ConnectionManager {
        self.0
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Runs `call` on the current manager. After a refused login (the command was not sent),
    /// puts a new manager in place when the backoff allows, and runs `call` once more on it.
    async fn run<T, F, Fut>(&self, call: F) -> RedisResult<T>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let mut result = call(self.current()).await;
        if result.as_ref().is_err_and(login_refused) {
            self.0.refused.store(true, Ordering::Relaxed);
            if self.replace() {
                result = call(self.current()).await;
            }
        }
        if result.is_ok() && self.0.refused.swap(false, Ordering::Relaxed) {
            let mut retry = self.0.retry.lock().unwrap_or_else(|e| e.into_inner());
            retry.1 = FIRST_PAUSE;
        }
        result
    }

    /// Puts a new manager in place unless the backoff says wait; whether it did.
    fn replace(&self) -> bool {
        let now = Instant::now();
        {
            let mut retry = self.0.retry.lock().unwrap_or_else(|e| e.into_inner());
            if now < retry.0 {
                return false;
            }
            *retry = (now + retry.1, (retry.1 * 2).min(LONGEST_PAUSE));
        }
        // lazy: it logs in at its first call, which reports how that went
        let fresh =
            ConnectionManager::new_lazy_with_config(self.0.client.clone(), self.0.config.clone());
        match fresh {
            Ok(fresh) => {
                tracing::debug!("redis refused the login; connecting again");
                *self
                    .0
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a new redis connection");
                false
            }
        }
    }

    /// `SUBSCRIBE` on the current manager (its pushes go to the configured sender).
    pub(super) async fn subscribe(&self, channel: impl ToRedisArgs + Clone) -> RedisResult<()> {
        self.run(|mut con| {
            let channel = channel.clone();
            async move { con.subscribe(channel).await }
        })
        .await
    }

    /// `UNSUBSCRIBE` on the current manager.
    pub(super) async fn unsubscribe(&self, channel: impl ToRedisArgs + Clone) -> RedisResult<()> {
        self.run(|mut con| {
            let channel = channel.clone();
            async move { con.unsubscribe(channel).await }
        })
        .await
    }
}

/// Whether `e` says Redis refused the connection's login (not a command the user may not run:
/// that is `NOPERM`, and a new connection would not change it).
fn login_refused(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
}

impl ConnectionLike for Manager {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.run(move |mut con| async move { con.send_packed_command(cmd).await }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.run(move |mut con| async move {
            con.send_packed_commands(pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        self.current().get_db()
    }
}
