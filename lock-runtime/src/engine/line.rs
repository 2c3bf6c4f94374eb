//! The line of waiters per key: joining it, whose turn it is, parking, leaving, and waking
//! the head.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::handoff::Orphan;
use super::holds::{HoldCell, add_hold};
use super::ids::{GrantId, LockKey, OwnerField};
use super::kind::Kind;
use super::local::{KeyState, Local, Waiter, WaiterState, look_again, wake_front};
use crate::scripts::TURN_MS;

/// What became of a grant another service's release pushed to a waiter of this service.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    Delivered,
    /// No waiter here has its grant id: give it back.
    Gone,
}

/// What a waiter should do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Not at the head, or a hand-off to it is in flight: wait for a wake-up.
    Wait,
    /// At the head: try Redis now.
    Attempt,
    /// At the head, but another owner of this service holds the lock: its release will hand
    /// the lock over or wake the head, so Redis need not be asked. Look again at `until`, when
    /// that hold stops being valid unless it is renewed.
    Behind { until: Instant },
    /// The lock was handed over with this token; its lease started no earlier than `since`.
    /// `claim`: another service's release granted it for a claim window shorter than the
    /// waiter's lease, which the new holder must claim (see `push`).
    Granted {
        token: u64,
        since: Instant,
        claim: bool,
    },
}

