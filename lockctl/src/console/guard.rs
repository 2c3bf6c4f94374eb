//! The request guard: which `Host` and `Origin` the console answers (against DNS rebinding
//! and other sites' pages), the unlock token and its constant-time check, and the security
//! headers of every answer. The parent module's documentation says why.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;

/// The page may load only what the binary serves.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// The header by which the page sends its unlock token.
const TOKEN_HEADER: &str = "x-lockctl-token";

/// A host name (or IP literal) the console answers to besides its own addresses:
/// `--allow-host NAME[:PORT]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllowedHost {
    /// Lowercase; an IPv6 literal in brackets.
    name: String,
    /// `None`: any port (and none).
    port: Option<u16>,
}

/// Parses `--allow-host`: `NAME`, `NAME:PORT`, `[IPV6]`, `[IPV6]:PORT`.
pub(crate) fn parse_allowed_host(text: &str) -> Result<AllowedHost, String> {
    let (name, port) = split_host(text).ok_or_else(|| {
        format!("{text:?} is not a host name with an optional port, like locks.example:7373")
    })?;
    Ok(AllowedHost { name, port })
}

/// A `Host` header (or the host part of an `Origin`): its lowercase name (an IPv6 literal in
/// brackets) and port; `None` when it is no host name.
fn split_host(text: &str) -> Option<(String, Option<u16>)> {
    let (name, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            after => Some(after.strip_prefix(':')?),
        };
        (format!("[{inside}]"), port)
    } else {
        match text.split_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (text.to_owned(), None),
        }
    };
    let port = match port {
        Some(port) => Some(port.parse::<u16>().ok()?),
        None => None,
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
    if name.is_empty() || !(name.starts_with('[') || name.chars().all(plain)) {
        return None;
    }
    Some((name.to_ascii_lowercase(), port))
}

/// `ip` as a `Host` names it: `10.0.0.5`, `[fe80::1]`.
fn host_name(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The local address a connection reached (an unspecified `--listen` address serves several).
#[derive(Debug, Clone, Copy)]
pub(super) struct LocalAddr(Option<SocketAddr>);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for LocalAddr {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        LocalAddr(stream.io().local_addr().ok())
    }
}

/// Compares a token with the console's in time that depends only on their lengths.
fn same_token(given: &[u8], token: &[u8]) -> bool {
    if given.len() != token.len() {
        return false;
    }
    let differ = given
        .iter()
        .zip(token)
        .fold(0u8, |acc, (a, b)| std::hint::black_box(acc | (a ^ b)));
    differ == 0
}

/// A random token of 32 bytes, in hex.
fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a request must show to be answered: a `Host` (and `Origin`) that names the console,
/// and for an unlock the token of the console's page.
pub(super) struct Gate {
    /// The address bound (the port is the OS's when `--listen` gave port 0).
    bound: SocketAddr,
    /// `--allow-host`.
    allow_hosts: Vec<AllowedHost>,
    /// What an unlock must carry in [`TOKEN_HEADER`]; embedded in the page.
    token: String,
}

impl Gate {
    /// The gate of a console listening on `bound`, with a new token.
    pub(super) fn new(bound: SocketAddr, allow_hosts: Vec<AllowedHost>) -> Gate {
        Gate {
            bound,
            allow_hosts,
            token: new_token(),
        }
    }

    /// The token the console's page embeds.
    pub(super) fn token(&self) -> &str {
        &self.token
    }

    /// Whether `headers` carry the console's unlock token.
    pub(super) fn carries_token(&self, headers: &HeaderMap) -> bool {
        let token = headers.get(TOKEN_HEADER).map(|t| t.as_bytes());
        token.is_some_and(|t| same_token(t, self.token.as_bytes()))
    }

    /// Whether a `Host` header (or an origin's host) names this console: a loopback name or
    /// the address listened on or reached (`local`), with the console's port (none for port
    /// 80), or a name of `--allow-host`.
    fn answers_to(&self, host: &str, local: Option<SocketAddr>) -> bool {
        let Some((name, port)) = split_host(host) else {
            return false;
        };
        let own_port = self.bound.port();
        let own = port == Some(own_port) || (port.is_none() && own_port == 80);
        let mut addresses = vec![self.bound.ip()];
        addresses.extend(local.map(|l| l.ip()));
        let own_name = ["localhost", "127.0.0.1", "[::1]"].contains(&name.as_str())
            || addresses
                .iter()
                .any(|ip| !ip.is_unspecified() && host_name(*ip) == name);
        if own && own_name {
            return true;
        }
        self.allow_hosts
            .iter()
            .any(|a| a.name == name && (a.port.is_none() || a.port == port))
    }
}

/// Refuses requests whose `Host` does not name the console (421: a page of another site that
/// points its host name at the console's address must not read the locks) or whose `Origin`
/// is another site (403), and sets the security headers of every answer.
pub(super) async fn guard(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    let local = request
        .extensions()
        .get::<ConnectInfo<LocalAddr>>()
        .and_then(|c| c.0.0);
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if !host.is_some_and(|host| gate.answers_to(host, local)) {
        let message = format!(
            "misdirected request: the Host header ({}) does not name this console; it answers \
             to localhost, 127.0.0.1, [::1] and its own address with its port, and to the \
             names given with `lockctl serve --allow-host NAME[:PORT]`\n",
            host.map_or_else(|| "none".to_owned(), |h| format!("{h:?}"))
        );
        return (StatusCode::MISDIRECTED_REQUEST, message).into_response();
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let named = origin
            .to_str()
            .ok()
            .and_then(|o| {
                o.strip_prefix("http://")
                    .or_else(|| o.strip_prefix("https://"))
            })
            .is_some_and(|host| gate.answers_to(host, local));
        if !named {
            let message = format!(
                "forbidden: requests from the origin {origin:?} are refused; the console takes \
                 them only from its own page\n"
            );
            return (StatusCode::FORBIDDEN, message).into_response();
        }
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        let parsed = |s: &str| split_host(s);
        assert_eq!(
            parsed("Locks.Example:80"),
            Some(("locks.example".into(), Some(80)))
        );
        assert_eq!(parsed("localhost"), Some(("localhost".into(), None)));
        assert_eq!(parsed("[::1]:7373"), Some(("[::1]".into(), Some(7373))));
        assert_eq!(parsed("[::1]"), Some(("[::1]".into(), None)));
        for bad in [
            "", ":80", "a:b", "a:1:2", "::1", "[::1", "[x]:1", "a/b", "a b", "a:",
        ] {
            assert_eq!(parsed(bad), None, "{bad}");
        }
        assert!(parse_allowed_host("http://x").is_err());
        assert_eq!(
            parse_allowed_host("Proxy.Example:8443"),
            Ok(AllowedHost {
                name: "proxy.example".into(),
                port: Some(8443)
            })
        );
    }

    #[test]
    fn tokens() {
        let token = new_token();
        assert_eq!(token.len(), 64);
        assert_ne!(token, new_token());
        assert!(same_token(token.as_bytes(), token.as_bytes()));
        assert!(!same_token(b"", token.as_bytes()));
        assert!(!same_token(&token.as_bytes()[1..], token.as_bytes()));
        let mut other = token.clone().into_bytes();
        other[63] ^= 1;
        assert!(!same_token(&other, token.as_bytes()));
    }
}
