use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "catalog:<id>", kind = "read", hold_at_least = "30s")]
async fn decrease_stock(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
