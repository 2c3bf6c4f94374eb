//! The lock an annotated fn's body runs under, readable from inside the body.

use crate::guard::LockGuard;

tokio::task_local! {
    static HELD: HeldLock;
}

/// What the body of an annotated fn can know about the lock it runs under.
#[derive(Debug, Clone)]
pub(crate) struct HeldLock {
    key: String,
    fence: u64,
}

impl HeldLock {
    pub(crate) fn of(guard: &LockGuard) -> Self {
        HeldLock {
            key: guard.key().to_owned(),
            fence: guard.fence(),
        }
    }
}

pub(crate) fn scope<F: std::future::Future>(
    held: HeldLock,
    f: F,
) -> impl std::future::Future<Output = F::Output> {
    HELD.scope(held, f)
}

/// The fencing token of the lock the current `#[distributed_lock]` body runs under (the
/// innermost one when they nest), or `None` outside such a body.
///
/// Write it next to the data the lock protects, and reject writes that carry an older token.
pub fn current_fence() -> Option<u64> {
    HELD.try_with(|h| h.fence).ok()
}

/// The key of the lock the current `#[distributed_lock]` body runs under, or `None` outside.
pub fn current_lock_key() -> Option<String> {
    HELD.try_with(|h| h.key.clone()).ok()
}
