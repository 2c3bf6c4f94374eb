//! Locked bodies: a future that runs holding a lock (an annotated fn's body, or the closure of
//! [`LockRequest::run`](crate::LockRequest::run)), and what it can read about that lock.

use std::future::Future;
use std::pin::pin;

use crate::engine::Guard;
use crate::error::LockError;
use crate::owner;

tokio::task_local! {
    static HELD: Held;
}

/// The lock a locked body runs under: its key and fencing token.
///
/// Handed to the closure of [`LockRequest::run`](crate::LockRequest::run); inside an annotated
/// fn's body, [`current_fence`] and [`current_lock_key`] read the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    key: String,
    fence: u64,
}

impl Held {
    pub(crate) fn of(guard: &Guard) -> Self {
        Held {
            key: guard.key().to_owned(),
            fence: guard.fence(),
        }
    }

    /// The lock key as it was asked for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of the hold (see [`LockGuard::fence`](crate::LockGuard::fence)).
    pub fn fence(&self) -> u64 {
        self.fence
    }
}

/// What a locked body does when its lock is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    /// Stop the body (drop it) and report the loss.
    Fail,
    /// Let the body finish and log a warning.
    Continue,
}

/// Runs `body` as the locked body of `guard`'s hold: lock calls in it (however deep) re-enter
/// the hold, [`current_fence`] reads its token. The hold is released after the body, also when
/// it panics or the returned future is dropped (the guard's drop releases in the background).
///
/// Returns `Err` (kind `Lost`) when the lock was lost while the body ran and `on_lost` stopped
/// it.
pub(crate) async fn run_body<T>(
    guard: Guard,
    on_lost: OnLost,
    body: impl Future<Output = T>,
) -> Result<T, LockError> {
    let held = Held::of(&guard);
    let (service, lock) = guard.chain_frame();
    let body = owner::body_scope(service, lock, guard.owner().clone(), body);
    let outcome = HELD
        .scope(held, async {
            let mut body = pin!(body);
            tokio::select! {
                biased;
                result = &mut body => Ok(result),
                lost = guard.lost() => match on_lost {
                    OnLost::Fail => Err(lost),
                    OnLost::Continue => {
                        tracing::warn!(error = %lost, "lock lost while the body runs; on_lost = \"continue\" lets it finish");
                        Ok(body.await)
                    }
                },
            }
        })
        .await;
    if outcome.is_ok()
        && let Err(e) = guard.release().await
    {
        // The body has run: its result stands. The lock is gone or expires by its lease; the
        // fencing token is what protects the data from here.
        tracing::warn!(error = %e, "releasing after the locked body failed");
    }
    outcome
}

/// The fencing token of the lock the current locked body runs under (an annotated fn's body or
/// a [`LockRequest::run`](crate::LockRequest::run) closure; the innermost one when they nest),
/// or `None` outside such a body.
///
/// Write it next to the data the lock protects, and reject writes that carry an older token.
pub fn current_fence() -> Option<u64> {
    HELD.try_with(|h| h.fence).ok()
}

/// The key of the lock the current locked body runs under, or `None` outside.
pub fn current_lock_key() -> Option<String> {
    HELD.try_with(|h| h.key.clone()).ok()
}
