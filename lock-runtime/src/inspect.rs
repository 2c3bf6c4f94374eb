//! Introspection for operators: which locks of every kind exist on Redis, who holds them (with
//! the request each hold was taken for), and breaking one whoever holds it.
//!
//! ```no_run
//! # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
//! use lock_runtime::LockKind;
//!
//! for lock in locks.list(Some("goods:*")).await? {
//!     for holder in &lock.holders {
//!         println!(
//!             "{} {} held by {} (request {:?}) for {:?} more",
//!             lock.kind, lock.key, holder.owner, holder.request_id, holder.lease_left
//!         );
//!     }
//! }
//! if let Some(removed) = locks.force_unlock_kind(LockKind::ReadWrite, "catalog:7").await? {
//!     println!("removed {} holds", removed.holders.len());
//! }
//! # Ok(()) }
//! ```
//!
//! The data is what the kinds keep on Redis (see each kind's module and the headers of its scripts): a
//! mutex's hash holds its owner and grant ids, a read-write lock's its write hold and one
//! field per read hold with its own expiry, a semaphore's one field per grant with its expiry
//! and permits.

use std::time::Duration;

use crate::engine::{Engine, KeyNames};
use crate::error::LockError;
use crate::owner;
use crate::scripts::{self, ScriptCall};
pub use crate::vocab::{HoldMode, LockKind};

/// The state of one lock on Redis, from [`LockService::inspect`](crate::LockService::inspect),
/// [`inspect_kind`](crate::LockService::inspect_kind), [`list`](crate::LockService::list) or
/// [`force_unlock_kind`](crate::LockService::force_unlock_kind).
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let info = locks.inspect("goods:42").await?;
/// for holder in &info.holders {
///     println!("{} holds {} ({} times)", holder.owner, info.key, holder.hold_count);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as asked for (the semaphore's name for a semaphore).
    pub key: String,
    /// The kind of lock.
    pub kind: LockKind,
    /// The lock's key on Redis, e.g. `lock:{goods:42}` or `lock:rw:{catalog:7}`.
    pub redis_key: String,
    /// Who holds it: the owner of a mutex; a read-write lock's writer or readers (the writer
    /// first); a semaphore's grants. Empty when free.
    pub holders: Vec<Holder>,
    /// The holder as stored on Redis (`<process instance>:<owner id>`; under the web
    /// middleware the owner id is `<request id>#<n>`), `None` when free. For a read-write lock
    /// or a semaphore, the first of [`holders`](Self::holders).
    pub holder: Option<String>,
    /// How many times the holder holds it, 0 when free: its grants on Redis (one per process
    /// holding it) plus, when the holder is in this service, its re-entries here. For a
    /// read-write lock or a semaphore, the sum over [`holders`](Self::holders).
    pub hold_count: u32,
    /// The remaining lease, `None` when free (a read-write lock or semaphore: its longest
    /// hold's; each holder's is in [`Holder::lease_left`]).
    pub ttl: Option<Duration>,
    /// The fencing token of the current grant (a read-write lock's: of its write hold),
    /// `None` when free (and for a semaphore, whose grants each got one of their own).
    pub fence: Option<u64>,
    /// The last fencing token issued in this key's cluster slot (the counter of the slot serves
    /// every lock in it): at least the last token of this key; `None` when none ever was.
    pub last_fence: Option<u64>,
    /// How many permits a semaphore has (the count its latest acquirer passed); `None` for
    /// the other kinds.
    pub permits: Option<u32>,
    /// How many services (processes) have waiters registered for this key.
    pub waiting_services: u32,
    /// How many callers of this service wait in line for this key right now.
    pub local_waiters: usize,
}

impl LockInfo {
    pub(crate) fn empty(kind: LockKind, key: &str, redis_key: &str) -> LockInfo {
        LockInfo {
            key: key.to_owned(),
            kind,
            redis_key: redis_key.to_owned(),
            holders: Vec::new(),
            holder: None,
            hold_count: 0,
            ttl: None,
            fence: None,
            last_fence: None,
            permits: None,
            waiting_services: 0,
            local_waiters: 0,
        }
    }

    /// Whether anyone holds it.
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }
}

/// One holder of a lock, as [`LockInfo::holders`] lists them.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let info = locks.inspect_kind(lock_runtime::LockKind::ReadWrite, "catalog:7").await?;
/// let readers = info.holders.iter().filter(|h| h.mode == lock_runtime::HoldMode::Read).count();
/// # let _ = readers;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The owner as stored on Redis: `<process instance>:<owner id>`, or `mesh:<owner id>` for
    /// an owner that is the same in every process ([`OwnerId::across_processes`](crate::OwnerId::across_processes)).
    pub field: String,
    /// The random id of the process (lock service instance) holding it; `None` for an owner
    /// across processes.
    pub instance: Option<String>,
    /// The owner id (see [`owner`]).
    pub owner: String,
    /// The request id the hold was taken for, when the owner is `<request id>#<n>` (the web
    /// middleware's owners, or [`owner::chain`]'s label); see [`owner::request_id_of`].
    pub request_id: Option<String>,
    /// What it holds.
    pub mode: HoldMode,
    /// How many times it holds it: its grants on Redis (a mutex owner across processes has
    /// one per process) plus, when the holder is in the service that asked, its re-entries.
    pub hold_count: u32,
    /// The remaining lease of this hold: the lock's for a mutex; a read-write lock and a
    /// semaphore keep one per hold.
    pub lease_left: Option<Duration>,
    /// The permits of a semaphore grant; `None` for the other kinds.
    pub permits: Option<u32>,
}

