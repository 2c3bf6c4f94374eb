//! Lock semantics on a real single-node Redis: exclusion, reentrancy, leases, watchdog,
//! wake-ups, waiter order, fencing, release rules and cancellation.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Fixture, evalsha_calls, eventually, waiters_in_line};
use lock_runtime::{ErrorKind, LockKind, LockService, OwnerId, owner};
use lock_tests::harness::{Spec, unique_key};
use tokio::sync::Mutex;

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

#[tokio::test]
async fn without_a_scope_every_lock_call_is_a_new_owner() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let (key, other_key) = (unique_key("fresh-owner"), unique_key("fresh-owner"));
    let first = locks.lock(&key).await.unwrap();
    let second = locks.lock(&key).wait(Duration::from_millis(100)).await;
    assert_eq!(
        second.unwrap_err().kind(),
        ErrorKind::Timeout,
        "the second call is another owner: it waits"
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
async fn waiters_in_one_service_are_served_in_arrival_order_without_barging() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("fifo");
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = locks.lock(&key).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (l, k, order) = (locks.clone(), key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = l.lock(&k).await.unwrap();
            order.lock().await.push(i);
            g.release().await.unwrap();
        }));
        waiters_in_line(&locks, &key, i + 1).await;
    }
    // The holder releases and locks again at once: it must queue behind the five.
    first.release().await.unwrap();
    let again = locks.lock(&key).await.unwrap();
    order.lock().await.push(99);
    again.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().await, vec![0, 1, 2, 3, 4, 99]);
}

/// A release wakes one waiter per service, not all: services A and B have five waiters each.
/// When the holder (a third service) releases, the turn goes to one of them, whose head takes the
/// lock; the other service's head looks again once that turn is over and waits on. Script calls
/// are counted (`INFO commandstats`, on a server of its own) from the release until well after
/// that second look: the release, one claim, one look again - never a call per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_per_service_not_all() {
    let fx = Fixture::own(Spec::Single).await;
    let holder = fx.service(LONG_WATCHDOG).await;
    let services = [
        ("a", fx.service(LONG_WATCHDOG).await),
        ("b", fx.service(LONG_WATCHDOG).await),
    ];
    let key = unique_key("herd");
    let guard = holder.lock(&key).await.unwrap();
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let done = Arc::new(tokio::sync::Semaphore::new(0));
    let mut tasks = Vec::new();
    for (name, service) in &services {
        for i in 0..5 {
            let (l, k, tx, done, name) = (
                service.clone(),
                key.clone(),
                granted_tx.clone(),
                done.clone(),
                *name,
            );
            tasks.push(tokio::spawn(async move {
                let g = l.lock(&k).wait(Duration::from_secs(30)).await.unwrap();
                tx.send(name).unwrap();
                let _go = done.acquire().await.unwrap();
                g.release().await.unwrap();
            }));
            waiters_in_line(service, &key, i + 1).await;
        }
    }
    eventually(
        "both services registered as waiting",
        Duration::from_secs(5),
        || async { holder.inspect(&key).await.unwrap().waiting_services == 2 },
    )
    .await;
    let mut con = fx.redis();
    // the heads' attempts before the release are over once the count stays put
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut before = evalsha_calls(&mut con);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = evalsha_calls(&mut con);
        if std::mem::replace(&mut before, now) == now {
            break;
        }
        assert!(Instant::now() < deadline, "the waiters never went quiet");
    }

    guard.release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), granted.recv())
        .await
        .expect("a waiter got the lock")
        .unwrap();
    // the other service's head looks again after the turn (250 ms): count well past that
    let window = Instant::now() + Duration::from_secs(1);
    let mut calls = 0;
    while Instant::now() < window {
        calls = evalsha_calls(&mut con) - before;
        assert!(
            calls <= 4,
            "{calls} script calls after one release with 10 waiters in 2 services"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        calls >= 2,
        "the release and the claim were counted: {calls}"
    );
    assert!(granted.try_recv().is_err(), "one grant");
    let (winner, loser) = if first == "a" {
        (&services[0].1, &services[1].1)
    } else {
        (&services[1].1, &services[0].1)
    };
    assert_eq!(winner.inspect(&key).await.unwrap().local_waiters, 4);
    assert_eq!(loser.inspect(&key).await.unwrap().local_waiters, 5);
    done.add_permits(tasks.len());
    for t in tasks {
        t.await.unwrap();
    }
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
    let _: () = redis::cmd("DEL")
        .arg(format!("lock:{{{key}}}:fence"))
        .query(&mut fx.redis())
        .unwrap();
    let g = a.lock(&key).await.unwrap();
    let after_flush = g.fence();
    assert!(after_flush > *tokens.last().unwrap());
    g.release().await.unwrap();
    // A stale counter (a failover lost its last writes) does not repeat the tokens it lost.
    let _: () = redis::cmd("SET")
        .arg(format!("lock:{{{key}}}:fence"))
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
        .arg(format!("lock:{{{key}}}:fence"))
        .arg(ahead)
        .query(&mut fx.redis())
        .unwrap();
    let g = a.lock(&key).await.unwrap();
    assert_eq!(g.fence(), ahead + 1);
    g.release().await.unwrap();
    assert_eq!(a.lock(&key).await.unwrap().fence(), ahead + 2);
}

