//! Tests of the fault proxy of the harness ([`Proxy`]) in front of a real redis-server: plain
//! forwarding, latency, a lost reply on a reset connection, a partition, pause, resets, and
//! that dropping the proxy closes everything.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use lock_tests::harness::{Faults, Kind, Proxy, Topology, shared, unique_key};
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Deadline of every awaited condition.
const DEADLINE: Duration = Duration::from_secs(2);

/// Response timeout of clients that must not time out.
const PATIENT: Duration = Duration::from_secs(2);

/// A proxy in front of the shared single server.
async fn proxied() -> (&'static Topology, Proxy) {
    let topo = shared(Kind::Single).await;
    let proxy = Proxy::start(Topology::addr_of(topo.master_port())).await;
    assert_eq!(proxy.upstream().port(), topo.master_port());
    assert!(proxy.addr().ip().is_loopback());
    (topo, proxy)
}

/// A multiplexed connection to `url` whose commands time out after `response_timeout`.
async fn connect(url: &str, response_timeout: Duration) -> MultiplexedConnection {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(DEADLINE))
        .set_response_timeout(Some(response_timeout));
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// A connection straight to the server, past the proxy.
async fn direct(topo: &Topology) -> MultiplexedConnection {
    connect(&topo.master_url(), PATIENT).await
}

async fn ping(con: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(con).await
}

async fn incr(con: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<i64> {
    redis::cmd("INCR").arg(key).query_async(con).await
}

async fn get(con: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(con).await.unwrap()
}

/// Polls `cond` every 5 ms; panics with `what` after [`DEADLINE`].
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {DEADLINE:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Reads from `stream` until `expected` bytes arrived, within [`DEADLINE`].
async fn read_exactly(stream: &mut TcpStream, expected: &[u8]) {
    let mut buf = vec![0; expected.len()];
    tokio::time::timeout(DEADLINE, stream.read_exact(&mut buf))
        .await
        .expect("no reply in time")
        .expect("read the reply");
    assert_eq!(
        String::from_utf8_lossy(&buf),
        String::from_utf8_lossy(expected)
    );
}

#[tokio::test]
async fn forwards_commands_and_replies() {
    let (topo, proxy) = proxied().await;
    let key = unique_key("proxy:plain");
    let mut con = connect(&proxy.url(), PATIENT).await;
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("v")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(get(&mut con, &key).await.as_deref(), Some("v"));
    assert_eq!(
        get(&mut direct(topo).await, &key).await.as_deref(),
        Some("v")
    );

    // A value larger than one chunk (16 KiB) both ways.
    let big = "x".repeat(100_000);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&big)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(get(&mut con, &key).await.as_deref(), Some(big.as_str()));

    assert_eq!(proxy.accepted(), 1);
    assert_eq!(proxy.open_connections(), vec![0]);
    assert_eq!(proxy.replies_dropped(), 0);
    assert_eq!(proxy.faults(), Faults::default());
}

#[tokio::test]
async fn latency_delays_replies_and_requests_in_order() {
    let (_topo, proxy) = proxied().await;
    let mut con = connect(&proxy.url(), PATIENT).await;
    let latency = Duration::from_millis(150);

    proxy.set_latency(latency);
    let started = Instant::now();
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");
    let took = started.elapsed();
    assert!(took >= latency, "PING answered in {took:?}");

    proxy.set_request_latency(latency);
    assert_eq!(proxy.faults().request_latency, latency);
    let started = Instant::now();
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");
    let took = started.elapsed();
    assert!(took >= 2 * latency, "PING answered in {took:?}");

    // Commands sent one after the other, without waiting, are answered in order.
    let key = unique_key("proxy:order");
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let mut con = con.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move { incr(&mut con, &key).await }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut values = Vec::new();
    for task in tasks {
        values.push(task.await.unwrap().unwrap());
    }
    assert_eq!(values, vec![1, 2, 3, 4, 5]);

    proxy.heal();
    assert_eq!(proxy.faults(), Faults::default());
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");
}

#[tokio::test]
async fn a_dropped_reply_fails_the_client_after_the_server_ran_the_command() {
    let (topo, proxy) = proxied().await;
    let key = unique_key("proxy:drop");
    let mut con = connect(&proxy.url(), PATIENT).await;
    assert_eq!(incr(&mut con, &key).await.unwrap(), 1);

    proxy.drop_next_reply();
    let started = Instant::now();
    let err = incr(&mut con, &key).await.unwrap_err();
    let took = started.elapsed();
    // The connection failed: the client did not wait out its response timeout.
    assert!(!err.is_timeout() && took < PATIENT, "{err} after {took:?}");
    assert_eq!(proxy.replies_dropped(), 1);
    assert_eq!(
        get(&mut direct(topo).await, &key).await.as_deref(),
        Some("2")
    );
    wait_until("the connection is closed", || {
        proxy.open_connections().is_empty()
    })
    .await;

    // One drop per call: a new connection works.
    let mut con = connect(&proxy.url(), PATIENT).await;
    assert_eq!(incr(&mut con, &key).await.unwrap(), 3);
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.replies_dropped(), 1);
}

