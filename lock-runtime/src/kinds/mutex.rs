//! The mutex: one owner at a time, re-entrant along a call chain, handed to the next waiter of
//! the releasing service on the server. Key layout: the hash `<prefix>{<key>}` (owner field ->
//! the ids of its grants, `:fence` -> the current token), `<lock>:fence` (last token issued),
//! `<lock>:wq` (services waiting), `<lock>:turn` (the service whose turn it is), the channel
//! `<lock>:ch`. Scripts: `scripts/mutex/`.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::engine::{Guard, Kind};
use crate::error::LockError;
use crate::owner::OwnerId;
use crate::service::LockService;

/// Renews or extends mutex holds by grant id.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/mutex/renew.lua")));

/// The mutex as the engine sees it.
pub(crate) static MUTEX: Kind = Kind {
    id: 0,
    noun: "lock",
    mode: crate::inspect::HoldMode::Exclusive,
    busy: "it is held by another owner",
    lua: &[
        include_str!("../scripts/mutex/acquire.lua"),
        include_str!("../scripts/mutex/release.lua"),
    ],
    renew: &RENEW,
    shared: false,
    joint: false,
    reentrant: true,
    leave: None,
    hand_off: true,
};

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
    metric_label: &'static str,
}

impl<'a> LockRequest<'a> {
    /// Try once, without waiting (the try-once / skip pattern): `wait(Duration::ZERO)`.
    pub fn try_once(self) -> Self {
        self.wait(Duration::ZERO)
    }

    pub(crate) fn new(service: &'a LockService, key: String) -> Self {
        LockRequest {
            service,
            key,
            lease: None,
            wait: None,
            owner: None,
            metric_label: crate::metrics::OTHER,
        }
    }

    /// The name the lock has in [metrics](crate::metrics) (the `key` label) and
    /// [events](crate::events): a fixed name for a family of keys, such as `"goods"` for
    /// `goods:<id>` (the attribute uses its key template). Never build it from the key: each
    /// distinct label is a time series of its own. Without it the label is `other`.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService, id: u64) -> Result<(), lock_runtime::LockError> {
    /// let guard = locks.lock(format!("goods:{id}")).metric_label("goods").await?;
    /// # guard.release().await }
    /// ```
    pub fn metric_label(mut self, label: &'static str) -> Self {
        self.metric_label = label;
        self
    }

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
    /// The errors of acquiring (see [`LockService::lock`]), and
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the lock was lost while the body ran:
    /// the body is stopped (dropped) at that moment, as someone else may hold the lock now.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops the body and releases the lock in the background.
    pub async fn run<F, Fut, T>(self, body: F) -> Result<T, LockError>
    where
        F: FnOnce(crate::Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.await?;
        let held = crate::Held::of(&guard.core);
        crate::context::run_body(guard.core, crate::context::OnLost::Fail, body(held)).await
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
        let names = self.service.names(&self.key);
        let acquiring = super::Acquiring::new(self.service, &MUTEX, names, self.owner)
            .with_label(self.metric_label);
        let (lease, wait) = (self.lease, self.wait);
        Box::pin(async move {
            let core = acquiring.run(lease, wait).await?;
            Ok(LockGuard { core })
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
            .field("metric_label", &self.metric_label)
            .finish()
    }
}

/// A held lock.
///
/// Release it with [`release`](Self::release), which reports whether the lock was still held.
/// Dropping the guard releases it too, in the background (the drop never blocks). A guard without
/// a lease is renewed by the service's watchdog until it is released or dropped; renewal stops
/// the moment the guard goes away, so a dropped, panicked or cancelled holder cannot keep a lock
/// alive.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let guard = locks.lock("account:7").await?;
/// let token = guard.fence(); // send it along with the writes the lock protects
/// # let _ = token;
/// tokio::select! {
///     _ = async { /* the critical section */ } => {}
///     why = guard.lost() => return Err(why), // stop: someone else may hold it now
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    pub(crate) core: Guard,
}

impl LockGuard {
    super::guard_methods!("lock");
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("owner", self.owner())
            .field("fence", &self.fence())
            .field("lease", &self.lease())
            .field("lost", &self.is_lost())
            .finish()
    }
}