#[tokio::test]
async fn fence_counters_expire_after_the_idle_ttl() {
    let fx = Fixture::single().await;
    let key = unique_key("fence-ttl");
    let fence_key = format!("lock:{{{key}}}:fence");
    let pttl = || -> i64 {
        redis::cmd("PTTL")
            .arg(&fence_key)
            .query(&mut fx.redis())
            .unwrap()
    };
    let never = LockService::connect(fx.config(LONG_WATCHDOG).with_fence_idle_ttl(None))
        .await
        .unwrap();
    never.lock(&key).await.unwrap().release().await.unwrap();
    assert_eq!(pttl(), -1, "fence_idle_ttl = never keeps the counter");

    let hour = Duration::from_secs(3600);
    let locks = LockService::connect(fx.config(LONG_WATCHDOG).with_fence_idle_ttl(Some(hour)))
        .await
        .unwrap();
    let held = locks.lock(&key).await.unwrap();
    let ttl = pttl();
    assert!((3_500_000..=3_600_000).contains(&ttl), "counter PTTL {ttl}");
    // a hand-off to a waiter of the same service is a grant as well
    let _: () = redis::cmd("PERSIST")
        .arg(&fence_key)
        .query(&mut fx.redis())
        .unwrap();
    let (l, k) = (locks.clone(), key.clone());
    let next = tokio::spawn(async move { l.lock(&k).wait(Duration::from_secs(5)).await });
    waiters_in_line(&locks, &key, 1).await;
    let first = held.fence();
    held.release().await.unwrap();
    let next = next.await.unwrap().unwrap();
    assert!(next.fence() > first);
    let ttl = pttl();
    assert!(
        (3_500_000..=3_600_000).contains(&ttl),
        "PTTL after hand-off {ttl}"
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
    // and the lock still works for everyone
    holder
        .try_lock(&key)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    other.try_lock(&key).await.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_waiter_in_line_does_not_block_the_ones_behind_it() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("cancel-line");
    let guard = locks.lock(&key).await.unwrap();
    let (l, k) = (locks.clone(), key.clone());
    let quitter = tokio::spawn(async move { l.lock(&k).await });
    waiters_in_line(&locks, &key, 1).await;
    let (l, k) = (locks.clone(), key.clone());
    let patient = tokio::spawn(async move { l.lock(&k).wait(Duration::from_secs(5)).await });
    waiters_in_line(&locks, &key, 2).await;
    quitter.abort();
    waiters_in_line(&locks, &key, 1).await;
    guard.release().await.unwrap();
    patient.await.unwrap().unwrap().release().await.unwrap();
}

#[tokio::test]
async fn timeouts_name_the_key_and_zero_wait_tries_once() {
    let fx = Fixture::single().await;
    let locks: LockService = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("timeout");
    let guard = locks.lock(&key).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_take_turns_instead_of_one_keeping_the_lock() {
    let fx = Fixture::single().await;
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("turns");
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = a.lock(&key).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..3 {
        for (name, service) in [("a", &a), ("b", &b)] {
            let (l, k, order) = (service.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let g = l.lock(&k).wait(Duration::from_secs(10)).await.unwrap();
                order.lock().await.push(name);
                tokio::time::sleep(Duration::from_millis(5)).await;
                g.release().await.unwrap();
            }));
            waiters_in_line(service, &key, i + 1).await;
        }
    }
    eventually(
        "b registered as waiting",
        Duration::from_secs(5),
        || async { a.inspect(&key).await.unwrap().waiting_services >= 1 },
    )
    .await;
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().await.clone();
    let switches = order.windows(2).filter(|w| w[0] != w[1]).count();
    // Without turns service a would hand the lock along its own line first (one switch).
    assert!(switches >= 3, "{order:?}");
    assert_eq!(
        order[0], "b",
        "the release gave the turn to the waiting service: {order:?}"
    );
}

