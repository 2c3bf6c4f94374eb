//! The semaphore's promises against real Redis: at most N permits held at any time across
//! services (on every topology, and while a fault proxy drops and delays replies), permits
//! that come back with their lease when a holder crashes or stops, watched permits renewed
//! while held, `acquire_many` all or nothing, `available()` as held, waiters woken by releases
//! without polling, releases that hand their permits to the waiters of their own service (no
//! more than that service's share while others wait), invalid counts refused before anything is
//! written, and cancelled acquires that give back what Redis granted them.
//!
//! A semaphore `name` is the hash `lock:sem:{name}` on Redis (one field `p:<grant id>` per
//! grant), with `:wq` and the channel `:ch` after it, and the fence counter of its slot.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Fixture, Worker, eventually, script_call, script_calls};
use lock_runtime::{
    ErrorKind, LockConfig, LockError, LockKind, LockService, Topology as LockTopology,
};
use lock_tests::harness::{Proxy, Spec, Topology, unique_key};
use rand::Rng;

const LONG: Duration = Duration::from_secs(30);

/// The hash of the semaphore `name` on Redis (default prefix `lock:`).
fn sem_hash(name: &str) -> String {
    format!("lock:sem:{{{name}}}")
}

/// The grants of the semaphore `name` on Redis: grant field -> '<expiry ms> <permits> <owner>'.
fn grants_on_redis(fx: &Fixture, name: &str) -> HashMap<String, String> {
    let hash = sem_hash(name);
    let all: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&hash)
        .query(&mut fx.conn_for(&hash))
        .unwrap();
    all.into_iter()
        .filter(|(f, _)| f.starts_with("p:"))
        .collect()
}

/// The services registered as waiting for the semaphore `name` (its `:wq` zset): member ->
/// registered until (server ms).
fn waiting_set(fx: &Fixture, name: &str) -> Vec<(String, u64)> {
    let queue = format!("{}:wq", sem_hash(name));
    redis::cmd("ZRANGE")
        .arg(&queue)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut fx.conn_for(&queue))
        .unwrap()
}

/// The server's clock in ms (the waiting set's scores are in it).
fn server_ms(fx: &Fixture) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut fx.redis()).unwrap();
    s * 1000 + us / 1000
}

/// The permits the grants on Redis hold, live or not.
fn permits_on_redis(fx: &Fixture, name: &str) -> u64 {
    grants_on_redis(fx, name)
        .values()
        .map(|v| v.split(' ').nth(1).unwrap().parse::<u64>().unwrap())
        .sum()
}

/// What the contending tasks saw.
#[derive(Debug, Default)]
struct Tally {
    sections: AtomicU64,
    /// Permits held by the tasks right now (counted from the grant to just before the release).
    inside: AtomicI64,
    /// The most permits the tasks held at once.
    max_inside: AtomicI64,
    /// Grants after which the tasks held more permits than the semaphore has.
    over: AtomicU64,
    /// The lowest `available()` a sampler saw while the tasks ran.
    min_available: AtomicI64,
    samples: AtomicU64,
    /// (operation, kind, message) of every error the library returned.
    errors: Mutex<Vec<(&'static str, ErrorKind, String)>>,
}

impl Tally {
    fn error(&self, op: &'static str, e: &LockError) {
        self.errors
            .lock()
            .unwrap()
            .push((op, e.kind(), e.to_string()));
    }

