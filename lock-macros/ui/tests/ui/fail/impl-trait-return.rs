use lock_runtime::distributed_lock;

// Shaped like axum's `IntoResponse`.
trait IntoResponse {}
impl IntoResponse for String {}

#[distributed_lock(key = "goods:<id>")]
async fn buy(id: u64) -> impl IntoResponse {
    format!("bought {id}")
}

fn main() {}
