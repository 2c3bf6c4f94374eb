//! The lock kinds. Each is one module over the engine that owns everything about itself: its
//! scripts (beside it, in `kinds/<kind>/`), its key namespace and Redis layout, the decoding
//! `inspect` shows, its request builder and its guard. The engine does the waiting, hand-off,
//! renewal, batching and give-back for all of them; [`KINDS`] is the one table of them.
//!
//! A new kind is a module here (with its scripts), a row of [`KINDS`], a word in
//! `crate::vocab`, its constructor on `LockService` and its re-exports in `lib.rs`.

pub(crate) mod multi;
pub(crate) mod mutex;
pub(crate) mod rw;
pub(crate) mod semaphore;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio_util::either::Either;

use crate::engine::{CallSite, Engine, Guard, KeyNames, Kind, Target};
use crate::error::{ErrorKind, LockError};
use crate::inspect::Layout;
use crate::metrics::{self, Outcome};
use crate::owner::{self, OwnerId};
use crate::vocab::LockKind;

/// One kind of lock: how `inspect` reads it, and the holds the engine runs for it (each with
/// an id of its own, unique across the table).
#[derive(Debug)]
pub(crate) struct KindEntry {
    pub(crate) layout: &'static Layout,
    /// Read by the table's test, which checks the ids are unique (a duplicate would make one
    /// kind run another's script).
    #[cfg_attr(not(test), expect(dead_code, reason = "checked by the table's test"))]
    pub(crate) holds: &'static [&'static Kind],
}

/// Every kind of lock, in [`LockKind::ALL`]'s order.
pub(crate) static KINDS: [&KindEntry; 3] = [&mutex::ENTRY, &rw::ENTRY, &semaphore::ENTRY];

/// The layouts of every kind, for `inspect`.
pub(crate) fn layouts() -> [&'static Layout; KINDS.len()] {
    KINDS.map(|entry| entry.layout)
}

/// The layout of `kind`.
pub(crate) fn layout(kind: LockKind) -> &'static Layout {
    KINDS
        .iter()
        .map(|entry| entry.layout)
        .find(|layout| layout.kind == kind)
        .unwrap_or(mutex::ENTRY.layout)
}

/// An acquire whose owner was resolved when the request was made (in the caller's call chain,
/// see [`owner`]): a new owner, an explicit one, or the re-entry of an enclosing locked body.
pub(crate) struct Acquiring {
    inner: Arc<Engine>,
    target: Result<Target, LockError>,
    resolved: owner::Resolved,
}

impl Acquiring {
    pub(crate) fn new(
        engine: &Arc<Engine>,
        kind: &'static Kind,
        names: Result<KeyNames, LockError>,
        explicit: Option<OwnerId>,
    ) -> Acquiring {
        let resolved = match (explicit, &names) {
            (Some(owner), _) => owner::Resolved::Owner(owner),
            (None, Ok(names)) => owner::resolve(engine.id(), &names.lock),
            (None, Err(_)) => owner::Resolved::AcrossSpawn, // not used: the key error comes first
        };
        Acquiring {
            inner: engine.clone(),
            target: names.map(|names| Target::new(kind, names)),
            resolved,
        }
    }

    /// The kind's extra argument to its acquire script.
    pub(crate) fn with_extra(mut self, extra: String) -> Self {
        if let Ok(target) = &mut self.target {
            target.extra = extra.into();
        }
        self
    }

    /// The name metrics and events give the lock (see [`crate::metrics`]).
    pub(crate) fn with_label(mut self, label: &'static str) -> Self {
        if let Ok(target) = &mut self.target {
            target.label = label;
        }
        self
    }

    /// The owner this acquire runs as, when the key was valid and it is not refused.
    pub(crate) fn owner(&self) -> Option<&OwnerId> {
        match &self.resolved {
            owner::Resolved::Owner(owner) | owner::Resolved::ReEnter { owner, .. } => Some(owner),
            owner::Resolved::AcrossSpawn => None,
        }
    }

