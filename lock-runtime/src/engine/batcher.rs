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
const IN_FLIGHT: usize = 2;
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
#[derive(Default)]
pub(crate) struct Batcher {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    queued: Vec<(Op, oneshot::Sender<OpReply>)>,
    in_flight: usize,
}

impl Batcher {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a slot and gives `op` back to be sent now, or queues it for the next call.
    pub(super) fn take_or_queue(&self, op: Op) -> Result<Op, oneshot::Receiver<OpReply>> {
        let mut state = self.lock();
        if state.in_flight < IN_FLIGHT {
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
