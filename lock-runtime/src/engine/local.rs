//! The in-process side of the locks of one service: which owners hold which keys here, and the
//! line of waiters per key.
//!
//! Waiters for one key line up in arrival order and only the head of the line talks to Redis, so
//! a release wakes one waiter, not all of them, and a task that releases and locks again queues
//! behind the waiters already in line. When a holder releases while the head is parked, the
//! release script can hand the lock straight to the head (one round trip); see `release.lua`.
//! The waiters' steps (joining the line, taking turns, parking, leaving) are in `line.rs`, the
//! release's (reserving a waiter for a hand-off, delivering it) in `handoff.rs`.
//!
//! Everything here is synchronous and runs under one short mutex; the Redis calls happen between
//! the `begin_*` and `end_*` steps.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use tokio::sync::Notify;

use super::holds::{Hold, HoldCell, add_hold, valid_until};
use super::ids::{GrantId, KeyMap, LockKey, OwnerField};
use super::kind::Kind;
use crate::owner::Site;
use crate::vocab::LossReason;

#[derive(Default)]
pub(crate) struct Local {
    keys: Mutex<Keys>,
    pub(super) next_waiter: AtomicU64,
}

#[derive(Default)]
pub(super) struct KeyState {
    pub(super) holds: Vec<Hold>,
    pub(super) waiters: VecDeque<Waiter>,
    /// The next turn went to another service (see [`Local::watch_turn`]).
    pub(super) turn_watch: TurnWatch,
    /// A waiter of the line was refused since the line was last empty: the service may be
    /// registered as waiting on Redis (see [`Local::leave_granted`]).
    pub(super) refused: bool,
    /// The grants of this key whose release (or give-back) is on its way to Redis: a message
    /// pushing one of them that comes now (late, or a second copy) names a grant that is
    /// being ended, not one to give back (see [`Local::pushed`]).
    pub(super) releasing: Vec<GrantId>,
    /// When the lock came to this service from Redis (an attempt's grant, a grant another
    /// service's release pushed), kept while it passes from waiter to waiter here: while less
    /// than [`TURN_SLICE`] ago, a release hands it to the next waiter here even when other
    /// services wait (see [`Reservation::in_turn`](super::handoff::Reservation::in_turn)).
    pub(super) turn_since: Option<Instant>,
    /// For a kind whose grants coexist and hand off (the semaphore): the head's last attempt,
    /// sent at the first instant, was refused with nothing free, and the service stays
    /// registered as waiting past the second. Until then, and unless something may have
    /// freed a grant since that attempt was sent ([`KeyState::freed`]), a new head need not ask
    /// Redis: a release of this service hands its grant over, and one of another service
    /// publishes a wake-up.
    pub(super) quiet: Option<(Instant, Instant)>,
    /// When something last may have freed a grant of the key (see [`look_again`]).
    pub(super) freed: std::cell::Cell<Option<Instant>>,
}

/// How long a service may pass a lock among its own waiters while other services wait for it,
/// counted from when it got the lock from Redis; then its next release gives the lock to the
/// next service. A turn of a few hand-offs inside a service costs a fraction of one between
/// services, and the other services wait at most a slice (and the section running when it
/// ends) per service ahead of them.
pub(crate) const TURN_SLICE: std::time::Duration = std::time::Duration::from_millis(5);

