use axum::response::IntoResponse;
use lock_runtime::distributed_lock;

#[distributed_lock(key = "goods:<id>")]
async fn buy(id: u64) -> impl IntoResponse {
    format!("bought {id}")
}

fn main() {}
