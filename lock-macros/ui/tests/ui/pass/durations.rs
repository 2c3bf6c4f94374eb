//! One duration grammar with the config file: fractions, days, and a zero wait ("try once,
//! skip if busy").
use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "job:<name>", wait = "0s")]
async fn nightly(name: &str) -> Result<(), LockError> {
    let _ = name;
    Ok(())
}

#[distributed_lock(key = "job:<name>", lease = "1.5s", wait = "0.25m")]
async fn fractions(name: &str) -> Result<(), LockError> {
    let _ = name;
    Ok(())
}

#[distributed_lock(key = "job:<name>", lease = "1d", wait = "forever")]
async fn days(name: &str) -> Result<(), LockError> {
    let _ = name;
    Ok(())
}

fn main() {
    let _ = (nightly("a"), fractions("b"), days("c"));
}
