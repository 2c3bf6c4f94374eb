//! What happens to held locks, as events a holder or the whole service can subscribe to.
//!
//! [`LockService::events`](crate::LockService::events) hands out a receiver of every
//! [`LockEvent`] of the service: renewals, renewals that failed, holds lost (and why), and
//! force-unlocks made through it (`force_unlock`, `force_unlock_kind`). A holder interested
//! in its own hold filters by [`key`](LockEvent::key) and [`fence`](LockEvent::fence), or
//! awaits its guard's `lost()`, which fires at the same moment as the [`LockEvent::Lost`] of
//! that hold (or earlier: at the hold's validity deadline, which the service notices within a
//! second when nobody awaits `lost()`).
//!
//! ```no_run
//! use lock_runtime::{LockEvent, LockService};
//! use tokio::sync::broadcast::error::RecvError;
//!
//! # async fn demo(locks: LockService) {
//! let mut events = locks.events();
//! tokio::spawn(async move {
//!     loop {
//!         match events.recv().await {
//!             Ok(LockEvent::Lost { key, reason, fence, .. }) => {
//!                 eprintln!("lost {key} (token {fence}): {reason}");
//!             }
//!             Ok(_) => {}
//!             Err(RecvError::Lagged(missed)) => eprintln!("{missed} lock events missed"),
//!             Err(RecvError::Closed) => break, // the service is gone
//!         }
//!     }
//! });
//! # }
//! ```
//!
//! Events are sent whether anyone listens or not (sending to no receiver costs a check); a
//! receiver that falls more than [`CAPACITY`] events behind loses the oldest ones and is told
//! how many ([`RecvError::Lagged`](tokio::sync::broadcast::error::RecvError::Lagged)).
//!
//! The same moments are logged with `tracing` (target `lock_runtime`): a grant at `DEBUG`
//! (`lock acquired`, inside the `lock.acquire` span), a failed renewal at `WARN`, a loss at
//! `ERROR` when the lease ran out or the hold was found gone (mutual exclusion may have ended
//! without anyone deciding so) and at `WARN` when this service force-unlocked it, and every
//! force-unlock at `WARN`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{broadcast, mpsc};

use crate::metrics;
use crate::owner::OwnerId;
pub use crate::vocab::LossReason;
use crate::vocab::{HoldMode, LockKind};

/// How many events a receiver may fall behind before it loses the oldest.
pub const CAPACITY: usize = 1024;

/// Something that happened to a lock of a service; from [`LockService::events`](crate::LockService::events).
///
/// `key` is the key as it was asked for, `kind` and `mode` what lock and hold it is, `fence`
/// the fencing token of the hold, `owner` its owner, `label` its metric label (the
/// attribute's key template such as `goods:<id>`, the request's
/// [`metric_label`](crate::LockRequest::metric_label), or `other`).
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::LockEvent;
///
/// let mut events = locks.events();
/// tokio::spawn(async move {
///     while let Ok(event) = events.recv().await {
///         if matches!(event, LockEvent::Lost { .. }) {
///             eprintln!("{} lost by {:?}", event.key(), event.owner());
///         }
///     }
/// });
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEvent {
    /// The watchdog renewed a hold held without a lease.
    #[non_exhaustive]
    Renewed {
        /// The key.
        key: Arc<str>,
        /// The lock's kind.
        kind: LockKind,
        /// What the hold holds: the mutex, a read or the write hold, permits.
        mode: HoldMode,
        /// The holder.
        owner: OwnerId,
        /// The hold's fencing token.
        fence: u64,
        /// The metric label.
        label: &'static str,
    },
    /// A renewal of a hold failed (Redis did not answer or answered with an error). The hold
    /// stays valid until its validity deadline; the watchdog tries again at its next tick, and
    /// if no renewal succeeds by the deadline, [`LockEvent::Lost`] follows.
    #[non_exhaustive]
    RenewalFailed {
        /// The key.
        key: Arc<str>,
        /// The lock's kind.
        kind: LockKind,
        /// What the hold holds: the mutex, a read or the write hold, permits.
        mode: HoldMode,
        /// The holder.
        owner: OwnerId,
        /// The hold's fencing token.
        fence: u64,
        /// The metric label.
        label: &'static str,
        /// What went wrong.
        error: String,
    },
    /// A hold was lost while held: its guards' `lost()` fire, an annotated body with
    /// `on_lost = "fail"` is stopped. Sent once per hold.
    #[non_exhaustive]
    Lost {
        /// The key.
        key: Arc<str>,
        /// The lock's kind.
        kind: LockKind,
        /// What the hold holds: the mutex, a read or the write hold, permits.
        mode: HoldMode,
        /// The holder.
        owner: OwnerId,
        /// The hold's fencing token.
        fence: u64,
        /// The metric label.
        label: &'static str,
        /// Why.
        reason: LossReason,
    },
    /// This service force-unlocked the lock `key` (whoever held it; the holders in this
    /// service get a [`LockEvent::Lost`] each, those elsewhere at their next renewal).
    #[non_exhaustive]
    ForceUnlocked {
        /// The key.
        key: Arc<str>,
        /// The lock's kind.
        kind: LockKind,
    },
}

