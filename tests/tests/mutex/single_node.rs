//! Lock semantics on a real single-node Redis: exclusion, reentrancy, leases, watchdog,
//! fencing, release rules and cancellation (waiter order and wake-ups: `waiting.rs`).

use std::time::{Duration, Instant};

use crate::common::{Fixture, acquire_op, eventually, script_call, script_calls, waiters_in_line};
use lock_runtime::{ErrorKind, LockConfig, LockKind, LockService, OwnerId, owner};
use lock_tests::harness::{Proxy, Spec, Topology, unique_key};

const WATCHDOG: Duration = Duration::from_millis(300);
const LONG_WATCHDOG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_exclude_each_other_on_a_shared_counter() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let (key, counter) = (unique_key("excl"), unique_key("counter"));
    let client = redis::Client::open(fx.topo().url()).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (locks, key, counter, client) =
            (locks.clone(), key.clone(), counter.clone(), client.clone());
        tasks.push(tokio::spawn(async move {
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..40 {
                let guard = locks.lock(&key).await.unwrap();
                let v: Option<u64> = redis::cmd("GET")
                    .arg(&counter)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                let _: () = redis::cmd("SET")
                    .arg(&counter)
                    .arg(v.unwrap_or(0) + 1)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total: u64 = redis::cmd("GET")
        .arg(&counter)
        .query(&mut fx.redis())
        .unwrap();
    assert_eq!(total, 8 * 40);
    assert!(!locks.is_locked(&key).await.unwrap());
}

#[tokio::test]
async fn an_owner_scope_reenters_and_frees_after_the_last_release() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("reentry");
    let me = OwnerId::new();
    let (outer, inner) = owner::scope(me.clone(), async {
        let outer = locks.lock(&key).await.unwrap();
        let inner = locks
            .lock(&key)
            .wait(Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(
            inner.fence(),
            outer.fence(),
            "re-entry keeps the holder's token"
        );
        assert!(locks.is_held_by_current(&key).await.unwrap());
        (outer, inner)
    })
    .await;
    let info = locks.inspect(&key).await.unwrap();
    assert_eq!(info.hold_count, 2);
    assert!(info.holder.unwrap().ends_with(me.as_str()));

    let other = locks.try_lock(&key).await.unwrap_err();
    assert_eq!(
        other.kind(),
        ErrorKind::Timeout,
        "a different owner must wait"
    );
    assert!(
        !locks.is_held_by_current(&key).await.unwrap(),
        "no scope here"
    );

    inner.release().await.unwrap();
    assert_eq!(locks.inspect(&key).await.unwrap().hold_count, 1);
    assert!(
        locks.try_lock(&key).await.is_err(),
        "still held after one release"
    );
    outer.release().await.unwrap();
    assert!(!locks.is_locked(&key).await.unwrap());
}

/// Owner ids are the application's text: one that holds '|' (the separator between a grant id
/// and its owner in what a lock call sends and stores) holds, re-enters, is handed the lock by a
/// release of its own service, and holds a permit like any other.
#[tokio::test]
async fn owners_with_a_bar_in_their_id_hold_reenter_and_are_handed_the_lock() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("bar-owner");
    let (first, second) = (OwnerId::from("tenant|1"), OwnerId::from("tenant|2|x"));
    let (outer, inner) = owner::scope(first.clone(), async {
        let outer = locks.lock(&key).await.unwrap();
        let inner = locks.lock(&key).await.unwrap();
        (outer, inner)
    })
    .await;
    let info = locks.inspect(&key).await.unwrap();
    assert_eq!(info.hold_count, 2);
    assert!(info.holder.unwrap().ends_with("tenant|1"));

    let waiter = tokio::spawn({
        let (locks, key, second) = (locks.clone(), key.clone(), second.clone());
        async move { locks.lock(&key).owner(second).await.unwrap() }
    });
    waiters_in_line(&locks, &key, 1).await;
    inner.release().await.unwrap();
    let token = outer.fence();
    outer.release().await.unwrap();
    let handed = waiter.await.unwrap();
    assert!(handed.fence() > token, "the hand-off draws a new token");
    let info = locks.inspect(&key).await.unwrap();
    assert!(info.holder.unwrap().ends_with("tenant|2|x"));
    handed.release().await.unwrap();
    assert!(!locks.is_locked(&key).await.unwrap());

    let permits = locks.semaphore(unique_key("bar-owner-sem"), 2);
    let permit = owner::scope(second, async { permits.acquire().await.unwrap() }).await;
    assert_eq!(permits.available().await.unwrap(), 1);
    permit.release().await.unwrap();
    assert_eq!(permits.available().await.unwrap(), 2);
}

#[tokio::test]
async fn without_a_scope_every_lock_call_is_a_new_owner() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let (key, other_key) = (unique_key("fresh-owner"), unique_key("fresh-owner"));
    let first = locks.lock(&key).await.unwrap();
    let second = locks.lock(&key).wait(Duration::from_millis(100)).await;
    assert_eq!(
        second.unwrap_err().kind(),
        ErrorKind::WouldDeadlock,
        "the second call is another owner, which would wait for the guard held next to it"
    );
    let other = locks.lock(&other_key).await.unwrap();
    assert_ne!(first.owner(), other.owner(), "two calls, two owners");
    let holder = locks.inspect(&key).await.unwrap().holder.unwrap();
    assert!(
        holder.ends_with(first.owner().as_str()),
        "{holder} holds {key}, not {}",
        first.owner()
    );
    let holder = locks.inspect(&other_key).await.unwrap().holder.unwrap();
    assert!(holder.ends_with(other.owner().as_str()), "{holder}");
    first.release().await.unwrap();
    other.release().await.unwrap();
}

#[tokio::test]
async fn a_lease_expires_even_while_the_guard_lives() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("lease");
    let guard = locks
        .lock(&key)
        .lease(Duration::from_millis(300))
        .await
        .unwrap();
    let started = Instant::now();
    let next = locks.lock(&key).wait(Duration::from_secs(3)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "took {:?}",
        started.elapsed()
    );
    assert!(guard.is_lost());
    let lost = guard.lost().await;
    assert_eq!(lost.kind(), ErrorKind::Lost);
    let err = guard.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(
        locks.is_locked(&key).await.unwrap(),
        "the late release must not free the new holder's lock"
    );
    assert!(next.fence() > 0);
    next.release().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_keeps_a_lock_past_its_timeout_until_release() {
    let fx = Fixture::single().await;
    let locks = fx.service(WATCHDOG).await;
    let key = unique_key("watchdog");
    let guard = locks.lock(&key).await.unwrap();
    tokio::time::sleep(WATCHDOG * 4).await; // four leases: without renewal it would be gone
    let info = locks.inspect(&key).await.unwrap();
    assert!(info.holder.is_some() && info.ttl.is_some(), "{info:?}");
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    assert!(!locks.is_locked(&key).await.unwrap());
}

#[tokio::test]
async fn dropped_panicked_and_cancelled_holders_free_the_lock() {
    // Leases of 30 s (the watchdog's, or a fixed one) against waits of 2 s: only a release frees
    // the lock in time, never a lease running out once renewal stops.
    const FREED_WITHIN: Duration = Duration::from_secs(2);
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let check = fx.service(LONG_WATCHDOG).await;

    let key = unique_key("dropped");
    drop(locks.lock(&key).await.unwrap());
    eventually("dropped guard releases", FREED_WITHIN, || async {
        !check.is_locked(&key).await.unwrap()
    })
    .await;

    let key = unique_key("dropped-lease");
    drop(
        locks
            .lock(&key)
            .lease(Duration::from_secs(30))
            .await
            .unwrap(),
    );
    eventually(
        "dropped guard with a fixed lease releases",
        FREED_WITHIN,
        || async { !check.is_locked(&key).await.unwrap() },
    )
    .await;

    let key = unique_key("panicked");
    let (l, k) = (locks.clone(), key.clone());
    let task = tokio::spawn(async move {
        let _guard = l.lock(&k).await.unwrap();
        panic!("holder panics");
    });
    assert!(task.await.unwrap_err().is_panic());
    eventually("panicked holder's lock is freed", FREED_WITHIN, || async {
        !check.is_locked(&key).await.unwrap()
    })
    .await;

    let key = unique_key("cancelled");
    let (l, k) = (locks.clone(), key.clone());
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let _guard = l.lock(&k).await.unwrap();
        held_tx.send(()).unwrap();
        std::future::pending::<()>().await;
    });
    held_rx.await.unwrap();
    task.abort();
    eventually("cancelled holder's lock is freed", FREED_WITHIN, || async {
        !check.is_locked(&key).await.unwrap()
    })
    .await;
}

