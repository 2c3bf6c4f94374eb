use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

mod app {
    pub type Result<T> = std::result::Result<T, super::AppError>;
}

mod deps {
    pub use lock_runtime as locks;
}

#[distributed_lock(key = "alias:<id>")]
async fn one_argument_alias(id: u64) -> app::Result<u64> {
    Ok(id)
}

#[distributed_lock(key = "path:<id>")]
async fn full_path(id: u64) -> ::core::result::Result<u64, crate::AppError> {
    Ok(id)
}

#[distributed_lock(key = "renamed:<id>", crate = "crate::deps::locks")]
async fn renamed_runtime(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _ = one_argument_alias(1);
    let _ = full_path(1);
    let _ = renamed_runtime(1);
}
