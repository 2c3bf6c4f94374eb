//! [`LockService`]: the handle applications use to take, inspect and break locks.

use std::collections::HashSet;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::config::LockConfig;
use crate::engine::{Inner, KeyNames, owner_field};
use crate::error::{ErrorKind, LockError};
use crate::guard::LockGuard;
use crate::local::Local;
use crate::owner::{self, OwnerId};
use crate::scripts::ScriptCall;
use crate::{notify, scripts, watchdog};

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
    inner: Arc<Inner>,
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
        let ops_script = scripts::ops(
            backend.publish_command(),
            Inner::fence_ttl_ms_of(&config),
            Inner::waiter_horizon_of(&config, None),
        );
        let inner = Arc::new(Inner {
            ops_script,
            backend,
            local: Local::default(),
            config,
            service_id: uuid::Uuid::new_v4().simple().to_string(),
            subscriptions: tokio::sync::Mutex::new(HashSet::new()),
            resubscribing: Default::default(),
            runtime: runtime.clone(),
            batcher: Default::default(),
        });
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
        LockRequest {
            service: self,
            key: key.into(),
            lease: None,
            wait: None,
            owner: None,
        }
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
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let names = self.names(key)?;
        let mut call = ScriptCall::new(&scripts::FORCE_UNLOCK, 2);
        call.key(&names.lock)
            .key(&names.turn())
            .arg(names.channel())
            .arg(self.inner.backend.publish_command());
        let removed: i64 = self.inner.backend.run("force_unlock", &call).await?;
        if removed == 1 {
            tracing::warn!(key = %names.user, "lock force-unlocked");
            self.inner.local.mark_lost(&names.lock);
        }
        Ok(removed == 1)
    }

    /// The state of the lock `key` on Redis: holder, hold count, remaining lease, fencing
    /// tokens and how many services wait for it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) or [`ErrorKind::Backend`](crate::ErrorKind::Backend).
    pub async fn inspect(&self, key: &str) -> Result<LockInfo, LockError> {
        let names = self.names(key)?;
        let mut call = ScriptCall::new(&scripts::INSPECT, 3);
        call.key(&names.lock)
            .key(&names.fence())
            .key(&names.queue());
        type Reply = (Vec<(String, String)>, i64, i64, i64);
        let (fields, ttl, last, waiting): Reply = self.inner.backend.run("inspect", &call).await?;
        let mut info = LockInfo {
            key: key.to_owned(),
            holder: None,
            hold_count: 0,
            ttl: u64::try_from(ttl).ok().map(Duration::from_millis),
            fence: None,
            last_fence: u64::try_from(last).ok(),
            waiting_services: u32::try_from(waiting).unwrap_or(0),
            local_waiters: self.inner.local.waiter_count(&names.lock),
        };
        for (field, value) in fields {
            if field == scripts::FENCE_FIELD {
                info.fence = value.parse().ok();
            } else {
                info.holder = Some(field);
                // one grant id per process holding it; re-entries are counted by that process
                info.hold_count = u32::try_from(value.split_whitespace().count()).unwrap_or(0);
                if let Some(local) = self.inner.local.guards_of(&names.lock, &value) {
                    info.hold_count += local.saturating_sub(1);
                }
            }
        }
        Ok(info)
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

    fn names(&self, key: &str) -> Result<KeyNames, LockError> {
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

/// A request for a lock, built by [`LockService::lock`]; awaiting it acquires the lock.
///
/// # Cancel safety
/// Dropping the future at any point never leaves the lock held past its lease: a grant that
/// arrives after the future was dropped is released at once.
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockRequest<'a> {
    service: &'a LockService,
    key: String,
    lease: Option<Duration>,
    wait: Option<Duration>,
    owner: Option<OwnerId>,
}

impl LockRequest<'_> {
    /// Hold the lock for at most `lease`: it expires then even if this process dies or forgets
    /// to release it. Without a lease the watchdog keeps the lock (with `watchdog_timeout`)
    /// until it is released.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Give up with [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) when the lock could not be acquired within `wait`.
    /// Without it the request waits until it acquires the lock; `Duration::ZERO` tries once.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Wait at most `wait` when it is `Some`, until acquired when it is `None`.
    pub fn wait_at_most(mut self, wait: Option<Duration>) -> Self {
        self.wait = wait;
        self
    }

    /// Acquires the lock, runs the future `body` returns as a locked body, and releases the lock
    /// after it: lock calls inside the body (however deep, also `#[distributed_lock]` fns)
    /// re-enter this hold. `body` gets the [`Held`](crate::Held) lock: its key and fencing
    /// token.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// # async fn send_report(fence: u64) -> u32 { 0 }
    /// use std::time::Duration;
    ///
    /// let sent = locks
    ///     .lock("job:nightly-report")
    ///     .wait(Duration::ZERO) // another instance runs it: skip
    ///     .run(|held| async move { send_report(held.fence()).await })
    ///     .await?;
    /// # let _ = sent; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The errors of acquiring (see [`LockService::lock`]), and [`ErrorKind::Lost`] when the
    /// lock was lost while the body ran: the body is stopped (dropped) at that moment, as
    /// someone else may hold the lock now.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops the body and releases the lock in the background.
    pub async fn run<F, Fut, T>(self, body: F) -> Result<T, LockError>
    where
        F: FnOnce(crate::Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.await?;
        let held = crate::Held::of(&guard);
        crate::context::run_body(guard, crate::context::OnLost::Fail, body(held)).await
    }

    /// Acquire as `owner`: the lock re-enters that owner's holds, wherever they are (see
    /// [`owner`](crate::owner#explicit-owners)), instead of following the call chain.
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }
}

