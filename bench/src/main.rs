//! `lock-bench`: measures `lock-runtime` against the raw-Redis floor, a Redisson-style lock and
//! the `rslock` crate, in the same run.
//!
//! It starts its own `redis-server` on a free loopback port (through the `lock-tests` harness;
//! with `--cluster`, the harness's cluster of 3 masters with 1 replica each) and runs the
//! scenarios below, each for our [`LockService`](lock_runtime::LockService) (and the
//! `#[distributed_lock]` path where it applies) and for two baselines written with the plain
//! `redis` crate:
//!
//! - raw ([`raw`]): one EVALSHA of `SET NX PX` to acquire, one EVALSHA of compare-and-delete to
//!   release, waiters retry at once after `tokio::task::yield_now()`: the floor;
//! - Redisson-style ([`redisson`]): a reentrant hash lock with Redisson's scripts, whose
//!   waiters subscribe to the lock's channel and sleep until a release message or the lock's
//!   remaining lease: the peer that waits without polling.
//!
//! and, in S1-S4, a third peer, the crate Rust users pick:
//!
//! - rslock ([`redlock`]): the `rslock` crate's Redlock `LockManager`, given the one server as
//!   its only node (with `--cluster`, the cluster as one), the same lease as its TTL and its
//!   default retries: a waiter tries again after a random sleep of up to 200 ms. Its figures
//!   are printed as informational checks: the targets compare ours with raw and Redisson-style.
//!
//! and, in S1 and S2, the raw lock with a fencing token:
//!
//! - fenced baseline ([`raw`]): raw's acquire script with what every fenced lock adds to an
//!   acquire, in the same script: the server clock and the token counter of the lock's slot
//!   (`max(last + 1, clock)`); one script call per acquire. It prices fencing itself, apart
//!   from any library, and is printed as an informational check.
//!
//! | | scenario | targets (issue #16) |
//! |---|---|---|
//! | S1 ([`uncontended_latency`]) | uncontended latency: 1 task, acquire + release on one key | median <= 1.05x raw, for `LockService` and the annotated fn |
//! | S2 ([`uncontended_throughput`]) | uncontended throughput: 64 tasks, each on its own key; ours with a lease and in watchdog mode | >= 0.90x raw with a lease and in watchdog mode (0.85x on a cluster); faster than Redisson-style |
//! | S3 ([`contention`]) | contention: 16 workers on one key, 1 instance x 16 and 4 instances x 4 | across 4 services x 4: >= 1.5x raw critical sections/s, <= 10 Redis commands per critical section, >= 80% hand-off |
//! | S4 ([`wakeup`]) | wake-up latency: time from a release to the blocked waiter's acquire | across services: median <= 1 PING round trip, p99 <= 2; <= 1 acquire attempt per wake-up; fewer commands per hand-off than Redisson-style |
//! | S5 ([`hot_item`]) | a hot item: 16 workers of 4 services buying from one key or 8 segments (`lock_examples::segmented`) | none: reported |
//! | S6 ([`leftovers`]) | what locks leave: lock and release 100,000 distinct keys (5,000 with `--quick`) | no key left per lock key after its last hold (fence counters: at most one per cluster slot) |
//!
//! and the lock family's figures (write lock, read-write lock, multi-key locks, semaphore):
//! S1F, S3W, S3RW, S3M, S3SEM, see [`family`]. Checks the issue sets no target for (in that
//! setup) are printed as informational: `(met)` / `(missed)`.
//!
//! Setups: the targets are same-run ratios, in the default setup (one server, tokio's
//! multi-thread runtime) and in a current-thread setup (`--current-thread`: one service per
//! process on a current-thread runtime, as every Rust peer runs there; the variants with
//! several instances, S3's 4 x 4 and S4's two sides, then run each instance on a current-thread
//! runtime of its own thread). `--cluster` runs S1-S3 on the cluster against the same
//! baselines there (commands are summed over the 3 masters; the channels are shard channels).
//!
//! Redis commands per operation come from `INFO commandstats` (commands run inside scripts
//! included), reset with `CONFIG RESETSTAT` around each measured phase.
//!
//! Output: a table per scenario with ratios to the baselines and the targets' verdicts, a
//! Targets list, then one `BENCH_JSON {...}` line per scenario (with the mode, the runtime and
//! the topology). Numbers are reported, never asserted.
//!
//! ```text
//! cargo run --release -p lock-bench                      # full run, a few minutes
//! cargo run --release -p lock-bench -- --quick           # seconds, for CI
//! cargo run --release -p lock-bench -- --current-thread --only S1,S2,S3,S4
//! cargo run --release -p lock-bench -- --cluster         # S1-S3 on a 3-master cluster
//! ```

mod annotated;
mod conn;
mod contention;
mod ctx;
mod error;
mod family;
mod hot_item;
mod leftovers;
mod raw;
mod redisson;
mod redlock;
mod relay;
mod report;
mod uncontended_latency;
mod uncontended_throughput;
mod wakeup;

use std::process::ExitCode;
use std::time::Instant;

use crate::ctx::{Ctx, Setup};
use crate::error::Result;
use crate::report::Scenario;

