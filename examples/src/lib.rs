//! Example services for `lock-runtime`: a flash sale that must not oversell.
//!
//! | binary | what |
//! |---|---|
//! | `shop-axum` | the shop on axum ([`axum_shop`]): `POST /goods/{id}/buy` under `#[distributed_lock]`; the lock metrics on `GET /metrics` ([`prometheus`]) and lost locks on stderr |
//! | `shop-actix` | the same shop on actix-web ([`actix_shop`]) |
//! | `loadgen` | fires concurrent purchases at shop instances and reports ([`loadgen`]) |
//! | `fine-grained` | [`LockService`](lock_runtime::LockService) used directly around a small section |
//! | `fenced_sqlite` | fenced writes: a SQLite `UPDATE .. WHERE fence < ?` refuses a holder whose lease ran out |
//!
//! The stock lives in Redis, so any number of shop instances sell the same goods;
//! `scripts/demo.sh` starts a private Redis, two `shop-axum` processes and one `shop-actix`
//! process, and runs `loadgen` against them, once on the locked endpoint and once on the
//! unlocked one.
//!
//! [`segmented`] splits a hot item's stock over several counters, each under a lock of its own,
//! so that several buyers of one item are served at once.
//!
//! ```text
//! cargo run -p lock-examples --bin shop-axum -- --config examples/config/single.toml --listen 127.0.0.1:3000
//! curl -X PUT -H 'content-type: application/json' -d '{"stock":10}' localhost:3000/goods/1
//! curl -X POST localhost:3000/goods/1/buy
//! ```

use lock_runtime::middleware::RequestId;
use serde::Serialize;

pub mod actix_shop;
pub mod args;
pub mod axum_shop;
pub mod loadgen;
#[cfg(feature = "metrics")]
pub mod prometheus;
pub mod segmented;
pub mod setup;
pub mod shop;

/// The body of `GET /about`, the same in both frameworks: which instance and web framework
/// answers, and the terms of a purchase (what the load generator's report explains).
#[derive(Debug, Serialize)]
pub struct About<'a> {
    /// The instance's name.
    pub instance: &'a str,
    /// `axum` or `actix-web`.
    pub framework: &'static str,
    /// The simulated checkout inside a purchase, in milliseconds.
    pub checkout_ms: u64,
    /// The lock a purchase takes.
    pub lock: shop::LockTerms,
}

/// What `instance` of `framework` selling from `store` answers to `GET /about`.
pub fn about<'a>(instance: &'a str, framework: &'static str, store: &shop::Store) -> About<'a> {
    About {
        instance,
        framework,
        checkout_ms: u64::try_from(store.checkout().as_millis()).unwrap_or(u64::MAX),
        lock: shop::BUY_LOCK,
    }
}

/// The body of a successful purchase response, the same in both frameworks.
#[derive(Debug, Serialize)]
pub struct Receipt<'a> {
    /// The instance that sold it.
    pub instance: &'a str,
    /// The request's id.
    pub request_id: &'a str,
    /// What was bought.
    pub purchases: &'a [shop::Purchase],
}

/// The receipt for `purchases` made by `instance` in `request`.
pub fn receipt<'a>(
    instance: &'a str,
    request: &'a RequestId,
    purchases: &'a [shop::Purchase],
) -> Receipt<'a> {
    Receipt {
        instance,
        request_id: request.as_str(),
        purchases,
    }
}

/// The project README: every Rust snippet compiles as written, as a doctest of this crate,
/// which has the dependencies they name (axum, actix-web, tokio, redis, toml, lock-runtime with
/// its features, this crate's `segmented` module).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
