//! Multi-key locks (`lock_all`) against real Redis: all or nothing (a busy key leaves none of
//! the others held, checked on Redis), no deadlock between callers naming the keys in opposite
//! orders, a fencing token per key that strictly increases, one guard whose release (or drop)
//! frees every key, and keys served by different cluster masters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::{Fixture, eventually, lock_key, script_calls};
use lock_runtime::{ErrorKind, LockService};
use lock_tests::harness::{Kind, unique_key};

const LONG: Duration = Duration::from_secs(30);

/// `n` keys that sort (as Redis keys) in the order they are returned.
fn keys(prefix: &str, n: usize) -> Vec<String> {
    let base = unique_key(prefix);
    (1..=n).map(|i| format!("{base}:{i}")).collect()
}

async fn holder(locks: &LockService, key: &str) -> Option<String> {
    locks.inspect(key).await.unwrap().holder
}

// ---- on every topology ----

/// When one key is held by someone else and the wait runs out, the keys taken before it are
/// released before the error returns (they were taken: Redis ran a write of their lock keys),
/// and the keys after it were never taken (no write of theirs). Once the busy key is free, the
/// same request takes them all.
async fn all_or_nothing_when_one_key_is_busy(fx: Fixture) {
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    for busy in [2, 1] {
        let ks = keys("all-or-nothing", 3);
        let held = a.lock(&ks[busy]).lease(LONG).await.unwrap();
        // named in another order than they are taken
        let asked = [ks[2].clone(), ks[0].clone(), ks[1].clone()];
        for wait in [Duration::ZERO, Duration::from_millis(300)] {
            // the writes of each lock key, on the node that serves it
            let mut writes = Vec::new();
            for key in &ks {
                let set = format!("\"set\" \"{}\" ", lock_key(key));
                let monitor =
                    crate::common::Monitor::start(fx.node_for(&lock_key(key)), move |l| {
                        l.contains(" lua] ") && l.contains(&set)
                    })
                    .await;
                writes.push(monitor);
            }
            let err = b.lock_all(asked.clone()).wait(wait).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
            for monitor in &writes {
                monitor.sync().await;
            }
            for (i, key) in ks.iter().enumerate() {
                let info = b.inspect(key).await.unwrap();
                if i == busy {
                    assert_eq!(info.fence, Some(held.fence()), "still A's: {info:?}");
                    continue;
                }
                assert_eq!(
                    info.holder, None,
                    "busy key {busy}, wait {wait:?}: key {i} left held: {info:?}"
                );
                assert!(!b.is_locked(key).await.unwrap());
                assert!(!fx.exists(&lock_key(key)), "key {i} left on Redis");
                let written = writes[i].lines();
                if i < busy {
                    assert!(
                        !written.is_empty(),
                        "key {i} (taken before the busy one) was never taken: the check \
                         proves nothing"
                    );
                } else {
                    assert!(
                        written.is_empty(),
                        "key {i} was taken after the busy one: {written:#?}"
                    );
                }
            }
        }
        let waiting = {
            let (b, asked) = (b.clone(), asked.clone());
            tokio::spawn(async move {
                b.lock_all(asked)
                    .lease(LONG)
                    .wait(Duration::from_secs(10))
                    .await
            })
        };
        eventually(
            "B waits for the busy key",
            Duration::from_secs(5),
            || async { b.inspect(&ks[busy]).await.unwrap().local_waiters == 1 },
        )
        .await;
        held.release().await.unwrap();
        let all = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("B took every key once the busy one was free")
            .unwrap()
            .unwrap();
        for key in &ks {
            let info = a.inspect(key).await.unwrap();
            assert_eq!(info.fence, all.fence(key), "{key}: {info:?}");
            assert!(info.holder.is_some());
        }
        all.release().await.unwrap();
        for key in &ks {
            assert!(!a.is_locked(key).await.unwrap());
        }
    }
}

