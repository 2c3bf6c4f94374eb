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

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::collections::HashMap;

use crate::engine::{Engine, KeyNames, presence};
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
    /// The services with callers waiting for this key, and how many: this service's counted
    /// now, every other service's as it last reported them (services report their waiting
    /// callers every second). A service registered as waiting on Redis that has not reported
    /// (an older version, or one that just started) shows with `waiting: None`.
    pub waiters: Vec<ServiceWaiters>,
    /// A mutex released under a minimum hold
    /// ([`LockRequest::hold_at_least`](crate::LockRequest::hold_at_least)): nobody holds it,
    /// and it stays taken until [`Kept::left`] runs out. `None` otherwise.
    pub kept: Option<Kept>,
}

/// The waiting callers of one service for one lock, in [`LockInfo::waiters`].
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// for w in locks.inspect("goods:42").await?.waiters {
///     println!("{} waits with {:?} callers", w.instance_name.as_deref().unwrap_or("?"), w.waiting);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceWaiters {
    /// The service's id on Redis (`<instance name>~<random id>`).
    pub service: String,
    /// The service's instance name (see
    /// [`LockConfig::with_instance_name`](crate::LockConfig::with_instance_name)); `None` for
    /// an id without one (an older version).
    pub instance_name: Option<String>,
    /// How many of its callers wait; `None` when the service has not reported it.
    pub waiting: Option<u32>,
}

/// An entry of the journal, from [`LockService::journal`](crate::LockService::journal): a rare
/// event one service saw that operators of the others need to know of.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// for entry in locks.journal(20).await? {
///     println!("{:?} {} {} `{}`", entry.at, entry.what, entry.kind, entry.key);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalEntry {
    /// When, by the server's clock.
    pub at: SystemTime,
    /// What happened.
    pub what: JournalKind,
    /// The lock's kind.
    pub kind: LockKind,
    /// The lock's key.
    pub key: String,
    /// The id of the service that recorded it (`<instance name>~<random id>`): the one that
    /// force-unlocked the lock, or whose hold was lost.
    pub service: Option<String>,
    /// That service's instance name.
    pub instance_name: Option<String>,
    /// The owner field of the lost hold (see [`Holder::field`]); `None` for a force-unlock.
    pub owner: Option<String>,
    /// Why a hold was lost (e.g. "its lease ran out").
    pub detail: Option<String>,
}

/// What a [`JournalEntry`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JournalKind {
    /// A service force-unlocked the lock, whoever held it.
    ForceUnlocked,
    /// A service's hold was lost while held: its lease ran out before a renewal reached Redis,
    /// a renewal found it gone, or it was force-unlocked.
    Lost,
}

impl JournalKind {
    /// `"force-unlocked"` or `"lost"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            JournalKind::ForceUnlocked => "force-unlocked",
            JournalKind::Lost => "lost",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<JournalKind> {
        match text {
            "force-unlocked" => Some(JournalKind::ForceUnlocked),
            "lost" => Some(JournalKind::Lost),
            _ => None,
        }
    }
}

