//! Lost replies (and reset connections) between the lock service and a Redis Cluster: every
//! node sits behind a fault
//! proxy it announces ([`Spec::proxied_cluster`]), so the services' scripts pass the proxies and
//! `drop_next_reply` makes Redis run a script whose reply the service never gets (its
//! connection is reset).
//!
//! The service must not send such a script again (the cluster client's own retries are off
//! for scripts): it reports a `Backend` error, gives back whatever the lost acquire may have
//! granted (by grant id), and repeats a lost release in the background. A replayed release
//! finds its grant gone and reports `NotHeld` for a release that worked; a replayed acquire
//! confirms its own grant id.
//!
//! Every cluster client routes by the addresses the nodes announce, so a service seeded with
//! the real node ports ([`Topology::node_urls`]) reaches the nodes through the proxies as well:
//! the tests of one lost reply keep every other service idle while the drop is armed. Counters
//! and lock hashes are read on raw connections to the real ports, past the proxies.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::eventually;
use lock_runtime::{ErrorKind, LockConfig, LockService, OwnerId, Topology as LockTopology, owner};
use lock_tests::harness::{Proxy, Spec, Topology, unique_key};
use redis::aio::MultiplexedConnection;

/// `redis.response_timeout` of every service.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long after a failed call a lost grant may stay on Redis: the give-back (or the repeated
/// release) runs at once, in calls bounded by the response timeout.
const GIVE_BACK_BOUND: Duration = RESPONSE_TIMEOUT.saturating_add(Duration::from_millis(500));

/// Lease of the locks the tests take: far longer than any test, so only a release frees them.
const LEASE: Duration = Duration::from_secs(30);

/// A service seeded with `nodes`.
async fn service(nodes: Vec<String>) -> LockService {
    let config = LockConfig::new(LockTopology::Cluster { nodes })
        .with_response_timeout(RESPONSE_TIMEOUT)
        .with_watchdog_timeout(LEASE);
    LockService::connect(config).await.expect("connect")
}

/// A service seeded with the proxies' ports.
async fn through_proxies(topo: &Topology) -> LockService {
    service(topo.proxied_node_urls()).await
}

/// A service seeded with the nodes' real ports (it still routes through the proxies: see the
/// module docs).
async fn seeded_direct(topo: &Topology) -> LockService {
    service(topo.node_urls()).await
}

/// The master serving the lock `key` (`lock:{key}` on Redis) and the proxy in front of it.
fn master_of<'t>(topo: &'t Topology, key: &str) -> (u16, &'t Proxy) {
    let master = topo.master_for_slot(topo.key_slot(&lock_hash(key)));
    (master, topo.proxy_for(master))
}

/// The Redis key that holds the lock `key` (default prefix `lock:`).
fn lock_hash(key: &str) -> String {
    format!("lock:{{{key}}}")
}

