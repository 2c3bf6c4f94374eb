//! What the tower and the actix-web middleware do with each request, over either framework's
//! request, response and header types: the request id taken from the request or made, put into
//! the request, the request's scopes around the inner service's response future, and the id
//! echoed on the response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tracing::Instrument;
use tracing::instrument::Instrumented;

use super::{OwnerScopeConfig, REQUEST_ID_HEADER, RequestId, RequestScope, request_scope};

/// A framework's request, as far as the middleware reads and changes it.
pub(crate) trait ScopedRequest {
    /// The framework's header name.
    type Name: FromStr + Clone;
    /// The framework's header value.
    type Value: FromStr + Clone;

    /// The value of the header `name` (lower case), if any.
    fn header(&self, name: &str) -> Option<&[u8]>;

    /// Sets the header `name` to `value`.
    fn insert_header(&mut self, name: Self::Name, value: Self::Value);

    /// Puts `id` into the request's extensions.
    fn insert_request_id(&mut self, id: RequestId);
}

/// Implements [`ScopedRequest`] for a framework's request type, which has `headers()`,
/// `headers_mut()` and `extensions_mut()` over `http` header types (each framework its own
/// version of them).
macro_rules! impl_scoped_request {
    (impl $(<$generic:ident>)? for $request:ty { Name = $name:ty, Value = $value:ty }) => {
        impl $(<$generic>)? $crate::middleware::scope::ScopedRequest for $request {
            type Name = $name;
            type Value = $value;

            fn header(&self, name: &str) -> Option<&[u8]> {
                self.headers().get(name).map(<$value>::as_bytes)
            }

            fn insert_header(&mut self, name: $name, value: $value) {
                self.headers_mut().insert(name, value);
            }

            fn insert_request_id(&mut self, id: $crate::middleware::RequestId) {
                self.extensions_mut().insert(id);
            }
        }
    };
}
pub(crate) use impl_scoped_request;

/// A framework's response, as far as the middleware changes it.
pub(crate) trait ScopedResponse {
    /// The framework's header name.
    type Name;
    /// The framework's header value.
    type Value;

    /// Sets the header `name` to `value` unless the response already has that header.
    fn echo_header(&mut self, name: Self::Name, value: Self::Value);
}

/// The configuration with its header names parsed once, as the framework's header names `N`.
#[derive(Debug)]
pub(crate) struct Shared<N> {
    config: OwnerScopeConfig,
    names: Vec<N>,
}

impl<N: FromStr + Clone> Shared<N> {
    pub(crate) fn new(config: OwnerScopeConfig) -> Arc<Shared<N>> {
        let names = config
            .headers()
            .into_iter()
            // Already checked by the config; the fallback keeps the indexes aligned.
            .map(|h| {
                N::from_str(h)
                    .or_else(|_| N::from_str(REQUEST_ID_HEADER))
                    .ok()
                    .expect("`x-request-id` is a header name")
            })
            .collect();
        Arc::new(Shared { config, names })
    }

    /// Takes the request id from `request` or makes one, puts it into the request (into its
    /// extensions, and into its headers when made here) and returns the response future of
    /// `call(request)` inside the request's scopes.
    pub(crate) fn call<R, F>(
        &self,
        mut request: R,
        call: impl FnOnce(R) -> F,
    ) -> Scoped<F, N, R::Value>
    where
        R: ScopedRequest<Name = N>,
        F: Future,
    {
        let started = self.config.start(|name| request.header(name));
        let name = self.names[started.echo_header].clone();
        // Visible ASCII only, so this never fails.
        let value = R::Value::from_str(started.id.as_str()).ok();
        if let (false, Some(value)) = (started.from_client, &value) {
            request.insert_header(name.clone(), value.clone());
        }
        request.insert_request_id(started.id.clone());
        let future = call(request);
        Scoped {
            inner: request_scope(&started, future).instrument(started.span),
            echo: value.map(|value| (name, value)),
        }
    }
}

pin_project! {
    /// The inner service's response future inside the request's scopes; adds the request id
    /// header to the response.
    pub(crate) struct Scoped<F, N, V> {
        #[pin]
        inner: Instrumented<RequestScope<F>>,
        echo: Option<(N, V)>,
    }
}

impl<F, N, V, T, E> Future for Scoped<F, N, V>
where
    F: Future<Output = Result<T, E>>,
    T: ScopedResponse<Name = N, Value = V>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        if let Some((name, value)) = this.echo.take() {
            response.echo_header(name, value);
        }
        Poll::Ready(Ok(response))
    }
}

/// Shows the header to echo, as `ResponseFuture` (the middlewares' future around this one).
impl<F, N: fmt::Debug, V: fmt::Debug> fmt::Debug for Scoped<F, N, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("echo", &self.echo)
            .finish_non_exhaustive()
    }
}