/// Two services x four tasks lock `[a, b]` and `[b, a]` again and again with no wait limit
/// and no lease: all of them finish (bounded by a deadline), one at a time.
async fn opposite_orders_never_deadlock(fx: Fixture) {
    const TASKS: usize = 4;
    const ROUNDS: usize = 10;
    let services = [fx.service(LONG).await, fx.service(LONG).await];
    let (a, b) = (unique_key("order-a"), unique_key("order-b"));
    let inside = Arc::new(AtomicI64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for service in &services {
        for task in 0..TASKS {
            let keys = if task % 2 == 0 {
                [a.clone(), b.clone()]
            } else {
                [b.clone(), a.clone()]
            };
            let (locks, inside, overlaps) = (service.clone(), inside.clone(), overlaps.clone());
            tasks.spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locks.lock_all(keys.clone()).await.unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            });
        }
    }
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(joined) = tasks.join_next().await {
            joined.expect("a locking task panicked");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("deadlock: the tasks were still waiting after 30 s"));
    println!(
        "{} pairs locked in opposite orders in {:?}",
        services.len() * TASKS * ROUNDS,
        started.elapsed()
    );
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders of both keys"
    );
    assert!(!services[0].is_locked(&a).await.unwrap());
    assert!(!services[0].is_locked(&b).await.unwrap());
}

/// Each key of a multi-key hold has its own fencing token, the one Redis holds for it, and
/// every key's tokens strictly increase across multi-key and single grants.
async fn fences_per_key_strictly_increase(fx: Fixture) {
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let ks = keys("fences", 2);
    let mut seen: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..4 {
        let locks = if round % 2 == 0 { &a } else { &b };
        let guard = locks.lock_all(ks.clone()).await.unwrap();
        assert_eq!(guard.keys().collect::<Vec<_>>(), ks, "taken in key order");
        assert_eq!(guard.guards().len(), 2);
        assert_eq!(guard.fence("not one of them"), None);
        for (i, key) in ks.iter().enumerate() {
            let fence = guard.fence(key).unwrap();
            assert_eq!(a.inspect(key).await.unwrap().fence, Some(fence));
            seen[i].push(fence);
        }
        guard.release().await.unwrap();
        // a single lock of the first key in between
        let single = b.lock(&ks[0]).await.unwrap();
        seen[0].push(single.fence());
        single.release().await.unwrap();
    }
    for (key, fences) in ks.iter().zip(&seen) {
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "{key}: tokens must strictly increase: {fences:?}"
        );
    }
}

