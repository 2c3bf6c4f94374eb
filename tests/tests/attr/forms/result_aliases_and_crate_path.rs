//! Result types by any path: a one-argument `Result<T>` alias, `::core::result::Result` with a
//! `crate::` error path; and the runtime under another name (`crate = ".."`).
use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

mod app {
    pub(super) type Result<T> = std::result::Result<T, super::AppError>;
}

mod deps {
    pub(super) use lock_runtime as locks;
}

#[distributed_lock(key = "alias:<id>")]
async fn one_argument_alias(id: u64) -> app::Result<u64> {
    Ok(id)
}

#[distributed_lock(key = "path:<id>")]
async fn full_path(
    id: u64,
) -> ::core::result::Result<u64, crate::forms::result_aliases_and_crate_path::AppError> {
    Ok(id)
}

#[distributed_lock(
    key = "renamed:<id>",
    crate = "crate::forms::result_aliases_and_crate_path::deps::locks"
)]
async fn renamed_runtime(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(one_argument_alias(1).await.unwrap(), 1);
    assert_eq!(full_path(1).await.unwrap(), 1);
    assert_eq!(renamed_runtime(1).await.unwrap(), 1);
}
