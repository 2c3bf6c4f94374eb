//! What the axum and actix-web suites share: the lock code behind their test routes, and the
//! client side of every scenario, run over real HTTP against a bound server.
//!
//! Both suites serve the same routes:
//!
//! | route | handler |
//! |---|---|
//! | `POST /hold/{key}/{ms}` | [`hold`]: takes `web:{key}` through the global service, holds it `ms` |
//! | `POST /locked/{key}` | [`locked_section`]: `#[distributed_lock]` on `web:{key}`, waits 300 ms |
//! | `POST /hold-then-call/{key}` | [`hold_then_call`]: takes `web:{key}`, then calls [`locked_section`] |
//! | `POST /bad-key` | [`bad_key`]: locks the empty key (an `InvalidKey` error) |
//! | `GET /ids` | the request id from the extractor, the task-local and the owner |
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use lock_examples::loadgen::{self, Endpoint, Load, Progress};
use lock_runtime::middleware::current_request_id;
use lock_runtime::{LockConfig, LockError, LockService, distributed_lock, owner};
use lock_tests::harness::{Kind, shared, unique_key};
use serde_json::{Value, json};

/// Connects the global lock service (the one annotated fns use) to the shared single-node
/// Redis, and returns that Redis's URL.
pub async fn setup() -> String {
    let url = shared(Kind::Single).await.url();
    lock_runtime::init(LockConfig::single(url.clone()))
        .await
        .expect("init the global lock service");
    url
}

async fn global() -> &'static LockService {
    lock_runtime::global().await.expect("global lock service")
}

fn who() -> Value {
    json!({
        "owner": owner::try_current().map(|o| o.to_string()),
        "request_id": current_request_id().map(|r| r.to_string()),
        "fence": lock_runtime::current_fence(),
    })
}

/// Holds `web:{key}` for `ms` milliseconds as the request's owner.
pub async fn hold(key: &str, ms: u64) -> Result<Value, LockError> {
    let guard = global()
        .await
        .lock(format!("web:{key}"))
        .lease(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .await?;
    tokio::time::sleep(Duration::from_millis(ms)).await;
    guard.release().await?;
    Ok(who())
}

/// Runs under `web:{key}`, waiting at most 300 ms for it.
#[distributed_lock(key = "web:<key>", lease = "5s", wait = "300ms")]
pub async fn locked_section(key: &str) -> Result<Value, LockError> {
    Ok(who())
}

/// Takes `web:{key}` with the service and calls the annotated [`locked_section`] on the same
/// key from the locked body: the call re-enters the hold.
pub async fn hold_then_call(key: &str) -> Result<Value, LockError> {
    global()
        .await
        .lock(format!("web:{key}"))
        .wait(Duration::from_millis(300))
        .run(|held| async move {
            let inner = locked_section(key).await?;
            Ok(json!({ "outer_fence": held.fence(), "inner_fence": inner["fence"] }))
        })
        .await
}

/// Fails with `InvalidKey`.
pub async fn bad_key() -> Result<Value, LockError> {
    let guard = global().await.lock("").await?;
    guard.release().await?;
    Ok(Value::Null)
}

/// A client for the scenarios.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("http client")
}

/// A response's status, headers and JSON body.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub json: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer {
        status,
        headers,
        json,
    }
}