impl<'a> IntoFuture for LockRequest<'a> {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let inner = self.service.inner.clone();
        let names = self.service.names(&self.key);
        let resolved = match (self.owner, &names) {
            (Some(owner), _) => owner::Resolved::Owner(owner),
            (None, Ok(names)) => owner::resolve(self.service.id(), &names.lock),
            (None, Err(_)) => owner::Resolved::AcrossSpawn, // not used: the key error comes first
        };
        let (lease, wait) = (self.lease, self.wait);
        Box::pin(async move {
            let names = names?;
            Inner::check_lease(&names, lease)?;
            match resolved {
                owner::Resolved::Owner(owner) => inner.acquire(names, owner, lease, wait).await,
                owner::Resolved::ReEnter { owner, entry } => {
                    // concurrent children of the holding body re-enter one at a time
                    let started = std::time::Instant::now();
                    let entered = match wait {
                        Some(wait) => tokio::time::timeout(wait, entry.lock_owned())
                            .await
                            .map_err(|_| inner.timeout_error(&names, wait))?,
                        None => entry.lock_owned().await,
                    };
                    let left = wait.map(|w| w.saturating_sub(started.elapsed()));
                    let mut guard = inner.acquire(names, owner, lease, left).await?;
                    guard.hold_entry(entered);
                    Ok(guard)
                }
                owner::Resolved::AcrossSpawn => Err(LockError::new(
                    ErrorKind::WouldDeadlock,
                    format!(
                        "lock `{}` is held further up this call chain, by the task that spawned \
                         this one (owner::spawn); waiting for it here would wait for that task, \
                         which may be waiting for this one. Re-entry follows one call chain: do \
                         the locked work in the holding task, or use another key",
                        names.user
                    ),
                )
                .with_key(&names.user)),
            }
        })
    }
}

impl fmt::Debug for LockRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRequest")
            .field("key", &self.key)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("owner", &self.owner)
            .finish()
    }
}

/// The state of one lock on Redis, from [`LockService::inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as asked for.
    pub key: String,
    /// The holder as stored on Redis (`<process instance>:<owner id>`; under the web
    /// middleware the owner id is `<request id>#<n>`), `None` when free.
    pub holder: Option<String>,
    /// How many times the holder holds it, 0 when free: its grants on Redis (one per process
    /// holding it) plus, when the holder is in this service, its re-entries here.
    pub hold_count: u32,
    /// The remaining lease, `None` when free.
    pub ttl: Option<Duration>,
    /// The fencing token of the current grant, `None` when free.
    pub fence: Option<u64>,
    /// The last fencing token issued for this key, `None` when none ever was.
    pub last_fence: Option<u64>,
    /// How many services (processes) have waiters registered for this key.
    pub waiting_services: u32,
    /// How many callers of this service wait in line for this key right now.
    pub local_waiters: usize,
}
