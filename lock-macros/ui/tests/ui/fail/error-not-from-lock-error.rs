use lock_runtime::distributed_lock;

#[derive(Debug)]
struct AppError;

#[distributed_lock(key = "goods:<id>")]
async fn decrease_stock(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
