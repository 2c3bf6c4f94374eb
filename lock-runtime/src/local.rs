//! The in-process side of the locks of one service: which owners hold which keys here, and the
//! line of waiters per key.
//!
//! Waiters for one key line up in arrival order and only the head of the line talks to Redis, so
//! a release wakes one waiter, not all of them, and a task that releases and locks again queues
//! behind the waiters already in line. When a holder releases while the head is parked, the
//! release script can hand the lock straight to the head (one round trip); see `release.lua`.
//!
//! Everything here is synchronous and runs under one short mutex; the Redis calls happen between
//! the `begin_*` and `end_*` steps.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A lock key as stored on Redis (prefix and hash tag applied).
pub(crate) type LockKey = Arc<str>;
/// An owner as stored on Redis: `<process instance>:<owner id>`.
pub(crate) type OwnerField = Arc<str>;

#[derive(Default)]
pub(crate) struct Local {
    keys: Mutex<HashMap<LockKey, KeyState>>,
    next_waiter: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct KeyState {
    holds: Vec<Hold>,
    waiters: VecDeque<Waiter>,
}

/// The guards one owner has on one key in this process.
struct Hold {
    owner: OwnerField,
    guards: u32,
    /// Guards without a lease: the watchdog renews the key while this is > 0.
    watched: u32,
    lost: CancellationToken,
    renewed_at: Instant,
    /// When the longest fixed lease of its guards runs out (about: measured here).
    lease_until: Instant,
}

impl Hold {
    /// Whether this hold is believed to be in force on Redis.
    fn live(&self, now: Instant) -> bool {
        !self.lost.is_cancelled() && (self.watched > 0 || self.lease_until > now)
    }
}

struct Waiter {
    id: u64,
    owner: OwnerField,
    lease_ms: u64,
    watched: bool,
    state: WaiterState,
    /// When the release that handed the lock over was sent: the lease runs from at most then.
    granted_at: Instant,
    wake: Arc<Notify>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WaiterState {
    /// Waiting to be woken; a release may reserve it for a hand-off.
    Parked,
    /// Its own acquire attempt is in flight.
    Attempting,
    /// A release is handing the lock to it.
    Reserved,
    /// The lock was handed to it with this token; its hold is registered.
    Granted(u64),
}

/// What a waiter should do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Not at the head, or a hand-off to it is in flight: wait for a wake-up.
    Wait,
    /// At the head: try Redis now.
    Attempt,
    /// At the head, but another owner of this service holds the lock: its release will hand
    /// the lock over or wake the head, so Redis need not be asked. Look again after a while
    /// anyway, in case that hold was lost without this service noticing; `until`: when its
    /// fixed lease runs out (`None`: renewed by the watchdog).
    Behind { until: Option<Instant> },
    /// The lock was handed over with this token; its lease started no earlier than `since`.
    Granted { token: u64, since: Instant },
}

/// A waiter reserved by a release for a hand-off.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    pub(crate) waiter: u64,
    pub(crate) at: Instant,
    pub(crate) owner: OwnerField,
    pub(crate) lease_ms: u64,
}

/// How a release attempt on Redis ended, as far as the waiter line cares.
pub(crate) enum ReleaseEnd {
    /// The lock went to the reserved waiter with this token.
    HandedOff(u64),
    /// Freed (the next turn may have gone to another service).
    Freed,
    /// Still held (re-entrant holds remain) or not held at all, or the call failed.
    Unchanged,
}

/// A hand-off the reserved waiter did not take: the caller must give the lock back.
pub(crate) struct Orphan {
    pub(crate) owner: OwnerField,
}

/// What the watchdog has to renew.
pub(crate) struct Renewal {
    pub(crate) key: LockKey,
    pub(crate) owner: OwnerField,
}

impl Local {
    fn lock(&self) -> MutexGuard<'_, HashMap<LockKey, KeyState>> {
        // A panic while holding this mutex cannot leave the maps inconsistent in a way that
        // matters more than refusing all further lock operations would.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `owner` holds `key` in this process (so a new lock call re-enters).
    pub(crate) fn holds(&self, key: &str, owner: &str) -> bool {
        let keys = self.lock();
        keys.get(key).is_some_and(|k| {
            k.holds
                .iter()
                .any(|h| &*h.owner == owner && !h.lost.is_cancelled())
        })
    }

