//! S5, a hot item: 16 workers of 4 services (4 each) buy one unit at a time of ONE item, its
//! stock under one lock or split over 8 segments ([`SegmentedStock`]), with the same load,
//! the same code and the same stock.
//!
//! Variants: 1 key and 8 segments, each with no work inside the hold (the section is the
//! fenced read and write of the segment: what bounds one key is the lock's hand-off) and with a
//! 1 ms checkout inside it (what bounds one key is the hold itself). A buy is
//! [`SegmentedStock::buy`]: with 1 segment a wait for the one lock; with 8, a try of each
//! segment in turn, then a wait for the busy ones. The stock (twice the buys) never runs out.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_examples::segmented::{Activity, BuyOutcome, SegmentedStock};
use lock_examples::shop::Store;
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::ctx::{Counts, Ctx, LEASE, PHASE_LIMIT, within};
use crate::error::{BoxError, Result};
use crate::report::{Samples, Scenario, Target, cost_cells, f1, per_op, ratio};

const SERVICES: usize = 4;
const WORKERS: usize = 16;
const SEGMENTS: u32 = 8;

#[derive(Clone, Copy)]
struct Kind {
    segments: u32,
    checkout: Duration,
}

impl Kind {
    fn name(self) -> String {
        let stock = match self.segments {
            1 => "1 key".to_owned(),
            n => format!("{n} segments"),
        };
        if self.checkout.is_zero() {
            format!("{stock}, no checkout")
        } else {
            format!("{stock}, {} ms checkout", self.checkout.as_millis())
        }
    }
}

struct Outcome {
    seconds: f64,
    buys: u64,
    latency: Samples,
    /// `Busy` answers (retried): a segment stayed held for the whole wait.
    busy_answers: u64,
    activity: Activity,
    stock_exact: bool,
    counts: Counts,
}

