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
//! The data is what the kinds keep on Redis (see the headers of the scripts in `scripts/`): a
//! mutex's hash holds its owner and grant ids, a read-write lock's its write hold and one
//! field per read hold with its own expiry, a semaphore's one field per grant with its expiry
//! and permits.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::engine::KeyNames;
use crate::error::{ErrorKind, LockError};
use crate::owner;
use crate::scripts::{self, ScriptCall};
use crate::service::{LockInfo, LockService};

/// The kinds of lock, each in a namespace of its own on Redis: the mutex `key` is
/// `<prefix>{key}`, the read-write lock `key` is `<prefix>rw:{key}`, the semaphore `name` is
/// `<prefix>sem:{name}`. The same key names three different locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LockKind {
    /// [`LockService::lock`] (and each key of [`LockService::lock_all`]).
    Mutex,
    /// [`LockService::read`] and [`LockService::write`].
    ReadWrite,
    /// [`LockService::semaphore`].
    Semaphore,
}

impl LockKind {
    /// Every kind.
    pub const ALL: [LockKind; 3] = [LockKind::Mutex, LockKind::ReadWrite, LockKind::Semaphore];

    /// The short name: `mutex`, `rw` or `semaphore` (what [`FromStr`] reads back).
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::ReadWrite => "rw",
            LockKind::Semaphore => "semaphore",
        }
    }

    /// What the kind puts between the prefix and the `{key}` hash tag on Redis.
    fn namespace(self) -> &'static str {
        match self {
            LockKind::Mutex => "",
            LockKind::ReadWrite => "rw:",
            LockKind::Semaphore => "sem:",
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads `mutex` (or `lock`), `rw` (or `read-write`), `semaphore` (or `sem`).
///
/// ```
/// use lock_runtime::LockKind;
///
/// assert_eq!("rw".parse::<LockKind>().unwrap(), LockKind::ReadWrite);
/// assert_eq!("sem".parse::<LockKind>().unwrap(), LockKind::Semaphore);
/// assert!("queue".parse::<LockKind>().is_err());
/// ```
impl FromStr for LockKind {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "mutex" | "lock" => Ok(LockKind::Mutex),
            "rw" | "read-write" | "readwrite" => Ok(LockKind::ReadWrite),
            "semaphore" | "sem" => Ok(LockKind::Semaphore),
            _ => Err(LockError::new(
                ErrorKind::InvalidArgument,
                format!("unknown lock kind `{s}`; expected one of: mutex, rw, semaphore"),
            )),
        }
    }
}

/// What a [`Holder`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldMode {
    /// A mutex.
    Exclusive,
    /// The write hold of a read-write lock.
    Write,
    /// A read hold of a read-write lock (readers share it).
    Read,
    /// Permits of a semaphore ([`Holder::permits`] says how many).
    Permits,
}

impl HoldMode {
    /// `exclusive`, `write`, `read` or `permits`.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldMode::Exclusive => "exclusive",
            HoldMode::Write => "write",
            HoldMode::Read => "read",
            HoldMode::Permits => "permits",
        }
    }
}