    /// Records a guard of `owner` on `key`; returns the hold's loss signal.
    pub(crate) fn add_hold(
        &self,
        key: &LockKey,
        owner: &OwnerField,
        watched: bool,
        lease_ms: u64,
    ) -> CancellationToken {
        let mut keys = self.lock();
        let state = keys.entry(key.clone()).or_default();
        add_hold(state, owner, watched, lease_ms)
    }

    /// Drops a guard of `owner` on `key` (synchronously, so renewal stops at once). When the
    /// owner has no guard left here and the head waiter is parked, reserves it for a hand-off.
    ///
    /// `guard` is `Some(watched)` when a guard is dropped, `None` when a grant that never got a
    /// guard is given back.
    pub(crate) fn begin_release(
        &self,
        key: &str,
        owner: &str,
        guard: Option<bool>,
        hand_off: bool,
    ) -> Option<Reservation> {
        let mut keys = self.lock();
        let state = keys.get_mut(key)?;
        let position = state.holds.iter().position(|h| &*h.owner == owner);
        let owner_left = match (position, guard) {
            (Some(i), Some(watched)) => {
                let hold = &mut state.holds[i];
                hold.guards = hold.guards.saturating_sub(1);
                hold.watched = hold.watched.saturating_sub(u32::from(watched));
                if hold.guards == 0 {
                    state.holds.swap_remove(i);
                }
                hold_count(state, owner) == 0
            }
            (Some(_), None) => false,
            (None, _) => true,
        };
        let reservation = match state.waiters.front_mut() {
            Some(head) if hand_off && owner_left && head.state == WaiterState::Parked => {
                head.state = WaiterState::Reserved;
                Some(Reservation {
                    waiter: head.id,
                    at: Instant::now(),
                    owner: head.owner.clone(),
                    lease_ms: head.lease_ms,
                })
            }
            _ => None,
        };
        if state.is_idle() {
            keys.remove(key);
        }
        reservation
    }

