//! actix-web middleware: each request a call chain of its own, labelled with its request id.
//!
//! Wrap the app in [`OwnerScope`]; the locks taken while handling a request are then held by
//! owners that carry its request id (`<request id>#<n>`), which introspection and logs show;
//! re-entry follows the call chain (see [`owner`](crate::owner)). [`LockError`] implements [`ResponseError`] (409 for a lock timeout, 503
//! when Redis is unavailable; see the [parent module](super)), so handlers can return it or an
//! error that converts it.
//!
//! ```no_run
//! use actix_web::{App, HttpServer, post, web};
//! use lock_runtime::middleware::RequestId;
//! use lock_runtime::middleware::actix::OwnerScope;
//! use lock_runtime::{LockError, distributed_lock};
//!
//! #[distributed_lock(key = "goods:<id>", lease = "5s", wait = "2s")]
//! async fn buy(id: u64) -> Result<String, LockError> {
//!     // ... check and decrease the stock of `id` ...
//!     Ok(format!("bought {id}"))
//! }
//!
//! #[post("/goods/{id}/buy")]
//! async fn buy_handler(id: web::Path<u64>, request: RequestId) -> Result<String, LockError> {
//!     tracing::info!(%request, "buying");
//!     buy(id.into_inner()).await // a timeout answers 409 {"error":"lock_timeout",...}
//! }
//!
//! #[actix_web::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Before the server starts, so the service's connections live on the main runtime.
//!     lock_runtime::init_from_file("lock.toml").await?;
//!     let scope = OwnerScope::new(); // Send + Sync: build it once, clone it per worker
//!     HttpServer::new(move || App::new().wrap(scope.clone()).service(buy_handler))
//!         .bind("127.0.0.1:8080")?
//!         .run()
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! The scope covers the inner service's response future, which is where actix runs extractors
//! and handlers. `wrap` it last (outermost) so that other middleware that takes locks runs
//! inside it.

use std::fmt;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_web::body::BoxBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use actix_web::{FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError};
use pin_project_lite::pin_project;

use super::response::Mapping;
use super::scope::{Scoped, ScopedResponse, Shared, impl_scoped_request};
use super::{OwnerScopeConfig, RequestId};
use crate::error::LockError;

impl_scoped_request!(impl for ServiceRequest { Name = HeaderName, Value = HeaderValue });

impl<B> ScopedResponse for ServiceResponse<B> {
    type Name = HeaderName;
    type Value = HeaderValue;

    fn echo_header(&mut self, name: HeaderName, value: HeaderValue) {
        if !self.headers().contains_key(&name) {
            self.headers_mut().insert(name, value);
        }
    }
}

/// Middleware factory: runs each request in its own lock-owner scope, with a [`RequestId`] in
/// its extensions and echoed on its response. See the [module docs](self).
///
/// ```
/// use lock_runtime::middleware::OwnerScopeConfig;
/// use lock_runtime::middleware::actix::OwnerScope;
///
/// let default = OwnerScope::new(); // x-request-id, then req-id; fresh owner per request
/// let custom = OwnerScope::with_config(OwnerScopeConfig::new().with_header("x-trace-id"));
/// # let _ = (default, custom);
/// ```
#[derive(Debug, Clone)]
pub struct OwnerScope {
    shared: Arc<Shared<HeaderName>>,
}

impl OwnerScope {
    /// The middleware with [`OwnerScopeConfig::new`].
    ///
    /// ```
    /// use lock_runtime::middleware::actix::OwnerScope;
    ///
    /// let app = actix_web::App::new().wrap(OwnerScope::new());
    /// # let _ = app;
    /// ```
    pub fn new() -> Self {
        Self::with_config(OwnerScopeConfig::new())
    }

    /// The middleware with `config`.
    ///
    /// ```
    /// use lock_runtime::middleware::OwnerScopeConfig;
    /// use lock_runtime::middleware::actix::OwnerScope;
    ///
    /// let scope = OwnerScope::with_config(OwnerScopeConfig::new().with_header("x-correlation-id"));
    /// let app = actix_web::App::new().wrap(scope);
    /// # let _ = app;
    /// ```
    pub fn with_config(config: OwnerScopeConfig) -> Self {
        OwnerScope {
            shared: Shared::new(config),
        }
    }
}

impl Default for OwnerScope {
    fn default() -> Self {
        Self::new()
    }
}

impl<S, B> Transform<S, ServiceRequest> for OwnerScope
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Transform = OwnerScopeMiddleware<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(OwnerScopeMiddleware {
            service,
            shared: self.shared.clone(),
        }))
    }
}

