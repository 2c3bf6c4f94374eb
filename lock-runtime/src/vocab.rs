//! The words every layer shares: the kinds of lock ([`LockKind`]), what a hold holds
//! ([`HoldMode`]) and why a hold was lost ([`LossReason`]), each with its names. One vocabulary:
//! metrics labels, events, introspection, `lockctl` and the attribute's `kind` argument all
//! speak it, so a name is written once, here.

use std::fmt;
use std::str::FromStr;

use crate::error::{ErrorKind, LockError};

/// The longest lease a lock can be taken for (about ten years): longer ones are refused before
/// anything is written, and a longer `lock.watchdog_timeout` is refused when the configuration
/// is loaded.
pub(crate) const MAX_LEASE_MS: u64 = 3650 * 24 * 3600 * 1000;

/// The kinds of lock, each in a namespace of its own on Redis: the mutex `key` is
/// `<prefix>{key}`, the read-write lock `key` is `<prefix>rw:{key}`, the semaphore `name` is
/// `<prefix>sem:{name}`. The same key names three different locks.
///
/// ```
/// use lock_runtime::LockKind;
///
/// assert_eq!(LockKind::ReadWrite.as_str(), "rw");
/// assert_eq!("semaphore".parse::<LockKind>().unwrap(), LockKind::Semaphore);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LockKind {
    /// [`LockService::lock`](crate::LockService::lock) (and each key of
    /// [`LockService::lock_all`](crate::LockService::lock_all)).
    Mutex,
    /// [`LockService::read`](crate::LockService::read) and
    /// [`LockService::write`](crate::LockService::write).
    ReadWrite,
    /// [`LockService::semaphore`](crate::LockService::semaphore).
    Semaphore,
}

impl LockKind {
    /// Every kind.
    pub const ALL: [LockKind; 3] = [LockKind::Mutex, LockKind::ReadWrite, LockKind::Semaphore];

    /// The short name: `mutex`, `rw` or `semaphore` (what [`FromStr`] reads back).
    pub const fn as_str(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::ReadWrite => "rw",
            LockKind::Semaphore => "semaphore",
        }
    }

    /// What a lock of this kind is called in sentences: `mutex`, `read-write lock` or
    /// `semaphore`.
    ///
    /// ```
    /// use lock_runtime::LockKind;
    ///
    /// assert_eq!(LockKind::ReadWrite.noun(), "read-write lock");
    /// ```
    pub const fn noun(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::ReadWrite => "read-write lock",
            LockKind::Semaphore => "semaphore",
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

/// What a hold holds: of which [`LockKind`], and how.
///
/// ```
/// use lock_runtime::{HoldMode, LockKind};
///
/// assert!(HoldMode::Write.is_exclusive() && !HoldMode::Read.is_exclusive());
/// assert_eq!(HoldMode::Read.kind(), LockKind::ReadWrite);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldMode {
    /// A mutex.
    Exclusive,
    /// The write hold of a read-write lock.
    Write,
    /// A read hold of a read-write lock (readers share it).
    Read,
    /// Permits of a semaphore ([`Holder::permits`](crate::Holder::permits) says how many).
    Permits,
}

impl HoldMode {
    /// Every mode.
    pub const ALL: [HoldMode; 4] = [
        HoldMode::Exclusive,
        HoldMode::Write,
        HoldMode::Read,
        HoldMode::Permits,
    ];

    /// `exclusive`, `write`, `read` or `permits`.
    pub const fn as_str(self) -> &'static str {
        match self {
            HoldMode::Exclusive => "exclusive",
            HoldMode::Write => "write",
            HoldMode::Read => "read",
            HoldMode::Permits => "permits",
        }
    }

    /// The short name of the request that takes such a hold: `lock` (a mutex, also each key of
    /// [`LockService::lock_all`](crate::LockService::lock_all)), `read`, `write` or
    /// `semaphore`. It is the `kind` label of [metrics](crate::metrics) and the value of the
    /// attribute's `kind = ".."` argument (which takes `lock`, `read` and `write`).
    ///
    /// ```
    /// use lock_runtime::HoldMode;
    ///
    /// assert_eq!(HoldMode::Exclusive.label(), "lock");
    /// assert_eq!(HoldMode::Permits.label(), "semaphore");
    /// ```
    pub const fn label(self) -> &'static str {
        match self {
            HoldMode::Exclusive => "lock",
            HoldMode::Read => "read",
            HoldMode::Write => "write",
            HoldMode::Permits => "semaphore",
        }
    }

    /// Whether a hold of this mode excludes every other hold of its lock (a mutex, a write
    /// hold).
    pub const fn is_exclusive(self) -> bool {
        matches!(self, HoldMode::Exclusive | HoldMode::Write)
    }

    /// The kind of lock a hold of this mode is of.
    ///
    /// ```
    /// use lock_runtime::{HoldMode, LockKind};
    ///
    /// assert_eq!(HoldMode::Read.kind(), LockKind::ReadWrite);
    /// ```
    pub const fn kind(self) -> LockKind {
        match self {
            HoldMode::Exclusive => LockKind::Mutex,
            HoldMode::Read | HoldMode::Write => LockKind::ReadWrite,
            HoldMode::Permits => LockKind::Semaphore,
        }
    }
}

impl fmt::Display for HoldMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a hold was lost.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) {
/// use lock_runtime::{LockEvent, LossReason};
///
/// let mut events = locks.events();
/// while let Ok(event) = events.recv().await {
///     if let LockEvent::Lost { reason: LossReason::LeaseRanOut, key, .. } = &event {
///         eprintln!("{key}: the lease ran out before the work finished");
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// Its validity deadline passed while it was held: a fixed lease ran out, or the watchdog
    /// could not renew it in time (Redis unreachable). Someone else may hold it now.
    LeaseRanOut,
    /// A renewal, re-entry or extension found it gone on Redis: it expired there, or it was
    /// force-unlocked from another service.
    FoundGone,
    /// This service force-unlocked it ([`LockService::force_unlock`](crate::LockService::force_unlock)).
    ForceUnlocked,
}

impl LossReason {
    /// `lease_ran_out`, `found_gone` or `force_unlocked`: the value of the `reason` label.
    pub const fn as_str(self) -> &'static str {
        match self {
            LossReason::LeaseRanOut => "lease_ran_out",
            LossReason::FoundGone => "found_gone",
            LossReason::ForceUnlocked => "force_unlocked",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::LeaseRanOut => "its lease ran out",
            LossReason::FoundGone => "it was found gone on Redis",
            LossReason::ForceUnlocked => "it was force-unlocked",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_and_names_are_unique() {
        for kind in LockKind::ALL {
            assert_eq!(kind.as_str().parse::<LockKind>().unwrap(), kind);
        }
        let labels: std::collections::HashSet<_> =
            HoldMode::ALL.iter().map(|m| m.label()).collect();
        assert_eq!(labels.len(), HoldMode::ALL.len());
        let names: std::collections::HashSet<_> =
            HoldMode::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(names.len(), HoldMode::ALL.len());
        for kind in LockKind::ALL {
            assert!(HoldMode::ALL.iter().any(|m| m.kind() == kind), "{kind}");
        }
    }
}
