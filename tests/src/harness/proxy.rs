//! [`Proxy`]: a loopback TCP proxy in front of one node that injects network faults (latency,
//! lost replies, partitions, pauses, resets) between its clients and that node.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::util;

/// The most bytes one read forwards as one chunk.
const CHUNK: usize = 16 * 1024;

/// Chunks in flight per direction of a connection (read, not yet delivered).
const QUEUE: usize = 64;

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Request chunks at the start of a connection searched for a replica's handshake.
const HANDSHAKE_CHUNKS: usize = 8;

/// The fault settings of a [`Proxy`] that apply to every connection, as
/// [`Proxy::faults`] reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Delay of every chunk from the server to the client ([`Proxy::set_latency`]).
    pub reply_latency: Duration,
    /// Delay of every chunk from the client to the server ([`Proxy::set_request_latency`]).
    pub request_latency: Duration,
    /// Bytes in both directions are discarded ([`Proxy::blackhole`]).
    pub blackhole: bool,
    /// Nothing is delivered until [`Proxy::resume`] ([`Proxy::pause`]).
    pub paused: bool,
}

impl Faults {
    fn latency(&self, dir: Dir) -> Duration {
        match dir {
            Dir::Request => self.request_latency,
            Dir::Reply => self.reply_latency,
        }
    }
}

/// A loopback TCP proxy in front of one upstream node that injects network faults.
///
/// [`Proxy::start`] listens on a free `127.0.0.1` port and pipes every client connection it
/// accepts to a new connection to the upstream node. Faults are switched at run time and apply
/// to every connection; some also to one connection, by its index (connections are numbered
/// from 0 in the order the proxy accepts them; a `redis` multiplexed connection or connection
/// manager opens one per (re)connect).
///
/// | fault | effect |
/// |---|---|
/// | [`Proxy::set_latency`], [`Proxy::set_request_latency`] | every chunk is delivered that long after it was read, in order |
/// | [`Proxy::drop_next_reply`], [`Proxy::drop_next_reply_on`] | the next chunk from the server is discarded and that connection reset: the server ran the command, the client lost the reply and the connection |
/// | [`Proxy::blackhole`] | a partition: bytes in both directions are discarded, connections stay open and new ones are accepted, nothing flows |
/// | [`Proxy::pause`], [`Proxy::resume`] | nothing is delivered, but nothing is lost either: the bytes are delivered on resume |
/// | [`Proxy::reset_all`], [`Proxy::reset`] | connections are closed with a TCP reset on both sides |
///
/// A proxy in front of a master that its replicas reach through the proxy too (a proxied
/// cluster: replicas follow the address the master announces) can spare their replication
/// links ([`Proxy::spare_replication`]): the faults switched for the whole proxy then hit
/// clients only, not the replication stream.
///
/// The proxy sees bytes, not commands. It forwards what one `read` from a socket returns (at
/// most 16 KiB) as one *chunk*, and the reply faults act on chunks. With one command in flight
/// on a connection, one chunk from the server is the whole reply (Redis writes a reply at once,
/// and a small one arrives in one piece on loopback); with pipelined or concurrent commands a
/// chunk may hold several replies, and a reply of more than 16 KiB spans several chunks.
///
/// Dropping the [`Proxy`] closes its listener and every connection (as soon as the runtime
/// handles the abort of the accept task, which owns the connection tasks). Memory is bounded: each direction of a connection holds
/// at most 64 chunks in flight, beyond that the proxy stops reading and TCP flow control holds
/// the sender back.
///
/// ```no_run
/// use lock_tests::harness::{Kind, Proxy, Topology, shared};
///
/// # async fn demo() -> redis::RedisResult<()> {
/// let topo = shared(Kind::Single).await;
/// let proxy = Proxy::start(Topology::addr_of(topo.master_port())).await;
/// let client = redis::Client::open(proxy.url())?;
/// let mut con = client.get_multiplexed_async_connection().await?;
/// proxy.drop_next_reply();
/// // The server increments the counter, the client sees its connection dropped.
/// assert!(redis::cmd("INCR").arg("n").query_async::<i64>(&mut con).await.is_err());
/// assert_eq!(proxy.replies_dropped(), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
}

