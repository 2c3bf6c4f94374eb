//! [`LockService`]: the handle applications use to take, inspect and break locks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::config::LockConfig;
use crate::engine::{Inner, KeyNames, notify, owner_field, watchdog};
use crate::error::LockError;
use crate::inspect::{Holder, LockKind};
use crate::kinds::mutex::LockRequest;
use crate::owner;

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
    pub(crate) inner: Arc<Inner>,
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
    pub async fn connect(config: LockConfig) -> Result<LockService, LockError> {
        config.validate()?;
        let (push_tx, push_rx) = tokio::sync::mpsc::unbounded_channel();
        let backend = Backend::connect(&config, push_tx).await?;
        let runtime = tokio::runtime::Handle::current();
        let period = config.watchdog_timeout() / 3;
        let inner = Arc::new(Inner::new(backend, config, runtime.clone()));
        runtime.spawn(watchdog::run(Arc::downgrade(&inner), period));
        runtime.spawn(notify::run(Arc::downgrade(&inner), push_rx));
        Ok(LockService { inner })
    }

    /// Starts a request for the lock `key`; await it to acquire.
    ///
    /// It re-enters a hold of an enclosing locked body of this call chain, or acts as the
    /// explicit owner of an [`owner::scope`]; otherwise it is a new owner (see [`owner`]). See
    /// [`LockRequest`] for the options.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        LockRequest::new(self, key.into())
    }

    /// Starts a request for a read (shared) hold of the read-write lock `key`: many readers at
    /// once, no writer meanwhile. A waiting writer stops new readers (writers do not starve); a
    /// read inside a write body of the same call chain (or owner) is granted at once
    /// (downgrade). See [`ReadGuard`](crate::ReadGuard).
    ///
    /// A read-write lock `key` is not the mutex `key`: they live under different Redis keys.
    pub fn read(&self, key: impl Into<String>) -> crate::ReadRequest<'_> {
        crate::ReadRequest::read(self, key.into())
    }

    /// Starts a request for the write (exclusive) hold of the read-write lock `key`: no other
    /// writer and no reader meanwhile; fenced. An owner that holds `key` for reading gets
    /// [`ErrorKind::WouldDeadlock`](crate::ErrorKind::WouldDeadlock) at once (an upgrade would
    /// wait for itself). See [`WriteGuard`](crate::WriteGuard).
    pub fn write(&self, key: impl Into<String>) -> crate::WriteRequest<'_> {
        crate::WriteRequest::write(self, key.into())
    }

    /// Starts a request for every lock in `keys` at once (all or nothing; see
    /// [`MultiRequest`](crate::MultiRequest)), e.g. both accounts of a transfer.
    pub fn lock_all<I>(&self, keys: I) -> crate::MultiRequest<'_>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        crate::MultiRequest::new(self, keys.into_iter().map(Into::into).collect())
    }

    /// The semaphore `name` with `permits` permits cluster-wide (see
    /// [`Semaphore`](crate::Semaphore)).
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> crate::Semaphore {
        crate::Semaphore::new(self.clone(), name.into(), permits)
    }

    /// Tries once, without waiting: `lock(key).wait(Duration::ZERO)`.
    pub fn try_lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        self.lock(key).wait(Duration::ZERO)
    }

    /// Whether anyone holds `key`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        Ok(self.inspect(key).await?.holder.is_some())
    }

    /// Removes the lock `key` whoever holds it, and wakes its waiters. Returns whether a lock
    /// was removed. Holders learn it at their next renewal (`LockGuard::lost`); their release
    /// then fails with [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld).
    /// [`force_unlock_kind`](Self::force_unlock_kind) does it for every kind and says what it
    /// removed.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
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
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<crate::LockEvent> {
        self.inner.events.subscribe()
    }

    /// The state of the lock `key` on Redis: holder, hold count, remaining lease, fencing
    /// tokens and how many services wait for it. This is the mutex `key`;
    /// [`inspect_kind`](Self::inspect_kind) looks at a lock of any kind and
    /// [`list`](Self::list) finds them.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    pub async fn inspect(&self, key: &str) -> Result<LockInfo, LockError> {
        self.inspect_kind(LockKind::Mutex, key).await
    }

    /// Whether the current owner (see [`owner`]) holds `key`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    pub async fn is_held_by_current(&self, key: &str) -> Result<bool, LockError> {
        let names = self.names(key)?;
        let Some(owner) = owner::enclosing(self.id(), &names.lock) else {
            return Ok(false);
        };
        let holder = self.inspect(key).await?.holder;
        Ok(holder.as_deref() == Some(&*owner_field(&owner)))
    }

    /// The configuration the service runs with.
    pub fn config(&self) -> &LockConfig {
        &self.inner.config
    }

    /// Identifies the service among the lock domains of a call chain.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    pub(crate) fn names(&self, key: &str) -> Result<KeyNames, LockError> {
        KeyNames::new(self.inner.config.prefix(), key).map_err(|e| e.with_key(key))
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

/// The state of one lock on Redis, from [`LockService::inspect`],
/// [`inspect_kind`](LockService::inspect_kind), [`list`](LockService::list) or
/// [`force_unlock_kind`](LockService::force_unlock_kind).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as asked for (the semaphore's name for a semaphore).
    pub key: String,
    /// The kind of lock.
    pub kind: LockKind,
    /// The lock's key on Redis, e.g. `lock:{goods:42}` or `lock:rw:{catalog:7}`.
    pub redis_key: String,
    /// Who holds it: the owner of a mutex; a read-write lock's writer or readers (the writer
    /// first); a semaphore's grants. Empty when free.
    pub holders: Vec<Holder>,
    /// The holder as stored on Redis (`<process instance>:<owner id>`; under the web
    /// middleware the owner id is `<request id>#<n>`), `None` when free. For a read-write lock
    /// or a semaphore, the first of [`holders`](Self::holders).
    pub holder: Option<String>,
    /// How many times the holder holds it, 0 when free: its grants on Redis (one per process
    /// holding it) plus, when the holder is in this service, its re-entries here. For a
    /// read-write lock or a semaphore, the sum over [`holders`](Self::holders).
    pub hold_count: u32,
    /// The remaining lease, `None` when free (a read-write lock or semaphore: its longest
    /// hold's; each holder's is in [`Holder::lease_left`]).
    pub ttl: Option<Duration>,
    /// The fencing token of the current grant (a read-write lock's: of its write hold),
    /// `None` when free (and for a semaphore, whose grants each got one of their own).
    pub fence: Option<u64>,
    /// The last fencing token issued for this key, `None` when none ever was.
    pub last_fence: Option<u64>,
    /// How many permits a semaphore has (the count its latest acquirer passed); `None` for
    /// the other kinds.
    pub permits: Option<u32>,
    /// How many services (processes) have waiters registered for this key.
    pub waiting_services: u32,
    /// How many callers of this service wait in line for this key right now.
    pub local_waiters: usize,
}

impl LockInfo {
    pub(crate) fn empty(kind: LockKind, key: &str, redis_key: &str) -> LockInfo {
        LockInfo {
            key: key.to_owned(),
            kind,
            redis_key: redis_key.to_owned(),
            holders: Vec::new(),
            holder: None,
            hold_count: 0,
            ttl: None,
            fence: None,
            last_fence: None,
            permits: None,
            waiting_services: 0,
            local_waiters: 0,
        }
    }

    /// Whether anyone holds it.
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }
}
