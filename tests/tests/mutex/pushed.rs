//! Grants pushed across services: a release that finds another service waiting grants the
//! lock to that service's noted head waiter (`<lock>:wh`). A grant nobody claims runs out after
//! its claim window, one to a waiter that left is given back at once, and a registration that
//! ran out gets none. (The waiter's side - no attempt after the release, the claim past the
//! window - is in `waiting.rs`, `a_release_wakes_a_waiter_of_another_service`.) Every body
//! runs on every topology.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockGuard, LockService};
use tokio::task::JoinHandle;

use crate::common::{Fixture, eventually, lock_key, waiters_in_line};
use lock_tests::harness::unique_key;

const LONG_WATCHDOG: Duration = Duration::from_secs(30);

/// A holds a lock that B's waiter waits for (20 s at most): A, the user key, the lock's waiting
/// set and heads, A's guard and B's waiting task.
struct Scene {
    a: LockService,
    key: String,
    queue: String,
    heads: String,
    held: LockGuard,
    waiting: JoinHandle<Result<LockGuard, LockError>>,
}

async fn b_waits_behind_a(fx: &Fixture, name: &str) -> Scene {
    let a = fx.service(LONG_WATCHDOG).await;
    let b = fx.service(LONG_WATCHDOG).await;
    let key = unique_key(name);
    let queue = format!("{}:wq", lock_key(&key));
    let heads = format!("{}:wh", lock_key(&key));
    let held = a.lock(&key).await.unwrap();
    let (s, k) = (b.clone(), key.clone());
    let waiting = tokio::spawn(async move { s.lock(&k).wait(Duration::from_secs(20)).await });
    waiters_in_line(&b, &key, 1).await;
    Scene {
        a,
        key,
        queue,
        heads,
        held,
        waiting,
    }
}

/// [`b_waits_behind_a`], once B is registered as waiting.
async fn b_registered_behind_a(fx: &Fixture, name: &str) -> Scene {
    let scene = b_waits_behind_a(fx, name).await;
    eventually(
        "B registered as waiting",
        Duration::from_secs(5),
        || async { scene.a.inspect(&scene.key).await.unwrap().waiting_services == 1 },
    )
    .await;
    scene
}

/// A grant pushed to a service that went away runs out like a turn: a service registered as
/// waiting ahead of B, with a head waiter noted, went away; the release grants the lock to that
/// head, which never claims it, and B gets the lock once the grant's claim window (250 ms) ran
/// out, long before the lease the head asked for (30 s) or B's own wait (20 s).
async fn an_unclaimed_pushed_grant_runs_out(fx: Fixture) {
    let Scene {
        key,
        queue,
        heads,
        held,
        waiting,
        ..
    } = b_registered_behind_a(&fx, "push-expiry").await;
    let mut con = fx.conn_for(&queue);
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(&queue)
        .arg(secs * 1000 + micros / 1000 + 5_000)
        .arg("a-service-that-went-away")
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("HSET")
        .arg(&heads)
        .arg("a-service-that-went-away")
        .arg(format!(
            "00000000000000aa 30000 0 {secs}{micros:06} gone~1:owner"
        ))
        .query(&mut con)
        .unwrap();
    let released = Instant::now();
    held.release().await.unwrap();
    let value: String = redis::cmd("GET")
        .arg(lock_key(&key))
        .query(&mut con)
        .unwrap();
    assert!(
        value.contains("00000000000000aa|gone~1:owner"),
        "the release granted the lock to the noted head: {value}"
    );
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("B still waits 10 s after the release: the unclaimed grant kept the lock")
        .unwrap()
        .unwrap();
    let after = released.elapsed();
    assert!(
        after >= Duration::from_millis(250),
        "B took the lock {after:?} after the release, inside the pushed grant's claim window"
    );
    guard.release().await.unwrap();
}

