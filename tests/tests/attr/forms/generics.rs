//! Generic fns: type parameters in the key, `where` clauses, explicit and elided lifetimes,
//! and a generic error type.
use std::fmt::Display;

use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "item:<id>")]
async fn generic_key<K: Display + Send>(id: K) -> Result<K, AppError> {
    Ok(id)
}

#[distributed_lock(key = "item:<id>")]
async fn where_clause<'a, K, V>(id: &'a K, value: V) -> Result<&'a K, AppError>
where
    K: Display + Sync + ?Sized,
    V: Into<u64>,
{
    let _: u64 = value.into();
    Ok(id)
}

// The error type may be generic too.
#[distributed_lock(key = "item:<id>")]
async fn generic_error<E: From<LockError>>(id: u64) -> Result<u64, E> {
    Ok(id)
}

#[distributed_lock(key = "slice:<name>")]
async fn elided_lifetimes(name: &str, items: &[u8]) -> Result<&'static str, AppError> {
    let _ = (name, items);
    Ok("done")
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(generic_key(1u8).await.unwrap(), 1);
    assert_eq!(where_clause("k", 1u32).await.unwrap(), "k");
    assert_eq!(generic_error::<AppError>(1).await.unwrap(), 1);
    assert_eq!(elided_lifetimes("n", &[1]).await.unwrap(), "done");
}
