//! The lock's safety promises under the faults a skeptical user would try: a stale hold never
//! merges with a new grant, an unknown outcome is undone exactly, nothing is stranded for a
//! whole lease when Redis stalls, keys cannot name each other's internals, arguments out of
//! range write nothing, and a holder learns of a partition before anyone else gets the lock.
//!
//! Each test names the fault it injects: `DEBUG SLEEP` (Redis busy past `response_timeout`),
//! the harness's TCP proxy (partitions and connection resets between one service and Redis),
//! raw writes that break a key, force-unlocks and leases that run out.

use std::time::{Duration, Instant};

use crate::common::{Fixture, Monitor, behind_proxy, eventually, script_call, waiters_in_line};
use lock_runtime::{ErrorKind, LockService, OwnerId, owner};
use lock_tests::harness::{Spec, unique_key};

const LONG: Duration = Duration::from_secs(30);

/// The lock key on Redis of a user key without braces or `%` (see `KeyNames`).
fn redis_key(key: &str) -> String {
    format!("lock:{{{key}}}")
}

async fn exists(fx: &Fixture, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query(&mut fx.redis())
        .unwrap();
    n == 1
}

/// Makes the server of `fx` sleep for `secs` (`DEBUG SLEEP`) from a thread of its own, and
/// returns once the server has stopped answering; join the handle to wait until it answers
/// again.
fn stall(fx: &Fixture, secs: f64) -> std::thread::JoinHandle<()> {
    let mut con = fx.redis();
    let mut probe = fx.redis();
    let sleeper = std::thread::spawn(move || {
        let () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(secs)
            .query(&mut con)
            .unwrap();
    });
    // stalled once a PING on another connection goes unanswered for 50 ms
    probe
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis::cmd("PING").query::<String>(&mut probe).is_ok() {
        assert!(
            Instant::now() < deadline,
            "DEBUG SLEEP did not stall the server"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    sleeper
}

async fn join_stall(sleeper: std::thread::JoinHandle<()>) -> Instant {
    tokio::task::spawn_blocking(move || sleeper.join().unwrap())
        .await
        .unwrap();
    Instant::now()
}

/// Stale hold + re-entry: the owner's lease ran out on Redis; locking again must make a new
/// grant that the stale guard can neither release nor share.
#[tokio::test]
async fn a_fresh_grant_never_merges_into_an_expired_hold() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("stale");
    owner::scope(OwnerId::new(), async {
        let outer = a
            .lock(&key)
            .lease(Duration::from_millis(300))
            .await
            .unwrap();
        eventually(
            "the lease ran out on Redis",
            Duration::from_secs(3),
            || async { !b.is_locked(&key).await.unwrap() },
        )
        .await;
        assert!(outer.is_lost(), "the guard knows its lease ran out");
        let inner = a.lock(&key).lease(LONG).await.unwrap();
        assert!(inner.fence() > outer.fence(), "a new grant, a new token");
        let stale = outer.release().await.unwrap_err();
        assert_eq!(stale.kind(), ErrorKind::NotHeld, "{stale}");
        // the new grant is untouched: nobody else can take the lock
        let busy = b.try_lock(&key).await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Timeout, "{busy}");
        assert!(!inner.is_lost());
        inner.release().await.unwrap();
        b.try_lock(&key).await.unwrap().release().await.unwrap();
    })
    .await;
}

/// The same after a force-unlock from the holder's own service.
#[tokio::test]
async fn a_force_unlocked_hold_is_a_dead_generation() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("forced");
    owner::scope(OwnerId::new(), async {
        let first = a.lock(&key).await.unwrap();
        assert!(a.force_unlock(&key).await.unwrap());
        assert!(first.is_lost());
        let second = a.lock(&key).await.unwrap();
        assert!(second.fence() > first.fence());
        let stale = first.release().await.unwrap_err();
        assert_eq!(stale.kind(), ErrorKind::NotHeld, "{stale}");
        let busy = b.try_lock(&key).await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Timeout, "{busy}");
        second.release().await.unwrap();
        assert!(!b.is_locked(&key).await.unwrap());
    })
    .await;
}

