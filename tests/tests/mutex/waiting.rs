//! Fair, herd-free waiting: waiters of one service line up in arrival order and only the head
//! asks Redis; a release wakes one waiter per service (by message, also one that waits longer
//! than its watchdog timeout) and hands the lock to the head; services waiting elsewhere take
//! turns (slices of up to 5 ms), the lock granted to their head by the release, and a turn
//! nobody claims runs out. The bodies at the end run on every topology (see
//! `topology_tests!` there).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{
    Fixture, Monitor, acquires_of, eventually, lock_key, script_calls, waiters_in_line,
};
use lock_tests::harness::{Spec, unique_key};
use tokio::sync::Mutex;

const LONG_WATCHDOG: Duration = Duration::from_secs(30);
/// A service passes a lock among its own waiters for at most 5 ms while other services wait
/// (README, "Fair, herd-free waiting"); a section this long ends every such turn.
const SECTION_PAST_SLICE: Duration = Duration::from_millis(12);

// ---- single node ----

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
    let mut before = script_calls(&mut con);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = script_calls(&mut con);
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
        calls = script_calls(&mut con) - before;
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

/// Service A holds the lock past its slice while A and B line up waiters alternately; from
/// then on each release gives the next turn to the other service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_take_turns_instead_of_one_keeping_the_lock() {
    let fx = Fixture::single().await;
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("turns");
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = a.lock(&key).await.unwrap();
    let first_granted = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..3 {
        for (name, service) in [("a", &a), ("b", &b)] {
            let (l, k, order) = (service.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let g = l.lock(&k).wait(Duration::from_secs(10)).await.unwrap();
                order.lock().await.push(name);
                tokio::time::sleep(SECTION_PAST_SLICE).await;
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
    // within its slice A would pass the lock to its own next waiter (what the next test is
    // about): the first release comes after the slice, however fast the lining up was
    tokio::time::sleep_until(first_granted + SECTION_PAST_SLICE).await;
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

/// A service passes the lock among its own waiters while others wait for a slice of 5 ms at
/// most: service A has 16 waiters whose sections take 1 ms or more (so at most six of them fit
/// in a slice that begins when A gets the lock), B has 3 waiters, lined up after A's; between two
/// of B's sections, and before B's first, A runs at most six. (That A's waiters pass the lock
/// along inside A meanwhile is what bench S3 measures: about 5 commands per critical section
/// with 4 services on one key, as with one service.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_keeps_the_lock_for_its_own_waiters_a_slice_at_most() {
    let fx = Fixture::single().await;
    let holder = fx.service(LONG_WATCHDOG).await;
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("slice");
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = holder.lock(&key).await.unwrap();
    let mut tasks = Vec::new();
    // A registers first, so it gets the lock first
    for (name, service, n) in [("a", &a, 16), ("b", &b, 3)] {
        for i in 0..n {
            let (l, k, order) = (service.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let g = l.lock(&k).wait(Duration::from_secs(20)).await.unwrap();
                order.lock().await.push(name);
                tokio::time::sleep(Duration::from_millis(1)).await;
                g.release().await.unwrap();
            }));
            waiters_in_line(service, &key, i + 1).await;
        }
    }
    eventually(
        "two services registered as waiting",
        Duration::from_secs(5),
        || async { holder.inspect(&key).await.unwrap().waiting_services == 2 },
    )
    .await;
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().await.clone();
    let last_b = order.iter().rposition(|n| *n == "b").unwrap();
    let runs: Vec<usize> = order[..last_b]
        .split(|n| *n == "b")
        .map(<[&str]>::len)
        .collect();
    assert!(
        runs.iter().all(|&run| run <= 6),
        "A kept the lock past its slice while B waited: {order:?}"
    );
}

/// A release gives the lock to the service that has been registered as waiting longest
/// (README: "grants the lock ... to the head waiter of the longest-registered one"). Services
/// A, B and C wait from the start; A has a second waiter with a shorter wait. Once A and B have
/// had the lock, C - waiting all along - is next, not A again (each section lasts longer than a
/// service's slice of passing the lock among its own waiters).
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
            // longer than a service's slice of passing the lock among its own waiters
            tokio::time::sleep(SECTION_PAST_SLICE).await;
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

