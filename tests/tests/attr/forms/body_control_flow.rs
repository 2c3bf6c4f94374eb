//! The body's control flow is the fn's own: `?` converts through `From`, `return` leaves the
//! body early (also from a body that is only a `return`), `?` inside closures and async blocks
//! of the body, and the body may move its arguments.
use std::num::ParseIntError;

use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock,
    Parse,
    Negative,
}

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError::Lock
    }
}

impl From<ParseIntError> for AppError {
    fn from(_: ParseIntError) -> Self {
        AppError::Parse
    }
}

async fn load(text: &str) -> Result<i64, ParseIntError> {
    text.parse()
}

// `?` converts through `From`, `return` leaves the body early, the body moves its arguments.
#[distributed_lock(key = "parse:<text>")]
async fn parse_positive(text: String) -> Result<i64, AppError> {
    let value = load(&text).await?;
    if value < 0 {
        return Err(AppError::Negative);
    }
    drop(text);
    Ok(value)
}

#[distributed_lock(key = "early:<id>")]
async fn only_returns(id: u32) -> Result<u32, AppError> {
    return Ok(id);
}

#[distributed_lock(key = "unit:<id>")]
async fn question_mark_in_closure_and_block(id: &str) -> Result<(), AppError> {
    let parse = |s: &str| -> Result<i64, ParseIntError> { s.parse::<i64>() };
    let doubled = async { Ok::<_, AppError>(parse(id)? * 2) }.await?;
    let _ = doubled;
    Ok(())
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(parse_positive("1".into()).await.unwrap(), 1);
    assert!(matches!(
        parse_positive("x".into()).await,
        Err(AppError::Parse)
    ));
    assert!(matches!(
        parse_positive("-1".into()).await,
        Err(AppError::Negative)
    ));
    assert_eq!(only_returns(1).await.unwrap(), 1);
    question_mark_in_closure_and_block("1").await.unwrap();
    assert!(matches!(
        question_mark_in_closure_and_block("x").await,
        Err(AppError::Parse)
    ));
}
