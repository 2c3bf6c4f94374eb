//! [`LockGuard`]: proof of holding a lock, with its fencing token.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::engine::{Inner, KeyNames, Released};
use crate::error::{ErrorKind, LockError};
use crate::local::OwnerField;
use crate::owner::OwnerId;

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
    inner: Arc<Inner>,
    names: KeyNames,
    owner: OwnerId,
    field: OwnerField,
    fence: u64,
    lease: Option<Duration>,
    /// For a fixed lease: when it runs out at the latest, measured from before the grant.
    expires: Option<Instant>,
    lost: CancellationToken,
    acquired: Instant,
    released: bool,
}

impl LockGuard {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        inner: Arc<Inner>,
        names: KeyNames,
        owner: OwnerId,
        field: OwnerField,
        fence: u64,
        lease: Option<Duration>,
        lost: CancellationToken,
        since: Instant,
    ) -> Self {
        LockGuard {
            expires: lease.map(|l| since + l),
            inner,
            names,
            owner,
            field,
            fence,
            lease,
            lost,
            acquired: Instant::now(),
            released: false,
        }
    }

    /// The lock key as it was asked for.
    pub fn key(&self) -> &str {
        &self.names.user
    }

    /// The fencing token of this grant: it strictly increases for a key with every new grant
    /// (also after expiry, release and force-unlock), and re-entry returns the holder's current
    /// one. Store it with the data the lock protects and reject writes that carry an older token.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The owner holding the lock.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The fixed lease, or `None` when the watchdog renews the lock.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// Whether the lock is known to be lost: the watchdog found it gone (or could not renew it
    /// for a whole lease), it was force-unlocked from this service, or the fixed lease ran out.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.expires.is_some_and(|e| Instant::now() >= e)
    }

    /// Resolves when the lock is lost (see [`is_lost`](Self::is_lost)), with an error of kind
    /// [`ErrorKind::Lost`] that says why. Never resolves while the lock is held.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing.
    pub async fn lost(&self) -> LockError {
        let why = match self.expires {
            Some(expires) => tokio::select! {
                () = self.lost.cancelled() => "it was found gone or force-unlocked",
                () = tokio::time::sleep_until(expires.into()) => "its lease ran out",
            },
            None => {
                self.lost.cancelled().await;
                "renewal found it gone (expired or force-unlocked)"
            }
        };
        LockError::new(
            ErrorKind::Lost,
            format!("lock `{}` was lost while held: {why}", self.names.user),
        )
        .with_key(&self.names.user)
    }

    /// Releases one hold of the lock (the key is freed when every hold of its owner is released)
    /// and waits for Redis to confirm.
    ///
    /// # Errors
    /// [`ErrorKind::NotHeld`] when the lock was no longer held by this owner (its lease ran out
    /// or it was force-unlocked); [`ErrorKind::Backend`] when Redis failed.
    ///
    /// # Cancel safety
    /// The release runs in its own task: cancelling this future does not stop it.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        let span = self.release_span();
        let task =
            self.inner
                .release_now(self.names.clone(), self.field.clone(), Some(self.watched()));
        let outcome = task.instrument(span).await;
        match outcome {
            Ok(Released::NotHeld) => Err(LockError::new(
                ErrorKind::NotHeld,
                format!(
                    "lock `{}` was not held by {} any more when released (lease ran out after \
                     {:?}, or force-unlocked)",
                    self.names.user,
                    self.owner,
                    self.acquired.elapsed()
                ),
            )
            .with_key(&self.names.user)),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn watched(&self) -> bool {
        self.lease.is_none()
    }

    fn release_span(&self) -> tracing::Span {
        tracing::info_span!(
            "lock.release",
            key = %self.names.user,
            owner = %self.owner,
            fence = self.fence,
            held_ms = self.acquired.elapsed().as_millis() as u64,
        )
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let span = self.release_span();
        let _enter = span.enter();
        tracing::debug!("guard dropped without release(); releasing in the background");
        // Detached: the join handle is not awaited; errors are logged by the span's events.
        drop(self.inner.release_detached(
            self.names.clone(),
            self.field.clone(),
            Some(self.watched()),
        ));
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.names.user)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("lease", &self.lease)
            .field("lost", &self.is_lost())
            .finish()
    }
}
