//! Metrics of the locks, recorded through the [`metrics`](https://docs.rs/metrics/0.24) facade
//! (0.24) with the cargo feature `metrics` (off by default).
//!
//! The library installs no recorder and exports nothing: the application installs the one it
//! wants (Prometheus with `metrics-exporter-prometheus`, StatsD, OpenTelemetry, ...) and the
//! metrics below show up in it. Without the feature nothing is recorded and no `metrics` crate
//! is compiled; with it and no recorder installed, each recording is a call into the facade's
//! no-op recorder with labels made once per kind and `key` label (no allocation, no
//! formatting per recording). Call
//! `describe()` once after installing a recorder to give the metrics their help texts and
//! units.
//!
//! ```no_run
//! # #[cfg(feature = "metrics")]
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Cargo.toml: lock-runtime = { .., features = ["metrics"] }, metrics-exporter-prometheus
//! // let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
//! lock_runtime::metrics::describe();
//! // serve handle.render() on GET /metrics
//! # Ok(()) }
//! ```
//!
//! # Metrics
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `distributed_lock_acquire_seconds` | histogram | `kind`, `key`, `outcome` | how long acquire calls took, from the call until granted (`outcome="granted"`, also re-entries), the wait ran out (`timed_out`) or it failed (`error`): one observation per acquire |
//! | `distributed_lock_wait_seconds` | histogram | `kind`, `key` | how long grants that had to wait (the lock was busy) waited, from the call until granted; grants at the first ask are not in it, so its count is the number of contended grants |
//! | `distributed_lock_hold_seconds` | histogram | `kind`, `key` | how long holds were held, from the grant until the release (or drop) of the hold's first guard |
//! | `distributed_lock_grants_total` | counter | `kind`, `key` | new holds granted, by the caller's own attempt or by a hand-off |
//! | `distributed_lock_reentries_total` | counter | `kind`, `key` | lock calls that re-entered a hold of their owner (no new grant) |
//! | `distributed_lock_handoffs_total` | counter | `kind`, `key` | grants handed to a waiter by a release of this service in the release's own script call (included in `grants`) |
//! | `distributed_lock_timeouts_total` | counter | `kind`, `key` | acquires whose wait ran out (`ErrorKind::Timeout`) |
//! | `distributed_lock_lost_total` | counter | `kind`, `key`, `reason` | holds lost while held, once per hold: `reason="lease_ran_out"`, `found_gone` (a renewal, re-entry or extension found it gone: expired on Redis or force-unlocked from another service) or `force_unlocked` (by this service) |
//! | `distributed_lock_renewals_total` | counter | `kind`, `key` | holds the watchdog renewed |
//! | `distributed_lock_renewal_failures_total` | counter | `kind`, `key` | renewals that failed (Redis did not answer or answered with an error); a renewal that finds the hold gone counts as a loss instead |
//! | `distributed_lock_waiters` | gauge | `kind`, `key` | callers of this service waiting in line now |
//! | `distributed_lock_redis_script_calls_total` | counter | `script` | script calls sent to Redis, by script: `acquire`, `release`, `acquire/release` (operations of one kind sharing a call), `renew`, `extend`, `leave`, `force_unlock`, `inspect`, `available` |
//! | `distributed_lock_redis_script_errors_total` | counter | `script` | script calls that failed: no answer within `response_timeout`, a lost connection, an error reply |
//! | `distributed_lock_batch_operations` | histogram | `kind` | lock operations per acquire/release script call (1 when a call goes out alone; up to 128 under load) |
//!
//! # Labels
//!
//! | label | values |
//! |---|---|
//! | `kind` | the hold's [`HoldMode`]: `lock` (exclusive: a mutex, also each key of `lock_all`), `read`, `write`, `semaphore` (permits) |
//! | `key` | a bounded name for the lock, **never the key itself** (a key per goods or per user would make a time series each): the attribute's key template (`#[distributed_lock(key = "goods:<id>")]` records `goods:<id>`; `keys = [..]` its templates joined with `,`), the [`metric_label`](crate::LockRequest::metric_label) of a programmatic request, else [`OTHER`] |
//! | `outcome` | `granted`, `timed_out`, `error` |
//! | `reason` | `lease_ran_out`, `found_gone`, `force_unlocked` ([`LossReason`]) |
//! | `script` | see `distributed_lock_redis_script_calls_total` |
//!
//! Useful ratios: contention is `wait_seconds_count / grants_total`; the share of hand-offs is
//! `handoffs_total / grants_total`; Redis calls per lock operation is
//! `redis_script_calls_total / (acquire_seconds_count + hold_seconds_count)`.

use std::time::Duration;

