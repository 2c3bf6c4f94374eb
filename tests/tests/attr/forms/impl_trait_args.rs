//! `impl Trait` parameters, one of them in the key, and `Result<impl Trait, E>` returns.
use std::fmt::Display;

use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "user:<user>")]
async fn impl_trait_args(
    user: impl Display,
    items: impl IntoIterator<Item = u32>,
) -> Result<u32, AppError> {
    let _ = user;
    Ok(items.into_iter().sum())
}

// `impl Trait` in the return type is fine too.
#[distributed_lock(key = "user:<user>")]
async fn impl_trait_return(user: u64) -> Result<impl Display, AppError> {
    Ok(user)
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(impl_trait_args("ann", [1, 2]).await.unwrap(), 3);
    assert_eq!(impl_trait_return(1).await.unwrap().to_string(), "1");
}
