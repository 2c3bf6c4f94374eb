//! Telling a TLS port from a plaintext one, for the errors of a client that got the scheme
//! wrong: a `rediss://` client at a plaintext port waits for a TLS answer that never comes (the
//! server waits for the end of a command line), and a `redis://` client at a TLS-only port sees
//! its connection reset. Neither error says why; one short look at the port does.

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{ErrorKind, LockError};

/// How long a look at a port may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// A TLS handshake still going after this long is looked into: on a plaintext port it would
/// go on until the connect timeout.
const SLOW_HANDSHAKE: Duration = Duration::from_millis(250);

/// `(host, port)` of a `redis://` or `rediss://` URL.
pub(super) fn host_port(url: &str) -> Option<(String, u16)> {
    use redis::{ConnectionAddr, IntoConnectionInfo};
    match url.into_connection_info().ok()?.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

/// Whether the server at `host:port` answers a plaintext `PING` in the Redis protocol (`+PONG`,
/// or `-NOAUTH ...`): then it does not speak TLS there.
pub(super) async fn answers_plaintext(host: &str, port: u16) -> bool {
    let look = async {
        let mut stream = TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0u8; 1];
        stream.read_exact(&mut first).await.ok()?;
        Some(matches!(first[0], b'+' | b'-'))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, look).await,
        Ok(Some(true))
    )
}

/// Whether the server at `host:port` answers a TLS ClientHello with a TLS record (a
/// ServerHello or an alert): then it speaks TLS there.
pub(super) async fn answers_tls(host: &str, port: u16) -> bool {
    let look = async {
        let mut stream = TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(&client_hello()).await.ok()?;
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).await.ok()?;
        // content type handshake (22) or alert (21), major version 3
        Some(matches!(head, [22 | 21, 3]))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, look).await,
        Ok(Some(true))
    )
}

/// The error for a client whose scheme does not match the server's port; `url` is shown
/// redacted.
pub(super) fn wrong_scheme(url: &str, server_tls: bool) -> LockError {
    let url = crate::config::redacted(url);
    let what = if server_tls {
        "TLS: the server speaks TLS only on this port: write rediss:// (lock-runtime's `tls` \
         feature; the CA and a client certificate go in `redis.tls`)"
    } else {
        "TLS: the server does not answer in TLS on this port, it answers in plaintext (a \
         rediss:// URL needs the server's `tls-port`)"
    };
    LockError::new(ErrorKind::Tls, format!("cannot connect to {url}: {what}"))
}

/// After a failed connect to `urls` that says nothing more precise (not refused, no timeout,
/// no TLS failure, no answer from Redis): the first of them whose port does not speak what its
/// scheme says, as an error naming it. The look ends at `deadline` (the end of the connect
/// timeout): a connect never takes longer for being explained.
pub(super) async fn wrong_scheme_after<U: AsRef<str>>(
    urls: &[U],
    err: &redis::RedisError,
    deadline: tokio::time::Instant,
) -> Option<LockError> {
    let said_why = err.is_connection_refusal()
        || err.is_timeout()
        || err.code().is_some()
        || err.kind() == redis::ErrorKind::AuthenticationFailed
        || crate::error::tls_failure(err).is_some();
    if said_why {
        return None;
    }
    tokio::time::timeout_at(deadline, mismatched_scheme(urls))
        .await
        .ok()
        .flatten()
}

/// The first of `urls` whose port does not speak what its scheme says - a `rediss://` one
/// answering in plaintext, a `redis://` one answering in TLS - as an error naming it. The
/// ports are looked at all at once: a look takes at most [`PROBE_TIMEOUT`] however many
/// seeds there are.
pub(super) async fn mismatched_scheme<U: AsRef<str>>(urls: &[U]) -> Option<LockError> {
    let looks: Vec<_> = urls
        .iter()
        .map(AsRef::as_ref)
        .filter_map(|url| {
            let (host, port) = host_port(url)?;
            let tls = crate::config::is_tls_url(url);
            let look = tokio::spawn(async move {
                match tls {
                    true => answers_plaintext(&host, port).await,
                    false => answers_tls(&host, port).await,
                }
            });
            Some((url, tls, look))
        })
        .collect();
    for (url, tls, look) in looks {
        if look.await.unwrap_or(false) {
            return Some(wrong_scheme(url, !tls));
        }
    }
    None
}

/// Runs `connect` to `urls`; if a TLS handshake is still going after a moment and one of
/// the servers answers in plaintext, gives up at once with an error naming it, instead of
/// waiting for the connect timeout.
pub(super) async fn unless_plaintext<T, U: AsRef<str>>(
    urls: &[U],
    connect: impl Future<Output = T>,
) -> Result<T, LockError> {
    if !urls.iter().any(|u| crate::config::is_tls_url(u.as_ref())) {
        return Ok(connect.await);
    }
    tokio::pin!(connect);
    tokio::select! {
        out = &mut connect => return Ok(out),
        () = tokio::time::sleep(SLOW_HANDSHAKE) => {}
    }
    tokio::select! {
        out = &mut connect => Ok(out),
        found = mismatched_scheme(urls) => match found {
            Some(wrong_scheme) => Err(wrong_scheme),
            None => Ok(connect.await),
        },
    }
}

/// A TLS 1.2 ClientHello offering ECDHE with AES-128-GCM (ECDSA and RSA certificates), enough
/// for any TLS server to answer with a ServerHello or an alert.
fn client_hello() -> Vec<u8> {
    let mut hello = vec![0x03, 0x03]; // TLS 1.2
    hello.extend([0x42; 32]); // random: any value does for a look
    hello.push(0); // no session id
    hello.extend([0x00, 0x04, 0xc0, 0x2b, 0xc0, 0x2f]); // two cipher suites
    hello.extend([0x01, 0x00]); // compression: none
    let extensions: [u8; 24] = [
        0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17, // supported groups: P-256
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // point formats: uncompressed
        0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x08, 0x04, // signature algorithms
    ];
    hello.extend(u16::try_from(extensions.len()).unwrap_or(0).to_be_bytes());
    hello.extend(extensions);
    let len = u32::try_from(hello.len()).unwrap_or(0).to_be_bytes();
    let mut handshake = vec![0x01, len[1], len[2], len[3]]; // ClientHello, 3-byte length
    handshake.extend(hello);
    let record_len = u16::try_from(handshake.len()).unwrap_or(0).to_be_bytes();
    let mut record = vec![0x16, 0x03, 0x01, record_len[0], record_len[1]];
    record.extend(handshake);
    record
}
