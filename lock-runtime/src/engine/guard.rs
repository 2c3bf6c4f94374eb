//! [`Guard`]: the core every kind's guard wraps - the hold's identity (kind, key, owner, grant),
//! its fencing token, lease and validity deadline, release and extension.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;
use tracing::Instrument;

use super::core::Engine;
use super::holds::{HoldCell, valid_until};
use super::ids::{GrantId, OwnerField};
use super::names::KeyNames;
use super::reply::Released;
use super::target::Target;
use super::watchdog;
use crate::error::{ErrorKind, LockError};
use crate::events::HoldInfo;
use crate::owner::{OwnerId, Site};
use crate::scripts::ScriptCall;
use crate::vocab::LossReason;

/// A hold of any kind. Dropping it releases it in the background.
#[must_use = "dropping the guard releases the hold at once"]
pub(crate) struct Guard {
    inner: Arc<Engine>,
    target: Target,
    owner: OwnerId,
    field: OwnerField,
    /// The grant (generation) this guard belongs to.
    grant: GrantId,
    fence: u64,
    /// The fixed lease (`None`: renewed by the watchdog); behind a lock so that `extend` takes
    /// `&self`.
    lease: Mutex<Option<Duration>>,
    /// Renewed by the watchdog (no fixed lease): fixed for the guard's life, an extension does
    /// not change it, so releases and renewals read it without the lock.
    watched: bool,
    /// Taken while an extension of this guard is on its way: two extensions through `&self`
    /// run one after the other, so the deadline set last is the one Redis applied last.
    extending: tokio::sync::Mutex<()>,
    /// Shared with the other guards of the grant: loss signal and validity deadline.
    cell: Arc<HoldCell>,
    acquired: Instant,
    released: bool,
    /// For a re-entry of an enclosing body's hold: its entry, taken while this guard lives.
    entry: Option<tokio::sync::OwnedMutexGuard<()>>,
    /// The hold's first guard (the others re-enter it): its release ends the hold time.
    first: bool,
    /// Where the plain lock call that returned this guard was made (`None` for a locked
    /// body's guard): another call from there must not wait for this guard.
    site: Option<Arc<Site>>,
    /// The minimum hold: a release that frees the lock before then keeps it taken (by
    /// nobody) until then; the mutex only.
    keep_until: Option<Instant>,
}