    /// Finishes a release: delivers a hand-off to the reserved waiter, or un-reserves it and
    /// wakes it. Returns the grant to give back when the reserved waiter is gone.
    pub(crate) fn end_release(
        &self,
        key: &LockKey,
        reservation: Option<Reservation>,
        end: ReleaseEnd,
    ) -> Option<Orphan> {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return match (end, reservation) {
                (ReleaseEnd::HandedOff(_), Some(r)) => Some(Orphan { owner: r.owner }),
                _ => None,
            };
        };
        let reserved = reservation
            .as_ref()
            .and_then(|r| state.waiters.iter().position(|w| w.id == r.waiter));
        match (end, reserved) {
            (ReleaseEnd::HandedOff(token), Some(i)) => {
                let w = &state.waiters[i];
                let (owner, watched, lease_ms) = (w.owner.clone(), w.watched, w.lease_ms);
                add_hold(state, &owner, watched, lease_ms);
                let waiter = &mut state.waiters[i];
                waiter.state = WaiterState::Granted(token);
                waiter.granted_at = reservation.as_ref().map_or_else(Instant::now, |r| r.at);
                waiter.wake.notify_one();
                None
            }
            (ReleaseEnd::HandedOff(_), None) => reservation.map(|r| Orphan { owner: r.owner }),
            (_, reserved) => {
                if let Some(i) = reserved {
                    state.waiters[i].state = WaiterState::Parked;
                }
                // After a yield the head learns of the release from the published message, at
                // the same moment as the other services' waiters, instead of racing ahead.
                // When the turn went to another service, the head's attempt finds that out and
                // waits for its turn; it must not sleep through the release.
                if let Some(head) = state.waiters.front() {
                    head.wake.notify_one();
                }
                None
            }
        }
    }

    /// Puts a new waiter at the end of the line of `key`.
    pub(crate) fn enqueue(
        &self,
        key: &LockKey,
        owner: &OwnerField,
        lease_ms: u64,
        watched: bool,
    ) -> (u64, Arc<Notify>) {
        let id = self
            .next_waiter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let mut keys = self.lock();
        let state = keys.entry(key.clone()).or_default();
        if state.waiters.is_empty() {
            wake.notify_one();
        }
        state.waiters.push_back(Waiter {
            id,
            owner: owner.clone(),
            lease_ms,
            watched,
            state: WaiterState::Parked,
            granted_at: Instant::now(),
            wake: wake.clone(),
        });
        (id, wake)
    }

    /// What waiter `id` should do now; marks the head as attempting when it should try Redis.
    pub(crate) fn turn(&self, key: &str, id: u64) -> Turn {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return Turn::Wait;
        };
        match state.waiters.front_mut() {
            Some(head) if head.id == id => match head.state {
                WaiterState::Parked
                    if state
                        .holds
                        .iter()
                        .any(|h| h.owner != head.owner && h.live(Instant::now())) =>
                {
                    let now = Instant::now();
                    let ahead = state
                        .holds
                        .iter()
                        .filter(|h| h.owner != head.owner && h.live(now));
                    let until = if ahead.clone().any(|h| h.watched > 0) {
                        None
                    } else {
                        ahead.map(|h| h.lease_until).max()
                    };
                    Turn::Behind { until }
                }
                WaiterState::Parked | WaiterState::Attempting => {
                    head.state = WaiterState::Attempting;
                    Turn::Attempt
                }
                WaiterState::Reserved => Turn::Wait,
                WaiterState::Granted(token) => Turn::Granted {
                    token,
                    since: head.granted_at,
                },
            },
            _ => match state.waiters.iter().find(|w| w.id == id) {
                Some(w) => match w.state {
                    WaiterState::Granted(token) => Turn::Granted {
                        token,
                        since: w.granted_at,
                    },
                    _ => Turn::Wait,
                },
                None => Turn::Wait,
            },
        }
    }

    /// The head's attempt failed (lock held elsewhere): park it so releases can hand off to it.
    pub(crate) fn park(&self, key: &str, id: u64) {
        let mut keys = self.lock();
        if let Some(w) = keys
            .get_mut(key)
            .and_then(|s| s.waiters.iter_mut().find(|w| w.id == id))
            && w.state == WaiterState::Attempting
        {
            w.state = WaiterState::Parked;
        }
    }

    /// Waiter `id` got the lock (by its own attempt or a hand-off): leave the line, register the
    /// hold unless a hand-off already did, and wake the next head.
    pub(crate) fn leave_granted(&self, key: &LockKey, id: u64) -> CancellationToken {
        let mut keys = self.lock();
        let state = keys.entry(key.clone()).or_default();
        let waiter = remove_waiter(state, id);
        match waiter {
            Some(w) if matches!(w.state, WaiterState::Granted(_)) => state
                .holds
                .iter()
                .find(|h| h.owner == w.owner)
                .map(|h| h.lost.clone())
                .unwrap_or_default(),
            Some(w) => add_hold(state, &w.owner, w.watched, w.lease_ms),
            None => CancellationToken::new(),
        }
    }

    /// Waiter `id` gives up (timeout, error, cancellation). If a hand-off had already reached
    /// it, returns the owner whose grant must be given back (its hold is already dropped).
    /// The second value says whether the line is empty now (the service waits no more).
    pub(crate) fn leave(&self, key: &str, id: u64) -> (Option<Orphan>, bool) {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return (None, false);
        };
        let Some(waiter) = remove_waiter(state, id) else {
            return (None, false);
        };
        let orphan = match waiter.state {
            WaiterState::Granted(_) => {
                if let Some(i) = state.holds.iter().position(|h| h.owner == waiter.owner) {
                    let hold = &mut state.holds[i];
                    hold.guards -= 1;
                    hold.watched = hold.watched.saturating_sub(u32::from(waiter.watched));
                    if hold.guards == 0 {
                        state.holds.swap_remove(i);
                    }
                }
                Some(Orphan {
                    owner: waiter.owner,
                })
            }
            _ => None,
        };
        let line_empty = state.waiters.is_empty();
        if state.is_idle() {
            keys.remove(key);
        }
        (orphan, line_empty)
    }

    /// Marks every hold of `key` in this process lost (it was force-unlocked).
    pub(crate) fn mark_lost(&self, key: &str) {
        if let Some(state) = self.lock().get(key) {
            for hold in &state.holds {
                hold.lost.cancel();
            }
            wake_head(state);
        }
    }

    /// Wakes the head waiter of `key` (a release message arrived).
    pub(crate) fn wake_head(&self, key: &str) {
        if let Some(head) = self.lock().get(key).and_then(|s| s.waiters.front()) {
            head.wake.notify_one();
        }
    }

    /// Wakes every head waiter (the subscriber reconnected and may have missed messages).
    pub(crate) fn wake_all_heads(&self) {
        for state in self.lock().values() {
            if let Some(head) = state.waiters.front() {
                head.wake.notify_one();
            }
        }
    }

    /// How many callers of this service wait in line for `key`.
    pub(crate) fn waiter_count(&self, key: &str) -> usize {
        self.lock().get(key).map_or(0, |s| s.waiters.len())
    }

    /// Whether anyone in this process waits for `key`.
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        self.lock().get(key).is_some_and(|s| !s.waiters.is_empty())
    }

    /// The holds the watchdog must renew now.
    pub(crate) fn renewals(&self) -> Vec<Renewal> {
        let keys = self.lock();
        let mut out = Vec::new();
        for (key, state) in keys.iter() {
            for hold in state
                .holds
                .iter()
                .filter(|h| h.watched > 0 && !h.lost.is_cancelled())
            {
                out.push(Renewal {
                    key: key.clone(),
                    owner: hold.owner.clone(),
                });
            }
        }
        out
    }

    /// Records the outcome of renewing `owner`'s hold on `key`. A hold that could not be
    /// renewed for longer than `lease` (Redis unreachable) has expired: it is reported lost.
    pub(crate) fn renewed(&self, key: &str, owner: &str, still_held: bool) {
        let mut keys = self.lock();
        let Some(hold) = keys
            .get_mut(key)
            .and_then(|s| s.holds.iter_mut().find(|h| &*h.owner == owner))
        else {
            return;
        };
        if still_held {
            hold.renewed_at = Instant::now();
        } else {
            hold.lost.cancel();
            if let Some(state) = keys.get(key) {
                wake_head(state);
            }
        }
    }

    /// Marks holds whose last successful renewal is older than `lease` as lost.
    pub(crate) fn expire_unrenewed(
        &self,
        lease: std::time::Duration,
    ) -> Vec<(LockKey, OwnerField)> {
        let keys = self.lock();
        let mut lost = Vec::new();
        for (key, state) in keys.iter() {
            for hold in state
                .holds
                .iter()
                .filter(|h| h.watched > 0 && !h.lost.is_cancelled())
            {
                if hold.renewed_at.elapsed() >= lease {
                    hold.lost.cancel();
                    lost.push((key.clone(), hold.owner.clone()));
                }
            }
            wake_head(state);
        }
        lost
    }
}

