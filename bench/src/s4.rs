//! S4, wake-up latency: one holder, one blocked waiter; the time from the holder's release
//! returning to the waiter's acquire returning (negative when the waiter got the lock before
//! the holder saw the release's reply).
//!
//! Variants: holder and waiter in different `LockService`s (the wake-up crosses pub/sub), in
//! the same service (the release hands the lock to the waiter in its script), and the spinning
//! baseline on two connections. Before each hand-off the waiter is seen blocked (for us: its
//! service registered in the lock's waiting set on Redis, which the probe clears before the
//! holder locks; for the baseline: an attempt failed), then the holder keeps the lock 1 ms
//! more. PING round trips are sampled between hand-offs in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockService;
use serde_json::json;

use crate::ctx::{Counts, Ctx, LEASE, Result};
use crate::raw::{self, Raw};
use crate::report::{Samples, Scenario, Target, f1, per_op, ratio};

const NAMES: [&str; 3] = [
    "LockService, 2 services (pub/sub)",
    "LockService, same service",
    "baseline (raw redis, spin)",
];
const PINGS_PER_HANDOFF: usize = 5;
/// The S4 target: median wake-up within this many PING round trips.
const TARGET_RTTS: f64 = 3.0;
const HOLD_AFTER_BLOCKED: Duration = Duration::from_millis(1);
const PROBE_LIMIT: Duration = Duration::from_secs(5);

fn elapsed_between(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1e6
    } else {
        -((from - to).as_secs_f64() * 1e6)
    }
}

/// The wake-up of one hand-off in us: from the release returning, and from the release call.
type Wake = (f64, f64);

