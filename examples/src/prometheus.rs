//! The lock metrics for Prometheus: `metrics-exporter-prometheus` as the process's recorder of
//! the `metrics` facade, rendered on `GET /metrics` by the axum shop ([`route`]).
//!
//! `lock-runtime` records its metrics (feature `metrics`; names in `lock_runtime::metrics`)
//! into whatever recorder the process installed; this installs Prometheus's, with histogram
//! buckets fit for lock times (1 ms to 10 s) and batch sizes (1 to 128). The shop's purchases
//! are labelled `key="goods:<goods>"`: the key template of their `#[distributed_lock]`, never
//! the goods id itself.
//!
//! ```no_run
//! # async fn demo(shop: lock_examples::axum_shop::Shop) -> Result<(), String> {
//! use lock_examples::{axum_shop, prometheus};
//! use lock_runtime::middleware::OwnerScopeConfig;
//!
//! let metrics = prometheus::install()?; // once per process, before the load
//! let app = prometheus::route(axum_shop::router(shop, OwnerScopeConfig::new()), metrics);
//! // curl localhost:3000/metrics | grep distributed_lock_grants_total
//! # let _ = app; Ok(()) }
//! ```

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Bucket bounds of the `*_seconds` histograms: 1 ms to 10 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Bucket bounds of `distributed_lock_batch_operations`: up to the 128 operations a call carries.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// The installed recorder's handle (one recorder per process).
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder as the process's `metrics` recorder (the first call; later
/// calls return the same handle), gives the lock metrics their descriptions, and keeps the
/// recorder's upkeep running on the current tokio runtime.
///
/// # Errors
/// When another `metrics` recorder was installed in this process first.
///
/// # Panics
/// Outside a tokio runtime.
pub fn install() -> Result<PrometheusHandle, String> {
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(lock_runtime::metrics::BATCH_OPERATIONS.into()),
                BATCH_BUCKETS,
            )
        })
        .map_err(|e| format!("prometheus buckets: {e}"))?;
    let handle = builder
        .install_recorder()
        .map_err(|e| format!("install the prometheus recorder: {e}"))?;
    lock_runtime::metrics::describe();
    handle.run_upkeep(); // publishes the descriptions
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(HANDLE.get_or_init(|| handle).clone())
}

/// `router` with `GET /metrics`: every metric of the process in Prometheus's text format.
pub fn route<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    handle: PrometheusHandle,
) -> Router<S> {
    router.route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                (
                    [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                    handle.render(),
                )
            }
        }),
    )
}
