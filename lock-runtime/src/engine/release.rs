//! Releasing: the guard's bookkeeping at once, then the release script (handing the lock to a
//! parked waiter of this service when the kind can), repeated until Redis answers when a call
//! fails; and give-back of grants nobody will use.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::batcher::Op;
use super::core::Engine;
use super::handoff::{ReleaseEnd, ReleasePlan, Reservation};
use super::ids::{GrantId, OwnerField};
use super::reply::{Released, parse_released};
use super::target::Target;
use crate::detach::Detachable;
use crate::error::LockError;

type Detached<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Engine {
    /// Releases one guard of grant `grant` in the background: drops the guard's bookkeeping
    /// now, then (for a grant's last guard) runs `release.lua`, handing the lock to a parked
    /// waiter of this service when it can. With `keep_until`, a mutex freed by this release
    /// stays taken (by nobody) until then: a minimum hold (see `LockRequest::hold_at_least`).
    pub(crate) fn release_detached(
        self: &Arc<Self>,
        target: Target,
        field: OwnerField,
        grant: GrantId,
        watched: bool,
        keep_until: Option<Instant>,
    ) -> tokio::task::JoinHandle<Result<Released, LockError>> {
        self.runtime
            .spawn(self.release_call(target, field, grant, Some(watched), true, keep_until))
    }

    /// Like [`release_detached`](Self::release_detached), but runs inline for a caller that
    /// awaits it; if the caller goes away, the release still completes in a task.
    pub(crate) fn release_now(
        self: &Arc<Self>,
        target: Target,
        field: OwnerField,
        grant: GrantId,
        watched: bool,
        keep_until: Option<Instant>,
    ) -> Detachable<Result<Released, LockError>> {
        Detachable::boxed(
            &self.runtime,
            self.release_call(target, field, grant, Some(watched), true, keep_until),
            drop,
        )
    }

    /// Gives back the grant `grant` (one nobody will use, or whose outcome is unknown) in the
    /// background, handing the lock to a parked waiter of this service when it can. Releasing
    /// a grant id that was never granted changes nothing; a call that fails is repeated until
    /// Redis answers (see [`repeat_release`](Self::repeat_release)).
    pub(crate) fn give_back(self: &Arc<Self>, target: Target, field: OwnerField, grant: GrantId) {
        let call = self.release_call(target, field, grant, None, true, None);
        self.runtime.spawn(call);
    }

    /// The bookkeeping happens now; the returned future runs the script when it is needed.
    fn release_call(
        self: &Arc<Self>,
        target: Target,
        field: OwnerField,
        grant: GrantId,
        guard: Option<bool>,
        hand_off: bool,
        keep_until: Option<Instant>,
    ) -> Detached<Result<Released, LockError>> {
        // a lock kept after its release is handed to nobody: the next waiter of this service
        // waits for the minimum hold to end like everybody else
        let keep_until = keep_until.filter(|t| *t > Instant::now());
        let hand_off = hand_off && target.kind.hand_off && keep_until.is_none();
        match self
            .local
            .begin_release(&target.names.lock, &grant, guard, hand_off)
        {
            ReleasePlan::Local => Box::pin(std::future::ready(Ok(Released::StillHeld))),
            ReleasePlan::NotHeld => Box::pin(std::future::ready(Ok(Released::NotHeld))),
            ReleasePlan::Redis(reservation) => {
                // counted until the script answered, also when the release runs in a task of
                // its own: a shutdown waits for it (see `shut_down`)
                let releasing = self.releasing.start();
                Box::pin(self.clone().finish_release(
                    target,
                    field,
                    grant,
                    reservation,
                    keep_until,
                    releasing,
                ))
            }
        }
    }

    /// The release call of `grant` (handing the lock to `reservation`'s waiter when there is
    /// one) and what follows from its reply here.
    ///
    /// (A function returning the future rather than an `async fn`, which would keep its
    /// arguments twice: every release's future carries this one.)
    #[allow(clippy::manual_async_fn)]
    fn finish_release(
        self: Arc<Self>,
        target: Target,
        field: OwnerField,
        grant: GrantId,
        reservation: Option<Reservation>,
        keep_until: Option<Instant>,
        // counted until the script answered (dropped at the end)
        releasing: ReleaseTicket,
    ) -> impl Future<Output = Result<Released, LockError>> + Send + 'static {
        async move {
            let _releasing = releasing;
            let names = &target.names;
            let sent = Instant::now();
            let op = Op::Release {
                target: target.clone(),
                owner: field.clone(),
                grant: grant.clone(),
                next: reservation.clone(),
                in_turn: reservation.as_ref().is_some_and(|r| r.in_turn),
                keep_until,
            };
            let reply = match self.run_op(op).await {
                Ok(synced) => match parse_released(&synced.reply, names) {
                    // a hand-off is a grant: it needs the replicas' acknowledgement like any other
                    Ok(Released::HandedOff(_)) if !synced.acknowledged => {
                        if let Some(r) = &reservation {
                            self.give_back_plain(target.clone(), r.owner.clone(), r.grant.clone());
                        }
                        Ok(Released::Freed { yielded: false })
                    }
                    other => other,
                },
                Err(e) => Err(e),
            };
            if reservation.is_some()
                && matches!(reply, Ok(Released::Freed { yielded: true }) | Err(_))
            {
                // a release that yields to another service registers this one, whose waiter is
                // next (release.lua); one whose outcome is unknown may have
                let horizon = Self::waiter_horizon_of(&self.config, None);
                let horizon = Duration::from_millis(horizon);
                self.registered.note(&names.lock, sent, horizon);
            }
            // The release registered this service as waiting when it reserved a waiter; whether the
            // head hears of its turn depends on the subscription (a head that never asked Redis
            // may not be subscribed yet: it looks at once, as after any release).
            let yielded = matches!(reply, Ok(Released::Freed { yielded: true }))
                && reservation.is_some()
                && self
                    .subscriptions
                    .try_lock()
                    .is_ok_and(|s| s.contains(&names.channel()));
            let end = match &reply {
                Ok(Released::HandedOff(token)) => ReleaseEnd::HandedOff(*token),
                Ok(Released::Freed { .. }) if yielded => ReleaseEnd::Yielded,
                Ok(Released::Freed { .. }) => ReleaseEnd::Freed,
                Ok(_) => ReleaseEnd::Unchanged,
                Err(_) => ReleaseEnd::Unknown,
            };
            if let Some(orphan) = self
                .local
                .end_release(&names.lock, &grant, reservation, end)
            {
                tracing::debug!(key = %names.user, "hand-off target left, giving the lock back");
                self.give_back(target.clone(), orphan.owner, orphan.grant);
            }
            if yielded {
                self.watch_turn(&names.lock);
            }
            if let Err(e) = &reply {
                // The release may not have run: repeat it (without a hand-off) until Redis answers,
                // so the lock is not left held for its whole lease.
                tracing::debug!(key = %names.user, error = %e, "release failed; repeating it in the background");
                self.runtime.spawn(self.clone().repeat_release(
                    target.clone(),
                    field,
                    grant,
                    keep_until,
                ));
            }
            reply
        }
    }

    /// Repeats the release of `grant` until Redis answers, for at most a minute or the
    /// watchdog timeout, whichever is longer (a grant with a longer fixed lease is left to it).
    /// A minimum hold still keeps the lock until `keep_until`.
    async fn repeat_release(
        self: Arc<Self>,
        target: Target,
        field: OwnerField,
        grant: GrantId,
        keep_until: Option<Instant>,
    ) {
        let names = &target.names;
        let started = Instant::now();
        let give_up = self.config.watchdog_timeout().max(Duration::from_secs(60));
        let mut pause = Duration::from_millis(20);
        while started.elapsed() < give_up {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
            let op = Op::Release {
                target: target.clone(),
                owner: field.clone(),
                grant: grant.clone(),
                next: None,
                in_turn: false,
                keep_until,
            };
            match self.run_op(op).await {
                Ok(_) => {
                    self.local.wake_head(&names.lock);
                    return;
                }
                Err(e) => tracing::debug!(key = %names.user, error = %e, "release failed again"),
            }
        }
        tracing::warn!(key = %names.user, "could not release a lock; it expires with its lease");
    }

    /// Gives back a grant without handing it to a waiter of this service (used when the grant
    /// was not replicated: handing it over would only repeat that).
    fn give_back_plain(self: &Arc<Self>, target: Target, field: OwnerField, grant: GrantId) {
        drop(
            self.runtime
                .spawn(self.release_call(target, field, grant, None, false, None)),
        );
    }
}