use crate::vocab::{HoldMode, LossReason};

/// Histogram: seconds an acquire call took, by `kind`, `key` and `outcome`.
pub const ACQUIRE_SECONDS: &str = "distributed_lock_acquire_seconds";
/// Histogram: seconds a contended grant waited, by `kind` and `key`.
pub const WAIT_SECONDS: &str = "distributed_lock_wait_seconds";
/// Histogram: seconds a hold was held, by `kind` and `key`.
pub const HOLD_SECONDS: &str = "distributed_lock_hold_seconds";
/// Counter: new holds granted, by `kind` and `key`.
pub const GRANTS_TOTAL: &str = "distributed_lock_grants_total";
/// Counter: re-entries, by `kind` and `key`.
pub const REENTRIES_TOTAL: &str = "distributed_lock_reentries_total";
/// Counter: grants handed over by a release of this service, by `kind` and `key`.
pub const HANDOFFS_TOTAL: &str = "distributed_lock_handoffs_total";
/// Counter: acquires whose wait ran out, by `kind` and `key`.
pub const TIMEOUTS_TOTAL: &str = "distributed_lock_timeouts_total";
/// Counter: holds lost while held, by `kind`, `key` and `reason`.
pub const LOST_TOTAL: &str = "distributed_lock_lost_total";
/// Counter: watchdog renewals, by `kind` and `key`.
pub const RENEWALS_TOTAL: &str = "distributed_lock_renewals_total";
/// Counter: failed renewals, by `kind` and `key`.
pub const RENEWAL_FAILURES_TOTAL: &str = "distributed_lock_renewal_failures_total";
/// Gauge: callers of this service waiting in line, by `kind` and `key`.
pub const WAITERS: &str = "distributed_lock_waiters";
/// Counter: script calls sent to Redis, by `script`.
pub const REDIS_SCRIPT_CALLS_TOTAL: &str = "distributed_lock_redis_script_calls_total";
/// Counter: script calls that failed, by `script`.
pub const REDIS_SCRIPT_ERRORS_TOTAL: &str = "distributed_lock_redis_script_errors_total";
/// Histogram: lock operations per acquire/release script call, by `kind`.
pub const BATCH_OPERATIONS: &str = "distributed_lock_batch_operations";

/// Label: the lock's kind.
pub const KIND: &str = "kind";
/// Label: the bounded name of the lock (template or metric label, never the raw key).
pub const KEY: &str = "key";
/// Label: how an acquire ended.
pub const OUTCOME: &str = "outcome";
/// Label: why a hold was lost.
pub const REASON: &str = "reason";
/// Label: the script a Redis call ran.
pub const SCRIPT: &str = "script";

/// The `key` label of locks asked for without a metric label.
pub const OTHER: &str = "other";

/// How an acquire ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Granted,
    TimedOut,
    Error,
}

impl Outcome {
    /// Its place in [`Labels::outcome`].
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn index(self) -> usize {
        match self {
            Outcome::Granted => 0,
            Outcome::TimedOut => 1,
            Outcome::Error => 2,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::TimedOut => "timed_out",
            Outcome::Error => "error",
        }
    }
}

/// How a granted acquire got its hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// A new grant by the caller's own attempt.
    Attempt,
    /// A new grant handed over by a release.
    HandOff,
    /// A re-entry of the owner's hold.
    Reentry,
}

/// The labels of one kind and `key` label, made once (see [`labels`]): a recording takes its
/// key from them without allocating (the facade's macros would build a label vector per
/// recording, with or without a recorder).
#[cfg(feature = "metrics")]
struct Labels {
    /// `kind`, `key`.
    kind_key: [metrics::Label; 2],
    /// `kind`, `key`, `outcome` for each [`Outcome`], in its order.
    outcome: [[metrics::Label; 3]; 3],
    /// `kind`, `key`, `reason` for each [`LossReason`], in its order.
    reason: [[metrics::Label; 3]; 3],
}

#[cfg(feature = "metrics")]
impl Labels {
    fn new(mode: HoldMode, key: &'static str) -> Labels {
        use metrics::Label;
        let (k, n) = (
            Label::from_static_parts(KIND, mode.label()),
            Label::from_static_parts(KEY, key),
        );
        let outcome = [Outcome::Granted, Outcome::TimedOut, Outcome::Error].map(|o| {
            [
                k.clone(),
                n.clone(),
                Label::from_static_parts(OUTCOME, o.as_str()),
            ]
        });
        let reason = [
            LossReason::LeaseRanOut,
            LossReason::FoundGone,
            LossReason::ForceUnlocked,
        ]
        .map(|r| {
            [
                k.clone(),
                n.clone(),
                Label::from_static_parts(REASON, r.as_str()),
            ]
        });
        Labels {
            kind_key: [k, n],
            outcome,
            reason,
        }
    }
}

