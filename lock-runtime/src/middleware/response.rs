//! [`LockError`] as an HTTP status and a short JSON body, shared by both frameworks.

use serde::Serialize;

use crate::error::{ErrorKind, LockError};

/// The HTTP status code for `error`: 409 for a lock timeout and a stale write, 503 for a lost lock, an
/// unavailable backend and a service shutting down, 500 otherwise (see the [module docs](super)).
///
/// ```
/// # fn demo(error: &lock_runtime::LockError) {
/// use lock_runtime::middleware::http_status;
///
/// if error.is_timeout() {
///     assert_eq!(http_status(error), 409);
/// }
/// # }
/// ```
pub fn http_status(error: &LockError) -> u16 {
    Mapping::of(error).status
}

/// The JSON body for `error`: `{"error": .., "key": .., "message": ..}`, without `key` when
/// the error concerns no key. 5xx bodies carry a fixed message, never backend details.
pub fn http_body(error: &LockError) -> String {
    Mapping::of(error).body(error)
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    message: String,
}

/// Everything both frameworks need to answer with.
pub(crate) struct Mapping {
    pub(crate) status: u16,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    /// Send `Retry-After: 1`.
    pub(crate) retry: bool,
}

impl Mapping {
    pub(crate) fn of(error: &LockError) -> Mapping {
        let key = error.key().unwrap_or("?");
        let (status, code, message) = match error.kind() {
            // The runtime's message names the key and how long it waited: nothing internal.
            ErrorKind::Timeout => (409, "lock_timeout", error.to_string()),
            ErrorKind::Stale => (
                409,
                "stale_write",
                format!("`{key}` was written by a newer lock holder; this write was rejected"),
            ),
            ErrorKind::Lost => (
                503,
                "lock_lost",
                format!("lock `{key}` was lost before the operation finished; try again"),
            ),
            // the request reached an instance on its way out: another one can serve it
            ErrorKind::ShuttingDown => (
                503,
                "lock_shutting_down",
                "this server is shutting down and takes no new locks; try again".to_owned(),
            ),
            // NotInitialized, Config, Auth, Tls and the rest are mistakes to fix, not to retry: 500
            ErrorKind::Backend | ErrorKind::ReplicaSync => (
                503,
                "lock_unavailable",
                "the lock service is unavailable; try again later".to_owned(),
            ),
            kind => (
                500,
                "lock_error",
                format!("the request could not be completed ({kind})"),
            ),
        };
        Mapping {
            status,
            code,
            message,
            retry: status != 500,
        }
    }

    /// Logs `error` (5xx at warn level with the full error, the rest at debug level).
    pub(crate) fn log(&self, error: &LockError) {
        let status = self.status;
        if status >= 500 {
            tracing::warn!(error = %error, kind = ?error.kind(), status, "lock error answered");
        } else {
            tracing::debug!(error = %error, status, "lock error answered");
        }
    }

    pub(crate) fn body(&self, error: &LockError) -> String {
        let body = Body {
            error: self.code,
            key: error.key(),
            message: self.message.clone(),
        };
        serde_json::to_string(&body).unwrap_or_else(|_| format!("{{\"error\":\"{}\"}}", self.code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(error: &LockError) -> serde_json::Value {
        serde_json::from_str(&http_body(error)).unwrap()
    }

    #[test]
    fn timeouts_are_conflicts_naming_the_key() {
        let e = LockError::new(
            ErrorKind::Timeout,
            "could not acquire lock `goods:42` within 2s",
        )
        .with_key("goods:42");
        assert_eq!(http_status(&e), 409);
        let body = json(&e);
        assert_eq!(body["error"], "lock_timeout");
        assert_eq!(body["key"], "goods:42");
        assert!(body["message"].as_str().unwrap().contains("goods:42"));
        assert!(Mapping::of(&e).retry);
    }

    #[test]
    fn stale_writes_are_conflicts_naming_the_key() {
        let e = LockError::new(
            ErrorKind::Stale,
            "fenced write to `stock:7` rejected: token 5 is older than 9",
        )
        .with_key("stock:7");
        assert_eq!(http_status(&e), 409);
        let body = json(&e);
        assert_eq!(body["error"], "stale_write");
        assert_eq!(body["key"], "stock:7");
        assert!(!body["message"].as_str().unwrap().contains("token 5"));
    }

    #[test]
    fn unavailable_backends_and_lost_locks_are_503_without_details() {
        for kind in [ErrorKind::Backend, ErrorKind::ReplicaSync] {
            let e = LockError::new(kind, "connect to 10.0.0.7:6379: connection refused");
            assert_eq!(http_status(&e), 503, "{kind:?}");
            let body = http_body(&e);
            assert!(!body.contains("10.0.0.7"), "{body}");
            assert_eq!(json(&e)["error"], "lock_unavailable");
            assert!(json(&e).get("key").is_none());
        }
        let lost = LockError::new(ErrorKind::Lost, "renewal found it gone").with_key("k");
        assert_eq!(
            (http_status(&lost), json(&lost)["error"].as_str()),
            (503, Some("lock_lost"))
        );
    }

    #[test]
    fn shutting_down_is_503_saying_so() {
        let e = LockError::new(ErrorKind::ShuttingDown, "the lock service shut down").with_key("k");
        assert_eq!(http_status(&e), 503);
        let body = json(&e);
        assert_eq!(body["error"], "lock_shutting_down");
        assert!(body["message"].as_str().unwrap().contains("shutting down"));
        assert!(Mapping::of(&e).retry);
    }

    #[test]
    fn everything_else_is_a_short_500() {
        for kind in [
            ErrorKind::NotHeld,
            ErrorKind::Config,
            ErrorKind::NotInitialized,
            ErrorKind::Auth,
            ErrorKind::Tls,
            ErrorKind::InvalidKey,
            ErrorKind::InvalidArgument,
            ErrorKind::WouldDeadlock,
        ] {
            let source = std::io::Error::other("secret detail");
            let e = LockError::new(kind, "internal text").with_source(source);
            assert_eq!(http_status(&e), 500);
            let body = http_body(&e);
            assert!(
                !body.contains("secret") && !body.contains("internal text"),
                "{body}"
            );
            assert_eq!(json(&e)["error"], "lock_error");
            assert!(!Mapping::of(&e).retry);
        }
    }
}