/// A grant pushed to a waiter that is no longer there is given back at once: B's noted head is
/// replaced by a grant id no waiter of B has (as after a waiter left while another of B still
/// waits); the release grants the lock to it, B finds no such waiter and gives the grant back,
/// which hands the lock to B's waiter - well inside the grant's claim window (250 ms).
async fn a_grant_pushed_to_a_waiter_that_left_is_given_back(fx: Fixture) {
    let Scene {
        queue,
        heads,
        held,
        waiting,
        ..
    } = b_waits_behind_a(&fx, "push-gone").await;
    let service = std::sync::Mutex::new(None::<String>);
    eventually(
        "B noted its head waiter",
        Duration::from_secs(5),
        || async {
            let mut con = fx.conn_for(&queue);
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&queue)
                .arg(0)
                .arg(-1)
                .query(&mut con)
                .unwrap();
            let Some(member) = members.first() else {
                return false;
            };
            let noted: Option<String> = redis::cmd("HGET")
                .arg(&heads)
                .arg(member)
                .query(&mut con)
                .unwrap();
            *service.lock().unwrap() = Some(member.clone());
            noted.is_some()
        },
    )
    .await;
    let service = service.into_inner().unwrap().unwrap();
    // B's waiter tries once more after subscribing, which notes it again: replace the note
    // until it stays replaced
    eventually(
        "the head note stays replaced",
        Duration::from_secs(5),
        || async {
            let mut con = fx.conn_for(&queue);
            let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
            let fake = format!("00000000000000bb 30000 0 {secs}{micros:06} gone~1:owner");
            let _: i64 = redis::cmd("HSET")
                .arg(&heads)
                .arg(&service)
                .arg(&fake)
                .query(&mut con)
                .unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now: String = redis::cmd("HGET")
                .arg(&heads)
                .arg(&service)
                .query(&mut con)
                .unwrap();
            now == fake
        },
    )
    .await;
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("B still waits 10 s after the release")
        .unwrap()
        .unwrap();
    let after = released.elapsed();
    assert!(
        after < Duration::from_millis(200),
        "B's waiter took the lock {after:?} after the release: the grant to a waiter that left \
         was not given back"
    );
    guard.release().await.unwrap();
}

/// A registration that ran out (its service went away without leaving) gets nothing: three such
/// registrations ahead of B, with their heads noted; the release removes them and grants the
/// lock to B's waiter at once, inside the 250 ms a turn or a pushed grant to them would take.
async fn registrations_that_ran_out_get_no_grant(fx: Fixture) {
    let Scene {
        queue,
        heads,
        held,
        waiting,
        ..
    } = b_registered_behind_a(&fx, "ran-out").await;
    let mut con = fx.conn_for(&queue);
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    for (i, gone) in ["gone-1", "gone-2", "gone-3"].iter().enumerate() {
        let _: i64 = redis::cmd("ZADD")
            .arg(&queue)
            .arg(secs * 1000 + micros / 1000 - 1_000 + i as u64)
            .arg(gone)
            .query(&mut con)
            .unwrap();
        let _: i64 = redis::cmd("HSET")
            .arg(&heads)
            .arg(gone)
            .arg(format!(
                "00000000000000c{i} 30000 0 {secs}{micros:06} {gone}~1:owner"
            ))
            .query(&mut con)
            .unwrap();
    }
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("B still waits 10 s after the release")
        .unwrap()
        .unwrap();
    let after = released.elapsed();
    assert!(
        after < Duration::from_millis(200),
        "B took the lock {after:?} after the release: a registration that ran out got it first"
    );
    let left: Vec<String> = redis::cmd("ZRANGE")
        .arg(&queue)
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    assert!(
        left.iter().all(|m| !m.starts_with("gone-")),
        "the registrations that ran out were removed: {left:?}"
    );
    guard.release().await.unwrap();
}

topology_tests!(
    an_unclaimed_pushed_grant_runs_out,
    a_grant_pushed_to_a_waiter_that_left_is_given_back,
    registrations_that_ran_out_get_no_grant,
);