    fn errors_by_kind(&self) -> HashMap<(&'static str, ErrorKind), usize> {
        let mut kinds = HashMap::new();
        for (op, kind, _) in self.errors.lock().unwrap().iter() {
            *kinds.entry((*op, *kind)).or_default() += 1;
        }
        kinds
    }
}

/// The load of [`contend`]: every service runs `tasks` tasks of `rounds` rounds each: acquire
/// (every fourth task two permits at once, every second task watched, the others with `lease`),
/// hold for about `work`, release.
#[derive(Debug, Clone, Copy)]
struct Load {
    permits: u32,
    tasks: usize,
    rounds: usize,
    lease: Duration,
    wait: Duration,
    work: Duration,
}

/// Runs `load` on the semaphore `name` in every service of `services`, while a sampler asks
/// `sampler` for `available()`; returns what the tasks saw once all are done.
async fn contend(
    services: &[LockService],
    sampler: &LockService,
    name: &str,
    load: Load,
) -> Arc<Tally> {
    let tally = Arc::new(Tally {
        min_available: AtomicI64::new(i64::MAX),
        ..Tally::default()
    });
    let mut tasks = tokio::task::JoinSet::new();
    for service in services {
        for task in 0..load.tasks {
            let (sem, tally) = (service.semaphore(name, load.permits), tally.clone());
            tasks.spawn(async move {
                let count = if task % 4 == 0 { 2 } else { 1 };
                for _ in 0..load.rounds {
                    let mut request = sem.acquire_many(count).wait(load.wait);
                    if task % 2 == 1 {
                        request = request.lease(load.lease);
                    }
                    let permit = match request.await {
                        Ok(p) => p,
                        Err(e) => {
                            tally.error("acquire", &e);
                            continue;
                        }
                    };
                    assert_eq!(permit.count(), count);
                    let now = tally.inside.fetch_add(i64::from(count), Ordering::SeqCst)
                        + i64::from(count);
                    tally.max_inside.fetch_max(now, Ordering::SeqCst);
                    if now > i64::from(load.permits) {
                        tally.over.fetch_add(1, Ordering::SeqCst);
                    }
                    let jitter = rand::rng().random_range(0..=load.work.as_millis() as u64);
                    tokio::time::sleep(load.work / 2 + Duration::from_millis(jitter)).await;
                    tally.inside.fetch_sub(i64::from(count), Ordering::SeqCst);
                    tally.sections.fetch_add(1, Ordering::SeqCst);
                    if let Err(e) = permit.release().await {
                        tally.error("release", &e);
                    }
                }
            });
        }
    }
    let sem = sampler.semaphore(name, load.permits);
    let sampling = async {
        loop {
            if let Ok(free) = sem.available().await {
                tally.min_available.fetch_min(free, Ordering::SeqCst);
                tally.samples.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let run = async {
        while let Some(joined) = tasks.join_next().await {
            joined.expect("a contending task panicked");
        }
    };
    tokio::select! {
        () = run => {}
        () = sampling => unreachable!(),
    }
    tally
}

/// The checks every contention run ends with: never more than N permits held (by the tasks'
/// count and by Redis's own), the limit reached, and every permit free again afterwards.
async fn assert_at_most_n(
    fx: Option<&Fixture>,
    check: &LockService,
    name: &str,
    load: Load,
    t: &Tally,
) {
    let sections = t.sections.load(Ordering::SeqCst);
    println!(
        "{sections} sections ({} tasks per service x {} rounds, 1 or 2 permits each), most \
         permits held at once {} of {}, lowest available() {} in {} samples, errors {:?}",
        load.tasks,
        load.rounds,
        t.max_inside.load(Ordering::SeqCst),
        load.permits,
        t.min_available.load(Ordering::SeqCst),
        t.samples.load(Ordering::SeqCst),
        t.errors_by_kind()
    );
    assert_eq!(
        t.over.load(Ordering::SeqCst),
        0,
        "more than {} permits held at once (most: {})",
        load.permits,
        t.max_inside.load(Ordering::SeqCst)
    );
    assert!(
        t.max_inside.load(Ordering::SeqCst) <= i64::from(load.permits),
        "more than {} permits held",
        load.permits
    );
    assert_eq!(
        t.max_inside.load(Ordering::SeqCst),
        i64::from(load.permits),
        "the load never held all permits at once: it cannot show the limit"
    );
    assert!(t.samples.load(Ordering::SeqCst) > 0);
    assert!(
        t.min_available.load(Ordering::SeqCst) >= 0,
        "Redis counted more permits held than there are"
    );
    let sem = check.semaphore(name, load.permits);
    eventually(
        "every permit is free once the load is over",
        Duration::from_secs(5),
        || async { sem.available().await.unwrap() == i64::from(load.permits) },
    )
    .await;
    if let Some(fx) = fx {
        eventually(
            "the semaphore's hash is gone with its last grant",
            Duration::from_secs(5),
            || async { !fx.exists(&sem_hash(name)) },
        )
        .await;
    }
}

// ---- on every topology ----

/// Three services x four tasks on a semaphore of 3 permits, some tasks taking 2 at once, some
/// watched, some leased: never more than 3 held.
async fn at_most_n_permits_are_held_at_once(fx: Fixture) {
    let services = vec![
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    ];
    let sampler = fx.service(LONG).await;
    let name = unique_key("sem-n");
    let load = Load {
        permits: 3,
        tasks: 4,
        rounds: 8,
        lease: LONG,
        wait: Duration::from_secs(20),
        work: Duration::from_millis(10),
    };
    let tally = contend(&services, &sampler, &name, load).await;
    assert_eq!(
        tally.sections.load(Ordering::SeqCst),
        (services.len() * load.tasks * load.rounds) as u64,
        "every round got its permits: {:?}",
        tally.errors.lock().unwrap()
    );
    assert_at_most_n(Some(&fx), &sampler, &name, load, &tally).await;
}

/// `acquire_many(n)` takes n permits in one grant or none: a request for more than are free
/// takes nothing (Redis holds exactly the grants that succeeded), and a waiting one gets all
/// of them at once.
async fn acquire_many_is_all_or_nothing(fx: Fixture) {
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let name = unique_key("sem-many");
    let (sa, sb) = (a.semaphore(&name, 5), b.semaphore(&name, 5));
    let three = sa.acquire_many(3).lease(LONG).await.unwrap();
    assert_eq!(three.count(), 3);
    assert_eq!(sb.available().await.unwrap(), 2);

    for wait in [Duration::ZERO, Duration::from_millis(200)] {
        let err = sb.acquire_many(3).wait(wait).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert_eq!(
            sb.available().await.unwrap(),
            2,
            "nothing taken (wait {wait:?})"
        );
        assert_eq!(
            grants_on_redis(&fx, &name).len(),
            1,
            "only the first grant on Redis: {:?}",
            grants_on_redis(&fx, &name)
        );
        assert_eq!(permits_on_redis(&fx, &name), 3);
    }

    let two = sb.acquire_many(2).try_once().await.unwrap();
    assert_eq!(two.count(), 2);
    assert_eq!(sa.available().await.unwrap(), 0);
    assert_eq!(permits_on_redis(&fx, &name), 5);
    let err = sa.acquire().try_once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");

    // a waiter for 4: one release of 3 is not enough to take anything, the next one is
    let waiter = {
        let sb = sb.clone();
        tokio::spawn(async move {
            sb.acquire_many(4)
                .lease(LONG)
                .wait(Duration::from_secs(10))
                .await
        })
    };
    eventually(
        "the waiter is registered",
        Duration::from_secs(5),
        || async {
            let n: i64 = redis::cmd("ZCARD")
                .arg(format!("{}:wq", sem_hash(&name)))
                .query(&mut fx.conn_for(&sem_hash(&name)))
                .unwrap();
            n == 1
        },
    )
    .await;
    three.release().await.unwrap();
    // the waiter may look, but it must not take 3 of the 4 it asked for
    for _ in 0..5 {
        assert_eq!(sa.available().await.unwrap(), 3);
        assert_eq!(permits_on_redis(&fx, &name), 2);
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(!waiter.is_finished());
    two.release().await.unwrap();
    let four = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter got its 4 permits once they were free")
        .unwrap()
        .unwrap();
    assert_eq!(four.count(), 4);
    assert_eq!(sa.available().await.unwrap(), 1);
    assert_eq!(grants_on_redis(&fx, &name).len(), 1, "one grant of 4");
    four.release().await.unwrap();
    assert_eq!(sa.available().await.unwrap(), 5);
    let all = sa.acquire_many(5).try_once().await.unwrap();
    assert_eq!(sb.available().await.unwrap(), 0);
    all.release().await.unwrap();
    assert!(!fx.exists(&sem_hash(&name)));
}

/// `available()` follows every grant, release and expiry, seen from any service; each grant
/// has a fencing token larger than the ones before.
async fn available_follows_grants_releases_and_expiry(fx: Fixture) {
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let name = unique_key("sem-avail");
    let (sa, sb) = (a.semaphore(&name, 4), b.semaphore(&name, 4));
    assert_eq!(sb.available().await.unwrap(), 4, "a semaphore never used");
    let mut fences = Vec::new();
    let mut held = Vec::new();
    for (i, n) in [1, 2, 1].into_iter().enumerate() {
        let sem = if i % 2 == 0 { &sa } else { &sb };
        let p = sem.acquire_many(n).lease(LONG).await.unwrap();
        fences.push(p.fence());
        held.push(p);
        let used: u32 = held.iter().map(|p| p.count()).sum();
        assert_eq!(sa.available().await.unwrap(), i64::from(4 - used));
        assert_eq!(sb.available().await.unwrap(), i64::from(4 - used));
    }
    assert_eq!(sa.available().await.unwrap(), 0);
    held.remove(1).release().await.unwrap();
    assert_eq!(sb.available().await.unwrap(), 2);
    // a short lease: the permit comes back when it runs out, without a release
    let short = sa
        .acquire()
        .lease(Duration::from_millis(300))
        .await
        .unwrap();
    fences.push(short.fence());
    assert_eq!(sb.available().await.unwrap(), 1);
    eventually(
        "the short lease ran out",
        Duration::from_secs(3),
        || async { sb.available().await.unwrap() == 2 },
    )
    .await;
    assert!(short.is_lost());
    assert_eq!(
        short.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    // two free: the expired grant does not count against a new one (with 2 still held)
    let again = sb
        .acquire_many(2)
        .wait(Duration::from_secs(2))
        .await
        .expect("the expired permit is free for a new grant");
    fences.push(again.fence());
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens increase: {fences:?}"
    );
    again.release().await.unwrap();
    for p in held {
        p.release().await.unwrap();
    }
    assert_eq!(sa.available().await.unwrap(), 4);
}

/// A permit without a lease outlives several watchdog timeouts while it is held, and is free
/// once released.
async fn a_watched_permit_is_renewed_while_held(fx: Fixture) {
    let watchdog = Duration::from_millis(300);
    let a = fx.service(watchdog).await;
    let b = fx.service(LONG).await;
    let name = unique_key("sem-watched");
    let permit = a.semaphore(&name, 2).acquire().await.unwrap();
    assert_eq!(permit.lease(), None);
    let sb = b.semaphore(&name, 2);
    let until = Instant::now() + watchdog * 5;
    while Instant::now() < until {
        assert_eq!(sb.available().await.unwrap(), 1, "still held");
        assert!(!permit.is_lost());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    permit.release().await.unwrap();
    assert_eq!(sb.available().await.unwrap(), 2);
}

/// A release wakes a waiter of another service: it gets the permit within a second, not when
/// the remaining lease (30 s) or its wait (10 s) runs out.
async fn a_release_wakes_a_waiter_of_another_service(fx: Fixture) {
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let name = unique_key("sem-wake");
    let held = a.semaphore(&name, 1).acquire().lease(LONG).await.unwrap();
    let channel = format!("{}:ch", sem_hash(&name));
    let sb = b.semaphore(&name, 1);
    let waiter = tokio::spawn(async move {
        sb.acquire()
            .wait(Duration::from_secs(10))
            .await
            .map(|p| (p, Instant::now()))
    });
    eventually(
        "the waiter subscribed to the wake-up channel",
        Duration::from_secs(5),
        || async { fx.subscribers(&channel) == 1 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await; // let it fall asleep
    let released = Instant::now();
    held.release().await.unwrap();
    let (permit, granted) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let after = granted - released;
    println!("woken {after:?} after the release");
    assert!(
        after < Duration::from_secs(1),
        "woken {after:?} after the release"
    );
    permit.release().await.unwrap();
}

topology_tests!(
    at_most_n_permits_are_held_at_once,
    acquire_many_is_all_or_nothing,
    available_follows_grants_releases_and_expiry,
    a_watched_permit_is_renewed_while_held,
    a_release_wakes_a_waiter_of_another_service,
);

// ---- single node ----

/// Counts of 0 permits, 0 asked for and more than there are are `InvalidArgument`, and nothing
/// reaches Redis.
#[tokio::test]
async fn invalid_counts_are_refused_and_write_nothing() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG).await;
    let name = unique_key("sem-invalid");
    // (the fence counter is shared by every lock of the slot: other tests may have made it)
    let keys = [sem_hash(&name), format!("{}:wq", sem_hash(&name))];
    let none = locks.semaphore(&name, 0);
    let three = locks.semaphore(&name, 3);
    let refused = [
        ("0 permits, acquire", none.acquire().try_once().await.err()),
        (
            "0 permits, acquire with a wait",
            none.acquire().wait(Duration::from_secs(1)).await.err(),
        ),
        ("0 of 0", none.acquire_many(0).await.err()),
        ("0 of 3", three.acquire_many(0).await.err()),
        (
            "0 of 3 with a lease",
            three.acquire_many(0).lease(LONG).try_once().await.err(),
        ),
        ("4 of 3", three.acquire_many(4).try_once().await.err()),
        (
            "4 of 3, waiting",
            three
                .acquire_many(4)
                .wait(Duration::from_secs(1))
                .await
                .err(),
        ),
        ("u32::MAX of 3", three.acquire_many(u32::MAX).await.err()),
        ("available() of 0 permits", none.available().await.err()),
    ];
    for (what, err) in refused {
        let err = err.unwrap_or_else(|| panic!("{what}: granted"));
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{what}: {err}");
        for key in &keys {
            assert!(!fx.exists(key), "{what} wrote {key}");
        }
    }
    // the same counts in range are fine
    let p = three.acquire_many(3).try_once().await.unwrap();
    assert_eq!(three.available().await.unwrap(), 0);
    p.release().await.unwrap();
}

/// The service of a test with a server of its own, reached through a fault proxy.
async fn behind_proxy(
    configure: impl FnOnce(LockConfig) -> LockConfig,
) -> (Fixture, Proxy, LockService) {
    let fx = Fixture::own(Spec::Single).await;
    let proxy = Proxy::start(Topology::addr_of(fx.topo().master_port())).await;
    let service = LockService::connect(configure(LockConfig::single(proxy.url())))
        .await
        .unwrap();
    (fx, proxy, service)
}

/// A waiter that waits for a release makes no calls while it waits: over 2 s of waiting the
/// server runs no script at all (it is woken by the release message, and it sleeps on the
/// holder's 30 s lease, not on a polling period), and taking the permit after the release
/// costs a few lock operations. (The waiting service's deregistration, which follows the grant
/// in the background, is not one of them: its first call on a fresh server also loads its
/// script, and counting it made the bound depend on when it ran.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_makes_no_calls_while_it_waits() {
    let fx = Fixture::own(Spec::Single).await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let name = unique_key("sem-quiet");
    let sa = a.semaphore(&name, 2);
    let first = sa.acquire().lease(LONG).await.unwrap();
    let second = sa.acquire().lease(LONG).await.unwrap();
    let sb = b.semaphore(&name, 2);
    let waiter = tokio::spawn(async move {
        sb.acquire()
            .lease(LONG)
            .wait(Duration::from_secs(20))
            .await
            .map(|p| (p, Instant::now()))
    });
    let channel = format!("{}:ch", sem_hash(&name));
    eventually(
        "the waiter subscribed to the wake-up channel",
        Duration::from_secs(5),
        || async { fx.subscribers(&channel) == 1 },
    )
    .await;
    let mut con = fx.redis();
    // its attempts around the subscription are over once the count stays put
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut before = script_calls(&mut con);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = script_calls(&mut con);
        if std::mem::replace(&mut before, now) == now {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never went quiet");
    }
    // the lock operations (acquires and releases) from here on
    let operations = common::Monitor::start(fx.topo().master_port(), |line: &str| {
        common::script_call(line) && (common::acquire_op(line) || common::release_op(line))
    })
    .await;
    // the window under test: the waiter waits 2 s for a release
    tokio::time::sleep(Duration::from_secs(2)).await;
    let while_waiting = script_calls(&mut con) - before;
    assert!(
        while_waiting == 0,
        "the waiter ran {while_waiting} scripts in 2 s of waiting: it polls"
    );
    assert!(!waiter.is_finished());
    let released = Instant::now();
    first.release().await.unwrap();
    let (permit, granted) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the release woke the waiter")
        .unwrap()
        .unwrap();
    operations.sync().await;
    let calls = operations.count();
    println!(
        "{while_waiting} scripts in 2 s of waiting; granted {:?} after the release, in {calls} \
         lock operations with the release",
        granted - released
    );
    assert!(granted - released < Duration::from_secs(1));
    assert!(
        calls <= 3,
        "{calls} lock operations for one release and the grant it woke: {:#?}",
        operations.lines()
    );
    permit.release().await.unwrap();
    second.release().await.unwrap();
}

/// A holder process crashes (SIGKILL) holding 2 of 3 permits with a 1.5 s lease, next to a
/// permit held for 30 s (so the semaphore's hash outlives the crashed grant): they stay held
/// until the lease runs out, then a waiter of another process gets them, woken by the lease
/// running out rather than by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permits_come_back_with_their_lease() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG).await;
    let name = unique_key("sem-crash");
    let lease = Duration::from_millis(1500);
    let sem = locks.semaphore(&name, 3);
    let long = sem.acquire().lease(LONG).await.unwrap();
    let mut worker = Worker::spawn(&[
        &fx.topo().url(),
        "permit",
        &name,
        "3",
        "2",
        &lease.as_millis().to_string(),
    ]);
    let line = worker.line(Duration::from_secs(30)).await;
    let held_at = Instant::now();
    assert!(line.starts_with("held "), "{line}");
    worker.kill().await;
    assert_eq!(
        sem.available().await.unwrap(),
        0,
        "the crashed holder's permits"
    );
    let err = sem.acquire().try_once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    let both = sem
        .acquire_many(2)
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    let after = held_at.elapsed();
    println!("the crashed holder's permits came back {after:?} after it printed its grant");
    assert!(
        after + Duration::from_millis(100) >= lease,
        "granted {after:?} after the crashed holder's grant, before its lease of {lease:?}"
    );
    assert!(
        after < lease + Duration::from_secs(1),
        "granted only {after:?} after a grant with a lease of {lease:?}"
    );
    both.release().await.unwrap();
    assert_eq!(sem.available().await.unwrap(), 2);
    long.release().await.unwrap();
}

/// SIGSTOPs a process until dropped (SIGCONT).
struct Paused(libc::pid_t);

impl Paused {
    fn pause(pid: u32) -> Paused {
        let pid = libc::pid_t::try_from(pid).unwrap();
        // SAFETY: signals a child process of this test by its pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: signals a child process of this test by its pid.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A holder process with a watched permit (watchdog 1 s) keeps it for several watchdog
/// timeouts while it runs; stopped (SIGSTOP), it keeps it only until the last renewal's lease
/// runs out; continued, its renewal does not bring the permit back. The other of the 2
/// permits is held for 30 s, so the semaphore's hash outlives the stopped holder's grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holders_watched_permit_comes_back_with_the_watchdog_lease() {
    let fx = Fixture::single().await;
    let locks = fx.service(LONG).await;
    let name = unique_key("sem-stopped");
    let watchdog = Duration::from_millis(1000);
    let sem = locks.semaphore(&name, 2);
    let long = sem.acquire().lease(LONG).await.unwrap();
    let mut worker = Worker::spawn(&[
        &fx.topo().url(),
        "permit",
        &name,
        "2",
        "1",
        "0",
        &watchdog.as_millis().to_string(),
    ]);
    let line = worker.line(Duration::from_secs(30)).await;
    assert!(line.starts_with("held "), "{line}");
    let until = Instant::now() + watchdog * 5 / 2;
    while Instant::now() < until {
        assert_eq!(sem.available().await.unwrap(), 0, "renewed while running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let paused = Paused::pause(worker.pid());
    let stopped = Instant::now();
    let permit = sem.acquire().wait(Duration::from_secs(10)).await.unwrap();
    let after = stopped.elapsed();
    println!("the stopped holder's permit came back {after:?} after SIGSTOP");
    assert!(
        after < watchdog + Duration::from_millis(500),
        "granted {after:?} after the holder stopped renewing (watchdog {watchdog:?})"
    );
    drop(paused);
    // the continued holder renews, finds its grant gone, and must not take the permit back
    let until = Instant::now() + watchdog;
    while Instant::now() < until {
        assert!(!permit.is_lost());
        assert_eq!(
            grants_on_redis(&fx, &name).len(),
            2,
            "the long one and the new one"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    permit.release().await.unwrap();
    let until = Instant::now() + watchdog;
    while Instant::now() < until {
        assert_eq!(sem.available().await.unwrap(), 1, "re-created by a renewal");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(worker.is_running());
    long.release().await.unwrap();
}

/// A watched permit is renewed (one renewal call naming it every third of the watchdog
/// timeout) while held; dropped, it is released and never renewed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_is_no_longer_renewed() {
    let fx = Fixture::single().await;
    let watchdog = Duration::from_millis(300);
    let a = fx.service(watchdog).await;
    let name = unique_key("sem-drop");
    let hash = sem_hash(&name);
    let renewals = common::Monitor::start(fx.node_for(&hash), {
        let quoted = format!("\"{hash}\"");
        // a renewal names the hash alone; acquires and releases name its fence counter too
        move |line: &str| script_call(line) && line.contains(&quoted) && !line.contains(":fence:{")
    })
    .await;
    let sem = a.semaphore(&name, 2);
    let permit = sem.acquire().await.unwrap();
    eventually("three renewals", Duration::from_secs(3), || async {
        renewals.count() >= 3
    })
    .await;
    assert_eq!(sem.available().await.unwrap(), 1);
    drop(permit);
    eventually(
        "the dropped permit is released",
        Duration::from_secs(2),
        || async { sem.available().await.unwrap() == 2 },
    )
    .await;
    renewals.sync().await;
    let seen = renewals.count();
    tokio::time::sleep(watchdog * 3).await;
    renewals.sync().await;
    assert_eq!(
        renewals.count(),
        seen,
        "renewed after it was dropped: {:#?}",
        renewals.lines()
    );
    assert!(!fx.exists(&hash));
}

/// Cancelled acquires give back what Redis granted them. The acquire's reply is delayed by the
/// proxy (200 ms) and the caller gives up while it is on its way: Redis made the grant (the
/// fence counter moved), and the permits are free again once the reply arrives, not after the
/// 30 s lease. A caller cancelled while it waits takes nothing either, even when a release
/// wakes it at that moment; each new waiter finds its service the only one registered as
/// waiting, also after the grant that the cancelled waiter of the round before got late made
/// the other service wait for the permits it gave back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_give_their_permits_back() {
    // named, so that the waiting set's members (`<instance name>~<id>`) tell who is who
    let (fx, proxy, a) = behind_proxy(|c| {
        c.with_response_timeout(Duration::from_secs(3))
            .with_instance_name("proxied")
    })
    .await;
    let direct = LockService::connect(fx.config(LONG).with_instance_name("direct"))
        .await
        .unwrap();
    let name = unique_key("sem-cancel");
    let fence_key = direct.fence_key(LockKind::Semaphore, &name).unwrap();
    let fence = || -> Option<u64> {
        redis::cmd("GET")
            .arg(&fence_key)
            .query(&mut fx.redis())
            .unwrap()
    };
    let (sa, sd) = (a.semaphore(&name, 2), direct.semaphore(&name, 2));
    // loads the script, so that the cancelled call is the acquire itself
    sa.acquire().await.unwrap().release().await.unwrap();

    proxy.set_latency(Duration::from_millis(200));
    for round in 0..3 {
        let before = fence();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(50),
            sa.acquire_many(2)
                .lease(LONG)
                .wait(Duration::from_secs(5))
                .into_future(),
        )
        .await;
        assert!(cancelled.is_err(), "round {round}: the reply came early");
        eventually(
            "Redis granted the cancelled acquire",
            Duration::from_secs(2),
            || async { fence() > before },
        )
        .await;
        let given_back = Instant::now();
        eventually(
            "the cancelled acquire's permits are given back",
            Duration::from_secs(3),
            || async { sd.available().await.unwrap() == 2 },
        )
        .await;
        println!(
            "round {round}: given back {:?} after Redis granted it",
            given_back.elapsed()
        );
    }
    proxy.heal();

    // cancelled while waiting, at points around a release that would wake it
    for round in 0..8u64 {
        let held = sd.acquire_many(2).lease(LONG).await.unwrap();
        let waiter = {
            let sa = sa.clone();
            tokio::spawn(
                async move { sa.acquire().lease(LONG).wait(Duration::from_secs(10)).await },
            )
        };
        // the proxied service alone: the direct one got its permits, it waits no more (even
        // when a late grant of the cancelled waiter of the round before made it wait)
        let registered = || {
            let set = waiting_set(&fx, &name);
            set.len() == 1 && set[0].0.starts_with("proxied~")
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !registered() {
            if Instant::now() >= deadline {
                let info = a.inspect_kind(LockKind::Semaphore, &name).await.unwrap();
                panic!(
                    "round {round}: the waiter's service is not the one service registered \
                     as waiting within 5 s: waiting set {:?} (member, registered until in \
                     server ms; server time {}), grants {:?}, waiters of the proxied service \
                     here: {}, waiter finished: {}",
                    waiting_set(&fx, &name),
                    server_ms(&fx),
                    grants_on_redis(&fx, &name),
                    info.local_waiters,
                    waiter.is_finished(),
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let release = held.release();
        let cancel = async {
            tokio::time::sleep(Duration::from_millis(round)).await;
            waiter.abort();
        };
        let (released, ()) = tokio::join!(release, cancel);
        released.unwrap();
        let outcome = waiter.await;
        if let Ok(Ok(permit)) = outcome {
            // granted before the abort reached it: it holds, and gives back on release
            permit.release().await.unwrap();
        }
        eventually(
            "nothing is held once the waiter was cancelled",
            Duration::from_secs(3),
            || async { sd.available().await.unwrap() == 2 },
        )
        .await;
    }
}

// ---- under faults ----

/// A semaphore of 2 permits, three services (two through a fault proxy, one direct) x four
/// tasks, while the proxy delays replies and requests by varying amounts, drops replies
/// (resetting the connection: Redis ran the call, the caller never hears of it) and resets
/// connections: never more than 2 permits held, every error a `Backend` error or a `Timeout`,
/// and nothing stranded afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_permits_while_a_proxy_drops_and_delays_replies() {
    let configure = |c: LockConfig| {
        c.with_response_timeout(Duration::from_secs(1))
            .with_watchdog_timeout(LONG)
    };
    let (fx, proxy, first) = behind_proxy(configure).await;
    let second = LockService::connect(configure(LockConfig::single(proxy.url())))
        .await
        .unwrap();
    let direct = fx.service(LONG).await;
    let services = vec![first, second, direct.clone()];
    let name = unique_key("sem-faults");
    let load = Load {
        permits: 2,
        tasks: 4,
        rounds: 8,
        lease: LONG,
        wait: Duration::from_secs(5),
        work: Duration::from_millis(5),
    };
    let faults = async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut armed = 0;
        for i in 0u64.. {
            tick.tick().await;
            match i % 10 {
                0 => proxy.set_latency(Duration::from_millis(rand::rng().random_range(0..150))),
                3 => proxy
                    .set_request_latency(Duration::from_millis(rand::rng().random_range(0..80))),
                7 => {
                    proxy.set_latency(Duration::ZERO);
                    proxy.set_request_latency(Duration::ZERO);
                }
                9 if i % 40 == 9 => {
                    proxy.reset_all().await;
                }
                _ => {}
            }
            // a drop every other tick: the calls between the drops get through
            if i % 2 == 0 && proxy.replies_dropped() >= armed {
                proxy.drop_next_reply();
                armed += 1;
            }
        }
    };
    let tally = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::select! {
            tally = contend(&services, &direct, &name, load) => tally,
            () = faults => unreachable!(),
        }
    })
    .await
    .expect("the contending tasks did not finish within 120 s");
    proxy.heal();
    println!("{} replies dropped", proxy.replies_dropped());
    assert!(proxy.replies_dropped() > 0, "no reply was dropped");
    let unexpected: Vec<_> = tally
        .errors
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, kind, _)| !matches!(kind, ErrorKind::Backend | ErrorKind::Timeout))
        .cloned()
        .collect();
    assert!(
        unexpected.is_empty(),
        "errors other than Backend / Timeout: {unexpected:?}"
    );
    assert_at_most_n(Some(&fx), &direct, &name, load, &tally).await;
}

/// The same on a Redis Cluster whose nodes sit behind proxies: the proxy of the master serving
/// the semaphore drops a reply every ~50 ms and delays the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_permits_in_a_cluster_while_replies_are_lost() {
    let topo = Topology::start(Spec::proxied_cluster()).await;
    let connect = |nodes: Vec<String>| async move {
        let config = LockConfig::new(LockTopology::Cluster { nodes })
            .with_response_timeout(Duration::from_secs(1))
            .with_watchdog_timeout(LONG);
        LockService::connect(config).await.expect("connect")
    };
    let services = vec![
        connect(topo.proxied_node_urls()).await,
        connect(topo.proxied_node_urls()).await,
        connect(topo.node_urls()).await,
    ];
    let name = unique_key("sem-cluster-faults");
    let master = topo.master_for_slot(topo.key_slot(&sem_hash(&name)));
    let proxy = topo.proxy_for(master);
    let load = Load {
        permits: 2,
        tasks: 4,
        rounds: 8,
        lease: LONG,
        wait: Duration::from_secs(5),
        work: Duration::from_millis(5),
    };
    let faults = async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut armed = 0;
        for i in 0u64.. {
            tick.tick().await;
            if i % 10 == 0 {
                proxy.set_latency(Duration::from_millis(rand::rng().random_range(0..100)));
            }
            if proxy.replies_dropped() >= armed {
                proxy.drop_next_reply();
                armed += 1;
            }
        }
    };
    let sampler = services[2].clone();
    let tally = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::select! {
            tally = contend(&services, &sampler, &name, load) => tally,
            () = faults => unreachable!(),
        }
    })
    .await
    .expect("the contending tasks did not finish within 120 s");
    proxy.heal();
    println!("{} replies dropped", proxy.replies_dropped());
    assert!(proxy.replies_dropped() > 0, "no reply was dropped");
    let unexpected: Vec<_> = tally
        .errors
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, kind, _)| !matches!(kind, ErrorKind::Backend | ErrorKind::Timeout))
        .cloned()
        .collect();
    assert!(
        unexpected.is_empty(),
        "errors other than Backend / Timeout: {unexpected:?}"
    );
    assert_at_most_n(None, &sampler, &name, load, &tally).await;
    let mut con = topo.conn(master);
    let exists: bool = redis::cmd("EXISTS")
        .arg(sem_hash(&name))
        .query(&mut con)
        .unwrap();
    assert!(!exists, "the semaphore's hash is gone with its last grant");
}

