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

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    nightly("a").await.unwrap();
    fractions("b").await.unwrap();
    days("c").await.unwrap();
}
