//! The flash sale on axum.
//!
//! | route | what |
//! |---|---|
//! | `POST /goods/{id}/buy` | [`shop::buy`]: one unit under the lock `goods:{id}` |
//! | `POST /goods/{id}/buy/{units}` | [`shop::buy_many`]: several units, re-entering the lock |
//! | `POST /goods/{id}/buy-unlocked` | [`shop::buy_unlocked`]: the same without the lock |
//! | `PUT /goods/{id}` `{"stock": 10}` | restock, reset the sold counter |
//! | `GET /goods/{id}` | `{"goods": .., "stock": .., "sold": ..}` |
//! | `GET /about` | `{"instance": .., "framework": "axum", "checkout_ms": .., "lock": {..}}` |
//! | `GET /health` | `ok` |
//! | `GET /metrics` | the lock metrics in Prometheus's text format (added by [`prometheus::route`](crate::prometheus::route); `shop-axum` serves it) |
//!
//! Every request runs in its own lock-owner scope ([`OwnerScopeLayer`]); lock errors answer
//! with the library's JSON (409 `lock_timeout`, 503 `lock_unavailable`, ...).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_runtime::middleware::tower::OwnerScopeLayer;
use lock_runtime::middleware::{OwnerScopeConfig, RequestId};
use serde::Deserialize;

use crate::shop::{self, Purchase, ShopError, Store};

/// The framework's name in `GET /about`.
pub const FRAMEWORK: &str = "axum";

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct Shop {
    /// The goods.
    pub store: Store,
    /// The name of this instance, echoed in purchase responses.
    pub instance: Arc<str>,
}

/// The shop's routes, each request in an owner scope made with `scope`.
pub fn router(shop: Shop, scope: OwnerScopeConfig) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/about", get(about))
        .route("/goods/{id}", get(goods).put(restock))
        .route("/goods/{id}/buy", post(buy))
        .route("/goods/{id}/buy/{units}", post(buy_many))
        .route("/goods/{id}/buy-unlocked", post(buy_unlocked))
        .with_state(shop)
        .layer(OwnerScopeLayer::with_config(scope))
}

/// The body of `PUT /goods/{id}`.
#[derive(Debug, Deserialize)]
struct Restock {
    stock: i64,
}

async fn restock(
    State(shop): State<Shop>,
    Path(id): Path<u64>,
    Json(body): Json<Restock>,
) -> Result<Response, ShopError> {
    Ok(Json(shop.store.restock(id, body.stock).await?).into_response())
}

async fn about(State(shop): State<Shop>) -> Response {
    Json(crate::about(&shop.instance, FRAMEWORK, &shop.store)).into_response()
}

async fn goods(State(shop): State<Shop>, Path(id): Path<u64>) -> Result<Response, ShopError> {
    Ok(Json(shop.store.goods(id).await?).into_response())
}

async fn buy(
    State(shop): State<Shop>,
    Path(id): Path<u64>,
    request: RequestId,
) -> Result<Response, ShopError> {
    let purchase = shop::buy(&shop.store, id).await?;
    Ok(receipt(&shop, &request, &[purchase]))
}

async fn buy_many(
    State(shop): State<Shop>,
    Path((id, units)): Path<(u64, u32)>,
    request: RequestId,
) -> Result<Response, ShopError> {
    let purchases = shop::buy_many(&shop.store, id, units).await?;
    Ok(receipt(&shop, &request, &purchases))
}

async fn buy_unlocked(
    State(shop): State<Shop>,
    Path(id): Path<u64>,
    request: RequestId,
) -> Result<Response, ShopError> {
    let purchase = shop::buy_unlocked(&shop.store, id).await?;
    Ok(receipt(&shop, &request, &[purchase]))
}

fn receipt(shop: &Shop, request: &RequestId, purchases: &[Purchase]) -> Response {
    Json(crate::receipt(&shop.instance, request, purchases)).into_response()
}

impl IntoResponse for ShopError {
    fn into_response(self) -> Response {
        let status = match self {
            ShopError::Lock(error) => return error.into_response(),
            ShopError::SoldOut { .. } => StatusCode::CONFLICT,
            ShopError::NotFound { .. } => StatusCode::NOT_FOUND,
            ShopError::Store(ref error) => {
                tracing::warn!(%error, "stock store failed");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        (status, [(CONTENT_TYPE, "application/json")], self.json()).into_response()
    }
}
