//! The third peer: the `rslock` crate (0.10), the Redlock implementation Rust users pick,
//! given the bench's one redis-server as its only node (a quorum of 1); with `--cluster`, the
//! cluster as its one backend (`LockManager::new_cluster`). Its TTL is the lease of the other
//! variants ([`LEASE`]).
//!
//! What it does, from its source: `LockManager::acquire` calls `LockManager::lock` until it
//! succeeds; `lock` makes up to `retry_count` attempts, each a plain `SET key <20 random bytes>
//! NX PX ttl` and, when it fails, an EVALSHA of compare-and-delete (Redlock's clean-up of the
//! nodes that may have taken the key), with a sleep of a random 0 to `retry_delay` between two
//! attempts and none between two calls of `lock`. The bench keeps rslock's defaults (no
//! `set_retry`): 3 attempts per call, `retry_delay` 200 ms. So a waiter polls, sleeping
//! 0-200 ms twice and then trying twice in a row, over and over; it has no pub/sub.
//! `LockGuard::release` is one EVALSHA of compare-and-delete and reports nothing (best effort:
//! the bench cannot check that a release found its hold). A manager's clones share its
//! connection: a manager is one application instance.

use std::time::Duration;

use rslock::{LockGuard, LockManager};

use crate::conn::Endpoint;
use crate::ctx::LEASE;
use crate::error::Result;

/// The commands rslock sends by themselves (not from a script): its attempts' `SET`.
pub(crate) const PLAIN: [&str; 1] = ["set"];

/// An acquire gives up (the bench fails) after this long; rslock's own `acquire` never does.
const GIVE_UP: Duration = Duration::from_secs(30);

/// One rslock `LockManager` (one connection); clones share it.
#[derive(Clone)]
pub(crate) struct Rslock {
    manager: LockManager,
}

impl Rslock {
    /// A manager of `redis`, its connection opened on the current runtime.
    pub(crate) async fn connect(redis: &Endpoint) -> Result<Rslock> {
        let manager = if redis.is_cluster() {
            LockManager::new_cluster(redis.urls().to_vec())?
        } else {
            LockManager::from_clients(vec![redis::Client::open(redis.url())?])
        };
        // rslock connects on first use; a GET now makes the connection (and runs its driver
        // task) on this runtime, outside any measured phase.
        manager
            .query_redis_for_key_value(key("connect").as_bytes())
            .await?;
        Ok(Rslock { manager })
    }

    /// `LockManager::acquire` of the lock `name` with the bench's lease: returns once held.
    pub(crate) async fn acquire(&self, name: &str) -> Result<LockGuard> {
        let key = key(name);
        let acquired = tokio::time::timeout(GIVE_UP, self.manager.acquire(key.as_str(), LEASE))
            .await
            .map_err(|_| format!("rslock: `{name}` not acquired within {GIVE_UP:?}"))?;
        Ok(acquired?)
    }
}

/// The variant's name: rslock is given one node (the one server, or the cluster as one).
pub(crate) fn name(redis: &Endpoint) -> &'static str {
    if redis.is_cluster() {
        "rslock (cluster as 1 node)"
    } else {
        "rslock (1 node)"
    }
}

/// rslock's key for a lock name (apart from the other variants' keys).
fn key(name: &str) -> String {
    format!("rslock:{{{name}}}")
}
