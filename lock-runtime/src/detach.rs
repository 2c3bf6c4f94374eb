//! Futures that finish even when their caller stops waiting.
//!
//! A Redis call that changes lock state must not be lost half-way: its reply decides whether a
//! lock was granted. [`Detachable`] polls the call inline (no task, no channel on the fast path);
//! if it is dropped before the call completed, the rest of the call moves to a task of its own
//! and its output goes to the orphan handler (for example, to give a late grant back).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A call on its way: boxed, so that it can move to a task when its caller goes away.
type Call<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A call whose output goes to `O` if its caller stops waiting after it started.
pub(crate) struct Detachable<T: Send + 'static, O: FnOnce(T) + Send + 'static = fn(T)> {
    call: Option<Call<T>>,
    orphan: Option<O>,
    runtime: tokio::runtime::Handle,
    /// A call never polled has not sent anything: dropping it is enough.
    started: bool,
}

impl<T: Send + 'static, O: FnOnce(T) + Send + 'static> Detachable<T, O> {
    pub(crate) fn new(
        runtime: &tokio::runtime::Handle,
        call: impl Future<Output = T> + Send + 'static,
        orphan: O,
    ) -> Self {
        Self::boxed(runtime, Box::pin(call), orphan)
    }

    /// Like [`new`](Self::new), for a call that is boxed already.
    pub(crate) fn boxed(runtime: &tokio::runtime::Handle, call: Call<T>, orphan: O) -> Self {
        Detachable {
            call: Some(call),
            orphan: Some(orphan),
            runtime: runtime.clone(),
            started: false,
        }
    }
}

// Nothing in it is pinned in place: the call is boxed, the orphan handler is only moved.
impl<T: Send + 'static, O: FnOnce(T) + Send + 'static> Unpin for Detachable<T, O> {}

impl<T: Send + 'static, O: FnOnce(T) + Send + 'static> Future for Detachable<T, O> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.started = true;
        let call = self.call.as_mut().expect("polled after completion");
        match call.as_mut().poll(cx) {
            Poll::Ready(out) => {
                self.call = None;
                Poll::Ready(out)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Send + 'static, O: FnOnce(T) + Send + 'static> Drop for Detachable<T, O> {
    fn drop(&mut self) {
        if !self.started {
            return;
        }
        if let (Some(call), Some(orphan)) = (self.call.take(), self.orphan.take()) {
            self.runtime.spawn(async move { orphan(call.await) });
        }
    }
}
