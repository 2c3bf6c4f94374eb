//! Locks across OS processes, leases surviving a killed holder, and bad input.

use std::time::{Duration, Instant};

use crate::common::{Fixture, Worker};
use lock_runtime::{ErrorKind, LockConfig, LockService, OwnerId};
use lock_tests::harness::unique_key;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_exclude_each_other_on_a_shared_counter() {
    let fx = Fixture::single().await;
    let (key, counter) = (unique_key("proc-excl"), unique_key("proc-counter"));
    let url = fx.topo().url();
    let workers: Vec<Worker> = (0..4)
        .map(|_| Worker::spawn(&[&url, "counter", &key, &counter, "60"]))
        .collect();
    for mut w in workers {
        assert_eq!(w.line(Duration::from_secs(60)).await, "done");
        assert!(w.success(Duration::from_secs(10)).await);
    }
    let total: u64 = redis::cmd("GET")
        .arg(&counter)
        .query(&mut fx.redis())
        .unwrap();
    assert_eq!(
        total,
        4 * 60,
        "lost updates mean two processes were inside at once"
    );
}

#[tokio::test]
async fn a_killed_holder_process_frees_the_lock_when_its_lease_runs_out() {
    let fx = Fixture::single().await;
    let locks = fx.service(Duration::from_secs(30)).await;
    let key = unique_key("kill-9");
    let mut holder = Worker::spawn(&[&fx.topo().url(), "hold", &key, "1000"]);
    let held = holder.line(Duration::from_secs(10)).await;
    let fence: u64 = held.strip_prefix("held ").unwrap().parse().unwrap();
    let killed = Instant::now();
    holder.kill().await; // SIGKILL: no release, no goodbye
    let guard = locks.lock(&key).wait(Duration::from_secs(5)).await.unwrap();
    let after = killed.elapsed();
    assert!(
        after < Duration::from_millis(1500),
        "acquired {after:?} after the kill (lease 1 s)"
    );
    assert!(guard.fence() > fence);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_killed_watchdog_holder_stops_renewing() {
    let fx = Fixture::single().await;
    let locks = fx.service(Duration::from_secs(30)).await;
    let key = unique_key("kill-watchdog");
    // the holder renews with a 600 ms watchdog; once killed, nobody renews it
    let mut holder = Worker::spawn(&[&fx.topo().url(), "hold", &key, "0", "600"]);
    holder.line(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        locks.is_locked(&key).await.unwrap(),
        "renewed while the holder lives"
    );
    holder.kill().await;
    let killed = Instant::now();
    let guard = locks.lock(&key).wait(Duration::from_secs(5)).await.unwrap();
    assert!(
        killed.elapsed() < Duration::from_millis(1100),
        "took {:?}",
        killed.elapsed()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_outlives_the_thread_that_started_it() {
    // PR_SET_PDEATHSIG fires when the thread that forked the child exits; workers are forked by
    // the harness's spawner thread, so one started from a short-lived thread keeps running.
    let fx = Fixture::single().await;
    let key = unique_key("worker-thread");
    let (url, k, rt) = (
        fx.topo().url(),
        key.clone(),
        tokio::runtime::Handle::current(),
    );
    let mut holder = std::thread::spawn(move || {
        let _rt = rt.enter();
        Worker::spawn(&[&url, "hold", &k, "0"])
    })
    .join()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        holder.is_running(),
        "the worker died with the thread that started it"
    );
    assert!(
        holder
            .line(Duration::from_secs(10))
            .await
            .starts_with("held ")
    );
    holder.kill().await;
}

#[tokio::test]
async fn an_empty_key_is_an_invalid_key_error() {
    let fx = Fixture::single().await;
    let locks = fx.service(Duration::from_secs(30)).await;
    assert_eq!(
        locks.lock("").await.unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
    assert_eq!(
        locks.is_locked("").await.unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
    assert_eq!(
        locks.force_unlock("").await.unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
    let zero = locks.lock("k").lease(Duration::ZERO).await.unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn an_unreachable_redis_fails_within_the_connect_timeout() {
    // nothing listens on this port
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = LockConfig::single(format!("redis://127.0.0.1:{port}"))
        .with_connect_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // a server that accepts connections but never answers
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let config = LockConfig::single(format!("redis://{addr}"))
        .with_connect_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("connect"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn a_malformed_config_file_names_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lock.toml");
    std::fs::write(&path, "[redis]\nmode = \"single\"\nurl = \"redis://127.0.0.1:1\"\n[lock]\nwatchdog_timeout = 30\n").unwrap();
    let err = LockConfig::from_file(&path).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    let msg = err.to_string();
    assert!(
        msg.contains("lock.toml") && msg.contains("lock.watchdog_timeout"),
        "{msg}"
    );
    let err = LockConfig::single("not a url").with_prefix("x");
    let err = LockService::connect(err).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

#[tokio::test]
async fn an_owner_across_processes_reenters_a_lock_held_by_another_process() {
    let fx = Fixture::single().await;
    let locks = fx.service(Duration::from_secs(30)).await;
    let key = unique_key("mesh");
    let mut holder = Worker::spawn(&[&fx.topo().url(), "hold-as", &key, "op-1"]);
    let fence: u64 = holder
        .line(Duration::from_secs(10))
        .await
        .strip_prefix("held ")
        .unwrap()
        .parse()
        .unwrap();
    // the same id as a plain owner is a different owner here: it must wait
    let plain = locks
        .lock(&key)
        .owner(OwnerId::from("op-1"))
        .wait(Duration::from_millis(100))
        .await;
    assert_eq!(plain.unwrap_err().kind(), ErrorKind::Timeout);
    let shared = locks
        .lock(&key)
        .owner(OwnerId::across_processes("op-1"))
        .wait(Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(shared.fence(), fence, "re-entered the other process's hold");
    assert_eq!(locks.inspect(&key).await.unwrap().hold_count, 2);
    shared.release().await.unwrap();
    holder.kill().await;
}