/// One release frees every key; so does dropping the guard. The same key twice is one lock.
async fn one_release_frees_every_key(fx: Fixture) {
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let ks = keys("release-all", 3);
    let mut asked = ks.clone();
    asked.push(ks[1].clone());
    let guard = a.lock_all(asked.clone()).lease(LONG).await.unwrap();
    assert_eq!(guard.keys().count(), 3, "a repeated key is one lock");
    for key in &ks {
        assert!(b.is_locked(key).await.unwrap());
        assert_eq!(
            b.try_lock(key).await.unwrap_err().kind(),
            ErrorKind::Timeout
        );
    }
    guard.release().await.unwrap();
    for key in &ks {
        assert!(!b.is_locked(key).await.unwrap(), "{key} held after release");
        assert!(!fx.exists(&lock_key(key)));
    }
    let guard = a.lock_all(asked).await.unwrap();
    assert!(!guard.is_lost());
    drop(guard);
    eventually(
        "every key is free once the guard is dropped",
        Duration::from_secs(3),
        || async {
            for key in &ks {
                if b.is_locked(key).await.unwrap() {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// Keys whose lock hashes live on three different cluster masters (elsewhere: any keys) are
/// held together and freed together; each is on the node that serves it.
async fn keys_on_different_nodes(fx: Fixture) {
    let locks = fx.service(LONG).await;
    let mut ks: Vec<String> = Vec::new();
    let mut nodes = Vec::new();
    while ks.len() < 3 {
        let key = unique_key("spread");
        let node = fx.node_for(&lock_key(&key));
        if fx.kind() != Kind::Cluster || !nodes.contains(&node) {
            nodes.push(node);
            ks.push(key);
        }
    }
    if fx.kind() == Kind::Cluster {
        let slots: Vec<u16> = ks
            .iter()
            .map(|k| fx.topo().key_slot(&lock_key(k)))
            .collect();
        println!("keys on masters {nodes:?}, slots {slots:?}");
    }
    let guard = locks.lock_all(ks.clone()).lease(LONG).await.unwrap();
    for key in &ks {
        assert!(
            fx.exists(&lock_key(key)),
            "{key} not on the node serving it"
        );
        assert_eq!(
            locks.inspect(key).await.unwrap().fence,
            guard.fence(key),
            "{key}"
        );
    }
    guard.release().await.unwrap();
    for key in &ks {
        assert!(!fx.exists(&lock_key(key)), "{key} left held");
    }
}

topology_tests!(
    all_or_nothing_when_one_key_is_busy,
    opposite_orders_never_deadlock,
    fences_per_key_strictly_increase,
    one_release_frees_every_key,
    keys_on_different_nodes,
);

// ---- single node ----

/// A `lock_all` cancelled while it waits for its second key gives back the first one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lock_all_gives_back_what_it_took() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let ks = keys("cancelled-all", 2);
    let held = a.lock(&ks[1]).lease(LONG).await.unwrap();
    let waiting = {
        let (b, ks) = (b.clone(), ks.clone());
        tokio::spawn(async move { b.lock_all(ks).lease(LONG).await })
    };
    eventually(
        "B took the first key and waits for the second",
        Duration::from_secs(5),
        || async {
            a.is_locked(&ks[0]).await.unwrap()
                && b.inspect(&ks[1]).await.unwrap().local_waiters == 1
        },
    )
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    eventually(
        "the first key is free once the request was dropped",
        Duration::from_secs(3),
        || async { holder(&a, &ks[0]).await.is_none() },
    )
    .await;
    assert_eq!(
        a.inspect(&ks[1]).await.unwrap().fence,
        Some(held.fence()),
        "the busy key is still A's"
    );
    held.release().await.unwrap();
}

/// No keys, or an empty key among valid ones, is `InvalidKey`, and none of the keys is taken.
#[tokio::test]
async fn invalid_keys_take_nothing() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG).await;
    let err = locks.lock_all(Vec::<String>::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    let ks = keys("invalid-all", 2);
    let err = locks
        .lock_all([ks[0].as_str(), "", ks[1].as_str()])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    for key in &ks {
        let info = locks.inspect(key).await.unwrap();
        assert_eq!(
            (info.holder, info.last_fence),
            (None, None),
            "{key} was taken"
        );
    }
}

/// Service B holds the second key for 1.5 s; A asks for both with a 500 ms lease and a 4 s wait:
/// A takes the first key at once and waits for the second while the first one's lease runs
/// out, and service C takes the first key meanwhile (holding it 1.5 s). `lock_all` may return
/// only with every key held: it never hands out a guard already lost, and never one whose key
/// C holds. (It takes the keys again once C is done, well within the wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_all_never_returns_a_key_whose_lease_ran_out_while_it_waited() {
    let fx = Fixture::single().await;
    let (a, b, c) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );
    let ks = keys("ran-out", 2);
    let busy = b
        .lock(&ks[1])
        .lease(Duration::from_millis(1500))
        .await
        .unwrap();
    let mut taking = {
        let (a, ks) = (a.clone(), ks.clone());
        tokio::spawn(async move {
            a.lock_all(ks)
                .lease(Duration::from_millis(500))
                .wait(Duration::from_secs(4))
                .await
        })
    };
    eventually(
        "A took the first key and waits for the second",
        Duration::from_secs(3),
        || async {
            holder(&b, &ks[0]).await.is_some()
                && a.inspect(&ks[1]).await.unwrap().local_waiters == 1
        },
    )
    .await;
    // C waits for the first key: it gets it once A's lease of it ran out
    let c_hold = c
        .lock(&ks[0])
        .lease(LONG)
        .wait(Duration::from_secs(3))
        .await
        .unwrap();
    let c_fence = c_hold.fence();
    // C holds the key for 1.5 s: A's lock_all must not return meanwhile
    if let Ok(joined) = tokio::time::timeout(Duration::from_millis(1500), &mut taking).await {
        let result = joined.unwrap();
        let lost: Vec<bool> = match &result {
            Ok(guard) => guard.guards().iter().map(|g| g.is_lost()).collect(),
            Err(_) => Vec::new(),
        };
        panic!(
            "lock_all returned while C held {} (A's guards lost: {lost:?}): {result:?}",
            ks[0]
        );
    }
    c_hold.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), taking)
        .await
        .expect("lock_all returns within its wait")
        .unwrap()
        .expect("A takes both keys once C let go, within its wait");
    for g in guard.guards() {
        assert!(!g.is_lost(), "{} handed out lost", g.key());
    }
    for key in &ks {
        assert_eq!(
            a.inspect(key).await.unwrap().fence,
            guard.fence(key),
            "{key} is not A's on Redis"
        );
    }
    assert!(
        guard.fence(&ks[0]).unwrap() > c_fence,
        "A holds the first key after C"
    );
    guard.release().await.unwrap();
    drop(busy);
}