    /// The target and owner of an acquire that is a new hold of a new owner here (no
    /// re-entry, nothing held by the owner on this key in this process), else `None`.
    pub(crate) fn fresh(&self) -> Option<(Target, OwnerId)> {
        let (Ok(target), owner::Resolved::Owner(owner)) = (&self.target, &self.resolved) else {
            return None;
        };
        let held = self
            .inner
            .local
            .holds_any(&target.names.lock, &self.inner.owner_field(owner));
        (!held).then(|| (target.clone(), owner.clone()))
    }

    pub(crate) fn inner(&self) -> &Arc<Engine> {
        &self.inner
    }

    /// [`run`](Self::run), boxed, its guard given to `wrap` (the kind's guard type) when
    /// acquired; fails with `checked`'s error, before anything is sent, when the request was
    /// refused. What a kind's request gives `.await`.
    pub(crate) fn wrapped<T, W>(
        self,
        lease: Option<Duration>,
        wait: Option<Duration>,
        checked: Result<(), LockError>,
        wrap: W,
    ) -> Pin<Box<dyn Future<Output = Result<T, LockError>> + Send + 'static>>
    where
        T: Send + 'static,
        W: FnOnce(Guard) -> T + Send + 'static,
    {
        match checked {
            Err(e) => Box::pin(std::future::ready(Err(e))),
            Ok(()) => Box::pin(Wrapped {
                acquire: self.run(lease, wait),
                wrap: Some(wrap),
            }),
        }
    }

