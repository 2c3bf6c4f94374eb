//! Lock owners: who holds a lock, carried in a tokio task-local.
//!
//! A lock is held by an *owner*. Inside one owner's scope, taking a lock that the owner already
//! holds re-enters it (the hold count goes up) instead of waiting for itself; other owners wait.
//! Outside any scope every [`LockService::lock`](crate::LockService::lock) call gets a fresh
//! owner, so two calls exclude each other even in the same task.
//!
//! Web middleware opens one scope per request; annotated fns open one when none is open, so that
//! nested locked calls in the same call chain re-enter. `tokio::spawn` does not inherit the
//! scope: use [`spawn`] (or [`scope`] with [`current`]) when the spawned task should act as the
//! same owner.
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
use std::sync::{Arc, LazyLock};

use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static OWNER: OwnerId;
}

/// The identity of a lock owner.
///
/// On Redis an owner is stored as `<process instance id>:<owner id>`, so equal owner ids in
/// different processes are different owners, except for ids made with
/// [`OwnerId::across_processes`].
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
pub fn scope<F: Future>(owner: OwnerId, future: F) -> TaskLocalFuture<OwnerId, F> {
    OWNER.scope(owner, future)
}

/// The current owner.
///
/// # Panics
/// Outside any [`scope`]. Use [`try_current`] when that can happen.
#[track_caller]
pub fn current() -> OwnerId {
    match try_current() {
        Some(owner) => owner,
        None => panic!("lock_runtime::owner::current() called outside an owner scope"),
    }
}

/// The current owner, or `None` outside any [`scope`].
pub fn try_current() -> Option<OwnerId> {
    OWNER.try_with(OwnerId::clone).ok()
}

/// Spawns `future` on the current tokio runtime inside the current owner's scope (or without a
/// scope when there is none), so that the spawned task re-enters the caller's locks.
///
/// # Panics
/// When called outside a tokio runtime, like `tokio::spawn`.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match try_current() {
        Some(owner) => tokio::spawn(scope(owner, future)),
        None => tokio::spawn(future),
    }
}

/// The random id of this process, the first half of every owner field on Redis.
pub(crate) fn process_instance() -> &'static str {
    static INSTANCE: LazyLock<String> = LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());
    &INSTANCE
}

/// The owner for a new lock call: the scope's, or a fresh one outside any scope.
pub(crate) fn current_or_new() -> OwnerId {
    try_current().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_ne!(current_or_new(), current_or_new());
    }

    #[test]
    #[should_panic(expected = "outside an owner scope")]
    fn current_panics_outside_a_scope() {
        current();
    }
}
