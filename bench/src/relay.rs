//! A TCP relay in front of the redis-server that counts the script calls (`EVALSHA`, `EVAL`)
//! and the plain `SET`s its clients send: S4 puts a waiter's connections behind one to count
//! its acquire attempts without `MONITOR` and without asking the library (rslock's attempt is
//! a plain `SET NX PX`, the other variants' a script call).
//!
//! The count of a request goes up before the request is passed on, so a reply a client has
//! received was always counted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::error::Result;

/// The script calls counted, as RESP bulk strings (`$7\r\nEVALSHA\r\n`): scripts and Redis
/// Functions.
const SCRIPT_CALLS: &[&[u8]] = &[b"\r\nEVALSHA\r\n", b"\r\nEVAL\r\n", b"\r\nFCALL\r\n"];
/// The plain `SET`s counted.
const SETS: &[&[u8]] = &[b"\r\nSET\r\n"];

/// A listening relay; dropping it stops accepting (open connections go on until closed).
pub(crate) struct Relay {
    url: String,
    scripts: Arc<AtomicU64>,
    sets: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port; connections go to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("redis://{}", listener.local_addr()?);
        let scripts = Arc::new(AtomicU64::new(0));
        let sets = Arc::new(AtomicU64::new(0));
        let counters = (scripts.clone(), sets.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream, counters.clone()));
            }
        });
        Ok(Relay {
            url,
            scripts,
            sets,
            accept,
        })
    }

    /// `redis://127.0.0.1:<port>` of the relay.
    pub(crate) fn url(&self) -> String {
        self.url.clone()
    }

    /// The script calls sent through the relay so far (a shared counter).
    pub(crate) fn scripts(&self) -> Arc<AtomicU64> {
        self.scripts.clone()
    }

    /// The plain `SET`s sent through the relay so far (a shared counter).
    pub(crate) fn sets(&self) -> Arc<AtomicU64> {
        self.sets.clone()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    (scripts, sets): (Arc<AtomicU64>, Arc<AtomicU64>),
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let requests = async {
        let mut buf = vec![0u8; 16 * 1024];
        let (mut script_tail, mut set_tail) = (Vec::new(), Vec::new());
        loop {
            let n = from_client.read(&mut buf).await?;
            if n == 0 {
                return to_server.shutdown().await;
            }
            let calls = count_calls(SCRIPT_CALLS, &mut script_tail, &buf[..n]);
            scripts.fetch_add(calls, Ordering::SeqCst);
            let calls = count_calls(SETS, &mut set_tail, &buf[..n]);
            sets.fetch_add(calls, Ordering::SeqCst);
            to_server.write_all(&buf[..n]).await?;
        }
    };
    let replies = tokio::io::copy(&mut from_server, &mut to_client);
    let _ = tokio::join!(requests, replies);
}

/// Calls of `names` (the longest first) in `chunk`, given the `tail` of the bytes before it (a
/// name may be split between reads); `tail` is updated for the next chunk.
fn count_calls(names: &[&[u8]], tail: &mut Vec<u8>, chunk: &[u8]) -> u64 {
    let mut window = std::mem::take(tail);
    let carried = window.len();
    window.extend_from_slice(chunk);
    let mut calls = 0;
    for name in names {
        calls += window
            .windows(name.len())
            .enumerate()
            // a match that ends in the carried bytes was counted with the previous chunk
            .filter(|(at, w)| at + name.len() > carried && w.eq_ignore_ascii_case(name))
            .count() as u64;
    }
    let keep = window.len().min(names[0].len() - 1);
    *tail = window[window.len() - keep..].to_vec();
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_script_calls_and_sets_across_chunks() {
        let stream = b"*3\r\n$7\r\nEVALSHA\r\n$1\r\na\r\n*1\r\n$4\r\nPING\r\n\
                       *3\r\n$4\r\nEVAL\r\n$1\r\nb\r\n*2\r\n$7\r\nevalsha\r\n$1\r\nc\r\n\
                       *3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*2\r\n$6\r\nSETNX\r\n$1\r\nk\r\n";
        for split in 1..stream.len() {
            let (mut tail, mut set_tail) = (Vec::new(), Vec::new());
            let (mut calls, mut sets) = (0, 0);
            for chunk in stream.chunks(split) {
                calls += count_calls(SCRIPT_CALLS, &mut tail, chunk);
                sets += count_calls(SETS, &mut set_tail, chunk);
            }
            assert_eq!(calls, 3, "chunks of {split}");
            assert_eq!(sets, 1, "chunks of {split}");
        }
    }
}
