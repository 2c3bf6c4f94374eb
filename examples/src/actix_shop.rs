//! The flash sale on actix-web: the same routes and answers as [`axum_shop`](crate::axum_shop).

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::http::header::ContentType;
use actix_web::{HttpResponse, ResponseError, web};
use serde::Deserialize;

use crate::shop::{self, Purchase, ShopError, Store};
use lock_runtime::middleware::RequestId;

/// The framework's name in `GET /about`.
pub const FRAMEWORK: &str = "actix-web";

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct Shop {
    /// The goods.
    pub store: Store,
    /// The name of this instance, echoed in purchase responses.
    pub instance: Arc<str>,
}

/// Registers the shop's routes and state. Wrap the `App` in
/// [`OwnerScope`](lock_runtime::middleware::actix::OwnerScope):
///
/// ```no_run
/// # fn demo(shop: lock_examples::actix_shop::Shop) {
/// use actix_web::App;
/// use lock_runtime::middleware::actix::OwnerScope;
///
/// let app = App::new()
///     .wrap(OwnerScope::new())
///     .configure(|cfg| lock_examples::actix_shop::configure(cfg, shop.clone()));
/// # let _ = app; }
/// ```
pub fn configure(cfg: &mut web::ServiceConfig, shop: Shop) {
    cfg.app_data(web::Data::new(shop))
        .route("/health", web::get().to(|| async { "ok" }))
        .route("/about", web::get().to(about))
        .route("/goods/{id}", web::get().to(goods))
        .route("/goods/{id}", web::put().to(restock))
        .route("/goods/{id}/buy", web::post().to(buy))
        .route("/goods/{id}/buy/{units}", web::post().to(buy_many))
        .route("/goods/{id}/buy-unlocked", web::post().to(buy_unlocked));
}

/// The body of `PUT /goods/{id}`.
#[derive(Debug, Deserialize)]
struct Restock {
    stock: i64,
}

async fn restock(
    shop: web::Data<Shop>,
    id: web::Path<u64>,
    body: web::Json<Restock>,
) -> Result<HttpResponse, ShopError> {
    let goods = shop.store.restock(id.into_inner(), body.stock).await?;
    Ok(HttpResponse::Ok().json(goods))
}

async fn about(shop: web::Data<Shop>) -> HttpResponse {
    HttpResponse::Ok().json(crate::about(&shop.instance, FRAMEWORK, &shop.store))
}

async fn goods(shop: web::Data<Shop>, id: web::Path<u64>) -> Result<HttpResponse, ShopError> {
    Ok(HttpResponse::Ok().json(shop.store.goods(id.into_inner()).await?))
}

async fn buy(
    shop: web::Data<Shop>,
    id: web::Path<u64>,
    request: RequestId,
) -> Result<HttpResponse, ShopError> {
    let purchase = shop::buy(&shop.store, id.into_inner()).await?;
    Ok(receipt(&shop, &request, &[purchase]))
}

async fn buy_many(
    shop: web::Data<Shop>,
    path: web::Path<(u64, u32)>,
    request: RequestId,
) -> Result<HttpResponse, ShopError> {
    let (id, units) = path.into_inner();
    let purchases = shop::buy_many(&shop.store, id, units).await?;
    Ok(receipt(&shop, &request, &purchases))
}

async fn buy_unlocked(
    shop: web::Data<Shop>,
    id: web::Path<u64>,
    request: RequestId,
) -> Result<HttpResponse, ShopError> {
    let purchase = shop::buy_unlocked(&shop.store, id.into_inner()).await?;
    Ok(receipt(&shop, &request, &[purchase]))
}

fn receipt(shop: &Shop, request: &RequestId, purchases: &[Purchase]) -> HttpResponse {
    HttpResponse::Ok().json(crate::receipt(&shop.instance, request, purchases))
}

impl ResponseError for ShopError {
    fn status_code(&self) -> StatusCode {
        match self {
            ShopError::Lock(error) => error.status_code(),
            ShopError::SoldOut { .. } => StatusCode::CONFLICT,
            ShopError::NotFound { .. } => StatusCode::NOT_FOUND,
            ShopError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            ShopError::Lock(error) => error.error_response(),
            other => {
                if let ShopError::Store(error) = other {
                    tracing::warn!(%error, "stock store failed");
                }
                HttpResponse::build(other.status_code())
                    .insert_header(ContentType::json())
                    .body(other.json())
            }
        }
    }
}
