//! Lock owners: who holds a lock, and when a lock call re-enters a hold instead of waiting.
//!
//! # Re-entry follows one call chain
//!
//! A lock call re-enters a lock that an *enclosing locked body* of the same call chain holds: the
//! body of a `#[distributed_lock]` fn (and any fn it awaits, however deep) re-enters the locks of
//! the annotated fns it runs inside. Everything else excludes: two calls at the same level -
//! concurrent children of one body or one request (`join!`, `join_all`, `select!`), two
//! requests, two tasks - are different chains, even when they share a request id.
//! Concurrent children that re-enter the same enclosing hold take turns: one at a time runs
//! inside it.
//!
//! ```text
//! #[distributed_lock(key = "account:<id>")] transfer(id)   holds account:7 (owner O1)
//! └─ audit(id)      #[distributed_lock(key = "account:<id>")]  re-enters O1's hold
//! settle_batch()    (not locked) joins debit(7), debit(7), debit(7):
//! ├─ debit(7)       owner O2 - gets the lock
//! ├─ debit(7)       owner O3 - waits for O2
//! └─ debit(7)       owner O4 - waits
//! ```
//!
//! A plain [`LockService::lock`](crate::LockService::lock) call opens no body: it re-enters only
//! holds of enclosing locked bodies. Lock calls are not counted per task (as thread-reentrant
//! locks count them per thread), so a second call for the same key made next to a plain guard
//! that is still alive would wait for a guard released only after it returns. Such a call is
//! refused at once with [`ErrorKind::WouldDeadlock`](crate::ErrorKind::WouldDeadlock) (a call
//! that only tries once, `wait(Duration::ZERO)`, is told the lock is busy). The precise
//! rule: it would wait for a guard of this service that a plain lock call (not a locked body's
//! acquire) returned, and that call was made at the same *site* - the same tokio task (or the
//! thread of a `block_on`, which runs no task), the same [`chain`] scope and directly in the same
//! locked body, or outside any - either for the turn of an enclosing body that guard keeps, or
//! for its hold when that hold is renewed for as long as the guard lives (taken without a
//! lease). A hold with a fixed lease ends by itself: a call waits for its lease to run out.
//! That covers
//!
//! - `let g = locks.lock(k).await?; locks.lock(k).await` (outside a body, or an annotated fn
//!   for `k` called next to `g`);
//! - "lock three times" as plain re-entries in one body: inside a `run` body or an annotated fn
//!   holding `k`, `let a = locks.lock(k).await?; let b = locks.lock(k).await?;` - `a` keeps the
//!   body's turn (see above) and `b` would wait for it.
//!
//! To re-enter, make the inner part a locked body - [`run`](crate::LockRequest::run) on the
//! first call, or a `#[distributed_lock]` fn - and lock again inside it; or release the first
//! guard first. A locked body's guard gives up its site: code next to it (a concurrent child)
//! waits for the body. Concurrent children of one task that take *plain* guards of one
//! key directly (`join!` of two `async { locks.lock(k).await ... }` blocks) share a site, which
//! cannot be told from one function locking twice: the one that finds the other's guard in its
//! way is refused the same way. Make them locked bodies, chains of their own ([`chain`]) or
//! tasks, and they take turns.
//!
//! Tasks: `tokio::spawn` starts a new chain. [`spawn`] carries the chain's label and its
//! enclosing holds along, so that a spawned task asking for a lock its parent holds gets
//! [`ErrorKind::WouldDeadlock`](crate::ErrorKind::WouldDeadlock) at once (the parent usually
//! awaits the task) instead of waiting out its whole wait.
//!
//! The web middleware labels each request's chain with the request id: introspection
//! ([`LockInfo::holder`](crate::LockInfo::holder)) and logs show it in the owner,
//! `<request id>#<n>`.
//!
//! # Explicit owners
//!
//! [`scope`] (or [`LockRequest::owner`](crate::LockRequest::owner)) names the owner yourself:
//! every lock call inside it acts as that one owner and re-enters that owner's holds, wherever
//! they are in the scope - also concurrent children's, so they do not exclude each other. Use it
//! when one logical operation must be one owner (for example across processes, with
//! [`OwnerId::across_processes`]).
//!
//! ```
//! use lock_runtime::owner::{self, OwnerId};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let id = OwnerId::new();
//! owner::scope(id.clone(), async move {
//!     assert_eq!(owner::current(), id);
//! })
//! .await;
//! assert!(owner::try_current().is_none());
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static OWNER: OwnerId;
    static CHAIN: Chain;
}