impl LockEvent {
    /// The key the event is about.
    pub fn key(&self) -> &str {
        match self {
            LockEvent::Renewed { key, .. }
            | LockEvent::RenewalFailed { key, .. }
            | LockEvent::Lost { key, .. }
            | LockEvent::ForceUnlocked { key, .. } => key,
        }
    }

    /// The lock's kind.
    pub fn kind(&self) -> LockKind {
        match self {
            LockEvent::Renewed { kind, .. }
            | LockEvent::RenewalFailed { kind, .. }
            | LockEvent::Lost { kind, .. }
            | LockEvent::ForceUnlocked { kind, .. } => *kind,
        }
    }

    /// What the hold the event is about holds (`None` for a force-unlock).
    pub fn mode(&self) -> Option<HoldMode> {
        match self {
            LockEvent::Renewed { mode, .. }
            | LockEvent::RenewalFailed { mode, .. }
            | LockEvent::Lost { mode, .. } => Some(*mode),
            LockEvent::ForceUnlocked { .. } => None,
        }
    }

    /// The fencing token of the hold the event is about (`None` for a force-unlock).
    pub fn fence(&self) -> Option<u64> {
        match self {
            LockEvent::Renewed { fence, .. }
            | LockEvent::RenewalFailed { fence, .. }
            | LockEvent::Lost { fence, .. } => Some(*fence),
            LockEvent::ForceUnlocked { .. } => None,
        }
    }

    /// The holder the event is about (`None` for a force-unlock).
    pub fn owner(&self) -> Option<&OwnerId> {
        match self {
            LockEvent::Renewed { owner, .. }
            | LockEvent::RenewalFailed { owner, .. }
            | LockEvent::Lost { owner, .. } => Some(owner),
            LockEvent::ForceUnlocked { .. } => None,
        }
    }
}

/// The sending side of a service's events.
#[derive(Debug)]
pub(crate) struct Events {
    sender: Sender,
    /// The journal's side of [`Sender::journal`], taken once by the task that writes the
    /// journal (see `engine::presence`).
    journal: std::sync::Mutex<Option<mpsc::UnboundedReceiver<LockEvent>>>,
}

/// Where events go: the application's receivers, and, for the rare ones other processes
/// cannot see (a hold lost, a force-unlock), the journal on Redis.
#[derive(Debug, Clone)]
pub(crate) struct Sender {
    broadcast: broadcast::Sender<LockEvent>,
    journal: mpsc::UnboundedSender<LockEvent>,
}

impl Default for Events {
    fn default() -> Self {
        let (journal, journal_rx) = mpsc::unbounded_channel();
        Events {
            sender: Sender {
                broadcast: broadcast::Sender::new(CAPACITY),
                journal,
            },
            journal: std::sync::Mutex::new(Some(journal_rx)),
        }
    }
}

