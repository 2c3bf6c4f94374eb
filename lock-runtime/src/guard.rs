//! [`LockGuard`]: proof of holding a lock, with its fencing token.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::engine::{Inner, KeyNames, Released};
use crate::error::{ErrorKind, LockError};
use crate::local::{GrantId, HoldCell, OwnerField};
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
    /// The grant (generation) this guard belongs to.
    grant: GrantId,
    fence: u64,
    lease: Option<Duration>,
    /// Shared with the other guards of the grant: loss signal and validity deadline.
    cell: Arc<HoldCell>,
    acquired: Instant,
    released: bool,
    /// For a re-entry of an enclosing body's hold: its entry, taken while this guard lives.
    entry: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl LockGuard {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        inner: Arc<Inner>,
        names: KeyNames,
        owner: OwnerId,
        field: OwnerField,
        grant: GrantId,
        fence: u64,
        lease: Option<Duration>,
        cell: Arc<HoldCell>,
    ) -> Self {
        LockGuard {
            inner,
            names,
            owner,
            field,
            grant,
            fence,
            lease,
            cell,
            acquired: Instant::now(),
            released: false,
            entry: None,
        }
    }

    /// Keeps the entry of the enclosing hold this guard re-enters until the guard goes.
    pub(crate) fn hold_entry(&mut self, entry: tokio::sync::OwnedMutexGuard<()>) {
        self.entry = Some(entry);
    }

    /// The lock key on Redis and the service, which identify the hold in a call chain.
    pub(crate) fn chain_frame(&self) -> (usize, Arc<str>) {
        (Arc::as_ptr(&self.inner) as usize, self.names.lock.clone())
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

    /// Whether the lock is known to be lost: its validity deadline passed (see
    /// [`lost`](Self::lost)), a renewal or re-entry found it gone, or it was force-unlocked from
    /// this service.
    pub fn is_lost(&self) -> bool {
        !self.cell.is_live(Instant::now())
    }

    /// The instant until which this hold is known to be valid: the last successful grant or
    /// renewal's *send* time plus the lease, less a margin for clock drift (1% + 2 ms). The
    /// watchdog pushes it further with every renewal.
    pub fn valid_until(&self) -> Instant {
        self.cell.valid_until()
    }

    /// Resolves when the lock is lost, with an error of kind [`ErrorKind::Lost`] that says why.
    ///
    /// It fires at the hold's validity deadline ([`valid_until`](Self::valid_until)) unless a
    /// renewal pushed the deadline further, and at once when a renewal or re-entry finds the
    /// lock gone or this service force-unlocks it. The deadline is counted from when the grant
    /// or renewal was sent, so it passes no later than Redis expires the key (with clocks that
    /// drift by less than 1%): another owner cannot be granted the lock before `lost()` fires,
    /// except through a force-unlock from another service (seen at the next renewal) or a
    /// failover that loses the grant. Never resolves while the lock is valid.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing.
    pub async fn lost(&self) -> LockError {
        let why = loop {
            let until = self.cell.valid_until();
            tokio::select! {
                () = self.cell.cancelled() => break "it was found gone or force-unlocked",
                () = tokio::time::sleep_until(until.into()) => {
                    if Instant::now() >= self.cell.valid_until() {
                        break match self.lease {
                            Some(_) => "its lease ran out",
                            None => "it could not be renewed before its lease ran out",
                        };
                    }
                }
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
    /// Releasing an inner (re-entered) guard only counts down here; the last guard of a grant
    /// releases it on Redis.
    ///
    /// # Errors
    /// [`ErrorKind::NotHeld`] when the lock was no longer held by this grant (its lease ran out,
    /// it was found gone or force-unlocked): Redis is not touched then, so a later grant of the
    /// same owner is never released by a stale guard. [`ErrorKind::Backend`] when Redis failed;
    /// the release is then repeated in the background until Redis answers.
    ///
    /// # Cancel safety
    /// The release runs in its own task: cancelling this future does not stop it.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        let span = self.release_span();
        let task = self.inner.release_now(
            self.names.clone(),
            self.field.clone(),
            self.grant.clone(),
            self.watched(),
        );
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
            self.grant.clone(),
            self.watched(),
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
