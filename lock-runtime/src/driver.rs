//! The library's I/O thread: one small runtime that drives the Redis connections, watchdogs and
//! subscribers of every [`LockService`](crate::LockService) in the process.
//!
//! Why a thread of its own rather than the caller's runtime:
//! - a service keeps working when it is used from several runtimes, or after the runtime that
//!   created it shut down (each `#[tokio::test]` has its own);
//! - latency: a reply is read and handed to the waiting caller by a thread that does nothing
//!   else, instead of by a worker that may be busy with application tasks or asleep in the
//!   caller's runtime (the bench's S1 measures the difference).
//!
//! Lock calls still run their own logic in the caller's task; only the connections' reading
//! and writing, and the background tasks, live here.

use std::future::Future;
use std::sync::LazyLock;

use crate::error::{ErrorKind, LockError};

static DRIVER: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("lock-runtime-io")
        .enable_all()
        .build()
        .expect("cannot start the lock service's I/O thread")
});

/// Runs `future` on the I/O thread and waits for it from any executor.
pub(crate) async fn run<T: Send + 'static>(
    future: impl Future<Output = Result<T, LockError>> + Send + 'static,
) -> Result<T, LockError> {
    DRIVER.spawn(future).await.map_err(|e| {
        LockError::new(
            ErrorKind::Backend,
            format!("the lock service's I/O thread failed: {e}"),
        )
    })?
}
