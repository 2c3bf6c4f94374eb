//! Multi-key locks: all of several mutexes or none. No scripts or keys of its own: it takes
//! the mutexes (`kinds::mutex`) in one global order - their Redis key - so two callers locking
//! `[a, b]` and `[b, a]` cannot deadlock, and gives back what it took when it cannot take all.

use std::collections::VecDeque;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;

use super::Acquiring;
use super::mutex::{LAYOUT, LockGuard, MUTEX};
use crate::engine::{Engine, Guard, MAX_OPS, Target, guard};
use crate::error::{ErrorKind, LockError};
use crate::owner::{self, OwnerId};

/// A request for several locks at once, built by [`LockService::lock_all`](crate::LockService::lock_all); awaiting it
/// acquires all of them or none.
///
/// The locks are taken in the order of their Redis keys, the same in every process, so no two
/// callers can deadlock. When they live on one node (always outside cluster mode; in cluster
/// mode only when they happen to share a slot, since every key is its own hash tag), all are
/// first asked for without waiting, in script calls of at most 128 keys each (so that no call
/// keeps Redis busy for long), which stop at the first one refused: the ones granted before it
/// are kept, the ones after it are not touched. The refused one is waited for (the time left
/// of `wait`), then the rest are asked for the same way again; elsewhere they are taken one
/// after another. When one cannot be taken in time, the ones already taken are released before
/// the error returns. Each key re-enters a hold of an enclosing locked body like
/// [`LockService::lock`](crate::LockService::lock).
///
/// A key taken early may run out while later ones are waited for (a fixed `lease` shorter than
/// that wait), and someone else may take it meanwhile. So when the keys were not all granted
/// by one script call, every one is confirmed on Redis before the guard is returned, its lease
/// set to the full `lease` from then (without a lease: renewed as by the watchdog). When one was
/// lost, all are given back and taken again within the time left of `wait`; when that runs
/// out, the error is [`ErrorKind::Timeout`]. (When nothing was waited for, the lease is shorter
/// than taking the keys takes: [`ErrorKind::InvalidArgument`], nothing is held.) A returned
/// guard holds every key.
///
/// # Cancel safety
/// Dropping the future releases what it took (in the background).
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
///
/// let both = locks
///     .lock_all(["account:1", "account:2"])
///     .lease(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .await?;
/// both.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a lock request does nothing until it is awaited"]
pub struct MultiRequest<'a> {
    engine: &'a Arc<Engine>,
    keys: Vec<String>,
    lease: Option<Duration>,
    wait: Option<Duration>,
    owner: Option<OwnerId>,
    metric_label: &'static str,
}

impl<'a> MultiRequest<'a> {
    pub(crate) fn new(engine: &'a Arc<Engine>, keys: Vec<String>) -> Self {
        MultiRequest {
            engine,
            keys,
            lease: None,
            wait: None,
            owner: None,
            metric_label: crate::metrics::OTHER,
        }
    }

    super::request_methods!("locks", "locks.lock_all([\"account:1\", \"account:2\"])");

    /// Acquire every key as `owner` (see [`owner`](crate::owner#explicit-owners)).
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let transfer = lock_runtime::OwnerId::from("transfer-981");
    /// let both = locks.lock_all(["account:1", "account:2"]).owner(transfer).await?;
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }
}

impl<'a> IntoFuture for MultiRequest<'a> {
    type Output = Result<MultiGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let mut named = Vec::with_capacity(self.keys.len());
        let mut invalid = None;
        for key in &self.keys {
            match self.engine.names(LAYOUT.namespace, key) {
                Ok(names) => named.push(names),
                Err(e) => {
                    invalid.get_or_insert(e);
                }
            }
        }
        // one order everywhere: the Redis key; the same key twice is one lock
        named.sort_by(|a, b| a.lock.cmp(&b.lock));
        named.dedup_by(|a, b| a.lock == b.lock);
        let (engine, owner, label) = (self.engine, self.owner, self.metric_label);
        let (lease, wait) = (self.lease, self.wait);
        Box::pin(async move {
            if let Some(e) = invalid {
                return Err(e);
            }
            if named.is_empty() {
                return Err(LockError::new(
                    ErrorKind::InvalidKey,
                    "lock_all was given no keys",
                ));
            }
            let deadline = wait.and_then(|w| Instant::now().checked_add(w));
            loop {
                let acquirings: Vec<Acquiring> = named
                    .iter()
                    .map(|names| {
                        Acquiring::new(engine, &MUTEX, Ok(names.clone()), owner.clone())
                            .with_label(label)
                    })
                    .collect();
                let started = Instant::now();
                let (guards, steps) = take_in_order(engine, acquirings, lease, deadline).await?;
                // Keys taken early may have run out (a fixed lease) while later ones were
                // taken: every one is confirmed on Redis, its lease set to the full lease from
                // now, before the guard is handed out.
                if steps == Steps::One {
                    return Ok(MultiGuard { guards });
                }
                let confirm = lease.unwrap_or(engine.config.watchdog_timeout());
                let cores: Vec<&Guard> = guards.iter().map(|g| &g.core).collect();
                let Err(lost) = guard::extend_all(&cores, confirm).await else {
                    return Ok(MultiGuard { guards });
                };
                give_back(guards).await;
                if lost.kind() != ErrorKind::NotHeld {
                    return Err(lost);
                }
                if steps == Steps::Calls {
                    // nobody else was waited for: the lease is shorter than taking the keys
                    // takes, and would be every time
                    return Err(LockError::new(
                        ErrorKind::InvalidArgument,
                        format!(
                            "a lease of {:?} is shorter than taking these {} keys took \
                             ({:?}): {lost}",
                            lease.unwrap_or_default(),
                            named.len(),
                            started.elapsed()
                        ),
                    ));
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    let mut err = LockError::new(
                        ErrorKind::Timeout,
                        format!(
                            "lock_all could not hold every key at once within {:?}: {lost}",
                            wait.unwrap_or_default()
                        ),
                    );
                    if let Some(key) = lost.key() {
                        err = err.with_key(key);
                    }
                    return Err(err);
                }
                tracing::debug!(error = %lost, "lock_all lost a key while it waited for the others; taking them again");
            }
        })
    }
}

