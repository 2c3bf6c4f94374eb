//! The operations waiting to be sent with the next script call, and the call slots taken: the
//! batching state of one service (see `batch` for the calls themselves).

use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::handoff::Reservation;
use super::ids::{GrantId, OwnerField};
use super::kind::Kind;
use super::names::KeyNames;
use super::reply::Ask;
use super::target::Target;
use crate::backend::Synced;
use crate::error::LockError;

/// Script calls on their way at once before operations queue: two keep Redis busy with one
/// while the client reads the other.
pub(super) const IN_FLIGHT: usize = 2;
/// More calls that may be on their way for releases that hand the lock to a waiter of this
/// service, on a multi-thread runtime: such a release is what its waiter waits for, so it does
/// not wait for a call to come back first (with four permits of a semaphore changing hands at
/// once, up to four hand-offs are on their way). Other operations queue while [`IN_FLIGHT`] or
/// more calls are on their way. On a current-thread runtime the one thread that sends every
/// call also reads every reply: there, a call more costs it more than the wait saves, and
/// hand-offs queue like any other operation.
const HAND_OFF_SLOTS: usize = 2;
/// Operations in one script call at most: bounds how long one call keeps Redis busy (Redis
/// runs nothing else while a script runs; 128 mutex operations take a few milliseconds).
pub(crate) const MAX_OPS: usize = 128;

/// One lock operation of `ops.lua`.
pub(crate) enum Op {
    Acquire {
        target: Target,
        owner: OwnerField,
        /// The id of the grant this attempt makes or confirms.
        grant: GrantId,
        lease_ms: u64,
        ask: Ask,
    },
    Release {
        target: Target,
        owner: OwnerField,
        /// The grant to release.
        grant: GrantId,
        /// The parked waiter of this service to hand the lock to.
        next: Option<Reservation>,
        /// Hand the lock to `next` even when other services wait: this service's turn with it
        /// started less than a slice ago (see `Reservation::in_turn`).
        in_turn: bool,
        /// A lock freed by this release stays taken until then (a minimum hold), when the kind
        /// keeps locks (the mutex); `None`: freed at once.
        keep_until: Option<std::time::Instant>,
    },
}

impl Op {
    pub(super) fn target(&self) -> &Target {
        match self {
            Op::Acquire { target, .. } | Op::Release { target, .. } => target,
        }
    }

    pub(super) fn names(&self) -> &KeyNames {
        &self.target().names
    }

    pub(super) fn kind(&self) -> &'static Kind {
        self.target().kind
    }

    /// Whether it is an acquire of an all-or-nothing run ([`Ask::Chained`]).
    pub(super) fn chained(&self) -> bool {
        matches!(
            self,
            Op::Acquire {
                ask: Ask::Chained,
                ..
            }
        )
    }

    /// Whether it may grant the lock, so the replicas must acknowledge it (`sync_replicas`).
    pub(super) fn grants(&self) -> bool {
        matches!(
            self,
            Op::Acquire {
                ask: Ask::Grant { .. } | Ask::Chained,
                ..
            } | Op::Release { next: Some(_), .. }
        )
    }
}

/// The reply of one operation (see `acquire.lua`, `release.lua`), and whether the replicas
/// acknowledged its call.
pub(crate) type OpReply = Result<Synced<[i64; 3]>, LockError>;

/// The operations waiting for a free slot, and the slots taken.
pub(crate) struct Batcher {
    state: Mutex<State>,
    /// The slots beyond [`IN_FLIGHT`] that hand-offs may take ([`HAND_OFF_SLOTS`] or none).
    hand_off_slots: usize,
}

#[derive(Default)]
struct State {
    queued: Vec<(Op, oneshot::Sender<OpReply>)>,
    in_flight: usize,
}

