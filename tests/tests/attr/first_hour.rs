//! What a new user meets first: a service started without `init` and without a config file
//! answers 500 (a mistake to fix), not 503 "try again"; `init_from_env` reports it at start-up.

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use lock_runtime::middleware::tower::OwnerScopeLayer;
use lock_runtime::{ErrorKind, LockError, distributed_lock};
use tower::ServiceExt;

#[distributed_lock(key = "goods:<id>", wait = "1s")]
async fn buy(id: u64) -> Result<String, LockError> {
    Ok(format!("bought {id}"))
}

#[tokio::test]
async fn no_configuration_is_a_500_and_init_from_env_says_so_at_start_up() {
    // no init, no $LOCK_CONFIG, and no ./lock.toml where the test runs (in a process of its own
    // under nextest, so no other test of this binary initialised the registry)
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    let err = lock_runtime::init_from_env().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotInitialized, "{err}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("lock.toml"), "{err}");

    let app = Router::new()
        .route("/buy", post(|| async { buy(7).await }))
        .layer(OwnerScopeLayer::new());
    let response = app
        .oneshot(
            axum::http::Request::post("/buy")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    assert!(response.headers().get("retry-after").is_none());
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"], "lock_error", "{json}");
}