/// Takes every one of `acquirings` in their order: as many as it can at once in script calls
/// (when they are new to this owner and on one node), then the first refused one waiting for
/// the time left of the wait, then again the rest at once, and so on. When one cannot be taken
/// in time, the ones taken are released before the error returns. Returns the guards, and in
/// how many steps they were taken (the first ones may have run out since).
async fn take_in_order(
    engine: &Arc<Engine>,
    acquirings: Vec<Acquiring>,
    lease: Option<Duration>,
    deadline: Option<Instant>,
) -> Result<(Vec<LockGuard>, Steps), LockError> {
    let mut guards: Vec<LockGuard> = Vec::with_capacity(acquirings.len());
    let mut rest: VecDeque<Acquiring> = acquirings.into();
    let mut steps = if rest.len() > MAX_OPS {
        Steps::Calls
    } else {
        Steps::One
    };
    while !rest.is_empty() {
        let fresh: Option<Vec<_>> = rest.iter().map(Acquiring::fresh).collect();
        if let Some(fresh) = fresh
            && one_node(engine, &fresh)
        {
            if let Some((target, _)) = fresh.first()
                && let Err(e) = Engine::check_lease(target.kind, &target.names, lease)
            {
                give_back(guards).await;
                return Err(e);
            }
            let taken = engine.try_all_at_once(fresh, lease).await;
            rest.drain(..taken.len());
            let site = owner::site().map(Arc::new);
            guards.extend(taken.into_iter().map(|mut core| {
                core.mark_site(site.clone());
                LockGuard { core }
            }));
        }
        // the first one refused, waiting for it
        let Some(acquiring) = rest.pop_front() else {
            break;
        };
        if !guards.is_empty() {
            steps = Steps::Waited;
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        match acquiring.run(lease, left).await {
            Ok(core) => {
                guards.push(LockGuard { core });
                if steps == Steps::One && !rest.is_empty() {
                    steps = Steps::Calls;
                }
            }
            Err(e) => {
                // all or nothing: give back what was taken, then report
                give_back(guards).await;
                return Err(e);
            }
        }
    }
    Ok((guards, steps))
}

/// How the keys of a multi-key lock were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steps {
    /// All by one script call.
    One,
    /// By several script calls, one after another, none of them refused.
    Calls,
    /// Some after others were taken and held meanwhile (waiting, or one by one).
    Waited,
}

async fn give_back(guards: Vec<LockGuard>) {
    let _ = guard::release_all(guards.into_iter().map(|g| g.core).collect()).await;
}

/// Whether one script call can touch every target: always outside cluster mode; in cluster
/// mode when they share a slot.
fn one_node(inner: &Engine, targets: &[(Target, OwnerId)]) -> bool {
    if !inner.backend.is_cluster() {
        return true;
    }
    let mut slots = targets.iter().map(|(t, _)| Slot::for_key(&*t.names.lock));
    let first = slots.next();
    slots.all(|slot| Some(slot) == first)
}

impl fmt::Debug for MultiRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiRequest")
            .field("keys", &self.keys)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .finish()
    }
}

/// Several locks held together, from [`LockService::lock_all`](crate::LockService::lock_all). Releasing (or dropping) it
/// releases all of them.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let both = locks.lock_all(["account:1", "account:2"]).await?;
/// let token = both.fence("account:1"); // Some(token) of that key's hold
/// for key in both.keys() {
///     println!("holding {key}");
/// }
/// # let _ = token;
/// both.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The held locks, in the order they were taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The keys, in the order they were taken.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The fencing token of the lock `key`, `None` when it is not one of them.
    pub fn fence(&self, key: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.key() == key)
            .map(LockGuard::fence)
    }

    /// Whether any of the locks is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Resolves when any of the locks is lost (see [`LockGuard::lost`]).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> LockError {
        let cores: Vec<&Guard> = self.guards.iter().map(|g| &g.core).collect();
        guard::lost_any(&cores).await
    }

    /// Sets every lock's lease to `lease` from now (see [`LockGuard::extend`]), in few script
    /// calls (up to 256 locks each).
    ///
    /// # Errors
    /// The first error of the extensions; all are tried.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        let cores: Vec<&Guard> = self.guards.iter().map(|g| &g.core).collect();
        guard::extend_all(&cores, lease).await
    }

    /// Releases every lock and waits for Redis.
    ///
    /// # Errors
    /// The first error of the releases (see [`LockGuard::release`]); all are released.
    pub async fn release(self) -> Result<(), LockError> {
        guard::release_all(self.into_cores()).await
    }

    /// The engine's guards of the locks, in the order they were taken.
    pub(crate) fn into_cores(self) -> Vec<Guard> {
        self.guards.into_iter().map(|g| g.core).collect()
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}