/// A release that frees fewer permits than the head of a service's line asks for still wakes
/// the requests behind it that fit: W1 waits for 2 permits, W2 (after it, same service) for 1;
/// one permit is released; W2 gets it within a second, while W1 goes on waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_smaller_request_behind_a_larger_one() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let name = unique_key("sem-behind");
    let attempts = common::Monitor::start(
        fx.node_for(&sem_hash(&name)),
        common::acquires_naming(&sem_hash(&name)),
    )
    .await;
    let sa = a.semaphore(&name, 2);
    let first = sa.acquire().lease(LONG).await.unwrap();
    let second = sa.acquire().lease(LONG).await.unwrap();
    attempts.sync().await;
    let before = attempts.count();
    let sb = b.semaphore(&name, 2);
    let w1 = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.acquire_many(2).wait(Duration::from_secs(10)).await })
    };
    // W1 is in line (its attempts before and after subscribing are made) before W2 comes
    eventually("W1 tried twice", Duration::from_secs(5), || async {
        attempts.sync().await;
        attempts.count() >= before + 2
    })
    .await;
    let w2 = {
        let sb = sb.clone();
        tokio::spawn(async move {
            sb.acquire()
                .wait(Duration::from_secs(5))
                .await
                .map(|p| (p, Instant::now()))
        })
    };
    // W2 waits in line behind W1 without asking Redis (only the head does)
    eventually("both went quiet", Duration::from_secs(5), || async {
        attempts.sync().await;
        let n = attempts.count();
        tokio::time::sleep(Duration::from_millis(200)).await;
        attempts.sync().await;
        n >= before + 2 && attempts.count() == n
    })
    .await;
    let released = Instant::now();
    first.release().await.unwrap();
    let (p, granted) = tokio::time::timeout(Duration::from_secs(10), w2)
        .await
        .unwrap()
        .unwrap()
        .unwrap_or_else(|e| panic!("W2 never got the free permit: {e}"));
    println!(
        "W2 got the free permit {:?} after the release",
        granted - released
    );
    assert!(
        granted - released < Duration::from_secs(1),
        "W2 got the free permit only {:?} after the release",
        granted - released
    );
    assert!(!w1.is_finished(), "W1 cannot have 2 permits");
    p.release().await.unwrap();
    second.release().await.unwrap();
    let both = tokio::time::timeout(Duration::from_secs(2), w1)
        .await
        .expect("W1 got both permits once they were free")
        .unwrap()
        .unwrap();
    assert_eq!(both.count(), 2);
    both.release().await.unwrap();
}

