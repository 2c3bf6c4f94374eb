//! S3, contention: 16 workers on ONE key, each running a number of critical sections that do a
//! non-atomic read / yield / write of a shared counter (a lost update shows as a wrong final
//! count).
//!
//! Variants, each with 1 instance x 16 workers and 4 instances x 4 workers: the raw baseline
//! (an instance is a connection), our library (an instance is a `LockService`: with 4, waiters
//! wake through pub/sub), the Redisson-style baseline (an instance is a service with its own
//! connections and subscriber) and the rslock peer (an instance is a `LockManager`, given the
//! one server as its only node; its waiters retry after rslock's random sleeps, see
//! [`redlock`]). With `--current-thread` the 4 instances run on a current-thread
//! runtime each, on threads of their own.
//!
//! Targets, across 4 services x 4 workers: at least 1.5x the raw baseline's critical sections
//! per second, at most 10 Redis commands per critical section, at least 80% hand-off between
//! workers (informational for 1 service x 16 and on a cluster). rslock's figures are printed as
//! informational checks against the same bounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockService;
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::conn::Endpoint;
use crate::ctx::{Counts, Ctx, LEASE, PHASE_LIMIT, within};
use crate::error::Result;
use crate::raw::{self, Raw};
use crate::redisson::Redisson;
use crate::redlock::{self, Rslock};
use crate::report::{Samples, Scenario, Target, cost_cells, f1, ratio};

const WORKERS: usize = 16;
const KEY: &str = "bench:s3";
/// Targets: critical sections per second against the baseline, commands per critical section,
/// share of grants that change workers.
const MIN_RATIO: f64 = 1.5;
const MAX_COMMANDS: f64 = 10.0;
const MIN_HANDOFF: f64 = 0.80;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Raw,
    Service,
    Redisson,
    Rslock,
}

/// The variants, in fours per number of instances: the raw baseline, ours, Redisson-style,
/// rslock.
const VIAS: [Via; 4] = [Via::Raw, Via::Service, Via::Redisson, Via::Rslock];

#[derive(Clone, Copy)]
struct Kind {
    via: Via,
    instances: usize,
    /// rslock's name (it depends on the topology).
    rslock: &'static str,
}

impl Kind {
    fn name(self) -> String {
        let per = WORKERS / self.instances;
        match (self.via, self.instances) {
            (Via::Raw, 1) => "baseline, 1 conn x 16".into(),
            (Via::Raw, n) => format!("baseline, {n} conns x {per}"),
            (Via::Service, 1) => "LockService, 1 service x 16".into(),
            (Via::Service, n) => format!("LockService, {n} services x {per}"),
            (Via::Redisson, 1) => "Redisson-style, 1 service x 16".into(),
            (Via::Redisson, n) => format!("Redisson-style, {n} services x {per}"),
            (Via::Rslock, 1) => format!("{}, 1 manager x 16", self.rslock),
            (Via::Rslock, n) => format!("{}, {n} managers x {per}", self.rslock),
        }
    }
}

/// One instance's connection or service.
#[derive(Clone)]
enum Instance {
    Raw(Raw),
    Service(LockService),
    Redisson(Redisson),
    Rslock(Rslock),
}