    /// Acquires with `lease` (`None`: watched), waiting up to `wait` (`None`: until acquired).
    ///
    /// (A function returning the future rather than an `async fn`, which would keep `self`
    /// twice: every lock call's future carries this one. The common acquire is the engine's
    /// future itself, made here, so no future of another layer copies it in when first polled;
    /// a re-entry, the rare case, runs boxed.)
    pub(crate) fn run(
        self,
        lease: Option<Duration>,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Guard, LockError>> + Send + 'static {
        type Other = Pin<Box<dyn Future<Output = Result<Guard, LockError>> + Send>>;
        let target = match self.target.and_then(|target| {
            Engine::check_lease(target.kind, &target.names, lease)?;
            Ok(target)
        }) {
            Ok(target) => target,
            Err(e) => return Either::Right(Box::pin(std::future::ready(Err(e))) as Other),
        };
        let inner = self.inner;
        match self.resolved {
            owner::Resolved::Owner(owner) => {
                Either::Left(inner.acquire(target, owner, lease, wait, CallSite::Polled))
            }
            owner::Resolved::ReEnter { owner, entry } => Either::Right(Box::pin(async move {
                // where this call is made (awaited): a guard it gets keeps it
                let site = owner::site().map(Arc::new);
                re_enter(inner, target, owner, entry, lease, wait, site).await
            })),
            owner::Resolved::AcrossSpawn => {
                Either::Right(Box::pin(std::future::ready(Err(LockError::new(
                    ErrorKind::WouldDeadlock,
                    format!(
                        "{} `{}` is held further up this call chain, by the task that spawned \
                         this one (owner::spawn); waiting for it here would wait for that task, \
                         which may be waiting for this one. Re-entry follows one call chain: do \
                         the locked work in the holding task, or use another key",
                        target.kind.noun, target.names.user
                    ),
                )
                .with_key(&target.names.user)))))
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// An acquire whose guard is wrapped for the caller as it comes ([`Acquiring::wrapped`]).
    /// Not an async block around the acquire: that would hold the acquire's future twice (as
    /// what it captured and as what it awaits), and copy it from one to the other when first
    /// polled.
    pub(crate) struct Wrapped<F, W> {
        #[pin]
        acquire: F,
        wrap: Option<W>,
    }
}

impl<F, W, T> Future for Wrapped<F, W>
where
    F: Future<Output = Result<Guard, LockError>>,
    W: FnOnce(Guard) -> T,
{
    type Output = Result<T, LockError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let acquired = std::task::ready!(this.acquire.poll(cx));
        let wrap = this
            .wrap
            .take()
            .expect("a lock call's future polled after it finished");
        Poll::Ready(acquired.map(wrap))
    }
}

/// A re-entry of the hold `entry` of the call chain's `owner`: after the entry's turn (the
/// concurrent children of the holding body re-enter one at a time), an acquire like any
/// other, which finds the hold and confirms it.
async fn re_enter(
    inner: Arc<Engine>,
    target: Target,
    owner: OwnerId,
    entry: Arc<owner::Entry>,
    lease: Option<Duration>,
    wait: Option<Duration>,
    site: Option<Arc<owner::Site>>,
) -> Result<Guard, LockError> {
    // a plain re-entry made here holds the entry: it goes only after this returns
    if wait != Some(Duration::ZERO) && site.as_deref().is_some_and(|site| entry.held_at(site)) {
        return Err(Engine::would_deadlock_error(target.kind, &target.names));
    }
    let started = std::time::Instant::now();
    let turn = entry.turn.clone();
    let entered = match wait {
        Some(wait) => tokio::time::timeout(wait, turn.lock_owned())
            .await
            .map_err(|_| {
                let (kind, label) = (target.kind.mode, target.label);
                let (outcome, took) = (Outcome::TimedOut, started.elapsed());
                metrics::acquired(kind, label, outcome, None, took, true);
                inner.timeout_error(target.kind, &target.names, wait)
            })?,
        None => turn.lock_owned().await,
    };
    let left = wait.map(|w| w.saturating_sub(started.elapsed()));
    let mut guard = inner
        .acquire(target, owner, lease, left, CallSite::Known(site.clone()))
        .await?;
    // from the moment the caller has the guard (a locked body gives it up at once)
    entry.entered_at(site.as_ref());
    guard.hold_entry(entered);
    Ok(guard)
}

/// The methods every guard has, forwarded to its [`Guard`](crate::engine::Guard) core, with the
/// docs written for the kind (`$noun`: "lock", "read lock", ...).
macro_rules! guard_methods {
    ($noun:literal, $take:literal) => {
        /// The key as it was asked for.
        pub fn key(&self) -> &str {
            self.core.key()
        }

        #[doc = concat!("The fencing token of this ", $noun, ": see [`LockGuard::fence`](crate::LockGuard::fence).")]
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $take, ".await?;\nlet token: u64 = guard.fence(); // send it with the writes the hold protects\n# let _ = token;\nguard.release().await?;\n# Ok(()) }\n```")]
        pub fn fence(&self) -> u64 {
            self.core.fence()
        }

        #[doc = concat!("The owner holding the ", $noun, ".")]
        pub fn owner(&self) -> &crate::owner::OwnerId {
            self.core.owner()
        }

        /// The fixed lease, or `None` when the watchdog renews the hold.
        pub fn lease(&self) -> Option<std::time::Duration> {
            self.core.lease()
        }

        #[doc = concat!("Whether the ", $noun, " is known to be lost: its validity deadline passed (see [`lost`](Self::lost)), a renewal or re-entry found it gone, or it was force-unlocked from this service.")]
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $take, ".await?;\n// ... a step of the work ...\nif guard.is_lost() {\n    return Ok(()); // stop: someone else may hold it now\n}\nguard.release().await?;\n# Ok(()) }\n```")]
        pub fn is_lost(&self) -> bool {
            self.core.is_lost()
        }

        /// The instant until which this hold is known to be valid: the last successful grant,
        /// renewal or extension's *send* time plus the lease, less a margin for clock drift
        /// (1% + 2 ms). The watchdog pushes it further with every renewal.
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $take, ".await?;\nlet left = guard.valid_until().saturating_duration_since(std::time::Instant::now());\n# let _ = left;\nguard.release().await?;\n# Ok(()) }\n```")]
        pub fn valid_until(&self) -> std::time::Instant {
            self.core.valid_until()
        }

        #[doc = concat!("Resolves when the ", $noun, " is lost, with an error of kind [`ErrorKind::Lost`](crate::ErrorKind::Lost) that says why.")]
        ///
        /// It fires at the hold's validity deadline ([`valid_until`](Self::valid_until)) unless
        /// a renewal pushed the deadline further, and at once when a renewal or re-entry finds
        /// the hold gone or this service force-unlocks it. The deadline is counted from when the
        /// grant or renewal was sent, so it passes no later than Redis expires the hold (with
        /// clocks that drift by less than 1%): nobody else can be granted it before `lost()`
        /// fires, except through a force-unlock from another service (seen at the next renewal)
        /// or a failover that loses the grant. Never resolves while the hold is valid.
        ///
        /// # Cancel safety
        /// Cancel safe: dropping the future changes nothing.
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $take, ".await?;\ntokio::select! {\n    () = async { /* the critical section */ } => guard.release().await?,\n    why = guard.lost() => return Err(why), // stopped: someone else may hold it now\n}\n# Ok(()) }\n```")]
        pub async fn lost(&self) -> crate::error::LockError {
            self.core.lost().await
        }

        #[doc = concat!("Sets the ", $noun, "'s lease to `lease` from now, shorter or longer than before, while this grant still holds it.")]
        ///
        /// A hold without a lease stays watched: the watchdog keeps renewing it afterwards, so
        /// it lasts at least `lease`, then as long as it is held. Re-entries of the same grant
        /// share the new lease.
        ///
        /// A lock whose owner is the same in every process
        /// ([`OwnerId::across_processes`](crate::OwnerId::across_processes)) and that other
        /// processes hold too (one grant they share) is never shortened, as the others are not
        /// told: the lease becomes `lease` only when that is longer than what is left, and
        /// [`valid_until`](Self::valid_until) never moves back then.
        ///
        /// # Errors
        /// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) when the hold is lost (nothing is
        /// changed on Redis), [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
        /// for a lease outside 1 ms to 3650 days, [`ErrorKind::Backend`](crate::ErrorKind::Backend)
        /// when Redis failed (the hold keeps its old lease).
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $take, ".await?;\n// the work takes longer than planned: 30 s more from now (no `mut` needed)\nguard.extend(Duration::from_secs(30)).await?;\nguard.release().await?;\n# Ok(()) }\n```")]
        pub async fn extend(&self, lease: std::time::Duration) -> Result<(), crate::error::LockError> {
            self.core.extend(lease).await
        }

        #[doc = concat!("Releases the ", $noun, " and waits for Redis to confirm.")]
        ///
        /// Releasing an inner (re-entered) guard only counts down here; the last guard of a
        /// grant releases it on Redis.
        ///
        /// # Errors
        /// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) when this grant no longer held it
        /// (its lease ran out, it was found gone or force-unlocked): Redis is not touched then,
        /// so a later grant of the same owner is never released by a stale guard.
        /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) when Redis failed; the release is
        /// then repeated in the background until Redis answers.
        ///
        /// # Cancel safety
        /// The release runs in its own task: cancelling this future does not stop it.
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $take, ".await?;\n// ... the critical section ...\nguard.release().await?; // Err(kind NotHeld) when the lease ran out meanwhile\n# Ok(()) }\n```")]
        pub fn release(
            self,
        ) -> impl std::future::Future<Output = Result<(), crate::error::LockError>> + Send + 'static
        {
            self.core.release()
        }
    };
}