impl fmt::Display for HoldMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One holder of a lock, as [`LockInfo::holders`] lists them.
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
    fn new(field: &str, mode: HoldMode) -> Holder {
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

/// The state of a lock as one script reply gives it.
pub(crate) struct RawState {
    pub(crate) fields: Vec<(String, String)>,
    pub(crate) pttl: i64,
    /// The server clock (ms) when it was read: per-hold expiries are in that clock.
    pub(crate) now_ms: i64,
}

/// The user key of a lock key `<prefix><namespace>{<encoded key>}` and its kind; `None` for a
/// key that is not a lock key under `prefix` (another prefix's, an auxiliary key).
pub(crate) fn parse_lock_key(prefix: &str, redis_key: &str) -> Option<(LockKind, String)> {
    let rest = redis_key.strip_prefix(prefix)?;
    LockKind::ALL.into_iter().find_map(|kind| {
        let tagged = rest.strip_prefix(kind.namespace())?;
        let encoded = tagged.strip_prefix('{')?.strip_suffix('}')?;
        if encoded.is_empty() || encoded.contains(['{', '}']) {
            return None;
        }
        Some((kind, decode_key(encoded)))
    })
}

/// Undoes `KeyNames`' escaping of `%`, `{` and `}` (left to right, so `%257B` is `%7B`).
fn decode_key(encoded: &str) -> String {
    let mut key = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(at) = rest.find('%') {
        key.push_str(&rest[..at]);
        let escape = &rest[at..];
        let (decoded, len) = if escape.starts_with("%25") {
            ('%', 3)
        } else if escape.starts_with("%7B") {
            ('{', 3)
        } else if escape.starts_with("%7D") {
            ('}', 3)
        } else {
            ('%', 1)
        };
        key.push(decoded);
        rest = &escape[len..];
    }
    key.push_str(rest);
    key
}

/// The `SCAN MATCH` pattern of the lock keys under `prefix` of every kind whose key matches
/// the glob `pattern`: the prefix with glob characters escaped, any namespace, and the pattern
/// inside the hash tag written the way `KeyNames` writes keys. Auxiliary keys (`…}:fence`,
/// `…}:wq`, `…}:turn`) never match: they do not end with `}`.
pub(crate) fn scan_pattern(prefix: &str, pattern: &str) -> String {
    let mut glob = String::with_capacity(prefix.len() + pattern.len() + 4);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            glob.push('\\');
        }
        glob.push(c);
    }
    glob.push_str("*{");
    for c in pattern.chars() {
        match c {
            '%' => glob.push_str("%25"),
            '{' => glob.push_str("%7B"),
            '}' => glob.push_str("%7D"),
            c => glob.push(c),
        }
    }
    glob.push('}');
    glob
}

