//! S3W, S3M and S3SEM: 16 workers contending, in the shape of S3 (a fixed number of critical
//! sections per worker; the baseline on 1 connection and on 4, our library in 1 service and in
//! 4; the counters reset around the measured run):
//!
//! - S3W: one write lock; the critical section is S3's non-atomic read / yield / write of a
//!   shared counter, so the figures compare with S3's mutex.
//! - S3M: `lock_all` of two accounts picked at random (the same sequence in every variant) out
//!   of 8, so the workers contend; the critical section moves one unit between the two with a
//!   non-atomic read / yield / write of each balance.
//! - S3SEM: one permit of a semaphore with 4; the critical section counts the holders inside
//!   (at most 4 may be) and yields.
//!
//! Targets: every variant's check holds (counter, balances, at most 4 holders inside); S3SEM's
//! semaphore reaches the raw baseline's grant rate, in one service and in four.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockService;
use serde_json::json;

use super::{PERMITS, RawSlots, Rng, breakdown, ms, run_workers};
use crate::ctx::{Counts, Ctx, LEASE, PHASE_LIMIT, within};
use crate::error::Result;
use crate::raw::{self, Raw};
use crate::report::{Samples, Scenario, Target, cost_cells, ratio};

const WORKERS: usize = 16;
const ACCOUNTS: u64 = 8;
const KEY: &str = "bench:s3w";
const SEMAPHORE: &str = "bench:s3sem";
/// S3SEM's target: the semaphore at least this many times the raw baseline's grant rate, in one
/// service and in four.
const SEMAPHORE_TARGET: f64 = 1.0;
/// The balance every account starts with.
const OPENING: i64 = 1_000_000;

/// What the workers lock.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// The write lock of one key.
    Write,
    /// Two of the accounts together.
    Pair,
    /// One permit of the semaphore.
    Permit,
}

impl Access {
    fn id(self) -> &'static str {
        match self {
            Access::Write => "S3W",
            Access::Pair => "S3M",
            Access::Permit => "S3SEM",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Access::Write => "CS",
            Access::Pair => "pair",
            Access::Permit => "grant",
        }
    }

    fn ours(self) -> &'static str {
        match self {
            Access::Write => "write lock",
            Access::Pair => "lock_all",
            Access::Permit => "semaphore",
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Raw { conns: usize },
    Service { services: usize },
}

impl Kind {
    fn name(self, access: Access) -> String {
        match self {
            Kind::Raw { conns: 1 } => "baseline, 1 conn x 16".into(),
            Kind::Raw { conns } => format!("baseline, {conns} conns x {}", WORKERS / conns),
            Kind::Service { services: 1 } => format!("{}, 1 service x 16", access.ours()),
            Kind::Service { services } => format!(
                "{}, {services} services x {}",
                access.ours(),
                WORKERS / services
            ),
        }
    }

    fn instances(self) -> usize {
        match self {
            Kind::Raw { conns } | Kind::Service { services: conns } => conns,
        }
    }
}

/// What a worker holds its locks through.
#[derive(Clone)]
enum Via {
    Raw(Raw),
    Slots(RawSlots),
    Service(LockService),
}