const USAGE: &str = "usage: lock-bench [--quick] [--current-thread] [--cluster] \
[--only S1,S2,S3,S4,S5,S6,S1F,S3W,S3RW,S3M,S3SEM]

  --quick           short runs (seconds), for CI; the numbers are noisier
  --only            run only these scenarios (e.g. while profiling one of them)
  --current-thread  a current-thread tokio runtime instead of the multi-thread one (variants
                    with several instances: a current-thread runtime per instance, each on a
                    thread of its own)
  --cluster         run S1, S2 and S3 (the default selection then) on a cluster of 3 masters
                    with 1 replica each instead of one redis-server";

fn main() -> ExitCode {
    let mut setup = Setup {
        quick: false,
        cluster: false,
        current_thread: false,
    };
    let mut only: Option<Vec<String>> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => setup.quick = true,
            "--cluster" => setup.cluster = true,
            "--current-thread" => setup.current_thread = true,
            "--only" => match args.next() {
                Some(list) => {
                    only = Some(list.split(',').map(|s| s.trim().to_uppercase()).collect());
                }
                None => {
                    eprintln!("--only needs a list such as S1,S3\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("unknown argument `{other}`\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let mut builder = if setup.current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if setup.cluster
        && let Some(other) = only
            .iter()
            .flatten()
            .find(|id| !CLUSTER_SCENARIOS.contains(&id.as_str()))
    {
        eprintln!("--cluster runs S1, S2 and S3 only, not {other}\n{USAGE}");
        return ExitCode::from(2);
    }
    let wanted = |id: &str| only.as_ref().is_none_or(|o| o.iter().any(|s| s == id));
    let selected: Vec<&'static str> = SCENARIOS
        .into_iter()
        .chain(family::SCENARIOS)
        .chain(LAST)
        .filter(|id| wanted(id) && (!setup.cluster || CLUSTER_SCENARIOS.contains(id)))
        .collect();
    if selected.is_empty() {
        eprintln!("--only names no scenario\n{USAGE}");
        return ExitCode::from(2);
    }
    match runtime.block_on(run(setup, &selected)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lock-bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

const SCENARIOS: [&str; 5] = ["S1", "S2", "S3", "S4", "S5"];
/// Runs after the family: it leaves (and then deletes) many keys.
const LAST: [&str; 1] = ["S6"];
const CLUSTER_SCENARIOS: [&str; 3] = ["S1", "S2", "S3"];

async fn run(setup: Setup, selected: &[&str]) -> Result<()> {
    let started = Instant::now();
    let ctx = Ctx::start(setup).await?;
    let topology = if setup.cluster {
        format!(
            "a cluster of {} masters with 1 replica each (seed {})",
            ctx.masters.len(),
            ctx.redis.url()
        )
    } else {
        format!("one server at {}", ctx.redis.url())
    };
    let runtime = if setup.current_thread {
        "tokio current-thread runtime (several instances of a variant: a current-thread \
         runtime each, on threads of their own)"
            .to_owned()
    } else {
        let workers = std::thread::available_parallelism().map_or(0, |n| n.get());
        format!("tokio multi-thread runtime with {workers} workers")
    };
    println!(
        "lock-bench ({}): redis-server {}, {topology}, {runtime}, {} build",
        setup.mode(),
        ctx.redis_version,
        if cfg!(debug_assertions) {
            "DEBUG (numbers not meaningful)"
        } else {
            "release"
        }
    );
    println!(
        "baselines, plain redis crate: raw = one multiplexed connection (a cluster connection \
         on a cluster); acquire = 1 EVALSHA of SET NX PX, release = 1 EVALSHA of \
         compare-and-delete; a waiter retries at once after tokio::task::yield_now(). \
         Redisson-style = a reentrant hash lock with Redisson's acquire / release scripts; a \
         waiter subscribes to the lock's channel (one subscriber connection per service) and \
         sleeps until a release message or the lock's remaining lease"
    );
    println!(
        "peer in {}: {} = the rslock crate 0.10 (Redlock) given this one {} as its only \
         node, the same 5 s lease as its TTL, its default retries (3 attempts per lock() call, \
         a random 0-200 ms sleep between two; acquire() calls lock() until it succeeds): a \
         waiter polls, no pub/sub; its ratios are informational",
        if setup.cluster { "S1-S3" } else { "S1-S4" },
        redlock::name(&ctx.redis),
        if setup.cluster { "cluster" } else { "server" }
    );
    let mut scenarios: Vec<Scenario> = Vec::new();
    for id in selected {
        let scenario = match *id {
            "S1" => uncontended_latency::run(&ctx).await?,
            "S2" => uncontended_throughput::run(&ctx).await?,
            "S3" => contention::run(&ctx).await?,
            "S4" => wakeup::run(&ctx).await?,
            "S6" => leftovers::run(&ctx).await?,
            id if family::SCENARIOS.contains(&id) => family::run(&ctx, id).await?,
            _ => hot_item::run(&ctx).await?,
        };
        scenario.print();
        scenarios.push(scenario);
    }

    println!("\nTargets");
    for s in &scenarios {
        for t in &s.targets {
            println!(
                "  {:<5} {:<8} {} ({})",
                s.id,
                t.verdict(),
                t.what,
                t.measured
            );
        }
    }
    println!("\ntotal time {:.1} s\n", started.elapsed().as_secs_f64());
    for s in &scenarios {
        println!("{}", s.json_line(&setup, &ctx.redis_version));
    }
    Ok(())
}
