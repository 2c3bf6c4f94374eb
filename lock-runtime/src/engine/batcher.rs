//! The operations waiting to be sent with the next script call, and the call slots taken: the
//! batching state of one service (see `batch` for the calls themselves).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
    /// In the order they were asked for.
    queued: Vec<Queued>,
    /// The slots taken: calls on their way (also one that came back until its slot's
    /// [`Batcher::next_batch`]), and collectors, slots an operation took while a call was on
    /// its way (see [`Batcher::take_or_queue`]), which send the queue soon.
    in_flight: usize,
    /// The calls on their way, and their operations.
    calls: usize,
    call_ops: usize,
}

impl State {
    fn came_back(&mut self, ops: usize) {
        self.calls = self.calls.saturating_sub(1);
        self.call_ops = self.call_ops.saturating_sub(ops);
    }
}

/// An operation waiting for the next call.
pub(super) struct Queued {
    pub(super) op: Op,
    /// When it was asked for: `response_timeout` bounds it from then, while it waits here and
    /// on the call it goes out with (no timer of its own: see [`Next`]).
    pub(super) asked: Instant,
    pub(super) reply: oneshot::Sender<OpReply>,
}

/// A queued operation's reply to come, and whether it took a free slot (`collect`): then its
/// caller sends the queued operations in that slot once the tasks that are ready now ran (see
/// [`Batcher::take_or_queue`]); else the next call that comes back sends it.
pub(super) struct Waiting {
    pub(super) reply: oneshot::Receiver<OpReply>,
    pub(super) collect: bool,
}

/// What a call slot that came back does next ([`Batcher::next_batch`]).
#[derive(Default)]
pub(super) struct Next {
    /// Queued operations asked for `response_timeout` ago or longer: they fail, unsent.
    pub(super) late: Vec<Queued>,
    /// The operations to send in the slot now, and by when their call must answer: the
    /// `response_timeout` of the oldest of them (one timer per call, none per operation).
    /// `None`: the slot is free again.
    pub(super) batch: Option<(Vec<Queued>, Instant)>,
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

    /// Takes a slot and gives `op` back to be sent now, or queues it (see [`Waiting`]).
    ///
    /// An operation goes at once when no call is on its way (a lone caller pays nothing for
    /// batching), and so does a release that hands the lock over while a slot is free. Any
    /// other operation that finds a slot free while a call is on its way takes the slot but
    /// queues: the tasks a call that came back woke are ready to run now, each with its next
    /// operation, and sending the first of them alone would take the slot for one operation
    /// for a whole round trip (under load, calls of one operation then alternated with calls
    /// of all the others: Redis and the client took turns instead of working at once).
    pub(super) fn take_or_queue(&self, op: Op) -> Result<Op, Waiting> {
        let hand_off = matches!(op, Op::Release { next: Some(_), .. });
        let slots = if hand_off {
            IN_FLIGHT + self.hand_off_slots
        } else {
            IN_FLIGHT
        };
        let mut state = self.lock();
        let free = state.in_flight < slots;
        if free && (state.in_flight == 0 || hand_off) {
            state.in_flight += 1;
            state.calls += 1;
            state.call_ops += 1;
            return Ok(op);
        }
        if free {
            state.in_flight += 1;
        }
        let (sender, reply) = oneshot::channel();
        // (read under the lock: the queue stays in the order of these times)
        state.queued.push(Queued {
            op,
            asked: Instant::now(),
            reply: sender,
        });
        Err(Waiting {
            reply,
            collect: free,
        })
    }