/// State shared by the [`Proxy`] handle, the accept task and the connection tasks.
#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    faults: watch::Sender<Faults>,
    /// Replies to drop on whichever connection delivers one first.
    drops_armed: AtomicUsize,
    /// Faults switched for the whole proxy leave replication links alone.
    spare_replication: AtomicBool,
    accepted: AtomicU64,
    replies_dropped: AtomicU64,
    /// Open connections by index.
    conns: Mutex<HashMap<usize, Arc<Conn>>>,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, HashMap<usize, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn conn(&self, index: usize) -> Option<Arc<Conn>> {
        self.conns().get(&index).cloned()
    }
}

/// One open connection, as the [`Proxy`] handle reaches it.
#[derive(Debug)]
struct Conn {
    /// Tells the connection task to reset the connection.
    reset: Notify,
    /// Replies to drop on this connection.
    drops_armed: AtomicUsize,
    /// The connection began with a replica's handshake (`REPLCONF`).
    replication: AtomicBool,
    /// Its sender lives as long as the connection task; closed once both sockets are.
    done: watch::Receiver<()>,
}

impl Conn {
    /// Waits until the connection task has ended and closed its sockets.
    async fn closed(&self) {
        let mut done = self.done.clone();
        while done.changed().await.is_ok() {}
    }
}

/// Held by a connection task: unregisters the connection and signals [`Conn::closed`] when the
/// task ends, also when it is aborted.
#[derive(Debug)]
struct Registration {
    shared: Arc<Shared>,
    index: usize,
    _done: watch::Sender<()>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.conns().remove(&self.index);
    }
}

/// Direction of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Client to server.
    Request,
    /// Server to client.
    Reply,
}

/// Bytes read from one side, to be delivered to the other at `due`.
#[derive(Debug)]
struct Chunk {
    bytes: Vec<u8>,
    due: Instant,
}

/// Why a direction of a connection stopped before both sides finished.
#[derive(Debug)]
enum Stop {
    /// A read or write failed: the connection is closed.
    Io,
    /// An armed drop discarded a reply: the connection is reset.
    ReplyDropped,
}

