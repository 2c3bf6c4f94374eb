use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "goods:#id")]
async fn decrease_stock(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