/// The place of `reason` in [`Labels::reason`].
#[cfg(feature = "metrics")]
fn reason_index(reason: LossReason) -> usize {
    match reason {
        LossReason::LeaseRanOut => 0,
        LossReason::FoundGone => 1,
        LossReason::ForceUnlocked => 2,
    }
}

/// Labels made once and kept for the process (leaked: a bounded number, see [`labels`]):
/// `key`'s from `made` (shared, behind a lock), after the first look from this thread's copy
/// in `seen` (no lock).
#[cfg(feature = "metrics")]
fn kept<K, V>(
    made: &std::sync::Mutex<Option<std::collections::HashMap<K, &'static V>>>,
    seen: &'static std::thread::LocalKey<
        std::cell::RefCell<std::collections::HashMap<K, &'static V>>,
    >,
    key: K,
    make: impl FnOnce() -> V,
) -> &'static V
where
    K: std::hash::Hash + Eq + Copy,
    V: Sync + 'static,
{
    seen.with(|seen| {
        if let Some(value) = seen.borrow().get(&key) {
            return *value;
        }
        let mut made = made.lock().unwrap_or_else(|p| p.into_inner());
        let value = *made
            .get_or_insert_with(std::collections::HashMap::new)
            .entry(key)
            .or_insert_with(|| Box::leak(Box::new(make())));
        seen.borrow_mut().insert(key, value);
        value
    })
}

/// The one label `name`=`value` (the per-call metrics' labels: a script's name, a kind).
#[cfg(feature = "metrics")]
fn single(name: &'static str, value: &'static str) -> &'static [metrics::Label; 1] {
    use std::cell::RefCell;
    use std::collections::HashMap;
    type Made = HashMap<(&'static str, &'static str), &'static [metrics::Label; 1]>;
    static MADE: std::sync::Mutex<Option<Made>> = std::sync::Mutex::new(None);
    thread_local! {
        static SEEN: RefCell<Made> = RefCell::new(HashMap::new());
    }
    kept(&MADE, &SEEN, (name, value), || {
        [metrics::Label::from_static_parts(name, value)]
    })
}

/// The labels of `mode` and `key`, one set per kind and `key` label: a bounded number
/// (templates and metric labels, never raw keys).
#[cfg(feature = "metrics")]
fn labels(mode: HoldMode, key: &'static str) -> &'static Labels {
    use std::cell::RefCell;
    use std::collections::HashMap;
    type Made = HashMap<(HoldMode, &'static str), &'static Labels>;
    static MADE: std::sync::Mutex<Option<Made>> = std::sync::Mutex::new(None);
    thread_local! {
        static SEEN: RefCell<Made> = RefCell::new(HashMap::new());
    }
    kept(&MADE, &SEEN, (mode, key), || Labels::new(mode, key))
}

#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

#[cfg(feature = "metrics")]
fn counter(name: &'static str, labels: &'static [metrics::Label]) -> metrics::Counter {
    let key = metrics::Key::from_static_parts(name, labels);
    metrics::with_recorder(|recorder| recorder.register_counter(&key, &METADATA))
}

#[cfg(feature = "metrics")]
fn histogram(name: &'static str, labels: &'static [metrics::Label]) -> metrics::Histogram {
    let key = metrics::Key::from_static_parts(name, labels);
    metrics::with_recorder(|recorder| recorder.register_histogram(&key, &METADATA))
}

#[cfg(feature = "metrics")]
fn gauge(name: &'static str, labels: &'static [metrics::Label]) -> metrics::Gauge {
    let key = metrics::Key::from_static_parts(name, labels);
    metrics::with_recorder(|recorder| recorder.register_gauge(&key, &METADATA))
}

/// Records the histograms and metric descriptions; call once after installing a recorder.
///
/// Descriptions are optional: without them the metrics are recorded all the same, with no
/// help text (and, in Prometheus, no unit hint).
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        ACQUIRE_SECONDS,
        Unit::Seconds,
        "Time lock acquire calls took, until granted, timed out or failed"
    );
    describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Time grants that found the lock busy waited for it"
    );
    describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time from grant to release of lock holds"
    );
    describe_counter!(GRANTS_TOTAL, "New lock holds granted");
    describe_counter!(
        REENTRIES_TOTAL,
        "Lock calls that re-entered their owner's hold"
    );
    describe_counter!(
        HANDOFFS_TOTAL,
        "Grants handed to a waiter by a release of this service"
    );
    describe_counter!(TIMEOUTS_TOTAL, "Lock acquires whose wait ran out");
    describe_counter!(LOST_TOTAL, "Lock holds lost while held, by reason");
    describe_counter!(RENEWALS_TOTAL, "Lock holds renewed by the watchdog");
    describe_counter!(RENEWAL_FAILURES_TOTAL, "Lock renewals that failed");
    describe_gauge!(
        WAITERS,
        "Callers of this service waiting in line for a lock"
    );
    describe_counter!(REDIS_SCRIPT_CALLS_TOTAL, "Lock script calls sent to Redis");
    describe_counter!(REDIS_SCRIPT_ERRORS_TOTAL, "Lock script calls that failed");
    describe_histogram!(
        BATCH_OPERATIONS,
        Unit::Count,
        "Lock operations per acquire/release script call"
    );
}