impl Guard {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        inner: Arc<Engine>,
        target: Target,
        owner: OwnerId,
        field: OwnerField,
        grant: GrantId,
        fence: u64,
        lease: Option<Duration>,
        cell: Arc<HoldCell>,
    ) -> Self {
        let first = !cell.is_described()
            && cell.describe(HoldInfo::new(
                target.names.user.clone(),
                target.kind.mode,
                target.label,
                owner.clone(),
                fence,
                inner.events.sender(),
            ));
        Guard {
            inner,
            target,
            owner,
            field,
            grant,
            fence,
            lease: Mutex::new(lease),
            watched: lease.is_none(),
            extending: tokio::sync::Mutex::new(()),
            cell,
            acquired: Instant::now(),
            released: false,
            entry: None,
            first,
            site: None,
            keep_until: None,
        }
    }

    /// A release that frees the lock before `min` has passed since the grant keeps it taken
    /// until then (see `LockRequest::hold_at_least`). Counted from when the grant's reply
    /// arrived, so the lock is kept at least `min` after the grant.
    pub(crate) fn hold_at_least(&mut self, min: Duration) {
        self.keep_until = self.acquired.checked_add(min);
    }

    /// Keeps `site`, where the lock call that got this guard was made, for as long as the guard
    /// lives, and notes it with the hold (see [`Site`]).
    pub(crate) fn mark_site(&mut self, site: Option<Arc<Site>>) {
        if let Some(site) = &site {
            let lock = &self.target.names.lock;
            self.inner
                .local
                .add_site(lock, &self.grant, Arc::downgrade(site));
        }
        self.site = site;
    }

    /// The guard now holds a locked body, a call chain of its own: it gives up its site, so
    /// that concurrent children of the code that made it wait for the body as usual.
    pub(crate) fn open_body(&mut self) {
        self.site = None;
    }

    /// Keeps the entry of the enclosing hold this guard re-enters until the guard goes.
    pub(crate) fn hold_entry(&mut self, entry: tokio::sync::OwnedMutexGuard<()>) {
        self.entry = Some(entry);
    }

    /// The lock key on Redis and the service, which identify the hold in a call chain.
    pub(crate) fn chain_frame(&self) -> (usize, Arc<str>) {
        (Arc::as_ptr(&self.inner) as usize, self.names().lock.clone())
    }

    fn names(&self) -> &KeyNames {
        &self.target.names
    }

    /// The lock key as it was asked for.
    pub(crate) fn key(&self) -> &str {
        &self.names().user
    }

    pub(crate) fn fence(&self) -> u64 {
        self.fence
    }

    /// What the hold holds (a read share, a write hold, ...).
    pub(crate) fn mode(&self) -> crate::vocab::HoldMode {
        self.target.kind.mode
    }

    pub(crate) fn owner(&self) -> &OwnerId {
        &self.owner
    }

    pub(crate) fn lease(&self) -> Option<Duration> {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn is_lost(&self) -> bool {
        !self.cell.is_live(Instant::now())
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.cell.valid_until()
    }

    /// Resolves when the hold is lost (see the kinds' `lost()` docs).
    pub(crate) async fn lost(&self) -> LockError {
        let why = loop {
            let until = self.cell.valid_until();
            tokio::select! {
                () = self.cell.cancelled() => break if self.cell.ended_by_shutdown() {
                    "the lock service shut down and released it"
                } else {
                    "it was found gone or force-unlocked"
                },
                () = tokio::time::sleep_until(until.into()) => {
                    if Instant::now() >= self.cell.valid_until() {
                        self.cell.report_lost(LossReason::LeaseRanOut);
                        break match self.lease() {
                            Some(_) => "its lease ran out",
                            None => "it could not be renewed before its lease ran out",
                        };
                    }
                }
            }
        };
        LockError::new(
            ErrorKind::Lost,
            format!(
                "{} `{}` was lost while held: {why}",
                self.target.kind.noun,
                self.key()
            ),
        )
        .with_key(self.key())
    }

    /// Releases this guard (the grant on Redis with its last guard) and waits for Redis.
    ///
    /// (A function returning the future rather than an `async fn`, which would keep the guard
    /// twice.)
    pub(crate) fn release(self) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        let mut guard = self;
        async move {
            guard.released = true;
            guard.record_hold_time();
            let span = guard.release_span();
            let task = guard.inner.release_now(
                guard.target.clone(),
                guard.field.clone(),
                guard.grant.clone(),
                guard.watched(),
                guard.keep_until,
            );
            let outcome = task.instrument(span).await;
            match outcome {
                // the service's shutdown released it already
                Ok(Released::NotHeld) if guard.cell.ended_by_shutdown() => Ok(()),
                Ok(Released::NotHeld) => Err(guard.not_held("released", "when released")),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            }
        }
    }

    fn not_held(&self, what: &str, when: &str) -> LockError {
        LockError::new(
            ErrorKind::NotHeld,
            format!(
                "{} `{}` was not held by {} any more {when} (lease ran out after {:?}, or \
                 force-unlocked); it was not {what}",
                self.target.kind.noun,
                self.key(),
                self.owner,
                self.acquired.elapsed()
            ),
        )
        .with_key(self.key())
    }

    /// Sets the hold's lease to `lease` from now (shorter or longer than before) when it is
    /// still held under this grant. A watched hold stays watched: its lease on Redis becomes at
    /// least `lease` from now and is never shortened (the watchdog renews it on its own period,
    /// which may come after a shorter lease ran out, while its validity deadline here only ever
    /// moves forward). Other guards of the same grant (re-entries) share the new lease.
    ///
    /// A grant that other processes share (an owner the same in every process holding the
    /// lock in several of them) is lengthened but never shortened: the others count on the
    /// expiry they were told, so the key's TTL and this guard's validity deadline only move
    /// forward then, and a fixed lease becomes the longer of the old and the new one.
    pub(crate) async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        extend_all(&[self], lease).await
    }

    /// Before an extension to `lease` is sent at `sent`: a fixed lease that gets shorter counts
    /// from now on, whatever becomes of the call - Redis may apply it even when the call is
    /// cancelled or its reply lost, and the guard must not outlive the key. (A lock shared
    /// across processes is never shortened on Redis, and a watched hold stays watched: their
    /// deadlines stay.)
    fn before_extend(&self, sent: Instant, lease: Duration) {
        if self.watched() || self.owner.is_across_processes() {
            return;
        }
        let until = valid_until(sent, Engine::millis(lease));
        if until < self.cell.valid_until() {
            self.cell.set_valid_until(until);
        }
    }

    /// Takes the renew script's flag for this hold from a call sent at `sent` that set its
    /// lease to `lease` from then.
    fn extended(&self, flag: i64, sent: Instant, lease: Duration) -> Result<(), LockError> {
        match flag {
            1 => {
                let until = valid_until(sent, Engine::millis(lease));
                if self.watched() {
                    self.cell.extend_to(until);
                } else {
                    self.cell.set_valid_until(until);
                    *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease);
                }
                Ok(())
            }
            2 => {
                // shared with other processes: lengthened at most, never shortened
                self.cell
                    .extend_to(valid_until(sent, Engine::millis(lease)));
                let mut fixed = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(old) = *fixed {
                    *fixed = Some(old.max(lease));
                }
                Ok(())
            }
            0 => {
                self.inner.local.drop_grant(&self.names().lock, &self.grant);
                Err(self.not_held("extended", "when extended"))
            }
            other => Err(self.unexpected_extend_reply(&format!("{other}"))),
        }
    }

    fn unexpected_extend_reply(&self, reply: &str) -> LockError {
        LockError::new(
            ErrorKind::Backend,
            format!(
                "unexpected reply {reply} extending {} `{}`",
                self.target.kind.noun,
                self.key()
            ),
        )
        .with_key(self.key())
    }

    fn watched(&self) -> bool {
        self.watched
    }

    /// Records how long the hold was held, when this is its first guard.
    fn record_hold_time(&self) {
        if self.first {
            let kind = self.target.kind.mode;
            crate::metrics::released(kind, self.target.label, self.acquired.elapsed());
        }
    }

    fn release_span(&self) -> tracing::Span {
        tracing::info_span!(
            "lock.release",
            kind = self.target.kind.noun,
            key = %self.key(),
            owner = %self.owner,
            fence = self.fence,
            held_ms = self.acquired.elapsed().as_millis() as u64,
        )
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.record_hold_time();
        let span = self.release_span();
        let _enter = span.enter();
        tracing::debug!("guard dropped without release(); releasing in the background");
        // Detached: the join handle is not awaited; errors are logged by the span's events.
        drop(self.inner.release_detached(
            self.target.clone(),
            self.field.clone(),
            self.grant.clone(),
            self.watched(),
            self.keep_until,
        ));
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("kind", &self.target.kind.noun)
            .field("key", &self.key())
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("lease", &self.lease())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// Resolves when any of `guards` is lost, with that loss's error.
pub(crate) async fn lost_any(guards: &[&Guard]) -> LockError {
    if let [guard] = guards {
        return guard.lost().await;
    }
    let mut lost: Vec<_> = guards.iter().map(|g| Box::pin(g.lost())).collect();
    std::future::poll_fn(|cx| {
        for f in &mut lost {
            if let std::task::Poll::Ready(e) = f.as_mut().poll(cx) {
                return std::task::Poll::Ready(e);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Sets the lease of every one of `guards` to `lease` from now, as [`Guard::extend`] does for
/// one, in renew script calls of at most [`watchdog::BATCH`] locks each (of one service and
/// kind, and in cluster mode of one slot): one round trip for many locks, and no call that
/// keeps Redis busy for long. All are tried.
///
/// # Errors
/// The first error: `NotHeld` for a hold that was lost (known here, or found gone on Redis).
pub(crate) async fn extend_all(guards: &[&Guard], lease: Duration) -> Result<(), LockError> {
    // one extension of a guard at a time (in the order of `guards`: a multi-key hold's guards
    // are always in the same order, a single guard's extension takes one)
    let mut turns = Vec::with_capacity(guards.len());
    for guard in guards {
        turns.push(guard.extending.lock().await);
    }
    let mut first = Ok(());
    let mut fail = |e: LockError| {
        if first.is_ok() {
            first = Err(e);
        }
    };
    let mut groups: HashMap<(usize, usize, bool, Option<Slot>), Vec<usize>> = HashMap::new();
    for (i, guard) in guards.iter().enumerate() {
        if let Err(e) = Engine::check_lease(guard.target.kind, guard.names(), Some(lease)) {
            fail(e);
        } else if guard.is_lost() {
            fail(guard.not_held("extended", "when extended"));
        } else {
            let cluster = guard.inner.backend.is_cluster();
            let slot = cluster.then(|| Slot::for_key(&*guard.names().lock));
            let service = Arc::as_ptr(&guard.inner) as usize;
            let group = (service, guard.target.kind.id, guard.watched(), slot);
            groups.entry(group).or_default().push(i);
        }
    }
    let lease_ms = Engine::millis(lease);
    for batch in groups
        .values()
        .flat_map(|group| group.chunks(watchdog::BATCH))
    {
        let head = &guards[batch[0]];
        let inner = head.inner.clone();
        let mut call = ScriptCall::new(head.target.kind.renew, batch.len());
        for &i in batch {
            call.key(&guards[i].names().lock);
        }
        call.arg(lease_ms)
            .arg(if head.watched() { "r" } else { "x" });
        for &i in batch {
            call.arg(&*guards[i].field).arg(&*guards[i].grant);
        }
        let sent = Instant::now();
        for &i in batch {
            guards[i].before_extend(sent, lease);
        }
        match inner.backend.run::<Vec<i64>>("extend", &call).await {
            Ok(flags) if flags.len() == batch.len() => {
                for (&i, flag) in batch.iter().zip(flags) {
                    if let Err(e) = guards[i].extended(flag, sent, lease) {
                        fail(e);
                    }
                }
            }
            Ok(flags) => {
                for &i in batch {
                    fail(guards[i].unexpected_extend_reply(&format!("{flags:?}")));
                }
            }
            Err(e) => fail(e),
        }
    }
    first
}

/// Releases every one of `guards`, all at once (their calls go out together: one round trip,
/// batched when they queue); the first error, after all of them ran.
pub(crate) async fn release_all(mut guards: Vec<Guard>) -> Result<(), LockError> {
    if guards.len() == 1
        && let Some(guard) = guards.pop()
    {
        return guard.release().await;
    }
    let releases: Vec<_> = guards
        .into_iter()
        .map(|guard| tokio::spawn(guard.release()))
        .collect();
    let mut first = Ok(());
    for release in releases {
        let outcome = release.await.unwrap_or_else(|e| {
            Err(LockError::new(
                ErrorKind::Backend,
                format!("a release task stopped: {e}"),
            ))
        });
        if let Err(e) = outcome {
            first = first.and(Err(e));
        }
    }
    first
}
