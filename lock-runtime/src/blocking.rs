//! The locks for synchronous code - CLI tools, sync workers, diesel-sync applications - in the
//! convention of `reqwest::blocking`: the same locks with methods that block the calling thread
//! until Redis answered, driven by a runtime thread of this crate (the caller needs none).
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_runtime::blocking::LockService;
//! use lock_runtime::LockConfig;
//!
//! # fn main() -> Result<(), lock_runtime::LockError> {
//! let locks = LockService::connect(LockConfig::single("redis://127.0.0.1:6379"))?;
//! let guard = locks
//!     .lock("report:nightly")
//!     .lease(Duration::from_secs(60))
//!     .try_once() // another instance runs it: Err(kind Timeout)
//!     .acquire()?;
//! // ... the critical section; guard.fence() is the fencing token ...
//! guard.release()?;
//! # Ok(()) }
//! ```
//!
//! - **Owners are threads**: every call of one thread acts as that thread's owner, so a thread
//!   that holds a lock re-enters it (a hold count, as Redisson's locks count per thread), and
//!   another thread waits for it.
//! - **Guards** release on drop, in the background, as the async ones do; `release()` blocks
//!   until Redis confirmed. Leases, the watchdog, fencing tokens, `extend`, `is_lost` and
//!   `valid_until` are those of the async guards ([`into_async`](LockGuard::into_async) gives
//!   the async guard itself).
//! - **Not from async code**: a blocking call made on a thread that runs a tokio runtime would
//!   stall that runtime; it is refused with [`ErrorKind::InvalidArgument`] instead. Use the
//!   async [`LockService`](crate::LockService) there.
//! - [`LockService::global`] is the process-wide service the attribute uses (set up by
//!   [`init`](crate::init), or from `lock.toml`), for sync code in an async application.
//!
//! Needs the `blocking` feature.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::config::LockConfig;
use crate::error::{ErrorKind, LockError};
use crate::inspect::LockInfo;
use crate::owner::{self, OwnerId};

thread_local! {
    /// The owner of every blocking call made on this thread.
    static THREAD_OWNER: OwnerId = OwnerId::new();
}

/// Runs `future` to its end on this crate's runtime thread's runtime, blocking the caller; as
/// this thread's owner.
fn block_on<F: Future>(future: F) -> Result<F::Output, LockError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(LockError::new(
            ErrorKind::InvalidArgument,
            "a blocking lock call was made from async code (a thread running a tokio runtime), \
             where it would stall the runtime: use the async lock_runtime::LockService there",
        ));
    }
    let owner = THREAD_OWNER.with(Clone::clone);
    Ok(crate::driver::block_on(owner::scope(owner, future)))
}

/// [`crate::LockService`] for synchronous code: each call blocks until Redis answered. Cheap to
/// clone; clones share the connections.
///
/// ```no_run
/// # fn main() -> Result<(), lock_runtime::LockError> {
/// let locks = lock_runtime::blocking::LockService::connect(lock_runtime::LockConfig::from_file("lock.toml")?)?;
/// let guard = locks.lock("report:nightly").acquire()?;
/// guard.release()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LockService {
    inner: crate::LockService,
}

impl LockService {
    /// Connects as [`crate::LockService::connect`] does, on this crate's runtime thread.
    ///
    /// # Errors
    /// As [`crate::LockService::connect`]; [`ErrorKind::InvalidArgument`] from async code.
    pub fn connect(config: LockConfig) -> Result<LockService, LockError> {
        let inner = block_on(crate::LockService::connect(config))??;
        Ok(LockService { inner })
    }

    /// The process-wide service of [`crate::global`]: the one `init` set up, else connected
    /// from the config file on first use.
    ///
    /// # Errors
    /// As [`crate::global`]; [`ErrorKind::InvalidArgument`] from async code.
    pub fn global() -> Result<LockService, LockError> {
        let inner = block_on(crate::global())??;
        Ok(LockService {
            inner: inner.clone(),
        })
    }