pub(crate) use guard_methods;

/// The lease and wait options every request builder has (fields `lease` and `wait`).
macro_rules! request_methods {
    ($noun:literal, $request:literal) => {
        #[doc = concat!("Hold the ", $noun, " for at most `lease`: it expires then even if this process dies or forgets to release it. Without a lease the watchdog keeps it (with `watchdog_timeout`) until it is released.")]
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $request, "\n    .lease(Duration::from_secs(5)) // expires 5 s after the grant at the latest\n    .await?;\n# let _ = guard;\n# Ok(()) }\n```")]
        pub fn lease(mut self, lease: std::time::Duration) -> Self {
            self.lease = Some(lease);
            self
        }

        #[doc = concat!("Give up with [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) when the ", $noun, " could not be acquired within `wait`. Without it the request waits until it is acquired; `Duration::ZERO` tries once.")]
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $request, "\n    .wait(Duration::from_secs(2)) // Err(kind Timeout) after 2 s\n    .await?;\n# let _ = guard;\n# Ok(()) }\n```")]
        pub fn wait(mut self, wait: std::time::Duration) -> Self {
            self.wait = Some(wait);
            self
        }

        /// Wait at most `wait` when it is `Some`, until acquired when it is `None`.
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet configured: Option<Duration> = None; // e.g. from the settings: `None` waits until acquired\nlet guard = ", $request, "\n    .wait_at_most(configured)\n    .await?;\n# let _ = guard;\n# Ok(()) }\n```")]
        pub fn wait_at_most(mut self, wait: Option<std::time::Duration>) -> Self {
            self.wait = wait;
            self
        }

        /// Try once, without waiting (the try-once / skip pattern): `wait(Duration::ZERO)`.
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $request, "\n    .try_once()\n    .await;\nif let Err(e) = &guard {\n    assert!(e.is_timeout()); // another owner has it: skip the work\n}\n# let _ = guard;\n# Ok(()) }\n```")]
        pub fn try_once(self) -> Self {
            self.wait(std::time::Duration::ZERO)
        }

        /// The name the lock has in [metrics](crate::metrics) (the `key` label) and
        /// [events](crate::events): a fixed name for a family of keys, such as `"goods"` for
        /// `goods:<id>`. Never build it from the key: each distinct label is a time series of
        /// its own. Without it the label is `other`.
        ///
        #[doc = concat!("```no_run\n# use std::time::Duration;\n# async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {\nlet guard = ", $request, "\n    .metric_label(\"goods\") // one time series for every goods id\n    .await?;\n# let _ = guard;\n# Ok(()) }\n```")]
        pub fn metric_label(mut self, label: &'static str) -> Self {
            self.metric_label = label;
            self
        }
    };
}

