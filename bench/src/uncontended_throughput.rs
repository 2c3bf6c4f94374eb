//! S2, uncontended throughput: 64 tasks, each on its own key, for a fixed time.
//!
//! Variants: the raw baseline, our `LockService` with a lease and in watchdog mode (no lease:
//! the watchdog renews the hold), the annotated fn (with a lease), the Redisson-style
//! baseline (with a lease), the rslock peer (one node, the lease as its TTL) and the fenced
//! baseline (`raw`: the raw lock plus a fencing token, one script call per acquire). Each
//! variant runs in slices interleaved with the others (rotating the order); the rate is all
//! pairs over all slice time. All tasks of a variant share one connection or one service, as one
//! application instance would.
//!
//! Targets: `LockService` at least 0.90x the raw baseline's rate with a lease and in watchdog
//! mode (0.85x on a cluster), and faster than the Redisson-style baseline (with a lease each).
//! rslock's and the fenced baseline's ratios are printed as informational checks against the
//! same bound.

use std::time::{Duration, Instant};

use lock_runtime::LockService;
use serde_json::json;
use tokio::task::JoinSet;

use crate::annotated;
use crate::ctx::{Counts, Ctx, LEASE};
use crate::error::Result;
use crate::raw::{self, Raw};
use crate::redisson::Redisson;
use crate::redlock::{self, Rslock};
use crate::report::{PAIR_COST_HEADERS, Scenario, Target, pair_cost_cells, ratio};

const NAMES: [&str; 5] = [
    "baseline (raw redis)",
    "LockService",
    "LockService, watchdog",
    "annotated fn",
    "Redisson-style",
];
const LEASED: usize = 1;
const WATCHDOG: usize = 2;
const ANNOTATED: usize = 3;
const REDISSON: usize = 4;
/// The rslock peer, after [`NAMES`] (its name depends on the topology).
const RSLOCK: usize = NAMES.len();
/// The fenced baseline (see `raw`), after the rslock peer: informational.
const FENCED: usize = RSLOCK + 1;
const VARIANTS: usize = NAMES.len() + 2;
const TASKS: u64 = 64;
/// The S2 target: our rate at least this fraction of the baseline's (one server, a cluster).
const TARGET: f64 = 0.90;
const TARGET_CLUSTER: f64 = 0.85;

/// What the tasks of a slice lock with.
#[derive(Clone)]
struct Paths {
    raw: Raw,
    locks: LockService,
    redisson: Redisson,
    rslock: Rslock,
}