    /// Starts a request for the mutex `key` (see [`crate::LockService::lock`]); `acquire()` it.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        LockRequest(self.inner.lock(key))
    }

    /// Starts a request for a read hold of the read-write lock `key` (see
    /// [`crate::LockService::read`]).
    pub fn read(&self, key: impl Into<String>) -> ReadRequest<'_> {
        ReadRequest(self.inner.read(key))
    }

    /// Starts a request for the write hold of the read-write lock `key` (see
    /// [`crate::LockService::write`]).
    pub fn write(&self, key: impl Into<String>) -> WriteRequest<'_> {
        WriteRequest(self.inner.write(key))
    }

    /// The semaphore `name` with `permits` permits (see [`crate::LockService::semaphore`]).
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Semaphore {
        Semaphore(self.inner.semaphore(name, permits))
    }

    /// Whether anyone holds the mutex `key`.
    ///
    /// # Errors
    /// As [`crate::LockService::is_locked`].
    pub fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        block_on(self.inner.is_locked(key))?
    }

    /// Who holds the mutex `key` (see [`crate::LockService::inspect`]).
    ///
    /// # Errors
    /// As [`crate::LockService::inspect`].
    pub fn inspect(&self, key: &str) -> Result<LockInfo, LockError> {
        block_on(self.inner.inspect(key))?
    }

    /// Removes the mutex `key` whoever holds it (see [`crate::LockService::force_unlock`]).
    ///
    /// # Errors
    /// As [`crate::LockService::force_unlock`].
    pub fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        block_on(self.inner.force_unlock(key))?
    }

    /// Releases everything this service holds and refuses new requests (see
    /// [`crate::LockService::shutdown`]).
    ///
    /// # Errors
    /// As [`crate::LockService::shutdown`].
    pub fn shutdown(&self) -> Result<(), LockError> {
        block_on(self.inner.shutdown())?
    }

    /// The async service these calls go to (for the async parts of an application).
    pub fn as_async(&self) -> &crate::LockService {
        &self.inner
    }
}

/// A request's options (lease, wait, label) and `acquire`, blocking.
macro_rules! blocking_request {
    ($(#[$doc:meta])* $name:ident, $inner:ty, $guard:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        #[must_use = "a request does nothing until it is acquired"]
        pub struct $name<'a>($inner);

        impl $name<'_> {
            /// Hold it for at most `lease` (without: the watchdog renews it until released).
            ///
            /// ```no_run
            /// # fn demo(locks: lock_runtime::blocking::LockService) -> Result<(), lock_runtime::LockError> {
            /// use std::time::Duration;
            ///
            /// let guard = locks.lock("report").lease(Duration::from_secs(60)).acquire()?;
            /// guard.release()?;
            /// # Ok(()) }
            /// ```
            pub fn lease(self, lease: Duration) -> Self {
                Self(self.0.lease(lease))
            }

            /// Give up with [`ErrorKind::Timeout`] when it could not be acquired within `wait`
            /// (without: wait until acquired; `Duration::ZERO` tries once).
            ///
            /// ```no_run
            /// # fn demo(locks: lock_runtime::blocking::LockService) -> Result<(), lock_runtime::LockError> {
            /// use std::time::Duration;
            ///
            /// let guard = locks.lock("report").wait(Duration::from_secs(2)).acquire()?; // Err(kind Timeout) after 2 s
            /// guard.release()?;
            /// # Ok(()) }
            /// ```
            pub fn wait(self, wait: Duration) -> Self {
                Self(self.0.wait(wait))
            }

            /// Try once, without waiting.
            ///
            /// ```no_run
            /// # fn demo(locks: lock_runtime::blocking::LockService) -> Result<(), lock_runtime::LockError> {
            /// use std::time::Duration;
            ///
            /// match locks.lock("report").try_once().acquire() {
            ///     Ok(guard) => guard.release()?,
            ///     Err(e) if e.is_timeout() => {} // another owner has it: skip
            ///     Err(e) => return Err(e),
            /// }
            /// # Ok(()) }
            /// ```
            pub fn try_once(self) -> Self {
                Self(self.0.try_once())
            }

            /// The fixed name of the lock in metrics and events (see
            /// [`crate::LockRequest::metric_label`]).
            ///
            /// ```no_run
            /// # fn demo(locks: lock_runtime::blocking::LockService) -> Result<(), lock_runtime::LockError> {
            /// use std::time::Duration;
            ///
            /// let guard = locks.lock("report:2024-11").metric_label("report").acquire()?;
            /// guard.release()?;
            /// # Ok(()) }
            /// ```
            pub fn metric_label(self, label: &'static str) -> Self {
                Self(self.0.metric_label(label))
            }

            /// Acquires, blocking until it is granted or the wait ran out.
            ///
            /// ```no_run
            /// # fn demo(locks: lock_runtime::blocking::LockService) -> Result<(), lock_runtime::LockError> {
            /// use std::time::Duration;
            ///
            /// let guard = locks.lock("report").wait(Duration::from_secs(2)).acquire()?;
            /// guard.release()?;
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            /// As awaiting the async request; [`ErrorKind::InvalidArgument`] from async code.
            pub fn acquire(self) -> Result<$guard, LockError> {
                // awaited inside the thread's owner scope: a request takes its owner when it
                // is turned into a future
                let request = self.0;
                block_on(async move { request.await })?.map($guard)
            }
        }
    };
}

