//! The one error type of the crate: [`LockError`], classified by [`ErrorKind`].

mod tls;

pub(crate) use tls::tls_failure;

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// What went wrong, coarsely: match on it to decide what to do.
///
/// The enum is `#[non_exhaustive]`: new kinds may appear in minor releases, so keep a `_` arm.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::ErrorKind;
///
/// match locks.lock("goods:42").try_once().await {
///     Ok(guard) => guard.release().await?,
///     Err(e) if e.kind() == ErrorKind::Timeout => println!("busy: try later"),
///     Err(e) if e.is_retryable() => println!("Redis trouble: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The wait ran out before the lock could be acquired.
    Timeout,
    /// A release (or extension) was attempted by an owner that does not hold the lock, for
    /// example because its lease ran out or an operator force-unlocked it.
    NotHeld,
    /// The lock was lost while it was held: the watchdog found it gone or the lease ran out.
    Lost,
    /// The grant was not acknowledged by the required number of replicas in time; the grant was
    /// given back.
    ReplicaSync,
    /// Redis could not be reached, answered with an error, or did not answer in time.
    Backend,
    /// Redis refused the credentials (`WRONGPASS`, `NOAUTH`) or the user lacks a permission the
    /// locks need (`NOPERM`): a configuration mistake, not retryable. The message names the
    /// user, never the password.
    Auth,
    /// A TLS connection could not be set up: the server's certificate is not trusted (another
    /// CA, a host name it does not name) or has expired, the server refused the client
    /// certificate, or the server does not speak TLS on that port (or a `redis://` client met
    /// a TLS-only port). A configuration or certificate mistake, not retryable; the message
    /// names the server (`host:port`) and what to check.
    Tls,
    /// The configuration is malformed: the message names the file, the field and what was
    /// expected.
    Config,
    /// No global lock service has been set up and no configuration file was found.
    NotInitialized,
    /// The lock key is not usable (for example empty).
    InvalidKey,
    /// An argument other than the key is not usable (for example a zero lease).
    InvalidArgument,
    /// The lock is held further up this call chain, across a task spawned with
    /// [`owner::spawn`](crate::owner::spawn): waiting for it would wait for the caller itself.
    /// Re-entry follows one call chain; pass the work back to the holder, or give the spawned
    /// task its own key.
    WouldDeadlock,
    /// A [fenced write](crate::fenced) carried a fencing token older than the one stored with
    /// the data: a newer holder of the lock has written since, so this hold was lost (for
    /// example its holder was paused past its lease). Nothing was written; start over with a
    /// new lock and read the data again.
    Stale,
    /// The lock service is shutting down ([`LockService::shutdown`](crate::LockService::shutdown)):
    /// it takes no new locks, and a wait that was under way ended. Not retryable on this
    /// service; the process is going away.
    ShuttingDown,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timed out",
            ErrorKind::NotHeld => "not held",
            ErrorKind::Lost => "lock lost",
            ErrorKind::ReplicaSync => "replica sync failed",
            ErrorKind::Backend => "backend error",
            ErrorKind::Auth => "authentication failed",
            ErrorKind::Tls => "TLS failed",
            ErrorKind::Config => "configuration error",
            ErrorKind::NotInitialized => "not initialized",
            ErrorKind::InvalidKey => "invalid key",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::WouldDeadlock => "would deadlock",
            ErrorKind::Stale => "stale write",
            ErrorKind::ShuttingDown => "shutting down",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The error returned by every fallible operation of this crate.
///
/// It is opaque on purpose: ask for its [`kind`](LockError::kind), use the `is_*` predicates,
/// the [`key`](LockError::key) it concerns, and the underlying [`source`](StdError::source).
///
/// ```
/// use lock_runtime::{ErrorKind, LockError};
///
/// fn describe(err: &LockError) -> &'static str {
///     match err.kind() {
///         ErrorKind::Timeout => "busy, try again later",
///         ErrorKind::Backend => "lock service unavailable",
///         _ => "unexpected lock failure",
///     }
/// }
/// # let _ = describe;
/// ```
pub struct LockError {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    key: Option<String>,
    /// The key as the code names it (an annotated fn's template, `goods:<id>`).
    label: Option<&'static str>,
    message: String,
    /// Whether the message names the Redis user already.
    user_named: bool,
    /// Shared, so that one failure can be reported to every caller it concerns.
    source: Option<Arc<dyn StdError + Send + Sync + 'static>>,
}

