//! Holds in this process: grants (generations) with their guards and validity deadlines.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::ids::{GrantId, OwnerField};
use super::kind::Kind;
use crate::events::HoldInfo;
use crate::owner::Site;
use crate::vocab::LossReason;

/// How long a hold is valid for here: the lease counted from when the grant or renewal was
/// *sent*, less a margin for clock drift between this process and Redis (1% + 2 ms, as in
/// RedLock). Redis keeps the key at least that long, so once this passes the lock may be
/// someone else's.
pub(crate) fn valid_until(sent: Instant, lease_ms: u64) -> Instant {
    let lease = Duration::from_millis(lease_ms);
    let margin = lease / 100 + Duration::from_millis(2);
    sent + lease.saturating_sub(margin)
}

/// A hold's loss signal: set once, awaited by any number of guards (a cancellation token without
/// children: no allocation of its own).
#[derive(Debug, Default)]
pub(crate) struct Lost {
    set: AtomicBool,
    notify: Notify,
}

impl Lost {
    /// Sets the signal and wakes every waiter (once: later calls change nothing).
    pub(crate) fn cancel(&self) {
        if !self.set.swap(true, Ordering::SeqCst) {
            self.notify.notify_waiters();
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once the signal is set.
    pub(crate) async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // registered before the flag is read: a `cancel` in between wakes it
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// What a hold's guards share: its loss signal and its validity deadline.
#[derive(Debug)]
pub(crate) struct HoldCell {
    pub(super) lost: Lost,
    valid_until: Mutex<Instant>,
    /// What events and metrics say about the hold, set by its first guard.
    info: OnceLock<HoldInfo>,
    /// The service's shutdown released the hold (its guards then touch Redis no more).
    shut_down: AtomicBool,
}

impl HoldCell {
    pub(super) fn new(valid_until: Instant) -> Arc<HoldCell> {
        Arc::new(HoldCell {
            lost: Lost::default(),
            valid_until: Mutex::new(valid_until),
            info: OnceLock::new(),
            shut_down: AtomicBool::new(false),
        })
    }

    /// Whether the hold has been described (it has a guard).
    pub(crate) fn is_described(&self) -> bool {
        self.info.get().is_some()
    }

    /// Describes the hold for events and metrics; `false` when it already was.
    pub(crate) fn describe(&self, info: HoldInfo) -> bool {
        self.info.set(info).is_ok()
    }

    /// The hold's description, once a guard gave it one.
    pub(crate) fn info(&self) -> Option<&HoldInfo> {
        self.info.get()
    }

    /// Reports the loss of the hold (once; holds that never had a guard are not reported).
    pub(crate) fn report_lost(&self, reason: LossReason) {
        if let Some(info) = self.info.get() {
            info.lost(reason);
        }
    }

    /// Until when the hold is valid, as far as is known now.
    pub(crate) fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves the deadline to `until` if that is later.
    pub(crate) fn extend_to(&self, until: Instant) {
        let mut valid = self
            .valid_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if until > *valid {
            *valid = until;
        }
    }

    /// Sets the deadline to `until`, earlier or later (a new fixed lease).
    pub(crate) fn set_valid_until(&self, until: Instant) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = until;
    }

    /// Ends the hold because the service shuts down (which releases it on Redis): its guards
    /// are no longer valid and their `lost()` says why.
    pub(super) fn end_by_shutdown(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
        self.lost.cancel();
    }

    /// Whether the service's shutdown released the hold.
    pub(crate) fn ended_by_shutdown(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Resolves when the hold was found gone or force-unlocked.
    pub(crate) async fn cancelled(&self) {
        self.lost.cancelled().await;
    }

    /// Whether the hold is believed to be in force on Redis.
    pub(crate) fn is_live(&self, now: Instant) -> bool {
        !self.lost.is_cancelled() && now < self.valid_until()
    }
}

/// One grant held by one owner in this process (a generation): its guards re-enter it without
/// asking Redis for a new grant, and a new grant never merges into it.
pub(super) struct Hold {
    pub(super) kind: &'static Kind,
    pub(super) owner: OwnerField,
    pub(super) grant: GrantId,
    pub(super) guards: u32,
    /// Guards without a lease: the watchdog renews the key while this is > 0.
    pub(super) watched: u32,
    pub(super) cell: Arc<HoldCell>,
    /// Where the plain lock calls whose guards hold it were made, while those guards live.
    pub(super) sites: Vec<Weak<Site>>,
}

impl Hold {
    pub(super) fn live(&self, now: Instant) -> bool {
        self.cell.is_live(now)
    }

    /// Whether this hold keeps a waiter of `owner` (of a kind whose holds are `shared` or not)
    /// from getting the lock: holds of one owner never conflict, shared ones neither.
    pub(super) fn blocks(&self, owner: &OwnerField, shared: bool) -> bool {
        self.owner != *owner && !(self.kind.shared && shared)
    }
}

/// A new generation: never merged into an existing hold of the same owner.
pub(super) fn add_hold(
    holds: &mut Vec<Hold>,
    kind: &'static Kind,
    owner: &OwnerField,
    grant: &GrantId,
    watched: bool,
    sent: Instant,
    lease_ms: u64,
) -> Arc<HoldCell> {
    // An earlier generation of the same owner is dead (a live one would have been re-entered):
    // its guards are lost.
    // (the clock is read only when there is such a generation to look at)
    let mut now = None;
    for hold in holds
        .iter()
        .filter(|h| h.owner == *owner && h.grant != *grant)
    {
        if !hold.live(*now.get_or_insert_with(Instant::now)) {
            hold.cell.report_lost(LossReason::LeaseRanOut);
            hold.cell.lost.cancel();
        }
    }
    if let Some(hold) = holds.iter_mut().find(|h| h.grant == *grant) {
        hold.guards += 1;
        hold.watched += u32::from(watched);
        hold.cell.extend_to(valid_until(sent, lease_ms));
        return hold.cell.clone();
    }
    let cell = HoldCell::new(valid_until(sent, lease_ms));
    holds.push(Hold {
        kind,
        owner: owner.clone(),
        grant: grant.clone(),
        guards: 1,
        watched: u32::from(watched),
        cell: cell.clone(),
        sites: Vec::new(),
    });
    cell
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use super::*;

    /// Polls `f` once: whether it finished.
    async fn ready_after_one_poll<F: Future>(mut f: Pin<&mut F>) -> bool {
        std::future::poll_fn(|cx: &mut Context<'_>| Poll::Ready(f.as_mut().poll(cx).is_ready()))
            .await
    }

    #[tokio::test]
    async fn a_loss_wakes_every_waiter_and_later_ones_return_at_once() {
        let cell = HoldCell::new(Instant::now() + Duration::from_secs(60));
        let mut waiters: Vec<_> = (0..3).map(|_| Box::pin(cell.cancelled())).collect();
        for waiter in &mut waiters {
            assert!(!ready_after_one_poll(waiter.as_mut()).await, "waits");
        }
        assert!(cell.is_live(Instant::now()));
        cell.lost.cancel();
        cell.lost.cancel();
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("woken by the loss");
        }
        assert!(!cell.is_live(Instant::now()));
        assert!(ready_after_one_poll(std::pin::pin!(cell.cancelled())).await);
    }
}