/// Builds the [`LockInfo`] of a lock of `kind` from its hash (as `HGETALL` gives it), leaving
/// out holds whose lease ran out (a read-write lock or semaphore drops them at its next call).
/// `local` gives the guards this service has of a grant (its re-entries), if it holds it.
pub(crate) fn lock_info(
    kind: LockKind,
    key: &str,
    redis_key: &str,
    state: RawState,
    local: impl Fn(&str) -> Option<u32>,
) -> LockInfo {
    let left = |expiry: &str| -> Option<Duration> {
        let expiry: i64 = expiry.parse().ok()?;
        let ms = u64::try_from(expiry - state.now_ms).ok()?;
        (ms > 0).then(|| Duration::from_millis(ms))
    };
    let pttl = u64::try_from(state.pttl).ok().map(Duration::from_millis);
    let mut info = LockInfo::empty(kind, key, redis_key);
    let mut write_expiry = None;
    for (field, value) in &state.fields {
        match kind {
            LockKind::Mutex if field == scripts::FENCE_FIELD => info.fence = value.parse().ok(),
            LockKind::Mutex => {
                let mut holder = Holder::new(field, HoldMode::Exclusive);
                // one grant id per process holding it; re-entries are counted by that process
                holder.hold_count = u32::try_from(value.split_whitespace().count()).unwrap_or(0);
                if let Some(guards) = local(value) {
                    holder.hold_count += guards.saturating_sub(1);
                }
                holder.lease_left = pttl;
                info.holders.push(holder);
            }
            LockKind::ReadWrite if field == scripts::FENCE_FIELD => {
                info.fence = value.parse().ok();
            }
            LockKind::ReadWrite if field == ":wexp" => write_expiry = Some(value.as_str()),
            LockKind::ReadWrite => {
                if let Some(owner) = field.strip_prefix("w:") {
                    let mut holder = Holder::new(owner, HoldMode::Write);
                    holder.hold_count = local(value).unwrap_or(1).max(1);
                    info.holders.push(holder);
                } else if let Some(grant) = field.strip_prefix("r:") {
                    let Some((expiry, owner)) = value.split_once(' ') else {
                        continue;
                    };
                    let Some(lease_left) = left(expiry) else {
                        continue;
                    };
                    let mut holder = Holder::new(owner, HoldMode::Read);
                    holder.hold_count = local(grant).unwrap_or(1).max(1);
                    holder.lease_left = Some(lease_left);
                    info.holders.push(holder);
                }
            }
            LockKind::Semaphore if field == ":n" => info.permits = value.parse().ok(),
            LockKind::Semaphore => {
                let Some(_grant) = field.strip_prefix("p:") else {
                    continue;
                };
                let mut parts = value.splitn(3, ' ');
                let (Some(expiry), Some(permits), Some(owner)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                let Some(lease_left) = left(expiry) else {
                    continue;
                };
                let mut holder = Holder::new(owner, HoldMode::Permits);
                holder.lease_left = Some(lease_left);
                holder.permits = permits.parse().ok();
                info.holders.push(holder);
            }
        }
    }
    if kind == LockKind::ReadWrite {
        // the write hold's lease is data too; one that ran out is gone
        let write_left = write_expiry.and_then(left);
        info.holders.retain_mut(|h| match h.mode {
            HoldMode::Write => {
                h.lease_left = write_left;
                write_left.is_some()
            }
            _ => true,
        });
        if !info.holders.iter().any(|h| h.mode == HoldMode::Write) {
            info.fence = None;
        }
    }
    // the writer first, then the longest leases
    info.holders.sort_by(|a, b| {
        (b.mode == HoldMode::Write)
            .cmp(&(a.mode == HoldMode::Write))
            .then(b.lease_left.cmp(&a.lease_left))
            .then(a.field.cmp(&b.field))
    });
    if info.holders.is_empty() {
        info.fence = None;
    } else {
        info.ttl = pttl;
        info.holder = info.holders.first().map(|h| h.field.clone());
        info.hold_count = info.holders.iter().map(|h| h.hold_count).sum();
    }
    info
}

impl LockService {
    /// The locks of every kind held now under this service's prefix whose key matches the glob
    /// `pattern` (`*` any text, `?` one character, `[abc]` one of; `None`: all), sorted by key
    /// and kind, each as [`inspect_kind`](Self::inspect_kind) gives it.
    ///
    /// The keys are found with `SCAN` (never `KEYS`, which blocks Redis) on the master, and on
    /// every master of a cluster, then inspected one by one: a lock taken or released meanwhile
    /// may be missing or shown as it was a moment ago. Auxiliary keys (fence counters, waiting
    /// sets, turn markers) are skipped, and so are locks whose holds all ran out.
    ///
    /// # Errors
    /// [`ErrorKind::Backend`] when Redis failed or did not answer within `response_timeout`.
    pub async fn list(&self, pattern: Option<&str>) -> Result<Vec<LockInfo>, LockError> {
        let prefix = self.config().prefix();
        let glob = scan_pattern(prefix, pattern.unwrap_or("*"));
        let keys = self.inner.backend.scan_hashes(&glob).await?;
        let mut locks = Vec::with_capacity(keys.len());
        for redis_key in keys {
            let Some((kind, key)) = parse_lock_key(prefix, &redis_key) else {
                continue;
            };
            let info = self.inspect_kind(kind, &key).await?;
            if !info.holders.is_empty() {
                locks.push(info);
            }
        }
        locks.sort_by(|a, b| (&a.key, a.kind).cmp(&(&b.key, b.kind)));
        Ok(locks)
    }

    /// The state of the lock `key` of `kind` on Redis: its holders (with their request ids and
    /// leases), fencing tokens and waiting services. A lock nobody holds has no holders.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`] or [`ErrorKind::Backend`].
    pub async fn inspect_kind(&self, kind: LockKind, key: &str) -> Result<LockInfo, LockError> {
        let names = self.names_of(kind, key)?;
        let mut call = ScriptCall::new(&scripts::INSPECT, 3);
        call.key(&names.lock)
            .key(&names.fence())
            .key(&names.queue());
        type Reply = (Vec<(String, String)>, i64, i64, i64, i64);
        let (fields, pttl, last, waiting, now_ms): Reply =
            self.inner.backend.run("inspect", &call).await?;
        let local = &self.inner.local;
        let mut info = lock_info(
            kind,
            key,
            &names.lock,
            RawState {
                fields,
                pttl,
                now_ms,
            },
            |grants| local.guards_of(&names.lock, grants),
        );
        info.last_fence = u64::try_from(last).ok();
        info.waiting_services = u32::try_from(waiting).unwrap_or(0);
        info.local_waiters = local.waiter_count(&names.lock);
        Ok(info)
    }

    /// Removes the lock `key` of `kind` whoever holds it, and wakes its waiters; returns the
    /// lock as it was removed (its holders, leases and fencing token, read in the same script;
    /// `last_fence` and the waiters are not read), or `None` when nobody held it.
    ///
    /// Every holder loses it: a holder in this service learns it at once (`lost()` fires), one
    /// elsewhere at its next renewal, or at its validity deadline. Their releases then fail
    /// with [`ErrorKind::NotHeld`] and never touch a newer grant. The fence counter stays, so
    /// tokens keep increasing. [`force_unlock`](Self::force_unlock) is this for a mutex.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`] or [`ErrorKind::Backend`].
    pub async fn force_unlock_kind(
        &self,
        kind: LockKind,
        key: &str,
    ) -> Result<Option<LockInfo>, LockError> {
        let names = self.names_of(kind, key)?;
        let turn = names.turn();
        let mut call = ScriptCall::new(
            &scripts::FORCE_UNLOCK,
            if kind == LockKind::Mutex { 2 } else { 1 },
        );
        call.key(&names.lock);
        if kind == LockKind::Mutex {
            // a turn given to a waiting service; a read-write lock's `:turn` is its waiting
            // writers, who keep their place
            call.key(&turn);
        }
        call.arg(names.channel())
            .arg(self.inner.backend.publish_command());
        type Reply = (Vec<(String, String)>, i64, i64);
        let (fields, pttl, now_ms): Reply = self.inner.backend.run("force_unlock", &call).await?;
        if fields.is_empty() {
            return Ok(None);
        }
        let local = &self.inner.local;
        let state = RawState {
            fields,
            pttl,
            now_ms,
        };
        let removed = lock_info(kind, key, &names.lock, state, |grants| {
            local.guards_of(&names.lock, grants)
        });
        local.mark_lost(&names.lock);
        if removed.holders.is_empty() {
            return Ok(None);
        }
        tracing::warn!(
            key = %names.user,
            kind = %kind,
            holders = removed.holders.len(),
            "lock force-unlocked"
        );
        self.inner.events.send(crate::LockEvent::ForceUnlocked {
            key: names.user.clone(),
            kind,
        });
        Ok(Some(removed))
    }

    /// The Redis key of the lock `key` of `kind` under this service's prefix, e.g.
    /// `lock:rw:{catalog:7}`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`] for an empty key.
    pub fn redis_key(&self, kind: LockKind, key: &str) -> Result<String, LockError> {
        Ok(self.names_of(kind, key)?.lock.to_string())
    }

    /// The kind and key of a Redis key of a lock under this service's prefix (the reverse of
    /// [`redis_key`](Self::redis_key)); `None` for any other key, such as a fence counter.
    pub fn parse_redis_key(&self, redis_key: &str) -> Option<(LockKind, String)> {
        parse_lock_key(self.config().prefix(), redis_key)
    }

    fn names_of(&self, kind: LockKind, key: &str) -> Result<KeyNames, LockError> {
        KeyNames::in_namespace(self.config().prefix(), kind.namespace(), key)
            .map_err(|e| e.with_key(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(fields: &[(&str, &str)], pttl: i64) -> RawState {
        RawState {
            fields: fields
                .iter()
                .map(|(f, v)| (f.to_string(), v.to_string()))
                .collect(),
            pttl,
            now_ms: 1_000_000,
        }
    }

    #[test]
    fn lock_keys_parse_back() {
        for kind in LockKind::ALL {
            for key in ["goods:42", "shop:{7}:a", "100%", "a%7Bb", "x}y"] {
                let names = KeyNames::in_namespace("lock:", kind.namespace(), key).unwrap();
                assert_eq!(
                    parse_lock_key("lock:", &names.lock),
                    Some((kind, key.to_owned())),
                    "{}",
                    names.lock
                );
                for aux in [names.fence(), names.queue(), names.turn()] {
                    assert_eq!(parse_lock_key("lock:", &aux), None);
                }
            }
        }
        assert_eq!(parse_lock_key("lock:", "other:{a}"), None);
        assert_eq!(parse_lock_key("lock:", "lock:queue:{a}"), None);
        assert_eq!(parse_lock_key("lock:", "lock:{}"), None);
        assert_eq!(decode_key("%25%7B%7D%zz%"), "%{}%zz%");
    }

    #[test]
    fn scan_patterns_escape_the_prefix_and_encode_the_key() {
        assert_eq!(scan_pattern("lock:", "*"), "lock:*{*}");
        assert_eq!(scan_pattern("a*[x]:", "goods:?"), "a\\*\\[x\\]:*{goods:?}");
        assert_eq!(scan_pattern("lock:", "shop:{7}*"), "lock:*{shop:%7B7%7D*}");
    }

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

    #[test]
    fn a_mutex() {
        let s = state(
            &[
                ("9f1c:req-42#1", "00000000000000aa"),
                (":fence", "1700000000000001"),
            ],
            4_000,
        );
        let info = lock_info(LockKind::Mutex, "k", "lock:{k}", s, |g| {
            (g == "00000000000000aa").then_some(3)
        });
        assert_eq!(info.holder.as_deref(), Some("9f1c:req-42#1"));
        assert_eq!(info.hold_count, 3);
        assert_eq!(info.fence, Some(1_700_000_000_000_001));
        assert_eq!(info.ttl, Some(Duration::from_secs(4)));
        let [h] = &info.holders[..] else { panic!() };
        assert_eq!((h.mode, h.hold_count), (HoldMode::Exclusive, 3));
        assert_eq!(h.lease_left, Some(Duration::from_secs(4)));

        let free = lock_info(LockKind::Mutex, "k", "lock:{k}", state(&[], -2), |_| None);
        assert_eq!((free.holder, free.ttl, free.hold_count), (None, None, 0));
    }

    #[test]
    fn a_read_write_lock_keeps_leases_per_hold() {
        let s = state(
            &[
                ("r:01", "1002000 i1:req-1#1"),
                ("r:02", "1005000 i2:job#4"),
                ("r:03", "999000 i3:gone#1"), // ran out, not cleaned up yet
                ("w:i4:req-9#2", "04"),
                (":wexp", "1001000"),
                (":fence", "77"),
            ],
            5_000,
        );
        let info = lock_info(LockKind::ReadWrite, "k", "lock:rw:{k}", s, |_| None);
        let modes: Vec<_> = info
            .holders
            .iter()
            .map(|h| (h.mode, h.owner.as_str()))
            .collect();
        assert_eq!(
            modes,
            [
                (HoldMode::Write, "req-9#2"),
                (HoldMode::Read, "job#4"),
                (HoldMode::Read, "req-1#1")
            ]
        );
        assert_eq!(info.holders[0].lease_left, Some(Duration::from_secs(1)));
        assert_eq!(info.holders[1].lease_left, Some(Duration::from_secs(5)));
        assert_eq!(info.fence, Some(77));
        assert_eq!(info.hold_count, 3);
        assert_eq!(info.holder.as_deref(), Some("i4:req-9#2"));

        // a write hold that ran out is no holder, and its token is not current
        let s = state(
            &[("w:i4:x", "04"), (":wexp", "999999"), (":fence", "7")],
            10,
        );
        let info = lock_info(LockKind::ReadWrite, "k", "lock:rw:{k}", s, |_| None);
        assert!(info.holders.is_empty());
        assert_eq!((info.fence, info.holder), (None, None));
    }

    #[test]
    fn a_semaphore_lists_grants_with_permits() {
        let s = state(
            &[
                (":n", "4"),
                ("p:01", "1003000 2 i1:req-7#1"),
                ("p:02", "1001500 1 mesh:batch"),
                ("p:03", "900000 1 i1:old#1"),
            ],
            3_000,
        );
        let info = lock_info(LockKind::Semaphore, "pdf", "lock:sem:{pdf}", s, |_| None);
        assert_eq!(info.permits, Some(4));
        assert_eq!(info.holders.len(), 2);
        assert_eq!(info.holders[0].permits, Some(2));
        assert_eq!(info.holders[0].request_id.as_deref(), Some("req-7"));
        assert_eq!(info.holders[1].instance, None);
        assert_eq!(
            info.holders[1].lease_left,
            Some(Duration::from_millis(1500))
        );
        assert_eq!(info.fence, None);
    }
}
