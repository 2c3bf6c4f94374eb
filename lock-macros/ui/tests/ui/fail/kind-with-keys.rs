use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], kind = "read")]
async fn balances(from: u64, to: u64) -> Result<(), AppError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
