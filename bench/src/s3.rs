//! S3, contention: 16 workers on ONE key, each running a number of critical sections that do a
//! non-atomic read / yield / write of a shared counter (a lost update shows as a wrong final
//! count).
//!
//! Variants: the baseline with all workers on one connection, and with 4 connections x 4
//! workers; our library with one `LockService` shared by the 16 workers (one application
//! instance) and with 4 services x 4 workers (four instances: waiters wake through pub/sub).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::ctx::{BoxError, Counts, Ctx, LEASE, Result};
use crate::raw::{self, Raw};
use crate::report::{Samples, Scenario, Target, f1, per_op, ratio};

const WORKERS: usize = 16;
const KEY: &str = "bench:s3";
/// Targets: commands per critical section, share of grants that change workers.
const MAX_COMMANDS: f64 = 12.0;
const MIN_HANDOFF: f64 = 0.80;

#[derive(Clone, Copy)]
enum Kind {
    Raw { conns: usize },
    Service { services: usize },
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Raw { conns: 1 } => "baseline, 1 conn x 16".into(),
            Kind::Raw { conns } => format!("baseline, {conns} conns x {}", WORKERS / conns),
            Kind::Service { services: 1 } => "LockService, 1 service x 16".into(),
            Kind::Service { services } => {
                format!("LockService, {services} services x {}", WORKERS / services)
            }
        }
    }
}

/// The state the critical sections share.
#[derive(Default)]
struct Shared {
    counter: AtomicU64,
    last_worker: AtomicUsize,
    grants: AtomicU64,
    changes: AtomicU64,
}

impl Shared {
    /// The critical section: who got it, then read / yield / write.
    async fn critical(&self, worker: usize) {
        let previous = self.last_worker.swap(worker, Ordering::SeqCst);
        if self.grants.fetch_add(1, Ordering::SeqCst) > 0 && previous != worker {
            self.changes.fetch_add(1, Ordering::SeqCst);
        }
        let value = self.counter.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        self.counter.store(value + 1, Ordering::SeqCst);
    }
}

struct Outcome {
    seconds: f64,
    waits: Samples,
    counter: u64,
    grants: u64,
    changes: u64,
    counts: Counts,
}

