//! The read-write lock: many readers or one writer. Key layout: the hash
//! `<prefix>rw:{<key>}` (see `kinds/rw/state.lua`: the write hold, each read hold with its own
//! expiry, the current write token), the fence counter of its slot, `<lock>:wq` (services
//! waiting), `<lock>:turn` (services with a writer waiting: writer preference), the channel
//! `<lock>:ch`. Scripts: `kinds/rw/`.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;
use tokio_util::either::Either;

use super::{Acquiring, KindEntry};
use crate::context::{self, Held, OnLost};
use crate::engine::{Engine, Guard, KeyNames, Kind};
use crate::error::{ErrorKind, LockError};
use crate::inspect::{Holder, Layout, LocalGuards, LockInfo, RawState};
use crate::owner::OwnerId;
use crate::scripts::{self, FENCE_FIELD};
use crate::vocab::{HoldMode, LockKind};

/// Renews or extends read and write holds by grant id.
static RENEW: LazyLock<Script> = LazyLock::new(|| scripts::renew(&[include_str!("rw/renew.lua")]));

/// Takes a service off the writers waiting and wakes the readers kept out for them: run by
/// the engine when the service's last waiting writer gives up (a writer that no longer waits
/// must not keep readers out until its registration runs out).
static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("rw/leave.lua")));

/// The read hold as the engine sees it: shared, taken together by the readers at the front of
/// a line.
pub(crate) static READ: Kind = Kind {
    id: 1,
    noun: "read lock",
    mode: HoldMode::Read,
    busy: "a writer holds it or waits for it",
    lua_first: "",
    lua: &[include_str!("rw/state.lua"), include_str!("rw/read.lua")],
    renew: &RENEW,
    shared: true,
    joint: true,
    reentrant: true,
    leave: None,
    hand_off: false,
    leaves_on_grant: false,
    fourth_key: Some(crate::scripts::TURN_SUFFIX),
    extra_arg: false,
};

/// The write hold as the engine sees it.
pub(crate) static WRITE: Kind = Kind {
    id: 2,
    noun: "write lock",
    mode: HoldMode::Write,
    busy: "it is held by readers or another writer",
    lua_first: "",
    lua: &[include_str!("rw/state.lua"), include_str!("rw/write.lua")],
    renew: &RENEW,
    shared: false,
    joint: false,
    reentrant: true,
    leave: Some(&LEAVE),
    hand_off: false,
    leaves_on_grant: true,
    fourth_key: Some(crate::scripts::TURN_SUFFIX),
    extra_arg: false,
};

/// How `inspect` reads a read-write lock: the hash `<prefix>rw:{<key>}` (a namespace of its
/// own: `rw:{key}` never names a mutex `{key}`), `w:<owner>` -> the write grant, `:wexp` -> the
/// write hold's expiry, `r:<grant>` -> `<expiry> <token> <owner>` per read hold, `:fence` -> the
/// write token.
pub(crate) static LAYOUT: Layout = Layout {
    kind: LockKind::ReadWrite,
    namespace: "rw:",
    decode,
};

/// The read-write lock in the table of kinds.
pub(crate) static ENTRY: KindEntry = KindEntry {
    layout: &LAYOUT,
    holds: &[&READ, &WRITE],
};

fn decode(info: &mut LockInfo, state: &RawState, local: LocalGuards<'_>) {
    let mut write_expiry = None;
    for (field, value) in &state.fields {
        if field == FENCE_FIELD {
            info.fence = value.parse().ok();
        } else if field == ":wexp" {
            write_expiry = Some(value.as_str());
        } else if let Some(owner) = field.strip_prefix("w:") {
            let mut holder = Holder::new(owner, HoldMode::Write);
            holder.hold_count = local(value).unwrap_or(1).max(1);
            info.holders.push(holder);
        } else if let Some(grant) = field.strip_prefix("r:") {
            let Some((expiry, token, owner)) = value
                .split_once(' ')
                .and_then(|(expiry, rest)| Some((expiry, rest.split_once(' ')?)))
                .map(|(expiry, (token, owner))| (expiry, token, owner))
            else {
                continue;
            };
            let Some(lease_left) = state.left(expiry) else {
                continue;
            };
            let mut holder = Holder::new(owner, HoldMode::Read);
            holder.hold_count = local(grant).unwrap_or(1).max(1);
            holder.lease_left = Some(lease_left);
            if let Ok(token) = token.parse() {
                holder.granted_by_token(token, state);
            }
            info.holders.push(holder);
        }
    }
    // the write hold's lease is data too; one that ran out is gone
    let write_left = write_expiry.and_then(|e| state.left(e));
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
    if let Some((writer, token)) = info
        .holders
        .iter_mut()
        .find(|h| h.mode == HoldMode::Write)
        .zip(info.fence)
    {
        writer.granted_by_token(token, state);
    }
}

fn names(engine: &Engine, key: &str) -> Result<KeyNames, LockError> {
    engine.names(LAYOUT.namespace, key)
}