impl Local {
    /// Puts a new waiter for a hold of `kind` at the end of the line of `key`; its attempts
    /// carry `grant` and the kind's `extra` argument. Returns its id, what wakes it, and its
    /// first [`Turn`] (as [`turn`](Self::turn) would give it).
    ///
    /// With `only_if_clear`, it joins only a key this service has nothing of (no hold, waiter or
    /// release: the uncontended case) and returns `None` otherwise: the caller looks at the
    /// owner's own holds first then (re-entry), which such a key cannot have.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue(
        &self,
        key: &LockKey,
        kind: &'static Kind,
        owner: &OwnerField,
        grant: &GrantId,
        extra: &Arc<str>,
        lease_ms: u64,
        watched: bool,
        only_if_clear: bool,
        now: Instant,
    ) -> Option<(u64, Arc<Notify>, Turn)> {
        let mut keys = self.lock();
        if only_if_clear && keys.contains_key(&**key) {
            return None;
        }
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let state = keys.state(key);
        // No wake-up permit for a new head: it attempts before it first waits anyway, and a
        // stored permit would only make it attempt once more for nothing.
        state.waiters.push_back(Waiter {
            id,
            kind,
            owner: owner.clone(),
            grant: grant.clone(),
            lease_ms,
            watched,
            state: WaiterState::Parked,
            passed: false,
            refused: false,
            granted_at: now,
            pushed: None,
            claim: false,
            extra: extra.clone(),
            wake: wake.clone(),
        });
        let turn = turn_of(state, state.waiters.len() - 1, now);
        Some((id, wake, turn))
    }

    /// What waiter `id` should do now; marks the head as attempting when it should try Redis.
    pub(crate) fn turn(&self, key: &str, id: u64) -> Turn {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return Turn::Wait;
        };
        let Some(i) = state.waiters.iter().position(|w| w.id == id) else {
            return Turn::Wait;
        };
        turn_of(state, i, Instant::now())
    }

    /// The head's attempt failed (lock held elsewhere): park it so releases can hand off to it.
    ///
    /// `room`: the kind said another request might be granted now (a semaphore with permits
    /// free, but too few for this waiter; a read refused only because writers wait, which a
    /// writer behind it may be granted): the waiter lets the one behind it try, and so on. A
    /// waiter of a joint kind wakes the first one behind it that is not: those of joint kinds
    /// right behind it attempt together with it anyway.
    pub(crate) fn park(&self, key: &str, id: u64, room: bool) {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return;
        };
        let Some(i) = state.waiters.iter().position(|w| w.id == id) else {
            return;
        };
        let w = &mut state.waiters[i];
        if w.state == WaiterState::Attempting
            && let Some((token, since)) = w.pushed.take()
        {
            // another service's release granted it the lock while its attempt was on its way
            w.state = WaiterState::Parked;
            Self::grant_pushed(state, i, token, since);
            return;
        }
        if w.state == WaiterState::Attempting {
            w.state = WaiterState::Parked;
            w.passed = room;
            w.refused = true;
            if room {
                state.freed.set(Some(Instant::now()));
            }
            let joint = w.kind.joint;
            state.refused = true;
            let next = state
                .waiters
                .iter()
                .skip(i + 1)
                .find(|n| !(joint && n.kind.joint));
            if room && let Some(next) = next {
                next.wake.notify_one();
            }
        }
    }

    /// The head's attempt sent at `sent` was refused with nothing free (for a kind whose
    /// grants coexist and hand off): until `until`, a head waits for a hand-off or a wake-up
    /// instead of asking Redis (see [`KeyState::quiet`]).
    pub(crate) fn quiet(&self, key: &str, sent: Instant, until: Instant) {
        if let Some(state) = self.lock().get_mut(key)
            && !state.waiters.is_empty()
        {
            state.quiet = Some((sent, until));
        }
    }

    /// Notes that something may have freed a grant of `key` (see [`look_again`]) without
    /// waking anyone.
    pub(crate) fn may_be_free(&self, key: &str) {
        if let Some(state) = self.lock().get(key) {
            state.freed.set(Some(Instant::now()));
        }
    }

    /// Waiter `id` got the lock (by its own attempt sent at `sent`, or a hand-off): leave the
    /// line, register the hold unless a hand-off already did, and wake the next head. The
    /// second value says whether the service may still be registered as waiting while nobody
    /// of it waits any more: the line is empty now, and one of its waiters was refused since it
    /// was last empty (a kind whose grant does not deregister the service leaves then).
    pub(crate) fn leave_granted(
        &self,
        key: &LockKey,
        id: u64,
        sent: Instant,
    ) -> (Arc<HoldCell>, bool) {
        let mut keys = self.lock();
        let state = keys.state(key);
        let cell = Self::granted_hold(state, id, sent);
        let registered = state.waiters.is_empty() && std::mem::take(&mut state.refused);
        (cell, registered)
    }

    /// Removes waiter `id`, granted, from the line of `state` and returns its hold's cell.
    fn granted_hold(state: &mut KeyState, id: u64, sent: Instant) -> Arc<HoldCell> {
        match remove_waiter(state, id) {
            Some(w) => {
                if matches!(w.state, WaiterState::Granted(_)) {
                    // handed over: the hand-off registered its hold already, unless it is gone
                    if let Some(hold) = state.holds.iter().find(|h| h.grant == w.grant) {
                        return hold.cell.clone();
                    }
                } else {
                    // granted by its own attempt (sent at `sent`): the lock came to this
                    // service from Redis
                    state.turn_since = Some(sent);
                }
                add_hold(
                    &mut state.holds,
                    w.kind,
                    &w.owner,
                    &w.grant,
                    w.watched,
                    sent,
                    w.lease_ms,
                )
            }
            // not in line (cannot happen): a hold that is already lost
            None => {
                let cell = HoldCell::new(sent);
                cell.lost.cancel();
                cell
            }
        }
    }

    /// Waiter `id` gives up (timeout, error, cancellation). If a hand-off had already reached
    /// it, returns the grant to give back (its hold is already dropped). The second value says
    /// whether the line is empty now (the service waits no more).
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
                if let Some(i) = state.holds.iter().position(|h| h.grant == waiter.grant) {
                    state.holds.swap_remove(i).cell.lost.cancel();
                }
                Some(Orphan {
                    owner: waiter.owner,
                    grant: waiter.grant,
                })
            }
            _ => None,
        };
        let line_empty = state.waiters.is_empty();
        if line_empty {
            // the caller deregisters the service
            state.refused = false;
        }
        if state.is_idle() {
            keys.retire(key);
        }
        (orphan, line_empty)
    }

    /// Another service's release granted `key` to this service's waiter whose grant id is
    /// `grant`, with `token`, for a claim window of at most [`TURN_MS`] that started no earlier
    /// than `since`. The waiter holds it now (or once its attempt on the way is refused, which
    /// it will be: the lock is held under its grant id, or, if the attempt ran first, it finds
    /// out when it next asks); [`Delivery::Gone`] when no waiter nor hold of this service has
    /// that grant id and no release of it is on its way (the waiter left): the caller gives the
    /// grant back.
    pub(crate) fn pushed(&self, key: &str, grant: &str, token: u64, since: Instant) -> Delivery {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return Delivery::Gone;
        };
        let Some(i) = state.waiters.iter().position(|w| &*w.grant == grant) else {
            // its attempt found the grant first (a message can come after the reply), maybe
            // used it and is releasing it now; or this is a second copy of the message (a
            // subscriber that reconnected can hear one twice)
            let known = state.holds.iter().any(|h| &*h.grant == grant)
                || state.releasing.iter().any(|g| &**g == grant);
            return if known {
                Delivery::Delivered
            } else {
                Delivery::Gone
            };
        };
        let w = &mut state.waiters[i];
        w.claim = TURN_MS < w.lease_ms;
        match w.state {
            WaiterState::Parked => Self::grant_pushed(state, i, token, since),
            WaiterState::Attempting | WaiterState::Reserved => w.pushed = Some((token, since)),
            WaiterState::Granted(_) => {}
        }
        Delivery::Delivered
    }

    /// Gives waiter `i` of `state` the lock another service's release granted it.
    pub(super) fn grant_pushed(state: &mut KeyState, i: usize, token: u64, since: Instant) {
        let w = &state.waiters[i];
        let lease_ms = if w.claim {
            w.lease_ms.min(TURN_MS)
        } else {
            w.lease_ms
        };
        Self::grant_waiter(state, i, token, since, lease_ms);
        state.turn_since = Some(Instant::now());
    }

    /// Waiter `i` of `state` holds the lock with `token`, its lease of `lease_ms` running from
    /// `since`: its hold is registered and it is woken to take it.
    pub(super) fn grant_waiter(
        state: &mut KeyState,
        i: usize,
        token: u64,
        since: Instant,
        lease_ms: u64,
    ) {
        let w = &state.waiters[i];
        let (kind, owner, grant, watched) = (w.kind, w.owner.clone(), w.grant.clone(), w.watched);
        add_hold(
            &mut state.holds,
            kind,
            &owner,
            &grant,
            watched,
            since,
            lease_ms,
        );
        let w = &mut state.waiters[i];
        w.state = WaiterState::Granted(token);
        w.granted_at = since;
        w.wake.notify_one();
    }

    /// Wakes the head waiter of `key`.
    pub(crate) fn wake_head(&self, key: &str) {
        if let Some(state) = self.lock().get(key) {
            look_again(state);
        }
    }

    /// Notes that the next turn of `key` went to another service, while someone here waits
    /// for it. Returns whether the caller must start a timer (none runs for `key` yet) that
    /// calls [`turn_watch_fired`](Self::turn_watch_fired) once that turn can have run out.
    ///
    /// The turns that go elsewhere while the timer runs start no timer of their own: the head
    /// looks again once per turn length at most, not once per release of the other services
    /// (which under steady contention asked Redis in vain at every one of them). It does look
    /// that often: a service whose registration as waiting was lost (a failover that dropped
    /// the last writes) gets no message of its own until it registers again.
    pub(crate) fn watch_turn(&self, key: &str) -> bool {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key).filter(|s| !s.waiters.is_empty()) else {
            return false;
        };
        !std::mem::replace(&mut state.turn_watch.armed, true)
    }

    /// The turn timer of `key` fired: the turn it watched ran out or was claimed (and its hold
    /// is what the head now waits for). Wakes the head, which asks Redis.
    pub(crate) fn turn_watch_fired(&self, key: &str) {
        if let Some(state) = self.lock().get_mut(key) {
            state.turn_watch.armed = false;
            look_again(state);
        }
    }

    /// Wakes every head waiter (the subscriber reconnected and may have missed messages).
    pub(crate) fn wake_all_heads(&self) {
        for state in self.lock().values() {
            look_again(state);
        }
    }

    /// The keys someone in this process waits for.
    pub(crate) fn waited_keys(&self) -> Vec<LockKey> {
        self.lock()
            .iter()
            .filter(|(_, state)| !state.waiters.is_empty())
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// How many callers of this service wait in line for `key`.
    pub(crate) fn waiter_count(&self, key: &str) -> usize {
        self.lock().get(key).map_or(0, |s| s.waiters.len())
    }

    /// Every lock key with callers of this service waiting for it, and how many (not a caller
    /// whose first attempt is under way: an uncontended acquire waits for nobody).
    pub(crate) fn waiting_lines(&self) -> Vec<(LockKey, usize)> {
        self.lock()
            .iter()
            .filter_map(|(key, s)| {
                let n = waiting(s);
                (n > 0).then(|| (key.clone(), n))
            })
            .collect()
    }

    /// [`waiting_lines`](Self::waiting_lines) of one lock key.
    pub(crate) fn waiting_for(&self, key: &str) -> usize {
        self.lock().get(key).map_or(0, waiting)
    }

    /// How many callers of this service wait in line for a hold of `kind` of `key`.
    pub(crate) fn waiters_of(&self, key: &str, kind: &Kind) -> usize {
        self.lock()
            .get(key)
            .map_or(0, |s| s.waiters.iter().filter(|w| w.kind == kind).count())
    }

    /// Whether anyone in this process waits for `key`.
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        self.lock().get(key).is_some_and(|s| !s.waiters.is_empty())
    }
}