/// Runs `buys` purchases per worker on a fresh item; `goods` must differ between runs.
async fn run_kind(ctx: &Ctx, kind: Kind, goods: u64, buys: usize) -> Result<Outcome> {
    let mut services = Vec::new();
    for _ in 0..SERVICES {
        services.push(ctx.service().await?);
    }
    let store = Store::connect(ctx.redis.url(), "bench:s5")
        .await?
        .with_checkout(kind.checkout);
    let stock = SegmentedStock::new(&store, goods, kind.segments)
        .with_lease(LEASE)
        .with_wait(Duration::from_secs(30));
    let initial = 2 * (WORKERS * buys) as u64;
    stock.restock(&services[0], initial).await?;

    let start = Arc::new(Barrier::new(WORKERS + 1));
    let mut workers = JoinSet::new();
    for worker in 0..WORKERS {
        let (stock, start) = (stock.clone(), start.clone());
        let locks = services[worker % SERVICES].clone();
        workers.spawn(async move {
            let (mut latency, mut busy) = (Samples::default(), 0u64);
            start.wait().await;
            let mut bought = 0;
            while bought < buys {
                let asked = Instant::now();
                match stock.buy(&locks, NonZeroU32::MIN).await? {
                    BuyOutcome::Bought(_) => {
                        latency.push(asked.elapsed());
                        bought += 1;
                    }
                    BuyOutcome::Busy => busy += 1,
                    other => return Err(format!("the stock ran out: {other:?}").into()),
                }
            }
            Ok::<_, BoxError>((latency, busy))
        });
    }
    ctx.reset()?;
    let started = Instant::now();
    start.wait().await;
    let (mut latency, mut busy_answers) = (Samples::default(), 0);
    while let Some(done) = workers.join_next().await {
        let (samples, busy) = done??;
        latency.extend(&samples);
        busy_answers += busy;
    }
    let seconds = started.elapsed().as_secs_f64();
    let counts = ctx.read()?;
    let sold = (WORKERS * buys) as i64;
    let left: i64 = stock.stock().await?.iter().sum();
    Ok(Outcome {
        seconds,
        buys: sold as u64,
        latency,
        busy_answers,
        activity: stock.activity(),
        stock_exact: left == initial as i64 - sold,
        counts,
    })
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Scenario> {
    let buys = if ctx.quick { 20 } else { 200 };
    let kinds = [
        Kind {
            segments: 1,
            checkout: Duration::ZERO,
        },
        Kind {
            segments: SEGMENTS,
            checkout: Duration::ZERO,
        },
        Kind {
            segments: 1,
            checkout: Duration::from_millis(1),
        },
        Kind {
            segments: SEGMENTS,
            checkout: Duration::from_millis(1),
        },
    ];
    // Every run sells a fresh item: warm-ups first (scripts loaded, subscriptions made).
    let mut goods = 0;
    for kind in kinds {
        goods += 1;
        run_kind(ctx, kind, goods, 3).await?;
    }
    let mut outcomes = Vec::new();
    for kind in kinds {
        goods += 1;
        let what = format!("S5 {}", kind.name());
        let outcome = within(PHASE_LIMIT, what, run_kind(ctx, kind, goods, buys)).await?;
        outcomes.push((kind, outcome));
    }

    let mut scenario = Scenario {
        id: "S5",
        title: format!(
            "hot item: {WORKERS} workers of {SERVICES} services buy 1 unit at a time, {buys} \
             buys each, from one item: 1 key vs {SEGMENTS} segments"
        ),
        headers: vec![
            "variant",
            "buys/s",
            "vs 1 key",
            "p50 buy us",
            "p99 buy us",
            "lock calls/buy",
            "held at once",
            "stock",
            "cmds/buy",
            "round trips/buy",
            "client CPU us/buy",
            "redis CPU us/buy",
        ],
        rows: Vec::new(),
        notes: vec![
            "vs 1 key: each variant against the 1-key variant with the same checkout; lock calls \
             = segment locks acquired + tries that found a segment busy; held at once = most \
             segment locks held at the same moment; Redis figures include the segment's fenced \
             read and write (2 EVALSHA per buy)"
                .into(),
            "checkout: a tokio sleep inside the hold, 1-2 ms with the timer's millisecond ticks"
                .into(),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({
            "workers": WORKERS,
            "services": SERVICES,
            "buys_per_worker": buys,
        }),
    };
    let rate = |o: &Outcome| o.buys as f64 / o.seconds;
    for (i, (kind, o)) in outcomes.iter().enumerate() {
        let base = &outcomes[i / 2 * 2].1;
        let lock_calls = o.activity.holds + o.activity.busy;
        scenario.rows.push(
            vec![
                kind.name(),
                format!("{:.0}", rate(o)),
                ratio(rate(o) / rate(base)),
                f1(o.latency.median()),
                f1(o.latency.pct(0.99)),
                per_op(lock_calls, o.buys),
                o.activity.max_holding.to_string(),
                if o.stock_exact { "ok" } else { "WRONG" }.to_owned(),
            ]
            .into_iter()
            .chain(cost_cells(&o.counts, o.buys))
            .collect(),
        );
        scenario.variants.push(json!({
            "variant": kind.name(),
            "segments": kind.segments,
            "checkout_ms": kind.checkout.as_millis() as u64,
            "buys": o.buys,
            "seconds": o.seconds,
            "buys_per_s": rate(o),
            "ratio_to_one_key": rate(o) / rate(base),
            "latency": o.latency.json(),
            "lock_calls_per_buy": lock_calls as f64 / o.buys.max(1) as f64,
            "busy_answers": o.busy_answers,
            "activity": o.activity,
            "stock_exact": o.stock_exact,
            "redis": o.counts.json(o.buys),
        }));
        scenario.targets.push(Target::new(
            format!("{}: stock exact, no two buyers in one segment", kind.name()),
            format!(
                "stock {}, overlaps {}, stale writes {}",
                if o.stock_exact { "ok" } else { "WRONG" },
                o.activity.overlaps,
                o.activity.stale_writes
            ),
            o.stock_exact && o.activity.overlaps == 0,
        ));
    }
    Ok(scenario)
}