/// A request for a read or write hold, built by [`LockService::read`](crate::LockService::read) or
/// [`LockService::write`](crate::LockService::write); awaiting it acquires.
///
/// # Cancel safety
/// Dropping the future at any point never leaves the hold past its lease: a grant that arrives
/// after the future was dropped is released at once.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
///
/// let read = locks.read("catalog:7").wait(Duration::from_secs(1)).await?;
/// read.release().await?;
/// let write = locks.write("catalog:7").lease(Duration::from_secs(30)).await?;
/// write.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a lock request does nothing until it is awaited"]
pub struct RwRequest<'a, G> {
    engine: &'a Arc<Engine>,
    kind: &'static Kind,
    key: String,
    lease: Option<Duration>,
    wait: Option<Duration>,
    owner: Option<OwnerId>,
    metric_label: &'static str,
    guard: fn(Guard) -> G,
}

/// A request for a read hold: [`LockService::read`](crate::LockService::read).
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let request: lock_runtime::ReadRequest<'_> = locks.read("catalog:7");
/// let read = request.await?;
/// read.release().await?;
/// # Ok(()) }
/// ```
pub type ReadRequest<'a> = RwRequest<'a, ReadGuard>;
/// A request for a write hold: [`LockService::write`](crate::LockService::write).
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let request: lock_runtime::WriteRequest<'_> = locks.write("catalog:7");
/// let write = request.await?;
/// write.release().await?;
/// # Ok(()) }
/// ```
pub type WriteRequest<'a> = RwRequest<'a, WriteGuard>;

impl<'a> ReadRequest<'a> {
    pub(crate) fn read(engine: &'a Arc<Engine>, key: String) -> Self {
        RwRequest {
            engine,
            kind: &READ,
            key,
            lease: None,
            wait: None,
            owner: None,
            metric_label: crate::metrics::OTHER,
            guard: |core| ReadGuard { core },
        }
    }
}

impl<'a> WriteRequest<'a> {
    pub(crate) fn write(engine: &'a Arc<Engine>, key: String) -> Self {
        RwRequest {
            engine,
            kind: &WRITE,
            key,
            lease: None,
            wait: None,
            owner: None,
            metric_label: crate::metrics::OTHER,
            guard: |core| WriteGuard { core },
        }
    }
}

impl<G: Send + 'static> RwRequest<'_, G> {
    super::request_methods!("hold", "locks.write(\"catalog:7\")");

    /// Acquire as `owner` (see [`owner`](crate::owner#explicit-owners)) instead of following
    /// the call chain.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
    /// let job = lock_runtime::OwnerId::from("reindex-7");
    /// let write = locks.write("catalog:7").owner(job.clone()).await?;
    /// let read = locks.read("catalog:7").owner(job).await?; // a downgrade inside the write: at once
    /// read.release().await?;
    /// write.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Acquires, runs the future `body` returns as a locked body (lock calls inside re-enter
    /// this hold: a read inside a write body is a downgrade), and releases after it, also when
    /// the body panics or the future is dropped. Returns the body's own `Result`, a lock error
    /// converted to `E`. See [`LockRequest::run`](crate::LockRequest::run).
    ///
    /// # Errors
    /// The body's errors; the errors of acquiring, and [`ErrorKind::Lost`] when the hold was
    /// lost while the body ran (the body is stopped at that moment), converted to `E`.
    pub async fn run<F, Fut, T, E>(self, body: F) -> Result<T, E>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        self.run_nested(body)
            .await
            .unwrap_or_else(|e| Err(E::from(e)))
    }

    /// [`run`](Self::run) for a body of any output, returned as it is inside the lock's own
    /// `Result` (see [`LockRequest::run_nested`](crate::LockRequest::run_nested)).
    ///
    /// # Errors
    /// The errors of acquiring, and [`ErrorKind::Lost`] when the hold was lost while the body
    /// ran: the body is stopped (dropped) at that moment.
    pub async fn run_nested<F, Fut, T>(self, body: F) -> Result<T, LockError>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let core = self.acquire_core().await?;
        let held = Held::of(&core);
        context::run_body(vec![core], OnLost::Fail, Box::pin(body(held))).await
    }

    /// Acquires and returns the engine's guard of the hold, for a locked body ([`run`](Self::run),
    /// the attribute's `kind = "read"` / `"write"`).
    pub(crate) fn acquire_core(
        self,
    ) -> impl Future<Output = Result<Guard, LockError>> + Send + 'static {
        let (acquiring, lease, wait, checked) = self.prepared();
        match checked {
            Ok(()) => Either::Left(acquiring.run(lease, wait)),
            Err(e) => Either::Right(std::future::ready(Err(e))),
        }
    }

    /// The acquire this request makes, its lease and wait, and whether it is refused before
    /// anything is sent.
    fn prepared(
        self,
    ) -> (
        Acquiring,
        Option<Duration>,
        Option<Duration>,
        Result<(), LockError>,
    ) {
        let names = names(self.engine, &self.key);
        let acquiring =
            Acquiring::new(self.engine, self.kind, names, self.owner).with_label(self.metric_label);
        // read -> write: the owner's own read share would keep its write waiting forever
        let upgrade = self.kind == &WRITE
            && acquiring.owner().is_some_and(|owner| {
                let Ok(names) = self::names(self.engine, &self.key) else {
                    return false;
                };
                acquiring
                    .inner()
                    .local
                    .held_kinds(&names.lock, &acquiring.inner().owner_field(owner))
                    .iter()
                    .any(|k| **k == READ)
            });
        let checked = if upgrade {
            Err(LockError::new(
                ErrorKind::WouldDeadlock,
                format!(
                    "write lock `{}` asked for by an owner that holds it for reading: an \
                     upgrade would wait for its own read share forever. Release the read \
                     lock first, or take the write lock from the start (a read inside a \
                     write is fine)",
                    self.key
                ),
            )
            .with_key(&self.key))
        } else {
            Ok(())
        };
        (acquiring, self.lease, self.wait, checked)
    }
}

