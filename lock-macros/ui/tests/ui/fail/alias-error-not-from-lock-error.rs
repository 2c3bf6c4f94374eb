use lock_runtime::distributed_lock;

#[derive(Debug)]
struct AppError;

mod app {
    pub type Result<T> = std::result::Result<T, super::AppError>;
}

#[distributed_lock(key = "goods:<id>")]
async fn decrease_stock(id: u64) -> app::Result<u64> {
    Ok(id)
}

fn main() {}
