//! What the engine needs to know about a lock kind, and nothing more: the kind's scripts and
//! how its holds combine. Each kind (`crate::kinds`) describes itself with one static [`Kind`];
//! the engine's waiting, hand-off, renewal, batching and give-back work the same for all.

use std::sync::LazyLock;

use redis::Script;

/// How many kinds there can be: [`Kind::id`] indexes per-service tables of this size.
pub(crate) const MAX_KINDS: usize = 8;

/// A lock kind as the engine sees it.
///
/// The kind's Lua (see `scripts/ops.lua` for the contract) defines two functions,
/// `acquire(lock, fence, queue, fourth, owner, grant_id, lease, horizon, extra)` and
/// `release(lock, fence, queue, fourth, owner, grant_id, next_owner, next_id, next_lease)`,
/// with the replies `ops.lua` documents (`fourth` is `nil` for a kind without
/// [`fourth_key`](Kind::fourth_key)); `renew` renews or extends holds by grant id.
#[derive(Debug)]
pub(crate) struct Kind {
    /// Unique among kinds, below [`MAX_KINDS`].
    pub(crate) id: usize,
    /// How logs and errors call a hold of this kind ("lock", "read lock", ...).
    pub(crate) noun: &'static str,
    /// What a hold of this kind holds (events, metrics, introspection).
    pub(crate) mode: crate::vocab::HoldMode,
    /// Why an acquire of this kind waits ("it is held by another owner"), for timeout errors.
    pub(crate) busy: &'static str,
    /// Lua source run first in the kind's operations script, after the clock (`clock.lua`)
    /// and before anything else is defined: the kind's most common operations done at once
    /// (the mutex's `fast.lua`), or "". It defines `fast_op(keys, k, argv, a)`, which
    /// `ops.lua` runs first for each operation (`nil`: go on to `acquire` / `release`).
    pub(crate) lua_first: &'static str,
    /// Lua source defining the kind's `acquire` and `release` functions (after the shared
    /// prelude, before `ops.lua`).
    pub(crate) lua: &'static [&'static str],
    /// Renews (or sets the lease of) holds by grant id; see `kinds/mutex/renew.lua`.
    pub(crate) renew: &'static LazyLock<Script>,
    /// Holds of this kind by different owners can be in force together (readers, permits).
    /// A waiter waits behind a hold of another owner in this process unless both are shared.
    pub(crate) shared: bool,
    /// Waiters at the front of a line attempt together while they all are of a joint kind
    /// (readers take their shares at once); otherwise only the head attempts.
    pub(crate) joint: bool,
    /// A lock call of an owner that holds the key in this mode re-enters that hold.
    pub(crate) reentrant: bool,
    /// Runs when the last waiter of this kind in a service's line gives up without the lock
    /// (its wait ran out, it failed, its future was dropped), before the service's waiting
    /// registration is dropped: KEYS turn marker, waiting services; ARGV service id, wake-up
    /// channel, publish command. For kinds that register their waiters beyond the waiting
    /// services (the writers waiting of a read-write lock).
    pub(crate) leave: Option<&'static LazyLock<Script>>,
    /// The release script can grant the lock to the next waiter of this service in the same
    /// call (its `next_*` arguments). With [`shared`](Kind::shared), any release may hand over
    /// (not only the last hold of this service), the lease argument carries the waiter's extra
    /// (see `scripts/ops.lua`), and a line refused with nothing free waits for a hand-off or a
    /// wake-up instead of asking again (see `engine/local.rs`).
    pub(crate) hand_off: bool,
    /// The kind's `acquire` takes the service out of the services waiting when it grants (the
    /// mutex, a writer). For the other kinds (permits, readers), a grant that empties a line
    /// refused since it was last empty is followed by `leave.lua`: a service is registered as
    /// waiting only while a caller of it waits.
    pub(crate) leaves_on_grant: bool,
    /// The suffix of a fourth key the kind's operations use, named after the lock key
    /// (`<lock>:turn`, a read-write lock's writers waiting; `<lock>:wh`, a mutex's waiting
    /// heads). In Redis Cluster each operation then declares four keys, otherwise three; on one
    /// server an operation passes two (the lock and its fence counter) and the script names the
    /// others after the lock key (every argument costs a call; see `scripts::ops`).
    pub(crate) fourth_key: Option<&'static str>,
    /// The kind's acquires carry an extra argument (the permits a semaphore's asks for, see
    /// [`Target::extra`](super::target::Target)): each operation then sends five arguments;
    /// otherwise four (every argument costs a call).
    pub(crate) extra_arg: bool,
}

impl PartialEq for Kind {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Kind {}