/// Runs `TASKS` tasks of `variant` until `slice` has passed; returns the pairs done.
async fn slice(variant: usize, paths: &Paths, slice: Duration) -> Result<u64> {
    let end = Instant::now() + slice;
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let id = 1_000 + task;
        let Paths {
            mut raw,
            locks,
            redisson,
            rslock,
        } = paths.clone();
        tasks.spawn(async move {
            let raw_key = raw::key(&format!("bench:s2:{id}"));
            let lib_key = format!("bench:s2:{id}");
            let owner = redisson.owner();
            let mut pairs = 0u64;
            while Instant::now() < end {
                match variant {
                    0 => {
                        let token = raw::token();
                        if !raw.try_acquire(&raw_key, &token).await? {
                            return Err("S2 baseline: the key was held".into());
                        }
                        raw.release(&raw_key, &token).await?;
                    }
                    LEASED => {
                        let guard = locks
                            .lock(lib_key.as_str())
                            .lease(LEASE)
                            .wait(Duration::from_secs(2))
                            .await?;
                        guard.release().await?;
                    }
                    WATCHDOG => {
                        let guard = locks
                            .lock(lib_key.as_str())
                            .wait(Duration::from_secs(2))
                            .await?;
                        guard.release().await?;
                    }
                    ANNOTATED => annotated::locked(id).await?,
                    RSLOCK => rslock.acquire(&lib_key).await?.release().await,
                    FENCED => {
                        let token = raw::token();
                        if raw.try_acquire_fenced(&raw_key, &token).await?.is_none() {
                            return Err("S2 fenced baseline: the key was held".into());
                        }
                        raw.release_fenced(&raw_key, &token).await?;
                    }
                    _ => {
                        let wait = Duration::from_secs(2);
                        redisson.lock(&lib_key, &owner, LEASE, wait).await?;
                        redisson.unlock(&lib_key, &owner, LEASE).await?;
                    }
                }
                pairs += 1;
            }
            Ok::<_, crate::error::BoxError>(pairs)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done??;
    }
    Ok(total)
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Scenario> {
    let (slices, length) = if ctx.quick {
        (2, Duration::from_millis(100))
    } else {
        (4, Duration::from_millis(500))
    };
    lock_runtime::init(ctx.config()).await?;
    let paths = Paths {
        raw: Raw::connect(&ctx.redis).await?,
        locks: ctx.service().await?,
        redisson: Redisson::connect(&ctx.redis).await?,
        rslock: Rslock::connect(&ctx.redis).await?,
    };
    let names: Vec<&str> = NAMES
        .into_iter()
        .chain([redlock::name(&ctx.redis), raw::FENCED_NAME])
        .collect();
    for variant in 0..VARIANTS {
        slice(variant, &paths, Duration::from_millis(100)).await?;
    }
    let mut pairs = [0u64; VARIANTS];
    let mut seconds = [0f64; VARIANTS];
    let mut counts = vec![Counts::default(); VARIANTS];
    for round in 0..slices {
        for i in 0..VARIANTS {
            let variant = (round + i) % VARIANTS;
            let started = Instant::now();
            let (done, c) = ctx.counted(slice(variant, &paths, length)).await?;
            seconds[variant] += started.elapsed().as_secs_f64();
            pairs[variant] += done;
            counts[variant].add(&c);
        }
    }
    counts[RSLOCK].sent_plain(&redlock::PLAIN);

    let rate = |i: usize| pairs[i] as f64 / seconds[i];
    let mut scenario = Scenario {
        id: "S2",
        title: format!(
            "uncontended throughput: {TASKS} tasks, each on its own key, {:.1} s per variant \
             ({slices} interleaved slices)",
            length.as_secs_f64() * slices as f64
        ),
        headers: vec!["variant", "pairs/s", "vs baseline"]
            .into_iter()
            .chain(PAIR_COST_HEADERS)
            .collect(),
        rows: Vec::new(),
        notes: vec![
            "LockService, watchdog: `.lock(key).wait(..)` without `.lease(..)`, the hold's lease \
             is `watchdog_timeout` (30 s here) and the service's watchdog renews it every third \
             while held; Redisson-style and annotated fn hold with a 5 s lease, as the baseline"
                .into(),
            format!(
                "{}: rslock 0.10, one LockManager shared by the {TASKS} tasks, \
                 acquire(key, 5 s) + release (its SET NX PX counted as a round trip)",
                names[RSLOCK]
            ),
            raw::FENCED_NOTE.into(),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({}),
    };
    for (i, name) in names.iter().enumerate() {
        let c = &counts[i];
        scenario.rows.push(
            vec![
                (*name).into(),
                format!("{:.0}", rate(i)),
                ratio(rate(i) / rate(0)),
            ]
            .into_iter()
            .chain(pair_cost_cells(c, pairs[i]))
            .collect(),
        );
        scenario.variants.push(json!({
            "variant": name,
            "pairs": pairs[i],
            "seconds": seconds[i],
            "pairs_per_s": rate(i),
            "ratio_to_baseline": rate(i) / rate(0),
            "redis": c.json(pairs[i]),
        }));
    }
    let cluster = ctx.redis.is_cluster();
    let target = if cluster { TARGET_CLUSTER } else { TARGET };
    for i in [LEASED, WATCHDOG, ANNOTATED] {
        let r = rate(i) / rate(0);
        scenario.targets.push(Target::either(
            i == ANNOTATED,
            format!("{} pairs/s >= {target:.2}x baseline", NAMES[i]),
            ratio(r),
            r >= target,
        ));
    }
    for i in [LEASED, WATCHDOG] {
        let r = rate(i) / rate(REDISSON);
        scenario.targets.push(Target::either(
            i == WATCHDOG || cluster,
            format!("{} pairs/s > {} pairs/s", NAMES[i], NAMES[REDISSON]),
            format!("{r:.2}x"),
            r > 1.0,
        ));
    }
    for i in [RSLOCK, FENCED] {
        let r = rate(i) / rate(0);
        scenario.targets.push(Target::info(
            format!("{} pairs/s >= {target:.2}x baseline", names[i]),
            ratio(r),
            r >= target,
        ));
    }
    Ok(scenario)
}