impl Instance {
    async fn connect(via: Via, redis: Endpoint) -> Result<Instance> {
        Ok(match via {
            Via::Raw => Instance::Raw(Raw::connect(&redis).await?),
            Via::Service => Instance::Service(LockService::connect(redis.config()).await?),
            Via::Redisson => Instance::Redisson(Redisson::connect(&redis).await?),
            Via::Rslock => Instance::Rslock(Rslock::connect(&redis).await?),
        })
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

/// One worker: `sections` critical sections under the lock; returns its waits.
async fn worker(
    mut instance: Instance,
    shared: Arc<Shared>,
    start: Arc<Barrier>,
    worker: usize,
    sections: usize,
) -> Result<Samples> {
    let mut waits = Samples::default();
    let raw_key = raw::key(KEY);
    let owner = match &instance {
        Instance::Redisson(redisson) => redisson.owner(),
        _ => String::new(),
    };
    start.wait().await;
    for _ in 0..sections {
        let asked = Instant::now();
        match &mut instance {
            Instance::Raw(raw) => {
                let token = raw::token();
                raw.acquire(&raw_key, &token).await?;
                waits.push(asked.elapsed());
                shared.critical(worker).await;
                raw.release(&raw_key, &token).await?;
            }
            Instance::Service(locks) => {
                let guard = locks
                    .lock(KEY)
                    .lease(LEASE)
                    .wait(Duration::from_secs(30))
                    .await?;
                waits.push(asked.elapsed());
                shared.critical(worker).await;
                guard.release().await?;
            }
            Instance::Redisson(redisson) => {
                let wait = Duration::from_secs(30);
                redisson.lock(KEY, &owner, LEASE, wait).await?;
                waits.push(asked.elapsed());
                shared.critical(worker).await;
                redisson.unlock(KEY, &owner, LEASE).await?;
            }
            Instance::Rslock(rslock) => {
                let guard = rslock.acquire(KEY).await?;
                waits.push(asked.elapsed());
                shared.critical(worker).await;
                guard.release().await;
            }
        }
    }
    Ok(waits)
}

async fn run_kind(ctx: &Ctx, kind: Kind, sections: usize) -> Result<Outcome> {
    let peers = ctx.peers(kind.instances)?;
    let mut instances = Vec::new();
    for peer in &peers {
        let redis = ctx.redis.clone();
        instances.push(peer.run(Instance::connect(kind.via, redis)).await?);
    }
    let shared = Arc::new(Shared::default());
    let start = Arc::new(Barrier::new(WORKERS + 1));
    let mut workers = JoinSet::new();
    for w in 0..WORKERS {
        let i = w % kind.instances;
        let task = worker(
            instances[i].clone(),
            shared.clone(),
            start.clone(),
            w,
            sections,
        );
        workers.spawn_on(task, peers[i].handle());
    }
    ctx.reset()?;
    let started = Instant::now();
    start.wait().await;
    let mut waits = Samples::default();
    while let Some(done) = workers.join_next().await {
        waits.extend(&done??);
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut counts = ctx.read()?;
    if kind.via == Via::Rslock {
        counts.sent_plain(&redlock::PLAIN);
    }
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
    // in fours (VIAS); 1 instance, then 4
    let rslock = redlock::name(&ctx.redis);
    let kinds: Vec<Kind> = [1, 4]
        .into_iter()
        .flat_map(|instances| {
            VIAS.map(|via| Kind {
                via,
                instances,
                rslock,
            })
        })
        .collect();
    // warm-up: scripts loaded, subscriptions made; with --quick, not for rslock (it has no
    // subscription; its one script loads at its first use), whose turns wait out
    // its sleeps (a warm-up takes as long as the quick run itself)
    for &kind in &kinds {
        if ctx.quick && kind.via == Via::Rslock {
            continue;
        }
        run_kind(ctx, kind, 5)
            .await
            .map_err(|e| format!("S3 warm-up {}: {e}", kind.name()))?;
    }
    let mut outcomes = Vec::new();
    for &kind in &kinds {
        let what = format!("S3 {}", kind.name());
        let outcome = within(PHASE_LIMIT, what, run_kind(ctx, kind, sections)).await?;
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
            "vs Redisson-style",
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
            "vs baseline / vs Redisson-style: against the raw baseline / the Redisson-style \
             baseline with as many instances; hand-off = share of grants that went to a \
             different worker than the previous one"
                .into(),
            format!(
                "{rslock}: rslock 0.10's acquire (LockManager::acquire, its defaults: 3 attempts \
                 per lock() call, a random 0-200 ms sleep between two, none between two calls; \
                 each failed SET NX PX is followed by an EVALSHA of compare-and-delete) and \
                 release, the 5 s lease as its TTL; an instance is a LockManager (one connection)"
            ),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({"expected_counter": expected}),
    };
    let rate = |o: &Outcome| o.grants as f64 / o.seconds;
    let handoff = |o: &Outcome| o.changes as f64 / (o.grants.max(2) - 1) as f64;
    for (i, (kind, o)) in outcomes.iter().enumerate() {
        let first = i / VIAS.len() * VIAS.len();
        let base = &outcomes[first].1;
        let redisson = &outcomes[first + 2].1;
        let cmds = o.counts.commands() as f64 / o.grants.max(1) as f64;
        scenario.rows.push(
            vec![
                kind.name(),
                format!("{:.0}", rate(o)),
                ratio(rate(o) / rate(base)),
                ratio(rate(o) / rate(redisson)),
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
            ]
            .into_iter()
            .chain(cost_cells(&o.counts, o.grants))
            .collect(),
        );
        scenario.variants.push(json!({
            "variant": kind.name(),
            "critical_sections": o.grants,
            "seconds": o.seconds,
            "cs_per_s": rate(o),
            "ratio_to_baseline": rate(o) / rate(base),
            "ratio_to_redisson_style": rate(o) / rate(redisson),
            "wait": o.waits.json(),
            "handoff_ratio": handoff(o),
            "final_counter": o.counter,
            "counter_exact": o.counter == expected,
            "redis": o.counts.json(o.grants),
        }));
        if kind.via == Via::Service {
            // the targets are across 4 services x 4 on one server
            let info = kind.instances == 1 || ctx.redis.is_cluster();
            let r = rate(o) / rate(base);
            scenario.targets.push(Target::either(
                info,
                format!("{}: CS/s >= {MIN_RATIO:.1}x baseline", kind.name()),
                ratio(r),
                r >= MIN_RATIO,
            ));
            scenario.targets.push(Target::either(
                info,
                format!("{}: cmds/CS <= {MAX_COMMANDS}", kind.name()),
                format!("{cmds:.2}"),
                cmds <= MAX_COMMANDS,
            ));
            scenario.targets.push(Target::either(
                info,
                format!("{}: hand-off >= 80%", kind.name()),
                format!("{:.1}%", handoff(o) * 100.0),
                handoff(o) >= MIN_HANDOFF,
            ));
        }
        if kind.via == Via::Rslock {
            // a peer: its figures against the same bounds, never a target
            let r = rate(o) / rate(base);
            scenario.targets.push(Target::info(
                format!("{}: CS/s >= {MIN_RATIO:.1}x baseline", kind.name()),
                ratio(r),
                r >= MIN_RATIO,
            ));
            scenario.targets.push(Target::info(
                format!("{}: cmds/CS <= {MAX_COMMANDS}", kind.name()),
                format!("{cmds:.2}"),
                cmds <= MAX_COMMANDS,
            ));
            scenario.targets.push(Target::info(
                format!("{}: hand-off >= 80%", kind.name()),
                format!("{:.1}%", handoff(o) * 100.0),
                handoff(o) >= MIN_HANDOFF,
            ));
        }
        scenario.targets.push(Target::either(
            kind.via == Via::Rslock,
            format!("{}: final counter exact", kind.name()),
            o.counter.to_string(),
            o.counter == expected,
        ));
    }
    Ok(scenario)
}