/// An acquire ended after `took`; `waited` when it found the lock busy and waited.
#[inline]
pub(crate) fn acquired(
    mode: HoldMode,
    key: &'static str,
    outcome: Outcome,
    how: Option<How>,
    took: Duration,
    waited: bool,
) {
    #[cfg(feature = "metrics")]
    {
        let labels = labels(mode, key);
        let with_outcome = &labels.outcome[outcome.index()];
        histogram(ACQUIRE_SECONDS, with_outcome).record(took);
        let kk = &labels.kind_key;
        match (outcome, how) {
            (Outcome::Granted, Some(How::Reentry)) => counter(REENTRIES_TOTAL, kk).increment(1),
            (Outcome::Granted, how) => {
                counter(GRANTS_TOTAL, kk).increment(1);
                if how == Some(How::HandOff) {
                    counter(HANDOFFS_TOTAL, kk).increment(1);
                }
                if waited {
                    histogram(WAIT_SECONDS, kk).record(took);
                }
            }
            (Outcome::TimedOut, _) => counter(TIMEOUTS_TOTAL, kk).increment(1),
            (Outcome::Error, _) => {}
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (mode, key, outcome, how, took, waited);
}

/// A hold was released (or dropped) after `held`.
#[inline]
pub(crate) fn released(mode: HoldMode, key: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    histogram(HOLD_SECONDS, &labels(mode, key).kind_key).record(held);
    #[cfg(not(feature = "metrics"))]
    let _ = (mode, key, held);
}

/// A hold was lost.
#[inline]
pub(crate) fn lost(mode: HoldMode, key: &'static str, reason: LossReason) {
    #[cfg(feature = "metrics")]
    counter(LOST_TOTAL, &labels(mode, key).reason[reason_index(reason)]).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (mode, key, reason);
}

/// The watchdog renewed a hold.
#[inline]
pub(crate) fn renewed(mode: HoldMode, key: &'static str) {
    #[cfg(feature = "metrics")]
    counter(RENEWALS_TOTAL, &labels(mode, key).kind_key).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (mode, key);
}

/// A renewal failed.
#[inline]
pub(crate) fn renewal_failed(mode: HoldMode, key: &'static str) {
    #[cfg(feature = "metrics")]
    counter(RENEWAL_FAILURES_TOTAL, &labels(mode, key).kind_key).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (mode, key);
}

/// One more caller waits in line (`joined`), or one left the line.
#[inline]
pub(crate) fn waiter(mode: HoldMode, key: &'static str, joined: bool) {
    #[cfg(feature = "metrics")]
    {
        let gauge = gauge(WAITERS, &labels(mode, key).kind_key);
        if joined {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (mode, key, joined);
}

/// A script call to Redis ended (`ok`: it answered without error).
#[inline]
pub(crate) fn script_call(script: &'static str, ok: bool) {
    #[cfg(feature = "metrics")]
    {
        let label = single(SCRIPT, script);
        counter(REDIS_SCRIPT_CALLS_TOTAL, label).increment(1);
        if !ok {
            counter(REDIS_SCRIPT_ERRORS_TOTAL, label).increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (script, ok);
}

/// An acquire/release script call carried `ops` operations of `kind`.
#[inline]
pub(crate) fn batch(mode: HoldMode, ops: usize) {
    #[cfg(feature = "metrics")]
    histogram(BATCH_OPERATIONS, single(KIND, mode.label())).record(ops as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (mode, ops);
}

/// Keeps the `waiters` gauge one higher while it lives (a place in a waiter line).
#[derive(Debug)]
pub(crate) struct Waiting {
    mode: HoldMode,
    key: &'static str,
}

impl Waiting {
    pub(crate) fn new(mode: HoldMode, key: &'static str) -> Waiting {
        waiter(mode, key, true);
        Waiting { mode, key }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        waiter(self.mode, self.key, false);
    }
}
