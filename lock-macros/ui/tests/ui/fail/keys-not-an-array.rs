use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(keys = "account:<id>")]
async fn close_account(id: u64) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {}