/// The service [`OwnerScope`] wraps around the app.
#[derive(Debug)]
pub struct OwnerScopeMiddleware<S> {
    service: S,
    shared: Arc<Shared<HeaderName>>,
}

impl<S, B> Service<ServiceRequest> for OwnerScopeMiddleware<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Future = ResponseFuture<S::Future>;

    forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        ResponseFuture {
            inner: self
                .shared
                .call(request, |request| self.service.call(request)),
        }
    }
}

pin_project! {
    /// The response future of [`OwnerScopeMiddleware`]: the inner future inside the request's
    /// owner scope; adds the request id header to the response.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Scoped<F, HeaderName, HeaderValue>,
    }
}

impl<F, B> Future for ResponseFuture<F>
where
    F: Future<Output = Result<ServiceResponse<B>, actix_web::Error>>,
{
    type Output = Result<ServiceResponse<B>, actix_web::Error>;

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
impl ResponseError for LockError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(Mapping::of(self).status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse<BoxBody> {
        let mapping = Mapping::of(self);
        mapping.log(self);
        let status =
            StatusCode::from_u16(mapping.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = HttpResponse::build(status);
        response.insert_header((CONTENT_TYPE, HeaderValue::from_static("application/json")));
        if mapping.retry {
            response.insert_header((RETRY_AFTER, HeaderValue::from_static("1")));
        }
        response.body(mapping.body(self))
    }
}

/// Extracts the request id set by [`OwnerScope`]; without the middleware the request fails
/// with 500.
impl FromRequest for RequestId {
    type Error = actix_web::Error;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(request: &HttpRequest, _payload: &mut actix_web::dev::Payload) -> Self::Future {
        ready(request.extensions().get::<RequestId>().cloned().ok_or_else(|| {
            actix_web::error::ErrorInternalServerError(
                "RequestId is set by lock_runtime::middleware::actix::OwnerScope, which is not installed",
            )
        }))
    }
}

#[cfg(test)]
mod tests {
    use actix_web::test::{TestRequest, call_and_read_body, call_service, init_service};
    use actix_web::{App, HttpResponse, web};

    use super::*;

    /// The owner a lock call made here would hold the lock as.
    fn owner_of_a_lock_call() -> String {
        match crate::owner::resolve(0, "lock:{k}") {
            crate::owner::Resolved::Owner(owner) => owner.to_string(),
            _ => unreachable!("no enclosing locked body here"),
        }
    }

    /// Answers `<owner> <request id from the extractor>`.
    async fn who(id: RequestId) -> String {
        format!("{} {id}", owner_of_a_lock_call())
    }

    #[actix_web::test]
    async fn each_request_gets_its_own_owner_and_the_id_is_echoed() {
        let app = init_service(
            App::new()
                .wrap(OwnerScope::new())
                .route("/", web::get().to(who)),
        )
        .await;
        let response = call_service(&app, TestRequest::get().uri("/").to_request()).await;
        let made = response
            .headers()
            .get("x-request-id")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(made.len(), 36);
        let forged = || {
            TestRequest::get()
                .uri("/")
                .insert_header(("req-id", "same"))
                .to_request()
        };
        let response = call_service(&app, forged()).await;
        assert_eq!(response.headers().get("req-id").unwrap(), "same");
        let one = call_and_read_body(&app, forged()).await;
        let two = call_and_read_body(&app, forged()).await;
        assert!(one.ends_with(b" same") && two.ends_with(b" same"));
        assert_ne!(one, two, "the same id is not the same owner");
    }

    #[actix_web::test]
    async fn a_trusted_id_is_the_owner_and_handler_headers_are_kept() {
        let config = OwnerScopeConfig::new().trust_request_id_as_owner();
        let app = init_service(
            App::new()
                .wrap(OwnerScope::with_config(config))
                .route("/", web::get().to(who))
                .route(
                    "/own",
                    web::get().to(|| async {
                        HttpResponse::Ok()
                            .insert_header(("x-request-id", "mine"))
                            .finish()
                    }),
                ),
        )
        .await;
        let request = TestRequest::get()
            .uri("/")
            .insert_header(("x-request-id", "r-1"));
        assert_eq!(
            call_and_read_body(&app, request.to_request()).await,
            "request:r-1 r-1"
        );
        let request = TestRequest::get()
            .uri("/own")
            .insert_header(("x-request-id", "r-2"));
        let response = call_service(&app, request.to_request()).await;
        assert_eq!(response.headers().get("x-request-id").unwrap(), "mine");
    }
}