impl KeyState {
    fn is_idle(&self) -> bool {
        self.holds.is_empty() && self.waiters.is_empty()
    }
}

fn wake_head(state: &KeyState) {
    if let Some(head) = state.waiters.front() {
        head.wake.notify_one();
    }
}

fn hold_count(state: &KeyState, owner: &str) -> u32 {
    state
        .holds
        .iter()
        .filter(|h| &*h.owner == owner)
        .map(|h| h.guards)
        .sum()
}

fn add_hold(
    state: &mut KeyState,
    owner: &OwnerField,
    watched: bool,
    lease_ms: u64,
) -> CancellationToken {
    let lease_until = Instant::now() + std::time::Duration::from_millis(lease_ms);
    match state.holds.iter_mut().find(|h| &h.owner == owner) {
        Some(hold) => {
            if hold.lost.is_cancelled() {
                // A fresh grant after the previous one was lost: new signal for the new guards.
                hold.lost = CancellationToken::new();
            }
            hold.guards += 1;
            hold.watched += u32::from(watched);
            hold.renewed_at = Instant::now();
            hold.lease_until = hold.lease_until.max(lease_until);
            hold.lost.clone()
        }
        None => {
            let lost = CancellationToken::new();
            state.holds.push(Hold {
                owner: owner.clone(),
                guards: 1,
                watched: u32::from(watched),
                lost: lost.clone(),
                renewed_at: Instant::now(),
                lease_until,
            });
            lost
        }
    }
}

