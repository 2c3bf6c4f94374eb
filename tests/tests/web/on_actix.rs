//! The actix-web middleware, over real HTTP: owner scopes per request, request ids, lock errors
//! as responses, and the flash-sale shop on three instances.

use std::sync::Arc;

use crate::web_common::{send, setup};
use actix_web::middleware::Condition;
use actix_web::{App, HttpResponse, HttpServer, web};
use lock_examples::actix_shop;
use lock_examples::shop::Store;
use lock_runtime::LockError;
use lock_runtime::middleware::actix::OwnerScope;
use lock_runtime::middleware::{OwnerScopeConfig, RequestId, current_request_id};
use lock_runtime::owner;
use lock_tests::harness::unique_key;
use serde_json::{Value, json};

type Answer = Result<HttpResponse, LockError>;

fn ok(body: Value) -> HttpResponse {
    HttpResponse::Ok().json(body)
}

async fn hold(path: web::Path<(String, u64)>) -> Answer {
    let (key, ms) = path.into_inner();
    Ok(ok(crate::web_common::hold(&key, ms).await?))
}

async fn locked(key: web::Path<String>) -> Answer {
    Ok(ok(crate::web_common::locked_section(&key).await?))
}

async fn hold_then_call(key: web::Path<String>) -> Answer {
    Ok(ok(crate::web_common::hold_then_call(&key).await?))
}

async fn bad_key() -> Answer {
    Ok(ok(crate::web_common::bad_key().await?))
}

async fn ids(id: RequestId) -> HttpResponse {
    ok(json!({
        "extension": id.as_str(),
        "task_local": current_request_id().map(|r| r.to_string()),
        "owner": owner::try_current().map(|o| o.to_string()),
    }))
}

/// Serves the test routes of `web_common` on a free loopback port, in an owner scope made with
/// `scope` (none: no middleware); returns the base URL.
fn serve(scope: Option<OwnerScopeConfig>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = HttpServer::new(move || {
        let middleware = OwnerScope::with_config(scope.clone().unwrap_or_default());
        App::new()
            .wrap(Condition::new(scope.is_some(), middleware))
            .route("/hold/{key}/{ms}", web::post().to(hold))
            .route("/locked/{key}", web::post().to(locked))
            .route("/hold-then-call/{key}", web::post().to(hold_then_call))
            .route("/bad-key", web::post().to(bad_key))
            .route("/ids", web::get().to(ids))
    })
    .workers(2)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    actix_web::rt::spawn(server);
    format!("http://{addr}")
}

#[actix_web::test]
async fn nested_locked_calls_in_one_request_reenter() {
    setup().await;
    let (scoped, bare) = (serve(Some(OwnerScopeConfig::new())), serve(None));
    crate::web_common::nested_calls_reenter_within_a_request(&scoped, &bare).await;
}

#[actix_web::test]
async fn two_requests_with_the_same_forged_id_still_exclude_each_other() {
    setup().await;
    let base = serve(Some(OwnerScopeConfig::new()));
    crate::web_common::same_request_id_concurrently(&base, false).await;
}

#[actix_web::test]
async fn a_trusted_request_id_reenters_across_requests() {
    setup().await;
    let base = serve(Some(OwnerScopeConfig::new().trust_request_id_as_owner()));
    crate::web_common::same_request_id_concurrently(&base, true).await;
}

#[actix_web::test]
async fn lock_errors_become_short_json_responses() {
    setup().await;
    let base = serve(Some(OwnerScopeConfig::new()));
    crate::web_common::other_lock_errors_are_short_500s(&base).await;
}

#[actix_web::test]
async fn request_ids_are_read_made_echoed_and_extracted() {
    setup().await;
    let base = serve(Some(OwnerScopeConfig::new()));
    crate::web_common::request_ids_are_read_made_and_echoed(&base).await;
    let bare = serve(None);
    let missing = send(crate::web_common::client().get(format!("{bare}/ids"))).await;
    assert_eq!(missing.status, 500, "the extractor needs the middleware");
}

#[actix_web::test]
async fn the_shop_on_three_instances_never_oversells() {
    let redis = setup().await;
    let namespace = unique_key("shop");
    let mut targets = Vec::new();
    for i in 0..3 {
        let shop = actix_shop::Shop {
            store: Store::connect(&redis, &namespace).await.unwrap(),
            instance: Arc::from(format!("actix-{i}")),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        targets.push(format!("http://{}", listener.local_addr().unwrap()));
        let server = HttpServer::new(move || {
            let shop = shop.clone();
            App::new()
                .wrap(OwnerScope::new())
                .configure(|cfg| actix_shop::configure(cfg, shop))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        actix_web::rt::spawn(server);
    }
    crate::web_common::three_instances_never_oversell(targets).await;
}