/// Four services with three workers each take turns on one key, 15 critical sections per
/// worker. The lock goes from one service to the next in the release's script call alone: the
/// release grants it to the next service's head waiter, which holds it from the grant's message
/// on; the releasing service's next waiter, registered as waiting by that release, waits for
/// its grant's message instead of asking Redis in vain, and the grants that go to other services
/// meanwhile do not wake it. Script calls are counted over the whole run (`INFO commandstats`,
/// on a server of its own); a few per service are allowed for the first waiter's attempts and
/// its subscription. (With a turn to claim, as before grants were pushed, it took two calls per
/// critical section.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_between_services_cost_one_release_each() {
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
    let before = script_calls(&mut con);
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
    let calls = script_calls(&mut con) - before;
    let sections = (SERVICES * WORKERS * ROUNDS) as u64;
    let allowed = sections + 8 * SERVICES as u64;
    assert!(
        calls <= allowed,
        "{calls} script calls for {sections} critical sections (at most {allowed})"
    );
}

// ---- every topology ----

/// Waiters of one service get the lock in arrival order, and a holder that releases and locks
/// again queues behind them.
async fn waiters_of_one_service_are_served_in_arrival_order(fx: Fixture) {
    let locks = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("fifo");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first = locks.lock(&key).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (l, k, order) = (locks.clone(), key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = l.lock(&k).wait(Duration::from_secs(10)).await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        waiters_in_line(&locks, &key, i + 1).await;
    }
    first.release().await.unwrap();
    let again = locks
        .lock(&key)
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    order.lock().unwrap().push(99);
    again.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 99]);
}

/// A waiter of another service sleeps until the release's message grants it the lock. Its only
/// other ways to wake are far off: the lock's lease (30 s, the hint it sleeps on) and its own
/// wait (20 s). The release comes only once the waiter is subscribed (`PUBSUB NUMSUB` /
/// `SHARDNUMSUB` on the node serving the channel) and has made the attempt that follows its
/// subscription (its attempts are seen with `MONITOR`): before that, the attempt could take
/// the lock without any message. The release grants the lock to the waiter in its script, so
/// the waiter holds it from the message on, without another acquire attempt, with a token
/// above the holder's, and keeps it past the grant's claim window (250 ms), which it
/// lengthens to its lease.
async fn a_release_wakes_a_waiter_of_another_service(fx: Fixture) {
    let holder = fx.service(LONG_WATCHDOG).await;
    let waiter = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("wake");
    let channel = format!("{}:ch", lock_key(&key));
    let guard = holder.lock(&key).await.unwrap();
    let attempts = Monitor::start(fx.node_for(&lock_key(&key)), acquires_of(&key)).await;
    let (w, k) = (waiter.clone(), key.clone());
    let waiting = tokio::spawn(async move { w.lock(&k).wait(Duration::from_secs(20)).await });
    eventually(
        "the waiter subscribed to the wake-up channel",
        Duration::from_secs(5),
        || async { fx.subscribers(&channel) == 1 },
    )
    .await;
    // Asleep once it has tried again after subscribing (a release before that attempt could
    // hand it the turn without a message) and then stays quiet. Today a waiter makes a third
    // attempt at once after the second: the line's head starts with a stored wake-up permit.
    eventually(
        "the waiter tried again after subscribing, then went quiet",
        Duration::from_secs(5),
        || async {
            attempts.sync().await;
            let n = attempts.count();
            tokio::time::sleep(Duration::from_millis(200)).await;
            attempts.sync().await;
            n >= 2 && attempts.count() == n
        },
    )
    .await;
    let before = attempts.count();
    assert_eq!(holder.inspect(&key).await.unwrap().waiting_services, 1);
    let holder_fence = guard.fence();
    guard.release().await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the waiter still sleeps 10 s after the release: no wake-up message reached it \
                 (acquire attempts: {:#?})",
                attempts.lines()
            )
        });
    let g = woken.unwrap().unwrap();
    assert!(
        g.fence() > holder_fence,
        "the grant's token is above the holder's"
    );
    attempts.sync().await;
    assert_eq!(
        attempts.count(),
        before,
        "the release granted the lock to the waiter: no acquire attempt after it: {:#?}",
        attempts.lines()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !g.is_lost() && g.valid_until() > std::time::Instant::now() + Duration::from_secs(20),
        "the pushed grant was claimed before its claim window ran out (valid for {:?})",
        g.valid_until()
            .saturating_duration_since(std::time::Instant::now())
    );
    let info = holder.inspect(&key).await.unwrap();
    let ttl = info.ttl.expect("the lock is held");
    assert!(
        ttl > Duration::from_secs(20),
        "the lease was lengthened to the waiter's: {ttl:?} left"
    );
    g.release().await.unwrap();
}

