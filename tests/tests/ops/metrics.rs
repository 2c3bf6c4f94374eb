//! Metrics and events against real Redis: the axum shop under load with its Prometheus
//! endpoint (`lock_examples::prometheus`), whose counters must agree with what the load
//! generator saw; and the events (and loss counters) of holds that are renewed, fail a renewal,
//! are force-unlocked from another service or from this one, or outlive their lease.
//!
//! The Prometheus recorder is the process's: the tests label their locks apart (the shop's
//! purchases are `goods:<goods>`, the others `events-*`), so they can share it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{Fixture, lock_key};
use lock_examples::loadgen::{self, Endpoint, Load, Progress};
use lock_examples::shop::Store;
use lock_examples::{axum_shop, prometheus};
use lock_runtime::middleware::OwnerScopeConfig;
use lock_runtime::{ErrorKind, HoldMode, LockConfig, LockEvent, LockKind, LockService, LossReason};
use lock_tests::harness::{Spec, unique_key};
use tokio::sync::broadcast::Receiver;

/// One sample of a scrape: metric name, labels, value.
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of a Prometheus text exposition (`name{a="x",b="y"} value` lines).
fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("`series value`");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').expect("closing brace")),
            None => (series, ""),
        };
        let mut map = BTreeMap::new();
        // label values here hold no `",` (no escapes needed)
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
            map.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
        }
        samples.push(Sample {
            name: name.to_owned(),
            labels: map,
            value: value.parse().expect("a number"),
        });
    }
    samples
}

/// The sum of the samples named `name` whose labels include `labels` (0 when none).
fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// Serves `app` on a free loopback port for the rest of the test; returns its base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn scrape(base: &str) -> String {
    let response = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.text().await.unwrap()
}

const REQUESTS: usize = 240;
const CONCURRENCY: usize = 16;
/// How long another service holds the goods' lock at the start: longer than a purchase waits
/// (2 s), so the first purchases time out.
const BLOCKED_FOR: Duration = Duration::from_millis(2600);