#[tokio::test]
async fn a_reply_drop_on_one_connection_leaves_the_others_alone() {
    let (topo, proxy) = proxied().await;
    let key = unique_key("proxy:drop-on");
    let mut first = connect(&proxy.url(), PATIENT).await;
    let mut second = connect(&proxy.url(), PATIENT).await;
    assert_eq!(proxy.open_connections(), vec![0, 1]);

    assert!(proxy.drop_next_reply_on(1));
    assert!(!proxy.drop_next_reply_on(7));
    assert_eq!(incr(&mut first, &key).await.unwrap(), 1);
    assert!(incr(&mut second, &key).await.is_err());
    assert_eq!(incr(&mut first, &key).await.unwrap(), 3);
    assert_eq!(
        get(&mut direct(topo).await, &key).await.as_deref(),
        Some("3")
    );
    assert_eq!(proxy.replies_dropped(), 1);
    wait_until("only the first connection is open", || {
        proxy.open_connections() == vec![0]
    })
    .await;
}

#[tokio::test]
async fn blackhole_swallows_both_ways_until_lifted() {
    let (topo, proxy) = proxied().await;
    let key = unique_key("proxy:blackhole");
    let short = Duration::from_millis(300);
    let mut con = connect(&proxy.url(), short).await;
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");

    proxy.blackhole(true);
    let err = redis::cmd("SET")
        .arg(&key)
        .arg(1)
        .query_async::<()>(&mut con)
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // The request was discarded, not held: the server never saw it.
    assert_eq!(get(&mut direct(topo).await, &key).await, None);
    assert_eq!(proxy.open_connections(), vec![0]);

    // A new connection is accepted, but nothing flows on it.
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    wait_until("the new connection is accepted", || proxy.accepted() == 2).await;
    raw.write_all(b"PING during\r\n").await.unwrap();
    let mut buf = [0; 64];
    let silent = tokio::time::timeout(Duration::from_millis(200), raw.read(&mut buf)).await;
    assert!(silent.is_err(), "read during the partition: {silent:?}");

    proxy.blackhole(false);
    let mut fresh = connect(&proxy.url(), PATIENT).await;
    assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
    // The raw connection survived, and its first request is gone for good.
    raw.write_all(b"PING after\r\n").await.unwrap();
    read_exactly(&mut raw, b"$5\r\nafter\r\n").await;
    assert_eq!(proxy.replies_dropped(), 0);
}

#[tokio::test]
async fn pause_holds_traffic_until_resume() {
    let (_topo, proxy) = proxied().await;
    let mut con = connect(&proxy.url(), PATIENT).await;
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");

    proxy.pause();
    let mut pending = tokio::spawn({
        let mut con = con.clone();
        async move { ping(&mut con).await }
    });
    let held = tokio::time::timeout(Duration::from_millis(200), &mut pending).await;
    assert!(held.is_err(), "answered while paused: {held:?}");
    proxy.resume();
    let pong = tokio::time::timeout(DEADLINE, pending)
        .await
        .expect("no reply after resume")
        .unwrap()
        .unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn reset_all_breaks_open_connections_with_a_reset() {
    let (_topo, proxy) = proxied().await;
    let mut con = connect(&proxy.url(), PATIENT).await;
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    read_exactly(&mut raw, b"+PONG\r\n").await;
    assert_eq!(proxy.open_connections(), vec![0, 1]);

    assert_eq!(proxy.reset_all().await, 2);
    assert!(proxy.open_connections().is_empty());
    let mut buf = [0; 16];
    let read = tokio::time::timeout(DEADLINE, raw.read(&mut buf))
        .await
        .expect("nothing happened on the reset connection");
    assert_eq!(
        read.map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionReset),
        "the client should see a reset"
    );
    let err = ping(&mut con).await.unwrap_err();
    assert!(!err.is_timeout(), "{err}");

    // The listener still accepts, and a single connection can be reset by index.
    let mut fresh = connect(&proxy.url(), PATIENT).await;
    assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
    assert!(proxy.reset(2).await);
    assert!(!proxy.reset(2).await);
    assert!(ping(&mut fresh).await.is_err());
}

#[tokio::test]
async fn dropping_the_proxy_closes_the_listener_and_the_connections() {
    let (_topo, proxy) = proxied().await;
    let addr = proxy.addr();
    let mut raw = TcpStream::connect(addr).await.unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    read_exactly(&mut raw, b"+PONG\r\n").await;

    drop(proxy);
    let mut buf = [0; 16];
    let read = tokio::time::timeout(DEADLINE, raw.read(&mut buf))
        .await
        .expect("the connection stayed open after the drop");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let deadline = Instant::now() + DEADLINE;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "{addr} still accepts");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