/// The releases on their way to Redis (their holds already left the service's bookkeeping), so
/// that a shutdown can wait for them: a guard dropped a moment before `shutdown` is released by
/// a task that the process's exit would otherwise cut short, leaving the lock held for its
/// lease.
#[derive(Default)]
pub(crate) struct Releasing(Arc<ReleasingCount>);

#[derive(Default)]
struct ReleasingCount {
    count: AtomicUsize,
    idle: Notify,
}

/// One release on its way; dropping it (the release answered, failed or was dropped) ends it.
pub(crate) struct ReleaseTicket(Arc<ReleasingCount>);

impl Releasing {
    pub(crate) fn start(&self) -> ReleaseTicket {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        ReleaseTicket(self.0.clone())
    }

    /// Returns once no release is on its way.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for ReleaseTicket {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_waits_for_every_release_on_its_way() {
        let releasing = Releasing::default();
        releasing.idle().await;
        let (a, b) = (releasing.start(), releasing.start());
        let waiting = async {
            releasing.idle().await;
            true
        };
        tokio::pin!(waiting);
        assert!(futures_poll_once(waiting.as_mut()).await.is_none());
        drop(a);
        assert!(
            futures_poll_once(waiting.as_mut()).await.is_none(),
            "b is on its way"
        );
        drop(b);
        assert_eq!(futures_poll_once(waiting.as_mut()).await, Some(true));
    }

    /// Polls `f` once: its output, or `None` when it is pending.
    async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| match Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await
    }
}
