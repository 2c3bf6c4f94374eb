//! Tower middleware (for axum and any tower stack): each request a call chain of its own,
//! labelled with its request id.
//!
//! Add [`OwnerScopeLayer`] to the router; the locks taken while handling a request are then
//! held by owners that carry its request id (`<request id>#<n>`), which introspection and logs
//! show; re-entry follows the call chain (see [`owner`](crate::owner)). Return [`LockError`] (or your own error that converts it) from handlers:
//! it implements axum's `IntoResponse` (409 for a lock timeout, 503 when Redis is unavailable;
//! see the [parent module](super)).
//!
//! ```no_run
//! use axum::{Router, extract::Path, routing::post};
//! use lock_runtime::middleware::RequestId;
//! use lock_runtime::middleware::tower::OwnerScopeLayer;
//! use lock_runtime::{LockError, distributed_lock};
//!
//! #[distributed_lock(key = "goods:<id>", lease = "5s", wait = "2s")]
//! async fn buy(id: u64) -> Result<String, LockError> {
//!     // ... check and decrease the stock of `id` ...
//!     Ok(format!("bought {id}"))
//! }
//!
//! async fn buy_handler(Path(id): Path<u64>, request: RequestId) -> Result<String, LockError> {
//!     tracing::info!(%request, id, "buying");
//!     buy(id).await // a timeout answers 409 {"error":"lock_timeout","key":"goods:<id>",...}
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! lock_runtime::init_from_file("lock.toml").await?;
//! let app = Router::new()
//!     .route("/goods/{id}/buy", post(buy_handler))
//!     // Outermost of the layers that take locks, so that they all run in the request's scope.
//!     .layer(OwnerScopeLayer::new());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! The scope covers the inner service's response future, which is where axum runs extractors
//! and handlers. Work a service does synchronously inside `Service::call`, before it returns
//! its future, runs outside the scope.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum_core::body::Body;
use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, Response};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::response::Mapping;
use super::scope::{Scoped, ScopedResponse, Shared, impl_scoped_request};
use super::{OwnerScopeConfig, RequestId};
use crate::error::LockError;

impl_scoped_request!(impl<B> for Request<B> { Name = HeaderName, Value = HeaderValue });

impl<B> ScopedResponse for http::Response<B> {
    type Name = HeaderName;
    type Value = HeaderValue;

    fn echo_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.headers_mut().entry(name).or_insert(value);
    }
}

/// A [`Layer`] that wraps services in [`OwnerScope`].
///
/// ```
/// use lock_runtime::middleware::OwnerScopeConfig;
/// use lock_runtime::middleware::tower::OwnerScopeLayer;
///
/// let default = OwnerScopeLayer::new(); // x-request-id, then req-id; fresh owner per request
/// let custom = OwnerScopeLayer::with_config(OwnerScopeConfig::new().with_header("x-trace-id"));
/// # let _ = (default, custom);
/// ```
///
/// ```
/// use lock_runtime::middleware::OwnerScopeConfig;
/// use lock_runtime::middleware::tower::OwnerScopeLayer;
///
/// let app: axum::Router = axum::Router::new()
///     .layer(OwnerScopeLayer::with_config(OwnerScopeConfig::new().with_header("x-correlation-id")));
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct OwnerScopeLayer {
    shared: Arc<Shared<HeaderName>>,
}

impl OwnerScopeLayer {
    /// The layer with [`OwnerScopeConfig::new`].
    ///
    /// ```
    /// use lock_runtime::middleware::tower::OwnerScopeLayer;
    ///
    /// let app: axum::Router = axum::Router::new().layer(OwnerScopeLayer::new());
    /// # let _ = app;
    /// ```
    pub fn new() -> Self {
        Self::with_config(OwnerScopeConfig::new())
    }

    /// The layer with `config`.
    pub fn with_config(config: OwnerScopeConfig) -> Self {
        OwnerScopeLayer {
            shared: Shared::new(config),
        }
    }
}

impl Default for OwnerScopeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for OwnerScopeLayer {
    type Service = OwnerScope<S>;

