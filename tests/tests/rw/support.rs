//! What several modules use: the Redis keys of a read-write lock and the reads of them the
//! checks wait on, the critical section with concurrency counters (`Room`), spawned acquires,
//! and the check that a lock ends up free.
//!
//! On Redis a read-write lock `k` is the hash `lock:rw:{k}` (see
//! `lock-runtime/src/kinds/rw/state.lua`): one field `r:<grant id>` -> `<expiry ms> <token>
//! <owner>` per read share, `w:<owner>` for the writer; the services waiting are the zset
//! `lock:rw:{k}:wq`, the services with a writer waiting the zset `lock:rw:{k}:turn`. A few checks read those (with the helpers below) to know when a waiter
//! is registered.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use crate::common::{Fixture, eventually};
use lock_runtime::{LockService, ReadGuard, WriteGuard};

pub(crate) const LONG: Duration = Duration::from_secs(30);
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// The hash of the read-write lock `key` (keys without `{`, `}` or `%`).
pub(crate) fn rw_key(key: &str) -> String {
    format!("lock:rw:{{{key}}}")
}

/// The services with a writer waiting for `key` (writer preference).
pub(crate) fn writers_key(key: &str) -> String {
    format!("{}:turn", rw_key(key))
}

/// The services waiting for `key`.
pub(crate) fn waiting_key(key: &str) -> String {
    format!("{}:wq", rw_key(key))
}

/// ZCARD of `redis_key`, asked of the node serving it.
pub(crate) fn zcard(fx: &Fixture, redis_key: &str) -> i64 {
    redis::cmd("ZCARD")
        .arg(redis_key)
        .query(&mut fx.conn_for(redis_key))
        .unwrap()
}

/// The critical section the lock protects, with concurrency counters: how many readers and
/// writers are inside now, the most readers seen inside at once, and every moment a writer was
/// inside together with anyone else. A side that enters counts itself in, then looks at the
/// other side (sequentially consistent): of two that are inside together, at least one sees
/// the other.
#[derive(Default)]
pub(crate) struct Room {
    pub(crate) readers: AtomicUsize,
    pub(crate) writers: AtomicUsize,
    pub(crate) max_readers: AtomicUsize,
    pub(crate) overlaps: AtomicUsize,
    pub(crate) reads: AtomicUsize,
    pub(crate) writes: AtomicUsize,
}

impl Room {
    pub(crate) fn enter_read(&self) {
        let n = self.readers.fetch_add(1, SeqCst) + 1;
        self.max_readers.fetch_max(n, SeqCst);
        if self.writers.load(SeqCst) > 0 {
            self.overlaps.fetch_add(1, SeqCst);
        }
    }

    pub(crate) fn leave_read(&self) {
        self.reads.fetch_add(1, SeqCst);
        self.readers.fetch_sub(1, SeqCst);
    }

    pub(crate) fn enter_write(&self) {
        let others = self.writers.fetch_add(1, SeqCst);
        if others > 0 || self.readers.load(SeqCst) > 0 {
            self.overlaps.fetch_add(1, SeqCst);
        }
    }

    pub(crate) fn leave_write(&self) {
        self.writes.fetch_add(1, SeqCst);
        self.writers.fetch_sub(1, SeqCst);
    }

    pub(crate) fn overlaps(&self) -> usize {
        self.overlaps.load(SeqCst)
    }

    pub(crate) fn max_readers(&self) -> usize {
        self.max_readers.load(SeqCst)
    }
}

pub(crate) fn spawn_read(
    service: &LockService,
    key: &str,
) -> tokio::task::JoinHandle<Result<ReadGuard, lock_runtime::LockError>> {
    let (service, key) = (service.clone(), key.to_owned());
    tokio::spawn(async move { service.read(&key).wait(WAIT).await })
}

pub(crate) fn spawn_write(
    service: &LockService,
    key: &str,
) -> tokio::task::JoinHandle<Result<WriteGuard, lock_runtime::LockError>> {
    let (service, key) = (service.clone(), key.to_owned());
    tokio::spawn(async move { service.write(&key).wait(WAIT).await })
}

/// Awaits a spawned acquire that must succeed within `within`.
pub(crate) async fn granted<G>(
    what: &str,
    task: tokio::task::JoinHandle<Result<G, lock_runtime::LockError>>,
    within: Duration,
) -> G {
    tokio::time::timeout(within, task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not granted within {within:?}"))
        .unwrap()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The lock `key` is free: no hash on Redis, and another service gets a write hold and then a
/// read hold at once. Waits up to `within` for that (a give-back or a repeated release runs in
/// the background).
pub(crate) async fn ends_up_free(fx: &Fixture, service: &LockService, key: &str, within: Duration) {
    eventually(
        &format!("{key} is free for writers and readers"),
        within,
        || async {
            if fx.exists(&rw_key(key)) {
                return false;
            }
            let Ok(w) = service.write(key).try_once().await else {
                return false;
            };
            w.release().await.unwrap();
            let Ok(r) = service.read(key).try_once().await else {
                return false;
            };
            r.release().await.unwrap();
            true
        },
    )
    .await;
    assert!(
        !fx.exists(&rw_key(key)),
        "{key}: released holds leave no hash"
    );
}