/// One hand-off between two of our services (possibly the same one).
async fn lib_handoff(holder: &LockService, waiter: &LockService, probe: &mut Raw) -> Result<Wake> {
    const KEY: &str = "bench:s4";
    // A service that got the lock by hand-off stays registered as waiting for a while; clear
    // that so the probe below sees this hand-off's waiter.
    let queue = "lock:{bench:s4}:wq";
    probe.unlink(queue).await?;
    let guard = holder
        .lock(KEY)
        .lease(LEASE)
        .wait(Duration::from_secs(2))
        .await?;
    let waiting = waiter.clone();
    let task = tokio::spawn(async move {
        let guard = waiting
            .lock(KEY)
            .lease(LEASE)
            .wait(Duration::from_secs(10))
            .await?;
        let acquired = Instant::now();
        guard.release().await?;
        Ok::<_, crate::ctx::BoxError>(acquired)
    });
    // A waiter of another service registers in the lock's waiting set when its attempt fails;
    // a waiter of the holder's own service waits in the local line without asking Redis.
    let same_service = std::ptr::eq(holder, waiter);
    let asked = Instant::now();
    while !(if same_service {
        waiter.inspect(KEY).await?.local_waiters == 1
    } else {
        probe.key_type(queue).await? == "zset"
    }) {
        if asked.elapsed() > PROBE_LIMIT {
            return Err("S4: the waiter never registered as waiting".into());
        }
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(HOLD_AFTER_BLOCKED).await;
    let called = Instant::now();
    guard.release().await?;
    let released = Instant::now();
    let acquired = task.await??;
    Ok((
        elapsed_between(released, acquired),
        elapsed_between(called, acquired),
    ))
}

/// One hand-off between two baseline connections; the waiter spins.
async fn raw_handoff(holder: &mut Raw, waiter: &Raw) -> Result<Wake> {
    let key = raw::key("bench:s4");
    let token = raw::token();
    if !holder.try_acquire(&key, &token).await? {
        return Err("S4 baseline: the key was held".into());
    }
    let blocked = Arc::new(AtomicBool::new(false));
    let (mut spinner, flag, waiter_key) = (waiter.clone(), blocked.clone(), key.clone());
    let task = tokio::spawn(async move {
        let token = raw::token();
        while !spinner.try_acquire(&waiter_key, &token).await? {
            flag.store(true, Ordering::SeqCst);
            tokio::task::yield_now().await;
        }
        let acquired = Instant::now();
        spinner.release(&waiter_key, &token).await?;
        Ok::<_, crate::ctx::BoxError>(acquired)
    });
    let asked = Instant::now();
    while !blocked.load(Ordering::SeqCst) {
        if asked.elapsed() > PROBE_LIMIT {
            return Err("S4 baseline: the waiter never tried".into());
        }
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(HOLD_AFTER_BLOCKED).await;
    let called = Instant::now();
    holder.release(&key, &token).await?;
    let released = Instant::now();
    let acquired = task.await??;
    Ok((
        elapsed_between(released, acquired),
        elapsed_between(called, acquired),
    ))
}

struct Services {
    a: LockService,
    b: LockService,
    holder: Raw,
    waiter: Raw,
    probe: Raw,
}

impl Services {
    async fn handoff(&mut self, variant: usize) -> Result<Wake> {
        match variant {
            0 => lib_handoff(&self.a, &self.b, &mut self.probe).await,
            1 => lib_handoff(&self.a, &self.a, &mut self.probe).await,
            _ => raw_handoff(&mut self.holder, &self.waiter).await,
        }
    }
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Scenario> {
    let handoffs = if ctx.quick { 20 } else { 200 };
    let mut s = Services {
        a: ctx.service().await?,
        b: ctx.service().await?,
        holder: Raw::connect(&ctx.url).await?,
        waiter: Raw::connect(&ctx.url).await?,
        probe: Raw::connect(&ctx.url).await?,
    };
    let mut ping = Raw::connect(&ctx.url).await?;
    for variant in 0..NAMES.len() {
        for _ in 0..5 {
            s.handoff(variant).await?;
        }
    }
    let mut wake = vec![Samples::default(); NAMES.len()];
    let mut from_call = vec![Samples::default(); NAMES.len()];
    let mut counts = vec![Counts::default(); NAMES.len()];
    let mut rtt = Samples::default();
    let rounds = 10;
    for round in 0..rounds {
        for i in 0..NAMES.len() {
            let variant = (round + i) % NAMES.len();
            let (mut samples, mut call_samples) = (Samples::default(), Samples::default());
            ctx.reset()?;
            for _ in 0..handoffs / rounds {
                for _ in 0..PINGS_PER_HANDOFF {
                    let t = Instant::now();
                    ping.ping().await?;
                    rtt.push(t.elapsed());
                }
                let (from_return, from_start) = s.handoff(variant).await?;
                samples.push_us(from_return);
                call_samples.push_us(from_start);
            }
            counts[variant].add(&ctx.read()?);
            wake[variant].extend(&samples);
            from_call[variant].extend(&call_samples);
        }
    }

    let rtt_median = rtt.median();
    let mut scenario = Scenario {
        id: "S4",
        title: format!(
            "wake-up latency: one holder, one blocked waiter, {} hand-offs per variant; \
             PING round trip in this run: median {} us, p99 {} us",
            wake[0].len(),
            f1(rtt_median),
            f1(rtt.pct(0.99))
        ),
        headers: vec![
            "variant",
            "median us",
            "p99 us",
            "median RTTs",
            "p99 RTTs",
            "from release call: median us",
            "median RTTs",
            "cmds/hand-off",
            "round trips/hand-off",
        ],
        rows: Vec::new(),
        notes: vec![
            "median/p99 = from the holder's release returning to the waiter's acquire \
             returning (the target's measure); from release call = from calling release"
                .into(),
            format!(
                "per hand-off: holder acquire + waiter's failed attempt(s) + release + waiter \
             acquire + waiter release; the baseline spins during the {HOLD_AFTER_BLOCKED:?} \
             hold after the waiter was seen blocked"
            ),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({"ping_rtt": rtt.json()}),
    };
    for (i, name) in NAMES.iter().enumerate() {
        let (w, c, n) = (&wake[i], &counts[i], wake[i].len() as u64);
        scenario.rows.push(vec![
            (*name).into(),
            f1(w.median()),
            f1(w.pct(0.99)),
            format!("{:.2}", w.median() / rtt_median),
            format!("{:.2}", w.pct(0.99) / rtt_median),
            f1(from_call[i].median()),
            format!("{:.2}", from_call[i].median() / rtt_median),
            per_op(c.commands(), n),
            per_op(c.requests(), n),
        ]);
        scenario.variants.push(json!({
            "variant": name,
            "wakeup": w.json(),
            "median_in_ping_rtts": w.median() / rtt_median,
            "p99_in_ping_rtts": w.pct(0.99) / rtt_median,
            "from_release_call": from_call[i].json(),
            "from_release_call_median_in_ping_rtts": from_call[i].median() / rtt_median,
            "redis": c.json(n),
        }));
    }
    for (i, name) in NAMES.iter().enumerate().take(2) {
        let r = wake[i].median() / rtt_median;
        let suffix = if i == 0 { "" } else { " (informational)" };
        scenario.targets.push(Target::new(
            format!("{name}: median wake-up <= {TARGET_RTTS} PING RTTs{suffix}"),
            format!("{} RTTs", ratio(r).trim_end_matches('x')),
            r <= TARGET_RTTS,
        ));
    }
    Ok(scenario)
}
