//! What a new user meets first: a service started without `init` and without a config file
//! answers 500 (a mistake to fix), not 503 "try again"; `init_from_env` reports it at start-up.

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use lock_runtime::middleware::tower::OwnerScopeLayer;
use lock_runtime::{CONFIG_ENV, ErrorKind, LockError, distributed_lock};
use lock_tests::harness::unique_key;
use std::time::Duration;
use tower::ServiceExt;

use crate::common::{Fixture, Worker};

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

/// A service deployed as a binary with its `lock.toml` beside it finds the file wherever it is
/// started from: no `$LOCK_CONFIG`, no `lock.toml` in the working directory.
#[tokio::test]
async fn init_from_env_finds_the_config_file_beside_the_executable() {
    let fx = Fixture::single().await;
    let dir = tempfile::tempdir().unwrap();
    let (bin, elsewhere) = (dir.path().join("bin"), dir.path().join("elsewhere"));
    std::fs::create_dir(&bin).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    let exe = bin.join("lock-worker");
    std::fs::copy(env!("CARGO_BIN_EXE_lock-worker"), &exe).unwrap();
    let written = fx.config_file(&bin, Duration::from_secs(30), "");
    std::fs::rename(written, bin.join("lock.toml")).unwrap();

    let key = unique_key("beside");
    let args = ["from-env", "annotated", key.as_str()];
    let mut worker = Worker::spawn_program_in(exe.to_str().unwrap(), &args, &elsewhere, CONFIG_ENV);
    let line = worker.line(Duration::from_secs(30)).await;
    assert!(line.starts_with("ok "), "{line}");
    assert!(worker.success(Duration::from_secs(10)).await);

    // the working directory's file comes first
    std::fs::write(
        elsewhere.join("lock.toml"),
        "[redis]\nmode = \"nonsense\"\n",
    )
    .unwrap();
    let worker = Worker::spawn_program_in(exe.to_str().unwrap(), &args, &elsewhere, CONFIG_ENV);
    assert!(
        !worker.success(Duration::from_secs(30)).await,
        "started with the file beside the executable although the working directory has one"
    );
}
