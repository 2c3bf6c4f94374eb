//! Web middleware: one lock-owner scope per request, request ids, and HTTP responses for
//! [`LockError`](crate::error::LockError).
//!
//! | feature | module | what it gives |
//! |---|---|---|
//! | `tower` | `tower` | `tower::OwnerScopeLayer` for axum / any tower stack; `IntoResponse` for `LockError`; `RequestId` as an axum extractor |
//! | `actix-web` | `actix` | `actix::OwnerScope` for `App::wrap`; `ResponseError` for `LockError`; `RequestId` as an actix extractor |
//!
//! # What the middleware does with each request
//!
//! 1. It takes the request id from the first configured header that carries a usable value
//!    (default `x-request-id`, then `req-id`), or makes a new one
//!    ([`MakeRequestId`], default [`UuidRequestId`]).
//! 2. It runs the rest of the request as a new call chain labelled with the request id (see
//!    [`owner`](crate::owner)): a locked call nested in another locked call on the same key
//!    re-enters it; everything else waits - other requests, and concurrent children of this
//!    one (`join!`, `join_all`, `select!`). The owners the request's locks are held by carry
//!    the request id (`<request id>#<n>`), so introspection and logs show which request holds
//!    a lock.
//! 3. The request id is put into the request's extensions (handlers take a [`RequestId`]),
//!    is readable anywhere in the request through [`current_request_id`], names a `tracing`
//!    span around the request (so the lock's own log lines carry it), and is echoed on the
//!    response under the header it arrived in (or the first configured header when it was
//!    made here), unless the response already has that header.
//!
//! # The request id is not the owner (unless you say so)
//!
//! By default every lock a request takes gets a new owner; the request id only labels it. A
//! client that sends the same `x-request-id` on two concurrent requests (by mistake or on
//! purpose) still gets mutual exclusion between them.
//!
//! [`OwnerScopeConfig::trust_request_id_as_owner`] makes the request id the explicit owner of
//! every lock call of the request instead (see
//! [explicit owners](crate::owner#explicit-owners)), so that requests carrying the same id -
//! and concurrent children of one request - re-enter each other's locks. Use it only when every
//! caller that can reach the service is trusted to send unique ids per logical operation (one
//! service mesh, the header set by your own gateway and stripped from outside traffic): anyone
//! who can send the header can otherwise join a critical section that another request holds,
//! which is exactly the race the lock is there to prevent. Such owners are the same in every
//! process ([`OwnerId::across_processes`]), so a call that carries the id to another service
//! of the mesh re-enters the locks the first service holds for it.
//!
//! # Errors as responses
//!
//! With either feature, a [`LockError`](crate::error::LockError) returned from a handler
//! becomes a short JSON response (see [`http_status`] and [`http_body`]):
//!
//! | kind | status | `error` |
//! |---|---|---|
//! | `Timeout` | 409 Conflict, `Retry-After: 1` | `lock_timeout` |
//! | `Stale` (a [fenced write](crate::fenced) from a holder whose lock has passed on) | 409 Conflict, `Retry-After: 1` | `stale_write` |
//! | `Lost` | 503 Service Unavailable, `Retry-After: 1` | `lock_lost` |
//! | `Backend`, `ReplicaSync` | 503 Service Unavailable, `Retry-After: 1` | `lock_unavailable` |
//! | `ShuttingDown` (the server is on its way out: [`LockService::shutdown`](crate::LockService::shutdown)) | 503 Service Unavailable, `Retry-After: 1` | `lock_shutting_down` |
//! | anything else (`NotInitialized`, `Config`, `Auth`, `WouldDeadlock`, `InvalidKey`, ...): a mistake to fix, not to retry | 500 Internal Server Error | `lock_error` |
//!
//! ```json
//! {"error":"lock_timeout","key":"goods:<id>","message":"the lock `goods:<id>` is held by another request; try again"}
//! ```
//!
//! `key` is the key template of the annotated fn the error comes from
//! ([`LockError::label`](crate::LockError::label)), never the key built from the request: keys
//! often carry user ids or internal names, which are not the client's to see. An error of a
//! programmatic call has no template and so no `key`. To show the key anyway, answer with your
//! own body from [`LockError::key`](crate::LockError::key).
//!
//! A lost lock is a 503, not a 409: the request did not collide with another one, the server
//! could not keep its lock (Redis failed over, renewals were too slow or the lease too
//! short), and the operation was stopped part-way; trying again later is the right reaction.
//! 5xx bodies carry a fixed message, never Redis error text or a debug dump; the full error is
//! logged with `tracing` instead. To answer differently, map the error yourself in your own
//! error type; [`http_status`] and [`http_body`] are there to reuse.

