//! Return types other than `Result<T, E>` that carry a lock error: result aliases of any name,
//! axum's `Response` and actix-web's `HttpResponse` (a lock error becomes the response), and
//! `Result<impl IntoResponse, LockError>`.
use axum::response::{IntoResponse, Response};
use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "goods:<id>")]
async fn aliased(id: u64) -> AppResult<u64> {
    Ok(id)
}

#[distributed_lock(key = "goods:<id>")]
async fn axum_handler(id: u64) -> Response {
    format!("bought {id}").into_response()
}

#[distributed_lock(key = "goods:<id>")]
async fn actix_handler(id: u64) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok().body(format!("bought {id}"))
}

#[distributed_lock(key = "goods:<id>")]
async fn opaque_ok(id: u64) -> Result<impl IntoResponse, LockError> {
    Ok(format!("bought {id}"))
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(aliased(1).await.unwrap(), 1);
    assert_eq!(axum_handler(2).await.status(), axum::http::StatusCode::OK);
    assert_eq!(
        actix_handler(3).await.status(),
        actix_web::http::StatusCode::OK
    );
    assert!(opaque_ok(4).await.is_ok());
}