impl Batcher {
    /// The batching state of a service whose tasks run on `runtime`.
    pub(crate) fn new(runtime: &tokio::runtime::Handle) -> Batcher {
        let hand_off_slots = match runtime.runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => 0,
            _ => HAND_OFF_SLOTS,
        };
        Batcher {
            state: Mutex::default(),
            hand_off_slots,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a slot and gives `op` back to be sent now, or queues it for the next call.
    pub(super) fn take_or_queue(&self, op: Op) -> Result<Op, oneshot::Receiver<OpReply>> {
        let slots = if matches!(op, Op::Release { next: Some(_), .. }) {
            IN_FLIGHT + self.hand_off_slots
        } else {
            IN_FLIGHT
        };
        let mut state = self.lock();
        if state.in_flight < slots {
            state.in_flight += 1;
            return Ok(op);
        }
        let (sender, reply) = oneshot::channel();
        state.queued.push((op, sender));
        Err(reply)
    }

    /// When a call's slot is done: the queued operations to send next in that slot (those of
    /// the first one's kind, in order, at most [`MAX_OPS`]), or `None` when nothing waits and
    /// the slot is free again.
    pub(super) fn next_batch(&self) -> Option<Vec<(Op, oneshot::Sender<OpReply>)>> {
        let mut state = self.lock();
        // operations whose caller gave up waiting are not sent
        state.queued.retain(|(_, reply)| !reply.is_closed());
        if state.queued.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        // the operations of the first one's kind, in order (one script runs them)
        let kind = state.queued[0].0.kind();
        if state.queued.len() <= MAX_OPS && state.queued.iter().all(|(op, _)| op.kind() == kind) {
            // all of them (the common case): the queue as it is, and a new one as large
            let capacity = state.queued.capacity();
            return Some(std::mem::replace(
                &mut state.queued,
                Vec::with_capacity(capacity),
            ));
        }
        let mut batch = Vec::new();
        let mut rest = Vec::new();
        for queued in state.queued.drain(..) {
            if batch.len() < MAX_OPS && queued.0.kind() == kind {
                batch.push(queued);
            } else {
                rest.push(queued);
            }
        }
        state.queued = rest;
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::ids::new_grant_id;
    use super::super::local::tests::TEST_KIND;
    use super::*;

    fn target() -> Target {
        Target::new(
            &TEST_KIND,
            KeyNames::in_namespace("lock:", "", "k").unwrap(),
        )
    }

    fn acquire() -> Op {
        Op::Acquire {
            target: target(),
            owner: "o".into(),
            grant: new_grant_id(),
            lease_ms: 1_000,
            ask: Ask::Chained,
        }
    }

    /// A release; with `hand_off`, one that hands the lock to a waiter of this service.
    fn release(hand_off: bool) -> Op {
        let next = hand_off.then(|| Reservation {
            waiter: 1,
            at: Instant::now(),
            owner: "w".into(),
            grant: new_grant_id(),
            lease_ms: 1_000,
            in_turn: true,
            extra: "".into(),
            held: 0,
        });
        Op::Release {
            target: target(),
            owner: "o".into(),
            grant: new_grant_id(),
            next,
            in_turn: hand_off,
            keep_until: None,
        }
    }

    /// A multi-thread runtime's batcher.
    fn batcher() -> Batcher {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        Batcher::new(runtime.handle())
    }

    #[test]
    fn a_hand_off_does_not_wait_for_a_call_to_come_back() {
        let batcher = batcher();
        for _ in 0..IN_FLIGHT {
            assert!(batcher.take_or_queue(acquire()).is_ok());
        }
        // every slot taken: other operations queue
        let _acquire = batcher.take_or_queue(acquire()).err().expect("queued");
        let _release = batcher.take_or_queue(release(false)).err().expect("queued");
        // a release that hands the lock over goes at once, up to HAND_OFF_SLOTS of them
        for _ in 0..HAND_OFF_SLOTS {
            assert!(batcher.take_or_queue(release(true)).is_ok());
        }
        let _hand_off = batcher.take_or_queue(release(true)).err().expect("queued");
        // a call coming back sends the queued operations, in order, in its slot
        let batch = batcher.next_batch().expect("queued operations");
        let kinds: Vec<_> = batch
            .iter()
            .map(|(op, _)| match op {
                Op::Acquire { .. } => "acquire",
                Op::Release { next: None, .. } => "release",
                Op::Release { next: Some(_), .. } => "hand-off",
            })
            .collect();
        assert_eq!(kinds, ["acquire", "release", "hand-off"]);
        // the slots come back one by one once nothing is queued
        for _ in 0..IN_FLIGHT + HAND_OFF_SLOTS {
            assert!(batcher.next_batch().is_none());
        }
        assert_eq!(batcher.lock().in_flight, 0);
    }

    #[test]
    fn on_a_current_thread_runtime_a_hand_off_queues_like_any_operation() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batcher = Batcher::new(runtime.handle());
        for _ in 0..IN_FLIGHT {
            assert!(batcher.take_or_queue(acquire()).is_ok());
        }
        let _hand_off = batcher.take_or_queue(release(true)).err().expect("queued");
    }
}
