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

/// A user's test of an annotated fn in three lines: `testing::init()` starts a private
/// redis-server for the test process and sets the global service up on it.
#[tokio::test]
async fn a_users_test_needs_three_lines() {
    let locks = lock_runtime::testing::init().await;
    assert_eq!(buy(7).await.unwrap(), "bought 7");
    // a second init in the same process shares the server and the service
    assert!(std::ptr::eq(locks, lock_runtime::testing::init().await));
}

/// The test server goes away with its owner: when the `RedisServer` is dropped, and when the
/// process that started it is killed with SIGKILL (no destructor runs).
#[tokio::test]
async fn a_test_server_stops_when_dropped_and_when_its_process_is_killed() {
    let answers = |port: u16| async move {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        match client.get_multiplexed_async_connection().await {
            Ok(mut con) => redis::cmd("PING")
                .query_async::<String>(&mut con)
                .await
                .is_ok(),
            Err(_) => false,
        }
    };
    let gone_within = |port: u16, what: &'static str| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while answers(port).await {
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let server = lock_runtime::testing::RedisServer::start().await.unwrap();
    let port = server.port();
    assert!(answers(port).await);
    drop(server);
    gone_within(port, "still answering after the RedisServer was dropped").await;

    let mut worker = Worker::spawn(&["testing-server"]);
    let line = worker.line(Duration::from_secs(20)).await;
    let port: u16 = line.strip_prefix("port ").unwrap().parse().unwrap();
    assert!(answers(port).await, "{line}");
    let pid = i32::try_from(worker.pid()).unwrap();
    // SAFETY: kill(2) on the worker's pid
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    gone_within(port, "still answering after its process was killed").await;
}