/// The same after the watchdog found the lock gone.
#[tokio::test]
async fn a_hold_the_watchdog_found_gone_is_a_dead_generation() {
    let fx = Fixture::single().await;
    let a = fx.service(Duration::from_millis(300)).await;
    let b = fx.service(LONG).await;
    let key = unique_key("vanished");
    owner::scope(OwnerId::new(), async {
        let first = a.lock(&key).await.unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(redis_key(&key))
            .query(&mut fx.redis())
            .unwrap();
        tokio::time::timeout(Duration::from_secs(3), first.lost())
            .await
            .expect("the watchdog reports the loss");
        let second = a.lock(&key).await.unwrap();
        let stale = first.release().await.unwrap_err();
        assert_eq!(stale.kind(), ErrorKind::NotHeld, "{stale}");
        let busy = b.try_lock(&key).await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Timeout, "{busy}");
        second.release().await.unwrap();
    })
    .await;
}

/// Give-back undoes only what its attempt did: an owner that is the same in every process
/// holds the key in one service; another service's attempt for that owner never reaches
/// Redis (partition, then the connection is reset) and is given back - which must not free
/// the hold that was already there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_back_an_attempt_that_never_ran_leaves_the_owners_hold_alone() {
    let (fx, proxy, b) =
        behind_proxy(|config| config.with_response_timeout(Duration::from_secs(5))).await;
    let a = fx.service(LONG).await;
    let c = fx.service(LONG).await;
    let key = unique_key("mesh");
    let mesh = OwnerId::across_processes(unique_key("op"));
    let held = a.lock(&key).owner(mesh.clone()).lease(LONG).await.unwrap();

    proxy.blackhole(true);
    // the attempt is sent into the partition and its caller goes away
    let attempt = b
        .lock(&key)
        .owner(mesh.clone())
        .wait(Duration::from_secs(1));
    assert!(
        tokio::time::timeout(Duration::from_millis(200), attempt.into_future())
            .await
            .is_err()
    );
    // the connection dies with the request unsent: the outcome is unknown to B
    proxy.reset_all().await;
    proxy.blackhole(false);
    // B gives the attempt back over a new connection
    eventually(
        "B reconnected and gave its attempt back",
        Duration::from_secs(5),
        || async { proxy.accepted() >= 2 && b.inspect(&key).await.is_ok() },
    )
    .await;
    let busy = c.try_lock(&key).await.unwrap_err();
    assert_eq!(
        busy.kind(),
        ErrorKind::Timeout,
        "the owner still holds it: {busy}"
    );
    assert!(!held.is_lost());
    held.release().await.unwrap();
    assert!(!c.is_locked(&key).await.unwrap());
}

/// Redis busy past `response_timeout` while an acquire is queued: the caller gets a timeout,
/// Redis then grants the lock to nobody - which must be given back as soon as Redis answers,
/// not held for the whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_is_given_back_once_redis_answers() {
    let fx = Fixture::own(Spec::Single).await;
    let response_timeout = Duration::from_millis(300);
    let a = LockService::connect(fx.config(LONG).with_response_timeout(response_timeout))
        .await
        .unwrap();
    let b = fx.service(LONG).await;
    let key = unique_key("asleep");
    for round in 0..2 {
        let sleeper = stall(&fx, 1.0);
        let err = a.lock(&key).wait(Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Backend, "round {round}: {err}");
        let awake = join_stall(sleeper).await;
        // with the grant stranded, this would wait for the 30 s lease
        let guard = b
            .lock(&key)
            .wait(response_timeout + Duration::from_secs(1))
            .await
            .unwrap_or_else(|e| panic!("round {round}: not given back: {e}"));
        println!(
            "round {round}: free {:?} after Redis answered again",
            awake.elapsed()
        );
        guard.release().await.unwrap();
    }
}

/// A re-entry whose reply was lost (Redis ran it, the connection dropped before the reply
/// arrived) must not leave the lock held once the outer hold is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_entry_whose_reply_was_lost_leaves_nothing_behind() {
    let (fx, proxy, a) = behind_proxy(|config| config).await;
    let b = fx.service(LONG).await;
    let key = unique_key("reenter");
    owner::scope(OwnerId::new(), async {
        let outer = a.lock(&key).lease(LONG).await.unwrap();
        proxy.drop_next_reply();
        let err = a.lock(&key).lease(LONG).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
        assert_eq!(proxy.replies_dropped(), 1);
        eventually("A reconnected", Duration::from_secs(5), || async {
            a.inspect(&key).await.is_ok()
        })
        .await;
        outer.release().await.unwrap();
    })
    .await;
    // outside A's owner scope: another owner
    let guard = b
        .lock(&key)
        .wait(Duration::from_secs(1))
        .await
        .expect("the lock is free once the outer hold is released");
    guard.release().await.unwrap();
}

