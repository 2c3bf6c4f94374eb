//! S1, uncontended latency: one task, acquire + release on one key.
//!
//! Variants: the raw baseline, our `LockService` (with a lease), the annotated fn, the
//! Redisson-style baseline, the rslock peer (`LockManager::acquire` + `LockGuard::release`,
//! one node) and the fenced baseline (`raw`: the raw lock plus a fencing token). They run in interleaved rounds (rotating the order) so that load
//! from other processes hits them alike; median and p99 are over all pairs of a variant.
//!
//! Target: our median at most 1.05x the raw baseline's, for `LockService` and for the annotated
//! fn (informational on a cluster, where the issue sets no S1 target). rslock's and the fenced
//! baseline's ratios are printed as informational checks against the same bound.

use std::time::Duration;

use lock_runtime::LockService;
use serde_json::json;

use crate::annotated;
use crate::ctx::{Ctx, LEASE};
use crate::error::Result;
use crate::raw::{self, Raw};
use crate::redisson::Redisson;
use crate::redlock::{self, Rslock};
use crate::report::{
    PAIR_COST_HEADERS, Scenario, Target, f1, interleaved_rounds, pair_cost_cells, ratio,
};

const NAMES: [&str; 4] = [
    "baseline (raw redis)",
    "LockService",
    "annotated fn",
    "Redisson-style",
];
/// The variants the target is about.
const OURS: [usize; 2] = [1, 2];
/// The rslock peer, after [`NAMES`] (its name depends on the topology).
const RSLOCK: usize = NAMES.len();
/// The fenced baseline (see `raw`), after the rslock peer: informational.
const FENCED: usize = RSLOCK + 1;
const WARMUP: usize = 200;
/// The S1 target: our median at most this many times the baseline's.
const TARGET: f64 = 1.05;

struct Paths {
    raw: Raw,
    raw_key: String,
    locks: LockService,
    redisson: Redisson,
    owner: String,
    rslock: Rslock,
}

impl Paths {
    async fn pair(&mut self, variant: usize) -> Result<()> {
        match variant {
            0 => {
                let token = raw::token();
                if !self.raw.try_acquire(&self.raw_key, &token).await? {
                    return Err("S1 baseline: the key was held".into());
                }
                self.raw.release(&self.raw_key, &token).await
            }
            1 => {
                let guard = self
                    .locks
                    .lock("bench:s1")
                    .lease(LEASE)
                    .wait(Duration::from_secs(2))
                    .await?;
                Ok(guard.release().await?)
            }
            2 => Ok(annotated::locked(1).await?),
            RSLOCK => {
                let guard = self.rslock.acquire("bench:s1").await?;
                guard.release().await;
                Ok(())
            }
            FENCED => {
                let token = raw::token();
                if self
                    .raw
                    .try_acquire_fenced(&self.raw_key, &token)
                    .await?
                    .is_none()
                {
                    return Err("S1 fenced baseline: the key was held".into());
                }
                self.raw.release_fenced(&self.raw_key, &token).await
            }
            _ => {
                let wait = Duration::from_secs(2);
                self.redisson
                    .lock("bench:s1", &self.owner, LEASE, wait)
                    .await?;
                self.redisson.unlock("bench:s1", &self.owner, LEASE).await
            }
        }
    }
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Scenario> {
    let (rounds, per_round) = if ctx.quick { (3, 100) } else { (10, 500) };
    lock_runtime::init(ctx.config()).await?;
    let mut paths = Paths {
        raw: Raw::connect(&ctx.redis).await?,
        raw_key: raw::key("bench:s1"),
        locks: ctx.service().await?,
        redisson: Redisson::connect(&ctx.redis).await?,
        owner: String::new(),
        rslock: Rslock::connect(&ctx.redis).await?,
    };
    paths.owner = paths.redisson.owner();
    let names: Vec<&str> = NAMES
        .into_iter()
        .chain([redlock::name(&ctx.redis), raw::FENCED_NAME])
        .collect();
    for variant in 0..names.len() {
        for _ in 0..WARMUP {
            paths.pair(variant).await?;
        }
    }
    let (samples, mut counts) =
        interleaved_rounds(ctx, names.len(), rounds, per_round, async |v| {
            paths.pair(v).await
        })
        .await?;
    counts[RSLOCK].sent_plain(&redlock::PLAIN);

    let pairs = (rounds * per_round) as u64;
    let base = samples[0].median();
    let mut scenario = Scenario {
        id: "S1",
        title: format!(
            "uncontended latency: 1 task, acquire+release on one key, {pairs} pairs per variant \
             ({rounds} interleaved rounds)"
        ),
        headers: vec![
            "variant",
            "median us",
            "p99 us",
            "vs baseline",
        ]
        .into_iter()
        .chain(PAIR_COST_HEADERS)
        .collect(),
        rows: Vec::new(),
        notes: vec![
            "cmds = every command Redis ran (INFO commandstats, commands inside scripts \
             included); round trips = commands sent over the network; script us = server time inside \
             EVALSHA (commandstats); CPU = user+sys of this process (all client threads) and of \
             redis-server over the phase"
                .into(),
            format!(
                "{}: rslock 0.10's LockManager::acquire (a plain SET NX PX, counted as a round \
                 trip and in script us) + LockGuard::release (an EVALSHA of compare-and-delete), \
                 with the one {} as its only node and the same 5 s lease as its TTL",
                names[RSLOCK],
                if ctx.redis.is_cluster() {
                    "cluster"
                } else {
                    "server"
                }
            ),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({}),
    };
    scenario.notes.push(raw::FENCED_NOTE.into());
    for (i, name) in names.iter().enumerate() {
        let (s, c) = (&samples[i], &counts[i]);
        scenario.rows.push(
            vec![
                (*name).into(),
                f1(s.median()),
                f1(s.pct(0.99)),
                ratio(s.median() / base),
            ]
            .into_iter()
            .chain(pair_cost_cells(c, pairs))
            .collect(),
        );
        scenario.variants.push(json!({
            "variant": name,
            "latency": s.json(),
            "ratio_median_to_baseline": s.median() / base,
            "ratio_p99_to_baseline": s.pct(0.99) / samples[0].pct(0.99),
            "redis": c.json(pairs),
        }));
    }
    for i in OURS {
        let r = samples[i].median() / base;
        scenario.targets.push(Target::either(
            ctx.redis.is_cluster(),
            format!("{} median <= {TARGET:.2}x baseline", NAMES[i]),
            ratio(r),
            r <= TARGET,
        ));
    }
    for i in [RSLOCK, FENCED] {
        let r = samples[i].median() / base;
        scenario.targets.push(Target::info(
            format!("{} median <= {TARGET:.2}x baseline", names[i]),
            ratio(r),
            r <= TARGET,
        ));
    }
    Ok(scenario)
}