/// The identity of a lock owner.
///
/// On Redis an owner is stored as `<process instance id>:<owner id>`, so equal owner ids in
/// different processes are different owners, except for ids made with
/// [`OwnerId::across_processes`].
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{OwnerId, owner};
///
/// // one owner for two calls: the second re-enters the first's hold
/// let job = OwnerId::new();
/// let first = owner::scope(job.clone(), async { locks.lock("job:7").await }).await?;
/// let again = owner::scope(job, async { locks.lock("job:7").await }).await?;
/// again.release().await?;
/// first.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId {
    id: Arc<str>,
    across_processes: bool,
}

impl OwnerId {
    /// A new random owner id (a UUID v4 in simple form).
    pub fn new() -> Self {
        Self::from(uuid::Uuid::new_v4().simple().to_string())
    }

    /// A new owner for a call that names none: unique in this process (a counter after a
    /// random start, 32 hex digits like [`new`](Self::new)'s), which is all an owner stored as
    /// `<process instance id>:<owner id>` needs, and cheaper than a random UUID per call.
    pub(crate) fn fresh() -> Self {
        static NEXT: LazyLock<(u64, AtomicU64)> =
            LazyLock::new(|| (rand::random(), AtomicU64::new(0)));
        let n = NEXT.1.fetch_add(1, Ordering::Relaxed);
        OwnerId {
            id: hex_id(&[NEXT.0, n]),
            across_processes: false,
        }
    }

    /// An owner that is the same owner in every process: locks it holds in one service are
    /// re-entered by the same id in another (for example one operation's request id passed
    /// along the calls of a trusted service mesh).
    ///
    /// Whoever can choose such an id can enter the critical sections of whoever else uses it:
    /// only build it from ids your own infrastructure assigns, never from raw client input.
    ///
    /// ```
    /// use lock_runtime::OwnerId;
    ///
    /// let here = OwnerId::across_processes("op-7f3a");
    /// assert!(here.is_across_processes());
    /// assert_ne!(here, OwnerId::from("op-7f3a"));
    /// ```
    pub fn across_processes(id: impl Into<String>) -> Self {
        OwnerId {
            id: id.into().into(),
            across_processes: true,
        }
    }

    /// Whether this owner is the same owner in every process.
    pub fn is_across_processes(&self) -> bool {
        self.across_processes
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.id
    }
}

impl Default for OwnerId {
    fn default() -> Self {
        Self::new()
    }
}

impl From<String> for OwnerId {
    fn from(id: String) -> Self {
        OwnerId {
            id: id.into(),
            across_processes: false,
        }
    }
}

impl From<&str> for OwnerId {
    fn from(id: &str) -> Self {
        Self::from(id.to_owned())
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.across_processes {
            ", across processes"
        } else {
            ""
        };
        write!(f, "OwnerId({:?}{kind})", &*self.id)
    }
}

/// Runs `future` with `owner` as the current lock owner.
///
/// Scopes nest: the innermost one wins. The returned future is tokio's named
/// [`TaskLocalFuture`], so middleware can store it without boxing.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{OwnerId, owner};
///
/// let request = OwnerId::from("import-2024-11");
/// owner::scope(request, async {
///     let guard = locks.lock("catalog:7").await?; // held by "import-2024-11"
///     guard.release().await
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub fn scope<F: Future>(owner: OwnerId, future: F) -> TaskLocalFuture<OwnerId, F> {
    OWNER.scope(owner, future)
}

/// The current owner (see [`try_current`]).
///
/// # Panics
/// When there is none: outside any [`scope`] and any locked body. Use [`try_current`] when that
/// can happen.
#[track_caller]
pub fn current() -> OwnerId {
    match try_current() {
        Some(owner) => owner,
        None => panic!(
            "lock_runtime::owner::current() called outside an owner scope and any locked body"
        ),
    }
}