/// Four services with three workers each take turns on one key, 15 critical sections per
/// worker. A turn that goes from one service to the next costs the release and the next
/// service's claim, two script calls: the releasing service's next waiter, registered as waiting
/// by that release, waits for its turn's message instead of asking Redis in vain, and the turns
/// that go to other services meanwhile do not wake it one by one. Script calls are counted over
/// the whole run (`INFO commandstats`, on a server of its own); a few per service are allowed
/// for the first waiter's attempt and its subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_between_services_cost_a_release_and_a_claim() {
    const SERVICES: usize = 4;
    const WORKERS: usize = 3;
    const ROUNDS: usize = 15;
    let fx = Fixture::own(Spec::Single).await;
    let mut services = Vec::new();
    for _ in 0..SERVICES {
        services.push(fx.service(LONG_WATCHDOG).await);
    }
    let key = unique_key("turn-cost");
    // a first script call, so that the counter exists
    services[0]
        .lock(&key)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut con = fx.redis();
    let before = evalsha_calls(&mut con);
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for service in &services {
        for _ in 0..WORKERS {
            let (l, k, inside) = (service.clone(), key.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let g = l.lock(&k).wait(Duration::from_secs(30)).await.unwrap();
                    assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let calls = evalsha_calls(&mut con) - before;
    let sections = (SERVICES * WORKERS * ROUNDS) as u64;
    let allowed = 2 * sections + 8 * SERVICES as u64;
    assert!(
        calls <= allowed,
        "{calls} script calls for {sections} critical sections (at most {allowed})"
    );
}

#[tokio::test]
async fn a_failed_operation_fails_alone_also_in_a_shared_call() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let bad = unique_key("wrong-type");
    // something else wrote a string where the lock's hash goes
    let _: () = redis::cmd("SET")
        .arg(format!("lock:{{{bad}}}"))
        .arg("not a lock")
        .query(&mut fx.redis())
        .unwrap();
    let e = locks.try_lock(&bad).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Backend);
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");

    // 32 callers at once: all but the first two queue and share calls with the bad key's
    let keys: Vec<String> = (0..32)
        .map(|i| unique_key(&format!("shared-{i}")))
        .collect();
    // the lock operation calls (`ops.lua`) naming any of these keys
    let ops_calls = common::Monitor::start(fx.topo().master_port(), {
        let names: Vec<String> = keys
            .iter()
            .chain([&bad])
            .map(|k| format!("\"lock:{{{k}}}:turn\""))
            .collect();
        move |line: &str| names.iter().any(|n| line.contains(n))
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
    let bad_acquire = format!("\"lock:{{{bad}}}:turn\"");
    let shared = lines
        .iter()
        .filter(|l| l.contains(&bad_acquire) && l.contains(" \"a\" "))
        .map(|l| {
            l.split(' ')
                .nth(5)
                .unwrap()
                .trim_matches('"')
                .parse::<usize>()
                .unwrap()
                / 4
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

/// The README's figure: "64 concurrent callers share about one call per ten operations". 64
/// tasks lock and release keys of their own; the script calls Redis ran (`INFO commandstats`, on
/// a server of its own) are at most one per five operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_callers_share_script_calls() {
    const CALLERS: usize = 64;
    const PAIRS: usize = 20;
    let fx = Fixture::own(Spec::Single).await;
    let locks = fx.service(LONG_WATCHDOG).await;
    // the script is loaded and the connections are up before counting
    locks
        .lock(unique_key("warm-up"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut con = fx.redis();
    let calls_before = evalsha_calls(&mut con);
    let start = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CALLERS {
        let (locks, start) = (locks.clone(), start.clone());
        tasks.spawn(async move {
            let key = unique_key(&format!("batched-{i}"));
            start.wait().await;
            for _ in 0..PAIRS {
                locks.lock(&key).await.unwrap().release().await.unwrap();
            }
        });
    }
    tasks.join_all().await;
    let calls = evalsha_calls(&mut con) - calls_before;
    let ops = CALLERS * PAIRS * 2;
    println!("{ops} operations in {calls} script calls");
    assert!(
        calls as usize * 5 <= ops,
        "{ops} operations of {CALLERS} concurrent callers took {calls} script calls"
    );
}

/// A release gives the next turn to the service that has been registered as waiting longest
/// (README: "the release gives the next turn to the longest-registered one ... so instances take
/// turns"). Services A, B and C wait from the start; A has a second waiter with a shorter wait.
/// Once A and B have had the lock, C - waiting all along - is next, not A again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_just_had_the_lock_does_not_get_the_turn_before_one_waiting_longer() {
    let fx = Fixture::single().await;
    let holder = fx.service(LONG_WATCHDOG).await;
    let (a, b, c) = (
        fx.service(LONG_WATCHDOG).await,
        fx.service(LONG_WATCHDOG).await,
        fx.service(LONG_WATCHDOG).await,
    );
    let key = unique_key("longest-waiting");
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = holder.lock(&key).await.unwrap();
    let mut tasks = Vec::new();
    // (waits in ms; those of A, B and C end in the order they came, as their registrations do)
    for (name, service, wait, in_line) in [
        ("a", &a, 20_000, 1),
        ("b", &b, 20_050, 1),
        ("c", &c, 20_100, 1),
        ("a", &a, 10_000, 2),
    ] {
        let (l, k, order) = (service.clone(), key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = l.lock(&k).wait(Duration::from_millis(wait)).await.unwrap();
            order.lock().await.push(name);
            g.release().await.unwrap();
        }));
        waiters_in_line(service, &key, in_line).await;
    }
    eventually(
        "three services registered as waiting",
        Duration::from_secs(5),
        || async { holder.inspect(&key).await.unwrap().waiting_services == 3 },
    )
    .await;
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().await, ["a", "b", "c", "a"]);
}

/// A waiter stays registered as waiting for its service's watchdog timeout (plus a second), but
/// the holder's lease may be far longer: it must look again before its registration runs out,
/// or a release after that publishes to nobody and it sleeps until its wait runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_that_waits_longer_than_its_watchdog_timeout() {
    let fx = Fixture::single().await;
    let holder = fx.service(LONG_WATCHDOG).await;
    let watchdog = Duration::from_millis(300);
    let waiter_service = fx.service(watchdog).await;
    let key = unique_key("long-wait");
    let held = holder.lock(&key).lease(LONG_WATCHDOG).await.unwrap();
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move {
            waiter_service
                .lock(&key)
                .wait(Duration::from_secs(10))
                .await
                .map(|g| (g, Instant::now()))
        })
    };
    let info_key = key.clone();
    eventually("the waiter registered", Duration::from_secs(5), || async {
        holder.inspect(&info_key).await.unwrap().waiting_services > 0
    })
    .await;
    // well past the waiter's first registration (watchdog + 1 s)
    tokio::time::sleep(watchdog + Duration::from_secs(2)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (guard, granted) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let after = granted - released;
    assert!(
        after < Duration::from_secs(1),
        "the waiter got the lock only {after:?} after the release"
    );
    guard.release().await.unwrap();
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
    let scripts_before = evalsha_calls(&mut fx.redis());
    write
        .release()
        .await
        .expect("a hold the shutdown released releases quietly");
    leased.release().await.unwrap();
    drop((read, watched));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        evalsha_calls(&mut fx.redis()),
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
