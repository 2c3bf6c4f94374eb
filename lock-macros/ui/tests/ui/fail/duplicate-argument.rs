use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "goods:<id>", lease = "5s", lease = "10s")]
async fn decrease_stock(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