/// No user key can name another lock's fence counter, waiting set or turn marker, and braces
/// in a key never choose its hash tag.
#[tokio::test]
async fn keys_never_name_another_locks_keys() {
    let fx = Fixture::single().await;
    let a = fx.service(LONG).await;
    let base = format!("{}{{t}}", unique_key("ns"));
    let guard = a.lock(&base).await.unwrap();
    let fence = guard.fence();
    guard.release().await.unwrap();
    assert_eq!(a.inspect(&base).await.unwrap().last_fence, Some(fence));
    let escaped = |key: &str| key.replace('{', "%7B").replace('}', "%7D");
    for reserved in [":fence", ":wq", ":turn", ":ch"] {
        let key = format!("{base}{reserved}");
        let guard = a
            .lock(&key)
            .wait(Duration::from_secs(1))
            .await
            .unwrap_or_else(|e| panic!("`{key}` is a lock of its own: {e}"));
        // held in a key of its own, not in one of `base`'s
        assert!(exists(&fx, &format!("lock:{{{}}}", escaped(&key))).await);
        assert!(!exists(&fx, &format!("lock:{{{}}}", escaped(&base))).await);
        guard.release().await.unwrap();
        a.force_unlock(&key).await.unwrap();
    }
    // the counter `base` draws from went on (one server: every lock's), never back
    let last = a.inspect(&base).await.unwrap().last_fence;
    assert!(
        last.is_some_and(|last| last > fence),
        "the fence counter of `{base}` survived: {last:?} after {fence}"
    );
    // the whole key is the hash tag, braces and all
    let held = a.lock(&base).lease(LONG).await.unwrap();
    assert!(exists(&fx, &format!("lock:{{{}}}", escaped(&base))).await);
    held.release().await.unwrap();
}

/// Leases out of range are refused before anything is written; a huge wait means forever.
#[tokio::test]
async fn leases_and_waits_out_of_range() {
    let fx = Fixture::single().await;
    let a = fx.service(LONG).await;
    let key = unique_key("range");
    for lease in [
        Duration::MAX,
        Duration::from_millis(1 << 63),
        Duration::from_secs(3651 * 24 * 3600),
        Duration::ZERO,
        Duration::from_micros(999),
    ] {
        let err = a.lock(&key).lease(lease).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{lease:?}: {err}");
        assert!(
            !exists(&fx, &redis_key(&key)).await,
            "{lease:?} wrote the lock"
        );
    }
    let guard = a.lock(&key).wait(Duration::MAX).await.unwrap();
    guard.release().await.unwrap();
    let guard = a
        .lock(&key)
        .lease(Duration::from_secs(3650 * 24 * 3600))
        .wait(Duration::MAX)
        .await
        .unwrap();
    guard.release().await.unwrap();
}

/// One lock whose key was overwritten by something that is not a lock must not stop the
/// renewal of the service's other locks.
#[tokio::test]
async fn one_broken_key_does_not_stop_the_renewal_of_the_others() {
    let fx = Fixture::single().await;
    let a = fx.service(Duration::from_millis(300)).await;
    let b = fx.service(LONG).await;
    let (broken, fine) = (unique_key("broken"), unique_key("fine"));
    let broken_guard = a.lock(&broken).await.unwrap();
    let fine_guard = a.lock(&fine).await.unwrap();
    let () = redis::cmd("SET")
        .arg(redis_key(&broken))
        .arg("not a lock")
        .query(&mut fx.redis())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), broken_guard.lost())
        .await
        .expect("the broken lock is reported lost");
    // several renewal periods later the other lock is still held and renewed
    for _ in 0..3 {
        let busy = b.try_lock(&fine).await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Timeout, "{busy}");
        assert!(!fine_guard.is_lost());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    fine_guard.release().await.unwrap();
    drop(broken_guard);
}