/// The current owner: the explicit one of [`scope`] (or of the web middleware when it trusts
/// request ids as owners), else the owner of the innermost locked body this call runs inside,
/// or `None`.
///
/// ```
/// assert!(lock_runtime::owner::try_current().is_none()); // outside any scope or locked body
/// ```
pub fn try_current() -> Option<OwnerId> {
    OWNER.try_with(OwnerId::clone).ok().or_else(|| {
        CHAIN
            .try_with(|c| {
                c.owner
                    .clone()
                    .or_else(|| c.frames.as_ref().map(|f| f.owner.clone()))
            })
            .ok()
            .flatten()
    })
}

/// Spawns `future` on the current tokio runtime, carrying the caller's lock context along: an
/// explicit owner ([`scope`]) stays the owner, so the task re-enters that owner's locks; a call
/// chain's label stays its label, and a lock the chain holds further up is refused with
/// [`ErrorKind::WouldDeadlock`](crate::ErrorKind::WouldDeadlock) instead of being waited for.
///
/// # Panics
/// When called outside a tokio runtime, like `tokio::spawn`.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let chain = CHAIN.try_with(Chain::across_spawn).ok();
    match (OWNER.try_with(OwnerId::clone).ok(), chain) {
        (Some(owner), Some(chain)) => tokio::spawn(scope(owner, CHAIN.scope(chain, future))),
        (Some(owner), None) => tokio::spawn(scope(owner, future)),
        (None, Some(chain)) => tokio::spawn(CHAIN.scope(chain, future)),
        (None, None) => tokio::spawn(future),
    }
}

/// The lock context of one call chain: its label (the request id, under the web middleware),
/// an explicit owner the middleware set, and the holds of the locked bodies it runs inside.
#[derive(Clone, Default)]
pub(crate) struct Chain {
    /// Which [`chain`] scope this is (0: none).
    id: u64,
    label: Option<Arc<str>>,
    owner: Option<OwnerId>,
    frames: Option<Arc<Frame>>,
    /// The innermost frame inherited through [`spawn`]: it and those above it are held by
    /// another task that may be waiting for this one.
    spawned_below: Option<Arc<Frame>>,
}

/// One locked body of a call chain: the hold it runs under.
pub(crate) struct Frame {
    /// Unique in the process: tells the bodies of a chain apart (see [`Site`]).
    id: u64,
    /// Which service the hold belongs to ([`LockService`](crate::LockService)s are separate
    /// lock domains).
    service: usize,
    lock: Arc<str>,
    owner: OwnerId,
    /// Taken by a call that re-enters this hold, for as long as its guard lives: concurrent
    /// children re-enter one at a time.
    entry: Arc<Entry>,
    parent: Option<Arc<Frame>>,
}

/// The entry of an enclosing hold: whoever re-enters it takes `turn` while its guard lives.
pub(crate) struct Entry {
    pub(crate) turn: Arc<tokio::sync::Mutex<()>>,
    /// Where the plain lock call that holds `turn` was made, while its guard lives (dead for a
    /// locked body's re-entry, see [`Site`]).
    holder: Mutex<Weak<Site>>,
}

impl Entry {
    fn new() -> Arc<Entry> {
        Arc::new(Entry {
            turn: Arc::new(tokio::sync::Mutex::new(())),
            holder: Mutex::new(Weak::new()),
        })
    }

    /// Notes that a call made at `site` holds the turn (for as long as `site` lives).
    pub(crate) fn entered_at(&self, site: Option<&Arc<Site>>) {
        *self.holder.lock().unwrap_or_else(|p| p.into_inner()) =
            site.map_or_else(Weak::new, Arc::downgrade);
    }

    /// Whether a plain lock call made at `site` holds the turn: one more call from there would
    /// wait for itself.
    pub(crate) fn held_at(&self, site: &Site) -> bool {
        let holder = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        holder.upgrade().is_some_and(|held| *held == *site)
    }
}

/// Where a lock call was made: its tokio task (or, for a future that no task runs, such as the
/// one `block_on` or `#[tokio::main]` runs, its thread) and its place in the call chain (the [`chain`]
/// scope and the innermost locked body). A guard that a plain lock call returned keeps its site
/// for as long as it lives (a locked body's guard gives it up: the body is a call chain of its
/// own). Another lock call made at the same site that would wait for that guard waits for code
/// that runs only after it returns: it is refused with
/// [`ErrorKind::WouldDeadlock`](crate::ErrorKind::WouldDeadlock) instead.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Site {
    runner: Runner,
    chain: u64,
    body: u64,
}

