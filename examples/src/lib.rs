//! Example services for `lock-runtime`: a flash sale that must not oversell.
//!
//! | binary | what |
//! |---|---|
//! | `shop-axum` | the shop on axum ([`axum_shop`]): `POST /goods/{id}/buy` under `#[distributed_lock]` |
//! | `shop-actix` | the same shop on actix-web ([`actix_shop`]) |
//! | `loadgen` | fires concurrent purchases at shop instances and reports ([`loadgen`]) |
//! | `fine-grained` | [`LockService`](lock_runtime::LockService) used directly around a small section |
//!
//! The stock lives in Redis, so any number of shop instances sell the same goods;
//! `scripts/demo.sh` starts a private Redis and three `shop-axum` processes and runs
//! `loadgen` against them, once on the locked endpoint and once on the unlocked one.
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
pub mod setup;
pub mod shop;

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