async fn run_kind(ctx: &Ctx, kind: Kind, sections: usize) -> Result<Outcome> {
    let instances = match kind {
        Kind::Raw { conns } | Kind::Service { services: conns } => conns,
    };
    let mut raws = Vec::new();
    let mut services = Vec::new();
    for _ in 0..instances {
        match kind {
            Kind::Raw { .. } => raws.push(Raw::connect(&ctx.url).await?),
            Kind::Service { .. } => services.push(ctx.service().await?),
        }
    }
    let shared = Arc::new(Shared::default());
    let start = Arc::new(Barrier::new(WORKERS + 1));
    let mut workers = JoinSet::new();
    for worker in 0..WORKERS {
        let (shared, start) = (shared.clone(), start.clone());
        let mut raw = raws.get(worker % instances).cloned();
        let locks = services.get(worker % instances).cloned();
        workers.spawn(async move {
            let mut waits = Samples::default();
            let raw_key = raw::key(KEY);
            start.wait().await;
            for _ in 0..sections {
                let asked = Instant::now();
                if let Some(raw) = raw.as_mut() {
                    let token = raw::token();
                    raw.acquire(&raw_key, &token).await?;
                    waits.push(asked.elapsed());
                    shared.critical(worker).await;
                    raw.release(&raw_key, &token).await?;
                } else if let Some(locks) = &locks {
                    let guard = locks
                        .lock(KEY)
                        .lease(LEASE)
                        .wait(Duration::from_secs(30))
                        .await?;
                    waits.push(asked.elapsed());
                    shared.critical(worker).await;
                    guard.release().await?;
                }
            }
            Ok::<_, BoxError>(waits)
        });
    }
    ctx.reset()?;
    let started = Instant::now();
    start.wait().await;
    let mut waits = Samples::default();
    while let Some(done) = workers.join_next().await {
        waits.extend(&done??);
    }
    let seconds = started.elapsed().as_secs_f64();
    let counts = ctx.read()?;
    Ok(Outcome {
        seconds,
        waits,
        counter: shared.counter.load(Ordering::SeqCst),
        grants: shared.grants.load(Ordering::SeqCst),
        changes: shared.changes.load(Ordering::SeqCst),
        counts,
    })
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Scenario> {
    let sections = if ctx.quick { 20 } else { 200 };
    let expected = (WORKERS * sections) as u64;
    let kinds = [
        Kind::Raw { conns: 1 },
        Kind::Service { services: 1 },
        Kind::Raw { conns: 4 },
        Kind::Service { services: 4 },
    ];
    // warm-up: scripts loaded, subscriptions made
    for kind in kinds {
        run_kind(ctx, kind, 5).await?;
    }
    let mut outcomes = Vec::new();
    for kind in kinds {
        let limit = Duration::from_secs(120);
        let outcome = tokio::time::timeout(limit, run_kind(ctx, kind, sections))
            .await
            .map_err(|_| format!("S3 {} did not finish within {limit:?}", kind.name()))?
            .map_err(|e| format!("S3 {}: {e}", kind.name()))?;
        outcomes.push((kind, outcome));
    }

    let mut scenario = Scenario {
        id: "S3",
        title: format!(
            "contention: {WORKERS} workers on ONE key, {sections} critical sections each \
             (read / yield / write of a shared counter)"
        ),
        headers: vec![
            "variant",
            "CS/s",
            "vs baseline",
            "p99 wait us",
            "max wait us",
            "hand-off",
            "counter",
            "cmds/CS",
            "round trips/CS",
            "client CPU us/CS",
            "redis CPU us/CS",
        ],
        rows: Vec::new(),
        notes: vec![
            "vs baseline: 1-instance variants against the 1-connection baseline, 4-instance \
             variants against the 4-connection baseline; hand-off = share of grants that went \
             to a different worker than the previous one"
                .into(),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({"expected_counter": expected}),
    };
    let rate = |o: &Outcome| o.grants as f64 / o.seconds;
    let handoff = |o: &Outcome| o.changes as f64 / (o.grants.max(2) - 1) as f64;
    for (i, (kind, o)) in outcomes.iter().enumerate() {
        let base = &outcomes[i / 2 * 2].1;
        let cmds = o.counts.commands() as f64 / o.grants.max(1) as f64;
        scenario.rows.push(vec![
            kind.name(),
            format!("{:.0}", rate(o)),
            ratio(rate(o) / rate(base)),
            f1(o.waits.pct(0.99)),
            f1(o.waits.max()),
            format!("{:.1}%", handoff(o) * 100.0),
            format!(
                "{}{}",
                o.counter,
                if o.counter == expected {
                    " ok"
                } else {
                    " WRONG"
                }
            ),
            per_op(o.counts.commands(), o.grants),
            per_op(o.counts.requests(), o.grants),
            per_op(o.counts.client_cpu_us, o.grants),
            per_op(o.counts.server_cpu_us, o.grants),
        ]);
        scenario.variants.push(json!({
            "variant": kind.name(),
            "critical_sections": o.grants,
            "seconds": o.seconds,
            "cs_per_s": rate(o),
            "ratio_to_baseline": rate(o) / rate(base),
            "wait": o.waits.json(),
            "handoff_ratio": handoff(o),
            "final_counter": o.counter,
            "counter_exact": o.counter == expected,
            "redis": o.counts.json(o.grants),
        }));
        if let Kind::Service { services } = kind {
            let suffix = if *services == 1 {
                ""
            } else {
                " (informational)"
            };
            let r = rate(o) / rate(base);
            scenario.targets.push(Target::new(
                format!("{}: CS/s >= baseline{suffix}", kind.name()),
                ratio(r),
                r >= 1.0,
            ));
            scenario.targets.push(Target::new(
                format!("{}: cmds/CS <= {MAX_COMMANDS}{suffix}", kind.name()),
                format!("{cmds:.2}"),
                cmds <= MAX_COMMANDS,
            ));
            scenario.targets.push(Target::new(
                format!("{}: hand-off >= 80%{suffix}", kind.name()),
                format!("{:.1}%", handoff(o) * 100.0),
                handoff(o) >= MIN_HANDOFF,
            ));
        }
        scenario.targets.push(Target::new(
            format!("{}: final counter exact", kind.name()),
            o.counter.to_string(),
            o.counter == expected,
        ));
    }
    Ok(scenario)
}