/// What polls a future: a tokio task, or the thread of a `block_on`.
#[derive(Debug, PartialEq, Eq)]
enum Runner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

/// The site of a lock call made now (`None` outside a tokio runtime).
pub(crate) fn site() -> Option<Site> {
    let runner = match tokio::task::try_id() {
        Some(task) => Runner::Task(task),
        None => {
            tokio::runtime::Handle::try_current().ok()?;
            Runner::Thread(std::thread::current().id())
        }
    };
    let (chain, body) = CHAIN
        .try_with(|c| (c.id, c.frames.as_ref().map_or(0, |f| f.id)))
        .unwrap_or((0, 0));
    Some(Site {
        runner,
        chain,
        body,
    })
}

/// A new id for a chain scope or a locked body.
fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// How a lock call without an explicit owner relates to the current call chain.
pub(crate) enum Resolved {
    /// Acquire as this owner (explicit, or fresh for a new hold).
    Owner(OwnerId),
    /// Re-enter the hold of this enclosing body, after taking its entry.
    ReEnter { owner: OwnerId, entry: Arc<Entry> },
    /// The chain holds it across a spawned task.
    AcrossSpawn,
}

impl Chain {
    fn across_spawn(&self) -> Chain {
        Chain {
            spawned_below: self.frames.clone(),
            ..self.clone()
        }
    }
}

/// The owner of a new lock call of `service` on `lock`: an explicit owner, the hold of an
/// enclosing body to re-enter, or a fresh owner labelled with the chain's label.
pub(crate) fn resolve(service: usize, lock: &str) -> Resolved {
    if let Ok(owner) = OWNER.try_with(OwnerId::clone) {
        return Resolved::Owner(owner);
    }
    let Ok(chain) = CHAIN.try_with(Chain::clone) else {
        return Resolved::Owner(OwnerId::fresh());
    };
    if let Some(owner) = chain.owner {
        return Resolved::Owner(owner);
    }
    let mut across_spawn = false;
    let mut frame = chain.frames.as_ref();
    while let Some(f) = frame {
        if chain
            .spawned_below
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, f))
        {
            across_spawn = true;
        }
        if f.service == service && &*f.lock == lock {
            return match across_spawn {
                true => Resolved::AcrossSpawn,
                false => Resolved::ReEnter {
                    owner: f.owner.clone(),
                    entry: f.entry.clone(),
                },
            };
        }
        frame = f.parent.as_ref();
    }
    Resolved::Owner(fresh_owner(chain.label.as_deref()))
}

/// `words` (two at most) as one id of 16 lowercase hex digits each (owner and grant ids),
/// written without the formatting machinery into the id's one allocation: ids are made on every
/// lock call.
pub(crate) fn hex_id(words: &[u64]) -> Arc<str> {
    let mut digits = [0u8; 32];
    let len = 16 * words.len();
    for (word, out) in words.iter().zip(digits[..len].chunks_exact_mut(16)) {
        for (i, digit) in out.iter_mut().enumerate() {
            *digit = b"0123456789abcdef"[((word >> (4 * (15 - i))) & 0xf) as usize];
        }
    }
    Arc::from(std::str::from_utf8(&digits[..len]).expect("hex digits are ASCII"))
}

