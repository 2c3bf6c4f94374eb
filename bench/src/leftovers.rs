//! S6, what locks leave on Redis: 64 tasks lock and release N distinct keys (100,000; 5,000
//! with `--quick`), once each, with `LockService` (with a lease) and with the raw baseline;
//! then the keys left under the variant's names are counted (SCAN), with their PTTL, the
//! bytes Redis holds for them (`used_memory` of `INFO memory` before and after, per distinct
//! key locked; `MEMORY USAGE` of a sample) and the change of DBSIZE. What is left is deleted
//! afterwards (UNLINK), so later scenarios do not see it.
//!
//! Target: no key is left per lock key after its last hold; the fencing counters (one per
//! cluster slot, `<prefix>fence:{<n>}`, never expiring) are counted apart: at most 16,384,
//! whatever the number of keys. The raw baseline deletes its key at release and should leave
//! nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lock_runtime::LockService;
use serde_json::json;
use tokio::task::JoinSet;

use crate::conn::Conn;
use crate::ctx::{Counts, Ctx, LEASE, info_field};
use crate::error::{BoxError, Result};
use crate::raw::{self, Raw};
use crate::report::{Samples, Scenario, Target, f1, per_op};

const NAMES: [&str; 2] = ["baseline (raw redis)", "LockService"];
const RAW: usize = 0;
const OURS: usize = 1;
const TASKS: usize = 64;
/// Keys whose `MEMORY USAGE` is asked for.
const SAMPLE: usize = 100;
/// Keys per SCAN, PTTL pipeline, UNLINK.
const BATCH: usize = 1000;

/// The lock name of distinct key `i`.
fn name(i: usize) -> String {
    format!("bench:s6:{i}")
}

struct Left {
    seconds: f64,
    counts: Counts,
    dbsize_delta: i64,
    memory_delta: i64,
    /// Every key left under the variant's names.
    keys: usize,
    /// The keys left by their shape: `lock:{<name>}:fence`, ...
    kinds: BTreeMap<String, usize>,
    /// PTTLs in ms of the keys that have one.
    pttl_ms: Samples,
    without_ttl: usize,
    /// `MEMORY USAGE` of a sample of the keys left, in bytes.
    usage: Samples,
    /// The fencing counters on the server after the run (ours only; shared by every lock of a
    /// cluster slot).
    counters: usize,
}

