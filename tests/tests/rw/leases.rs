//! Every hold has a lease of its own, on a single node: each reader's share runs out with its
//! own lease (also a crashed reader's, while the others keep theirs), and the last live share
//! that leaves frees the lock; `extend` and `release` on a hold that is lost are `NotHeld` and
//! change nothing, `extend` on a hold in force keeps it past its first lease.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::{Fixture, Worker, eventually};
use crate::support::{LONG, ends_up_free, granted, rw_key, spawn_write, writers_key, zcard};
use lock_runtime::{ErrorKind, ReadGuard, WriteGuard};
use lock_tests::harness::unique_key;

/// The read shares of `key` that are in force by the server's clock (expired ones stay in the
/// hash until the next script call on the lock drops them).
fn live_shares(fx: &Fixture, key: &str) -> usize {
    let lock = rw_key(key);
    let mut con = fx.conn_for(&lock);
    let fields: HashMap<String, String> = redis::cmd("HGETALL").arg(&lock).query(&mut con).unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let now = secs * 1000 + micros / 1000;
    fields
        .iter()
        .filter(|(f, v)| {
            f.starts_with("r:")
                && v.split(' ')
                    .next()
                    .and_then(|exp| exp.parse::<u64>().ok())
                    .is_some_and(|exp| exp > now)
        })
        .count()
}

/// Each reader's hold has its own lease: a short-leased share runs out (lost, then `extend`
/// and `release` say `NotHeld`) while a watched share and a long-leased one stay; the watched
/// one is renewed past many watchdog periods without keeping the expired one alive; a new
/// lease for one share moves only that share's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reader_has_its_own_lease() {
    let fx = Fixture::single().await;
    let watchdog = Duration::from_millis(300);
    let a = fx.service(watchdog).await;
    let b = fx.service(LONG).await;
    let key = unique_key("leases");
    let short = b
        .read(&key)
        .lease(Duration::from_millis(300))
        .await
        .unwrap();
    let watched = a.read(&key).await.unwrap();
    let long = b.read(&key).lease(LONG).await.unwrap();
    let why = tokio::time::timeout(Duration::from_secs(3), short.lost())
        .await
        .expect("the short share runs out");
    assert_eq!(why.kind(), ErrorKind::Lost);
    eventually(
        "Redis dropped the short share only",
        Duration::from_secs(3),
        || async { live_shares(&fx, &key) == 2 },
    )
    .await;
    let e = short.extend(LONG).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    // the watched share lives on through renewals (four watchdog periods)
    assert!(
        tokio::time::timeout(watchdog * 4, watched.lost())
            .await
            .is_err(),
        "the watched share was lost"
    );
    assert!(!long.is_lost());
    assert_eq!(live_shares(&fx, &key), 2);
    let e = short.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");

    // a new, shorter lease for one share: only its deadline moves
    let before = (long.valid_until(), watched.valid_until());
    long.extend(Duration::from_millis(200)).await.unwrap();
    assert!(long.valid_until() < before.0);
    assert!(watched.valid_until() >= before.1);
    tokio::time::timeout(Duration::from_secs(3), long.lost())
        .await
        .expect("the re-leased share runs out");
    // Redis drops it a few ms later: the client counts a lease from when it sent the call,
    // less a margin for clock drift
    eventually(
        "Redis dropped the re-leased share",
        Duration::from_secs(3),
        || async { live_shares(&fx, &key) == 1 },
    )
    .await;
    assert!(!watched.is_lost());
    let busy = b.write(&key).try_once().await.unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Timeout, "the watched share holds");
    // releasing the last live share frees the lock at once: the expired shares count for
    // nothing
    watched.release().await.unwrap();
    b.write(&key)
        .try_once()
        .await
        .expect("free once the last live reader left")
        .release()
        .await
        .unwrap();
    ends_up_free(&fx, &b, &key, Duration::from_secs(5)).await;
}