/// The state the critical sections share.
struct Shared {
    counter: AtomicU64,
    last_worker: AtomicUsize,
    grants: AtomicU64,
    changes: AtomicU64,
    balances: Vec<AtomicI64>,
    inside: AtomicU64,
    most_inside: AtomicU64,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            counter: AtomicU64::new(0),
            last_worker: AtomicUsize::new(usize::MAX),
            grants: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            balances: (0..ACCOUNTS).map(|_| AtomicI64::new(OPENING)).collect(),
            inside: AtomicU64::new(0),
            most_inside: AtomicU64::new(0),
        }
    }

    /// Who got it (for the hand-off share), then the access's own critical section.
    async fn critical(&self, access: Access, worker: usize, pair: (u64, u64)) {
        let previous = self.last_worker.swap(worker, Ordering::SeqCst);
        if self.grants.fetch_add(1, Ordering::SeqCst) > 0 && previous != worker {
            self.changes.fetch_add(1, Ordering::SeqCst);
        }
        match access {
            Access::Write => {
                let value = self.counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                self.counter.store(value + 1, Ordering::SeqCst);
            }
            Access::Pair => {
                let (from, to) = (
                    &self.balances[pair.0 as usize],
                    &self.balances[pair.1 as usize],
                );
                let (a, b) = (from.load(Ordering::SeqCst), to.load(Ordering::SeqCst));
                tokio::task::yield_now().await;
                from.store(a - 1, Ordering::SeqCst);
                to.store(b + 1, Ordering::SeqCst);
            }
            Access::Permit => {
                let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_inside.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                self.inside.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Whether the critical sections excluded each other as they should, and how it shows.
    fn check(&self, access: Access, ops: u64) -> (bool, String) {
        match access {
            Access::Write => {
                let counter = self.counter.load(Ordering::SeqCst);
                (counter == ops, counter.to_string())
            }
            Access::Pair => {
                // every account was debited for each pair it was first in and credited for
                // each it was second in: a lost update moves one of them
                let off = self
                    .balances
                    .iter()
                    .map(|b| b.load(Ordering::SeqCst))
                    .sum::<i64>()
                    - OPENING * ACCOUNTS as i64;
                (off == 0, format!("sum {off:+}"))
            }
            Access::Permit => {
                let most = self.most_inside.load(Ordering::SeqCst);
                (most <= u64::from(PERMITS), format!("max {most} inside"))
            }
        }
    }
}

struct Outcome {
    seconds: f64,
    waits: Samples,
    grants: u64,
    changes: u64,
    /// Whether the check passed, and what it saw.
    check: (bool, String),
    counts: Counts,
}

/// The lock name of account `i`.
fn account(i: u64) -> String {
    format!("bench:s3m:acct:{i}")
}

/// One critical section through `via`: acquire, `critical`, release; returns the wait.
async fn once(
    via: &mut Via,
    access: Access,
    shared: &Shared,
    worker: usize,
    pair: (u64, u64),
) -> Result<Duration> {
    let asked = Instant::now();
    let wait = Duration::from_secs(30);
    let names = || [account(pair.0), account(pair.1)];
    let waited;
    match (via, access) {
        (Via::Raw(raw), Access::Write) => {
            let (key, token) = (raw::key(KEY), raw::token());
            raw.acquire(&key, &token).await?;
            waited = asked.elapsed();
            shared.critical(access, worker, pair).await;
            raw.release(&key, &token).await?;
        }
        (Via::Raw(raw), Access::Pair) => {
            // one global order (the key), as lock_all takes them
            let mut keys = names().map(|n| raw::key(&n));
            keys.sort();
            let token = raw::token();
            for key in &keys {
                raw.acquire(key, &token).await?;
            }
            waited = asked.elapsed();
            shared.critical(access, worker, pair).await;
            for key in keys.iter().rev() {
                raw.release(key, &token).await?;
            }
        }
        (Via::Slots(slots), _) => {
            let token = raw::token();
            let slot = slots.acquire(&token).await?;
            waited = asked.elapsed();
            shared.critical(access, worker, pair).await;
            slots.release(slot, &token).await?;
        }
        (Via::Service(locks), Access::Write) => {
            let guard = locks.write(KEY).lease(LEASE).wait(wait).await?;
            waited = asked.elapsed();
            shared.critical(access, worker, pair).await;
            guard.release().await?;
        }
        (Via::Service(locks), Access::Pair) => {
            let guard = locks.lock_all(names()).lease(LEASE).wait(wait).await?;
            waited = asked.elapsed();
            shared.critical(access, worker, pair).await;
            guard.release().await?;
        }
        (Via::Service(locks), Access::Permit) => {
            let permit = locks
                .semaphore(SEMAPHORE, PERMITS)
                .acquire()
                .lease(LEASE)
                .wait(wait)
                .await?;
            waited = asked.elapsed();
            shared.critical(access, worker, pair).await;
            permit.release().await?;
        }
        (Via::Raw(_), Access::Permit) => {
            return Err("the raw semaphore goes through its slots".into());
        }
    }
    Ok(waited)
}

async fn run_kind(ctx: &Ctx, access: Access, kind: Kind, sections: usize) -> Result<Outcome> {
    let mut vias = Vec::new();
    for _ in 0..kind.instances() {
        vias.push(match (kind, access) {
            (Kind::Raw { .. }, Access::Permit) => {
                Via::Slots(RawSlots::connect(ctx.redis.url(), SEMAPHORE).await?)
            }
            (Kind::Raw { .. }, _) => Via::Raw(Raw::connect(&ctx.redis).await?),
            (Kind::Service { .. }, _) => Via::Service(ctx.service().await?),
        });
    }
    let shared = Arc::new(Shared::new());
    let run = run_workers(ctx, WORKERS, |worker| {
        let mut via = vias[worker % vias.len()].clone();
        let shared = shared.clone();
        async move {
            let mut rng = Rng::new(worker as u64 + 1);
            let mut waits = Samples::default();
            for _ in 0..sections {
                let pair = rng.pair(ACCOUNTS);
                waits.push(once(&mut via, access, &shared, worker, pair).await?);
            }
            Ok(waits)
        }
    })
    .await?;
    let mut waits = Samples::default();
    for w in &run.results {
        waits.extend(w);
    }
    let grants = shared.grants.load(Ordering::SeqCst);
    Ok(Outcome {
        seconds: run.seconds,
        waits,
        grants,
        changes: shared.changes.load(Ordering::SeqCst),
        check: shared.check(access, grants),
        counts: run.counts,
    })
}

pub(super) async fn run(ctx: &Ctx, access: Access) -> Result<Scenario> {
    let id = access.id();
    let (warmup, sections) = if ctx.quick { (2, 10) } else { (5, 200) };
    let kinds = [
        Kind::Raw { conns: 1 },
        Kind::Service { services: 1 },
        Kind::Raw { conns: 4 },
        Kind::Service { services: 4 },
    ];
    // warm-up: scripts loaded, subscriptions made
    for kind in kinds {
        run_kind(ctx, access, kind, warmup).await?;
    }
    let mut outcomes = Vec::new();
    for kind in kinds {
        let name = kind.name(access);
        let phase = run_kind(ctx, access, kind, sections);
        let outcome = within(PHASE_LIMIT, format!("{id} {name}"), phase).await?;
        outcomes.push((kind, outcome));
    }

    let unit = access.unit();
    let (title, check_header) = match access {
        Access::Write => (
            format!(
                "write lock contention: {WORKERS} workers on ONE key, {sections} critical \
                 sections each (read / yield / write of a shared counter, as S3)"
            ),
            "counter",
        ),
        Access::Pair => (
            format!(
                "multi-key contention: {WORKERS} workers, {sections} transfers each between two \
                 of {ACCOUNTS} accounts picked at random, both locked together"
            ),
            "balances",
        ),
        Access::Permit => (
            format!(
                "semaphore contention: {WORKERS} workers, {PERMITS} permits, {sections} grants \
                 each (acquire, yield, release)"
            ),
            "holders",
        ),
    };
    let rate_header = match access {
        Access::Write => "CS/s",
        Access::Pair => "pairs/s",
        Access::Permit => "grants/s",
    };
    let mut scenario = Scenario {
        id,
        title,
        headers: vec![
            "variant",
            rate_header,
            "vs baseline",
            "median wait ms",
            "p99 wait ms",
            "max wait ms",
            "hand-off",
            check_header,
            "cmds/op",
            "round trips/op",
            "client CPU us/op",
            "redis CPU us/op",
        ],
        rows: Vec::new(),
        notes: vec![format!(
            "op = one {unit}; wait = from asking to acquired; vs baseline: 1-instance variants \
             against the 1-connection baseline, 4-instance variants against the 4-connection \
             baseline{}",
            if access == Access::Write {
                "; hand-off = share of grants that went to a different worker than the previous \
                 one"
            } else {
                ""
            }
        )],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({"workers": WORKERS, "per_worker": sections}),
    };
    if access != Access::Write {
        // with pairs of keys or several permits, who held it last says little
        scenario.headers.retain(|h| *h != "hand-off");
    }
    let rate = |o: &Outcome| o.grants as f64 / o.seconds;
    let handoff = |o: &Outcome| o.changes as f64 / (o.grants.max(2) - 1) as f64;
    for (i, (kind, o)) in outcomes.iter().enumerate() {
        let base = &outcomes[i / 2 * 2].1;
        let name = kind.name(access);
        let mut row = vec![
            name.clone(),
            format!("{:.0}", rate(o)),
            ratio(rate(o) / rate(base)),
            ms(o.waits.median()),
            ms(o.waits.pct(0.99)),
            ms(o.waits.max()),
        ];
        if access == Access::Write {
            row.push(format!("{:.1}%", handoff(o) * 100.0));
        }
        row.push(format!(
            "{} {}",
            o.check.1,
            if o.check.0 { "ok" } else { "WRONG" }
        ));
        row.extend(cost_cells(&o.counts, o.grants));
        scenario.rows.push(row);
        if let Kind::Service { .. } = kind {
            scenario.notes.push(format!(
                "{name}: commands per {unit}: {}",
                breakdown(&o.counts, o.grants)
            ));
            if access == Access::Permit {
                let r = rate(o) / rate(base);
                scenario.targets.push(Target::new(
                    format!("{name}: {rate_header} >= {SEMAPHORE_TARGET:.1}x baseline"),
                    ratio(r),
                    r >= SEMAPHORE_TARGET,
                ));
            }
        }
        scenario.targets.push(Target::new(
            format!("{name}: {check_header} correct"),
            o.check.1.clone(),
            o.check.0,
        ));
        scenario.variants.push(json!({
            "variant": name,
            "ops": o.grants,
            "unit": unit,
            "seconds": o.seconds,
            "ops_per_s": rate(o),
            "ratio_to_baseline": rate(o) / rate(base),
            "wait": o.waits.json(),
            "handoff_ratio": (access == Access::Write).then(|| handoff(o)),
            "check_ok": o.check.0,
            "check": o.check.1,
            "redis": o.counts.json(o.grants),
        }));
    }
    Ok(scenario)
}