impl std::fmt::Display for JournalKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mutex kept after its release because of its minimum hold, in [`LockInfo::kept`]: the job
/// ran, and the lock keeps others out until `left` runs out.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// if let Some(kept) = locks.inspect("job:nightly-report").await?.kept {
///     println!("done by {}, kept for {:?} more", kept.holder.owner, kept.left);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Kept {
    /// Who held it last (its lease and hold count are those of the finished hold: none, 0).
    pub holder: Holder,
    /// How long it stays taken.
    pub left: Duration,
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
            waiters: Vec::new(),
            kept: None,
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
    /// The random id of the process holding it; `None` for an owner across processes.
    pub instance: Option<String>,
    /// The instance name of the service holding it (see
    /// [`LockConfig::with_instance_name`](crate::LockConfig::with_instance_name), default
    /// `hostname:pid`); `None` for an owner across processes and for holds of older versions.
    pub instance_name: Option<String>,
    /// When it was granted, by the server's clock (read from the hold's fencing token, which
    /// is the server time of the grant in microseconds); `None` when unknown (a token ahead of
    /// the server's clock: the clock stepped back).
    pub granted_at: Option<SystemTime>,
    /// How long ago it was granted, by the server's clock; `None` when unknown. Renewals do
    /// not reset it; a hand-off to the next owner does.
    pub held_for: Option<Duration>,
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
        let (name, instance, owner) = split_owner_field(field);
        Holder {
            field: field.to_owned(),
            instance: instance.map(str::to_owned),
            instance_name: name.map(str::to_owned),
            granted_at: None,
            held_for: None,
            request_id: owner::request_id_of(owner).map(str::to_owned),
            owner: owner.to_owned(),
            mode,
            hold_count: 1,
            lease_left: None,
            permits: None,
        }
    }

    /// Records when the hold was granted from its fencing token (the server's clock in
    /// microseconds at the grant), as read at `state`'s server time.
    pub(crate) fn granted_by_token(&mut self, token: u64, state: &RawState) {
        let now_us = u64::try_from(state.now_ms)
            .unwrap_or(0)
            .saturating_mul(1000);
        // a token ahead of the clock (by more than the millisecond the clock was read in) was
        // drawn from the counter, not the clock: its time says nothing
        if token == 0 || token > now_us + 1000 {
            return;
        }
        self.granted_at = Some(UNIX_EPOCH + Duration::from_micros(token));
        self.held_for = Some(Duration::from_micros(now_us.saturating_sub(token)));
    }
}

/// The parts of an owner field (see `Engine::owner_field`): `<name>~<process id>:<owner>`,
/// `mesh:<owner>`, or an older version's `<process id>:<owner>` (a process id is 32 hex
/// digits). Returns the instance name, the process id (both `None` for `mesh`) and the owner
/// id, which may itself contain `:` and `~`.
pub(crate) fn split_owner_field(field: &str) -> (Option<&str>, Option<&str>, &str) {
    fn process_then_owner(s: &str) -> Option<(&str, &str)> {
        let (process, owner) = (s.get(..32)?, s.get(32..)?.strip_prefix(':')?);
        process
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
            .then_some((process, owner))
    }
    if let Some(owner) = field.strip_prefix("mesh:") {
        return (None, None, owner);
    }
    if let Some((process, owner)) = process_then_owner(field) {
        return (None, Some(process), owner);
    }
    // an instance name has no `~`
    if let Some((name, (process, owner))) = field
        .split_once('~')
        .and_then(|(name, rest)| Some((name, process_then_owner(rest)?)))
    {
        return (Some(name), Some(process), owner);
    }
    (None, None, field)
}

/// The instance name in a service id (`<name>~<random id>`); `None` for an older version's.
pub(crate) fn service_name(service: &str) -> Option<&str> {
    service.split_once('~').map(|(name, _)| name)
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
    let reports = reports(engine).await;
    let mut locks = Vec::with_capacity(keys.len());
    for redis_key in keys {
        let Some((layout, key)) = parse_redis_key(prefix, layouts, &redis_key) else {
            continue;
        };
        let info = inspect_with(engine, layout, &key, &reports).await?;
        if !info.holders.is_empty() || info.kept.is_some() {
            locks.push(info);
        }
    }
    locks.sort_by(|a, b| (&a.key, a.kind).cmp(&(&b.key, b.kind)));
    Ok(locks)
}

