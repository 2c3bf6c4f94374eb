//! The mutex: one owner at a time, re-entrant along a call chain, handed by the release script
//! to the next waiter of the releasing service, or granted to the head waiter of the next
//! waiting service (see `engine/push.rs`). Key layout: the string `<prefix>{<key>}` (state,
//! token, grant ids and owner field in one value, see `mutex/value.lua`; its expiry is the
//! lease), the fence counter of its slot, and only while services wait `<lock>:wq` (services
//! waiting), `<lock>:wh` (their head waiters) and the channel `<lock>:ch`. Scripts:
//! `kinds/mutex/`.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use super::{Acquiring, KindEntry};
use crate::context::{self, Held, OnLost};
use crate::engine::{Engine, Guard, Kind};
use crate::error::{ErrorKind, LockError};
use crate::inspect::{Holder, Kept, Layout, LocalGuards, LockInfo, RawState};
use crate::owner::OwnerId;
use crate::scripts;
use crate::vocab::{HoldMode, LockKind, MAX_LEASE_MS};

/// Renews or extends mutex holds by grant id.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| scripts::renew(&[VALUE_LUA, include_str!("mutex/renew.lua")]));

/// How a mutex's value reads and is written, for its operations and its renewal.
const VALUE_LUA: &str = include_str!("mutex/value.lua");

/// The mutex as the engine sees it.
pub(crate) static MUTEX: Kind = Kind {
    id: 0,
    noun: "lock",
    mode: HoldMode::Exclusive,
    busy: "it is held by another owner",
    lua_first: include_str!("mutex/fast.lua"),
    lua: &[
        VALUE_LUA,
        include_str!("mutex/acquire.lua"),
        include_str!("mutex/release.lua"),
    ],
    renew: &RENEW,
    shared: false,
    joint: false,
    reentrant: true,
    leave: None,
    hand_off: true,
    leaves_on_grant: true,
    fourth_key: Some(crate::scripts::HEADS_SUFFIX),
    extra_arg: false,
};

/// How `inspect` reads a mutex: the string `<prefix>{<key>}` = state, token (16 digits), grant
/// ids (one per process holding it; re-entries are counted by that process), `|`, owner field;
/// the lock key's TTL is the lease. A reserved turn (state `T`) has no holder.
pub(crate) static LAYOUT: Layout = Layout {
    kind: LockKind::Mutex,
    namespace: "",
    decode,
};

/// The mutex in the table of kinds.
pub(crate) static ENTRY: KindEntry = KindEntry {
    layout: &LAYOUT,
    holds: &[&MUTEX],
};

/// The parts of a mutex's value: state, token, grant ids, owner field (see `mutex/value.lua`);
/// `None` for anything else.
fn parts(value: &str) -> Option<(u8, u64, &str, &str)> {
    let state = *value.as_bytes().first()?;
    let token = value.get(1..17)?.parse().ok()?;
    let (ids, owner) = value.get(17..)?.split_once('|')?;
    Some((state, token, ids, owner))
}

fn decode(info: &mut LockInfo, state: &RawState, local: LocalGuards<'_>) {
    let Some((kind, token, ids, owner)) = state.value.as_deref().and_then(parts) else {
        return;
    };
    if kind == b'T' {
        // a turn reserved for a service, or a finished hold kept for its minimum hold
        if let (Some(done), Some(left)) = (owner.strip_prefix("done:"), state.pttl()) {
            let mut holder = Holder::new(done, HoldMode::Exclusive);
            holder.hold_count = 0;
            holder.granted_by_token(token, state);
            info.kept = Some(Kept { holder, left });
        }
        return;
    }
    if ids.is_empty() {
        return;
    }
    info.fence = Some(token);
    let mut holder = Holder::new(owner, HoldMode::Exclusive);
    holder.hold_count = u32::try_from(ids.split_whitespace().count()).unwrap_or(0);
    if let Some(guards) = local(ids) {
        holder.hold_count += guards.saturating_sub(1);
    }
    holder.lease_left = state.pttl();
    holder.granted_by_token(token, state);
    info.holders.push(holder);
}