#[tokio::test]
async fn renewal_reports_a_force_unlocked_lock_as_lost_and_does_not_recreate_it() {
    let fx = Fixture::single().await;
    let holder = fx.service(WATCHDOG).await;
    let operator = fx.service(WATCHDOG).await;
    let key = unique_key("lost");
    let guard = holder.lock(&key).await.unwrap();
    assert!(operator.force_unlock(&key).await.unwrap());
    assert!(
        !operator.force_unlock(&key).await.unwrap(),
        "nothing left to remove"
    );
    let lost = tokio::time::timeout(WATCHDOG * 3, guard.lost())
        .await
        .expect("loss noticed within a renewal period");
    assert_eq!(lost.kind(), ErrorKind::Lost);
    assert!(guard.is_lost());
    tokio::time::sleep(WATCHDOG).await; // more renewal rounds
    assert!(
        !operator.is_locked(&key).await.unwrap(),
        "renewal must not re-create the lock"
    );
    assert_eq!(
        guard.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
}

#[tokio::test]
async fn force_unlock_in_the_same_service_marks_the_guard_lost_at_once() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("force-local");
    let guard = locks
        .lock(&key)
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(locks.force_unlock(&key).await.unwrap());
    assert!(guard.is_lost());
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_across_grants_expiry_and_force_unlock() {
    let fx = Fixture::single().await;
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("fence");
    let mut tokens = Vec::new();
    for round in 0..4 {
        let g = a.lock(&key).await.unwrap();
        tokens.push(g.fence());
        g.release().await.unwrap();
        let g = b.lock(&key).lease(Duration::from_millis(50)).await.unwrap();
        tokens.push(g.fence());
        if round % 2 == 0 {
            assert!(b.force_unlock(&key).await.unwrap());
        }
        // either force-unlocked or left to expire
        let g2 = a.lock(&key).wait(Duration::from_secs(2)).await.unwrap();
        tokens.push(g2.fence());
        g2.release().await.unwrap();
        drop(g);
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let info = a.inspect(&key).await.unwrap();
    assert_eq!(info.last_fence, tokens.last().copied());
    // The counter survives a flush of the fence key through the clock.
    let fence_key = a.fence_key(LockKind::Mutex, &key).unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&fence_key)
        .query(&mut fx.redis())
        .unwrap();
    let g = a.lock(&key).await.unwrap();
    let after_flush = g.fence();
    assert!(after_flush > *tokens.last().unwrap());
    g.release().await.unwrap();
    // A stale counter (a failover lost its last writes) does not repeat the tokens it lost.
    let _: () = redis::cmd("SET")
        .arg(&fence_key)
        .arg(after_flush - 1_000)
        .query(&mut fx.redis())
        .unwrap();
    let g = a.lock(&key).await.unwrap();
    assert!(g.fence() > after_flush, "{} after {after_flush}", g.fence());
    let after_flush = g.fence();
    g.release().await.unwrap();
    // A counter ahead of the server clock (the clock stepped back): tokens go on from it.
    let ahead = after_flush + 3_600_000_000;
    let _: () = redis::cmd("SET")
        .arg(&fence_key)
        .arg(ahead)
        .query(&mut fx.redis())
        .unwrap();
    let g = a.lock(&key).await.unwrap();
    assert_eq!(g.fence(), ahead + 1);
    g.release().await.unwrap();
    assert_eq!(a.lock(&key).await.unwrap().fence(), ahead + 2);
}

/// The fence counters are one per cluster slot and never expire, whatever `fence_idle_ttl`
/// says (still accepted, no longer used): a grant and a hand-off to a waiter of the same
/// service both take their token from the slot's counter and leave it without a TTL.
#[tokio::test]
async fn fence_counters_never_expire_whatever_the_idle_ttl() {
    let fx = Fixture::single().await;
    let key = unique_key("fence-ttl");
    let counters = || -> Vec<String> {
        redis::cmd("KEYS")
            .arg("lock:fence:{*}")
            .query(&mut fx.redis())
            .unwrap()
    };
    let pttl = |counter: &str| -> i64 {
        redis::cmd("PTTL")
            .arg(counter)
            .query(&mut fx.redis())
            .unwrap()
    };
    let hour = Duration::from_secs(3600);
    let locks = LockService::connect(fx.config(LONG_WATCHDOG).with_fence_idle_ttl(Some(hour)))
        .await
        .unwrap();
    let held = locks.lock(&key).await.unwrap();
    let before = counters();
    assert!(!before.is_empty());
    for counter in &before {
        assert_eq!(pttl(counter), -1, "{counter} never expires");
    }
    // a hand-off to a waiter of the same service is a grant as well
    let (l, k) = (locks.clone(), key.clone());
    let next = tokio::spawn(async move { l.lock(&k).wait(Duration::from_secs(5)).await });
    waiters_in_line(&locks, &key, 1).await;
    let first = held.fence();
    held.release().await.unwrap();
    let next = next.await.unwrap().unwrap();
    assert!(next.fence() > first);
    for counter in counters() {
        assert_eq!(pttl(&counter), -1, "{counter} after the hand-off");
    }
    assert!(
        redis::cmd("EXISTS")
            .arg(format!("lock:{{{key}}}:fence"))
            .query::<bool>(&mut fx.redis())
            .map(|exists| !exists)
            .unwrap(),
        "no counter per lock key"
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn only_the_owner_releases_and_a_dropped_guard_frees_in_the_background() {
    let fx = Fixture::single().await;
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("owner-only");
    let stale = a.lock(&key).await.unwrap();
    a.force_unlock(&key).await.unwrap();
    let current = b.lock(&key).await.unwrap();
    assert_eq!(
        stale.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    let info = b.inspect(&key).await.unwrap();
    assert_eq!(
        info.fence,
        Some(current.fence()),
        "the other owner's release removed nothing"
    );
    drop(current);
    eventually("dropped guard released", Duration::from_secs(2), || async {
        !b.is_locked(&key).await.unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_acquires_at_any_point_never_leaves_the_lock_held() {
    let fx = Fixture::single().await;
    let holder = fx.service(LONG_WATCHDOG).await;
    let other = fx.service(LONG_WATCHDOG).await;
    let check = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("cancel");
    // Only some rounds cancel an acquire while its granting attempt is in flight (with the
    // give-back disabled, the first such round came between round 9 and 79 in 8 runs): 300
    // rounds, about a second.
    for round in 0u64..300 {
        let guard = holder.lock(&key).await.unwrap();
        let (l, k) = (
            if round % 2 == 0 {
                holder.clone()
            } else {
                other.clone()
            },
            key.clone(),
        );
        // waiters that give up after a varying delay, racing with the release below
        let cancel_after = Duration::from_micros(round * 97 % 2_000);
        let waiter = tokio::spawn(async move {
            tokio::time::timeout(cancel_after, l.lock(&k))
                .await
                .ok()
                .map(|r| r.unwrap())
        });
        tokio::time::sleep(Duration::from_micros(round * 53 % 1_500)).await;
        guard.release().await.unwrap();
        if let Some(g) = waiter.await.unwrap() {
            g.release().await.unwrap();
        }
        // A grant that reaches a cancelled acquire is given back in the background; without that
        // it would stay held for the whole 30 s lease.
        match check.lock(&key).wait(Duration::from_secs(2)).await {
            Ok(g) => g.release().await.unwrap(),
            Err(e) => panic!(
                "round {round}: the lock is still held 2 s after the round (lease 30 s), so a \
                 cancelled acquire kept a grant: {e}"
            ),
        }
    }
    eventually(
        "no cancelled acquire holds the lock",
        Duration::from_secs(3),
        || async { !holder.is_locked(&key).await.unwrap() },
    )
    .await;
    // and the lock still works for everyone (within a turn's 250 ms: the last release may have
    // given the turn to a service whose waiter was cancelled just before)
    let within = Duration::from_secs(1);
    let g = holder.lock(&key).wait(within).await.unwrap();
    g.release().await.unwrap();
    other
        .lock(&key)
        .wait(within)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn timeouts_name_the_key_and_zero_wait_tries_once() {
    let fx = Fixture::single().await;
    let locks: LockService = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("timeout");
    // held by another service (a second call next to a guard of its own is refused at once)
    let other = fx.service(LONG_WATCHDOG).await;
    let guard = other.lock(&key).await.unwrap();
    let started = Instant::now();
    let err = locks
        .lock(&key)
        .wait(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        err.is_timeout() && err.key() == Some(key.as_str()),
        "{err:?}"
    );
    assert!(err.to_string().contains(&key));
    let err = locks.try_lock(&key).await.unwrap_err();
    assert!(err.is_timeout());
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_failed_operation_fails_alone_also_in_a_shared_call() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let bad = unique_key("wrong-type");
    // something else wrote a list where the lock goes
    let _: () = redis::cmd("RPUSH")
        .arg(format!("lock:{{{bad}}}"))
        .arg("not a lock")
        .query(&mut fx.redis())
        .unwrap();
    let e = locks.try_lock(&bad).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Backend);
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    // and a string the library did not write is refused as such, and left as it was
    let junk = unique_key("junk");
    let junk_key = format!("lock:{{{junk}}}");
    let _: () = redis::cmd("SET")
        .arg(&junk_key)
        .arg("not a lock")
        .query(&mut fx.redis())
        .unwrap();
    let e = locks.try_lock(&junk).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Backend);
    assert!(e.to_string().contains("not a lock"), "{e}");
    let left: String = redis::cmd("GET")
        .arg(&junk_key)
        .query(&mut fx.redis())
        .unwrap();
    assert_eq!(left, "not a lock");

    // 32 callers at once: all but the first two queue and share calls with the bad key's
    let keys: Vec<String> = (0..32)
        .map(|i| unique_key(&format!("shared-{i}")))
        .collect();
    // the lock operation calls (`ops.lua`) naming any of these keys
    let ops_calls = crate::common::Monitor::start(fx.topo().master_port(), {
        let names: Vec<String> = keys
            .iter()
            .chain([&bad])
            .map(|k| format!("\"lock:{{{k}}}\""))
            .collect();
        // (an ops call: an acquire or release; not the commands its Lua runs, nor a `leave`)
        move |line: &str| {
            script_call(line)
                && (acquire_op(line) || crate::common::release_op(line))
                && names.iter().any(|n| line.contains(n))
        }
    })
    .await;
    let mut calls = tokio::task::JoinSet::new();
    for key in keys.iter().cloned().chain([bad.clone()]) {
        let locks = locks.clone();
        calls.spawn(async move {
            let result = locks.try_lock(&key).await;
            (key, result)
        });
    }
    let mut guards = Vec::new();
    while let Some(joined) = calls.join_next().await {
        let (key, result) = joined.unwrap();
        match result {
            Ok(guard) => {
                assert_ne!(key, bad);
                guards.push(guard);
            }
            Err(e) => {
                assert_eq!(key, bad, "only the bad key fails: {e}");
                assert!(e.to_string().contains("WRONGTYPE"), "{e}");
            }
        }
    }
    ops_calls.sync().await;
    let lines = ops_calls.lines();
    let bad_acquire = format!("\"lock:{{{bad}}}\"");
    let shared = lines
        .iter()
        .filter(|l| l.contains(&bad_acquire) && acquire_op(l))
        .map(|l| {
            l.split(' ')
                .nth(5)
                .unwrap()
                .trim_matches('"')
                .parse::<usize>()
                .unwrap()
                // (on one server an operation passes 2 keys: the lock and its fence counter)
                / 2
        })
        .collect::<Vec<_>>();
    assert!(
        shared.len() == 1 && shared[0] > 1,
        "the bad key's acquire went out in one call with others (operations per call: \
         {shared:?})"
    );
    // two go out at once, the rest together (up to 128 in a call); the failed acquire is then
    // given back (one more call)
    assert!(
        lines.len() * 5 <= 34,
        "33 acquires took {} calls: they were not shared",
        lines.len()
    );
    assert_eq!(guards.len(), keys.len());
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// A guard dropped just before `shutdown` is released by a task of its own; `shutdown` waits
/// for that release too, so a process that exits right after it leaves no lock behind (the
/// release's request is held up 300 ms by a proxy: the lock must be free once `shutdown`
/// returned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_releases_already_on_their_way() {
    let fx = Fixture::own(Spec::Single).await;
    let proxy = Proxy::start(Topology::addr_of(fx.topo().master_port())).await;
    let config = LockConfig::single(proxy.url()).with_response_timeout(Duration::from_secs(3));
    let locks = LockService::connect(config).await.unwrap();
    let direct = fx.service(LONG_WATCHDOG).await;
    let (dropped, released) = (unique_key("sd-dropped"), unique_key("sd-released"));
    let guard = locks.lock(&dropped).await.unwrap();
    let other = locks.lock(&released).await.unwrap();
    proxy.set_request_latency(Duration::from_millis(300));
    // the drop starts the release in the background; a release cancelled half-way also goes on
    // in the background
    drop(guard);
    let cancelled = tokio::time::timeout(Duration::from_millis(20), other.release()).await;
    assert!(
        cancelled.is_err(),
        "the release answered through a 300 ms delay"
    );
    let started = Instant::now();
    locks.shutdown().await.unwrap();
    let took = started.elapsed();
    for key in [&dropped, &released] {
        assert!(
            !direct.is_locked(key).await.unwrap(),
            "{key} still held when shutdown returned after {took:?}: {:?}",
            direct.inspect(key).await.unwrap()
        );
    }
    println!("shutdown returned after {took:?}, both locks free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_hold_refuses_acquires_and_fails_waiters() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let other = fx.service(LONG_WATCHDOG).await;
    let (key, rw_key, sem) = (unique_key("sd"), unique_key("sd-rw"), unique_key("sd-sem"));
    let mutex = locks.lock(&key).await.unwrap();
    let read = locks.read(&key).await.unwrap();
    let write = locks.write(&rw_key).await.unwrap();
    let permits = locks.semaphore(&sem, 3);
    let watched = permits.acquire().await.unwrap();
    // a killed holder's permit would stay for this lease
    let leased = permits
        .acquire()
        .lease(Duration::from_secs(300))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move { locks.lock(&key).await.map(drop) }
    });
    waiters_in_line(&locks, &key, 1).await;
    for (kind, name) in [
        (LockKind::Mutex, &key),
        (LockKind::ReadWrite, &key),
        (LockKind::ReadWrite, &rw_key),
        (LockKind::Semaphore, &sem),
    ] {
        let info = other.inspect_kind(kind, name).await.unwrap();
        assert!(!info.holders.is_empty(), "{kind:?} {name} held before");
    }

    let started = Instant::now();
    locks.shutdown().await.unwrap();
    println!("shutdown took {:?}", started.elapsed());
    assert!(locks.is_shut_down());

    // free on Redis right after, as a second service sees it
    for (kind, name) in [
        (LockKind::Mutex, &key),
        (LockKind::ReadWrite, &key),
        (LockKind::ReadWrite, &rw_key),
        (LockKind::Semaphore, &sem),
    ] {
        let info = other.inspect_kind(kind, name).await.unwrap();
        assert!(info.holders.is_empty(), "{kind:?} {name} free: {info:?}");
    }
    assert_eq!(other.semaphore(&sem, 3).available().await.unwrap(), 3);
    let taken = other
        .try_lock(&key)
        .await
        .expect("another service takes it at once");

    // the waiter failed promptly, and new acquires are refused
    let waited = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("the waiter ends promptly")
        .unwrap();
    let e = waited.expect_err("the waiter is failed");
    assert_eq!(e.kind(), ErrorKind::ShuttingDown, "{e}");
    assert!(e.is_shutting_down());
    let e = locks.lock(unique_key("sd-new")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ShuttingDown, "{e}");
    let e = permits.acquire().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ShuttingDown, "{e}");
    let e = locks.read(unique_key("sd-new")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ShuttingDown, "{e}");

    // the guards know, and releasing them touches Redis no more
    let lost = tokio::time::timeout(Duration::from_secs(1), mutex.lost())
        .await
        .expect("lost() resolves at once");
    assert_eq!(lost.kind(), ErrorKind::Lost);
    assert!(lost.to_string().contains("shut down"), "{lost}");
    assert!(write.is_lost());
    let scripts_before = script_calls(&mut fx.redis());
    write
        .release()
        .await
        .expect("a hold the shutdown released releases quietly");
    leased.release().await.unwrap();
    drop((read, watched));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        script_calls(&mut fx.redis()),
        scripts_before,
        "no script ran for the guards released by the shutdown"
    );
    assert_eq!(
        other.inspect(&key).await.unwrap().fence,
        Some(taken.fence()),
        "the other service's hold is untouched"
    );

    // a second call returns at once
    tokio::time::timeout(Duration::from_millis(50), locks.shutdown())
        .await
        .expect("a second shutdown returns at once")
        .unwrap();
    taken.release().await.unwrap();
}

/// The application's error of [`run_returns_the_bodys_own_result`].
#[derive(Debug, PartialEq)]
enum AppError {
    OutOfStock,
    Lock(ErrorKind),
}

impl From<lock_runtime::LockError> for AppError {
    fn from(e: lock_runtime::LockError) -> Self {
        AppError::Lock(e.kind())
    }
}

/// `run` returns the body's own `Result`, a lock error converted into its error type, as an
/// annotated fn does; `run_nested` keeps the body's output and the lock's error apart.
#[tokio::test]
async fn run_returns_the_bodys_own_result() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("run");

    let sold: Result<u32, AppError> = locks.lock(&key).run(|_| async { Ok(3) }).await;
    assert_eq!(sold, Ok(3));
    let out: Result<u32, AppError> = locks
        .lock(&key)
        .run(|_| async { Err(AppError::OutOfStock) })
        .await;
    assert_eq!(out, Err(AppError::OutOfStock));

    let busy = locks.lock(&key).await.unwrap();
    let skipped: Result<u32, AppError> = owner::scope(OwnerId::new(), async {
        locks.lock(&key).try_once().run(|_| async { Ok(1) }).await
    })
    .await;
    assert_eq!(skipped, Err(AppError::Lock(ErrorKind::Timeout)));

    // both apart: the lock's error outside, the body's output (any type) inside
    let nested = owner::scope(OwnerId::new(), async {
        locks
            .lock(&key)
            .try_once()
            .run_nested(|_| async { 1 })
            .await
    })
    .await;
    assert_eq!(nested.unwrap_err().kind(), ErrorKind::Timeout);
    busy.release().await.unwrap();
    let nested: Result<Result<u32, AppError>, _> = locks
        .lock(&key)
        .run_nested(|_| async { Err(AppError::OutOfStock) })
        .await;
    assert_eq!(nested.unwrap(), Err(AppError::OutOfStock));
    let read: Result<u8, AppError> = locks.read(&key).run(|_| async { Ok(2) }).await;
    assert_eq!(read, Ok(2));
}
