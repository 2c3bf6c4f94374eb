//! At most N permits held at once across services, `acquire_many` all or nothing (a request
//! for more than are free takes nothing, a waiting one gets all of them at once), `available()`
//! following every grant, release and expiry, and invalid counts refused before anything is
//! written. The first three bodies run on every topology (see `topology_tests!` after them).

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{Fixture, eventually};
use crate::contention::{Load, assert_at_most_n, contend};
use crate::support::{LONG, grants_on_redis, permits_on_redis, sem_hash};
use lock_runtime::ErrorKind;
use lock_tests::harness::unique_key;

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

topology_tests!(
    at_most_n_permits_are_held_at_once,
    acquire_many_is_all_or_nothing,
    available_follows_grants_releases_and_expiry,
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
