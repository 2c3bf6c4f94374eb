//! Locked bodies: a future that runs holding a lock (an annotated fn's body, or the closure of
//! [`LockRequest::run`](crate::LockRequest::run)), and what it can read about that lock.

use std::future::Future;
use std::pin::{Pin, pin};

use crate::engine::{Guard, guard};
use crate::error::{ErrorKind, LockError};
use crate::owner;
use crate::vocab::HoldMode;

tokio::task_local! {
    static HELD: Held;
}

/// The lock a locked body runs under: its key and fencing token.
///
/// Handed to the closure of [`LockRequest::run`](crate::LockRequest::run); inside an annotated
/// fn's body, [`current_fence`] and [`current_lock_key`] read the same. The `Held` of a read
/// body cannot make fenced writes (see [`fenced`](crate::fenced#read-holds-do-not-write)).
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let token = locks
///     .lock("job:nightly")
///     .run(|held| async move {
///         println!("running under {} with token {}", held.key(), held.fence());
///         Ok::<_, lock_runtime::LockError>(held.fence())
///     })
///     .await?;
/// # let _ = token;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    key: String,
    fence: u64,
    /// A read share: its token orders what it read, it does not write.
    read: bool,
}

impl Held {
    pub(crate) fn of(guard: &Guard) -> Self {
        Held {
            key: guard.key().to_owned(),
            fence: guard.fence(),
            read: guard.mode() == HoldMode::Read,
        }
    }

    /// The body runs under a read share: fenced writes refuse it.
    pub(crate) fn is_read(&self) -> bool {
        self.read
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

/// Runs `body` as the locked body of the holds `cores` (one lock, or the locks of a multi-key
/// hold in the order they were taken): lock calls in it (however deep) re-enter any of them,
/// [`current_fence`] and [`current_lock_key`] read the first. The holds are released after
/// the body, also when it panics or the returned future is dropped (the guards' drop releases
/// in the background).
///
/// Returns `Err` (kind `Lost`) when a lock was lost while the body ran and `on_lost` stopped
/// it, and - whatever `on_lost` says - when one was lost before the body started: the body does
/// not start then, and the holds are released.
///
/// The body comes boxed: a locked body is often itself a future that awaits locked bodies
/// (nested annotated fns, `join!` of them), and carried by value through the layers below it
/// would be stored once per layer, so that nesting multiplied a future's size (100 KB for two
/// levels in a debug build, enough to overflow a thread's stack).
pub(crate) async fn run_body<T>(
    mut cores: Vec<Guard>,
    on_lost: OnLost,
    body: Pin<Box<impl Future<Output = T>>>,
) -> Result<T, LockError> {
    let Some(first) = cores.first() else {
        // `lock_all` refuses an empty list before acquiring anything
        return Err(LockError::new(
            ErrorKind::InvalidKey,
            "a multi-key lock was given no keys",
        ));
    };
    // a hold already lost (its lease ran out while the others were taken, say) never starts
    // the body: another owner may hold that lock by now
    if let Some(lost) = cores.iter().find(|core| core.is_lost()) {
        let err = lost.lost().await;
        if let Err(e) = guard::release_all(cores).await {
            tracing::debug!(error = %e, "releasing the holds of a body that did not start");
        }
        return Err(err);
    }
    let held = Held::of(first);
    for core in &mut cores {
        // the body is a call chain of its own: its siblings wait for it as usual
        core.open_body();
    }
    let holds = cores.iter().map(|core| {
        let (service, lock) = core.chain_frame();
        (service, lock, core.owner().clone())
    });
    let body = owner::bodies_scope(holds, body);
    let refs: Vec<&Guard> = cores.iter().collect();
    let outcome = watch(held, body, guard::lost_any(&refs), on_lost).await;
    if outcome.is_ok()
        && let Err(e) = guard::release_all(cores).await
    {
        // The body has run: its result stands. The lock is gone or expires by its lease; the
        // fencing token is what protects the data from here.
        tracing::warn!(error = %e, "releasing after the locked body failed");
    }
    outcome
}

/// Runs `body` with `held` as the lock [`current_fence`] reads, until it finishes or `lost`
/// resolves; then as `on_lost` says.
async fn watch<T>(
    held: Held,
    body: impl Future<Output = T>,
    lost: impl Future<Output = LockError>,
    on_lost: OnLost,
) -> Result<T, LockError> {
    HELD.scope(held, async {
        let mut body = pin!(body);
        tokio::select! {
            biased;
            result = &mut body => Ok(result),
            lost = lost => match on_lost {
                OnLost::Fail => Err(lost),
                OnLost::Continue => {
                    tracing::warn!(error = %lost, "lock lost while the body runs; on_lost = \"continue\" lets it finish");
                    Ok(body.await)
                }
            },
        }
    })
    .await
}

/// The fencing token of the lock the current locked body runs under (an annotated fn's body or
/// a [`LockRequest::run`](crate::LockRequest::run) closure; the innermost one when they nest),
/// or `None` outside such a body.
///
/// Write it next to the data the lock protects, and reject writes that carry an older token.
///
/// In the body of a write lock (`kind = "write"`) it is the token of that write hold. In the
/// body of a read lock (`kind = "read"`) it is `None`, also inside a write body: a read share
/// does not write (see [`fenced`](crate::fenced#read-holds-do-not-write)). In the body of a
/// multi-key lock (`keys = [..]`) it is the token of the first of its locks in the order they
/// were taken: the order of their Redis keys, the same in every process and whatever order the
/// keys were listed in (for `["account:<from>", "account:<to>"]`, the same account for a
/// transfer either way). For the token of each lock, take them with
/// [`LockService::lock_all`](crate::LockService::lock_all) and read
/// [`MultiGuard::fence`](crate::MultiGuard::fence).
pub fn current_fence() -> Option<u64> {
    HELD.try_with(|h| (!h.read).then_some(h.fence))
        .ok()
        .flatten()
}

/// The key of the lock the current locked body runs under, or `None` outside. In the body of a
/// multi-key lock: the key of the first lock taken, the one [`current_fence`] is the token of.
pub fn current_lock_key() -> Option<String> {
    HELD.try_with(|h| h.key.clone()).ok()
}
