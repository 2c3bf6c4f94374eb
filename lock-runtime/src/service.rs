//! [`LockService`]: the handle applications use to take, inspect and break locks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::config::LockConfig;
use crate::engine::{Engine, notify, presence, watchdog};
use crate::error::LockError;
use crate::events::LockEvent;
use crate::inspect::{self, LockInfo};
use crate::kinds::multi::MultiRequest;
use crate::kinds::mutex::{self, LockRequest};
use crate::kinds::rw::{ReadRequest, WriteRequest};
use crate::kinds::semaphore::Semaphore;
use crate::kinds::{self, layout};
use crate::nodes::RedisNodes;
use crate::owner;
use crate::vocab::LockKind;

/// A connection to Redis that hands out distributed locks.
///
/// Cheap to clone (all clones share one set of connections, one watchdog and one subscriber);
/// `Send + Sync`. Background tasks stop when the last clone is dropped.
///
/// ```no_run
/// use lock_runtime::{LockConfig, LockService};
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// let locks = LockService::connect(LockConfig::single("redis://127.0.0.1:6379")).await?;
/// let guard = locks
///     .lock("goods:42")
///     .lease(Duration::from_secs(5)) // without: the watchdog renews it until released
///     .wait(Duration::from_secs(2)) // without: wait until acquired
///     .await?;
/// println!("fencing token {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockService {
    pub(crate) inner: Arc<Engine>,
}