impl Proxy {
    /// Starts a proxy to `upstream` on a free `127.0.0.1` port. Its tasks run on the current
    /// tokio runtime, so a blocking client (`redis::Connection`) talking through the proxy needs
    /// a multi-thread runtime, or a thread of its own.
    ///
    /// # Panics
    ///
    /// If `upstream` is not a loopback address, if no port can be bound, or outside a tokio
    /// runtime.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        Proxy::start_in(&Handle::current(), upstream)
    }

    /// [`Proxy::start`] on the runtime of `handle`, for blocking code (the harness starts the
    /// proxies of a proxied cluster on tokio's blocking pool). The listener is bound before
    /// this returns, so the port is the proxy's from then on.
    ///
    /// # Panics
    ///
    /// As [`Proxy::start`].
    pub(crate) fn start_in(handle: &Handle, upstream: SocketAddr) -> Proxy {
        assert!(
            upstream.ip().is_loopback(),
            "the proxy only forwards to loopback addresses, not {upstream}"
        );
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("proxy: cannot bind 127.0.0.1:0: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("proxy: cannot make the listener non-blocking: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy: no local address: {e}"));
        let listener = {
            let _runtime = handle.enter();
            TcpListener::from_std(listener)
                .unwrap_or_else(|e| panic!("proxy: cannot register the listener: {e}"))
        };
        let shared = Arc::new(Shared {
            upstream,
            faults: watch::Sender::new(Faults::default()),
            drops_armed: AtomicUsize::new(0),
            spare_replication: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            replies_dropped: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        let acceptor = handle.spawn(accept_loop(listener, Arc::clone(&shared)));
        Proxy {
            addr,
            shared,
            acceptor,
        }
    }

    /// The address clients connect to: `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        util::url(self.port())
    }

    /// The address of the node behind the proxy.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The current settings of the faults that apply to every connection.
    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    /// Delays every chunk from the server to the client by `latency` from when the proxy read
    /// it (zero: no delay). Order is kept, and chunks already read keep the delay they got.
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .faults
            .send_modify(|f| f.reply_latency = latency);
    }

    /// Delays every chunk from the client to the server by `latency`, like
    /// [`Proxy::set_latency`] does for replies.
    pub fn set_request_latency(&self, latency: Duration) {
        self.shared
            .faults
            .send_modify(|f| f.request_latency = latency);
    }

    /// Arms one reply drop: the next chunk the proxy would deliver from the server to a
    /// client, on whichever connection comes first, is discarded, and that connection is
    /// reset on both sides. The server has executed the command; the client sees its
    /// connection reset without a reply. Each call arms one more drop.
    ///
    /// A chunk is the result of one read (see [`Proxy`]): with one
    /// command in flight it is that command's reply. Chunks discarded by
    /// [`Proxy::blackhole`] do not use up an armed drop.
    pub fn drop_next_reply(&self) {
        self.shared.drops_armed.fetch_add(1, Ordering::SeqCst);
    }

    /// [`Proxy::drop_next_reply`] for the connection with this index only. Returns `false`
    /// (and arms nothing) if that connection is not open.
    pub fn drop_next_reply_on(&self, conn: usize) -> bool {
        match self.shared.conn(conn) {
            Some(c) => {
                c.drops_armed.fetch_add(1, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Turns the partition on or off. While on, bytes in both directions are discarded (also
    /// chunks read before and still delayed), new connections are accepted and connected
    /// upstream but nothing flows, and no connection is closed: clients only see silence.
    /// An end of stream from either side is passed on once the partition is off.
    pub fn blackhole(&self, on: bool) {
        self.shared.faults.send_modify(|f| f.blackhole = on);
    }

    /// Stops delivering in both directions without losing anything: what arrives meanwhile is
    /// held (up to 64 chunks per direction, then by TCP flow control) and delivered, in order,
    /// on [`Proxy::resume`].
    pub fn pause(&self) {
        self.shared.faults.send_modify(|f| f.paused = true);
    }

    /// Delivers what [`Proxy::pause`] held and forwards normally again.
    pub fn resume(&self) {
        self.shared.faults.send_modify(|f| f.paused = false);
    }

    /// Spares replication links (on) or not (off, the default) from the faults switched for the
    /// whole proxy: latency, [`Proxy::drop_next_reply`], [`Proxy::blackhole`],
    /// [`Proxy::pause`] and [`Proxy::reset_all`]. A replication link is a connection whose
    /// first requests hold a replica's `REPLCONF` (a replica's `PING` before it is still a
    /// client's). Faults aimed at one connection by index ([`Proxy::drop_next_reply_on`],
    /// [`Proxy::reset`]) still apply.
    pub fn spare_replication(&self, on: bool) {
        self.shared.spare_replication.store(on, Ordering::SeqCst);
    }

    /// Indexes of the open connections recognised as replication links (see
    /// [`Proxy::spare_replication`]), in ascending order.
    pub fn replication_connections(&self) -> Vec<usize> {
        let mut links: Vec<usize> = self
            .shared
            .conns()
            .iter()
            .filter(|(_, c)| c.replication.load(Ordering::SeqCst))
            .map(|(&i, _)| i)
            .collect();
        links.sort_unstable();
        links
    }

    /// Clears every fault: no latency, no partition, not paused, no armed drop.
    pub fn heal(&self) {
        self.shared.faults.send_replace(Faults::default());
        self.shared.drops_armed.store(0, Ordering::SeqCst);
        for conn in self.shared.conns().values() {
            conn.drops_armed.store(0, Ordering::SeqCst);
        }
    }

    /// Resets every open connection (a TCP reset to the client and to the server) and waits
    /// until their sockets are closed. Returns how many connections were reset. The listener
    /// keeps accepting. Spared replication links stay open (see [`Proxy::spare_replication`]).
    pub async fn reset_all(&self) -> usize {
        let spare = self.shared.spare_replication.load(Ordering::SeqCst);
        let conns: Vec<Arc<Conn>> = self
            .shared
            .conns()
            .values()
            .filter(|c| !(spare && c.replication.load(Ordering::SeqCst)))
            .cloned()
            .collect();
        for conn in &conns {
            conn.reset.notify_one();
        }
        for conn in &conns {
            conn.closed().await;
        }
        conns.len()
    }

    /// Resets the connection with this index, like [`Proxy::reset_all`]. Returns `false` if
    /// it is not open.
    pub async fn reset(&self, conn: usize) -> bool {
        let Some(conn) = self.shared.conn(conn) else {
            return false;
        };
        conn.reset.notify_one();
        conn.closed().await;
        true
    }

    /// Number of client connections accepted so far; the next one gets this index.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Number of replies discarded by armed drops so far.
    pub fn replies_dropped(&self) -> u64 {
        self.shared.replies_dropped.load(Ordering::SeqCst)
    }

    /// Indexes of the connections open now, in ascending order.
    pub fn open_connections(&self) -> Vec<usize> {
        let mut open: Vec<usize> = self.shared.conns().keys().copied().collect();
        open.sort_unstable();
        open
    }
}

impl Drop for Proxy {
    /// Stops the listener and closes every connection (the accept task owns the connection
    /// tasks; aborting it aborts them).
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Accepts clients until aborted; each connection is a task of its own in `tasks`, so that
/// aborting this task ends them all.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut tasks = JoinSet::new();
    let mut next_index = 0;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    let index = next_index;
                    next_index += 1;
                    let (done_tx, done_rx) = watch::channel(());
                    let conn = Arc::new(Conn {
                        reset: Notify::new(),
                        drops_armed: AtomicUsize::new(0),
                        replication: AtomicBool::new(false),
                        done: done_rx,
                    });
                    shared.conns().insert(index, Arc::clone(&conn));
                    let registration = Registration {
                        shared: Arc::clone(&shared),
                        index,
                        _done: done_tx,
                    };
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    tasks.spawn(serve(client, conn, registration));
                }
                Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

/// Closes `stream` with a TCP reset once it is dropped.
fn reset_on_close(stream: &TcpStream) {
    // `SO_LINGER` of zero does not block on close; tokio 1.50 names this `set_zero_linger`.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Runs one client connection: connects upstream, then pipes both directions until both sides
/// have finished, an error, a dropped reply or a reset.
async fn serve(mut client: TcpStream, conn: Arc<Conn>, registration: Registration) {
    let shared = Arc::clone(&registration.shared);
    let connected = tokio::select! {
        connected = TcpStream::connect(shared.upstream) => connected.ok(),
        () = conn.reset.notified() => None,
    };
    let Some(mut server) = connected else {
        reset_on_close(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let link = Link {
            shared: &shared,
            conn: &conn,
        };
        let both = async {
            tokio::try_join!(
                pipe(client_read, server_write, Dir::Request, link),
                pipe(server_read, client_write, Dir::Reply, link),
            )
        };
        tokio::select! {
            () = conn.reset.notified() => true,
            ended = both => matches!(ended, Err(Stop::ReplyDropped)),
        }
    };
    if reset {
        reset_on_close(&client);
        reset_on_close(&server);
    }
    drop(client);
    drop(server);
    drop(registration);
}

/// What the pipes of a connection read their faults from.
#[derive(Debug, Clone, Copy)]
struct Link<'a> {
    shared: &'a Shared,
    conn: &'a Conn,
}

impl Link<'_> {
    /// `true` when the faults switched for the whole proxy leave this connection alone.
    fn spared(&self) -> bool {
        self.shared.spare_replication.load(Ordering::SeqCst)
            && self.conn.replication.load(Ordering::SeqCst)
    }

    /// The faults that apply to this connection now.
    fn faults(&self) -> Faults {
        if self.spared() {
            Faults::default()
        } else {
            *self.shared.faults.borrow()
        }
    }

    /// Uses up an armed drop of this connection, else one of the proxy (unless spared), and
    /// counts it.
    fn take_armed_drop(&self) -> bool {
        let take = |armed: &AtomicUsize| {
            armed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        };
        let taken =
            take(&self.conn.drops_armed) || (!self.spared() && take(&self.shared.drops_armed));
        if taken {
            self.shared.replies_dropped.fetch_add(1, Ordering::SeqCst);
        }
        taken
    }
}

/// One direction of a connection: a reader stamping chunks with their due time and a writer
/// delivering them, joined by a bounded queue.
async fn pipe(src: ReadHalf<'_>, dst: WriteHalf<'_>, dir: Dir, link: Link<'_>) -> Result<(), Stop> {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::try_join!(read_chunks(src, tx, dir, link), deliver(rx, dst, dir, link))?;
    Ok(())
}

/// Reads chunks from `src` until its end of stream. Discards them during a partition.
async fn read_chunks(
    mut src: ReadHalf<'_>,
    tx: mpsc::Sender<Chunk>,
    dir: Dir,
    link: Link<'_>,
) -> Result<(), Stop> {
    let mut buf = vec![0; CHUNK];
    let mut handshake = if dir == Dir::Request {
        HANDSHAKE_CHUNKS
    } else {
        0
    };
    loop {
        let n = src.read(&mut buf).await.map_err(|_| Stop::Io)?;
        if n == 0 {
            return Ok(());
        }
        if handshake > 0 {
            handshake -= 1;
            if is_replica_handshake(&buf[..n]) {
                link.conn.replication.store(true, Ordering::SeqCst);
                handshake = 0;
            }
        }
        let faults = link.faults();
        if faults.blackhole {
            continue;
        }
        let chunk = Chunk {
            bytes: buf[..n].to_vec(),
            due: Instant::now() + faults.latency(dir),
        };
        if tx.send(chunk).await.is_err() {
            // The writer stopped; `pipe` ends with its result.
            return Ok(());
        }
    }
}

/// Delivers the chunks to `dst` when due, unless paused, partitioned or dropped; then passes
/// the end of stream on.
async fn deliver(
    mut rx: mpsc::Receiver<Chunk>,
    mut dst: WriteHalf<'_>,
    dir: Dir,
    link: Link<'_>,
) -> Result<(), Stop> {
    let mut faults = link.shared.faults.subscribe();
    while let Some(chunk) = rx.recv().await {
        if chunk.due > Instant::now() {
            tokio::time::sleep_until(chunk.due).await;
        }
        if !link.spared() {
            // The sender lives in `Shared`, which outlives this task: `wait_for` cannot fail.
            let _ = faults.wait_for(|f| !f.paused).await;
            if faults.borrow().blackhole {
                continue;
            }
        }
        if dir == Dir::Reply && link.take_armed_drop() {
            return Err(Stop::ReplyDropped);
        }
        dst.write_all(&chunk.bytes).await.map_err(|_| Stop::Io)?;
    }
    if !link.spared() {
        let _ = faults.wait_for(|f| !f.paused && !f.blackhole).await;
    }
    dst.shutdown().await.map_err(|_| Stop::Io)
}

/// `true` when request bytes hold a replica's `REPLCONF` (sent after its `PING`, before
/// `PSYNC`, in every replication handshake).
fn is_replica_handshake(bytes: &[u8]) -> bool {
    const REPLCONF: &[u8] = b"REPLCONF";
    bytes
        .windows(REPLCONF.len())
        .any(|w| w.eq_ignore_ascii_case(REPLCONF))
}

#[cfg(test)]
mod tests {
    use super::is_replica_handshake;

    #[test]
    fn recognises_a_replica_handshake() {
        assert!(is_replica_handshake(
            b"*3\r\n$8\r\nREPLCONF\r\n$14\r\nlistening-port\r\n$4\r\n7001\r\n"
        ));
        assert!(is_replica_handshake(b"*1\r\n$8\r\nreplconf\r\n"));
        assert!(!is_replica_handshake(b"*1\r\n$4\r\nPING\r\n"));
        assert!(!is_replica_handshake(b"*2\r\n$3\r\nGET\r\n$4\r\nREPL\r\n"));
    }
}
