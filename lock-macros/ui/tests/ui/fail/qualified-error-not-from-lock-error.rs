use lock_runtime::distributed_lock;

mod errors {
    #[derive(Debug)]
    pub struct AppError;
}

#[distributed_lock(key = "goods:<id>")]
async fn decrease_stock(id: u64) -> Result<u64, crate::errors::AppError> {
    Ok(id)
}

fn main() {}
