//! A positional key (as lock4j users write it); braces and `#` that name no parameter are
//! literal text.
use lock_runtime::{LockError, distributed_lock};

#[distributed_lock("goods:<id>", wait = "1s")]
async fn positional(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "shop:{eu}:#1:<id>")]
async fn literal_braces(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(positional(1).await.unwrap(), 1);
    assert_eq!(literal_braces(2).await.unwrap(), 2);
}
