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

fn main() {
    let _ = generic_key(1u8);
    let _ = where_clause("k", 1u32);
    let _ = generic_error::<AppError>(1);
    let _ = elided_lifetimes("n", &[1]);
}
