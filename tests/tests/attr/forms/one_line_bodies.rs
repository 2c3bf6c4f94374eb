//! One-line bodies draw no lint the user did not cause.
#![deny(warnings)]

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "goods:<id>")]
async fn one_line(id: u64) -> Result<u64, LockError> { Ok(id) }

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(one_line(1).await.unwrap(), 1);
}