/// A reader in another process is SIGKILLed while it holds a share (watchdog 500 ms): its
/// share runs out with its lease while a live reader here keeps its own, and when the live
/// reader leaves, the waiting writer gets the lock at once (not at the end of anyone's lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_readers_share_runs_out() {
    let fx = Fixture::single().await;
    let (b, c) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("crash");
    let live = b.read(&key).await.unwrap();
    let url = fx.topo().url();
    let mut worker = Worker::spawn(&[url.as_str(), "hold-read", key.as_str(), "0", "500"]);
    let line = worker.line(Duration::from_secs(30)).await;
    assert!(line.starts_with("held "), "{line}");
    let writer = spawn_write(&c, &key);
    eventually("the writer waits", Duration::from_secs(5), || async {
        zcard(&fx, &writers_key(&key)) == 1
    })
    .await;
    // the worker renews its share: it outlives three of its watchdog periods
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(live_shares(&fx, &key), 2, "the live worker's share ran out");
    assert!(!writer.is_finished());

    let killed = Instant::now();
    worker.kill().await;
    eventually(
        "the crashed reader's share runs out",
        Duration::from_secs(5),
        || async { live_shares(&fx, &key) == 1 },
    )
    .await;
    println!(
        "the crashed share ran out {:?} after SIGKILL",
        killed.elapsed()
    );
    assert!(!writer.is_finished(), "the live reader still holds");
    assert!(!live.is_lost());
    live.release().await.unwrap();
    let w = granted(
        "the writer, once the live reader left",
        writer,
        Duration::from_secs(2),
    )
    .await;
    let fence: u64 = line["held ".len()..].parse().unwrap();
    assert!(w.fence() > fence);
    w.release().await.unwrap();
    ends_up_free(&fx, &b, &key, Duration::from_secs(5)).await;
}

/// `extend` on a hold that is lost is `NotHeld`, and changes nothing: whether the hold's lease
/// ran out (known here) or the hold vanished on Redis (found out by the call); the same for
/// `release`. On a hold that is in force, `extend` works and the hold outlives its first lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_on_a_lost_hold_is_not_held() {
    let fx = Fixture::single().await;
    let a = fx.service(LONG).await;
    for write in [false, true] {
        // the lease ran out
        let key = unique_key("extend-expired");
        let (mut r, mut w) = (None, None);
        if write {
            w = Some(
                a.write(&key)
                    .lease(Duration::from_millis(200))
                    .await
                    .unwrap(),
            );
        } else {
            r = Some(
                a.read(&key)
                    .lease(Duration::from_millis(200))
                    .await
                    .unwrap(),
            );
        }
        eventually("the lease ran out", Duration::from_secs(3), || async {
            r.as_ref().is_none_or(ReadGuard::is_lost) && w.as_ref().is_none_or(WriteGuard::is_lost)
        })
        .await;
        let e = match (&mut r, &mut w) {
            (Some(r), _) => r.extend(LONG).await.unwrap_err(),
            (_, Some(w)) => w.extend(LONG).await.unwrap_err(),
            _ => unreachable!(),
        };
        assert_eq!(e.kind(), ErrorKind::NotHeld, "write {write}: {e}");
        eventually(
            "the expired hold is gone on Redis: nothing was extended",
            Duration::from_secs(1),
            || async { !fx.exists(&rw_key(&key)) },
        )
        .await;

        // the hold vanished on Redis
        let key = unique_key("extend-gone");
        let (mut r, mut w) = (None, None);
        if write {
            w = Some(a.write(&key).await.unwrap());
        } else {
            r = Some(a.read(&key).await.unwrap());
        }
        let _: i64 = redis::cmd("DEL")
            .arg(rw_key(&key))
            .query(&mut fx.redis())
            .unwrap();
        let e = match (&mut r, &mut w) {
            (Some(r), _) => r.extend(LONG).await.unwrap_err(),
            (_, Some(w)) => w.extend(LONG).await.unwrap_err(),
            _ => unreachable!(),
        };
        assert_eq!(e.kind(), ErrorKind::NotHeld, "write {write}: {e}");
        assert!(!fx.exists(&rw_key(&key)), "extend re-created nothing");
        let lost = match (r, w) {
            (Some(r), _) => {
                assert!(r.is_lost());
                r.release().await.unwrap_err()
            }
            (_, Some(w)) => {
                assert!(w.is_lost());
                w.release().await.unwrap_err()
            }
            _ => unreachable!(),
        };
        assert_eq!(lost.kind(), ErrorKind::NotHeld, "{lost}");

        // in force: extended past its first lease
        let key = unique_key("extend-live");
        let first = Duration::from_millis(300);
        let valid = if write {
            let w = a.write(&key).lease(first).await.unwrap();
            w.extend(Duration::from_secs(5)).await.unwrap();
            assert!(tokio::time::timeout(first * 2, w.lost()).await.is_err());
            w.release().await.map(|()| !fx.exists(&rw_key(&key)))
        } else {
            let r = a.read(&key).lease(first).await.unwrap();
            r.extend(Duration::from_secs(5)).await.unwrap();
            assert!(tokio::time::timeout(first * 2, r.lost()).await.is_err());
            r.release().await.map(|()| !fx.exists(&rw_key(&key)))
        };
        assert!(valid.unwrap(), "released after the extension");
    }
}