    fn layer(&self, inner: S) -> OwnerScope<S> {
        OwnerScope {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// Runs each request of the inner service in its own lock-owner scope, with a [`RequestId`]
/// in its extensions and echoed on its response. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct OwnerScope<S> {
    inner: S,
    shared: Arc<Shared<HeaderName>>,
}

impl<S> OwnerScope<S> {
    /// Wraps `inner` with `config`.
    pub fn new(inner: S, config: OwnerScopeConfig) -> Self {
        OwnerScope {
            inner,
            shared: Shared::new(config),
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for OwnerScope<S>
where
    S: Service<Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        ResponseFuture {
            inner: self
                .shared
                .call(request, |request| self.inner.call(request)),
        }
    }
}

pin_project! {
    /// The response future of [`OwnerScope`]: the inner future inside the request's owner
    /// scope; adds the request id header to the response.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Scoped<F, HeaderName, HeaderValue>,
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<ResBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

/// A short JSON response: 409 for a lock timeout, 503 for a lost lock or an unavailable lock
/// service, 500 otherwise; see the [parent module](super).
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        let mapping = Mapping::of(&self);
        mapping.log(&self);
        let mut response = Response::new(Body::from(mapping.body(&self)));
        *response.status_mut() =
            StatusCode::from_u16(mapping.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if mapping.retry {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Extracts the request id set by [`OwnerScopeLayer`]; without the layer the request fails
/// with 500.
impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<RequestId>().cloned().ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "RequestId is set by lock_runtime::middleware::tower::OwnerScopeLayer, which is not installed",
        ))
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::get;
    use http::HeaderMap;

    use super::*;

    /// The owner a lock call made here would hold the lock as.
    fn owner_of_a_lock_call() -> String {
        match crate::owner::resolve(0, "lock:{k}") {
            crate::owner::Resolved::Owner(owner) => owner.to_string(),
            _ => unreachable!("no enclosing locked body here"),
        }
    }

    async fn call(
        service: &mut OwnerScope<Router>,
        headers: &[(&str, &str)],
    ) -> http::Response<Body> {
        let mut request = Request::builder().uri("/");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        service
            .call(request.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    async fn text(response: http::Response<Body>) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// Answers `<owner> <request id from the extension> <x-request-id header it saw>`.
    fn app() -> Router {
        Router::new().route(
            "/",
            get(|id: RequestId, headers: HeaderMap| async move {
                let seen = headers
                    .get("x-request-id")
                    .map(|v| v.to_str().unwrap().to_owned());
                format!(
                    "{} {id} {}",
                    owner_of_a_lock_call(),
                    seen.unwrap_or_default()
                )
            }),
        )
    }

    #[tokio::test]
    async fn each_request_gets_its_own_owner_and_a_made_id_is_passed_on() {
        let mut service = OwnerScopeLayer::new().layer(app());
        let one = call(&mut service, &[]).await;
        let made = one.headers()["x-request-id"].to_str().unwrap().to_owned();
        let one = text(one).await;
        let parts: Vec<&str> = one.split(' ').collect();
        assert_eq!(
            parts[1..],
            [&*made, &*made],
            "extension and request header carry it"
        );
        let two = text(call(&mut service, &[("x-request-id", &made)]).await).await;
        assert_ne!(
            two.split(' ').next(),
            Some(parts[0]),
            "the same id is not the same owner"
        );
    }

    #[tokio::test]
    async fn a_trusted_id_is_the_owner() {
        let config = OwnerScopeConfig::new().trust_request_id_as_owner();
        let mut service = OwnerScope::new(app(), config);
        let body = text(call(&mut service, &[("req-id", "r-1")]).await).await;
        assert_eq!(body, "request:r-1 r-1 ");
    }

    #[tokio::test]
    async fn a_response_header_the_handler_set_is_kept() {
        let handler = || async { ([("x-request-id", "from-handler")], "ok") };
        let mut service = OwnerScopeLayer::new().layer(Router::new().route("/", get(handler)));
        let response = call(&mut service, &[("x-request-id", "from-client")]).await;
        assert_eq!(response.headers()["x-request-id"], "from-handler");
    }
}
