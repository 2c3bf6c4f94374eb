//! Pattern parameters (tuple structs shaped like axum's extractors, tuples, structs, slices,
//! `mut`, `ref`, `ref mut`, `@` bindings, raw identifiers): every name they bind can be a key
//! placeholder, fields of it too.
use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

// Shaped like axum's extractors.
struct Path<T>(T);
struct Json<T>(T);
struct State<T>(T);

struct CurrentUser {
    id: u64,
    team: Team,
}

struct Team {
    name: String,
}

struct Point {
    x: i32,
    y: i32,
}

#[distributed_lock(key = "order:<order_id>:user:<user.id>:team:<user.team.name>")]
async fn pay(
    Path(order_id): Path<u64>,
    State(_db): State<()>,
    user: CurrentUser,
) -> Result<Json<u64>, AppError> {
    Ok(Json(order_id + user.id))
}

#[distributed_lock(key = "pair:<a>:<b>:<pair.0>:<x>:<y_renamed>:<first>")]
async fn nested(
    (a, (b, _)): (u8, (u8, u8)),
    pair: (u32, u32),
    Point { x, y: y_renamed }: Point,
    [first, ..]: [u8; 3],
) -> Result<i32, AppError> {
    Ok(x + y_renamed + i32::from(a) + i32::from(b) + i32::from(first) + pair.1 as i32)
}

// `ref` parameters are what this fn shows (clippy would have them written as `&` types)
#[allow(clippy::toplevel_ref_arg)]
#[distributed_lock(key = "counter:<count>:<r#type>:<named>")]
async fn mut_and_ref(
    mut count: u32,
    ref r#type: String,
    ref mut named: String,
) -> Result<u32, AppError> {
    count += 1;
    named.push_str(r#type);
    Ok(count)
}

#[distributed_lock(key = "whole:<whole.0>:<inner>")]
async fn at_binding(whole @ Path(inner): Path<u8>) -> Result<u8, AppError> {
    Ok(whole.0 + inner)
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    let user = CurrentUser {
        id: 1,
        team: Team { name: "a".into() },
    };
    let Json(paid) = pay(Path(1), State(()), user).await.unwrap();
    assert_eq!(paid, 2);
    let sum = nested((1, (2, 3)), (4, 5), Point { x: 1, y: 2 }, [1, 2, 3]);
    assert_eq!(sum.await.unwrap(), 12);
    assert_eq!(mut_and_ref(1, "t".into(), "n".into()).await.unwrap(), 2);
    assert_eq!(at_binding(Path(1)).await.unwrap(), 2);
}
