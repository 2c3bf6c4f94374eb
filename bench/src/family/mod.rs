//! The lock family's figures: the write lock, the read-write lock under mixed load, multi-key
//! locks and the semaphore, each against a raw-Redis floor measured in the same run.
//!
//! | | scenario |
//! |---|---|
//! | S1F | uncontended latency of every kind: mutex, write, read, semaphore permit, a pair of keys |
//! | S3W | contention: 16 workers on ONE write lock (the shape of S3) |
//! | S3RW | 16 readers + 2 writers on one read-write lock, for a fixed time |
//! | S3M | 16 workers locking random pairs out of 8 accounts (`lock_all`) |
//! | S3SEM | 16 workers on a semaphore with 4 permits |
//!
//! The baselines: the plain `SET NX PX` lock of [`raw`](crate::raw) for the mutex-like kinds
//! (the write lock; one key after the other, in key order, for a pair), and for the semaphore
//! 4 such locks ("slots") tried in one script ([`RawSlots`]). Waiters spin with
//! `tokio::task::yield_now()`, as in the other scenarios.

mod contention;
mod latency;
mod rw;

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;
use redis::aio::MultiplexedConnection;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::ctx::{Counts, Ctx, LEASE};
use crate::error::Result;
use crate::report::Scenario;

/// The scenarios of this module, in the order they run.
pub(crate) const SCENARIOS: [&str; 5] = ["S1F", "S3W", "S3RW", "S3M", "S3SEM"];

/// Runs the scenario `id` (one of [`SCENARIOS`]).
pub(crate) async fn run(ctx: &Ctx, id: &str) -> Result<Scenario> {
    match id {
        "S1F" => latency::run(ctx).await,
        "S3W" => contention::run(ctx, contention::Access::Write).await,
        "S3RW" => rw::run(ctx).await,
        "S3M" => contention::run(ctx, contention::Access::Pair).await,
        "S3SEM" => contention::run(ctx, contention::Access::Permit).await,
        other => Err(format!("no family scenario `{other}`").into()),
    }
}

/// Permits of the semaphore scenarios.
const PERMITS: u32 = 4;

/// The raw floor of a semaphore: `PERMITS` `SET NX PX` locks ("slots"); an acquire is one
/// EVALSHA that takes the first free slot, a release the compare-and-delete of its slot.
#[derive(Clone)]
pub(crate) struct RawSlots {
    con: MultiplexedConnection,
    slots: Vec<String>,
}

static TAKE_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "for i, k in ipairs(KEYS) do \
           if redis.call('set', k, ARGV[1], 'NX', 'PX', ARGV[2]) then return i end \
         end return 0",
    )
});

static FREE_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end \
         return 0",
    )
});

impl RawSlots {
    pub(crate) async fn connect(url: &str, name: &str) -> Result<RawSlots> {
        let con = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let slots = (0..PERMITS)
            .map(|i| format!("raw:{{{name}}}:{i}"))
            .collect();
        Ok(RawSlots { con, slots })
    }

    /// One attempt: the slot taken (1-based), 0 when all were held.
    pub(crate) async fn try_acquire(&mut self, token: &str) -> Result<usize> {
        let mut call = TAKE_SLOT.prepare_invoke();
        for slot in &self.slots {
            call.key(slot);
        }
        let slot: i64 = call
            .arg(token)
            .arg(LEASE.as_millis() as u64)
            .invoke_async(&mut self.con)
            .await?;
        Ok(usize::try_from(slot).unwrap_or(0))
    }

    /// Spins (yielding) until a slot is taken.
    pub(crate) async fn acquire(&mut self, token: &str) -> Result<usize> {
        let started = Instant::now();
        loop {
            let slot = self.try_acquire(token).await?;
            if slot > 0 {
                return Ok(slot);
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err("baseline semaphore: no slot within 30 s".into());
            }
            tokio::task::yield_now().await;
        }
    }

    /// Compare-and-delete of the slot; an error when it was not held with `token`.
    pub(crate) async fn release(&mut self, slot: usize, token: &str) -> Result<()> {
        let key = &self.slots[slot - 1];
        let deleted: i64 = FREE_SLOT
            .key(key)
            .arg(token)
            .invoke_async(&mut self.con)
            .await?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(format!("baseline semaphore: slot `{key}` was not held by {token}").into())
        }
    }
}

/// Workers run together: the seconds from the start signal until the last one finished, what
/// each returned, and the Redis counters over that time.
pub(crate) struct Run<W> {
    pub(crate) seconds: f64,
    pub(crate) results: Vec<W>,
    pub(crate) counts: Counts,
}

/// Spawns `workers` workers (`make(i)` builds worker `i`), lets them start together and waits
/// for all; the counters are reset just before the start.
pub(crate) async fn run_workers<W, F, Fut>(ctx: &Ctx, workers: usize, mut make: F) -> Result<Run<W>>
where
    W: Send + 'static,
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<W>> + Send + 'static,
{
    let start = Arc::new(Barrier::new(workers + 1));
    let mut set = JoinSet::new();
    for worker in 0..workers {
        let work = make(worker);
        let start = start.clone();
        set.spawn(async move {
            start.wait().await;
            work.await
        });
    }
    ctx.reset()?;
    let started = Instant::now();
    start.wait().await;
    let mut results = Vec::with_capacity(workers);
    while let Some(done) = set.join_next().await {
        results.push(done??);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Run {
        seconds,
        results,
        counts: ctx.read()?,
    })
}

/// A small deterministic generator (xorshift64*), so every variant sees the same choices.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) % n
    }

    /// Two different numbers below `n`, smaller first.
    pub(crate) fn pair(&mut self, n: u64) -> (u64, u64) {
        let a = self.below(n);
        let mut b = self.below(n - 1);
        if b >= a {
            b += 1;
        }
        (a.min(b), a.max(b))
    }
}

/// Milliseconds with two decimals, from microseconds.
pub(crate) fn ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

/// The commands of a variant per operation, largest first, for a note: `evalsha 1.00, ...`.
pub(crate) fn breakdown(counts: &Counts, ops: u64) -> String {
    let json = counts.json(ops);
    let mut by: Vec<(String, f64)> = json["by_command_per_op"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    by.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    by.iter()
        .filter(|(_, n)| *n > 0.0)
        .map(|(k, n)| format!("{k} {n:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_distinct_and_ordered() {
        let mut rng = Rng::new(7);
        for _ in 0..1000 {
            let (a, b) = rng.pair(8);
            assert!(a < b && b < 8);
        }
    }
}
