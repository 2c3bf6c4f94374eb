//! A separate OS process that takes locks, for the multi-process tests.
//!
//! ```text
//! lock-worker <redis url | config.toml> counter <lock key> <counter key> <iterations>
//!     each iteration: lock, GET counter, yield, SET counter + 1, release; prints "done"
//! lock-worker <redis url | config.toml> hold <lock key> <lease ms, 0 = watchdog> [watchdog ms]
//!     takes the lock, prints "held <fence>", then sleeps until killed
//! lock-worker <redis url | config.toml> hold-as <lock key> <owner id>
//!     takes the lock as `OwnerId::across_processes(owner id)`, prints "held <fence>", sleeps
//! lock-worker <config.toml> annotated <key>
//!     starts the global service from the file and calls an annotated fn on "order:<key>" that
//!     calls another one on the same key; prints "ok <fence> <hold count inside>"
//! ```

use std::time::Duration;

use lock_runtime::{LockConfig, LockError, LockService, Topology, distributed_lock};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = &args[0];
    let watchdog_ms: u64 = match args[1].as_str() {
        "hold" => args.get(4).and_then(|a| a.parse().ok()).unwrap_or(30_000),
        _ => 30_000,
    };
    let config = if url.ends_with(".toml") {
        LockConfig::from_file(url).expect("config file")
    } else {
        LockConfig::single(url.clone()).with_watchdog_timeout(Duration::from_millis(watchdog_ms))
    };
    if args[1] == "annotated" {
        lock_runtime::init_from_file(url)
            .await
            .expect("init from the config file");
        let (fence, count) = checkout(&args[2]).await.expect("annotated call");
        println!("ok {fence} {count}");
        return;
    }
    let locks = LockService::connect(config).await.expect("connect");
    match args[1].as_str() {
        "counter" => {
            counter(
                &locks,
                &args[2],
                &args[3],
                args[4].parse().expect("iterations"),
            )
            .await
        }
        "hold" => hold(&locks, &args[2], args[3].parse().expect("lease ms")).await,
        "hold-as" => {
            let owner = lock_runtime::OwnerId::across_processes(args[3].clone());
            let guard = locks.lock(&args[2]).owner(owner).await.expect("lock");
            println!("held {}", guard.fence());
            std::future::pending::<()>().await;
        }
        other => panic!("unknown mode {other}"),
    }
}

async fn counter(locks: &LockService, key: &str, counter_key: &str, iterations: u32) {
    let mut con = Raw::connect(locks.config().topology()).await;
    let mut last_fence = 0;
    for _ in 0..iterations {
        let guard = locks.lock(key).await.expect("lock");
        assert!(guard.fence() > last_fence, "fencing token went backwards");
        last_fence = guard.fence();
        let value: Option<u64> = con.query(redis::cmd("GET").arg(counter_key)).await;
        tokio::task::yield_now().await;
        let _: () = con
            .query(
                redis::cmd("SET")
                    .arg(counter_key)
                    .arg(value.unwrap_or(0) + 1),
            )
            .await;
        guard.release().await.expect("release");
    }
    println!("done");
}

/// Plain commands on the data the lock protects, on any topology.
enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    async fn connect(topology: &Topology) -> Raw {
        match topology {
            Topology::Single { url } | Topology::MasterSlave { master: url, .. } => Raw::Single(
                redis::Client::open(url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
            ),
            Topology::Cluster { nodes } => Raw::Cluster(
                redis::cluster::ClusterClient::new(nodes.clone())
                    .unwrap()
                    .get_async_connection()
                    .await
                    .unwrap(),
            ),
            Topology::Sentinel {
                master_name,
                sentinels,
            } => {
                let mut sentinel = redis::Client::open(sentinels[0].as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let (host, port): (String, u16) = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(master_name)
                    .query_async(&mut sentinel)
                    .await
                    .unwrap();
                let url = format!("redis://{host}:{port}");
                Raw::Single(
                    redis::Client::open(url)
                        .unwrap()
                        .get_multiplexed_async_connection()
                        .await
                        .unwrap(),
                )
            }
            other => panic!("unsupported topology {other:?}"),
        }
    }

    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            Raw::Single(c) => cmd.query_async(c).await.expect("raw command"),
            Raw::Cluster(c) => cmd.query_async(c).await.expect("raw command"),
        }
    }
}

#[distributed_lock(key = "order:<key>", wait = "5s")]
async fn checkout(key: &str) -> Result<(u64, u32), LockError> {
    reserve_stock(key).await
}

#[distributed_lock(key = "order:<key>", wait = "5s")]
async fn reserve_stock(key: &str) -> Result<(u64, u32), LockError> {
    let locks = lock_runtime::global().await?;
    let info = locks.inspect(&format!("order:{key}")).await?;
    Ok((lock_runtime::current_fence().unwrap_or(0), info.hold_count))
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