/// A holder cut off from Redis learns of it (`lost()`) before another service is granted the
/// lock: its validity deadline runs from when its last renewal was sent, not from the next
/// watchdog tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_learns_of_the_loss_before_anyone_else_gets_the_lock() {
    let watchdog = Duration::from_secs(1);
    let (fx, proxy, a) = behind_proxy(|config| {
        config
            .with_watchdog_timeout(watchdog)
            .with_response_timeout(Duration::from_millis(200))
    })
    .await;
    let b = fx.service(LONG).await;
    let mut ahead = Vec::new();
    for round in 0..4 {
        let key = unique_key("cut");
        let guard = a.lock(&key).await.unwrap();
        // cut at a different point of the renewal period each round
        tokio::time::sleep(watchdog / 4 * round).await;
        proxy.blackhole(true);
        let cut = Instant::now();
        let holder = tokio::spawn(async move {
            let lost = guard.lost().await;
            (Instant::now(), lost, guard)
        });
        let other = b.lock(&key).wait(watchdog * 3).await.unwrap();
        let granted = Instant::now();
        let (lost_at, why, guard) = holder.await.unwrap();
        assert_eq!(why.kind(), ErrorKind::Lost);
        assert!(
            lost_at <= granted,
            "round {round}: lost() fired {:?} after the other service's grant",
            lost_at - granted
        );
        ahead.push(granted - lost_at);
        println!(
            "round {round}: cut at +{:?}; lost() {:?} after the cut, {:?} before the other grant",
            watchdog / 4 * round,
            lost_at - cut,
            granted - lost_at
        );
        let stale = guard.release().await.unwrap_err();
        assert_eq!(stale.kind(), ErrorKind::NotHeld);
        other.release().await.unwrap();
        proxy.reset_all().await;
        proxy.blackhole(false);
        eventually("A reconnected", Duration::from_secs(5), || async {
            a.inspect(&key).await.is_ok()
        })
        .await;
    }
    println!("lost() ahead of the other grant: {ahead:?}");
}

/// A service that stopped waiting - its caller timed out, was cancelled, or the whole service
/// died while registered as waiting - must not keep the next turn from the services still
/// waiting: A holds, B waits 10 s, C stops waiting; when A releases, B gets the lock within
/// about a turn (250 ms), not at the end of the released lock's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_stopped_waiting_does_not_keep_the_turn() {
    let fx = Fixture::single().await;
    let (a, b, c) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );
    for how in ["timed out", "cancelled", "died"] {
        let key = unique_key("departed");
        let held = a.lock(&key).lease(LONG).await.unwrap();
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move { b.lock(&key).wait(Duration::from_secs(10)).await })
        };
        waiters_in_line(&b, &key, 1).await;
        eventually(
            "B is registered as waiting",
            Duration::from_secs(5),
            || async { a.inspect(&key).await.unwrap().waiting_services == 1 },
        )
        .await;
        match how {
            "timed out" => {
                let gave_up = c
                    .lock(&key)
                    .wait(Duration::from_millis(300))
                    .await
                    .unwrap_err();
                assert_eq!(gave_up.kind(), ErrorKind::Timeout);
                // it left the waiting set before its caller got the error
                assert_eq!(a.inspect(&key).await.unwrap().waiting_services, 1);
            }
            "cancelled" => {
                let attempt = c.lock(&key).wait(Duration::from_secs(10)).into_future();
                let mut attempt = Box::pin(attempt);
                let registered = async {
                    eventually("C is registered", Duration::from_secs(5), || async {
                        a.inspect(&key).await.unwrap().waiting_services == 2
                    })
                    .await
                };
                tokio::select! {
                    _ = &mut attempt => panic!("C cannot get the lock"),
                    () = registered => {}
                }
                drop(attempt);
            }
            _ => {
                // a service that registered as waiting ahead of B, then died
                let now: (u64, u64) = redis::cmd("TIME").query(&mut fx.redis()).unwrap();
                let score = now.0 * 1000 + now.1 / 1000 + 5_000;
                let _: i64 = redis::cmd("ZADD")
                    .arg(format!("{}:wq", redis_key(&key)))
                    .arg(score)
                    .arg("a-service-that-died")
                    .query(&mut fx.redis())
                    .unwrap();
            }
        }
        let released = Instant::now();
        held.release().await.unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .unwrap_or_else(|_| panic!("C {how}: B still waits 2 s after the release"))
            .unwrap()
            .unwrap();
        println!(
            "C {how}: B got the lock {:?} after the release",
            released.elapsed()
        );
        guard.release().await.unwrap();
    }
}

/// A release that never reached Redis (the connection was cut while it was on its way) is sent
/// again once Redis can be reached: the lock is not left held for its whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_never_reached_redis_is_sent_again() {
    let (fx, proxy, a) =
        behind_proxy(|config| config.with_response_timeout(Duration::from_millis(300))).await;
    let b = fx.service(LONG).await;
    let key = unique_key("unsent");
    let held = a.lock(&key).lease(LONG).await.unwrap();
    proxy.blackhole(true);
    let err = held.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(
        b.is_locked(&key).await.unwrap(),
        "the release never arrived"
    );
    proxy.reset_all().await;
    proxy.blackhole(false);
    // with the release lost, this would wait for the 30 s lease
    let guard = b
        .lock(&key)
        .wait(Duration::from_secs(5))
        .await
        .expect("the release is sent again once Redis can be reached");
    guard.release().await.unwrap();
}