/// Waits until `web:{key}` is held.
async fn until_held(key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !global()
        .await
        .is_locked(&format!("web:{key}"))
        .await
        .unwrap()
    {
        assert!(Instant::now() < deadline, "web:{key} was never taken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A handler that takes a lock and calls an annotated fn on the same key from the locked body
/// completes, with the middleware's scope (`scoped`) and without it (`bare`): re-entry follows
/// the locked body, not the request.
pub async fn nested_calls_reenter_within_a_request(scoped: &str, bare: &str) {
    let c = client();
    let key = unique_key("reenter");
    let a = send(c.post(format!("{scoped}/hold-then-call/{key}"))).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        a.json["outer_fence"], a.json["inner_fence"],
        "re-entry keeps the token"
    );
    let b = send(c.post(format!("{bare}/hold-then-call/{key}"))).await;
    assert_eq!(b.status, 200, "{}", b.json);
    assert_eq!(b.json["outer_fence"], b.json["inner_fence"]);
    assert!(
        !global()
            .await
            .is_locked(&format!("web:{key}"))
            .await
            .unwrap()
    );
}

/// While one request holds a lock, a second request with the same `x-request-id` gets a lock
/// timeout (409, JSON naming the key), unless the service trusts request ids as owners.
pub async fn same_request_id_concurrently(base: &str, trusted: bool) {
    let c = client();
    let key = unique_key(if trusted { "trusted" } else { "forged" });
    let id = unique_key("rid");
    let holder = tokio::spawn(send(
        c.post(format!("{base}/hold/{key}/1500"))
            .header("x-request-id", &id),
    ));
    until_held(&key).await;
    let second = send(
        c.post(format!("{base}/locked/{key}"))
            .header("x-request-id", &id),
    )
    .await;
    assert_eq!(second.header("x-request-id"), Some(id.as_str()));
    let third = send(
        c.post(format!("{base}/locked/{key}"))
            .header("x-request-id", "someone-else"),
    )
    .await;
    let first = holder.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.json);
    assert_eq!(first.json["request_id"], id.as_str());
    if trusted {
        assert_eq!(
            second.status, 200,
            "the trusted id re-enters: {}",
            second.json
        );
        assert_eq!(second.json["owner"], format!("request:{id}"));
    } else {
        assert_eq!(
            second.status, 409,
            "a repeated id must not share the owner: {}",
            second.json
        );
        assert_eq!(second.json["error"], "lock_timeout");
        // the fn's key template, never the key built from the request (`key` may be a user id)
        assert_eq!(second.json["key"], "web:<key>");
        assert!(
            second.json["message"]
                .as_str()
                .unwrap()
                .contains("web:<key>")
        );
        assert!(!second.json.to_string().contains(&key), "{}", second.json);
        assert_eq!(second.header("retry-after"), Some("1"));
        assert_eq!(second.header("content-type"), Some("application/json"));
    }
    assert_eq!(
        third.status, 409,
        "another id never gets in: {}",
        third.json
    );
    let after = send(
        c.post(format!("{base}/locked/{key}"))
            .header("x-request-id", &id),
    )
    .await;
    assert_eq!(
        after.status, 200,
        "free again after the holder: {}",
        after.json
    );
    let owner = after.json["owner"].as_str().unwrap();
    if trusted {
        assert_eq!(owner, format!("request:{id}"));
    } else {
        assert!(
            owner.starts_with(&format!("{id}#")),
            "the owner carries the request id as its label: {owner}"
        );
    }
}

/// Errors other than timeouts: a short 500 without debug output.
pub async fn other_lock_errors_are_short_500s(base: &str) {
    let a = send(client().post(format!("{base}/bad-key"))).await;
    assert_eq!(a.status, 500);
    assert_eq!(a.json["error"], "lock_error", "{}", a.json);
    let body = a.json.to_string();
    assert!(
        !body.contains("LockError") && !body.contains("kind:"),
        "{body}"
    );
    assert!(a.header("retry-after").is_none());
}

/// Request ids: read from `x-request-id`, else `req-id`, else made; echoed; visible to handlers
/// through the extractor and the task-local; never the owner by default.
pub async fn request_ids_are_read_made_and_echoed(base: &str) {
    let c = client();
    let url = format!("{base}/ids");
    let a = send(c.get(&url).header("req-id", "from-req-id")).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header("req-id"), Some("from-req-id"));
    assert_eq!(a.json["extension"], "from-req-id");
    assert_eq!(a.json["task_local"], "from-req-id");
    assert!(
        a.json["owner"].is_null(),
        "a request is no owner; each lock call chain in it gets one: {}",
        a.json
    );

    let b = send(
        c.get(&url)
            .header("x-request-id", "first")
            .header("req-id", "second"),
    )
    .await;
    assert_eq!(
        (b.header("x-request-id"), b.header("req-id")),
        (Some("first"), None)
    );
    assert_eq!(b.json["extension"], "first");

    for sent in [None, Some("has space"), Some(&*"x".repeat(200))] {
        let mut request = c.get(&url);
        if let Some(value) = sent {
            request = request.header("x-request-id", value);
        }
        let made = send(request).await;
        let echoed = made.header("x-request-id").expect("a made id is echoed");
        assert_eq!(echoed.len(), 36, "a UUID: {echoed}");
        assert_eq!(made.json["extension"], echoed);
    }
    let one = send(c.get(&url)).await;
    let two = send(c.get(&url)).await;
    assert_ne!(one.header("x-request-id"), two.header("x-request-id"));
}

/// The flash sale on three instances: the locked endpoint sells exactly the stock, the unlocked
/// one oversells; and a request buying several units re-enters its own lock.
pub async fn three_instances_never_oversell(targets: Vec<String>) {
    let goods = u64::from(rand::random::<u32>());
    let mut load = Load {
        targets,
        goods,
        stock: 10,
        requests: 240,
        concurrency: 24,
        endpoint: Endpoint::Locked,
        progress: Progress::Quiet,
    };
    let locked = loadgen::run(&load).await.expect("locked run");
    println!("{locked}");
    assert_eq!(locked.oversold(), 0, "{locked}");
    assert_eq!((locked.sold, locked.errors), (10, 0), "{locked}");
    assert_eq!(locked.sold + locked.sold_out + locked.lock_timeouts, 240);
    assert_eq!(
        (locked.stock_left, locked.sold_recorded),
        (0, 10),
        "{locked}"
    );
    assert!(
        locked.per_instance.len() > 1,
        "sales spread over instances: {locked}"
    );

    load.endpoint = Endpoint::Unlocked;
    let unlocked = loadgen::run(&load).await.expect("unlocked run");
    println!("{unlocked}");
    assert!(
        unlocked.oversold() > 0,
        "without the lock it oversells: {unlocked}"
    );
    assert!(locked.summary_line().contains(" oversold=0 "));

    let c = client();
    let base = &load.targets[0];
    let restock = c
        .put(format!("{base}/goods/{goods}"))
        .header("content-type", "application/json")
        .body(r#"{"stock":3}"#);
    assert_eq!(send(restock).await.status, 200);
    let many = send(c.post(format!("{base}/goods/{goods}/buy/3"))).await;
    assert_eq!(many.status, 200, "{}", many.json);
    let purchases = many.json["purchases"].as_array().unwrap();
    assert_eq!(purchases.len(), 3);
    assert!(
        purchases
            .iter()
            .all(|p| p["fence"] == purchases[0]["fence"])
    );
    let sold_out = send(c.post(format!("{base}/goods/{goods}/buy"))).await;
    assert_eq!(
        (sold_out.status, &sold_out.json["error"]),
        (409, &json!("sold_out"))
    );
}
