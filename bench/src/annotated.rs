//! The annotated-fn path: acquire and release through `#[distributed_lock]` and the global
//! service set up with `lock_runtime::init`.

/// An empty critical section under the lock `bench:<id>`.
#[lock_runtime::distributed_lock(key = "bench:<id>", lease = "5s", wait = "2s")]
pub(crate) async fn locked(id: u64) -> Result<(), lock_runtime::LockError> {
    Ok(())
}
