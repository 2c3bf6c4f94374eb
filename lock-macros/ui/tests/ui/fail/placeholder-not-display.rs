use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

struct Goods {
    id: u64,
}

#[distributed_lock(key = "goods:<goods>")]
async fn decrease_stock(goods: Goods) -> Result<u64, AppError> {
    Ok(goods.id)
}

fn main() {}
