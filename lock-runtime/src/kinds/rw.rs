//! The read-write lock: many readers or one writer. Key layout: the hash
//! `<prefix>rw:{<key>}` (see `scripts/rw/state.lua`: the write hold, each read hold with its own
//! expiry, the current write token), `<lock>:fence` (last token issued), `<lock>:wq` (services
//! waiting), `<lock>:turn` (services with a writer waiting: writer preference), the channel
//! `<lock>:ch`. Scripts: `scripts/rw/`.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::Acquiring;
use crate::engine::{Guard, KeyNames, Kind, owner_field};
use crate::error::{ErrorKind, LockError};
use crate::owner::OwnerId;
use crate::service::LockService;

/// Renews or extends read and write holds by grant id.
static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/rw/renew.lua")));

/// Takes a service off the writers waiting and wakes the readers kept out for them: run by
/// the engine when the service's last waiting writer gives up (a writer that no longer waits
/// must not keep readers out until its registration runs out).
static LEAVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/rw/leave.lua")));

/// The read hold as the engine sees it: shared, taken together by the readers at the front of
/// a line.
pub(crate) static READ: Kind = Kind {
    id: 1,
    noun: "read lock",
    mode: crate::inspect::HoldMode::Read,
    busy: "a writer holds it or waits for it",
    lua: &[
        include_str!("../scripts/rw/state.lua"),
        include_str!("../scripts/rw/read.lua"),
    ],
    renew: &RENEW,
    shared: true,
    joint: true,
    reentrant: true,
    leave: None,
    hand_off: false,
};

/// The write hold as the engine sees it.
pub(crate) static WRITE: Kind = Kind {
    id: 2,
    noun: "write lock",
    mode: crate::inspect::HoldMode::Write,
    busy: "it is held by readers or another writer",
    lua: &[
        include_str!("../scripts/rw/state.lua"),
        include_str!("../scripts/rw/write.lua"),
    ],
    renew: &RENEW,
    shared: false,
    joint: false,
    reentrant: true,
    leave: Some(&LEAVE),
    hand_off: false,
};

/// The namespace of read-write locks: `rw:{key}` never names a mutex (`{key}`).
const NAMESPACE: &str = "rw:";

pub(crate) fn names(service: &LockService, key: &str) -> Result<KeyNames, LockError> {
    KeyNames::in_namespace(service.config().prefix(), NAMESPACE, key).map_err(|e| e.with_key(key))
}

/// A request for a read or write hold, built by [`LockService::read`] or
/// [`LockService::write`]; awaiting it acquires.
///
/// # Cancel safety
/// Dropping the future at any point never leaves the hold past its lease: a grant that arrives
/// after the future was dropped is released at once.
#[must_use = "a lock request does nothing until it is awaited"]
pub struct RwRequest<'a, G> {
    service: &'a LockService,
    kind: &'static Kind,
    key: String,
    lease: Option<Duration>,
    wait: Option<Duration>,
    owner: Option<OwnerId>,
    metric_label: &'static str,
    guard: fn(Guard) -> G,
}

/// A request for a read hold: [`LockService::read`].
pub type ReadRequest<'a> = RwRequest<'a, ReadGuard>;
/// A request for a write hold: [`LockService::write`].
pub type WriteRequest<'a> = RwRequest<'a, WriteGuard>;

impl<'a> ReadRequest<'a> {
    pub(crate) fn read(service: &'a LockService, key: String) -> Self {
        RwRequest {
            service,
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
    pub(crate) fn write(service: &'a LockService, key: String) -> Self {
        RwRequest {
            service,
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
    super::request_methods!("hold");

    /// Acquire as `owner` (see [`owner`](crate::owner#explicit-owners)) instead of following
    /// the call chain.
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Acquires, runs the future `body` returns as a locked body (lock calls inside re-enter
    /// this hold: a read inside a write body is a downgrade), and releases after it, also when
    /// the body panics or the future is dropped. See [`LockRequest::run`](crate::LockRequest::run).
    ///
    /// # Errors
    /// The errors of acquiring, and [`ErrorKind::Lost`] when the hold was lost while the body
    /// ran: the body is stopped (dropped) at that moment.
    pub async fn run<F, Fut, T>(self, body: F) -> Result<T, LockError>
    where
        F: FnOnce(crate::Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let core = self.acquire_core().await?;
        let held = crate::Held::of(&core);
        crate::context::run_body(core, crate::context::OnLost::Fail, body(held)).await
    }

    /// Acquires and returns the engine's guard of the hold, for a locked body ([`run`](Self::run),
    /// the attribute's `kind = "read"` / `"write"`).
    pub(crate) fn acquire_core(
        self,
    ) -> impl Future<Output = Result<Guard, LockError>> + Send + 'static {
        let names = names(self.service, &self.key);
        let acquiring = Acquiring::new(self.service, self.kind, names, self.owner)
            .with_label(self.metric_label);
        // read -> write: the owner's own read share would keep its write waiting forever
        let upgrade = self.kind == &WRITE
            && acquiring.owner().is_some_and(|owner| {
                let Ok(names) = self::names(self.service, &self.key) else {
                    return false;
                };
                acquiring
                    .inner()
                    .local
                    .held_kinds(&names.lock, &owner_field(owner))
                    .iter()
                    .any(|k| **k == READ)
            });
        let (lease, wait, key) = (self.lease, self.wait, self.key);
        async move {
            if upgrade {
                return Err(LockError::new(
                    ErrorKind::WouldDeadlock,
                    format!(
                        "write lock `{key}` asked for by an owner that holds it for reading: an \
                         upgrade would wait for its own read share forever. Release the read \
                         lock first, or take the write lock from the start (a read inside a \
                         write is fine)"
                    ),
                )
                .with_key(&key));
            }
            acquiring.run(lease, wait).await
        }
    }
}

impl<'a, G: Send + 'static> IntoFuture for RwRequest<'a, G> {
    type Output = Result<G, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let guard = self.guard;
        let acquire = self.acquire_core();
        Box::pin(async move { acquire.await.map(guard) })
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

/// A read hold: shared with other readers, excluding writers. From [`LockService::read`].
///
/// Each reader's hold has its own lease (or the watchdog's): a crashed reader's share runs out
/// without touching the others. Dropping the guard releases the share in the background.
#[must_use = "dropping the guard releases the read lock at once"]
pub struct ReadGuard {
    core: Guard,
}

impl ReadGuard {
    super::guard_methods!("read lock");
}

/// A write hold: excludes readers and other writers. From [`LockService::write`].
///
/// Its fencing token strictly increases with every write grant of the key. Dropping the guard
/// releases it in the background.
#[must_use = "dropping the guard releases the write lock at once"]
pub struct WriteGuard {
    core: Guard,
}

impl WriteGuard {
    super::guard_methods!("write lock");
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
