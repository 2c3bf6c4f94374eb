//! The flash-sale shop as three separate OS processes (`src/bin/web-shop.rs`: two on axum, one
//! on actix-web, each with `#[distributed_lock]` and the framework's owner-scope middleware),
//! driven over HTTP: exclusion between processes, not between routers sharing one service.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{Worker, write_config};
use lock_tests::harness::{Kind, shared};
use serde_json::Value;

/// How long a shop process may take to start and print that it listens.
const LISTEN_WITHIN: Duration = Duration::from_secs(30);

/// Units of stock each run sells.
const STOCK: i64 = 10;

/// Requests per run, and how many are in flight at once (spread evenly over the shops).
const REQUESTS: usize = 240;
const CONCURRENCY: usize = 24;

/// A running `web-shop` process; killed when dropped.
struct ShopProcess {
    base: String,
    _process: Worker,
}

/// A port no socket is bound to right now (the shop binds it a moment later; if another
/// process took it meanwhile the shop says so and [`start_shop`] tries another).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `web-shop <framework>` and waits until it prints that it listens.
async fn start_shop(framework: &str, config: &str, stock_url: &str, name: &str) -> ShopProcess {
    start_shop_with(framework, config, stock_url, name, &[]).await
}

/// [`start_shop`] with the optional arguments of `web-shop` after the instance name.
async fn start_shop_with(
    framework: &str,
    config: &str,
    stock_url: &str,
    name: &str,
    optional: &[&str],
) -> ShopProcess {
    let deadline = Instant::now() + LISTEN_WITHIN;
    for _ in 0..3 {
        let port = free_port().to_string();
        let mut args = vec![framework, &port, config, stock_url, name];
        args.extend_from_slice(optional);
        let mut process = Worker::spawn_program(env!("CARGO_BIN_EXE_web-shop"), &args);
        let mut lines = process.take_lines();
        let first = tokio::time::timeout_at(deadline.into(), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{name} did not print within {LISTEN_WITHIN:?}"))
            .expect("read the shop's output");
        match first.as_deref() {
            Some(line) if line == format!("listening 127.0.0.1:{port}") => {
                return ShopProcess {
                    base: format!("http://127.0.0.1:{port}"),
                    _process: process,
                };
            }
            Some(line) if line.contains("Address already in use") => continue,
            other => panic!("{name} ({framework}) failed to start: {other:?}"),
        }
    }
    panic!("{name}: three free ports were taken before the shop bound them");
}

/// What one request got.
#[derive(Debug)]
struct Reply {
    shop: usize,
    status: u16,
    json: Value,
}

/// `REQUESTS` purchases on `route` (`buy` or `buy-unlocked`) of `goods`, request `i` to shop
/// `i % shops`, `CONCURRENCY` at a time.
async fn purchases(shops: &[String], goods: u64, route: &str) -> Vec<Reply> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let urls: Arc<Vec<String>> = Arc::new(
        shops
            .iter()
            .map(|base| format!("{base}/goods/{goods}/{route}"))
            .collect(),
    );
    let mut tasks = Vec::new();
    for lane in 0..CONCURRENCY {
        let (client, urls) = (client.clone(), urls.clone());
        tasks.push(tokio::spawn(async move {
            let mut replies = Vec::new();
            for i in (lane..REQUESTS).step_by(CONCURRENCY) {
                let shop = i % urls.len();
                let response = client.post(&urls[shop]).send().await.expect("request");
                let status = response.status().as_u16();
                let text = response.text().await.expect("body");
                let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
                replies.push(Reply { shop, status, json });
            }
            replies
        }));
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.extend(task.await.unwrap());
    }
    replies
}

async fn get_json(url: &str) -> Value {
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}"))
}

