//! What a failed TLS handshake means, in words that say what to check.

#[cfg(feature = "tls")]
use std::error::Error as StdError;

/// What a failed TLS handshake means, when `err` is one; `None` for every other error.
#[cfg(feature = "tls")]
pub(crate) fn tls_failure(err: &redis::RedisError) -> Option<String> {
    if let Some(e) = find_rustls(err) {
        return Some(format!("TLS: {}: {e}", Failure::of(e).explain()));
    }
    // the cluster client passes connection errors on as text
    let text = err.to_string();
    Failure::in_text(&text).map(|failure| format!("TLS: {}: {text}", failure.explain()))
}

/// Without the `tls` feature no connection uses TLS.
#[cfg(not(feature = "tls"))]
pub(crate) fn tls_failure(_err: &redis::RedisError) -> Option<String> {
    None
}

/// The kinds of failed handshake, by what to check.
#[cfg(feature = "tls")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Untrusted,
    Expired,
    WrongName,
    Certificate,
    ClientExpired,
    ClientRefused,
    Alert,
    NotTls,
    Incompatible,
    Other,
}

#[cfg(feature = "tls")]
impl Failure {
    fn of(e: &rustls::Error) -> Failure {
        use rustls::{AlertDescription as A, CertificateError as C, Error as E};
        match e {
            E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => Failure::Untrusted,
            E::InvalidCertificate(
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. },
            ) => Failure::Expired,
            E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                Failure::WrongName
            }
            E::InvalidCertificate(_) => Failure::Certificate,
            E::AlertReceived(A::CertificateExpired) => Failure::ClientExpired,
            E::AlertReceived(
                A::CertificateRequired
                | A::BadCertificate
                | A::UnknownCA
                | A::CertificateUnknown
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::AccessDenied,
            ) => Failure::ClientRefused,
            E::AlertReceived(_) => Failure::Alert,
            E::InvalidMessage(_) | E::InappropriateMessage { .. } | E::PeerSentOversizedRecord => {
                Failure::NotTls
            }
            E::PeerIncompatible(_) => Failure::Incompatible,
            _ => Failure::Other,
        }
    }

    /// The same from an error's text (rustls's wording of the errors above).
    fn in_text(text: &str) -> Option<Failure> {
        let has = |part: &str| text.contains(part);
        let alert = |names: &[&str]| {
            names
                .iter()
                .any(|name| has(&format!("received fatal alert: {name}")))
        };
        Some(
            if has("invalid peer certificate: UnknownIssuer")
                || has("invalid peer certificate: BadSignature")
            {
                Failure::Untrusted
            } else if has("invalid peer certificate: certificate expired")
                || has("invalid peer certificate: Expired")
                || has("invalid peer certificate: certificate not valid yet")
                || has("invalid peer certificate: NotValidYet")
            {
                Failure::Expired
            } else if has("invalid peer certificate: certificate not valid for name")
                || has("invalid peer certificate: NotValidForName")
            {
                Failure::WrongName
            } else if has("invalid peer certificate") {
                Failure::Certificate
            } else if alert(&["CertificateExpired"]) {
                Failure::ClientExpired
            } else if alert(&[
                "CertificateRequired",
                "BadCertificate",
                "UnknownCA",
                "CertificateUnknown",
                "UnsupportedCertificate",
                "CertificateRevoked",
                "AccessDenied",
            ]) {
                Failure::ClientRefused
            } else if has("received fatal alert") {
                Failure::Alert
            } else if has("received corrupt message") || has("received unexpected message") {
                Failure::NotTls
            } else if has("peer is incompatible") {
                Failure::Incompatible
            } else {
                return None;
            },
        )
    }

    fn explain(self) -> &'static str {
        match self {
            Failure::Untrusted => {
                "the server's certificate is not signed by a CA this client trusts \
                 (`redis.tls.ca_file`, or the system's roots when it is not set)"
            }
            Failure::Expired => "the server's certificate has expired (or is not valid yet)",
            Failure::WrongName => {
                "the server's certificate does not name the host this client connects to (the \
                 URL's host, or in sentinel and cluster mode the address the servers announce)"
            }
            Failure::Certificate => "the server's certificate was not accepted",
            Failure::ClientExpired => {
                "the server refused this client's certificate (`redis.tls.cert_file`) as expired"
            }
            Failure::ClientRefused => {
                "the server refused this client's certificate (`redis.tls.cert_file` / \
                 `key_file`: it checks clients, and the certificate is missing or not signed by \
                 a CA it trusts)"
            }
            Failure::Alert => "the server ended the TLS handshake",
            Failure::NotTls => {
                "the server does not answer in TLS on this port (a plaintext port? a rediss:// \
                 URL needs the server's `tls-port`)"
            }
            Failure::Incompatible => {
                "the server and this client have no TLS version or cipher in common"
            }
            Failure::Other => "the TLS handshake failed",
        }
    }
}

/// The rustls error somewhere in `err`'s chain: the redis client keeps the I/O error of the TLS
/// stream, which carries the rustls error as its payload (not as its `source`).
#[cfg(feature = "tls")]
fn find_rustls<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(found) = in_one(e) {
            return Some(found);
        }
        next = e.source();
    }
    None
}

#[cfg(feature = "tls")]
fn in_one<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    type Shared = std::sync::Arc<dyn StdError + Send + Sync>;
    if let Some(found) = e.downcast_ref::<rustls::Error>() {
        return Some(found);
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return io.get_ref().and_then(|inner| in_one(inner));
    }
    if let Some(shared) = e.downcast_ref::<Shared>() {
        let inner: &(dyn StdError + 'static) = &**shared;
        return in_one(inner);
    }
    None
}
