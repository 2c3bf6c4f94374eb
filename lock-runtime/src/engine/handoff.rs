//! Releasing, as far as this process's bookkeeping goes: a release drops its guard's hold and
//! may reserve a parked waiter of this service for a hand-off ([`Local::begin_release`]); once
//! Redis answered, the hand-off is delivered to that waiter, or the waiter waits again
//! ([`Local::end_release`]). A mutex hands off to the head of the line when no other hold of
//! the key is in force; a semaphore, whose grants coexist, to the first parked waiter whatever
//! else is held. The Redis side is `release.rs` and each kind's release script.

use std::sync::Arc;
use std::time::Instant;

use super::ids::{GrantId, LockKey, OwnerField};
use super::local::{KeyState, Keys, Local, TURN_SLICE, WaiterState, look_again};
use crate::vocab::LossReason;

/// A waiter reserved by a release for a hand-off.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    pub(crate) waiter: u64,
    pub(crate) at: Instant,
    pub(crate) owner: OwnerField,
    pub(crate) grant: GrantId,
    pub(crate) lease_ms: u64,
    /// The service's turn with the lock started less than [`TURN_SLICE`] ago: the release hands
    /// the lock to this waiter even when other services wait.
    pub(crate) in_turn: bool,
    /// The waiter's extra argument (see [`Waiter::extra`]).
    pub(crate) extra: Arc<str>,
    /// How many other grants of the key this service holds (for a kind whose grants coexist:
    /// a service that holds its share of them hands none over while other services wait).
    pub(crate) held: usize,
}

/// How a release attempt on Redis ended, as far as the waiter line cares.
pub(crate) enum ReleaseEnd {
    /// The lock went to the reserved waiter with this token.
    HandedOff(u64),
    /// Freed (the next turn may have gone to another service).
    Freed,
    /// Freed, and the next turn went to another service while this one, registered as waiting
    /// by the release itself, is subscribed to the lock's wake-ups: the head waits for its
    /// turn's message (or for that turn to run out) instead of asking Redis in vain now.
    Yielded,
    /// Still held by other grants, or not held at all.
    Unchanged,
    /// The call failed: the release (and a hand-off) may or may not have happened.
    Unknown,
}

/// A grant nobody will use: the caller must give it back (release that grant id).
pub(crate) struct Orphan {
    pub(crate) owner: OwnerField,
    pub(crate) grant: GrantId,
}

/// What releasing a guard takes.
pub(crate) enum ReleasePlan {
    /// Other guards of the same grant remain: nothing to tell Redis.
    Local,
    /// The guard's grant is no longer valid here (lost, force-unlocked, past its deadline).
    NotHeld,
    /// Release the grant on Redis, handing it to the reserved waiter if there is one.
    Redis(Option<Reservation>),
}