    /// When a slot is done: its call of `came_back` operations came back (0: a collector's
    /// slot, which sent nothing). The queued operations to send next in that slot, and the ones
    /// that waited `timeout` or longer, which are not sent (see [`Next`]). The slot takes the
    /// first one's kind, in order, at most [`MAX_OPS`], and its share of them when collectors
    /// are to come. A collector that finds a few operations while a call of many more is on its
    /// way leaves them to that call's slot and frees its own: sent alone, the few would keep a
    /// call of their own beside the large one, call after call, and Redis and the client would
    /// take turns (one call at work, the other not) instead of working at once.
    ///
    /// No operation waits here or on its call longer than `timeout`: a call's deadline is
    /// `timeout` after its oldest operation was asked for, so every call on its way when an
    /// operation queued (its operations asked for earlier, or at the front of the queue then)
    /// comes back before that operation's own deadline, and the slot it frees either sends it
    /// in time or finds it late; an operation a slot leaves queued for another is one of
    /// these: that slot was taken when it queued.
    pub(super) fn next_batch(&self, timeout: Duration, came_back: usize) -> Next {
        let mut next = Next::default();
        let mut state = self.lock();
        if came_back > 0 {
            state.came_back(came_back);
        }
        // operations whose caller gave up waiting are not sent
        state.queued.retain(|queued| !queued.reply.is_closed());
        if let Some(first) = state.queued.first()
            && first.asked.elapsed() >= timeout
        {
            let now = Instant::now();
            let late = state
                .queued
                .partition_point(|queued| now.saturating_duration_since(queued.asked) >= timeout);
            next.late = state.queued.drain(..late).collect();
        }
        let Some(first) = state.queued.first() else {
            state.in_flight -= 1;
            return next;
        };
        let deadline = first.asked + timeout;
        // the operations of the first one's kind, in order (one script runs them), this
        // slot's share of them
        let kind = first.op.kind();
        let queued = state.queued.len();
        if came_back == 0 && queued * 4 < state.call_ops {
            // a few, while a call of many more is on its way: they go with that call's slot
            state.in_flight -= 1;
            return next;
        }
        // shared with the collectors to come (this slot is one of the slots taken that carry
        // no call)
        let collectors = state.in_flight.saturating_sub(state.calls);
        let share = queued.div_ceil(collectors.max(1)).min(MAX_OPS);
        if share == queued && state.queued.iter().all(|q| q.op.kind() == kind) {
            // all of them (the common case): the queue as it is, and a new one as large
            let capacity = state.queued.capacity();
            let batch = std::mem::replace(&mut state.queued, Vec::with_capacity(capacity));
            state.calls += 1;
            state.call_ops += batch.len();
            next.batch = Some((batch, deadline));
            return next;
        }
        let mut batch = Vec::new();
        let mut rest = Vec::new();
        for queued in state.queued.drain(..) {
            if batch.len() < share && queued.op.kind() == kind {
                batch.push(queued);
            } else {
                rest.push(queued);
            }
        }
        state.queued = rest;
        state.calls += 1;
        state.call_ops += batch.len();
        next.batch = Some((batch, deadline));
        next
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::ids::new_grant_id;
    use super::super::local::tests::TEST_KIND;
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(1);

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

    /// Takes every call slot of `batcher` (as calls on their way): the operations after queue.
    fn take_every_slot(batcher: &Batcher) {
        assert!(
            batcher.take_or_queue(acquire()).is_ok(),
            "no call on its way"
        );
        batcher.lock().in_flight = IN_FLIGHT;
    }

    #[test]
    fn with_a_call_on_its_way_a_free_slot_waits_for_the_ready_operations() {
        let batcher = batcher();
        // nothing on its way: at once
        assert!(batcher.take_or_queue(acquire()).is_ok());
        // a call on its way and a slot free: the operation takes it, but queues, and its
        // caller sends the queue in that slot (the operations ready now with it)
        let first = batcher.take_or_queue(release(false)).err().expect("queued");
        assert!(first.collect);
        assert_eq!(batcher.lock().in_flight, IN_FLIGHT);
        // no slot left: the next ones queue for a call coming back
        let second = batcher.take_or_queue(acquire()).err().expect("queued");
        assert!(!second.collect);
        // a hand-off still goes at once while a slot of its own is free
        assert!(batcher.take_or_queue(release(true)).is_ok());
        // the collecting slot sends both, in order
        let (batch, _) = batcher.next_batch(TIMEOUT, 0).batch.expect("the queue");
        let kinds: Vec<_> = batch
            .iter()
            .map(|queued| matches!(queued.op, Op::Acquire { .. }))
            .collect();
        assert_eq!(kinds, [false, true]);
    }

    #[test]
    fn a_call_coming_back_leaves_a_collector_to_come_its_share() {
        let batcher = batcher();
        assert!(batcher.take_or_queue(acquire()).is_ok());
        // a collector's slot, and four more operations behind its own
        let collector = batcher.take_or_queue(acquire()).err().expect("queued");
        assert!(collector.collect);
        let _rest: Vec<_> = (0..4)
            .map(|_| batcher.take_or_queue(acquire()).err().expect("queued"))
            .collect();
        // the call on its way comes back before the collector's turn: it takes half of the
        // five, the collector the rest
        let (first, _) = batcher.next_batch(TIMEOUT, 1).batch.expect("a share");
        let (second, _) = batcher.next_batch(TIMEOUT, 0).batch.expect("the rest");
        assert_eq!((first.len(), second.len()), (3, 2));
        assert!(first.iter().chain(&second).is_sorted_by_key(|q| q.asked));
        assert_eq!(batcher.lock().in_flight, IN_FLIGHT);
        assert_eq!(batcher.lock().call_ops, 5);
    }

    #[test]
    fn a_hand_off_does_not_wait_for_a_call_to_come_back() {
        let batcher = batcher();
        take_every_slot(&batcher);
        // every slot taken: other operations queue
        let _acquire = batcher.take_or_queue(acquire()).err().expect("queued");
        let _release = batcher.take_or_queue(release(false)).err().expect("queued");
        // a release that hands the lock over goes at once, up to HAND_OFF_SLOTS of them
        for _ in 0..HAND_OFF_SLOTS {
            assert!(batcher.take_or_queue(release(true)).is_ok());
        }
        let _hand_off = batcher.take_or_queue(release(true)).err().expect("queued");
        // calls coming back send the queued operations, in order, in their slots (each its
        // share: two of three, with four slots taken)
        let first = batcher.next_batch(TIMEOUT, 1).batch.expect("queued");
        let second = batcher.next_batch(TIMEOUT, 1).batch.expect("the rest");
        let kinds: Vec<_> = first
            .0
            .iter()
            .chain(&second.0)
            .map(|queued| match queued.op {
                Op::Acquire { .. } => "acquire",
                Op::Release { next: None, .. } => "release",
                Op::Release { next: Some(_), .. } => "hand-off",
            })
            .collect();
        assert_eq!(kinds, ["acquire", "release", "hand-off"]);
        assert_eq!(first.0.len(), 2);
        // the slots come back one by one once nothing is queued
        for _ in 0..IN_FLIGHT + HAND_OFF_SLOTS {
            assert!(batcher.next_batch(TIMEOUT, 1).batch.is_none());
        }
        assert_eq!(batcher.lock().in_flight, 0);
    }

    #[test]
    fn on_a_current_thread_runtime_a_hand_off_queues_like_any_operation() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batcher = Batcher::new(runtime.handle());
        take_every_slot(&batcher);
        let _hand_off = batcher.take_or_queue(release(true)).err().expect("queued");
    }

    #[test]
    fn queued_operations_past_the_timeout_fail_unsent_and_a_call_keeps_the_oldest_deadline() {
        let batcher = batcher();
        take_every_slot(&batcher);
        let _old = batcher.take_or_queue(acquire()).err().expect("queued");
        std::thread::sleep(Duration::from_millis(30));
        let _new = batcher.take_or_queue(release(false)).err().expect("queued");
        // the first has waited 30 ms or more, the second less
        let next = batcher.next_batch(Duration::from_millis(30), 0);
        assert_eq!(next.late.len(), 1);
        assert!(matches!(next.late[0].op, Op::Acquire { .. }));
        let (batch, deadline) = next.batch.expect("the second goes out");
        assert_eq!(batch.len(), 1);
        assert_eq!(deadline, batch[0].asked + Duration::from_millis(30));
        // everything late: nothing to send, the slot is free
        let _late = batcher.take_or_queue(acquire()).err().expect("queued");
        let next = batcher.next_batch(Duration::ZERO, 0);
        assert_eq!(next.late.len(), 1);
        assert!(next.batch.is_none());
        assert_eq!(batcher.lock().in_flight, IN_FLIGHT - 1);
    }
}
