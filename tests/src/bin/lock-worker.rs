//! A separate OS process that takes locks, for the multi-process tests.
//!
//! ```text
//! lock-worker <redis url> counter <lock key> <counter key> <iterations>
//!     each iteration: lock, GET counter, yield, SET counter + 1, release; prints "done <fences>"
//! lock-worker <redis url> hold <lock key> <lease ms, 0 = watchdog> [watchdog ms]
//!     takes the lock, prints "held <fence>", then sleeps until killed
//! ```

use std::time::Duration;

use lock_runtime::{LockConfig, LockService};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = &args[0];
    let watchdog_ms: u64 = match args[1].as_str() {
        "hold" => args.get(4).and_then(|a| a.parse().ok()).unwrap_or(30_000),
        _ => 30_000,
    };
    let config =
        LockConfig::single(url.clone()).with_watchdog_timeout(Duration::from_millis(watchdog_ms));
    let locks = LockService::connect(config).await.expect("connect");
    match args[1].as_str() {
        "counter" => {
            counter(
                &locks,
                url,
                &args[2],
                &args[3],
                args[4].parse().expect("iterations"),
            )
            .await
        }
        "hold" => hold(&locks, &args[2], args[3].parse().expect("lease ms")).await,
        other => panic!("unknown mode {other}"),
    }
}

async fn counter(locks: &LockService, url: &str, key: &str, counter_key: &str, iterations: u32) {
    let client = redis::Client::open(url).expect("url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut last_fence = 0;
    for _ in 0..iterations {
        let guard = locks.lock(key).await.expect("lock");
        assert!(guard.fence() > last_fence, "fencing token went backwards");
        last_fence = guard.fence();
        let value: Option<u64> = redis::cmd("GET")
            .arg(counter_key)
            .query_async(&mut con)
            .await
            .expect("get");
        tokio::task::yield_now().await;
        let _: () = redis::cmd("SET")
            .arg(counter_key)
            .arg(value.unwrap_or(0) + 1)
            .query_async(&mut con)
            .await
            .expect("set");
        guard.release().await.expect("release");
    }
    println!("done");
}

async fn hold(locks: &LockService, key: &str, lease_ms: u64) {
    let mut request = locks.lock(key);
    if lease_ms > 0 {
        request = request.lease(Duration::from_millis(lease_ms));
    }
    let guard = request.await.expect("lock");
    println!("held {}", guard.fence());
    std::future::pending::<()>().await;
    drop(guard);
}