blocking_request!(
    /// A request for a mutex: [`LockService::lock`].
    LockRequest, crate::LockRequest<'a>, LockGuard
);
blocking_request!(
    /// A request for a read hold: [`LockService::read`].
    ReadRequest, crate::ReadRequest<'a>, ReadGuard
);
blocking_request!(
    /// A request for the write hold: [`LockService::write`].
    WriteRequest, crate::WriteRequest<'a>, WriteGuard
);
blocking_request!(
    /// A request for permits: [`Semaphore::acquire`].
    PermitRequest, crate::PermitRequest<'a>, Permit
);

/// A guard's reading methods, `extend` and `release`, blocking.
macro_rules! blocking_guard {
    ($(#[$doc:meta])* $name:ident, $inner:ty) => {
        $(#[$doc])*
        ///
        /// Dropping it releases in the background; [`release`](Self::release) waits for Redis.
        #[derive(Debug)]
        #[must_use = "dropping the guard releases the hold at once"]
        pub struct $name($inner);

        impl $name {
            /// The key as it was asked for.
            pub fn key(&self) -> &str {
                self.0.key()
            }

            /// The fencing token of the hold.
            pub fn fence(&self) -> u64 {
                self.0.fence()
            }

            /// The fixed lease (`None`: renewed by the watchdog).
            pub fn lease(&self) -> Option<Duration> {
                self.0.lease()
            }

            /// Whether the hold is known to be lost.
            pub fn is_lost(&self) -> bool {
                self.0.is_lost()
            }

            /// Until when the hold is certainly valid.
            pub fn valid_until(&self) -> Instant {
                self.0.valid_until()
            }

            /// Sets the lease to `lease` from now (see the async guard's `extend`).
            ///
            /// # Errors
            /// As the async guard's `extend`; [`ErrorKind::InvalidArgument`] from async code.
            pub fn extend(&self, lease: Duration) -> Result<(), LockError> {
                block_on(self.0.extend(lease))?
            }

            /// Releases and blocks until Redis confirmed.
            ///
            /// ```no_run
            /// # fn demo(locks: lock_runtime::blocking::LockService) -> Result<(), lock_runtime::LockError> {
            /// let guard = locks.lock("report").acquire()?;
            /// // ... the critical section; guard.fence() for the writes ...
            /// guard.release()?; // Err(kind NotHeld) when the lease ran out meanwhile
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            /// As the async guard's `release`; [`ErrorKind::InvalidArgument`] from async code
            /// (the hold is then released in the background).
            pub fn release(self) -> Result<(), LockError> {
                block_on(self.0.release())?
            }

            /// The async guard, for async code.
            pub fn into_async(self) -> $inner {
                self.0
            }
        }
    };
}

blocking_guard!(
    /// A held mutex ([`crate::LockGuard`], blocking).
    LockGuard, crate::LockGuard
);
blocking_guard!(
    /// A read hold ([`crate::ReadGuard`], blocking).
    ReadGuard, crate::ReadGuard
);
blocking_guard!(
    /// The write hold ([`crate::WriteGuard`], blocking).
    WriteGuard, crate::WriteGuard
);
blocking_guard!(
    /// Permits of a semaphore ([`crate::Permit`], blocking).
    Permit, crate::Permit
);

/// A semaphore ([`crate::Semaphore`], blocking).
///
/// ```no_run
/// # fn demo(locks: lock_runtime::blocking::LockService) -> Result<(), lock_runtime::LockError> {
/// let renders = locks.semaphore("pdf-render", 4);
/// let permit = renders.acquire().acquire()?; // blocks until a permit is free
/// permit.release()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore(crate::Semaphore);

impl Semaphore {
    /// A request for one permit.
    pub fn acquire(&self) -> PermitRequest<'_> {
        PermitRequest(self.0.acquire())
    }

    /// A request for `n` permits at once.
    pub fn acquire_many(&self, n: u32) -> PermitRequest<'_> {
        PermitRequest(self.0.acquire_many(n))
    }

    /// The permits free now.
    ///
    /// # Errors
    /// As [`crate::Semaphore::available`].
    pub fn available(&self) -> Result<i64, LockError> {
        block_on(self.0.available())?
    }
}
