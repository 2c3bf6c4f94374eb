//! The semaphore: at most N permits held cluster-wide, each grant with its own lease (or the
//! watchdog's), so a crashed holder's permits come back. Key layout: the hash
//! `<prefix>sem:{<name>}` (see `kinds/semaphore/semaphore.lua`), the fence counter of its slot,
//! `<key>:wq` (services waiting), the channel `<key>:ch`. Scripts: `kinds/semaphore/`.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use super::{Acquiring, KindEntry};
use crate::engine::{Engine, Guard, KeyNames, Kind};
use crate::error::{ErrorKind, LockError};
use crate::inspect::{Holder, Layout, LocalGuards, LockInfo, RawState};
use crate::scripts::{self, ScriptCall};
use crate::vocab::{HoldMode, LockKind};

static RENEW: LazyLock<Script> =
    LazyLock::new(|| scripts::renew(&[include_str!("semaphore/renew.lua")]));
static AVAILABLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("semaphore/available.lua")));

/// A permit grant as the engine sees it: grants coexist; a release hands its permits to the
/// next waiter of its service in the same call when they fit (and the service holds no more
/// than its share while other services wait), so a permit is never idle between the release
/// and the next grant. Only the head of a line asks Redis (a release that frees permits wakes
/// it, and each waiter granted wakes the next); after a refusal with nothing free, the line
/// waits for a hand-off or a wake-up. A head refused while some permits are free - too few for
/// its request, maybe enough for a smaller one - lets the waiter behind it try, and so on down
/// the line.
pub(crate) static SEMAPHORE: Kind = Kind {
    id: 3,
    noun: "semaphore",
    mode: HoldMode::Permits,
    busy: "all its permits are held",
    lua_first: "",
    lua: &[include_str!("semaphore/semaphore.lua")],
    renew: &RENEW,
    shared: true,
    joint: false,
    reentrant: false,
    leave: None,
    hand_off: true,
    leaves_on_grant: false,
    fourth_key: None,
    extra_arg: true,
};

/// How `inspect` reads a semaphore: the hash `<prefix>sem:{<name>}`, `:n` -> the permit count
/// of the latest acquirer, `p:<grant>` -> `<expiry> <permits> @<token> <owner>` per grant.
pub(crate) static LAYOUT: Layout = Layout {
    kind: LockKind::Semaphore,
    namespace: "sem:",
    decode,
};

/// The semaphore in the table of kinds.
pub(crate) static ENTRY: KindEntry = KindEntry {
    layout: &LAYOUT,
    holds: &[&SEMAPHORE],
};

fn decode(info: &mut LockInfo, state: &RawState, _local: LocalGuards<'_>) {
    for (field, value) in &state.fields {
        if field == ":n" {
            info.permits = value.parse().ok();
            continue;
        }
        if field.strip_prefix("p:").is_none() {
            continue;
        }
        let mut parts = value.splitn(3, ' ');
        let (Some(expiry), Some(permits), Some(rest)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Some(lease_left) = state.left(expiry) else {
            continue;
        };
        // '@<token> <owner>', or an older version's '<owner>'
        let (token, owner) = match rest.strip_prefix('@').and_then(|r| r.split_once(' ')) {
            Some((token, owner)) => (token.parse().ok(), owner),
            None => (None, rest),
        };
        let mut holder = Holder::new(owner, HoldMode::Permits);
        holder.lease_left = Some(lease_left);
        holder.permits = permits.parse().ok();
        if let Some(token) = token {
            holder.granted_by_token(token, state);
        }
        info.holders.push(holder);
    }
}

/// A distributed semaphore with expiring permits, from [`LockService::semaphore`](crate::LockService::semaphore).
///
/// At most [`permits`](Self::permits) permits are held at any time across every service using
/// the same name. Each acquire is a grant of its own (permits are not re-entrant) with its own
/// lease, or the watchdog's when none is given; a holder that crashes gives its permits back
/// when its lease runs out. Waiters sleep until a release wakes them (no polling).
///
/// The number of permits is each caller's: a grant is made when the permits held plus the ones
/// asked for fit in the caller's count. Services that disagree (say, during a deploy that
/// changes it) each enforce their own count; lowering it never takes permits back, it only
/// stops new grants until enough are released.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
///
/// let renders = locks.semaphore("pdf-render", 4); // 4 permits cluster-wide
/// let permit = renders
///     .acquire()
///     .lease(Duration::from_secs(30))
///     .wait(Duration::from_secs(5))
///     .await?;
/// // ... render ...
/// permit.release().await?;
/// println!("{} free", renders.available().await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    engine: Arc<Engine>,
    name: String,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(engine: Arc<Engine>, name: String, permits: u32) -> Semaphore {
        Semaphore {
            engine,
            name,
            permits,
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// A request for one permit.
    pub fn acquire(&self) -> PermitRequest<'_> {
        self.acquire_many(1)
    }

    /// A request for `n` permits at once (one grant: all of them or none).
    pub fn acquire_many(&self, n: u32) -> PermitRequest<'_> {
        PermitRequest {
            semaphore: self,
            count: n,
            lease: None,
            wait: None,
            metric_label: crate::metrics::OTHER,
        }
    }

    /// How many permits are free now (negative when more are held than this count allows,
    /// after another service used a larger count).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`], [`ErrorKind::InvalidArgument`] (no permits) or
    /// [`ErrorKind::Backend`].
    pub async fn available(&self) -> Result<i64, LockError> {
        let names = self.names()?;
        self.check(1)?;
        let mut call = ScriptCall::new(&AVAILABLE, 1);
        call.key(&names.lock).arg(self.permits);
        self.engine.backend.run("available", &call).await
    }

    fn names(&self) -> Result<KeyNames, LockError> {
        self.engine.names(LAYOUT.namespace, &self.name)
    }

    fn check(&self, n: u32) -> Result<(), LockError> {
        if self.permits == 0 || n == 0 || n > self.permits {
            return Err(LockError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "semaphore `{}` asked for {n} of {} permits: a semaphore has at least one \
                     permit, and a request asks for 1 to all of them",
                    self.name, self.permits
                ),
            )
            .with_key(&self.name));
        }
        Ok(())
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish()
    }
}