/// A release that Redis answers with "not held" (another service force-unlocked the lock while
/// this one still counted on it) is `NotHeld`, never a silent success.
#[tokio::test]
async fn a_release_redis_finds_not_held_is_not_held() {
    release_after_another_service_force_unlocked(false).await;
}

/// The same when the other service took the lock meanwhile: the release frees nothing, and the
/// new holder keeps the lock. The two values differ only in their grant ids and owner fields,
/// which have the same lengths: a release that compared less than the whole tail would free the
/// other service's hold.
#[tokio::test]
async fn a_release_after_another_service_took_the_lock_frees_nothing() {
    release_after_another_service_force_unlocked(true).await;
}

/// A holds the lock; B force-unlocks it (and takes it, when `taken`); A's release is `NotHeld`
/// and leaves B's hold alone.
async fn release_after_another_service_force_unlocked(taken: bool) {
    let fx = Fixture::single().await;
    let (a, b, c) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );
    let key = unique_key("broken-by-other");
    let guard = a.lock(&key).await.unwrap();
    assert!(b.force_unlock(&key).await.unwrap());
    assert!(
        !guard.is_lost(),
        "this service learns it at the next renewal only"
    );
    let holder = match taken {
        true => Some(b.lock(&key).await.unwrap()),
        false => None,
    };
    let err = guard.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    if let Some(holder) = holder {
        let busy = c.try_lock(&key).await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Timeout, "{busy}");
        assert!(!holder.is_lost());
        holder.release().await.unwrap();
    }
    c.try_lock(&key).await.unwrap().release().await.unwrap();
}

/// A re-entry without a lease inside a hold with a short lease keeps the lock alive (the
/// watchdog renews it while that guard lives), also past the outer lease.
#[tokio::test]
async fn a_watched_re_entry_keeps_a_leased_hold_alive() {
    let fx = Fixture::single().await;
    let a = fx.service(Duration::from_millis(300)).await;
    let b = fx.service(LONG).await;
    let key = unique_key("watched-inner");
    owner::scope(OwnerId::new(), async {
        let outer = a
            .lock(&key)
            .lease(Duration::from_millis(300))
            .await
            .unwrap();
        let inner = a.lock(&key).await.unwrap();
        // three leases later the lock is still held and valid
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(!inner.is_lost(), "the watchdog renewed it");
        let busy = b.try_lock(&key).await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Timeout, "{busy}");
        inner.release().await.unwrap();
        outer.release().await.unwrap();
    })
    .await;
    assert!(!b.is_locked(&key).await.unwrap());
}

/// A re-entry that finds the grant gone on Redis (another service force-unlocked it) makes the
/// old guards lost at once, not at their deadline, and takes a new grant.
#[tokio::test]
async fn a_re_entry_that_finds_the_grant_gone_marks_the_old_guards_lost() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("gone-on-reentry");
    owner::scope(OwnerId::new(), async {
        let first = a.lock(&key).await.unwrap();
        assert!(b.force_unlock(&key).await.unwrap());
        assert!(!first.is_lost(), "not known here yet");
        let second = a.lock(&key).await.unwrap();
        assert!(first.is_lost(), "the re-entry found the grant gone");
        assert!(second.fence() > first.fence());
        assert_eq!(
            first.release().await.unwrap_err().kind(),
            ErrorKind::NotHeld
        );
        second.release().await.unwrap();
    })
    .await;
}

/// The watchdog renews only holds without a lease: a fixed lease runs out on time even while
/// the watchdog ticks faster than the lease.
#[tokio::test]
async fn the_watchdog_never_extends_a_fixed_lease() {
    let fx = Fixture::single().await;
    let a = fx.service(Duration::from_millis(300)).await;
    let b = fx.service(LONG).await;
    let key = unique_key("fixed");
    let guard = a
        .lock(&key)
        .lease(Duration::from_millis(500))
        .await
        .unwrap();
    eventually(
        "the fixed lease ran out on Redis",
        Duration::from_secs(3),
        || async { !b.is_locked(&key).await.unwrap() },
    )
    .await;
    assert!(guard.is_lost());
    drop(guard);
}