fn stock_key(goods: u64) -> String {
    format!("web-shop:{{{goods}}}:stock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shop_processes_never_oversell() {
    let redis = shared(Kind::Single).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lock.toml");
    let topology = lock_runtime::Topology::Single { url: redis.url() };
    write_config(&config, &topology, Duration::from_secs(30), "");
    let config = config.to_str().unwrap();
    let url = redis.url();
    let started = Instant::now();
    let (a, b, c) = tokio::join!(
        start_shop("axum", config, &url, "axum-0"),
        start_shop("actix", config, &url, "actix-1"),
        start_shop("axum", config, &url, "axum-2"),
    );
    println!("three shop processes listen after {:?}", started.elapsed());
    let shops = [a, b, c];
    let bases: Vec<String> = shops.iter().map(|s| s.base.clone()).collect();
    let goods = rand::random::<u64>() >> 1;
    let mut con = redis.conn(redis.master_port());
    let set_stock = |con: &mut redis::Connection| {
        let () = redis::cmd("SET")
            .arg(stock_key(goods))
            .arg(STOCK)
            .query(con)
            .unwrap();
    };

    // The locked route: exactly the stock is sold, each unit once, in token order.
    set_stock(&mut con);
    let started = Instant::now();
    let replies = purchases(&bases, goods, "buy").await;
    println!("{REQUESTS} locked purchases in {:?}", started.elapsed());
    let mut sold_by = vec![0u64; shops.len()];
    let mut sold_out = 0;
    let mut lock_timeouts = 0;
    // units left after each sale -> (fence, shop)
    let mut sales: BTreeMap<i64, (u64, usize)> = BTreeMap::new();
    for reply in &replies {
        match (reply.status, reply.json["error"].as_str()) {
            (200, _) => {
                sold_by[reply.shop] += 1;
                let left = reply.json["left"].as_i64().expect("left");
                let fence = reply.json["fence"]
                    .as_u64()
                    .expect("a fence under the lock");
                assert_eq!(
                    reply.json["instance"],
                    ["axum-0", "actix-1", "axum-2"][reply.shop]
                );
                let again = sales.insert(left, (fence, reply.shop));
                assert!(
                    again.is_none(),
                    "two purchases both left {left} units: {again:?} and {reply:?} - oversold"
                );
            }
            (409, Some("sold_out")) => sold_out += 1,
            (409, Some("lock_timeout")) => lock_timeouts += 1,
            _ => panic!("unexpected answer from shop {}: {reply:?}", reply.shop),
        }
    }
    println!("sold per process {sold_by:?}, sold out {sold_out}, lock timeouts {lock_timeouts}");
    assert_eq!(
        sales.keys().copied().collect::<Vec<_>>(),
        (0..STOCK).collect::<Vec<_>>(),
        "every unit sold exactly once"
    );
    assert_eq!(sold_out + lock_timeouts + sales.len(), REQUESTS);
    // a sale that left fewer units came later, under a later grant
    let fences: Vec<u64> = sales.values().rev().map(|&(fence, _)| fence).collect();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "tokens grow with the sales: {fences:?}"
    );
    let left: i64 = redis::cmd("GET")
        .arg(stock_key(goods))
        .query(&mut con)
        .unwrap();
    assert_eq!(left, 0, "the stock is used up, not below zero");
    // every process ran the locked body (a sale or a sold-out answer is given under the lock),
    // so the three took the same lock; which of them sold the units is up to the lock
    let under_lock: BTreeSet<usize> = replies
        .iter()
        .filter(|r| r.status == 200 || r.json["error"] == "sold_out")
        .map(|r| r.shop)
        .collect();
    assert_eq!(
        under_lock.len(),
        shops.len(),
        "every process answered under the lock: {sold_by:?}, sales {sales:?}"
    );
    // what each process counted itself matches what its clients were told
    let mut counted = Vec::new();
    for (i, base) in bases.iter().enumerate() {
        let own = get_json(&format!("{base}/sales")).await;
        assert_eq!(own["instance"], ["axum-0", "actix-1", "axum-2"][i]);
        counted.push(own["sold"].as_u64().unwrap());
    }
    assert_eq!(counted, sold_by, "the processes' own sales counts");
    assert_eq!(counted.iter().sum::<u64>(), STOCK as u64);

    // The same purchases without the lock oversell: what the checks above would catch.
    set_stock(&mut con);
    let replies = purchases(&bases, goods, "buy-unlocked").await;
    let unlocked_sales = replies.iter().filter(|r| r.status == 200).count();
    println!("without the lock: {unlocked_sales} units sold of {STOCK}");
    assert!(
        unlocked_sales > STOCK as usize,
        "the unlocked route oversells across processes: {unlocked_sales} sold"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shop_stopped_with_sigterm_frees_its_locks_at_once_and_exits() {
    let redis = shared(Kind::Single).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lock.toml");
    let topology = lock_runtime::Topology::Single { url: redis.url() };
    write_config(&config, &topology, Duration::from_secs(30), "");
    let watcher =
        lock_runtime::LockService::connect(lock_runtime::LockConfig::from_file(&config).unwrap())
            .await
            .unwrap();
    let config = config.to_str().unwrap();
    let url = redis.url();
    let mut con = redis.conn(redis.master_port());
    for framework in ["axum", "actix"] {
        // a purchase whose checkout takes 30 s holds the lock `shop:<goods>` (lease 5 s)
        let shop = start_shop_with(framework, config, &url, framework, &["30000"]).await;
        let goods = rand::random::<u64>() >> 1;
        let () = redis::cmd("SET")
            .arg(stock_key(goods))
            .arg(STOCK)
            .query(&mut con)
            .unwrap();
        let buy = format!("{}/goods/{goods}/buy", shop.base);
        let slow = tokio::spawn(async move { reqwest::Client::new().post(buy).send().await });
        let key = format!("shop:{goods}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !watcher.is_locked(&key).await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "{framework}: the slow purchase never locked {key}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let ShopProcess {
            _process: process, ..
        } = shop;
        // SAFETY: kill only sends a signal to the shop process this test started.
        let sent = unsafe { libc::kill(process.pid() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(sent, 0, "SIGTERM sent");
        let signalled = Instant::now();
        let deadline = signalled + Duration::from_secs(1);
        while watcher.is_locked(&key).await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "{framework}: {key} still locked 1 s after SIGTERM: {:?}",
                watcher.inspect(&key).await.unwrap()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!(
            "{framework}: {key} free {:?} after SIGTERM",
            signalled.elapsed()
        );
        assert!(
            process.success(Duration::from_secs(5)).await,
            "{framework}: the shop exits with status 0 after SIGTERM"
        );
        // the cut-short purchase got no answer (or an error), never a sale
        let answer = slow.await.unwrap();
        assert!(
            answer.as_ref().map_or(true, |r| r.status() != 200),
            "{framework}: {answer:?}"
        );
    }
}