/// A request for permits, from [`Semaphore::acquire`] or [`Semaphore::acquire_many`]; awaiting
/// it acquires.
///
/// # Cancel safety
/// Dropping the future at any point never leaves permits held past their lease: a grant that
/// arrives after the future was dropped is released at once.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
///
/// let renders = locks.semaphore("pdf-render", 4);
/// let two = renders.acquire_many(2).lease(Duration::from_secs(60)).wait(Duration::from_secs(5)).await?;
/// two.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a permit request does nothing until it is awaited"]
pub struct PermitRequest<'a> {
    semaphore: &'a Semaphore,
    count: u32,
    lease: Option<Duration>,
    wait: Option<Duration>,
    metric_label: &'static str,
}

impl PermitRequest<'_> {
    super::request_methods!("permit", "locks.semaphore(\"pdf-render\", 4).acquire()");
}

impl<'a> IntoFuture for PermitRequest<'a> {
    type Output = Result<Permit, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let sem = self.semaphore;
        let checked = sem.check(self.count);
        let acquiring = Acquiring::new(&sem.engine, &SEMAPHORE, sem.names(), None)
            .with_extra(format!("{} {}", self.count, sem.permits))
            .with_label(self.metric_label);
        let (lease, wait, count) = (self.lease, self.wait, self.count);
        acquiring.wrapped(lease, wait, checked, move |core| Permit { core, count })
    }
}

impl fmt::Debug for PermitRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitRequest")
            .field("semaphore", &self.semaphore.name)
            .field("count", &self.count)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .finish()
    }
}

/// Permits held, from a [`Semaphore`]. Dropping it releases them in the background.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// let permit = locks.semaphore("pdf-render", 4).acquire().await?;
/// assert_eq!(permit.count(), 1);
/// // ... render ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the permit releases it at once"]
pub struct Permit {
    core: Guard,
    count: u32,
}

impl Permit {
    super::guard_methods!("permit", "locks.semaphore(\"pdf-render\", 4).acquire()");

    /// How many permits this grant holds.
    pub fn count(&self) -> u32 {
        self.count
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("count", &self.count)
            .field("core", &self.core)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::inspect::{lock_info, raw_state};

    #[test]
    fn a_semaphore_lists_grants_with_permits() {
        let s = raw_state(
            &[
                (":n", "4"),
                (
                    "p:01",
                    "1003000 2 @997000000 pdf-1~0123456789abcdef0123456789abcdef:req-7#1",
                ),
                ("p:02", "1001500 1 mesh:batch"),
                (
                    "p:03",
                    "900000 1 pdf-1~0123456789abcdef0123456789abcdef:old#1",
                ),
            ],
            3_000,
        );
        let info = lock_info(&LAYOUT, "pdf", "lock:sem:{pdf}", s, |_| None);
        assert_eq!(info.permits, Some(4));
        assert_eq!(info.holders.len(), 2);
        assert_eq!(info.holders[0].permits, Some(2));
        assert_eq!(info.holders[0].request_id.as_deref(), Some("req-7"));
        assert_eq!(info.holders[0].instance_name.as_deref(), Some("pdf-1"));
        // its token tells its grant time (server time 1,000,000 ms); an older grant has none
        assert_eq!(info.holders[0].held_for, Some(Duration::from_secs(3)));
        assert_eq!(info.holders[1].instance, None);
        assert_eq!(info.holders[1].held_for, None);
        assert_eq!(
            info.holders[1].lease_left,
            Some(Duration::from_millis(1500))
        );
        assert_eq!(info.fence, None);
    }
}