use std::fmt;
use std::sync::Arc;

#[cfg(feature = "actix-web")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix-web")))]
pub mod actix;
mod response;
mod scope;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

pub use response::{http_body, http_status};

use crate::owner::OwnerId;

/// The header the request id is read from and echoed in by default.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// A second header accepted by default when [`REQUEST_ID_HEADER`] is absent.
pub const ALT_REQUEST_ID_HEADER: &str = "req-id";
/// The longest request id taken from a header; longer values are replaced by a new id.
pub const MAX_REQUEST_ID_LEN: usize = 128;

tokio::task_local! {
    static REQUEST_ID: RequestId;
}

/// The id of the request being handled.
///
/// A request id is 1 to [`MAX_REQUEST_ID_LEN`] visible ASCII characters, so it is always a
/// valid header value and safe to log.
///
/// ```
/// use lock_runtime::middleware::RequestId;
///
/// let id = RequestId::parse("order-7-retry-2").unwrap();
/// assert_eq!(id.as_str(), "order-7-retry-2");
/// assert!(RequestId::parse("has space").is_none());
/// assert_ne!(RequestId::generate(), RequestId::generate());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(Arc<str>);

impl RequestId {
    /// The id in `value`, or `None` when it is empty, too long or not visible ASCII.
    pub fn parse(value: &str) -> Option<RequestId> {
        Self::from_bytes(value.as_bytes())
    }

    /// A new random id (a UUID v4 in hyphenated form).
    pub fn generate() -> RequestId {
        RequestId(uuid::Uuid::new_v4().hyphenated().to_string().into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn from_bytes(value: &[u8]) -> Option<RequestId> {
        let usable = !value.is_empty()
            && value.len() <= MAX_REQUEST_ID_LEN
            && value.iter().all(|b| b.is_ascii_graphic());
        if !usable {
            return None;
        }
        // Visible ASCII is valid UTF-8.
        std::str::from_utf8(value).ok().map(|s| RequestId(s.into()))
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({:?})", &*self.0)
    }
}

/// The id of the request being handled, inside the middleware's scope; `None` outside.
///
/// Like the lock owner it is a task-local: a task spawned with `tokio::spawn` does not see it.
pub fn current_request_id() -> Option<RequestId> {
    REQUEST_ID.try_with(RequestId::clone).ok()
}

/// Makes the id of a request that arrived without a usable one.
///
/// ```
/// use lock_runtime::middleware::{MakeRequestId, OwnerScopeConfig, RequestId};
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// #[derive(Debug, Default)]
/// struct Counter(AtomicU64);
///
/// impl MakeRequestId for Counter {
///     fn make_request_id(&self) -> RequestId {
///         let n = self.0.fetch_add(1, Ordering::Relaxed);
///         RequestId::parse(&format!("req-{n}")).expect("visible ASCII")
///     }
/// }
///
/// let config = OwnerScopeConfig::new().with_make_request_id(Counter::default());
/// # let _ = config;
/// ```
pub trait MakeRequestId: Send + Sync + fmt::Debug + 'static {
    /// A new request id.
    fn make_request_id(&self) -> RequestId;
}

/// The default [`MakeRequestId`]: [`RequestId::generate`], a random UUID.
///
/// ```
/// use lock_runtime::middleware::{MakeRequestId, UuidRequestId};
///
/// let id = UuidRequestId.make_request_id(); // a hyphenated UUID v4, fresh each time
/// assert_eq!(id.as_str().len(), 36);
/// assert_ne!(id, UuidRequestId.make_request_id());
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct UuidRequestId;

impl MakeRequestId for UuidRequestId {
    fn make_request_id(&self) -> RequestId {
        RequestId::generate()
    }
}

/// How the middleware finds request ids and picks lock owners; shared by the tower and
/// actix-web middleware.
///
/// ```
/// use lock_runtime::middleware::OwnerScopeConfig;
///
/// // Read `x-correlation-id`, then `x-request-id`; make a new id when neither is usable.
/// let config = OwnerScopeConfig::new()
///     .with_header("x-correlation-id")
///     .also_accept_header("x-request-id");
/// assert_eq!(config.headers(), ["x-correlation-id", "x-request-id"]);
/// assert!(!config.trusts_request_id());
/// ```
///
/// ```
/// use lock_runtime::middleware::OwnerScopeConfig;
///
/// let config = OwnerScopeConfig::new()
///     .with_header("x-correlation-id") // instead of x-request-id
///     .also_accept_header("traceparent");
/// # let _ = config;
/// ```
#[derive(Clone)]
pub struct OwnerScopeConfig {
    headers: Vec<Arc<str>>,
    trust_request_id: bool,
    make_request_id: Arc<dyn MakeRequestId>,
}

impl OwnerScopeConfig {
    /// Headers `x-request-id` then `req-id`, a random UUID when neither is usable, and a fresh
    /// owner per request.
    pub fn new() -> Self {
        OwnerScopeConfig {
            headers: vec![REQUEST_ID_HEADER.into(), ALT_REQUEST_ID_HEADER.into()],
            trust_request_id: false,
            make_request_id: Arc::new(UuidRequestId),
        }
    }