/// Whether a timer already watches for a turn of another service running out, and when a
/// wake-up last found the head reserved for a hand-off.
#[derive(Default)]
pub(super) struct TurnWatch {
    pub(super) armed: bool,
    /// When a wake-up (a message giving this service the turn, a turn timer, a reconnection)
    /// last reached the head while a release had it reserved, so that it could not act on it:
    /// a release that yielded decides by this whether to wake the head (see
    /// [`ReleaseEnd::Yielded`](super::handoff::ReleaseEnd::Yielded)).
    pub(super) missed: std::cell::Cell<Option<Instant>>,
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) kind: &'static Kind,
    pub(super) owner: OwnerField,
    /// The grant id of every attempt of this waiter and of a hand-off to it.
    pub(super) grant: GrantId,
    pub(super) lease_ms: u64,
    pub(super) watched: bool,
    pub(super) state: WaiterState,
    /// Its last attempt failed but the kind said a smaller request might fit: the waiters
    /// behind it may try too (see [`Local::park`]).
    pub(super) passed: bool,
    /// An attempt of it was refused: it waits for another holder (what a waiting report
    /// counts, with the waiters behind it).
    pub(super) refused: bool,
    /// When the release that handed the lock over was sent: the lease runs from at most then.
    pub(super) granted_at: Instant,
    /// Another service's release granted it the lock (token, the earliest the grant's claim
    /// window can have started) while its own attempt was on its way: delivered when that
    /// attempt is refused (see [`Local::pushed`]).
    pub(super) pushed: Option<(u64, Instant)>,
    /// It holds the lock by such a grant, for a claim window shorter than its lease: it must
    /// claim the lease (see `push`).
    pub(super) claim: bool,
    /// The kind's extra argument of its attempts (a hand-off to it carries it too).
    pub(super) extra: Arc<str>,
    pub(super) wake: Arc<Notify>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum WaiterState {
    /// Waiting to be woken; a release may reserve it for a hand-off.
    Parked,
    /// Its own acquire attempt is in flight.
    Attempting,
    /// A release is handing the lock to it.
    Reserved,
    /// The lock was handed to it with this token; its hold is registered.
    Granted(u64),
}

impl WaiterState {
    /// A release is handing it the lock, or did.
    pub(super) fn is_served(self) -> bool {
        matches!(self, WaiterState::Reserved | WaiterState::Granted(_))
    }
}

/// A hold the service's shutdown ended: the grant to release on Redis.
pub(crate) struct Ended {
    pub(crate) kind: &'static Kind,
    pub(crate) key: LockKey,
    pub(crate) owner: OwnerField,
    pub(crate) grant: GrantId,
}

/// What the watchdog has to renew.
pub(crate) struct Renewal {
    pub(crate) kind: &'static Kind,
    pub(crate) key: LockKey,
    pub(crate) owner: OwnerField,
    pub(crate) grant: GrantId,
    /// The hold's cell (events and metrics of the renewal).
    pub(crate) cell: Arc<HoldCell>,
}

impl Local {
    pub(super) fn lock(&self) -> MutexGuard<'_, Keys> {
        // A panic while holding this mutex cannot leave the maps inconsistent in a way that
        // matters more than refusing all further lock operations would.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The grant under which `owner` holds `key` in this process, in the mode asked for
    /// (shared or not), and that is still valid, so a new lock call re-enters it.
    pub(crate) fn holding(&self, key: &str, owner: &str, shared: bool) -> Option<GrantId> {
        let keys = self.lock();
        // (the clock is read only when there is a hold to look at)
        let holds = &keys.get(key)?.holds;
        let now = Instant::now();
        holds
            .iter()
            .find(|h| &*h.owner == owner && h.kind.shared == shared && h.live(now))
            .map(|h| h.grant.clone())
    }

    /// Whether the grant `grant` of `key` is held here and still valid.
    pub(crate) fn holds_live(&self, key: &str, grant: &str) -> bool {
        let keys = self.lock();
        let now = Instant::now();
        keys.get(key)
            .is_some_and(|s| s.holds.iter().any(|h| &*h.grant == grant && h.live(now)))
    }