/// Locks and releases keys `0..n`, `TASKS` at a time.
async fn lock_all(variant: usize, n: usize, raw: &Raw, locks: &LockService) -> Result<()> {
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let (mut raw, locks) = (raw.clone(), locks.clone());
        tasks.spawn(async move {
            for i in (task..n).step_by(TASKS) {
                if variant == RAW {
                    let (key, token) = (raw::key(&name(i)), raw::token());
                    if !raw.try_acquire(&key, &token).await? {
                        return Err(format!("S6 baseline: `{key}` was held").into());
                    }
                    raw.release(&key, &token).await?;
                } else {
                    let guard = locks
                        .lock(name(i))
                        .lease(LEASE)
                        .wait(Duration::from_secs(2))
                        .await?;
                    guard.release().await?;
                }
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

async fn dbsize(admin: &mut Conn) -> Result<i64> {
    Ok(redis::cmd("DBSIZE").query_async(admin).await?)
}

async fn used_memory(admin: &mut Conn) -> Result<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(admin).await?;
    Ok(info_field(&info, "used_memory")
        .and_then(|v| v.parse().ok())
        .ok_or("INFO memory without used_memory")?)
}

/// Every key matching `pattern`.
async fn scan(admin: &mut Conn, pattern: &str) -> Result<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(BATCH)
            .query_async(admin)
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

async fn run_variant(
    ctx: &Ctx,
    variant: usize,
    n: usize,
    raw: &Raw,
    locks: &LockService,
) -> Result<Left> {
    let mut admin = ctx.redis.connection().await?;
    let (dbsize_before, memory_before) =
        (dbsize(&mut admin).await?, used_memory(&mut admin).await?);
    let started = Instant::now();
    let ((), counts) = ctx.counted(lock_all(variant, n, raw, locks)).await?;
    let seconds = started.elapsed().as_secs_f64();
    let (dbsize_after, memory_after) = (dbsize(&mut admin).await?, used_memory(&mut admin).await?);

    let pattern = if variant == RAW {
        raw::key("bench:s6:*")
    } else {
        format!("{}{{bench:s6:*", ctx.config().prefix())
    };
    let keys = scan(&mut admin, &pattern).await?;
    let counters = if variant == RAW {
        0
    } else {
        let counters = format!("{}fence:{{*", ctx.config().prefix());
        scan(&mut admin, &counters).await?.len()
    };
    let mut kinds = BTreeMap::new();
    for key in &keys {
        let kind = match (key.split_once('{'), key.rsplit_once('}')) {
            (Some((prefix, _)), Some((_, rest))) => format!("{prefix}{{<name>}}{rest}"),
            _ => key.clone(),
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    let (mut pttl_ms, mut without_ttl) = (Samples::default(), 0);
    for batch in keys.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for key in batch {
            pipe.cmd("PTTL").arg(key);
        }
        let ttls: Vec<i64> = pipe.query_async(&mut admin).await?;
        for ttl in ttls {
            match ttl {
                -1 => without_ttl += 1,
                -2 => {} // expired meanwhile
                ms => pttl_ms.push_us(ms as f64),
            }
        }
    }
    let mut usage = Samples::default();
    for key in keys.iter().take(SAMPLE) {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut admin)
            .await?;
        if let Some(bytes) = bytes {
            usage.push_us(bytes as f64);
        }
    }
    for batch in keys.chunks(BATCH) {
        redis::cmd("UNLINK")
            .arg(batch)
            .query_async::<()>(&mut admin)
            .await?;
    }
    Ok(Left {
        seconds,
        counts,
        dbsize_delta: dbsize_after - dbsize_before,
        memory_delta: memory_after - memory_before,
        keys: keys.len(),
        kinds,
        pttl_ms,
        without_ttl,
        usage,
        counters,
    })
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Scenario> {
    let n = if ctx.quick { 5_000 } else { 100_000 };
    let raw = Raw::connect(&ctx.redis).await?;
    let locks = ctx.service().await?;
    // warm-up on other names: scripts loaded, connections up
    let mut warm = raw.clone();
    for i in 0..20 {
        let key = format!("bench:s6-warm-up:{i}");
        let (raw_key, token) = (raw::key(&key), raw::token());
        warm.try_acquire(&raw_key, &token).await?;
        warm.release(&raw_key, &token).await?;
        locks.lock(key).lease(LEASE).await?.release().await?;
    }
    let mut left = Vec::new();
    for variant in [RAW, OURS] {
        left.push(
            run_variant(ctx, variant, n, &raw, &locks)
                .await
                .map_err(|e| format!("S6 {}: {e}", NAMES[variant]))?,
        );
    }

    let mut scenario = Scenario {
        id: "S6",
        title: format!(
            "what locks leave on Redis: {TASKS} tasks lock and release {n} distinct keys once \
             each"
        ),
        headers: vec![
            "variant",
            "pairs/s",
            "cmds/pair",
            "keys left",
            "left/key locked",
            "DBSIZE delta",
            "used_memory delta B/key",
            "MEMORY USAGE B (sample)",
            "PTTL min s",
            "PTTL max s",
            "no TTL",
            "fence counters",
        ],
        rows: Vec::new(),
        notes: vec![format!(
            "keys left = keys under the variant's names after the run (SCAN), deleted \
             afterwards; used_memory delta = INFO memory before and after, over the {n} keys \
             locked; MEMORY USAGE = mean over up to {SAMPLE} of the keys left; fence counters \
             = the per-slot counters on the server after the run (not per lock key)"
        )],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({
            "distinct_keys": n,
        }),
    };
    for (i, l) in left.iter().enumerate() {
        let secs = |ms: f64| {
            if l.pttl_ms.len() == 0 {
                "-".into()
            } else {
                f1(ms / 1e3)
            }
        };
        scenario.rows.push(vec![
            NAMES[i].into(),
            format!("{:.0}", n as f64 / l.seconds),
            per_op(l.counts.commands(), n as u64),
            l.keys.to_string(),
            format!("{:.2}", l.keys as f64 / n as f64),
            l.dbsize_delta.to_string(),
            format!("{:.1}", l.memory_delta as f64 / n as f64),
            if l.usage.len() == 0 {
                "-".into()
            } else {
                format!("{:.0}", l.usage.mean())
            },
            secs(l.pttl_ms.pct(0.0)),
            secs(l.pttl_ms.max()),
            l.without_ttl.to_string(),
            if i == RAW {
                "-".into()
            } else {
                l.counters.to_string()
            },
        ]);
        scenario.variants.push(json!({
            "variant": NAMES[i],
            "distinct_keys": n,
            "seconds": l.seconds,
            "pairs_per_s": n as f64 / l.seconds,
            "keys_left": l.keys,
            "keys_left_per_key": l.keys as f64 / n as f64,
            "keys_left_by_kind": l.kinds,
            "dbsize_delta": l.dbsize_delta,
            "used_memory_delta_bytes": l.memory_delta,
            "used_memory_delta_bytes_per_key": l.memory_delta as f64 / n as f64,
            "memory_usage_sample_bytes": l.usage.mean(),
            "pttl_ms": {
                "n": l.pttl_ms.len(),
                "min": l.pttl_ms.pct(0.0),
                "median": l.pttl_ms.median(),
                "max": l.pttl_ms.max(),
            },
            "keys_without_ttl": l.without_ttl,
            "fence_counters": l.counters,
            "redis": l.counts.json(n as u64),
        }));
    }
    for (i, l) in left.iter().enumerate() {
        if !l.kinds.is_empty() {
            let kinds: Vec<String> = l
                .kinds
                .iter()
                .map(|(kind, count)| format!("{kind} x {count}"))
                .collect();
            scenario
                .notes
                .push(format!("{} leaves {}", NAMES[i], kinds.join(", ")));
        }
    }
    let ours = &left[OURS];
    scenario.targets.push(Target::new(
        format!(
            "{}: no key left per lock key after its last hold (fence counters: at most one per \
             cluster slot, 16,384)",
            NAMES[OURS]
        ),
        format!(
            "{} keys left under the lock names ({:.2} per key locked); {} fence counters",
            ours.keys,
            ours.keys as f64 / n as f64,
            ours.counters
        ),
        ours.keys == 0 && ours.counters <= 16_384,
    ));
    scenario.targets.push(Target::info(
        format!("{}: leaves no key", NAMES[RAW]),
        format!("{} keys left", left[RAW].keys),
        left[RAW].keys == 0,
    ));
    Ok(scenario)
}
