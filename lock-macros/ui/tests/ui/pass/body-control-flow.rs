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

fn main() {
    let _ = parse_positive("1".into());
    let _ = only_returns(1);
    let _ = question_mark_in_closure_and_block("1");
    let _ = [AppError::Lock, AppError::Parse, AppError::Negative];
}
