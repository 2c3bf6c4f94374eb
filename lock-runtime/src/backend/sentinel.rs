//! Sentinel mode: the master is whatever the sentinels name. A monitor asks them every
//! [`POLL`] (and at once after any failed operation); when they name a new master it checks that
//! the server really is a master, connects, moves the wake-up subscriptions over, swaps it in and
//! wakes every waiter (release messages may have been lost in the switch).
//!
//! Asking `SENTINEL GET-MASTER-ADDR-BY-NAME` of every sentinel and taking the majority answer
//! follows a failover about a second after it starts; the client library's own sentinel
//! support reads `SENTINEL MASTERS` from one sentinel, which can report the old master for
//! seconds.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, PushInfo};
use tokio::sync::Notify;

use super::single::{Single, open, url_user};
use super::{PushSink, probe};
use crate::config::{LockConfig, redacted};
use crate::error::{ErrorKind, LockError};

/// How often the sentinels are asked who the master is.
const POLL: Duration = Duration::from_millis(250);

pub(super) struct Sentinel {
    shared: Arc<Shared>,
}

struct Shared {
    master_name: String,
    /// Each sentinel: its URL as shown, the user its URL logs in as, the connection.
    sentinels: Vec<(String, Option<String>, ConnectionManager)>,
    config: LockConfig,
    push: PushSink,
    current: RwLock<Arc<Master>>,
    channels: Mutex<HashSet<String>>,
    poke: Arc<Notify>,
}

/// The connections to the master in use.
pub(super) struct Master {
    addr: String,
    single: Single,
}

impl Deref for Master {
    type Target = Single;
    fn deref(&self) -> &Single {
        &self.single
    }
}

impl Sentinel {
    pub(super) async fn connect(
        master_name: &str,
        urls: &[String],
        config: &LockConfig,
        push: PushSink,
    ) -> Result<Sentinel, LockError> {
        let query_timeout = config.response_timeout().min(Duration::from_millis(500));
        let mut sentinels = Vec::new();
        for url in urls {
            let info = url.as_str().into_connection_info().map_err(|e| {
                LockError::config(format!(
                    "{}: invalid sentinel URL {}: {e}",
                    config.origin(),
                    redacted(url)
                ))
                .with_source(e)
            })?;
            let client = open(url, info, config)?;
            let manager = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(query_timeout))
                .set_response_timeout(Some(query_timeout))
                .set_number_of_retries(1);
            let con = ConnectionManager::new_lazy_with_config(client, manager)
                .map_err(|e| LockError::backend(&format!("sentinel {}", redacted(url)), e))?;
            sentinels.push((redacted(url), url_user(url), con));
        }
        let first = async {
            // Sentinels that did not answer in time (a slow TLS handshake on a busy machine)
            // are asked again, with twice the time, until one answers or the connect timeout
            // ends it: their answer - an address, or the certificate they were refused for -
            // says more than the silence.
            let mut patience = query_timeout;
            let addr = loop {
                match resolve(&sentinels, master_name, patience).await {
                    Ok(addr) => break addr,
                    Err(Unresolved {
                        timed_out: true, ..
                    }) => {
                        patience = (patience * 2).min(config.connect_timeout());
                    }
                    // no sentinel named a master: perhaps they speak another scheme than
                    // their URLs say
                    Err(Unresolved { error, .. }) if error.kind() == ErrorKind::Backend => {
                        return Err(probe::mismatched_scheme(urls).await.unwrap_or(error));
                    }
                    Err(Unresolved { error, .. }) => return Err(error),
                }
            };
            Master::connect(addr, config, push.clone()).await
        };
        let master = match tokio::time::timeout(config.connect_timeout(), first).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(LockError::new(
                    ErrorKind::Backend,
                    format!(
                        "cannot reach master `{master_name}` through the sentinels within {:?} \
                         (redis.connect_timeout)",
                        config.connect_timeout()
                    ),
                ));
            }
        };
        let shared = Arc::new(Shared {
            master_name: master_name.to_owned(),
            sentinels,
            config: config.clone(),
            push,
            current: RwLock::new(Arc::new(master)),
            channels: Mutex::new(HashSet::new()),
            poke: Arc::new(Notify::new()),
        });
        tokio::spawn(monitor(Arc::downgrade(&shared), shared.poke.clone()));
        Ok(Sentinel { shared })
    }

    /// The master to send commands to now.
    pub(super) fn current(&self) -> Arc<Master> {
        self.shared
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// After a failed operation, look for a new master at once.
    pub(super) fn check<T>(&self, result: &Result<T, LockError>) {
        if result.is_err() {
            self.poke();
        }
    }

    /// Asks the sentinels for the master at once, instead of at the next poll.
    pub(super) fn poke(&self) {
        self.shared.poke.notify_one();
    }

    pub(super) async fn subscribe(&self, channel: &str) -> redis::RedisResult<()> {
        self.shared.lock_channels().insert(channel.to_owned());
        self.current().subscriber.clone().subscribe(channel).await
    }

    pub(super) async fn unsubscribe(&self, channels: &[String]) -> redis::RedisResult<()> {
        {
            let mut subscribed = self.shared.lock_channels();
            for channel in channels {
                subscribed.remove(channel);
            }
        }
        self.current()
            .subscriber
            .clone()
            .unsubscribe(channels)
            .await
    }
}