/// A request for a lock, built by [`LockService::lock`](crate::LockService::lock); awaiting it acquires the lock.
///
/// # Cancel safety
/// Dropping the future at any point never leaves the lock held past its lease: a grant that
/// arrives after the future was dropped is released at once.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
///
/// let guard = locks
///     .lock("goods:42")
///     .lease(Duration::from_secs(5)) // else the watchdog renews it
///     .wait(Duration::from_secs(2)) // else it waits until acquired
///     .await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockRequest<'a> {
    engine: &'a Arc<Engine>,
    key: String,
    lease: Option<Duration>,
    wait: Option<Duration>,
    owner: Option<OwnerId>,
    metric_label: &'static str,
    hold_at_least: Option<Duration>,
}

impl<'a> LockRequest<'a> {
    pub(crate) fn new(engine: &'a Arc<Engine>, key: String) -> Self {
        LockRequest {
            engine,
            key,
            hold_at_least: None,
            lease: None,
            wait: None,
            owner: None,
            metric_label: crate::metrics::OTHER,
        }
    }

    super::request_methods!("lock", "locks.lock(\"goods:7\")");

    /// Acquires the lock, runs the future `body` returns as a locked body, and releases the lock
    /// after it: lock calls inside the body (however deep, also `#[distributed_lock]` fns)
    /// re-enter this hold. `body` gets the [`Held`](crate::Held) lock: its key and fencing
    /// token.
    ///
    /// Returns the body's own `Result`, as an annotated fn does: a lock error (the lock could
    /// not be had, or was lost while the body ran) comes back through `E: From<LockError>`. To
    /// tell the two apart, or for a body that does not return a `Result`, use
    /// [`run_nested`](Self::run_nested).
    ///
    /// ```no_run
    /// # #[derive(Debug)] struct AppError;
    /// # impl From<lock_runtime::LockError> for AppError { fn from(_: lock_runtime::LockError) -> Self { AppError } }
    /// # async fn send_report(fence: u64) -> Result<u32, AppError> { Ok(0) }
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), AppError> {
    /// use std::time::Duration;
    ///
    /// let sent: u32 = locks
    ///     .lock("job:nightly-report")
    ///     .wait(Duration::ZERO) // another instance runs it: Err(AppError::from(timeout))
    ///     .run(|held| async move { send_report(held.fence()).await })
    ///     .await?;
    /// # let _ = sent; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The body's errors; and, converted to `E`, the errors of acquiring (see
    /// [`LockService::lock`](crate::LockService::lock)) and
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the lock was lost while the body ran:
    /// the body is stopped (dropped) at that moment, as someone else may hold the lock now.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops the body and releases the lock in the background.
    pub async fn run<F, Fut, T, E>(self, body: F) -> Result<T, E>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        self.run_nested(body)
            .await
            .unwrap_or_else(|e| Err(E::from(e)))
    }

    /// [`run`](Self::run) for a body of any output: returns it as it is, inside the lock's own
    /// `Result` - `Ok(output)` when the body ran to its end, `Err` when the lock could not be
    /// had or was lost while the body ran (the body is then stopped).
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let outcome: Result<u32, std::io::Error> = locks
    ///     .lock("report")
    ///     .run_nested(|_held| async { Ok(7) })
    ///     .await?; // the lock's error here, the body's in `outcome`
    /// # let _ = outcome; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`run`](Self::run), for the lock only.
    ///
    /// # Cancel safety
    /// As [`run`](Self::run).
    pub async fn run_nested<F, Fut, T>(self, body: F) -> Result<T, LockError>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.await?;
        let held = Held::of(&guard.core);
        context::run_body(vec![guard.core], OnLost::Fail, Box::pin(body(held))).await
    }

    /// Acquire as `owner`: the lock re-enters that owner's holds, wherever they are (see
    /// [`owner`](crate::owner#explicit-owners)), instead of following the call chain.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::OwnerId;
    ///
    /// // one import job, run by several tasks, re-enters its own lock
    /// let job = OwnerId::from("import-2024-11");
    /// let guard = locks.lock("catalog:7").owner(job.clone()).await?;
    /// let again = locks.lock("catalog:7").owner(job).await?; // at once: the same owner
    /// again.release().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// A minimum hold, for jobs that must run once per schedule: a release (or drop) that frees
    /// the lock before `min` has passed since it was granted keeps it taken, by nobody, until
    /// then - without holding the caller, whose release returns at once. Instances whose
    /// schedulers fire the same job a little apart (clock skew, a slow start) find it taken and
    /// skip, even when the job itself took a millisecond. `inspect`, `lockctl` and its console
    /// show such a lock as done and kept until its time ([`LockInfo::kept`](crate::LockInfo::kept)),
    /// and [`force_unlock`](crate::LockService::force_unlock) removes it. From 1 ms to the
    /// longest lease (about ten years); the lease (or the watchdog) still bounds a holder that
    /// dies before it releases. It applies when this guard's release frees the lock (a re-entry
    /// inside an outer hold frees nothing; the outer's release does) and is not kept across a
    /// [`LockService::shutdown`](crate::LockService::shutdown).
    ///
    /// ```no_run
    /// # async fn run_report() {}
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    ///
    /// // every instance fires this at 02:00; only the first runs it, even if it is done in 1 s
    /// match locks
    ///     .lock("job:nightly-report")
    ///     .try_once()
    ///     .hold_at_least(Duration::from_secs(30))
    ///     .await
    /// {
    ///     Ok(guard) => {
    ///         run_report().await;
    ///         guard.release().await?; // returns now; the key stays taken for the 30 s
    ///     }
    ///     Err(e) if e.is_timeout() => {} // another instance runs or ran it
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn hold_at_least(mut self, min: Duration) -> Self {
        self.hold_at_least = Some(min);
        self
    }
}