    /// Registers a new hold of `kind` that `owner` was granted without waiting in line (sent
    /// at `sent` with `lease_ms`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_new_hold(
        &self,
        key: &LockKey,
        kind: &'static Kind,
        owner: &OwnerField,
        grant: &GrantId,
        watched: bool,
        sent: Instant,
        lease_ms: u64,
    ) -> Arc<HoldCell> {
        let mut keys = self.lock();
        let state = keys.state(key);
        add_hold(
            &mut state.holds,
            kind,
            owner,
            grant,
            watched,
            sent,
            lease_ms,
        )
    }

    /// Whether `owner` has a valid hold of any kind on `key` in this process (no allocation:
    /// asked on every re-entrant acquire).
    pub(crate) fn holds_any(&self, key: &str, owner: &str) -> bool {
        let keys = self.lock();
        keys.get(key).is_some_and(|state| {
            let now = Instant::now();
            state
                .holds
                .iter()
                .any(|h| &*h.owner == owner && h.live(now))
        })
    }

    /// The kinds of the valid holds `owner` has on `key` in this process.
    pub(crate) fn held_kinds(&self, key: &str, owner: &str) -> Vec<&'static Kind> {
        let keys = self.lock();
        let now = Instant::now();
        keys.get(key).map_or_else(Vec::new, |state| {
            state
                .holds
                .iter()
                .filter(|h| &*h.owner == owner && h.live(now))
                .map(|h| h.kind)
                .collect()
        })
    }

    /// Notes that a guard of the grant `grant` of `key` was returned to a plain lock call made
    /// at `site`, for as long as `site` lives.
    pub(crate) fn add_site(&self, key: &str, grant: &str, site: Weak<Site>) {
        let mut keys = self.lock();
        let Some(hold) = keys
            .get_mut(key)
            .and_then(|state| state.holds.iter_mut().find(|h| &*h.grant == grant))
        else {
            return;
        };
        hold.sites.retain(|s| s.strong_count() > 0);
        hold.sites.push(site);
    }

    /// Whether a valid hold of `key` that keeps `owner` (asking for a hold that is `shared`
    /// or not) from getting it is watched (renewed for as long as a guard without a lease
    /// lives) and has a guard that a plain lock call made at `site` holds: waiting for it there
    /// would wait for itself. A hold with fixed leases only ends by itself.
    pub(crate) fn held_at(&self, key: &str, owner: &OwnerField, shared: bool, site: &Site) -> bool {
        let keys = self.lock();
        keys.get(key).is_some_and(|state| {
            let now = Instant::now();
            state.holds.iter().any(|h| {
                h.live(now)
                    && h.watched > 0
                    && h.blocks(owner, shared)
                    && h.sites
                        .iter()
                        .any(|s| s.upgrade().is_some_and(|s| *s == *site))
            })
        })
    }

    /// Adds a guard to the grant `grant` of `key` after Redis confirmed it (sent at `sent`,
    /// with `lease_ms`); `None` when that grant stopped being valid meanwhile.
    pub(crate) fn add_guard(
        &self,
        key: &str,
        grant: &str,
        watched: bool,
        sent: Instant,
        lease_ms: u64,
    ) -> Option<Arc<HoldCell>> {
        let mut keys = self.lock();
        let hold = keys
            .get_mut(key)?
            .holds
            .iter_mut()
            .find(|h| &*h.grant == grant)?;
        if !hold.live(Instant::now()) {
            return None;
        }
        hold.guards += 1;
        hold.watched += u32::from(watched);
        hold.cell.extend_to(valid_until(sent, lease_ms));
        Some(hold.cell.clone())
    }

    /// The grant `grant` of `key` is gone on Redis (a re-entry or renewal found it so): its
    /// guards are lost, and new lock calls no longer re-enter it.
    pub(crate) fn drop_grant(&self, key: &str, grant: &str) {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return;
        };
        if let Some(i) = state.holds.iter().position(|h| &*h.grant == grant) {
            let hold = state.holds.swap_remove(i);
            hold.cell.report_lost(LossReason::FoundGone);
            hold.cell.lost.cancel();
        }
        look_again(state);
        if state.is_idle() {
            keys.retire(key);
        }
    }

    /// Marks every hold of `key` in this process lost (it was force-unlocked).
    pub(crate) fn mark_lost(&self, key: &str) {
        let mut keys = self.lock();
        if let Some(state) = keys.get_mut(key) {
            for hold in state.holds.drain(..) {
                hold.cell.report_lost(LossReason::ForceUnlocked);
                hold.cell.lost.cancel();
            }
            look_again(state);
            if state.is_idle() {
                keys.retire(key);
            }
        }
    }

    /// Ends every hold of this process for the service's shutdown and wakes every waiter;
    /// returns the grants to release on Redis. The holds' guards are no longer valid (their
    /// `lost()` says the service shut down) and their release touches nothing.
    pub(crate) fn shut_down(&self) -> Vec<Ended> {
        let mut keys = self.lock();
        let mut ended = Vec::new();
        for (key, state) in keys.iter_mut() {
            for hold in state.holds.drain(..) {
                hold.cell.end_by_shutdown();
                ended.push(Ended {
                    kind: hold.kind,
                    key: key.clone(),
                    owner: hold.owner,
                    grant: hold.grant,
                });
            }
            for waiter in &state.waiters {
                waiter.wake.notify_one();
            }
        }
        keys.retain(|_, state| !state.is_idle());
        ended
    }

    /// How many guards the grants `grants` (space-separated ids, as on Redis) of `key` have in
    /// this process, if one of them is held here.
    pub(crate) fn guards_of(&self, key: &str, grants: &str) -> Option<u32> {
        let keys = self.lock();
        let state = keys.get(key)?;
        grants.split_whitespace().find_map(|g| {
            state
                .holds
                .iter()
                .find(|h| &*h.grant == g)
                .map(|h| h.guards)
        })
    }

    /// The holds the watchdog must renew now (valid ones with a guard without a lease).
    pub(crate) fn renewals(&self) -> Vec<Renewal> {
        let keys = self.lock();
        let now = Instant::now();
        let mut out = Vec::new();
        for (key, state) in keys.iter() {
            for hold in state.holds.iter().filter(|h| h.watched > 0 && h.live(now)) {
                out.push(Renewal {
                    kind: hold.kind,
                    key: key.clone(),
                    owner: hold.owner.clone(),
                    grant: hold.grant.clone(),
                    cell: hold.cell.clone(),
                });
            }
        }
        out
    }

    /// Reports the loss of the holds whose validity deadline passed while their guards still
    /// hold them (nobody awaits their `lost()`, nobody released them yet).
    pub(crate) fn report_expired(&self) {
        let keys = self.lock();
        let now = Instant::now();
        for hold in keys.values().flat_map(|state| &state.holds) {
            if hold.guards > 0 && !hold.live(now) {
                hold.cell.report_lost(LossReason::LeaseRanOut);
            }
        }
    }

    /// Records the outcome of renewing the grant `grant` of `key`, sent at `sent` with
    /// `lease_ms`: a renewed hold is valid for longer; one found gone is lost.
    pub(crate) fn renewed(&self, key: &str, grant: &str, sent: Instant, lease_ms: u64, held: bool) {
        if !held {
            self.drop_grant(key, grant);
            return;
        }
        let keys = self.lock();
        if let Some(hold) = keys
            .get(key)
            .and_then(|s| s.holds.iter().find(|h| &*h.grant == grant))
            && hold.live(Instant::now())
        {
            hold.cell.extend_to(valid_until(sent, lease_ms));
        }
    }
}

