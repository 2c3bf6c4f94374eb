//! Concurrent purchases against shop instances, and the report of what happened.
//!
//! ```no_run
//! use lock_examples::loadgen::{Endpoint, Load, Progress};
//!
//! # async fn demo() -> Result<(), String> {
//! let load = Load {
//!     targets: vec!["http://127.0.0.1:3000".into(), "http://127.0.0.1:3001".into()],
//!     goods: 1,
//!     stock: 10,
//!     requests: 2000,
//!     concurrency: 64,
//!     endpoint: Endpoint::Locked,
//!     progress: Progress::Quiet,
//! };
//! let report = lock_examples::loadgen::run(&load).await?;
//! assert_eq!(report.oversold(), 0);
//! println!("{report}");
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::CONTENT_TYPE;

mod report;

use report::percentile;
pub use report::{InstanceReport, Report, ShopInfo, explain};

/// Which purchase endpoint to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /goods/{id}/buy`: under the distributed lock.
    Locked,
    /// `POST /goods/{id}/buy-unlocked`: the same steps without it.
    Unlocked,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Locked => "buy",
            Endpoint::Unlocked => "buy-unlocked",
        }
    }

    /// `locked` or `unlocked`.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Locked => "locked",
            Endpoint::Unlocked => "unlocked",
        }
    }
}

/// How the run shows progress on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nothing.
    Quiet,
    /// One updating line on a terminal, a line per second otherwise.
    Stderr,
}

/// What to fire.
#[derive(Debug, Clone)]
pub struct Load {
    /// Base URLs of the instances (`http://127.0.0.1:3000`); request `i` goes to target
    /// `i % targets.len()`.
    pub targets: Vec<String>,
    /// The goods to buy.
    pub goods: u64,
    /// The stock the goods get before the run.
    pub stock: i64,
    /// How many purchases.
    pub requests: usize,
    /// How many purchases in flight at once.
    pub concurrency: usize,
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// Progress output.
    pub progress: Progress,
}

/// The outcome counters, shared by the workers and the progress printer.
#[derive(Default)]
struct Counters {
    done: AtomicUsize,
    sold: AtomicU64,
    sold_out: AtomicU64,
    lock_timeouts: AtomicU64,
    errors: AtomicU64,
}

enum Outcome {
    Sold(String),
    SoldOut,
    LockTimeout,
    Error(String),
}

/// One purchase as a worker saw it: the target it went to, how long it took, what came back.
struct Sample {
    target: usize,
    latency: Duration,
    outcome: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sold,
    SoldOut,
    LockTimeout,
    Error,
}