/// A raw connection to the node on `port`, past its proxy.
async fn raw(port: u16) -> MultiplexedConnection {
    redis::Client::open(Topology::url_of(port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The value of the mutex at the Redis key `key` (holder, token and grant ids), if any.
async fn value(con: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(con).await.unwrap()
}

/// Waits until the lock `key` is gone from Redis; returns how long that took.
async fn freed_on_redis(con: &mut MultiplexedConnection, key: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let exists: bool = redis::cmd("EXISTS")
            .arg(key)
            .query_async(con)
            .await
            .unwrap();
        if !exists {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{key} still on Redis {within:?} after the failed call: {:?}",
            value(con, key).await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the proxy has dropped `n` replies in all.
async fn dropped(proxy: &Proxy, n: u64) {
    eventually(
        &format!("{n} replies dropped"),
        Duration::from_secs(2),
        || async { proxy.replies_dropped() >= n },
    )
    .await;
}

/// An acquire whose reply is lost after Redis granted the lock: the caller gets an error and
/// the grant is given back (or, if the caller gets the lock, it is the only grant). Before the
/// cluster client's retries were turned off for scripts, the acquire ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_leaves_no_stranded_grant() {
    let topo = Topology::start(Spec::proxied_cluster()).await;
    let key = unique_key("lost-acquire");
    let (master, proxy) = master_of(&topo, &key);
    let mut direct = raw(master).await;
    let a = through_proxies(&topo).await;
    // loads the script on that master: the reply to drop is the script's, not a NOSCRIPT
    a.lock(&key)
        .lease(LEASE)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = a.inspect(&key).await.unwrap();
    assert_eq!(before.holder, None);

    proxy.drop_next_reply();
    let result = a.lock(&key).lease(LEASE).wait(Duration::from_secs(2)).await;
    let answered = Instant::now();
    assert_eq!(
        proxy.replies_dropped(),
        1,
        "the acquire's reply was the one lost"
    );

    let b = seeded_direct(&topo).await;
    match result {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
            let freed = freed_on_redis(&mut direct, &lock_hash(&key), GIVE_BACK_BOUND).await;
            let info = b.inspect(&key).await.unwrap();
            assert_eq!(info.holder, None, "a stranded holder: {info:?}");
            assert!(
                info.last_fence > before.last_fence,
                "Redis ran the acquire whose reply was lost (it issued a token): {info:?}"
            );
            let g = b
                .lock(&key)
                .lease(LEASE)
                .wait(Duration::from_secs(3))
                .await
                .unwrap();
            let taken = answered.elapsed();
            println!(
                "lost acquire reply: Backend error ({e}); given back {freed:?} after it, \
                 another service holds the lock {taken:?} after it"
            );
            assert!(
                taken < GIVE_BACK_BOUND,
                "the other service took the lock only {taken:?} after the failed acquire"
            );
            assert_eq!(b.inspect(&key).await.unwrap().hold_count, 1);
            g.release().await.unwrap();
        }
        Ok(guard) => {
            println!(
                "lost acquire reply: the caller got the lock (fence {})",
                guard.fence()
            );
            let info = b.inspect(&key).await.unwrap();
            assert_eq!(info.fence, Some(guard.fence()), "{info:?}");
            assert_eq!(info.hold_count, 1, "one grant on Redis: {info:?}");
            assert_eq!(
                b.try_lock(&key).await.unwrap_err().kind(),
                ErrorKind::Timeout
            );
            guard.release().await.unwrap();
            b.lock(&key)
                .wait(Duration::from_secs(3))
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
    }
    let info = b.inspect(&key).await.unwrap();
    assert_eq!(
        (info.holder.as_deref(), info.hold_count),
        (None, 0),
        "{info:?}"
    );
}

/// A release whose reply is lost, of a re-entered lock (the inner hold is released here
/// without a call to Redis, the outer one on Redis) and of a single hold: the caller gets
/// success or a `Backend` error, never `NotHeld` (the sign of a release that ran twice), the
/// lock is free at once, and the release repeated in the background never frees the next
/// holder's grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_release_reply_is_not_a_second_release() {
    let topo = Topology::start(Spec::proxied_cluster()).await;
    let key = unique_key("lost-release");
    let hash = lock_hash(&key);
    let (master, proxy) = master_of(&topo, &key);
    let mut direct = raw(master).await;
    let a = through_proxies(&topo).await;
    let b = seeded_direct(&topo).await;

    for (round, reentered) in [true, false].into_iter().enumerate() {
        let drops = proxy.replies_dropped();
        let released = owner::scope(OwnerId::new(), async {
            let outer = a.lock(&key).lease(LEASE).await.unwrap();
            let held = value(&mut direct, &hash).await;
            assert!(held.is_some(), "held: {held:?}");
            if reentered {
                let inner = a
                    .lock(&key)
                    .lease(LEASE)
                    .wait(Duration::from_millis(500))
                    .await
                    .unwrap();
                assert_eq!(inner.fence(), outer.fence());
                proxy.drop_next_reply();
                inner.release().await.unwrap();
                assert_eq!(
                    proxy.replies_dropped(),
                    drops,
                    "an inner release called Redis (it used the armed drop)"
                );
                assert_eq!(
                    value(&mut direct, &hash).await,
                    held,
                    "still held as before"
                );
            } else {
                proxy.drop_next_reply();
            }
            outer.release().await
        })
        .await;
        dropped(proxy, drops + 1).await;
        if let Err(e) = &released {
            assert_eq!(
                e.kind(),
                ErrorKind::Backend,
                "a release whose reply was lost (re-entered: {reentered}): {e}"
            );
        }
        let freed = freed_on_redis(&mut direct, &hash, GIVE_BACK_BOUND).await;
        println!(
            "lost release reply (re-entered: {reentered}): {:?}; freed on Redis {freed:?} \
             after the call returned",
            released.as_ref().map_err(ToString::to_string),
        );

        let g = b
            .lock(&key)
            .lease(LEASE)
            .wait(Duration::from_secs(3))
            .await
            .unwrap();
        // a release of A repeated in the background must never free B's grant
        tokio::time::sleep(Duration::from_millis(200)).await;
        let info = b.inspect(&key).await.unwrap();
        assert_eq!(info.hold_count, 1, "round {round}: {info:?}");
        assert_eq!(info.fence, Some(g.fence()), "round {round}: {info:?}");
        assert!(!g.is_lost());
        g.release().await.unwrap();
        assert!(!b.is_locked(&key).await.unwrap());
    }
}

/// What the contending tasks saw.
#[derive(Debug, Default)]
struct Tally {
    sections: AtomicU64,
    /// Tasks inside the critical section right now.
    inside: AtomicUsize,
    overlaps: AtomicU64,
    /// (operation, kind, message) of every error the library returned.
    errors: Mutex<Vec<(&'static str, ErrorKind, String)>>,
}

impl Tally {
    fn error(&self, op: &'static str, e: &lock_runtime::LockError) {
        self.errors
            .lock()
            .unwrap()
            .push((op, e.kind(), e.to_string()));
    }
}

/// Three services (two seeded with the proxies, one with the real ports) x four tasks each
/// increment a counter next to the lock (read, yield, write, on a raw connection past the
/// proxies) under the lock, while the master's proxy drops a reply every ~50 ms. No update is
/// lost (never two holders), and every error is a `Backend` error or a `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_holds_while_replies_are_lost() {
    const SERVICES: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 25;
    const WAIT: Duration = Duration::from_secs(5);
    const DROP_EVERY: Duration = Duration::from_millis(50);

    let topo = Topology::start(Spec::proxied_cluster()).await;
    let key = unique_key("exclusion");
    let counter = format!("counter:{{{key}}}");
    assert_eq!(topo.key_slot(&counter), topo.key_slot(&lock_hash(&key)));
    let (master, proxy) = master_of(&topo, &key);
    let services = vec![
        through_proxies(&topo).await,
        through_proxies(&topo).await,
        seeded_direct(&topo).await,
    ];
    assert_eq!(services.len(), SERVICES);
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for service in &services {
        for _ in 0..TASKS {
            let (locks, key, counter, tally) =
                (service.clone(), key.clone(), counter.clone(), tally.clone());
            let mut con = raw(master).await;
            tasks.spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = match locks.lock(&key).lease(LEASE).wait(WAIT).await {
                        Ok(g) => g,
                        Err(e) => {
                            tally.error("acquire", &e);
                            continue;
                        }
                    };
                    if tally.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        tally.overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let value: Option<u64> = redis::cmd("GET")
                        .arg(&counter)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let _: () = redis::cmd("SET")
                        .arg(&counter)
                        .arg(value.unwrap_or(0) + 1)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    tally.sections.fetch_add(1, Ordering::SeqCst);
                    tally.inside.fetch_sub(1, Ordering::SeqCst);
                    if let Err(e) = guard.release().await {
                        tally.error("release", &e);
                    }
                }
            });
        }
    }

    // one drop armed at a time, every ~50 ms, until the tasks are done
    let mut armed = 0;
    let mut tick = tokio::time::interval(DROP_EVERY);
    let run = async {
        loop {
            tokio::select! {
                joined = tasks.join_next() => match joined {
                    Some(result) => result.expect("a contending task panicked"),
                    None => break,
                },
                _ = tick.tick() => {
                    if proxy.replies_dropped() >= armed {
                        proxy.drop_next_reply();
                        armed += 1;
                    }
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the contending tasks did not finish within 120 s");
    proxy.heal();
    let elapsed = started.elapsed();

    let sections = tally.sections.load(Ordering::SeqCst);
    let value: Option<u64> = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut raw(master).await)
        .await
        .unwrap();
    let errors = tally.errors.lock().unwrap().clone();
    let mut kinds: HashMap<(&str, ErrorKind), usize> = HashMap::new();
    for (op, kind, _) in &errors {
        *kinds.entry((op, *kind)).or_default() += 1;
    }
    println!(
        "{sections} critical sections of {} in {elapsed:?}, {} replies dropped, errors by kind: \
         {kinds:?}",
        SERVICES * TASKS * ROUNDS,
        proxy.replies_dropped()
    );
    assert!(proxy.replies_dropped() > 0, "no reply was dropped");
    assert!(sections > 0);
    assert_eq!(
        tally.overlaps.load(Ordering::SeqCst),
        0,
        "two holders at once"
    );
    assert_eq!(value, Some(sections), "lost updates: two holders at once");
    let unexpected: Vec<_> = errors
        .iter()
        .filter(|(_, kind, _)| !matches!(kind, ErrorKind::Backend | ErrorKind::Timeout))
        .collect();
    assert!(
        unexpected.is_empty(),
        "errors other than Backend / Timeout: {unexpected:?}"
    );
    // nothing stranded: every lost grant was given back, every lost release repeated
    let locks = &services[2];
    eventually(
        "the lock is free once the contention is over",
        GIVE_BACK_BOUND,
        || async { !locks.is_locked(&key).await.unwrap() },
    )
    .await;
}

/// How many connections of the node on `port` are subscribed to the shard channel `channel`.
async fn shard_subscribers(port: u16, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(&mut raw(port).await)
        .await
        .unwrap();
    n
}

/// A service whose connections to a node are reset while one of its callers waits is subscribed
/// to the lock's channel again once, on the node that serves its slot: the cluster client
/// restores its shard subscriptions by itself after a reconnection, and a second `SSUBSCRIBE`
/// of the service's own, sent while the client was reconnecting, landed on another node of the
/// shard (a replica), which then delivered every wake-up of the channel a second time. B waits
/// for a lock A holds; the connections through the lock's master's proxy are reset twenty
/// times, and after each reset the shard's nodes hold one subscription to the channel in all
/// (B's; A waits for nothing), and B still gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_service_is_subscribed_once() {
    const RESETS: usize = 20;
    let topo = Topology::start(Spec::proxied_cluster()).await;
    let key = unique_key("resubscribed");
    let channel = format!("{}:ch", lock_hash(&key));
    let (master, proxy) = master_of(&topo, &key);
    let a = through_proxies(&topo).await;
    let b = through_proxies(&topo).await;
    let held = a.lock(&key).lease(LEASE).await.unwrap();
    // B keeps waiting: an attempt whose connection was reset fails (`Backend`), and B asks again
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            loop {
                match b
                    .lock(&key)
                    .lease(LEASE)
                    .wait(Duration::from_secs(60))
                    .await
                {
                    Err(e) if e.kind() == ErrorKind::Backend => continue,
                    other => return other,
                }
            }
        })
    };
    eventually("B subscribed", Duration::from_secs(5), || async {
        shard_subscribers(master, &channel).await == 1
    })
    .await;
    let mut most = 0;
    for _ in 0..RESETS {
        proxy.reset_all().await;
        eventually("B subscribed again", Duration::from_secs(5), || async {
            shard_subscribers(master, &channel).await >= 1
        })
        .await;
        // both restorations (if there were two) are done well within this
        let settle = Instant::now() + Duration::from_millis(300);
        while Instant::now() < settle {
            let mut all = 0;
            for port in topo.node_ports() {
                all += shard_subscribers(port, &channel).await;
            }
            most = most.max(all);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    println!("at most {most} subscriptions to the channel after {RESETS} resets");
    assert_eq!(
        most, 1,
        "a service subscribed on two nodes of the shard hears every message twice"
    );
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("B got the lock after the resets")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}