impl Master {
    /// `host:port` as the sentinels name it.
    pub(super) fn addr(&self) -> &str {
        &self.addr
    }

    async fn connect(
        addr: String,
        config: &LockConfig,
        push: PushSink,
    ) -> Result<Master, LockError> {
        // the sentinels name host:port; TLS to them means TLS to the data nodes too
        let scheme = if config.uses_tls() { "rediss" } else { "redis" };
        let url = format!("{scheme}://{addr}");
        let single = Single::connect(&url, config, push, config.sync_replicas() > 0).await?;
        single
            .ensure_master(&url, config.response_timeout())
            .await?;
        Ok(Master { addr, single })
    }
}

impl Shared {
    fn lock_channels(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Switches to the master at `addr`; on failure keeps the current one (the next poll retries).
    async fn switch(&self, addr: String) -> Result<(), LockError> {
        let master = Master::connect(addr, &self.config, self.push.clone()).await?;
        let channels: Vec<String> = self.lock_channels().iter().cloned().collect();
        if !channels.is_empty() {
            master
                .subscriber
                .clone()
                .subscribe(&channels)
                .await
                .map_err(|e| LockError::backend("resubscribing on the new master failed", e))?;
        }
        let old = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|p| p.into_inner()),
            Arc::new(master),
        );
        tracing::warn!(master = %self.master_name, from = %old.addr, to = %self.current_addr(), "sentinel failover: switched master");
        // messages published around the switch are lost: every head waiter looks again
        (self.push)(PushInfo {
            kind: redis::PushKind::Disconnection,
            data: Vec::new(),
        });
        Ok(())
    }

    fn current_addr(&self) -> String {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .addr
            .clone()
    }
}

/// Follows the sentinels until the service is dropped.
async fn monitor(shared: Weak<Shared>, poke: Arc<Notify>) {
    loop {
        tokio::select! {
            () = poke.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let query_timeout = shared
            .config
            .response_timeout()
            .min(Duration::from_millis(500));
        match resolve(&shared.sentinels, &shared.master_name, query_timeout).await {
            Ok(addr) if addr != shared.current_addr() => {
                if let Err(e) = shared.switch(addr).await {
                    tracing::warn!(error = %e, "sentinels name a new master that is not usable yet");
                }
            }
            Ok(_) => {}
            Err(Unresolved { error, .. }) => {
                tracing::debug!(error = %error, "asking the sentinels failed");
            }
        }
    }
}

/// Why no master address came from the sentinels.
struct Unresolved {
    error: LockError,
    /// No sentinel named a master and some did not answer within the query timeout.
    timed_out: bool,
}

/// The master address most sentinels agree on.
async fn resolve(
    sentinels: &[(String, Option<String>, ConnectionManager)],
    master_name: &str,
    query_timeout: Duration,
) -> Result<String, Unresolved> {
    let mut asks = tokio::task::JoinSet::new();
    for (url, user, con) in sentinels {
        let (mut con, name) = (con.clone(), master_name.to_owned());
        let (url, user) = (url.clone(), user.clone());
        asks.spawn(async move {
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(name);
            let ask = cmd.query_async::<Option<(String, u16)>>(&mut con);
            match tokio::time::timeout(query_timeout, ask).await {
                Ok(Ok(Some((host, port)))) => Ok(format!("{host}:{port}")),
                Ok(Err(e)) => Err(Some((url, user, e))),
                _ => Err(None),
            }
        });
    }
    let answers = asks.join_all().await;
    let mut votes: HashMap<String, usize> = HashMap::new();
    let mut failures = Vec::new();
    let mut timed_out = false;
    for answer in answers {
        match answer {
            Ok(addr) => *votes.entry(addr).or_default() += 1,
            Err(Some(failure)) => failures.push(failure),
            Err(None) => timed_out = true,
        }
    }
    // a certificate or credential mistake says more than "no sentinel knows"
    let mistake = failures.into_iter().find_map(|(url, user, e)| {
        let error = LockError::backend(&format!("cannot ask sentinel {url}"), e)
            .naming_user(user.as_deref());
        matches!(error.kind(), ErrorKind::Tls | ErrorKind::Auth).then_some(error)
    });
    if votes.is_empty()
        && let Some(mistake) = mistake
    {
        return Err(Unresolved {
            error: mistake,
            timed_out: false,
        });
    }
    votes
        .into_iter()
        .max_by_key(|(addr, n)| (*n, std::cmp::Reverse(addr.clone())))
        .map(|(addr, _)| addr)
        .ok_or_else(|| Unresolved {
            error: LockError::new(
                ErrorKind::Backend,
                format!(
                    "no sentinel ({}) knows a master named `{master_name}`",
                    sentinels
                        .iter()
                        .map(|(url, _, _)| url.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            timed_out,
        })
}