impl LockService {
    /// Connects to the topology in `config` and starts the service's watchdog and subscriber.
    ///
    /// The connections and background tasks run on the tokio runtime this is called on: lock
    /// calls can be made from any runtime, but the service stops working when that runtime
    /// shuts down. (The global service of [`init`](crate::init) runs on a thread of its own.)
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for an invalid configuration; [`ErrorKind::Backend`](crate::ErrorKind::Backend) when Redis
    /// cannot be reached within `connect_timeout`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::{LockConfig, LockService};
    ///
    /// let locks = LockService::connect(LockConfig::from_file("lock.toml")?).await?;
    /// # let _ = locks;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: LockConfig) -> Result<LockService, LockError> {
        config.validate()?;
        let (push_tx, push_rx) = tokio::sync::mpsc::unbounded_channel();
        let engine = Arc::new(std::sync::OnceLock::new());
        let backend = Backend::connect(&config, notify::sink(engine.clone(), push_tx)).await?;
        let runtime = tokio::runtime::Handle::current();
        let period = config.watchdog_timeout() / 3;
        let inner = Arc::new(Engine::new(
            backend,
            config,
            runtime.clone(),
            &crate::kinds::mutex::MUTEX,
        ));
        let _ = engine.set(Arc::downgrade(&inner));
        runtime.spawn(watchdog::run(Arc::downgrade(&inner), period));
        runtime.spawn(notify::run(Arc::downgrade(&inner), push_rx));
        runtime.spawn(presence::run(Arc::downgrade(&inner)));
        Ok(LockService { inner })
    }

    /// Starts a request for the lock `key`; await it to acquire.
    ///
    /// It re-enters a hold of an enclosing locked body of this call chain, or acts as the
    /// explicit owner of an [`owner::scope`]; otherwise it is a new owner (see [`owner`]). See
    /// [`LockRequest`] for the options.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let guard = locks.lock("goods:42").wait(Duration::from_secs(2)).await?;
    /// // ... the critical section; guard.fence() for the writes ...
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        LockRequest::new(&self.inner, key.into())
    }

    /// Starts a request for a read (shared) hold of the read-write lock `key`: many readers at
    /// once, no writer meanwhile. A waiting writer stops new readers (writers do not starve); a
    /// read inside a write body of the same call chain (or owner) is granted at once
    /// (downgrade). See [`ReadGuard`](crate::ReadGuard).
    ///
    /// A read-write lock `key` is not the mutex `key`: they live under different Redis keys.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let read = locks.read("catalog:7").await?; // alongside other readers
    /// // ... read the catalog ...
    /// read.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn read(&self, key: impl Into<String>) -> ReadRequest<'_> {
        ReadRequest::read(&self.inner, key.into())
    }

    /// Starts a request for the write (exclusive) hold of the read-write lock `key`: no other
    /// writer and no reader meanwhile; fenced. An owner that holds `key` for reading gets
    /// [`ErrorKind::WouldDeadlock`](crate::ErrorKind::WouldDeadlock) at once (an upgrade would
    /// wait for itself). See [`WriteGuard`](crate::WriteGuard).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let write = locks.write("catalog:7").lease(Duration::from_secs(30)).await?;
    /// // ... change the catalog; write.fence() for fenced writes ...
    /// write.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn write(&self, key: impl Into<String>) -> WriteRequest<'_> {
        WriteRequest::write(&self.inner, key.into())
    }

    /// Starts a request for every lock in `keys` at once (all or nothing; see
    /// [`MultiRequest`](crate::MultiRequest)), e.g. both accounts of a transfer.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let both = locks
    ///     .lock_all(["account:1", "account:2"]) // in any order: no deadlock
    ///     .wait(Duration::from_secs(2))
    ///     .await?;
    /// // ... move money between the two accounts ...
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all<I>(&self, keys: I) -> MultiRequest<'_>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        MultiRequest::new(&self.inner, keys.into_iter().map(Into::into).collect())
    }

    /// The semaphore `name` with `permits` permits cluster-wide (see
    /// [`Semaphore`](crate::Semaphore)).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let renders = locks.semaphore("pdf-render", 4); // 4 at once, cluster-wide
    /// let permit = renders.acquire().lease(Duration::from_secs(60)).await?;
    /// // ... render ...
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Semaphore {
        Semaphore::new(self.inner.clone(), name.into(), permits)
    }

    /// Tries once, without waiting: `lock(key).wait(Duration::ZERO)`.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// match locks.try_lock("job:nightly").await {
    ///     Ok(guard) => guard.release().await?, // ran the job
    ///     Err(e) if e.is_timeout() => {}       // another instance runs it
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        self.lock(key).wait(Duration::ZERO)
    }

    /// Whether the mutex `key` is taken: held by anyone, or kept after a release because of
    /// its minimum hold ([`LockRequest::hold_at_least`](crate::LockRequest::hold_at_least)).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// if locks.is_locked("goods:42").await? {
    ///     println!("someone is buying goods 42");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let info = inspect::holds(&self.inner, &mutex::LAYOUT, key).await?;
        Ok(info.holder.is_some() || info.kept.is_some())
    }

    /// Removes the lock `key` whoever holds it, and wakes its waiters. Returns whether a lock
    /// was removed. Holders learn it at their next renewal (`LockGuard::lost`); their release
    /// then fails with [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld).
    /// [`force_unlock_kind`](Self::force_unlock_kind) does it for every kind and says what it
    /// removed.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// // an operator's action: the holder's next renewal finds the lock gone
    /// let removed = locks.force_unlock("goods:42").await?;
    /// # let _ = removed;
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        Ok(self
            .force_unlock_kind(LockKind::Mutex, key)
            .await?
            .is_some())
    }

    /// A receiver of what happens to this service's locks from now on: renewals, failed
    /// renewals, holds lost (with the reason) and force-unlocks (see [`events`](crate::events)).
    ///
    /// Every receiver gets every event (a broadcast channel); one that falls more than
    /// [`CAPACITY`](crate::events::CAPACITY) events behind loses the oldest and is told how
    /// many. Dropping it unsubscribes. The events of a single hold are easiest had from its
    /// guard: `lost()` resolves when it is lost.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) {
    /// use lock_runtime::LockEvent;
    ///
    /// let mut events = locks.events();
    /// while let Ok(event) = events.recv().await {
    ///     if let LockEvent::Lost { key, reason, .. } = &event {
    ///         eprintln!("lock {key} lost: {reason}");
    ///     }
    /// }
    /// # }
    /// ```
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<LockEvent> {
        self.inner.events.subscribe()
    }

    /// The state of the lock `key` on Redis: holder, hold count, remaining lease, fencing
    /// tokens and how many services wait for it. This is the mutex `key`;
    /// [`inspect_kind`](Self::inspect_kind) looks at a lock of any kind and
    /// [`list`](Self::list) finds them.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let info = locks.inspect("goods:42").await?;
    /// println!("held by {:?}, {} time(s), {:?} left", info.holder, info.hold_count, info.ttl);
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<LockInfo, LockError> {
        self.inspect_kind(LockKind::Mutex, key).await
    }

    /// Whether the current owner (see [`owner`]) holds `key`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    pub async fn is_held_by_current(&self, key: &str) -> Result<bool, LockError> {
        let names = self.inner.names(mutex::LAYOUT.namespace, key)?;
        let Some(owner) = owner::enclosing(self.inner.id(), &names.lock) else {
            return Ok(false);
        };
        let holder = inspect::holds(&self.inner, &mutex::LAYOUT, key)
            .await?
            .holder;
        Ok(holder.as_deref() == Some(&*self.inner.owner_field(&owner)))
    }

    /// The configuration the service runs with.
    pub fn config(&self) -> &LockConfig {
        &self.inner.config
    }

    /// Ends the service gracefully, for a clean exit: call it when the process stops (after
    /// the server stopped taking requests), so that its locks do not stay held on Redis until
    /// their leases run out.
    ///
    /// From the first call on, every clone of the service refuses new acquires with
    /// [`ErrorKind::ShuttingDown`](crate::ErrorKind::ShuttingDown), and waits under way end
    /// with it. Every hold and permit of the service is released on Redis (one script call per
    /// kind, all at once; waiters elsewhere are woken), releases already on their way (of
    /// guards released or dropped a moment before) are waited for, and the watchdog and the
    /// subscriber stop. The guards of those holds are no longer valid: their `lost()` resolves (saying the
    /// service shut down), and their release or drop does not touch Redis again (`release()`
    /// returns `Ok`). A second call returns at once.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) {
    /// // after the server's graceful shutdown finished:
    /// if let Err(e) = locks.shutdown().await {
    ///     eprintln!("some locks were not released, they expire with their leases: {e}");
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) when Redis did not confirm every
    /// release within `response_timeout` (the service is shut down all the same; what was not
    /// released expires with its lease).
    pub async fn shutdown(&self) -> Result<(), LockError> {
        self.inner.shut_down().await
    }

    /// Whether [`shutdown`](Self::shutdown) was called on this service (or a clone).
    pub fn is_shut_down(&self) -> bool {
        self.inner.is_closing()
    }
}