/// Redis runs nothing else while a script runs, so no call may carry thousands of keys: taking
/// and releasing 10,000 keys goes out in script calls of a bounded number of keys. Checked by
/// its effect on another client - a PING every millisecond from a connection of its own never
/// waits long - and by the number of script calls. The bound on the PING is a bound on how
/// long Redis is kept busy by one call (a few milliseconds for a call of 128 keys), not a speed
/// requirement: it is generous (100 ms) so that a loaded machine does not fail it, while one
/// script for every key kept PINGs waiting for about half a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_keys_never_keep_redis_busy_for_long() {
    const N: usize = 10_000;
    /// Keys per script call at most (the engine's `MAX_OPS`).
    const PER_CALL: usize = 128;
    let fx = Fixture::single().await;
    let locks = fx.service(LONG).await;
    let ks = keys("ten-thousand", N);
    // a script call first: the counter of script calls shows from the first one on
    let warm_up = locks.lock(unique_key("warm-up")).await.unwrap();
    warm_up.release().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let (stop, mut con) = (stop.clone(), fx.redis());
        std::thread::spawn(move || {
            let (mut longest, mut pings) = (Duration::ZERO, 0u64);
            while !stop.load(Ordering::SeqCst) {
                let sent = Instant::now();
                let _: String = redis::cmd("PING").query(&mut con).unwrap();
                longest = longest.max(sent.elapsed());
                pings += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            (longest, pings)
        })
    };
    let mut con = fx.redis();
    let held_count = |con: &mut redis::Connection| -> usize {
        ks.chunks(500)
            .map(|chunk| {
                let mut exists = redis::cmd("EXISTS");
                for key in chunk {
                    exists.arg(lock_key(key));
                }
                exists.query::<usize>(con).unwrap()
            })
            .sum()
    };
    let before = script_calls(&mut con);
    let guard = locks.lock_all(ks.clone()).lease(LONG).await.unwrap();
    let acquire_calls = script_calls(&mut con) - before;
    assert_eq!(guard.keys().count(), N);
    assert_eq!(held_count(&mut con), N, "every key held on Redis");
    let before = script_calls(&mut con);
    guard.release().await.unwrap();
    let release_calls = script_calls(&mut con) - before;
    assert_eq!(held_count(&mut con), 0, "every key released on Redis");
    stop.store(true, Ordering::SeqCst);
    let (longest, pings) = pinger.join().unwrap();
    println!(
        "{N} keys: {acquire_calls} script calls to take them, {release_calls} to release them; \
         {pings} PINGs, the longest {longest:?}"
    );
    let at_least = N.div_ceil(PER_CALL) as u64;
    assert!(
        acquire_calls >= at_least,
        "{acquire_calls} script calls took {N} keys: more than {PER_CALL} keys per call"
    );
    assert!(
        release_calls >= at_least,
        "{release_calls} script calls released {N} keys: more than {PER_CALL} keys per call"
    );
    assert!(
        pings > 10,
        "the PINGs ran while the keys were taken and released"
    );
    assert!(
        longest < Duration::from_millis(100),
        "a PING waited {longest:?}: one call kept Redis busy that long"
    );
}