impl LockError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        LockError {
            inner: Box::new(Inner {
                kind,
                key: None,
                label: None,
                message: message.into(),
                user_named: false,
                source: None,
            }),
        }
    }

    pub(crate) fn with_key(mut self, key: &str) -> Self {
        self.inner.key = Some(key.to_owned());
        self
    }

    /// Names the lock as the code does: the key template of the annotated fn it comes from.
    pub(crate) fn with_label(mut self, label: &'static str) -> Self {
        self.inner.label = Some(label);
        self
    }

    pub(crate) fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(Arc::from(source.into()));
        self
    }

    /// The same error again (kind, key, message and source), for the other callers a failed
    /// batch of operations concerns.
    pub(crate) fn duplicate(&self) -> Self {
        LockError {
            inner: Box::new(Inner {
                kind: self.inner.kind,
                key: self.inner.key.clone(),
                label: self.inner.label,
                message: self.inner.message.clone(),
                user_named: self.inner.user_named,
                source: self.inner.source.clone(),
            }),
        }
    }

    /// A Redis failure; refused credentials or permissions are [`ErrorKind::Auth`], a failed
    /// TLS handshake [`ErrorKind::Tls`].
    pub(crate) fn backend(context: &str, err: redis::RedisError) -> Self {
        if let Some(what) = tls_failure(&err) {
            return LockError::new(ErrorKind::Tls, format!("{context}: {what}")).with_source(err);
        }
        // a command or key refused inside a script comes without a NOPERM code on Redis 7.0
        let auth = err.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(err.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
            || [
                "WRONGPASS",
                "NOAUTH",
                "NOPERM",
                "The user executing the script can't",
            ]
            .iter()
            .any(|code| err.to_string().contains(code));
        let kind = if auth {
            ErrorKind::Auth
        } else {
            ErrorKind::Backend
        };
        LockError::new(kind, format!("{context}: {err}")).with_source(err)
    }

    /// Names the Redis user in an [`ErrorKind::Auth`] error (other errors, and one that names
    /// its user already, pass unchanged): `user` is the one the connection logged in as, `None`
    /// for the default user.
    pub(crate) fn naming_user(mut self, user: Option<&str>) -> Self {
        if self.kind() == ErrorKind::Auth && !self.inner.user_named {
            self.inner.user_named = true;
            let who = match user {
                Some(user) => format!("user `{user}`"),
                None => "the default user".to_owned(),
            };
            let inner = &mut self.inner;
            inner.message = format!(
                "{} (as {who}; check redis.username / redis.password or $LOCK_REDIS_USERNAME / \
                 $LOCK_REDIS_PASSWORD, and the user's ACL permissions)",
                inner.message
            );
        }
        self
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        LockError::new(ErrorKind::Config, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The lock key (as the caller wrote it, without prefix) this error concerns, if any.
    pub fn key(&self) -> Option<&str> {
        self.inner.key.as_deref()
    }

    /// The key template of the `#[distributed_lock]` fn this error comes from (`"goods:<id>"`;
    /// with `keys = [..]`, the templates joined with `,`), if it comes from one. Unlike
    /// [`key`](Self::key), it never carries the values the key was built from (user ids,
    /// internal names): the web middleware's JSON body shows this, not the key.
    pub fn label(&self) -> Option<&str> {
        self.inner.label
    }

    /// `true` when the wait for the lock ran out.
    pub fn is_timeout(&self) -> bool {
        self.kind() == ErrorKind::Timeout
    }

    /// `true` when the caller did not (or no longer) hold the lock it tried to release.
    pub fn is_not_held(&self) -> bool {
        self.kind() == ErrorKind::NotHeld
    }

    /// `true` when a held lock was lost (renewal found it gone, or its lease ran out).
    pub fn is_lost(&self) -> bool {
        self.kind() == ErrorKind::Lost
    }

    /// `true` when replicas did not acknowledge a grant in time.
    pub fn is_replica_sync(&self) -> bool {
        self.kind() == ErrorKind::ReplicaSync
    }

    /// `true` when Redis was unreachable, failed or did not answer in time.
    pub fn is_backend(&self) -> bool {
        self.kind() == ErrorKind::Backend
    }

    /// `true` when a fenced write was rejected because a newer lock holder has written.
    pub fn is_stale(&self) -> bool {
        self.kind() == ErrorKind::Stale
    }

    /// `true` when the lock service is shutting down and took no lock (see
    /// [`ErrorKind::ShuttingDown`]).
    pub fn is_shutting_down(&self) -> bool {
        self.kind() == ErrorKind::ShuttingDown
    }

    /// `true` for configuration errors.
    pub fn is_config(&self) -> bool {
        self.kind() == ErrorKind::Config
    }

    /// `true` when a TLS connection could not be set up (see [`ErrorKind::Tls`]).
    pub fn is_tls(&self) -> bool {
        self.kind() == ErrorKind::Tls
    }

    /// `true` when trying the same operation again later may succeed (timeouts, lost locks,
    /// backend and replica failures), `false` for caller mistakes (bad key, bad config, releasing
    /// a lock that is not held).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::Timeout | ErrorKind::Lost | ErrorKind::Backend | ErrorKind::ReplicaSync
        )
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.message)
    }
}

impl fmt::Debug for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LockError");
        d.field("kind", &self.inner.kind);
        if let Some(key) = &self.inner.key {
            d.field("key", key);
        }
        if let Some(label) = self.inner.label {
            d.field("label", &label);
        }
        d.field("message", &self.inner.message);
        if let Some(source) = &self.inner.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl StdError for LockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_predicates() {
        let e = LockError::new(ErrorKind::Timeout, "waited 2s for lock `a`").with_key("a");
        assert!(e.is_timeout() && e.is_retryable() && !e.is_backend());
        assert_eq!(e.key(), Some("a"));
        assert_eq!(e.to_string(), "waited 2s for lock `a`");
        let e = LockError::new(ErrorKind::InvalidKey, "empty");
        assert!(!e.is_retryable());
    }

    #[test]
    fn an_auth_error_names_its_user_once() {
        let e = LockError::new(ErrorKind::Auth, "WRONGPASS")
            .naming_user(Some("app"))
            .naming_user(None);
        let text = e.to_string();
        assert!(text.contains("as user `app`"), "{text}");
        assert!(!text.contains("default user"), "{text}");
        let e = LockError::new(ErrorKind::Backend, "refused").naming_user(Some("app"));
        assert_eq!(e.to_string(), "refused");
    }

    #[test]
    fn source_is_kept() {
        let io = std::io::Error::other("boom");
        let e = LockError::new(ErrorKind::Backend, "x").with_source(io);
        assert_eq!(e.source().unwrap().to_string(), "boom");
        assert!(format!("{e:?}").contains("boom"));
    }
}