impl Events {
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<LockEvent> {
        self.sender.broadcast.subscribe()
    }

    pub(crate) fn sender(&self) -> Sender {
        self.sender.clone()
    }

    /// The events to journal (holds lost, force-unlocks); `None` after the first call.
    pub(crate) fn take_journal(&self) -> Option<mpsc::UnboundedReceiver<LockEvent>> {
        self.journal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Sends `event` to the receivers there are (none: nothing to do).
    pub(crate) fn send(&self, event: LockEvent) {
        send(&self.sender, event);
    }
}

fn send(sender: &Sender, event: LockEvent) {
    if matches!(
        event,
        LockEvent::Lost { .. } | LockEvent::ForceUnlocked { .. }
    ) {
        // nobody reads it once the service is gone: nothing to do then
        let _ = sender.journal.send(event.clone());
    }
    if sender.broadcast.receiver_count() > 0 {
        let _ = sender.broadcast.send(event);
    }
}

/// What events and metrics say about one hold (a grant), set by its first guard; shared by the
/// grant's guards through its cell.
#[derive(Debug)]
pub(crate) struct HoldInfo {
    pub(crate) key: Arc<str>,
    pub(crate) mode: HoldMode,
    pub(crate) label: &'static str,
    pub(crate) owner: OwnerId,
    pub(crate) fence: u64,
    events: Sender,
    /// The loss was reported: a hold is lost once.
    lost: AtomicBool,
}

impl HoldInfo {
    pub(crate) fn new(
        key: Arc<str>,
        mode: HoldMode,
        label: &'static str,
        owner: OwnerId,
        fence: u64,
        events: Sender,
    ) -> HoldInfo {
        HoldInfo {
            key,
            mode,
            label,
            owner,
            fence,
            events,
            lost: AtomicBool::new(false),
        }
    }

    /// The hold was lost: counted, logged and sent the first time only.
    pub(crate) fn lost(&self, reason: LossReason) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        metrics::lost(self.mode, self.label, reason);
        match reason {
            LossReason::ForceUnlocked => tracing::warn!(
                kind = self.mode.label(), key = %self.key, owner = %self.owner,
                fence = self.fence, reason = reason.as_str(), "lock lost while held: {reason}"
            ),
            LossReason::LeaseRanOut | LossReason::FoundGone => tracing::error!(
                kind = self.mode.label(), key = %self.key, owner = %self.owner,
                fence = self.fence, reason = reason.as_str(), "lock lost while held: {reason}"
            ),
        }
        send(
            &self.events,
            LockEvent::Lost {
                key: self.key.clone(),
                kind: self.mode.kind(),
                mode: self.mode,
                owner: self.owner.clone(),
                fence: self.fence,
                label: self.label,
                reason,
            },
        );
    }

    /// The watchdog renewed the hold.
    pub(crate) fn renewed(&self) {
        metrics::renewed(self.mode, self.label);
        tracing::trace!(kind = self.mode.label(), key = %self.key, owner = %self.owner, fence = self.fence, "lock renewed");
        if self.events.broadcast.receiver_count() > 0 {
            send(
                &self.events,
                LockEvent::Renewed {
                    key: self.key.clone(),
                    kind: self.mode.kind(),
                    mode: self.mode,
                    owner: self.owner.clone(),
                    fence: self.fence,
                    label: self.label,
                },
            );
        }
    }

    /// A renewal of the hold failed; the caller logs it.
    pub(crate) fn renewal_failed(&self, error: &dyn fmt::Display) {
        metrics::renewal_failed(self.mode, self.label);
        if self.events.broadcast.receiver_count() > 0 {
            send(
                &self.events,
                LockEvent::RenewalFailed {
                    key: self.key.clone(),
                    kind: self.mode.kind(),
                    mode: self.mode,
                    owner: self.owner.clone(),
                    fence: self.fence,
                    label: self.label,
                    error: error.to_string(),
                },
            );
        }
    }
}