/// A service counts as waiting for a semaphore (it is a member of `<sem>:wq`, which makes every
/// release publish a wake-up and which `inspect` reports as `waiting_services`) while a caller
/// of it waits, not after its last waiter got its permits: W1 (2 permits) and W2 (1 permit,
/// behind W1) of one service wait while another holds both permits; one is released and W2
/// gets it while W1 waits on (the service stays registered, so the next release wakes W1);
/// the other is released, W1 gets both, and the service leaves the waiting set at once,
/// not when its registration runs out 11 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_last_waiter_got_its_permits_no_longer_counts_as_waiting() {
    let fx = Fixture::single().await;
    let holder = LockService::connect(fx.config(LONG).with_instance_name("holder"))
        .await
        .unwrap();
    let waiting = LockService::connect(fx.config(LONG).with_instance_name("waiting"))
        .await
        .unwrap();
    let name = unique_key("sem-granted-leaves");
    let sh = holder.semaphore(&name, 2);
    let first = sh.acquire().lease(LONG).await.unwrap();
    let second = sh.acquire().lease(LONG).await.unwrap();
    let sw = waiting.semaphore(&name, 2);
    let w1 = {
        let sw = sw.clone();
        tokio::spawn(async move {
            sw.acquire_many(2)
                .lease(LONG)
                .wait(Duration::from_secs(10))
                .await
        })
    };
    let members = || -> Vec<String> {
        waiting_set(&fx, &name)
            .into_iter()
            .map(|(member, _)| member)
            .collect()
    };
    let registered = |set: &[String]| set.len() == 1 && set[0].starts_with("waiting~");
    eventually("W1 is registered", Duration::from_secs(5), || async {
        registered(&members())
    })
    .await;
    let w2 = {
        let sw = sw.clone();
        tokio::spawn(async move { sw.acquire().lease(LONG).wait(Duration::from_secs(10)).await })
    };
    common::waiters_in_line_of(&waiting, LockKind::Semaphore, &name, 2).await;
    first.release().await.unwrap();
    let one = tokio::time::timeout(Duration::from_secs(5), w2)
        .await
        .expect("W2 got the free permit")
        .unwrap()
        .unwrap();
    assert!(!w1.is_finished(), "W1 cannot have 2 permits");
    assert!(
        registered(&members()),
        "W1 still waits, so its service must stay registered: waiting set {:?}",
        waiting_set(&fx, &name)
    );
    one.release().await.unwrap();
    second.release().await.unwrap();
    let both = tokio::time::timeout(Duration::from_secs(5), w1)
        .await
        .expect("W1 was woken by the release and got both permits")
        .unwrap()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !members().is_empty() {
        assert!(
            Instant::now() < deadline,
            "nobody waits, yet the waiting set still holds {:?} (member, registered until in \
             server ms; server time {})",
            waiting_set(&fx, &name),
            server_ms(&fx),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let info = holder
        .inspect_kind(LockKind::Semaphore, &name)
        .await
        .unwrap();
    assert_eq!(info.waiting_services, 0, "{info:?}");
    both.release().await.unwrap();
}

/// A waiter whose service has a short watchdog timeout (its registration as a waiting service
/// lasts that long plus a second after each attempt) still hears of a release that comes long
/// after that, while the holder's lease (30 s) has far to go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_that_waits_longer_than_its_watchdog_timeout() {
    let fx = Fixture::single().await;
    let holder = fx.service(LONG).await;
    let watchdog = Duration::from_millis(300);
    let waiter_service = fx.service(watchdog).await;
    let name = unique_key("sem-long-wait");
    let held = holder
        .semaphore(&name, 1)
        .acquire()
        .lease(LONG)
        .await
        .unwrap();
    let sem = waiter_service.semaphore(&name, 1);
    let waiter = tokio::spawn(async move {
        sem.acquire()
            .wait(Duration::from_secs(10))
            .await
            .map(|p| (p, Instant::now()))
    });
    let queue = format!("{}:wq", sem_hash(&name));
    eventually("the waiter registered", Duration::from_secs(5), || async {
        fx.exists(&queue)
    })
    .await;
    // well past the waiter's first registration (watchdog + 1 s)
    tokio::time::sleep(watchdog + Duration::from_secs(2)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (permit, granted) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let after = granted - released;
    println!("granted {after:?} after the release");
    assert!(
        after < Duration::from_secs(1),
        "the waiter got the permit only {after:?} after the release"
    );
    permit.release().await.unwrap();
}

/// A release hands its permit to the next waiter of its own service in the same call: with 4
/// permits held and 8 waiters in line in that service, the 4 releases get 4 of the waiters
/// holding at once within a second, without a single acquire call (a release that freed the
/// permit would need the waiter's attempt to take it, and only the head of the line asks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_hand_permits_to_the_waiters_of_their_service() {
    let fx = Fixture::single().await;
    let service = fx.service(LONG).await;
    let name = unique_key("sem-hand-off");
    let attempts = common::Monitor::start(
        fx.node_for(&sem_hash(&name)),
        common::acquires_naming(&sem_hash(&name)),
    )
    .await;
    let sem = service.semaphore(&name, 4);
    let mut holders = Vec::new();
    for _ in 0..4 {
        holders.push(sem.acquire().lease(LONG).await.unwrap());
    }
    let inside = Arc::new(AtomicI64::new(0));
    let (done, finished) = tokio::sync::watch::channel(false);
    let mut waiters = Vec::new();
    for _ in 0..8 {
        let (sem, inside, mut finished) = (sem.clone(), inside.clone(), finished.clone());
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire().lease(LONG).wait(LONG).await?;
            inside.fetch_add(1, Ordering::SeqCst);
            let _ = finished.wait_for(|done| *done).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            Ok::<_, LockError>(())
        }));
    }
    drop(finished);
    eventually("8 waiters in line", Duration::from_secs(5), || async {
        let info = service
            .inspect_kind(LockKind::Semaphore, &name)
            .await
            .unwrap();
        info.local_waiters == 8
    })
    .await;
    // the head asked Redis (before and after subscribing), then the line went quiet
    eventually("the line went quiet", Duration::from_secs(5), || async {
        attempts.sync().await;
        let n = attempts.count();
        tokio::time::sleep(Duration::from_millis(200)).await;
        attempts.sync().await;
        n > 0 && attempts.count() == n
    })
    .await;
    let before = attempts.count();
    let released = Instant::now();
    let releases: Vec<_> = holders
        .into_iter()
        .map(|p| tokio::spawn(async move { p.release().await }))
        .collect();
    for release in releases {
        release.await.unwrap().unwrap();
    }
    eventually(
        "4 waiters hold a permit at once",
        Duration::from_secs(1),
        || async { inside.load(Ordering::SeqCst) == 4 },
    )
    .await;
    println!(
        "4 waiters held a permit {:?} after the releases",
        released.elapsed()
    );
    attempts.sync().await;
    assert_eq!(
        attempts.count(),
        before,
        "the permits were handed over by the releases, without acquire calls"
    );
    assert_eq!(permits_on_redis(&fx, &name), 4);
    // the other 4 get theirs as the first 4 release
    done.send_replace(true);
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter got a permit and released it")
            .unwrap()
            .unwrap();
    }
    assert_eq!(sem.available().await.unwrap(), 4);
}