impl Holder {
    /// A holder of `mode` stored as `field` (`<instance>:<owner>` or `mesh:<owner>`), held
    /// once, with no lease or permits yet.
    pub(crate) fn new(field: &str, mode: HoldMode) -> Holder {
        let (instance, owner) = split_owner_field(field);
        Holder {
            field: field.to_owned(),
            instance: instance.map(str::to_owned),
            request_id: owner::request_id_of(owner).map(str::to_owned),
            owner: owner.to_owned(),
            mode,
            hold_count: 1,
            lease_left: None,
            permits: None,
        }
    }
}

/// `<instance>:<owner>` or `mesh:<owner>` (see `engine::owner_field`): the instance (`None` for
/// `mesh`) and the owner id, which may itself contain `:`.
fn split_owner_field(field: &str) -> (Option<&str>, &str) {
    match field.split_once(':') {
        Some(("mesh", owner)) => (None, owner),
        Some((instance, owner)) => (Some(instance), owner),
        None => (None, field),
    }
}

/// How many guards this service has of a grant (given by its grant ids, as the kind's hash
/// stores them), `None` when it does not hold it: its re-entries count as holds.
pub(crate) type LocalGuards<'a> = &'a dyn Fn(&str) -> Option<u32>;

/// What `inspect` needs to know about a kind: its namespace on Redis and how its hash reads.
/// Each kind describes itself with one (see `crate::kinds`); the functions here ask it.
#[derive(Debug)]
pub(crate) struct Layout {
    /// The kind.
    pub(crate) kind: LockKind,
    /// What the kind puts between the prefix and the `{key}` hash tag on Redis.
    pub(crate) namespace: &'static str,
    /// Fills `info`'s holders (and fence, permits) from the kind's key (a hash's fields, a
    /// string's value).
    pub(crate) decode: fn(&mut LockInfo, &RawState, LocalGuards<'_>),
}

/// The state of a lock as one script reply gives it.
pub(crate) struct RawState {
    /// The fields of a hash (empty for a string).
    pub(crate) fields: Vec<(String, String)>,
    /// The value of a string (a mutex), `None` for a hash or no key.
    pub(crate) value: Option<String>,
    pub(crate) pttl: i64,
    /// The server clock (ms) when it was read: per-hold expiries are in that clock.
    pub(crate) now_ms: i64,
}

impl RawState {
    /// The lease left of a hold whose expiry (server clock, ms) is `expiry`; `None` when it ran
    /// out or is not a number.
    pub(crate) fn left(&self, expiry: &str) -> Option<Duration> {
        let expiry: i64 = expiry.parse().ok()?;
        let ms = u64::try_from(expiry - self.now_ms).ok()?;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// The lock key's remaining lease, `None` when it has none or is gone.
    pub(crate) fn pttl(&self) -> Option<Duration> {
        u64::try_from(self.pttl).ok().map(Duration::from_millis)
    }
}

/// Builds the [`LockInfo`] of a lock of `layout`'s kind from its hash (as `HGETALL` gives it),
/// leaving out holds whose lease ran out (a read-write lock or semaphore drops them at its next
/// call). `local` gives the guards this service has of a grant (its re-entries), if it holds it.
pub(crate) fn lock_info(
    layout: &Layout,
    key: &str,
    redis_key: &str,
    state: RawState,
    local: impl Fn(&str) -> Option<u32>,
) -> LockInfo {
    let mut info = LockInfo::empty(layout.kind, key, redis_key);
    (layout.decode)(&mut info, &state, &local);
    // an exclusive hold (the writer) first, then the longest leases
    info.holders.sort_by(|a, b| {
        (b.mode.is_exclusive())
            .cmp(&a.mode.is_exclusive())
            .then(b.lease_left.cmp(&a.lease_left))
            .then(a.field.cmp(&b.field))
    });
    if info.holders.is_empty() {
        info.fence = None;
    } else {
        info.ttl = state.pttl();
        info.holder = info.holders.first().map(|h| h.field.clone());
        info.hold_count = info.holders.iter().map(|h| h.hold_count).sum();
    }
    info
}

/// The locks of every kind in `layouts` held now under the engine's prefix whose key matches
/// the glob `pattern`, sorted by key and kind (see `LockService::list`).
pub(crate) async fn list(
    engine: &Engine,
    layouts: &[&Layout],
    pattern: Option<&str>,
) -> Result<Vec<LockInfo>, LockError> {
    let prefix = engine.config.prefix();
    let glob = KeyNames::scan_pattern(prefix, pattern.unwrap_or("*"));
    let keys = engine.backend.scan_keys(&glob).await?;
    let mut locks = Vec::with_capacity(keys.len());
    for redis_key in keys {
        let Some((layout, key)) = parse_redis_key(prefix, layouts, &redis_key) else {
            continue;
        };
        let info = inspect(engine, layout, &key).await?;
        if !info.holders.is_empty() {
            locks.push(info);
        }
    }
    locks.sort_by(|a, b| (&a.key, a.kind).cmp(&(&b.key, b.kind)));
    Ok(locks)
}

/// The layout and user key of a lock key under `prefix` of one of `layouts`' kinds; `None`
/// for any other key (another prefix's, an auxiliary key).
pub(crate) fn parse_redis_key<'l>(
    prefix: &str,
    layouts: &[&'l Layout],
    redis_key: &str,
) -> Option<(&'l Layout, String)> {
    layouts.iter().find_map(|layout| {
        KeyNames::parse(prefix, layout.namespace, redis_key).map(|key| (*layout, key))
    })
}

/// The state of the lock `key` of `layout`'s kind on Redis (see `LockService::inspect_kind`).
pub(crate) async fn inspect(
    engine: &Engine,
    layout: &Layout,
    key: &str,
) -> Result<LockInfo, LockError> {
    let names = engine.names(layout.namespace, key)?;
    let mut call = ScriptCall::new(&scripts::INSPECT, 3);
    call.key(&names.lock).key(names.fence()).key(&names.queue());
    type Reply = (Vec<(String, String)>, i64, i64, i64, i64, Option<String>);
    let (fields, pttl, last, waiting, now_ms, value): Reply =
        engine.backend.run("inspect", &call).await?;
    let local = &engine.local;
    let state = RawState {
        fields,
        value,
        pttl,
        now_ms,
    };
    let mut info = lock_info(layout, key, &names.lock, state, |grants| {
        local.guards_of(&names.lock, grants)
    });
    info.last_fence = u64::try_from(last).ok();
    info.waiting_services = u32::try_from(waiting).unwrap_or(0);
    info.local_waiters = local.waiter_count(&names.lock);
    Ok(info)
}

/// Removes the lock `key` of `layout`'s kind whoever holds it and wakes its waiters; the lock as
/// it was removed, `None` when nobody held it (see `LockService::force_unlock_kind`).
pub(crate) async fn force_unlock(
    engine: &Engine,
    layout: &Layout,
    key: &str,
) -> Result<Option<LockInfo>, LockError> {
    let names = engine.names(layout.namespace, key)?;
    let mut call = ScriptCall::new(&scripts::FORCE_UNLOCK, 1);
    call.key(&names.lock)
        .arg(names.channel())
        .arg(engine.backend.publish_command());
    type Reply = (Vec<(String, String)>, i64, i64, Option<String>);
    let (fields, pttl, now_ms, value): Reply = engine.backend.run("force_unlock", &call).await?;
    if fields.is_empty() && value.is_none() {
        return Ok(None);
    }
    let local = &engine.local;
    let state = RawState {
        fields,
        value,
        pttl,
        now_ms,
    };
    let removed = lock_info(layout, key, &names.lock, state, |grants| {
        local.guards_of(&names.lock, grants)
    });
    local.mark_lost(&names.lock);
    if removed.holders.is_empty() {
        return Ok(None);
    }
    tracing::warn!(
        key = %names.user,
        kind = %layout.kind,
        holders = removed.holders.len(),
        "lock force-unlocked"
    );
    engine.events.send(crate::events::LockEvent::ForceUnlocked {
        key: names.user.clone(),
        kind: layout.kind,
    });
    Ok(Some(removed))
}

/// A [`RawState`] read at server time 1,000,000 ms, for the kinds' decoding tests.
#[cfg(test)]
pub(crate) fn raw_state(fields: &[(&str, &str)], pttl: i64) -> RawState {
    RawState {
        fields: fields
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect(),
        value: None,
        pttl,
        now_ms: 1_000_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_and_request_ids() {
        let h = Holder::new("9f1c:req-42#1", HoldMode::Exclusive);
        assert_eq!(h.instance.as_deref(), Some("9f1c"));
        assert_eq!(h.owner, "req-42#1");
        assert_eq!(h.request_id.as_deref(), Some("req-42"));
        let h = Holder::new("mesh:op:7", HoldMode::Exclusive);
        assert_eq!(
            (h.instance, h.owner.as_str(), h.request_id),
            (None, "op:7", None)
        );
    }
}
