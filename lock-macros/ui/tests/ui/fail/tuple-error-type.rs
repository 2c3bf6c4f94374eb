use lock_runtime::distributed_lock;

// Shaped like axum's `StatusCode`.
struct StatusCode(u16);

#[distributed_lock(key = "goods:<id>")]
async fn buy(id: u64) -> Result<String, (StatusCode, String)> {
    Ok(format!("bought {id}"))
}

fn main() {}
