//! Futures that finish even when their caller stops waiting.
//!
//! A Redis call that changes lock state must not be lost half-way: its reply decides whether a
//! lock was granted. [`Detachable`] polls the call inline (no task, no channel on the fast path);
//! if it is dropped before the call completed, the rest of the call moves to a task of its own
//! and its output goes to the orphan handler (for example, to give a late grant back).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type Orphan<T> = Box<dyn FnOnce(T) + Send>;

pub(crate) struct Detachable<T: Send + 'static> {
    call: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    orphan: Option<Orphan<T>>,
    runtime: tokio::runtime::Handle,
    /// A call never polled has not sent anything: dropping it is enough.
    started: bool,
}

impl<T: Send + 'static> Detachable<T> {
    pub(crate) fn new(
        runtime: &tokio::runtime::Handle,
        call: impl Future<Output = T> + Send + 'static,
        orphan: impl FnOnce(T) + Send + 'static,
    ) -> Self {
        Detachable {
            call: Some(Box::pin(call)),
            orphan: Some(Box::new(orphan)),
            runtime: runtime.clone(),
            started: false,
        }
    }
}

impl<T: Send + 'static> Future for Detachable<T> {
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

impl<T: Send + 'static> Drop for Detachable<T> {
    fn drop(&mut self) {
        if !self.started {
            return;
        }
        if let (Some(call), Some(orphan)) = (self.call.take(), self.orphan.take()) {
            self.runtime.spawn(async move { orphan(call.await) });
        }
    }
}
