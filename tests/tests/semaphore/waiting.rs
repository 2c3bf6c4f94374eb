//! Waiters woken by releases, without polling: a release wakes a waiter of another service
//! within a second (on every topology, see `topology_tests!`), also one that waits longer than
//! its watchdog timeout, and a smaller request behind a larger one; a waiter makes no calls
//! while it waits; a service counts as waiting only while a caller of it waits.

use std::time::{Duration, Instant};

use crate::common::{self, Fixture, eventually, script_calls};
use crate::support::{LONG, sem_hash, server_ms, waiting_set};
use lock_runtime::{LockKind, LockService};
use lock_tests::harness::{Spec, unique_key};

// ---- on every topology ----

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

topology_tests!(a_release_wakes_a_waiter_of_another_service);

// ---- single node ----

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
