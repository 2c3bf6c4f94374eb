//! The tower middleware on axum, over real HTTP: owner scopes per request, request ids, lock
//! errors as responses, and the flash-sale shop on three instances.

use std::sync::Arc;

use crate::web_common::{send, setup};
use axum::extract::Path;
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_examples::axum_shop;
use lock_examples::shop::Store;
use lock_runtime::middleware::tower::OwnerScopeLayer;
use lock_runtime::middleware::{OwnerScopeConfig, RequestId, current_request_id};
use lock_runtime::owner;
use lock_tests::harness::unique_key;
use serde_json::json;

/// The test routes of `web_common`, in an owner scope made with `scope` (none: no middleware).
fn app(scope: Option<OwnerScopeConfig>) -> Router {
    let router = Router::new()
        .route(
            "/hold/{key}/{ms}",
            post(|Path((key, ms)): Path<(String, u64)>| async move {
                crate::web_common::hold(&key, ms).await.map(Json)
            }),
        )
        .route(
            "/locked/{key}",
            post(|Path(key): Path<String>| async move {
                crate::web_common::locked_section(&key).await.map(Json)
            }),
        )
        .route(
            "/hold-then-call/{key}",
            post(|Path(key): Path<String>| async move {
                crate::web_common::hold_then_call(&key).await.map(Json)
            }),
        )
        .route(
            "/bad-key",
            post(|| async move { crate::web_common::bad_key().await.map(Json) }),
        )
        .route(
            "/ids",
            get(|id: RequestId| async move {
                Json(json!({
                    "extension": id.as_str(),
                    "task_local": current_request_id().map(|r| r.to_string()),
                    "owner": owner::try_current().map(|o| o.to_string()),
                }))
            }),
        );
    match scope {
        Some(config) => router.layer(OwnerScopeLayer::with_config(config)),
        None => router,
    }
}

/// Serves `app` on a free loopback port for the rest of the test; returns its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_locked_calls_in_one_request_reenter() {
    setup().await;
    let scoped = serve(app(Some(OwnerScopeConfig::new()))).await;
    let bare = serve(app(None)).await;
    crate::web_common::nested_calls_reenter_within_a_request(&scoped, &bare).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_requests_with_the_same_forged_id_still_exclude_each_other() {
    setup().await;
    let base = serve(app(Some(OwnerScopeConfig::new()))).await;
    crate::web_common::same_request_id_concurrently(&base, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_request_id_reenters_across_requests() {
    setup().await;
    let config = OwnerScopeConfig::new().trust_request_id_as_owner();
    let base = serve(app(Some(config))).await;
    crate::web_common::same_request_id_concurrently(&base, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_errors_become_short_json_responses() {
    setup().await;
    let base = serve(app(Some(OwnerScopeConfig::new()))).await;
    crate::web_common::other_lock_errors_are_short_500s(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_read_made_echoed_and_extracted() {
    setup().await;
    let base = serve(app(Some(OwnerScopeConfig::new()))).await;
    crate::web_common::request_ids_are_read_made_and_echoed(&base).await;
    let bare = serve(app(None)).await;
    let missing = send(crate::web_common::client().get(format!("{bare}/ids"))).await;
    assert_eq!(missing.status, 500, "the extractor needs the layer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_on_three_instances_never_oversells() {
    let redis = setup().await;
    let namespace = unique_key("shop");
    let mut targets = Vec::new();
    for i in 0..3 {
        let shop = axum_shop::Shop {
            store: Store::connect(&redis, &namespace).await.unwrap(),
            instance: Arc::from(format!("axum-{i}")),
        };
        targets.push(serve(axum_shop::router(shop, OwnerScopeConfig::new())).await);
    }
    crate::web_common::three_instances_never_oversell(targets).await;
}