/// Removes waiter `id`; when it was the head, wakes the new head.
fn remove_waiter(state: &mut KeyState, id: u64) -> Option<Waiter> {
    let i = state.waiters.iter().position(|w| w.id == id)?;
    let waiter = state.waiters.remove(i)?;
    if i == 0
        && let Some(head) = state.waiters.front()
    {
        head.wake.notify_one();
    }
    Some(waiter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LockKey {
        "lock:{k}".into()
    }

    #[test]
    fn line_order_and_hand_off() {
        let local = Local::default();
        let (k, a, b) = (key(), OwnerField::from("i:a"), OwnerField::from("i:b"));
        local.add_hold(&k, &a, true, 60_000);
        let (w1, _) = local.enqueue(&k, &b, 100, false);
        let (w2, _) = local.enqueue(&k, &"i:c".into(), 100, false);
        assert_eq!(local.turn(&k, w2), Turn::Wait);
        // behind a live hold of this service the head does not ask Redis
        assert_eq!(local.turn(&k, w1), Turn::Behind { until: None });
        local.mark_lost(&k);
        assert_eq!(local.turn(&k, w1), Turn::Attempt);
        // while the head attempts, a release must not reserve it
        assert!(local.begin_release(&k, &a, Some(true), true).is_none());
        local.park(&k, w1);
        local.add_hold(&k, &a, false, 60_000);
        let r = local
            .begin_release(&k, &a, Some(false), true)
            .expect("parked head is reserved");
        assert_eq!((r.waiter, &*r.owner), (w1, "i:b"));
        assert_eq!(local.turn(&k, w1), Turn::Wait);
        assert!(
            local
                .end_release(&k, Some(r), ReleaseEnd::HandedOff(7))
                .is_none()
        );
        assert!(matches!(local.turn(&k, w1), Turn::Granted { token: 7, .. }));
        assert!(local.holds(&k, "i:b"));
        local.leave_granted(&k, w1);
        assert!(matches!(
            local.turn(&k, w2),
            Turn::Behind { until: Some(_) }
        ));
        assert_eq!(
            local.renewals().len(),
            0,
            "b holds with a lease: nothing to renew"
        );
    }

    #[test]
    fn cancelled_waiters_give_back_hand_offs() {
        let local = Local::default();
        let (k, a, b) = (key(), OwnerField::from("i:a"), OwnerField::from("i:b"));
        local.add_hold(&k, &a, false, 60_000);
        let (w1, _) = local.enqueue(&k, &b, 100, true);
        let r = local.begin_release(&k, &a, Some(false), true).unwrap();
        // the waiter is cancelled while the hand-off is in flight
        assert!(local.leave(&k, w1).0.is_none());
        let orphan = local
            .end_release(&k, Some(r), ReleaseEnd::HandedOff(3))
            .unwrap();
        assert_eq!(&*orphan.owner, "i:b");
        // cancelled after the hand-off reached it
        local.add_hold(&k, &a, false, 60_000);
        let (w2, _) = local.enqueue(&k, &b, 100, true);
        let r = local.begin_release(&k, &a, Some(false), true).unwrap();
        local.end_release(&k, Some(r), ReleaseEnd::HandedOff(4));
        assert_eq!(local.renewals().len(), 1);
        assert_eq!(&*local.leave(&k, w2).0.unwrap().owner, "i:b");
        assert!(local.renewals().is_empty());
        assert!(local.lock().is_empty(), "idle keys are forgotten");
    }
}