impl Local {
    /// Drops a guard of the grant `grant` of `key` (synchronously, so renewal stops at once).
    /// When it was the grant's last guard and the head waiter is parked, reserves the head for
    /// a hand-off (for a kind whose grants coexist, the first waiter not served yet, when it
    /// is parked).
    ///
    /// `guard` is `Some(watched)` when a guard is dropped, `None` when a grant that never got a
    /// guard (or whose guards are gone) is given back.
    pub(crate) fn begin_release(
        &self,
        key: &str,
        grant: &GrantId,
        guard: Option<bool>,
        hand_off: bool,
    ) -> ReleasePlan {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return match guard {
                Some(_) => ReleasePlan::NotHeld,
                None => ReleasePlan::Redis(None),
            };
        };
        let position = state.holds.iter().position(|h| h.grant == *grant);
        // one reading of the clock for what follows
        let now = Instant::now();
        match (position, guard) {
            (Some(i), Some(watched)) => {
                let hold = &mut state.holds[i];
                if !hold.live(now) {
                    // a dead generation: Redis may already have granted the lock to someone
                    // else; its guards are lost and their release touches nothing
                    let hold = state.holds.swap_remove(i);
                    hold.cell.report_lost(LossReason::LeaseRanOut);
                    hold.cell.lost.cancel();
                    if state.is_idle() {
                        keys.retire(key);
                    }
                    return ReleasePlan::NotHeld;
                }
                hold.guards = hold.guards.saturating_sub(1);
                hold.watched = hold.watched.saturating_sub(u32::from(watched));
                if hold.guards > 0 {
                    return ReleasePlan::Local;
                }
                state.holds.swap_remove(i);
            }
            (Some(i), None) => {
                state.holds.swap_remove(i).cell.lost.cancel();
            }
            (None, Some(_)) => {
                if state.is_idle() {
                    keys.retire(key);
                }
                return ReleasePlan::NotHeld;
            }
            (None, None) => {}
        }
        state.releasing.push(grant.clone());
        let held = state.holds.iter().filter(|h| h.live(now)).count();
        let in_turn = state
            .turn_since
            .is_some_and(|since| now.saturating_duration_since(since) < TURN_SLICE);
        let next = match state.waiters.front() {
            // Grants that coexist (permits): to the first parked waiter, whatever else is
            // held, so that every release keeps its grant in use. A waiter whose own attempt
            // is on its way is passed over: that attempt takes a free permit, and when it is
            // refused, the waiter is the next one served.
            Some(head) if head.kind.shared => state
                .waiters
                .iter_mut()
                .find(|w| w.state == WaiterState::Parked),
            // A hand-off goes to the head only when no other hold is in force (the kinds
            // that hand off one grant per key have one at a time).
            _ if held > 0 => None,
            _ => state.waiters.front_mut(),
        };
        let reservation = match next {
            Some(w) if hand_off && w.state == WaiterState::Parked => {
                w.state = WaiterState::Reserved;
                Some(Reservation {
                    waiter: w.id,
                    at: now,
                    owner: w.owner.clone(),
                    grant: w.grant.clone(),
                    lease_ms: w.lease_ms,
                    in_turn,
                    extra: w.extra.clone(),
                    held,
                })
            }
            _ => None,
        };
        if state.is_idle() {
            keys.retire(key);
        }
        ReleasePlan::Redis(reservation)
    }

    /// Finishes a release: delivers a hand-off to the reserved waiter, or un-reserves it and
    /// wakes it. Returns the grant to give back when the reserved waiter is gone.
    pub(crate) fn end_release(
        &self,
        key: &LockKey,
        grant: &str,
        reservation: Option<Reservation>,
        end: ReleaseEnd,
    ) -> Option<Orphan> {
        let mut keys = self.lock();
        let orphan = Self::end_release_in(&mut keys, key, grant, reservation, end);
        if keys.get(key).is_some_and(KeyState::is_idle) {
            keys.retire(key);
        }
        orphan
    }

    fn end_release_in(
        keys: &mut Keys,
        key: &LockKey,
        grant: &str,
        reservation: Option<Reservation>,
        end: ReleaseEnd,
    ) -> Option<Orphan> {
        let orphan = |r: Reservation| Orphan {
            owner: r.owner,
            grant: r.grant,
        };
        let Some(state) = keys.get_mut(key) else {
            return match (end, reservation) {
                (ReleaseEnd::HandedOff(_) | ReleaseEnd::Unknown, Some(r)) => Some(orphan(r)),
                _ => None,
            };
        };
        if let Some(i) = state.releasing.iter().position(|g| &**g == grant) {
            state.releasing.swap_remove(i);
        }
        let reserved = reservation
            .as_ref()
            .and_then(|r| state.waiters.iter().position(|w| w.id == r.waiter));
        if !matches!(end, ReleaseEnd::HandedOff(_) | ReleaseEnd::Unchanged) {
            // the lock left this service: its next grant starts a new turn
            state.turn_since = None;
        }
        match (end, reserved) {
            (ReleaseEnd::HandedOff(token), Some(i)) => {
                let at = reservation.as_ref().map_or_else(Instant::now, |r| r.at);
                let lease_ms = state.waiters[i].lease_ms;
                Self::grant_waiter(state, i, token, at, lease_ms);
                None
            }
            // the waiter left: whatever reached it goes back (releasing a grant id that was
            // never granted changes nothing)
            (ReleaseEnd::HandedOff(_) | ReleaseEnd::Unknown, None) => reservation.map(orphan),
            (ReleaseEnd::Yielded, reserved) => {
                if let Some(i) = reserved {
                    Self::unreserve(state, i);
                }
                // A wake-up may have come while the release's reply was on its way (the turn
                // came back in a message, which travels on another connection; a turn timer
                // fired; the subscriber reconnected): it found the head reserved and was spent.
                // Wake the head now.
                let sent = reservation.as_ref().map(|r| r.at);
                let missed = state.turn_watch.missed.get();
                if missed.is_some_and(|t| sent.is_none_or(|s| t >= s)) {
                    look_again(state);
                }
                None
            }
            (_, reserved) => {
                // When the outcome is unknown, the waiter's next attempt (with the grant id of
                // the hand-off) finds out: a grant made by the hand-off is confirmed as its own.
                if let Some(i) = reserved {
                    Self::unreserve(state, i);
                }
                // After a yield the head learns of the release from the published message, at
                // the same moment as the other services' waiters, instead of racing ahead.
                // When the turn went to another service, the head's attempt finds that out and
                // waits for its turn; it must not sleep through the release.
                look_again(state);
                None
            }
        }
    }

    /// Waiter `i`, reserved for a hand-off that did not happen, waits again - or holds the lock
    /// if another service's release granted it meanwhile.
    fn unreserve(state: &mut KeyState, i: usize) {
        state.waiters[i].state = WaiterState::Parked;
        if let Some((token, since)) = state.waiters[i].pushed.take() {
            Self::grant_pushed(state, i, token, since);
        }
    }
}
