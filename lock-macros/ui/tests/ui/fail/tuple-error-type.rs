use axum::http::StatusCode;
use lock_runtime::distributed_lock;

#[distributed_lock(key = "goods:<id>")]
async fn buy(id: u64) -> Result<String, (StatusCode, String)> {
    Ok(format!("bought {id}"))
}

fn main() {}