/// Operators' methods: what is held, by whom, and breaking a lock whoever holds it (see
/// [`inspect`](crate::inspect)); the Redis servers and their health ([`nodes`](Self::nodes)).
impl LockService {
    /// The latest `limit` entries of the journal, newest first: the force-unlocks and the holds
    /// lost while held that any service of this prefix recorded (about the last 500; the
    /// journal, one Redis stream `<prefix>journal`, expires a week after its last entry).
    /// A hold released or run out is not journaled (it happens all the time); `lockctl` tells
    /// those apart by watching.
    ///
    /// # Errors
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) when Redis failed or did not answer
    /// within `response_timeout`.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// for entry in locks.journal(10).await? {
    ///     println!("{} {} by {:?}", entry.what, entry.key, entry.instance_name);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn journal(&self, limit: usize) -> Result<Vec<crate::JournalEntry>, LockError> {
        presence::journal(&self.inner, limit).await
    }

    /// The locks of every kind held now under this service's prefix whose key matches the glob
    /// `pattern` (`*` any text, `?` one character, `[abc]` one of; `None`: all), sorted by key
    /// and kind, each as [`inspect_kind`](Self::inspect_kind) gives it.
    ///
    /// The keys are found with `SCAN` (never `KEYS`, which blocks Redis) on the master, and on
    /// every master of a cluster, then inspected one by one: a lock taken or released meanwhile
    /// may be missing or shown as it was a moment ago. Auxiliary keys (fence counters, waiting
    /// sets, turn markers) are skipped, and so are locks whose holds all ran out; a mutex kept
    /// after its release for its minimum hold is listed, with [`LockInfo::kept`] set.
    ///
    /// # Errors
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) when Redis failed or did not answer within `response_timeout`.
    pub async fn list(&self, pattern: Option<&str>) -> Result<Vec<LockInfo>, LockError> {
        inspect::list(&self.inner, &kinds::layouts(), pattern).await
    }

    /// The state of the lock `key` of `kind` on Redis: its holders (with their request ids and
    /// leases), fencing tokens and waiting services. A lock nobody holds has no holders.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    pub async fn inspect_kind(&self, kind: LockKind, key: &str) -> Result<LockInfo, LockError> {
        inspect::inspect(&self.inner, layout(kind), key).await
    }

    /// Removes the lock `key` of `kind` whoever holds it, and wakes its waiters; returns the
    /// lock as it was removed (its holders, leases and fencing token, read in the same script;
    /// `last_fence` and the waiters are not read), or `None` when nobody held it.
    ///
    /// Every holder loses it: a holder in this service learns it at once (`lost()` fires), one
    /// elsewhere at its next renewal, or at its validity deadline. Their releases then fail
    /// with [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) and never touch a newer grant. The fence counters stay, so
    /// tokens keep increasing. [`force_unlock`](Self::force_unlock) is this for a mutex.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    pub async fn force_unlock_kind(
        &self,
        kind: LockKind,
        key: &str,
    ) -> Result<Option<LockInfo>, LockError> {
        inspect::force_unlock(&self.inner, layout(kind), key).await
    }

    /// The Redis servers this service uses, each with its role and whether it answers now: the
    /// topology for an operator's console.
    ///
    /// | mode | nodes |
    /// |---|---|
    /// | `single` | the server (a master, or a replica if the URL names one: then it is unhealthy, locks cannot be written there), and the replicas its `ROLE` reply lists as linked |
    /// | `master-slave` | the master, then each configured replica, asked on a connection of its own (its link to the master, and how many bytes it is behind) |
    /// | `sentinel` | the master the sentinels name now and the replicas its `ROLE` reply lists, then each configured sentinel (`PING` on a connection of its own) |
    /// | `cluster` | every node `CLUSTER NODES` lists (asked of every node at once; the first answer is used), with the flags `fail`, `fail?` (`pfail`), `handshake`, `noaddr` and a disconnected cluster link |
    ///
    /// Every probe, connecting included, ends after `response_timeout`, and they all run at
    /// once, so a call takes about one `response_timeout` at most. A server that does not answer
    /// is listed as unhealthy with the reason in [`NodeStatus::detail`](crate::NodeStatus::detail)
    /// (`"not reachable: ..."`); a replica that is not linked to its master any more is
    /// not listed by its master (single and sentinel mode) until it is back. See
    /// [`NodeStatus`](crate::NodeStatus) for what healthy means.
    ///
    /// # Errors
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) only when no server answered at all
    /// (the message names each one with its reason): the server of single mode, neither the
    /// master nor a replica of master-slave mode, neither the master nor a sentinel of sentinel
    /// mode, no node of a cluster.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let topology = locks.nodes().await?;
    /// println!("redis ({})", topology.mode);
    /// for node in &topology.nodes {
    ///     let state = if node.healthy { "ok" } else { "DOWN" };
    ///     let latency = node.latency.map(|l| format!("{l:?}")).unwrap_or_default();
    ///     let detail = node.detail.as_deref().unwrap_or("");
    ///     println!("  {:<8} {:<22} {state:<4} {latency:>10} {detail}", node.role, node.address);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn nodes(&self) -> Result<RedisNodes, LockError> {
        self.inner.backend.nodes(&self.inner.config).await
    }

    /// The Redis key of the lock `key` of `kind` under this service's prefix, e.g.
    /// `lock:rw:{catalog:7}`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) for an empty key.
    pub fn redis_key(&self, kind: LockKind, key: &str) -> Result<String, LockError> {
        Ok(self
            .inner
            .names(layout(kind).namespace, key)?
            .lock
            .to_string())
    }

    /// The Redis key of the fencing-token counter serving the lock `key` of `kind`: on Redis
    /// Cluster one counter per cluster slot (`lock:fence:{<n>}`), shared by every lock of that
    /// slot; on one server (single, master-slave, Sentinel) one counter for every lock (slot
    /// 0's name, `lock:fence:{3560}`). Counters never expire; the value is the last token
    /// issued from it. A compatibility contract: deleting it makes the next tokens come from
    /// the server clock alone.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) for an empty key.
    pub fn fence_key(&self, kind: LockKind, key: &str) -> Result<String, LockError> {
        let names = self.inner.names(layout(kind).namespace, key)?;
        Ok(self.inner.fence_counter(&names))
    }

    /// The kind and key of a Redis key of a lock under this service's prefix (the reverse of
    /// [`redis_key`](Self::redis_key)); `None` for any other key, such as a fence counter.
    pub fn parse_redis_key(&self, redis_key: &str) -> Option<(LockKind, String)> {
        inspect::parse_redis_key(self.config().prefix(), &kinds::layouts(), redis_key)
            .map(|(layout, key)| (layout.kind, key))
    }
}

impl fmt::Debug for LockService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("topology", &self.inner.config.topology().mode())
            .field("prefix", &self.inner.config.prefix())
            .finish_non_exhaustive()
    }
}