impl KeyState {
    pub(super) fn is_idle(&self) -> bool {
        self.holds.is_empty() && self.waiters.is_empty() && self.releasing.is_empty()
    }

    /// A state like a new one that keeps the room its lists had.
    fn emptied(mut self) -> KeyState {
        self.holds.clear();
        self.waiters.clear();
        self.releasing.clear();
        KeyState {
            holds: self.holds,
            waiters: self.waiters,
            releasing: self.releasing,
            ..KeyState::default()
        }
    }
}

/// How many emptied key states [`Keys`] keeps for reuse.
const SPARE_STATES: usize = 64;
/// The most room a kept state's lists may have, in entries each: a state whose line once grew
/// long is dropped, not kept with that room.
const SPARE_ROOM: usize = 16;

/// The states by lock key, and a few emptied ones kept for reuse: a key that goes idle after
/// each hold (the common case) would otherwise allocate its line and lists again on its next
/// lock call.
#[derive(Default)]
pub(super) struct Keys {
    map: KeyMap<KeyState>,
    spare: Vec<KeyState>,
}

impl Keys {
    /// The state of `key`, made (or reused) when it has none.
    pub(super) fn state(&mut self, key: &LockKey) -> &mut KeyState {
        let Keys { map, spare } = self;
        map.entry(key.clone())
            .or_insert_with(|| spare.pop().unwrap_or_default())
    }

    /// Forgets the state of `key` (an idle one), keeping it for reuse when its lists are short.
    pub(super) fn retire(&mut self, key: &str) {
        if let Some(state) = self.map.remove(key)
            && self.spare.len() < SPARE_STATES
            && state.holds.capacity() <= SPARE_ROOM
            && state.waiters.capacity() <= SPARE_ROOM
            && state.releasing.capacity() <= SPARE_ROOM
        {
            self.spare.push(state.emptied());
        }
    }
}