impl<'a> IntoFuture for LockRequest<'a> {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let names = self.engine.names(LAYOUT.namespace, &self.key);
        let acquiring =
            Acquiring::new(self.engine, &MUTEX, names, self.owner).with_label(self.metric_label);
        let (lease, wait, min) = (self.lease, self.wait, self.hold_at_least);
        let checked = match min {
            Some(min)
                if min < Duration::from_millis(1) || min.as_millis() > u128::from(MAX_LEASE_MS) =>
            {
                Err(LockError::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "lock `{}` requested with a minimum hold of {min:?}; a minimum hold is \
                         from 1ms to {} days",
                        self.key,
                        MAX_LEASE_MS / 86_400_000
                    ),
                )
                .with_key(&self.key))
            }
            _ => Ok(()),
        };
        acquiring.wrapped(lease, wait, checked, move |mut core| {
            if let Some(min) = min {
                core.hold_at_least(min);
            }
            LockGuard { core }
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
            .field("hold_at_least", &self.hold_at_least)
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
    super::guard_methods!("lock", "locks.lock(\"goods:7\")");
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::inspect::{lock_info, raw_state};

    fn string(value: &str, pttl: i64) -> RawState {
        let mut s = raw_state(&[], pttl);
        s.value = Some(value.to_owned());
        s
    }

    #[test]
    fn a_mutex() {
        let s = string("W170000000000000100000000000000aa|9f1c:req-42#1", 4_000);
        let info = lock_info(&LAYOUT, "k", "lock:{k}", s, |g| {
            (g == "00000000000000aa").then_some(3)
        });
        assert_eq!(info.holder.as_deref(), Some("9f1c:req-42#1"));
        assert_eq!(info.hold_count, 3);
        assert_eq!(info.fence, Some(1_700_000_000_000_001));
        assert_eq!(info.ttl, Some(Duration::from_secs(4)));
        let [h] = &info.holders[..] else { panic!() };
        assert_eq!((h.mode, h.hold_count), (HoldMode::Exclusive, 3));
        assert_eq!(h.lease_left, Some(Duration::from_secs(4)));

        let free = lock_info(&LAYOUT, "k", "lock:{k}", raw_state(&[], -2), |_| None);
        assert_eq!((free.holder, free.ttl, free.hold_count), (None, None, 0));

        // a reserved turn has no holder; an owner field may hold '|'; a shared owner
        let turn = string("T0000000000000000|5f3e", 200);
        let turn = lock_info(&LAYOUT, "k", "lock:{k}", turn, |_| None);
        assert_eq!((turn.holder, turn.fence), (None, None));
        let shared = string(
            "H0000000000000042000000000000000a 000000000000000b|mesh:a|b",
            900,
        );
        let shared = lock_info(&LAYOUT, "k", "lock:{k}", shared, |_| None);
        assert_eq!(shared.holder.as_deref(), Some("mesh:a|b"));
        assert_eq!((shared.hold_count, shared.fence), (2, Some(42)));
        for junk in ["", "H12", "Hxxxxxxxxxxxxxxxx|o", "H0000000000000001no-bar"] {
            let info = lock_info(&LAYOUT, "k", "lock:{k}", string(junk, 5), |_| None);
            assert!(info.holders.is_empty(), "{junk:?}");
        }
    }
}