/// What the waiter at `i` of `state`'s line should do `now`; marks the head as attempting when it
/// should try Redis (see [`Local::turn`]).
fn turn_of(state: &mut KeyState, i: usize, now: Instant) -> Turn {
    let w = &state.waiters[i];
    if let WaiterState::Granted(token) = w.state {
        // A grant another service pushed (its message may come late) must leave its holder
        // time to claim it; one that is about to run out, or ran out, is dropped, and the
        // waiter asks Redis, which confirms it if it is still there.
        let needed = if w.claim {
            Duration::from_millis(TURN_MS / 3)
        } else {
            Duration::ZERO
        };
        let hold = state.holds.iter().position(|h| h.grant == w.grant);
        if hold.is_some_and(|h| state.holds[h].live(now + needed)) {
            return Turn::Granted {
                token,
                since: w.granted_at,
                claim: w.claim,
            };
        }
        if let Some(h) = hold {
            state.holds.swap_remove(h).cell.lost.cancel();
        }
        let w = &mut state.waiters[i];
        w.state = WaiterState::Parked;
        w.claim = false;
    }
    let w = &state.waiters[i];
    // The head looks; so does a waiter of a joint kind with only such waiters ahead of it
    // (readers take their shares together, not one round trip after another).
    // For grants that coexist and hand off, the waiters a release is serving already are
    // not in the way: the first one not served looks.
    let front = i == 0
        || (w.kind.joint && state.waiters.iter().take(i).all(|a| a.kind.joint))
        || state
            .waiters
            .iter()
            .take(i)
            .all(|a| a.passed || (w.kind.shared && w.kind.hand_off && a.state.is_served()));
    if !front {
        return Turn::Wait;
    }
    match w.state {
        WaiterState::Parked => {
            let behind = state
                .holds
                .iter()
                .filter(|h| h.live(now) && h.blocks(&w.owner, w.kind.shared))
                .map(|h| h.cell.valid_until())
                .max();
            let quiet = state.quiet.filter(|(sent, until)| {
                w.kind.shared
                    && w.kind.hand_off
                    && now < *until
                    && state.freed.get().is_none_or(|freed| freed < *sent)
            });
            match behind.or(quiet.map(|(_, until)| until)) {
                Some(until) => Turn::Behind { until },
                None => {
                    state.waiters[i].state = WaiterState::Attempting;
                    state.waiters[i].passed = false;
                    Turn::Attempt
                }
            }
        }
        WaiterState::Attempting => Turn::Attempt,
        WaiterState::Reserved | WaiterState::Granted(_) => Turn::Wait,
    }
}

/// Removes waiter `id`; when it was the head, wakes the new head.
fn remove_waiter(state: &mut KeyState, id: u64) -> Option<Waiter> {
    let i = state.waiters.iter().position(|w| w.id == id)?;
    let waiter = state.waiters.remove(i)?;
    if state.waiters.is_empty() {
        // the service stops waiting (it deregisters, and may unsubscribe)
        state.quiet = None;
    } else if i == 0 {
        wake_front(state);
    }
    Some(waiter)
}

/// The callers of a line that wait for another holder (see [`Local::waiting_lines`]): parked
/// (behind another caller or a hold, or refused) or being handed the lock, and any caller
/// refused before; not one whose first attempt is under way, nor one already granted.
fn waiting(s: &KeyState) -> usize {
    s.waiters
        .iter()
        .filter(|w| w.refused || matches!(w.state, WaiterState::Parked | WaiterState::Reserved))
        .count()
}