/// An `extend` that shortens a fixed lease and is cancelled while its reply is on its way:
/// Redis applied the shorter lease, so the guard must be lost when it runs out - before
/// another service can be granted the lock - not go on trusting the longer one.
#[tokio::test]
async fn a_cancelled_shortening_extend_never_leaves_the_guard_the_longer_lease() {
    let (fx, proxy, service) = behind_proxy(|c| c).await;
    let other = fx.service(LONG).await;
    let key = unique_key("short-extend");
    let guard = service
        .lock(&key)
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    // (a first extend loads the script, so the next one runs as soon as it arrives)
    guard.extend(Duration::from_secs(10)).await.unwrap();
    // the call reaches Redis at once, its reply 600 ms later: cancelled before it arrives
    proxy.set_latency(Duration::from_millis(600));
    let extend = guard.extend(Duration::from_millis(300));
    let cancelled = tokio::time::timeout(Duration::from_millis(150), extend).await;
    assert!(
        cancelled.is_err(),
        "the extend answered before it was cancelled"
    );
    proxy.set_latency(Duration::ZERO);
    // Redis expires the key 300 ms after the extend: another service gets it then
    let taken = other.lock(&key).wait(Duration::from_secs(5)).await.unwrap();
    assert!(
        guard.is_lost(),
        "another service holds the lock while the guard still counts on its 10 s lease \
         ({:?} left)",
        guard
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
    taken.release().await.unwrap();
}

/// A copy of a pushed grant's message that reaches the holder while its release is on its way
/// (a subscriber that reconnected can hear a shard channel's message twice, and any message can
/// come after the reply of an attempt that found its grant already there) is not a grant to a
/// waiter that left: the release alone ends the grant, and nothing else is sent for it. (Before,
/// the copy found neither the waiter nor the hold and gave the grant back beside the release; on
/// a cluster that give-back could run first and free the lock under the release, which then
/// reported `NotHeld`.) B reaches Redis through a proxy that holds every request back 300 ms,
/// so that its release is on its way when the copy, published on a direct connection, comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_pushed_grant_is_not_given_back() {
    let (fx, proxy, b) = behind_proxy(|config| config.with_watchdog_timeout(LONG)).await;
    let a = fx.service(LONG).await;
    let key = unique_key("late-copy");
    let channel = format!("{}:ch", redis_key(&key));

    // the messages of the lock's channel, heard on a connection of the test's own
    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let mut listener = fx.redis();
    let listening = channel.clone();
    std::thread::spawn(move || {
        let mut pubsub = listener.as_pubsub();
        pubsub.subscribe(&listening).unwrap();
        pubsub
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        ready_tx.send(()).unwrap();
        while let Ok(message) = pubsub.get_message() {
            if heard_tx.send(message.get_payload().unwrap()).is_err() {
                return;
            }
        }
    });
    ready.await.unwrap();

    let held = a.lock(&key).lease(LONG).await.unwrap();
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.lock(&key).lease(LONG).wait(Duration::from_secs(20)).await })
    };
    eventually(
        "B is registered as waiting",
        Duration::from_secs(5),
        || async { a.inspect(&key).await.unwrap().waiting_services == 1 },
    )
    .await;
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("B got the lock")
        .unwrap()
        .unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .expect("the release published a message")
        .unwrap();
    let fields: Vec<&str> = message.split('\n').collect();
    assert_eq!(fields.len(), 6, "a grant pushed to B's head: {message:?}");
    assert_eq!(fields[2].parse::<u64>().unwrap(), guard.fence());
    let grant = fields[1].to_owned();

    let seen = grant.clone();
    let monitor = Monitor::start(fx.topo().master_port(), move |line| {
        script_call(line) && line.contains(&seen)
    })
    .await;
    proxy.set_request_latency(Duration::from_millis(100));
    let release = guard.release();
    tokio::pin!(release);
    // one poll: the release has left the guard's bookkeeping and is on its way to Redis
    tokio::select! {
        biased;
        _ = &mut release => panic!("the release cannot be answered inside the proxy's delay"),
        () = std::future::ready(()) => {}
    }
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg(&message)
        .query(&mut fx.redis())
        .unwrap();
    release
        .await
        .expect("the release ends the grant the copy named");
    // anything B sent for the grant after the copy came went out before this question
    assert!(!b.is_locked(&key).await.unwrap());
    monitor.sync().await;
    assert_eq!(
        monitor.count(),
        1,
        "only the release is sent for the grant: {:#?}",
        monitor.lines()
    );
}
