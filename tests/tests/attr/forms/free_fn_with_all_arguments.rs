//! A free fn with every argument set, in any order; docs, visibility and other attributes stay
//! on the fn; hash tags and `<<` in the key.
use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

/// Docs and other attributes stay on the fn.
#[distributed_lock(key = "goods:<id>", lease = "5s", wait = "2s", on_lost = "continue")]
#[must_use = "the stock is returned"]
pub(crate) async fn decrease_stock(id: u64, qty: u32) -> Result<u32, AppError> {
    Ok(qty)
}

#[distributed_lock(key = "report", wait = "forever", lease = "1h", on_lost = "fail")]
async fn nightly_report() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "{hash-tag}:<<literal>:<id>", wait = "500ms", lease = "2m")]
async fn braces_and_escapes(id: &str) -> std::result::Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(decrease_stock(1, 2).await.unwrap(), 2);
    nightly_report().await.unwrap();
    braces_and_escapes("x").await.unwrap();
}