    /// Reads the request id from `name` only (replacing the default headers), and echoes ids
    /// made here under it. Header names are case-insensitive.
    ///
    /// # Panics
    /// When `name` is not a valid header name.
    ///
    /// ```
    /// let config = lock_runtime::middleware::OwnerScopeConfig::new().with_header("x-correlation-id");
    /// # let _ = config;
    /// ```
    #[track_caller]
    pub fn with_header(mut self, name: &str) -> Self {
        self.headers = vec![header_name(name)];
        self
    }

    /// Also reads the request id from `name`, after the headers already configured.
    ///
    /// # Panics
    /// When `name` is not a valid header name.
    ///
    /// ```
    /// let config = lock_runtime::middleware::OwnerScopeConfig::new().also_accept_header("x-amzn-trace-id");
    /// # let _ = config;
    /// ```
    #[track_caller]
    pub fn also_accept_header(mut self, name: &str) -> Self {
        let name = header_name(name);
        if !self.headers.contains(&name) {
            self.headers.push(name);
        }
        self
    }

    /// Makes the request id the lock owner of the request, so that requests carrying the same
    /// id re-enter each other's locks, in this process and in every other service that trusts
    /// it too.
    ///
    /// Only for services whose every caller is trusted: a client that copies another request's
    /// id gets into that request's critical sections. See the [module docs](self).
    ///
    /// ```
    /// use lock_runtime::middleware::OwnerScopeConfig;
    ///
    /// // behind a gateway that assigns x-request-id: retries of one request re-enter its locks
    /// let config = OwnerScopeConfig::new().trust_request_id_as_owner();
    /// # let _ = config;
    /// ```
    pub fn trust_request_id_as_owner(mut self) -> Self {
        self.trust_request_id = true;
        self
    }

    /// Makes ids for requests that arrive without a usable one with `make`.
    pub fn with_make_request_id(mut self, make: impl MakeRequestId) -> Self {
        self.make_request_id = Arc::new(make);
        self
    }

    /// The headers the request id is read from, in order (lower case).
    pub fn headers(&self) -> Vec<&str> {
        self.headers.iter().map(|h| &**h).collect()
    }

    /// Whether the request id is the lock owner.
    pub fn trusts_request_id(&self) -> bool {
        self.trust_request_id
    }