/// The services' waiting reports; none when they cannot be read (they only add counts to
/// what the lock's own keys say).
async fn reports(engine: &Engine) -> HashMap<String, Vec<(String, u32)>> {
    presence::reported_waiters(engine)
        .await
        .unwrap_or_else(|e| {
            tracing::debug!(error = %e, "could not read the services' waiting reports");
            HashMap::new()
        })
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
    engine.names(layout.namespace, key)?;
    // both calls at once: one `response_timeout` bounds the whole when Redis stalls
    let none = HashMap::new();
    let (reports, info) = tokio::join!(reports(engine), inspect_with(engine, layout, key, &none));
    let mut info = info?;
    if let Some(reported) = reports.get(&info.redis_key) {
        presence::add_reported(engine, &mut info.waiters, reported);
    }
    Ok(info)
}

/// [`inspect`] without the other services' waiting counts (one call to Redis instead of two),
/// for the questions that need only the holds (`is_locked`, `is_held_by_current`).
pub(crate) async fn holds(
    engine: &Engine,
    layout: &Layout,
    key: &str,
) -> Result<LockInfo, LockError> {
    inspect_with(engine, layout, key, &HashMap::new()).await
}

/// [`inspect`] with the services' waiting reports already read.
async fn inspect_with(
    engine: &Engine,
    layout: &Layout,
    key: &str,
    reports: &HashMap<String, Vec<(String, u32)>>,
) -> Result<LockInfo, LockError> {
    let names = engine.names(layout.namespace, key)?;
    let mut call = ScriptCall::new(&scripts::INSPECT, 3);
    call.key(&names.lock)
        .key(&engine.fence_counter(&names))
        .key(&names.queue());
    type Reply = (
        Vec<(String, String)>,
        i64,
        i64,
        Vec<String>,
        i64,
        Option<String>,
    );
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
    info.waiting_services = u32::try_from(waiting.len()).unwrap_or(u32::MAX);
    info.local_waiters = local.waiter_count(&names.lock);
    let reported = reports.get(&*names.lock).map(Vec::as_slice);
    info.waiters = presence::waiters_of(engine, &names.lock, &waiting, reported);
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
    if removed.holders.is_empty() && removed.kept.is_none() {
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

    const P: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn owners_and_request_ids() {
        let h = Holder::new(&format!("shop-1:4242~{P}:req-42#1"), HoldMode::Exclusive);
        assert_eq!(h.instance_name.as_deref(), Some("shop-1:4242"));
        assert_eq!(h.instance.as_deref(), Some(P));
        assert_eq!(h.owner, "req-42#1");
        assert_eq!(h.request_id.as_deref(), Some("req-42"));
        let h = Holder::new("mesh:op:7", HoldMode::Exclusive);
        assert_eq!(
            (h.instance, h.instance_name, h.owner.as_str(), h.request_id),
            (None, None, "op:7", None)
        );
        // an older version's field: a process id, no name
        let h = Holder::new(&format!("{P}:job~{P}:1"), HoldMode::Exclusive);
        assert_eq!(
            (h.instance.as_deref(), h.instance_name, h.owner.as_str()),
            (Some(P), None, &*format!("job~{P}:1"))
        );
        // not written by this library: the whole field is the owner
        let h = Holder::new("someone", HoldMode::Exclusive);
        assert_eq!((h.instance, h.owner.as_str()), (None, "someone"));
        assert_eq!(service_name("shop-1:4242~77ab"), Some("shop-1:4242"));
        assert_eq!(service_name("77ab"), None);
    }

    #[test]
    fn grant_times_come_from_tokens() {
        let state = raw_state(&[], 1000);
        let mut h = Holder::new("x", HoldMode::Exclusive);
        h.granted_by_token(400_000_000, &state);
        assert_eq!(h.held_for, Some(Duration::from_millis(600_000)));
        assert_eq!(h.granted_at, Some(UNIX_EPOCH + Duration::from_secs(400)));
        // a token the counter drew ahead of the clock says nothing of the time
        let mut h = Holder::new("x", HoldMode::Exclusive);
        h.granted_by_token(5_000_000_000, &state);
        assert_eq!((h.granted_at, h.held_for), (None, None));
    }
}