/// A service whose waiters keep taking the permits its releases hand over does not keep them
/// from another service: four tasks of A take turns on 2 permits without a pause, while a
/// waiter of B gets one within a second (A keeps no more than its share while B waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_offs_leave_other_services_their_share() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let name = unique_key("sem-share");
    let stop = Arc::new(AtomicU64::new(0));
    let mut busy = Vec::new();
    for _ in 0..4 {
        let (sem, stop) = (a.semaphore(&name, 2), stop.clone());
        busy.push(tokio::spawn(async move {
            while stop.load(Ordering::SeqCst) == 0 {
                let permit = sem.acquire().lease(LONG).wait(LONG).await?;
                tokio::task::yield_now().await;
                permit.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    eventually("A holds both permits", Duration::from_secs(5), || async {
        a.semaphore(&name, 2).available().await.unwrap() <= 0
    })
    .await;
    let asked = Instant::now();
    let permit = b
        .semaphore(&name, 2)
        .acquire()
        .lease(LONG)
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    let waited = asked.elapsed();
    println!("B got a permit after {waited:?}");
    assert!(
        waited < Duration::from_secs(1),
        "B waited {waited:?} while A handed its permits over"
    );
    stop.store(1, Ordering::SeqCst);
    permit.release().await.unwrap();
    for task in busy {
        task.await.unwrap().unwrap();
    }
}
