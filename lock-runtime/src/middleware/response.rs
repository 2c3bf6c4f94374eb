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

/// The JSON body for `error`: `{"error": .., "key": .., "message": ..}`. `key` is the key
/// template of the annotated fn the error comes from ([`LockError::label`], `"goods:<id>"`),
/// never the key itself, whose values (user ids, internal names) are not the client's to see;
/// without a template there is no `key`. Messages are fixed texts that name at most the
/// template, never backend details.
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
        let lock = match error.label() {
            Some(label) => format!("the lock `{label}`"),
            None => "the lock".to_owned(),
        };
        let (status, code, message) = match error.kind() {
            ErrorKind::Timeout => (
                409,
                "lock_timeout",
                format!("{lock} is held by another request; try again"),
            ),
            ErrorKind::Stale => (
                409,
                "stale_write",
                format!(
                    "the data of {lock} was written by a newer holder; this write was rejected"
                ),
            ),
            ErrorKind::Lost => (
                503,
                "lock_lost",
                format!("{lock} was lost before the operation finished; try again"),
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
            key: error.label(),
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
    fn timeouts_are_conflicts_naming_the_template_never_the_key() {
        let e = LockError::new(
            ErrorKind::Timeout,
            "could not acquire lock `user:alice@example.com` within 2s",
        )
        .with_key("user:alice@example.com");
        assert_eq!(http_status(&e), 409);
        let body = json(&e);
        assert_eq!(body["error"], "lock_timeout");
        assert!(body.get("key").is_none(), "{body}");
        assert!(!http_body(&e).contains("alice"), "{body}");
        assert!(Mapping::of(&e).retry);

        let e = e.with_label("user:<email>");
        let body = json(&e);
        assert_eq!(body["key"], "user:<email>");
        assert!(body["message"].as_str().unwrap().contains("user:<email>"));
        assert!(!http_body(&e).contains("alice"), "{body}");
    }

    #[test]
    fn stale_writes_are_conflicts_naming_the_template_never_the_key() {
        let e = LockError::new(
            ErrorKind::Stale,
            "fenced write to `stock:7` rejected: token 5 is older than 9",
        )
        .with_key("stock:7")
        .with_label("stock:<id>");
        assert_eq!(http_status(&e), 409);
        let body = json(&e);
        assert_eq!(body["error"], "stale_write");
        assert_eq!(body["key"], "stock:<id>");
        let text = http_body(&e);
        assert!(
            !text.contains("token 5") && !text.contains("stock:7"),
            "{text}"
        );
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