    /// The request id, the owner and the index of the header to echo the id in, for a request
    /// whose header values `lookup` returns.
    pub(crate) fn start<'a>(&self, lookup: impl Fn(&str) -> Option<&'a [u8]>) -> Started {
        let found = self.headers.iter().enumerate().find_map(|(i, name)| {
            lookup(name)
                .and_then(RequestId::from_bytes)
                .map(|id| (i, id))
        });
        let (echo_header, id, from_client) = match found {
            Some((i, id)) => (i, id, true),
            None => (0, self.make_request_id.make_request_id(), false),
        };
        let owner = self
            .trust_request_id
            .then(|| OwnerId::across_processes(format!("request:{id}")));
        let span = tracing::debug_span!(
            "request",
            request_id = %id,
            trusted_owner = self.trust_request_id,
            from_client
        );
        Started {
            id,
            owner,
            echo_header,
            from_client,
            span,
        }
    }
}

impl Default for OwnerScopeConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for OwnerScopeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnerScopeConfig")
            .field("headers", &self.headers)
            .field("trust_request_id", &self.trust_request_id)
            .field("make_request_id", &self.make_request_id)
            .finish()
    }
}

/// What the middleware decided for one request.
pub(crate) struct Started {
    pub(crate) id: RequestId,
    /// The explicit owner of every lock call of the request, when request ids are trusted.
    pub(crate) owner: Option<OwnerId>,
    /// Index into the configured headers.
    pub(crate) echo_header: usize,
    pub(crate) from_client: bool,
    pub(crate) span: tracing::Span,
}

/// Runs `future` with `id` as the current request id.
pub(crate) fn request_id_scope<F: std::future::Future>(
    id: RequestId,
    future: F,
) -> tokio::task::futures::TaskLocalFuture<RequestId, F> {
    REQUEST_ID.scope(id, future)
}

/// The request's scopes around `future`: a call chain labelled with the request id (with the
/// trusted owner, if any), and the request id.
pub(crate) type RequestScope<F> = tokio::task::futures::TaskLocalFuture<
    crate::owner::Chain,
    tokio::task::futures::TaskLocalFuture<RequestId, F>,
>;

pub(crate) fn request_scope<F: std::future::Future>(
    started: &Started,
    future: F,
) -> RequestScope<F> {
    crate::owner::chain_scope(
        Some(started.id.as_str().into()),
        started.owner.clone(),
        request_id_scope(started.id.clone(), future),
    )
}

#[track_caller]
fn header_name(name: &str) -> Arc<str> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    assert!(valid, "`{name}` is not a valid HTTP header name");
    name.to_ascii_lowercase().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a [u8]> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes())
        }
    }

    #[test]
    fn the_first_usable_header_wins_and_unusable_ids_are_replaced() {
        let config = OwnerScopeConfig::new();
        let s = config.start(headers(&[("req-id", "b"), ("x-request-id", "a")]));
        assert_eq!(
            (s.id.as_str(), s.echo_header, s.from_client),
            ("a", 0, true)
        );
        let s = config.start(headers(&[("x-request-id", "bad value"), ("req-id", "b")]));
        assert_eq!((s.id.as_str(), s.echo_header), ("b", 1));
        let long = "x".repeat(MAX_REQUEST_ID_LEN + 1);
        let s = config.start(headers(&[("x-request-id", &long)]));
        assert!(!s.from_client && s.id.as_str().len() == 36 && s.echo_header == 0);
    }

    #[test]
    fn there_is_no_request_owner_unless_the_id_is_trusted() {
        let plain = OwnerScopeConfig::new();
        let a = plain.start(headers(&[("x-request-id", "same")]));
        assert_eq!(a.owner, None, "each lock call chain gets its own owner");
        let trusted = OwnerScopeConfig::new().trust_request_id_as_owner();
        let a = trusted.start(headers(&[("x-request-id", "same")]));
        let b = trusted.start(headers(&[("req-id", "same")]));
        assert_eq!(a.owner, b.owner);
        assert_eq!(a.owner.unwrap().as_str(), "request:same");
    }

    #[test]
    fn header_names_are_checked_and_lower_cased() {
        let config = OwnerScopeConfig::new()
            .with_header("X-Trace")
            .also_accept_header("x-trace");
        assert_eq!(config.headers(), ["x-trace"]);
        let bad = std::panic::catch_unwind(|| OwnerScopeConfig::new().with_header("a b"));
        assert!(bad.is_err());
    }
}