/// Three services waiting for one lock get it in turn: every service has had it before any has
/// it twice, and no service keeps it while others wait (each section lasts longer than a
/// service's slice of passing the lock among its own waiters). (The services' waits end in the
/// order they arrive, 50 ms apart: the turn order follows the waiters' deadlines, see above for
/// a service that gets the turn back ahead of one waiting longer.)
async fn three_services_take_turns(fx: Fixture) {
    let holder = fx.service(LONG_WATCHDOG).await;
    let services = [
        ("a", fx.service(LONG_WATCHDOG).await),
        ("b", fx.service(LONG_WATCHDOG).await),
        ("c", fx.service(LONG_WATCHDOG).await),
    ];
    let key = unique_key("turns3");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first = holder.lock(&key).await.unwrap();
    let mut tasks = Vec::new();
    let mut wait = Duration::from_secs(20);
    for i in 0..2 {
        for (name, service) in &services {
            let (l, k, order, name) = (service.clone(), key.clone(), order.clone(), *name);
            tasks.push(tokio::spawn(async move {
                let g = l.lock(&k).wait(wait).await.unwrap();
                order.lock().unwrap().push(name);
                tokio::time::sleep(SECTION_PAST_SLICE).await;
                g.release().await.unwrap();
            }));
            waiters_in_line(service, &key, i + 1).await;
            wait += Duration::from_millis(50);
        }
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
    let order = order.lock().unwrap().clone();
    for round in order.chunks(3) {
        let mut names = round.to_vec();
        names.sort_unstable();
        assert_eq!(names, ["a", "b", "c"], "each service in turn: {order:?}");
    }
}

/// A turn nobody claims runs out: a service registered as waiting ahead of B and went away
/// (it gets the turn at the release); B gets the lock once the turn ran out (it can't before),
/// long before the released lock's lease (30 s, what B sleeps on) or its own wait (20 s).
async fn an_unclaimed_turn_runs_out(fx: Fixture) {
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key("turn-expiry");
    let queue = format!("{}:wq", lock_key(&key));
    let held = a.lock(&key).await.unwrap();
    let (s, k) = (b.clone(), key.clone());
    let waiting = tokio::spawn(async move { s.lock(&k).wait(Duration::from_secs(20)).await });
    waiters_in_line(&b, &key, 1).await;
    eventually(
        "B registered as waiting",
        Duration::from_secs(5),
        || async { a.inspect(&key).await.unwrap().waiting_services == 1 },
    )
    .await;
    let mut con = fx.conn_for(&queue);
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    // B is registered until about its deadline (20 s away): this one comes first
    let _: i64 = redis::cmd("ZADD")
        .arg(&queue)
        .arg(secs * 1000 + micros / 1000 + 5_000)
        .arg("a-service-that-went-away")
        .query(&mut con)
        .unwrap();
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("B still waits 10 s after the release: the unclaimed turn kept the lock")
        .unwrap()
        .unwrap();
    let after = released.elapsed();
    assert!(
        after >= Duration::from_millis(250),
        "B took the lock {after:?} after the release, inside the other service's turn"
    );
    guard.release().await.unwrap();
}

topology_tests!(
    waiters_of_one_service_are_served_in_arrival_order,
    a_release_wakes_a_waiter_of_another_service,
    three_services_take_turns,
    an_unclaimed_turn_runs_out,
);