impl<'a, G: Send + 'static> IntoFuture for RwRequest<'a, G> {
    type Output = Result<G, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let guard = self.guard;
        let (acquiring, lease, wait, checked) = self.prepared();
        acquiring.wrapped(lease, wait, checked, guard)
    }
}

impl<G> fmt::Debug for RwRequest<'_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwRequest")
            .field("kind", &self.kind.noun)
            .field("key", &self.key)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("owner", &self.owner)
            .finish()
    }
}

/// A read hold: shared with other readers, excluding writers. From [`LockService::read`](crate::LockService::read).
///
/// Each reader's hold has its own lease (or the watchdog's): a crashed reader's share runs out
/// without touching the others. Dropping the guard releases the share in the background.
///
/// Its fencing token is its own, issued for it: larger than the token of every write granted
/// before it, never a write grant's (a read inside a write of the same owner shares the
/// write's). A read share does not make fenced writes: it is not
/// [`Fenced`](crate::fenced::Fenced) (see [`fenced`](crate::fenced#read-holds-do-not-write)).
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let read = locks.read("catalog:7").await?; // other readers may hold it too
/// // ... read the catalog ...
/// read.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the read lock at once"]
pub struct ReadGuard {
    core: Guard,
}

impl ReadGuard {
    super::guard_methods!("read lock", "locks.read(\"catalog:7\")");
}

/// A write hold: excludes readers and other writers. From [`LockService::write`](crate::LockService::write).
///
/// Its fencing token strictly increases with every write grant of the key. Dropping the guard
/// releases it in the background.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let write = locks.write("catalog:7").await?; // alone: no reader, no other writer
/// let token = write.fence(); // for fenced writes
/// # let _ = token;
/// write.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the write lock at once"]
pub struct WriteGuard {
    core: Guard,
}

impl WriteGuard {
    super::guard_methods!("write lock", "locks.write(\"catalog:7\")");
}

impl fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReadGuard").field(&self.core).finish()
    }
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WriteGuard").field(&self.core).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::inspect::{lock_info, raw_state};

    #[test]
    fn a_read_write_lock_keeps_leases_per_hold() {
        let s = raw_state(
            &[
                (
                    "r:01",
                    "1002000 999000000 web-1~0123456789abcdef0123456789abcdef:req-1#1",
                ),
                (
                    "r:02",
                    "1005000 79 web-2~0123456789abcdef0123456789abcdef:job#4",
                ),
                (
                    "r:03",
                    "999000 70 web-3~0123456789abcdef0123456789abcdef:gone#1",
                ), // ran out, not cleaned up yet
                ("w:web-4~0123456789abcdef0123456789abcdef:req-9#2", "04"),
                (":wexp", "1001000"),
                (":fence", "998000000"),
            ],
            5_000,
        );
        let info = lock_info(&LAYOUT, "k", "lock:rw:{k}", s, |_| None);
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
        assert_eq!(info.fence, Some(998_000_000));
        assert_eq!(info.hold_count, 3);
        assert_eq!(
            info.holder.as_deref(),
            Some("web-4~0123456789abcdef0123456789abcdef:req-9#2")
        );
        // who and since when, from the owner fields and the tokens (server time 1,000,000 ms)
        assert_eq!(info.holders[0].instance_name.as_deref(), Some("web-4"));
        assert_eq!(info.holders[0].held_for, Some(Duration::from_secs(2)));
        assert_eq!(info.holders[2].held_for, Some(Duration::from_secs(1)));

        // a write hold that ran out is no holder, and its token is not current
        let s = raw_state(
            &[("w:i4:x", "04"), (":wexp", "999999"), (":fence", "7")],
            10,
        );
        let info = lock_info(&LAYOUT, "k", "lock:rw:{k}", s, |_| None);
        assert!(info.holders.is_empty());
        assert_eq!((info.fence, info.holder), (None, None));
    }
}