impl std::ops::Deref for Keys {
    type Target = KeyMap<KeyState>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl std::ops::DerefMut for Keys {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

/// Something may have freed a grant of the key (a release of this service that handed
/// nothing over, a wake-up message, a grant found gone): a quiet line's head asks Redis again
/// (see [`KeyState::quiet`]). Wakes the front of the line.
pub(super) fn look_again(state: &KeyState) {
    // (only a line, or a quiet one's head to come, asks when something was freed: a waiter
    // that joins later attempts after this anyway)
    if !state.waiters.is_empty() || state.quiet.is_some() {
        state.freed.set(Some(Instant::now()));
    }
    wake_front(state);
}

/// Wakes the head waiter, and when it is of a joint kind, the waiters of joint kinds right
/// behind it (see [`Local::turn`]).
pub(super) fn wake_front(state: &KeyState) {
    let mut front = state.waiters.iter();
    if let Some(head) = front.next() {
        if head.state == WaiterState::Reserved {
            state.turn_watch.missed.set(Some(Instant::now()));
        }
        head.wake.notify_one();
        if head.kind.joint {
            for w in front.take_while(|w| w.kind.joint) {
                w.wake.notify_one();
            }
        } else if head.kind.shared && head.kind.hand_off && head.state.is_served() {
            // the first waiter not served is the one that looks (see `Local::turn`)
            if let Some(w) = front.find(|w| !w.state.is_served()) {
                w.wake.notify_one();
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::LazyLock;
    use std::time::Duration;

    use super::super::handoff::{ReleaseEnd, ReleasePlan};
    use super::super::ids::new_grant_id;
    use super::super::line::{Delivery, Turn};
    use super::*;

    static NO_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new("return 0"));
    /// An exclusive, re-entrant kind that hands off (the engine's tests use it too).
    pub(in crate::engine) static TEST_KIND: Kind = Kind {
        id: 0,
        noun: "lock",
        mode: crate::vocab::HoldMode::Exclusive,
        busy: "held",
        lua_first: "",
        lua: &[],
        renew: &NO_SCRIPT,
        shared: false,
        joint: false,
        reentrant: true,
        leave: None,
        hand_off: true,
        leaves_on_grant: true,
        fourth_key: None,
        extra_arg: false,
    };

    /// A shared kind whose waiters attempt together (readers).
    static JOINT_KIND: Kind = Kind {
        id: 1,
        noun: "read lock",
        mode: crate::vocab::HoldMode::Read,
        busy: "held",
        lua_first: "",
        lua: &[],
        renew: &NO_SCRIPT,
        shared: true,
        joint: true,
        reentrant: true,
        leave: None,
        hand_off: false,
        leaves_on_grant: false,
        fourth_key: None,
        extra_arg: false,
    };

    fn key() -> LockKey {
        "lock:{k}".into()
    }

    fn hold(local: &Local, k: &LockKey, owner: &OwnerField, watched: bool) -> GrantId {
        let grant = new_grant_id();
        let mut keys = local.lock();
        let state = keys.state(k);
        add_hold(
            &mut state.holds,
            &TEST_KIND,
            owner,
            &grant,
            watched,
            Instant::now(),
            60_000,
        );
        grant
    }

    /// Puts a waiter in `local`'s line of `key` (no extra argument, a 100 ms lease): its id and
    /// what wakes it.
    fn join(
        local: &Local,
        key: &LockKey,
        kind: &'static Kind,
        owner: &OwnerField,
        grant: &GrantId,
        watched: bool,
    ) -> (u64, Arc<tokio::sync::Notify>) {
        let now = Instant::now();
        let joined = local.enqueue(
            key,
            kind,
            owner,
            grant,
            &"".into(),
            100,
            watched,
            false,
            now,
        );
        let (id, wake, _) = joined.expect("joined");
        (id, wake)
    }

    #[test]
    fn line_order_and_hand_off() {
        let local = Local::default();
        let (k, a, b) = (key(), OwnerField::from("i:a"), OwnerField::from("i:b"));
        let ga = hold(&local, &k, &a, true);
        let (w1, _) = join(&local, &k, &TEST_KIND, &b, &new_grant_id(), false);
        let (w2, _) = join(
            &local,
            &k,
            &TEST_KIND,
            &"i:c".into(),
            &new_grant_id(),
            false,
        );
        assert_eq!(local.turn(&k, w2), Turn::Wait);
        // behind a live hold of this service the head does not ask Redis
        assert!(matches!(local.turn(&k, w1), Turn::Behind { .. }));
        local.mark_lost(&k);
        assert_eq!(local.turn(&k, w1), Turn::Attempt);
        assert!(
            matches!(
                local.begin_release(&k, &ga, Some(true), true),
                ReleasePlan::NotHeld
            ),
            "a force-unlocked grant's guard is not held"
        );
        local.park(&k, w1, false);
        let ga = hold(&local, &k, &a, false);
        let ReleasePlan::Redis(Some(r)) = local.begin_release(&k, &ga, Some(false), true) else {
            panic!("parked head is reserved");
        };
        assert_eq!((r.waiter, &*r.owner), (w1, "i:b"));
        assert_eq!(local.turn(&k, w1), Turn::Wait);
        assert!(
            local
                .end_release(&k, &ga, Some(r), ReleaseEnd::HandedOff(7))
                .is_none()
        );
        assert!(matches!(local.turn(&k, w1), Turn::Granted { token: 7, .. }));
        assert!(local.holding(&k, "i:b", false).is_some());
        let (_, registered) = local.leave_granted(&k, w1, Instant::now());
        assert!(!registered, "w2 still waits");
        assert!(matches!(local.turn(&k, w2), Turn::Behind { .. }));
        assert_eq!(
            local.renewals().len(),
            0,
            "b holds with a lease: nothing to renew"
        );
    }

    /// Readers at the front attempt together; when they are all refused with room (kept out
    /// only by writers waiting elsewhere), the writer behind them attempts too.
    #[test]
    fn readers_refused_with_room_let_the_writer_behind_them_try() {
        let local = Local::default();
        let k = key();
        let mut line = Vec::new();
        for (kind, owner) in [
            (&JOINT_KIND, "i:r1"),
            (&JOINT_KIND, "i:r2"),
            (&TEST_KIND, "i:w"),
        ] {
            line.push(join(
                &local,
                &k,
                kind,
                &owner.into(),
                &new_grant_id(),
                false,
            ));
        }
        let [(r1, _), (r2, r2_wake), (w, w_wake)] = &line[..] else {
            unreachable!()
        };
        assert_eq!(local.turn(&k, *r1), Turn::Attempt);
        assert_eq!(local.turn(&k, *r2), Turn::Attempt);
        assert_eq!(local.turn(&k, *w), Turn::Wait);
        // refused without room: nobody behind is woken
        local.park(&k, *r1, false);
        assert_eq!(local.turn(&k, *w), Turn::Wait);
        assert_eq!(local.turn(&k, *r1), Turn::Attempt);
        // r1 passes while r2 is still attempting: the writer is woken but must wait for r2
        local.park(&k, *r1, true);
        let woken = |n: &Arc<Notify>| {
            let notified = std::pin::pin!(n.notified());
            notified.enable()
        };
        assert!(
            woken(w_wake),
            "the writer is woken, not the reader beside r1"
        );
        assert!(!woken(r2_wake));
        assert_eq!(local.turn(&k, *w), Turn::Wait);
        local.park(&k, *r2, true);
        assert!(woken(w_wake));
        assert_eq!(local.turn(&k, *w), Turn::Attempt);
        // a head that tries again no longer lets anyone pass until it is refused with room
        assert_eq!(local.turn(&k, *r1), Turn::Attempt);
        local.park(&k, *w, false);
        assert_eq!(local.turn(&k, *w), Turn::Wait);
    }

    #[test]
    fn inner_guards_release_locally_and_generations_never_merge() {
        let local = Local::default();
        let (k, a) = (key(), OwnerField::from("i:a"));
        let g1 = hold(&local, &k, &a, false);
        assert_eq!(local.holding(&k, &a, false).as_deref(), Some(&*g1));
        let cell = local
            .add_guard(&k, &g1, false, Instant::now(), 60_000)
            .unwrap();
        assert!(matches!(
            local.begin_release(&k, &g1, Some(false), true),
            ReleasePlan::Local
        ));
        // the grant is found gone: its guards are lost and the next call gets a new grant
        local.drop_grant(&k, &g1);
        assert!(!cell.is_live(Instant::now()));
        assert!(local.holding(&k, &a, false).is_none());
        let g2 = hold(&local, &k, &a, false);
        assert_ne!(g1, g2);
        assert!(
            matches!(
                local.begin_release(&k, &g1, Some(false), true),
                ReleasePlan::NotHeld
            ),
            "a stale guard never releases the new grant"
        );
        assert!(matches!(
            local.begin_release(&k, &g2, Some(false), true),
            ReleasePlan::Redis(None)
        ));
    }

    #[test]
    fn a_retired_key_state_comes_back_as_new() {
        let mut keys = Keys::default();
        let (k, other) = (key(), LockKey::from("lock:{other}"));
        let state = keys.state(&k);
        state.refused = true;
        state.turn_since = Some(Instant::now());
        state.releasing.push(new_grant_id());
        state.releasing.clear();
        keys.retire(&k);
        assert!(keys.get(&k).is_none());
        assert_eq!(keys.spare.len(), 1);
        let reused = keys.state(&other);
        assert!(!reused.refused && reused.turn_since.is_none() && reused.is_idle());
        assert!(reused.releasing.capacity() > 0, "its room was kept");
        assert!(keys.spare.is_empty());
        // one whose line grew long is not kept
        let state = keys.state(&k);
        state.waiters.reserve(SPARE_ROOM + 1);
        keys.retire(&k);
        assert!(keys.spare.is_empty());
    }

    #[test]
    fn a_hold_past_its_deadline_is_not_re_entered() {
        let local = Local::default();
        let (k, a) = (key(), OwnerField::from("i:a"));
        let grant = new_grant_id();
        {
            let mut keys = local.lock();
            let state = keys.state(&k);
            let sent = Instant::now() - Duration::from_millis(500);
            add_hold(&mut state.holds, &TEST_KIND, &a, &grant, false, sent, 300);
        }
        assert!(local.holding(&k, &a, false).is_none());
        assert!(
            local
                .add_guard(&k, &grant, false, Instant::now(), 300)
                .is_none()
        );
        assert!(matches!(
            local.begin_release(&k, &grant, Some(false), true),
            ReleasePlan::NotHeld
        ));
    }

    #[test]
    fn cancelled_waiters_give_back_hand_offs() {
        let local = Local::default();
        let (k, a, b) = (key(), OwnerField::from("i:a"), OwnerField::from("i:b"));
        let ga = hold(&local, &k, &a, false);
        let gb = new_grant_id();
        let (w1, _) = join(&local, &k, &TEST_KIND, &b, &gb, true);
        let ReleasePlan::Redis(Some(r)) = local.begin_release(&k, &ga, Some(false), true) else {
            panic!("reserved");
        };
        // the waiter is cancelled while the hand-off is in flight
        assert!(local.leave(&k, w1).0.is_none());
        let orphan = local
            .end_release(&k, &ga, Some(r.clone()), ReleaseEnd::HandedOff(3))
            .unwrap();
        assert_eq!((&*orphan.owner, &*orphan.grant), ("i:b", &*gb));
        // an unknown outcome is given back too
        assert!(
            local
                .end_release(&k, &ga, Some(r), ReleaseEnd::Unknown)
                .is_some()
        );
        // cancelled after the hand-off reached it
        let ga = hold(&local, &k, &a, false);
        let (w2, _) = join(&local, &k, &TEST_KIND, &b, &gb, true);
        let ReleasePlan::Redis(Some(r)) = local.begin_release(&k, &ga, Some(false), true) else {
            panic!("reserved");
        };
        local.end_release(&k, &ga, Some(r), ReleaseEnd::HandedOff(4));
        assert_eq!(local.renewals().len(), 1);
        assert_eq!(&*local.leave(&k, w2).0.unwrap().grant, &*gb);
        assert!(local.renewals().is_empty());
        assert!(local.lock().is_empty(), "idle keys are forgotten");
    }

    /// A message pushing a grant whose release is on its way (late, or a second copy) is no
    /// grant to give back; once the release answered, one is (releasing it again changes
    /// nothing on Redis), and the key is forgotten.
    #[test]
    fn a_push_of_a_grant_being_released_is_not_gone() {
        let local = Local::default();
        let (k, a) = (key(), OwnerField::from("i:a"));
        let ga = hold(&local, &k, &a, false);
        assert!(matches!(
            local.begin_release(&k, &ga, Some(false), true),
            ReleasePlan::Redis(None)
        ));
        let since = Instant::now();
        assert_eq!(local.pushed(&k, &ga, 5, since), Delivery::Delivered);
        assert!(
            local.lock().contains_key(&k),
            "kept while the release is on its way"
        );
        assert!(
            local
                .end_release(&k, &ga, None, ReleaseEnd::Freed)
                .is_none()
        );
        assert!(local.lock().is_empty(), "idle keys are forgotten");
        assert_eq!(local.pushed(&k, &ga, 5, since), Delivery::Gone);
    }
}