pub(crate) use request_methods;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::engine::MAX_KINDS;
    use crate::vocab::HoldMode;

    #[test]
    fn the_table_has_every_kind_once_with_unique_ids_and_namespaces() {
        let kinds: Vec<LockKind> = KINDS.iter().map(|e| e.layout.kind).collect();
        assert_eq!(
            kinds,
            LockKind::ALL,
            "one row per kind, in LockKind::ALL's order"
        );
        let mut ids = HashSet::new();
        let mut modes = HashSet::new();
        for entry in KINDS {
            for hold in entry.holds {
                assert!(
                    hold.id < MAX_KINDS,
                    "{}: id {} >= MAX_KINDS",
                    hold.noun,
                    hold.id
                );
                assert!(
                    ids.insert(hold.id),
                    "{}: id {} used twice",
                    hold.noun,
                    hold.id
                );
                assert_eq!(hold.mode.kind(), entry.layout.kind, "{}", hold.noun);
                modes.insert(hold.mode);
            }
        }
        assert_eq!(
            modes.len(),
            HoldMode::ALL.len(),
            "every hold mode has a hold"
        );
        // no namespace names another's keys: each ends before the `{` of the hash tag and none
        // is a prefix of another
        let spaces: Vec<&str> = KINDS.iter().map(|e| e.layout.namespace).collect();
        for (i, a) in spaces.iter().enumerate() {
            assert!(!a.contains(['{', '}']), "{a}");
            for b in &spaces[i + 1..] {
                assert!(!a.is_empty() || !b.starts_with('{'));
                assert!(a.is_empty() || !b.starts_with(a), "{a} / {b}");
                assert!(b.is_empty() || !a.starts_with(b), "{a} / {b}");
            }
        }
        for kind in LockKind::ALL {
            assert_eq!(layout(kind).kind, kind);
        }
    }
}