/// Restocks the goods, fires the purchases, reads the stock back and reports.
///
/// # Errors
/// When the load is empty or the goods cannot be restocked or read back.
pub async fn run(load: &Load) -> Result<Report, String> {
    if load.targets.is_empty() || load.concurrency == 0 {
        return Err("no targets or zero concurrency".into());
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(load.concurrency)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let base = load.targets[0].trim_end_matches('/');
    let goods_url = format!("{base}/goods/{}", load.goods);
    let restocked = client
        .put(&goods_url)
        .header(CONTENT_TYPE, "application/json")
        .body(format!("{{\"stock\":{}}}", load.stock))
        .send()
        .await
        .map_err(|e| format!("restock {goods_url}: {e}"))?;
    if !restocked.status().is_success() {
        return Err(format!("restock {goods_url}: {}", restocked.status()));
    }
    let mut shops = Vec::with_capacity(load.targets.len());
    for target in &load.targets {
        shops.push(about(&client, target).await);
    }

    let counters = Arc::new(Counters::default());
    let next = Arc::new(AtomicUsize::new(0));
    let per_instance = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let error_samples = Arc::new(Mutex::new(Vec::<String>::new()));
    let urls: Arc<Vec<String>> = Arc::new(
        load.targets
            .iter()
            .map(|t| {
                format!(
                    "{}/goods/{}/{}",
                    t.trim_end_matches('/'),
                    load.goods,
                    load.endpoint.path()
                )
            })
            .collect(),
    );
    let started = Instant::now();
    let printer = (load.progress == Progress::Stderr).then(|| {
        tokio::spawn(print_progress(
            counters.clone(),
            load.requests,
            load.endpoint,
        ))
    });
    let mut workers = Vec::new();
    for _ in 0..load.concurrency.min(load.requests.max(1)) {
        let (client, counters, next, urls) =
            (client.clone(), counters.clone(), next.clone(), urls.clone());
        let (per_instance, error_samples, total) =
            (per_instance.clone(), error_samples.clone(), load.requests);
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return samples;
                }
                let target = i % urls.len();
                let sent = Instant::now();
                let outcome = purchase(&client, &urls[target]).await;
                let latency = sent.elapsed();
                let kind = match outcome {
                    Outcome::Sold(instance) => {
                        counters.sold.fetch_add(1, Ordering::Relaxed);
                        *lock(&per_instance).entry(instance).or_default() += 1;
                        Kind::Sold
                    }
                    Outcome::SoldOut => {
                        counters.sold_out.fetch_add(1, Ordering::Relaxed);
                        Kind::SoldOut
                    }
                    Outcome::LockTimeout => {
                        counters.lock_timeouts.fetch_add(1, Ordering::Relaxed);
                        Kind::LockTimeout
                    }
                    Outcome::Error(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        let mut error_samples = lock(&error_samples);
                        if error_samples.len() < 3 {
                            error_samples.push(e);
                        }
                        Kind::Error
                    }
                };
                samples.push(Sample {
                    target,
                    latency,
                    outcome: kind,
                });
                counters.done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut samples = Vec::with_capacity(load.requests);
    for worker in workers {
        samples.extend(worker.await.map_err(|e| format!("worker failed: {e}"))?);
    }
    let elapsed = started.elapsed();
    if let Some(printer) = printer {
        printer.abort();
        let _ = printer.await;
        let line = progress_line(&counters, load.requests, load.endpoint);
        if std::io::stderr().is_terminal() {
            eprintln!("\r{line}\x1b[K");
        } else {
            eprintln!("{line}");
        }
    }

    let after = client
        .get(&goods_url)
        .send()
        .await
        .map_err(|e| format!("read back {goods_url}: {e}"))?
        .text()
        .await
        .map_err(|e| format!("read back {goods_url}: {e}"))?;
    let after: serde_json::Value =
        serde_json::from_str(&after).map_err(|e| format!("read back {goods_url}: {e}: {after}"))?;
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    let per_target = load
        .targets
        .iter()
        .zip(shops)
        .enumerate()
        .map(|(i, (target, shop))| instance_report(i, target, shop, &samples))
        .collect();
    let per_instance = lock(&per_instance).clone();
    let error_samples = lock(&error_samples).clone();
    Ok(Report {
        endpoint: load.endpoint,
        instances: load.targets.len(),
        concurrency: load.concurrency,
        goods: load.goods,
        stock: load.stock,
        requests: load.requests,
        sold: counters.sold.load(Ordering::Relaxed),
        sold_out: counters.sold_out.load(Ordering::Relaxed),
        lock_timeouts: counters.lock_timeouts.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        error_samples,
        stock_left: after["stock"].as_i64().unwrap_or(-1),
        sold_recorded: after["sold"].as_i64().unwrap_or(-1),
        per_instance,
        per_target,
        latency: [0.50, 0.90, 0.99, 1.0].map(|q| percentile(&latencies, q)),
        elapsed,
    })
}

/// What `target` says about itself on `GET /about`; `None` when it does not answer that (a
/// service other than the example shops).
async fn about(client: &reqwest::Client, target: &str) -> Option<ShopInfo> {
    let url = format!("{}/about", target.trim_end_matches('/'));
    let response = client.get(&url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&response.text().await.ok()?).ok()?;
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    Some(ShopInfo {
        instance: text(&json["instance"])?,
        framework: text(&json["framework"]).unwrap_or_default(),
        checkout: json["checkout_ms"].as_u64().map(Duration::from_millis),
        lock_key: text(&json["lock"]["key"]),
        lock_wait: text(&json["lock"]["wait"]),
    })
}

/// The share of the purchases in `samples` that went to target `index`.
fn instance_report(
    index: usize,
    target: &str,
    shop: Option<ShopInfo>,
    samples: &[Sample],
) -> InstanceReport {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.target == index).collect();
    let count = |kind: Kind| mine.iter().filter(|s| s.outcome == kind).count() as u64;
    let mut latencies: Vec<Duration> = mine.iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    InstanceReport {
        target: target.to_owned(),
        shop,
        requests: mine.len() as u64,
        sold: count(Kind::Sold),
        sold_out: count(Kind::SoldOut),
        lock_timeouts: count(Kind::LockTimeout),
        errors: count(Kind::Error),
        latency: [0.50, 0.99].map(|q| percentile(&latencies, q)),
    }
}

async fn purchase(client: &reqwest::Client, url: &str) -> Outcome {
    let response = match client.post(url).send().await {
        Ok(response) => response,
        Err(e) => return Outcome::Error(format!("POST {url}: {e}")),
    };
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    match (status, json["error"].as_str()) {
        (200, _) => Outcome::Sold(json["instance"].as_str().unwrap_or("?").to_owned()),
        (409, Some("sold_out")) => Outcome::SoldOut,
        (409, Some("lock_timeout")) => Outcome::LockTimeout,
        _ => Outcome::Error(format!(
            "POST {url}: {status} {}",
            body.chars().take(200).collect::<String>()
        )),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn progress_line(c: &Counters, total: usize, endpoint: Endpoint) -> String {
    format!(
        "  [{:>8}] {:>6}/{total}  sold {}  sold out {}  lock timeout {}  errors {}",
        endpoint.name(),
        c.done.load(Ordering::Relaxed),
        c.sold.load(Ordering::Relaxed),
        c.sold_out.load(Ordering::Relaxed),
        c.lock_timeouts.load(Ordering::Relaxed),
        c.errors.load(Ordering::Relaxed),
    )
}

async fn print_progress(counters: Arc<Counters>, total: usize, endpoint: Endpoint) {
    let live = std::io::stderr().is_terminal();
    let every = if live {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(1)
    };
    loop {
        tokio::time::sleep(every).await;
        let line = progress_line(&counters, total, endpoint);
        let mut err = std::io::stderr().lock();
        if live {
            let _ = write!(err, "\r{line}\x1b[K");
            let _ = err.flush();
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
}