/// A new owner for a new hold: `<label>#<n>` when the chain has a label, else a fresh one.
fn fresh_owner(label: Option<&str>) -> OwnerId {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    match label {
        Some(label) => OwnerId::from(format!(
            "{label}#{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )),
        None => OwnerId::fresh(),
    }
}

/// Runs `future` as a new call chain labelled `label` (for example a job or message id): the
/// locks it takes are held by owners `<label>#<n>`, which introspection and logs show. The web
/// middleware does this for every request, with the request id.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use lock_runtime::owner;
///
/// owner::chain("nightly-report", async {
///     // lock calls here: owners "nightly-report#1", "nightly-report#2", ...
/// })
/// .await;
/// # }
/// ```
pub fn chain<F: Future>(label: impl Into<String>, future: F) -> impl Future<Output = F::Output> {
    chain_scope(Some(label.into().into()), None, future)
}

/// The request id (the call chain's label) an owner id was made for: `req-42` for the owner
/// `req-42#3` that [`chain`] or the web middleware gives a new hold; `None` for an owner of
/// another form (a random id, an explicit one without `#<n>`).
///
/// ```
/// use lock_runtime::owner;
///
/// assert_eq!(owner::request_id_of("req-42#3"), Some("req-42"));
/// assert_eq!(owner::request_id_of("a#b#12"), Some("a#b"));
/// assert_eq!(owner::request_id_of("5f0c9e2a"), None);
/// assert_eq!(owner::request_id_of("#7"), None);
/// ```
pub fn request_id_of(owner: &str) -> Option<&str> {
    let (label, n) = owner.rsplit_once('#')?;
    let counted = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    (counted && !label.is_empty()).then_some(label)
}

/// Runs `future` as a new call chain labelled `label`, with `owner` as its explicit owner if
/// given (the web middleware, per request).
pub(crate) fn chain_scope<F: Future>(
    label: Option<Arc<str>>,
    owner: Option<OwnerId>,
    future: F,
) -> TaskLocalFuture<Chain, F> {
    CHAIN.scope(
        Chain {
            id: next_id(),
            label,
            owner,
            frames: None,
            spawned_below: None,
        },
        future,
    )
}

/// Runs `future` as the locked body of holds, each given as `(service, lock, owner)` (one, or
/// the locks of a multi-key hold): lock calls in it re-enter any of them.
pub(crate) fn bodies_scope<F: Future>(
    holds: impl IntoIterator<Item = (usize, Arc<str>, OwnerId)>,
    future: F,
) -> TaskLocalFuture<Chain, F> {
    let mut chain = CHAIN.try_with(Chain::clone).unwrap_or_default();
    for (service, lock, owner) in holds {
        chain.frames = Some(Arc::new(Frame {
            id: next_id(),
            service,
            lock,
            owner,
            entry: Entry::new(),
            parent: chain.frames.take(),
        }));
    }
    CHAIN.scope(chain, future)
}

/// The owners of the locked bodies this call chain runs inside, innermost first (for
/// `is_held_by_current`).
pub(crate) fn enclosing(service: usize, lock: &str) -> Option<OwnerId> {
    match resolve(service, lock) {
        Resolved::Owner(owner) if OWNER.try_with(|_| ()).is_ok() => Some(owner),
        Resolved::Owner(owner) if CHAIN.try_with(|c| c.owner.is_some()).unwrap_or(false) => {
            Some(owner)
        }
        Resolved::ReEnter { owner, .. } => Some(owner),
        _ => None,
    }
}

/// The random id of this process, the first half of every owner field on Redis.
pub(crate) fn process_instance() -> &'static str {
    static INSTANCE: LazyLock<String> = LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());
    &INSTANCE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_ids_are_16_digits_per_word() {
        assert_eq!(&*hex_id(&[0xab]), "00000000000000ab");
        assert_eq!(
            &*hex_id(&[u64::MAX, 0x0123_4567_89ab_cdef]),
            "ffffffffffffffff0123456789abcdef"
        );
        assert_eq!(&*hex_id(&[]), "");
    }

    #[test]
    fn fresh_owners_are_distinct_and_look_like_new_ones() {
        let a = OwnerId::fresh();
        let b = OwnerId::fresh();
        assert_ne!(a, b);
        for id in [&a, &b, &OwnerId::new()] {
            assert_eq!(id.as_str().len(), 32, "{id}");
            assert!(id.as_str().bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
            assert!(!id.is_across_processes());
        }
        // the same process start, another count
        assert_eq!(a.as_str()[..16], b.as_str()[..16]);
    }

    #[tokio::test]
    async fn scopes_nest_and_spawn_passes_the_owner_on() {
        let outer = OwnerId::from("outer");
        scope(outer.clone(), async {
            assert_eq!(current(), outer);
            scope("inner".into(), async {
                assert_eq!(current().as_str(), "inner")
            })
            .await;
            assert_eq!(current(), outer);
            let seen = spawn(async { try_current() }).await.unwrap();
            assert_eq!(seen, Some(outer.clone()));
            let plain = tokio::spawn(async { try_current() }).await.unwrap();
            assert_eq!(plain, None);
        })
        .await;
        assert!(try_current().is_none());
    }

    #[test]
    #[should_panic(expected = "outside an owner scope")]
    fn current_panics_outside_a_scope() {
        current();
    }
}
