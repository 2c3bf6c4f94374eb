//! The global service's thread: a small runtime of its own that drives the connections,
//! watchdog and subscriber of the process-wide [`LockService`](crate::LockService).
//!
//! Annotated fns may run on any runtime (each `#[tokio::test]` has its own, actix-web runs one
//! per worker thread): a service driven by one of them would stop with it. Services made with
//! [`LockService::connect`](crate::LockService::connect) run on their caller's runtime instead,
//! where replies wake the waiting tasks without a hop between threads (the bench's S2 to S4
//! measure the difference; S1, one task alone, is faster on a thread of its own).

use std::future::Future;
use std::sync::LazyLock;

use crate::error::{ErrorKind, LockError};

static DRIVER: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("lock-runtime-global")
        .enable_all()
        .build()
        .expect("cannot start the global lock service's thread")
});

/// Runs `future` on the global service's thread and waits for it from any executor.
pub(crate) async fn run<T: Send + 'static>(
    future: impl Future<Output = Result<T, LockError>> + Send + 'static,
) -> Result<T, LockError> {
    DRIVER.spawn(future).await.map_err(|e| {
        LockError::new(
            ErrorKind::Backend,
            format!("a call on the global lock service's thread failed: {e}"),
        )
    })?
}

/// Runs `future` to its end from a thread that runs no runtime, with the global service's
/// runtime driving its I/O and timers (the blocking API).
#[cfg(feature = "blocking")]
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    DRIVER.block_on(future)
}