/// The shop sells under load, with a holder in another service making the first purchases time
/// out; then `GET /metrics` counts what the load generator saw: a grant per purchase that got
/// the lock (sold or sold out), a timeout per 409 `lock_timeout`, one acquire observation per
/// purchase, a hold per grant, nobody left waiting, and one batch observation per script call
/// that carried lock operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shop_metrics_agree_with_the_load() {
    let redis = crate::web_common::setup().await;
    let metrics = prometheus::install().unwrap();
    let shop = axum_shop::Shop {
        store: Store::connect(&redis, &unique_key("metrics-shop"))
            .await
            .unwrap(),
        instance: Arc::from("axum-metrics"),
    };
    let app = prometheus::route(axum_shop::router(shop, OwnerScopeConfig::new()), metrics);
    let base = serve(app).await;
    let goods = rand::random::<u64>() >> 1;

    let elsewhere = LockService::connect(LockConfig::single(redis.clone()))
        .await
        .unwrap();
    let blocker = elsewhere
        .lock(format!("goods:{goods}"))
        .lease(Duration::from_secs(10))
        .metric_label("metrics-test-blocker")
        .await
        .unwrap();
    let unblock = tokio::spawn(async move {
        tokio::time::sleep(BLOCKED_FOR).await;
        blocker.release().await
    });
    let report = loadgen::run(&Load {
        targets: vec![base.clone()],
        goods,
        stock: 10,
        requests: REQUESTS,
        concurrency: CONCURRENCY,
        endpoint: Endpoint::Locked,
        progress: Progress::Quiet,
    })
    .await
    .unwrap();
    unblock.await.unwrap().unwrap();
    println!("{report}");
    assert_eq!(report.errors, 0, "{:?}", report.error_samples);
    assert_eq!(report.oversold(), 0);
    assert!(
        report.lock_timeouts > 0,
        "the blocked purchases timed out: {report}"
    );
    let locked = report.sold + report.sold_out;
    assert_eq!(locked + report.lock_timeouts, REQUESTS as u64);

    let text = scrape(&base).await;
    let samples = parse(&text);
    let shop = [("kind", "lock"), ("key", "goods:<goods>")];
    let value = |name: &str, extra: &[(&str, &str)]| {
        let labels: Vec<(&str, &str)> = shop.iter().chain(extra).copied().collect();
        sum(&samples, name, &labels)
    };
    let excerpt: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.contains("_bucket")
                && (l.contains("goods:<goods>") || l.contains("script") || l.contains("batch"))
        })
        .collect();
    println!("GET /metrics (excerpt):\n{}", excerpt.join("\n"));

    let grants = value("distributed_lock_grants_total", &[]);
    assert_eq!(
        grants, locked as f64,
        "a grant per purchase that got the lock"
    );
    assert_eq!(
        value("distributed_lock_timeouts_total", &[]),
        report.lock_timeouts as f64,
        "a timeout per 409 lock_timeout"
    );
    let acquires = |outcome| {
        value(
            "distributed_lock_acquire_seconds_count",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(acquires("granted"), locked as f64);
    assert_eq!(acquires("timed_out"), report.lock_timeouts as f64);
    assert_eq!(acquires("error"), 0.0);
    assert_eq!(
        value("distributed_lock_acquire_seconds_count", &[]),
        REQUESTS as f64,
        "one acquire observation per purchase"
    );
    assert_eq!(value("distributed_lock_reentries_total", &[]), 0.0);
    assert_eq!(
        value("distributed_lock_hold_seconds_count", &[]),
        grants,
        "every hold was released (before its response was sent)"
    );
    let handoffs = value("distributed_lock_handoffs_total", &[]);
    assert!(
        handoffs > 0.0 && handoffs <= grants,
        "releases handed the lock to the purchases waiting in line: {handoffs} of {grants}"
    );
    let waited = value("distributed_lock_wait_seconds_count", &[]);
    assert!(
        waited > 0.0 && waited <= grants,
        "contended grants: {waited} of {grants}"
    );
    // the purchases that timed out waited their whole 2 s
    let timed_out_for = value(
        "distributed_lock_acquire_seconds_sum",
        &[("outcome", "timed_out")],
    );
    assert!(
        timed_out_for >= 2.0 * report.lock_timeouts as f64,
        "{timed_out_for} s for {} timeouts",
        report.lock_timeouts
    );
    assert_eq!(value("distributed_lock_waiters", &[]), 0.0, "nobody waits");
    assert_eq!(
        value("distributed_lock_lost_total", &[]),
        0.0,
        "no purchase outlived its 5 s lease"
    );

    // Every script call that carried lock operations is one batch observation (the recorder
    // also counts the other test's calls, on both sides; a call still on its way when the page
    // was rendered is looked at again).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let samples = parse(&scrape(&base).await);
        let of_ops_scripts = |name: &str| -> f64 {
            ["acquire", "release", "acquire/release"]
                .iter()
                .map(|script| sum(&samples, name, &[("script", script)]))
                .sum()
        };
        let calls = of_ops_scripts("distributed_lock_redis_script_calls_total");
        let batches = sum(&samples, "distributed_lock_batch_operations_count", &[]);
        let operations = sum(&samples, "distributed_lock_batch_operations_sum", &[]);
        if calls == batches {
            assert!(
                operations >= 2.0 * grants - handoffs,
                "an acquire per own grant, a release per grant: {operations} operations"
            );
            assert!(calls > 0.0);
            // (the other tests' renewals against a stopped server fail; no lock operation did)
            assert_eq!(
                of_ops_scripts("distributed_lock_redis_script_errors_total"),
                0.0
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{calls} lock script calls but {batches} batch observations"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The next event about `key` if one comes within `within`.
async fn event_within(
    events: &mut Receiver<LockEvent>,
    key: &str,
    within: Duration,
) -> Option<LockEvent> {
    let deadline = Instant::now() + within;
    loop {
        let event = tokio::time::timeout_at(deadline.into(), events.recv())
            .await
            .ok()?
            .expect("the service is alive");
        if event.key() == key {
            return Some(event);
        }
    }
}

/// The next event about `key`, within `within`.
async fn next_event(events: &mut Receiver<LockEvent>, key: &str, within: Duration) -> LockEvent {
    event_within(events, key, within)
        .await
        .unwrap_or_else(|| panic!("no event about {key} within {within:?}"))
}

/// The next event about `key` other than a renewal.
async fn next_non_renewal(
    events: &mut Receiver<LockEvent>,
    key: &str,
    within: Duration,
) -> LockEvent {
    loop {
        let event = next_event(events, key, within).await;
        if !matches!(event, LockEvent::Renewed { .. }) {
            return event;
        }
    }
}

/// Holds renewed by the watchdog are `Renewed` events; a hold force-unlocked from another
/// service is `Lost` (found gone) at its next renewal, one force-unlocked here is `Lost`
/// (force-unlocked) at once, one that outlives its lease unwatched is `Lost` (lease ran out)
/// within a sweep; each loss once, with the hold's token and owner, and counted in
/// `distributed_lock_lost_total` by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_holds_and_renewals_are_events_and_metrics() {
    let fx = Fixture::single().await;
    let metrics = prometheus::install().unwrap();
    // renewals every 300 ms
    let watchdog = Duration::from_millis(900);
    let here = fx.service(watchdog).await;
    let there = fx.service(watchdog).await;
    let mut events = here.events();
    let mut there_events = there.events();

    // renewed, then force-unlocked from another service: found gone at the next renewal
    let key = unique_key("events-gone");
    let guard = here.lock(&key).metric_label("events-gone").await.unwrap();
    for _ in 0..2 {
        match next_event(&mut events, &key, Duration::from_secs(2)).await {
            LockEvent::Renewed {
                kind,
                mode,
                owner,
                fence,
                label,
                ..
            } => {
                assert_eq!((kind, mode), (LockKind::Mutex, HoldMode::Exclusive));
                assert_eq!(&owner, guard.owner());
                assert_eq!(fence, guard.fence());
                assert_eq!(label, "events-gone");
            }
            other => panic!("expected a renewal: {other:?}"),
        }
    }
    assert!(there.force_unlock(&key).await.unwrap());
    let unlocked = next_event(&mut there_events, &key, Duration::from_secs(1)).await;
    assert!(
        matches!(
            unlocked,
            LockEvent::ForceUnlocked {
                kind: LockKind::Mutex,
                ..
            }
        ),
        "{unlocked:?}"
    );
    let started = Instant::now();
    match next_non_renewal(&mut events, &key, Duration::from_secs(2)).await {
        LockEvent::Lost {
            reason,
            fence,
            owner,
            ..
        } => {
            assert_eq!(reason, LossReason::FoundGone);
            assert_eq!(fence, guard.fence());
            assert_eq!(&owner, guard.owner());
        }
        other => panic!("expected the loss: {other:?}"),
    }
    println!(
        "found gone {:?} after the force-unlock elsewhere",
        started.elapsed()
    );
    let why = tokio::time::timeout(Duration::from_millis(100), guard.lost())
        .await
        .expect("lost() fires with the event");
    assert_eq!(why.kind(), ErrorKind::Lost);
    assert_eq!(
        guard.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );

    // force-unlocked by this service: lost at once
    let key = unique_key("events-here");
    let guard = here
        .lock(&key)
        .lease(Duration::from_secs(10))
        .metric_label("events-here")
        .await
        .unwrap();
    assert!(here.force_unlock(&key).await.unwrap());
    match next_event(&mut events, &key, Duration::from_millis(500)).await {
        LockEvent::Lost { reason, fence, .. } => {
            assert_eq!(reason, LossReason::ForceUnlocked);
            assert_eq!(fence, guard.fence());
        }
        other => panic!("expected the loss: {other:?}"),
    }
    let unlocked = next_event(&mut events, &key, Duration::from_millis(500)).await;
    assert!(
        matches!(unlocked, LockEvent::ForceUnlocked { .. }),
        "{unlocked:?}"
    );
    assert!(guard.is_lost());
    drop(guard);

    // a write hold force-unlocked here: the event names its kind and mode
    let key = unique_key("events-rw");
    let guard = here.write(&key).metric_label("events-rw").await.unwrap();
    let removed = here.force_unlock_kind(LockKind::ReadWrite, &key).await;
    assert!(removed.unwrap().is_some());
    match next_event(&mut events, &key, Duration::from_millis(500)).await {
        LockEvent::Lost {
            kind, mode, reason, ..
        } => {
            assert_eq!((kind, mode), (LockKind::ReadWrite, HoldMode::Write));
            assert_eq!(reason, LossReason::ForceUnlocked);
        }
        other => panic!("expected the loss: {other:?}"),
    }
    let unlocked = next_event(&mut events, &key, Duration::from_millis(500)).await;
    assert_eq!(unlocked.kind(), LockKind::ReadWrite, "{unlocked:?}");
    assert!(guard.is_lost());
    drop(guard);

    // a fixed lease runs out while held, nobody awaiting lost(): reported by the service
    let key = unique_key("events-lease");
    let guard = here
        .lock(&key)
        .lease(Duration::from_millis(300))
        .metric_label("events-lease")
        .await
        .unwrap();
    let started = Instant::now();
    match next_event(&mut events, &key, Duration::from_secs(2)).await {
        LockEvent::Lost { reason, fence, .. } => {
            assert_eq!(reason, LossReason::LeaseRanOut);
            assert_eq!(fence, guard.fence());
        }
        other => panic!("expected the loss: {other:?}"),
    }
    println!(
        "lease ran out: reported {:?} after the grant",
        started.elapsed()
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(
        guard.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    // reported once: the release that found it dead says nothing more
    let again = event_within(&mut events, &key, Duration::from_millis(400)).await;
    assert!(again.is_none(), "a second event: {again:?}");

    let samples = parse(&metrics.render());
    let lost = |label: &str, reason: &str| {
        sum(
            &samples,
            "distributed_lock_lost_total",
            &[("key", label), ("reason", reason)],
        )
    };
    assert_eq!(lost("events-gone", "found_gone"), 1.0);
    assert_eq!(lost("events-here", "force_unlocked"), 1.0);
    let write_losses = sum(
        &samples,
        "distributed_lock_lost_total",
        &[("kind", "write"), ("key", "events-rw")],
    );
    assert_eq!(write_losses, 1.0);
    assert_eq!(lost("events-lease", "lease_ran_out"), 1.0);
    for label in ["events-gone", "events-here", "events-lease"] {
        let all = sum(&samples, "distributed_lock_lost_total", &[("key", label)]);
        assert_eq!(all, 1.0, "{label}: one loss, one reason");
        let grants = sum(&samples, "distributed_lock_grants_total", &[("key", label)]);
        assert_eq!(grants, 1.0, "{label}: one grant");
    }
    let renewals = sum(
        &samples,
        "distributed_lock_renewals_total",
        &[("key", "events-gone")],
    );
    assert!(renewals >= 2.0, "{renewals} renewals counted");
}

/// A renewal that Redis does not answer (the server stopped for longer than
/// `response_timeout`) is a `RenewalFailed` event and a failure counted; the hold stays valid
/// (its deadline is the lease from the last renewal) and the next renewal renews it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_is_an_event_and_the_hold_survives_it() {
    let fx = Fixture::own(Spec::Single).await;
    let metrics = prometheus::install().unwrap();
    let locks = LockService::connect(
        fx.config(Duration::from_millis(1500))
            .with_response_timeout(Duration::from_millis(150)),
    )
    .await
    .unwrap();
    let mut events = locks.events();
    let key = unique_key("events-stall");
    let guard = locks.lock(&key).metric_label("events-stall").await.unwrap();
    // right after a renewal, stop the server past the next one (renewals every 500 ms)
    let renewed = next_event(&mut events, &key, Duration::from_secs(2)).await;
    assert!(matches!(renewed, LockEvent::Renewed { .. }), "{renewed:?}");
    let node = [fx.node_for(&lock_key(&key))];
    let stopped = fx.stop(&node);
    let failed = next_event(&mut events, &key, Duration::from_secs(2)).await;
    drop(stopped);
    match failed {
        LockEvent::RenewalFailed {
            fence,
            error,
            label,
            ..
        } => {
            assert_eq!(fence, guard.fence());
            assert_eq!(label, "events-stall");
            println!("renewal failed: {error}");
        }
        other => panic!("expected a failed renewal: {other:?}"),
    }
    assert!(
        !guard.is_lost(),
        "valid until its lease from the last renewal"
    );
    let renewed = next_event(&mut events, &key, Duration::from_secs(2)).await;
    assert!(
        matches!(renewed, LockEvent::Renewed { .. }),
        "renewed again once the server answers: {renewed:?}"
    );
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    let samples = parse(&metrics.render());
    let failures = sum(
        &samples,
        "distributed_lock_renewal_failures_total",
        &[("key", "events-stall")],
    );
    assert!(failures >= 1.0, "{failures} failures counted");
    assert_eq!(
        sum(
            &samples,
            "distributed_lock_lost_total",
            &[("key", "events-stall")]
        ),
        0.0
    );
}

/// What a tracing layer saw: each event's level and fields (`message` among them).
type Logged = Arc<std::sync::Mutex<Vec<(tracing::Level, BTreeMap<String, String>)>>>;

struct EventLog(Logged);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for EventLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let level = *event.metadata().level();
        self.0.lock().unwrap().push((level, fields));
    }
}

/// With `tracing`, a grant is a `DEBUG` event (with its token), a lease that runs out while
/// held an `ERROR`, and a force-unlock here a `WARN` for the loss and one for the unlock.
#[tokio::test(flavor = "current_thread")]
async fn grants_and_losses_are_tracing_events_at_their_levels() {
    use tracing_subscriber::layer::SubscriberExt;
    let logged = Logged::default();
    let subscriber = tracing_subscriber::registry().with(EventLog(logged.clone()));
    let _default = tracing::subscriber::set_default(subscriber);
    let fx = Fixture::single().await;
    let locks = fx.service(Duration::from_secs(30)).await;
    let find = |message: &str, key: Option<&str>| {
        logged
            .lock()
            .unwrap()
            .iter()
            .find(|(_, f)| {
                f.get("message").is_some_and(|m| m == message)
                    && key.is_none_or(|k| f.get("key").is_some_and(|v| v == k))
            })
            .cloned()
            .unwrap_or_else(|| panic!("no event {message:?} for {key:?}"))
    };

    let key = unique_key("traced-lease");
    let guard = locks
        .lock(&key)
        .lease(Duration::from_millis(200))
        .await
        .unwrap();
    let (level, fields) = find("lock acquired", None);
    assert_eq!(level, tracing::Level::DEBUG);
    assert_eq!(fields["fence"], guard.fence().to_string());
    assert_eq!(fields["how"], "granted");
    guard.lost().await;
    let (level, fields) = find("lock lost while held: its lease ran out", Some(&key));
    assert_eq!(level, tracing::Level::ERROR);
    assert_eq!(fields["reason"], "lease_ran_out");
    assert_eq!(fields["fence"], guard.fence().to_string());
    drop(guard);

    let key = unique_key("traced-unlock");
    let guard = locks.lock(&key).await.unwrap();
    assert!(locks.force_unlock(&key).await.unwrap());
    let (level, fields) = find("lock lost while held: it was force-unlocked", Some(&key));
    assert_eq!(level, tracing::Level::WARN);
    assert_eq!(fields["reason"], "force_unlocked");
    let (level, _) = find("lock force-unlocked", Some(&key));
    assert_eq!(level, tracing::Level::WARN);
    assert!(guard.is_lost());
}

#[lock_runtime::distributed_lock(key = "metrics-catalog:<id>", kind = "read", wait = "5s")]
async fn read_catalog(id: &str) -> Result<(), lock_runtime::LockError> {
    let _ = id;
    Ok(())
}

#[lock_runtime::distributed_lock(key = "metrics-catalog:<id>", kind = "write", wait = "5s")]
async fn write_catalog(id: &str) -> Result<(), lock_runtime::LockError> {
    let _ = id;
    Ok(())
}

#[lock_runtime::distributed_lock(keys = ["metrics-account:<from>", "metrics-account:<to>"])]
async fn transfer(from: &str, to: &str) -> Result<(), lock_runtime::LockError> {
    let _ = (from, to);
    Ok(())
}

/// Every form of the attribute labels its locks with its key templates: a read or write lock
/// with its template and kind, a multi-key lock with its templates joined by `,` (each key a
/// grant of kind `lock`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_labels_every_kind_with_its_templates() {
    crate::web_common::setup().await;
    let metrics = prometheus::install().unwrap();
    let (a, b) = (unique_key("a"), unique_key("b"));
    read_catalog(&a).await.unwrap();
    read_catalog(&b).await.unwrap();
    write_catalog(&a).await.unwrap();
    transfer(&a, &b).await.unwrap();
    let samples = parse(&metrics.render());
    let grants = |kind: &str, key: &str| {
        sum(
            &samples,
            "distributed_lock_grants_total",
            &[("kind", kind), ("key", key)],
        )
    };
    assert_eq!(grants("read", "metrics-catalog:<id>"), 2.0);
    assert_eq!(grants("write", "metrics-catalog:<id>"), 1.0);
    assert_eq!(
        grants("lock", "metrics-account:<from>,metrics-account:<to>"),
        2.0
    );
    let holds = sum(
        &samples,
        "distributed_lock_hold_seconds_count",
        &[("key", "metrics-catalog:<id>")],
    );
    assert_eq!(holds, 3.0);
}

/// On a cluster: contended grants of several kinds are counted per kind and label, and a hold
/// force-unlocked from another service is a `Lost` (found gone) event at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_events_on_a_cluster() {
    let fx = Fixture::shared(lock_tests::harness::Kind::Cluster).await;
    let metrics = prometheus::install().unwrap();
    let watchdog = Duration::from_millis(900);
    let (here, there) = (fx.service(watchdog).await, fx.service(watchdog).await);
    let key = unique_key("cluster-metrics");
    let rounds = 20;
    let mut tasks = Vec::new();
    for service in [here.clone(), there.clone()] {
        for _ in 0..2 {
            let (service, key) = (service.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let g = service
                        .lock(&key)
                        .metric_label("cluster-mutex")
                        .await
                        .unwrap();
                    tokio::task::yield_now().await;
                    g.release().await.unwrap();
                    let r = service.read(&key).metric_label("cluster-rw").await.unwrap();
                    r.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let samples = parse(&metrics.render());
    let grants = |kind, label| {
        sum(
            &samples,
            "distributed_lock_grants_total",
            &[("kind", kind), ("key", label)],
        )
    };
    assert_eq!(grants("lock", "cluster-mutex"), f64::from(4 * rounds));
    assert_eq!(grants("read", "cluster-rw"), f64::from(4 * rounds));
    let acquired = sum(
        &samples,
        "distributed_lock_acquire_seconds_count",
        &[("key", "cluster-mutex"), ("outcome", "granted")],
    );
    assert_eq!(acquired, f64::from(4 * rounds));

    let mut events = here.events();
    let lost_key = unique_key("cluster-events");
    let guard = here.lock(&lost_key).await.unwrap();
    assert!(there.force_unlock(&lost_key).await.unwrap());
    match next_non_renewal(&mut events, &lost_key, Duration::from_secs(3)).await {
        LockEvent::Lost { reason, fence, .. } => {
            assert_eq!(reason, LossReason::FoundGone);
            assert_eq!(fence, guard.fence());
        }
        other => panic!("expected a loss: {other:?}"),
    }
    assert_eq!(
        guard.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
}
