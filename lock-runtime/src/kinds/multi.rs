//! Multi-key locks: all of several mutexes or none. No scripts or keys of its own: it takes
//! the mutexes (`kinds::mutex`) in one global order - their Redis key - so two callers locking
//! `[a, b]` and `[b, a]` cannot deadlock, and gives back what it took when it cannot take all.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;

use std::sync::Arc;

use super::Acquiring;
use super::mutex::{LAYOUT, LockGuard, MUTEX};
use crate::engine::{Engine, Guard, Target, guard};
use crate::error::{ErrorKind, LockError};
use crate::owner::OwnerId;

/// A request for several locks at once, built by [`LockService::lock_all`](crate::LockService::lock_all); awaiting it
/// acquires all of them or none.
///
/// The locks are taken in the order of their Redis keys, the same in every process, so no two
/// callers can deadlock. When they live on one node (always outside cluster mode; in cluster
/// mode only when they happen to share a slot, since every key is its own hash tag), all are
/// first asked for in one script call without waiting, which stops at the first one refused:
/// the ones granted before it are kept, the ones after it are not touched. The rest are taken
/// one after another, each waiting for the time left of `wait`. When one cannot be taken in time, the ones already taken are
/// released before the error returns. Each key re-enters a hold of
/// an enclosing locked body like [`LockService::lock`](crate::LockService::lock).
///
/// # Cancel safety
/// Dropping the future releases what it took (in the background).
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

    super::request_methods!("locks");

    /// Acquire every key as `owner` (see [`owner`](crate::owner#explicit-owners)).
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
        let acquirings: Vec<Acquiring> = named
            .into_iter()
            .map(|names| {
                Acquiring::new(self.engine, &MUTEX, Ok(names), self.owner.clone())
                    .with_label(self.metric_label)
            })
            .collect();
        let (lease, wait) = (self.lease, self.wait);
        Box::pin(async move {
            if let Some(e) = invalid {
                return Err(e);
            }
            if acquirings.is_empty() {
                return Err(LockError::new(
                    ErrorKind::InvalidKey,
                    "lock_all was given no keys",
                ));
            }
            let deadline = wait.and_then(|w| Instant::now().checked_add(w));
            let mut guards = Vec::with_capacity(acquirings.len());
            // one script call when every key lives on one node: the keys granted before the
            // first refused one are kept (the ones after it given back)
            let inner = acquirings[0].inner().clone();
            let fresh: Option<Vec<_>> = acquirings.iter().map(Acquiring::fresh).collect();
            if let Some(fresh) = fresh
                && one_node(&inner, &fresh)
            {
                if let Some((target, _)) = fresh.first() {
                    Engine::check_lease(target.kind, &target.names, lease)?;
                }
                let taken = inner.try_all_at_once(fresh, lease).await;
                guards.extend(taken.into_iter().map(|core| LockGuard { core }));
                if guards.len() == acquirings.len() {
                    return Ok(MultiGuard { guards });
                }
            }
            // the rest in order, from the first one refused
            for acquiring in acquirings.into_iter().skip(guards.len()) {
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                match acquiring.run(lease, left).await {
                    Ok(core) => guards.push(LockGuard { core }),
                    Err(e) => {
                        // all or nothing: give back what was taken, then report
                        for guard in guards {
                            let _ = guard.release().await;
                        }
                        return Err(e);
                    }
                }
            }
            Ok(MultiGuard { guards })
        })
    }
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
    pub async fn extend(&mut self, lease: Duration) -> Result<(), LockError> {
        let mut cores: Vec<&mut Guard> = self.guards.iter_mut().map(|g| &mut g.core).collect();
        guard::extend_all(&mut cores, lease).await
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
