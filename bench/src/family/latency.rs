//! S1F, uncontended latency of the lock family: one task, acquire + release, as S1 measures
//! it for the mutex (interleaved rounds, rotating the order, the same pair count), for each
//! kind and its raw floor.

use std::time::Duration;

use lock_runtime::{LockService, Semaphore};
use serde_json::json;

use super::{PERMITS, RawSlots, breakdown};
use crate::ctx::{Ctx, LEASE};
use crate::error::Result;
use crate::raw::{self, Raw};
use crate::report::{PAIR_COST_HEADERS, Scenario, f1, interleaved_rounds, pair_cost_cells, ratio};

/// The variants, each with the variant it is compared with.
const VARIANTS: [(&str, usize); 8] = [
    ("baseline (raw redis, 1 key)", 0),
    ("LockService mutex", 0),
    ("write lock", 0),
    ("read lock", 0),
    ("baseline semaphore (raw, 4 slots)", 4),
    ("semaphore permit (4 permits)", 4),
    ("baseline pair (raw, 2 keys in order)", 6),
    ("lock_all, 2 keys", 6),
];
const KEY: &str = "bench:s1f";
const PAIR: [&str; 2] = ["bench:s1f:a", "bench:s1f:b"];

struct Paths {
    raw: Raw,
    slots: RawSlots,
    locks: LockService,
    semaphore: Semaphore,
}

impl Paths {
    async fn pair(&mut self, variant: usize) -> Result<()> {
        let wait = Duration::from_secs(2);
        match variant {
            0 => {
                let (key, token) = (raw::key(KEY), raw::token());
                if !self.raw.try_acquire(&key, &token).await? {
                    return Err("S1F baseline: the key was held".into());
                }
                self.raw.release(&key, &token).await
            }
            1 => {
                let guard = self.locks.lock(KEY).lease(LEASE).wait(wait).await?;
                Ok(guard.release().await?)
            }
            2 => {
                let guard = self.locks.write(KEY).lease(LEASE).wait(wait).await?;
                Ok(guard.release().await?)
            }
            3 => {
                let guard = self.locks.read(KEY).lease(LEASE).wait(wait).await?;
                Ok(guard.release().await?)
            }
            4 => {
                let token = raw::token();
                let slot = self.slots.try_acquire(&token).await?;
                if slot == 0 {
                    return Err("S1F baseline semaphore: every slot was held".into());
                }
                self.slots.release(slot, &token).await
            }
            5 => {
                let permit = self.semaphore.acquire().lease(LEASE).wait(wait).await?;
                Ok(permit.release().await?)
            }
            6 => {
                let token = raw::token();
                let keys = PAIR.map(raw::key);
                for key in &keys {
                    if !self.raw.try_acquire(key, &token).await? {
                        return Err("S1F baseline pair: a key was held".into());
                    }
                }
                for key in keys.iter().rev() {
                    self.raw.release(key, &token).await?;
                }
                Ok(())
            }
            _ => {
                let guard = self.locks.lock_all(PAIR).lease(LEASE).wait(wait).await?;
                Ok(guard.release().await?)
            }
        }
    }
}

pub(super) async fn run(ctx: &Ctx) -> Result<Scenario> {
    // full: S1's shape; quick (CI, often a debug build): a third of its pairs per variant
    let (warmup, rounds, per_round) = if ctx.quick {
        (30, 2, 50)
    } else {
        (200, 10, 500)
    };
    let locks = ctx.service().await?;
    let mut paths = Paths {
        raw: Raw::connect(&ctx.redis).await?,
        slots: RawSlots::connect(ctx.redis.url(), "bench:s1f:sem").await?,
        semaphore: locks.semaphore("bench:s1f", PERMITS),
        locks,
    };
    let n = VARIANTS.len();
    for variant in 0..n {
        for _ in 0..warmup {
            paths.pair(variant).await?;
        }
    }
    let (samples, counts) =
        interleaved_rounds(ctx, n, rounds, per_round, async |v| paths.pair(v).await).await?;

    let pairs = (rounds * per_round) as u64;
    let mut scenario = Scenario {
        id: "S1F",
        title: format!(
            "uncontended latency of the lock family: 1 task, acquire+release, {pairs} pairs per \
             variant ({rounds} interleaved rounds)"
        ),
        headers: vec![
            "variant",
            "median us",
            "p99 us",
            "vs baseline",
            "vs raw 1 key",
        ]
        .into_iter()
        .chain(PAIR_COST_HEADERS)
        .collect(),
        rows: Vec::new(),
        notes: vec![
            "vs baseline: the mutex, write and read lock against the raw 1-key lock, the permit \
             against the raw 4-slot semaphore, lock_all against the raw pair; a pair of \
             lock_all = both keys acquired and released"
                .into(),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({}),
    };
    for (i, (name, base)) in VARIANTS.iter().enumerate() {
        let (s, c) = (&samples[i], &counts[i]);
        let vs = s.median() / samples[*base].median();
        let vs_one = s.median() / samples[0].median();
        scenario.rows.push(
            vec![
                (*name).into(),
                f1(s.median()),
                f1(s.pct(0.99)),
                ratio(vs),
                ratio(vs_one),
            ]
            .into_iter()
            .chain(pair_cost_cells(c, pairs))
            .collect(),
        );
        if *base != i {
            scenario.notes.push(format!(
                "{name}: commands per pair: {}",
                breakdown(c, pairs)
            ));
        }
        scenario.variants.push(json!({
            "variant": name,
            "baseline": VARIANTS[*base].0,
            "latency": s.json(),
            "ratio_median_to_baseline": vs,
            "ratio_p99_to_baseline": s.pct(0.99) / samples[*base].pct(0.99),
            "ratio_median_to_raw_1_key": vs_one,
            "redis": c.json(pairs),
        }));
    }
    Ok(scenario)
}
