//! S4, wake-up latency: one holder, one blocked waiter; the time from the holder's release
//! returning to the waiter's acquire returning (negative when the waiter got the lock before
//! the holder saw the release's reply).
//!
//! Variants: holder and waiter in different `LockService`s (the wake-up crosses pub/sub), in
//! the same service (the release hands the lock to the waiter in its script), the
//! Redisson-style baseline in two services (the waiter sleeps until the release's message), the
//! spinning raw baseline on two connections, and the rslock peer in two `LockManager`s, one node
//! each (no pub/sub: the waiter retries after rslock's random sleeps, with its defaults, see
//! [`redlock`]). Before each hand-off the waiter is seen blocked (for us: its
//! service registered in the lock's waiting set on Redis, which the probe clears before the
//! holder locks, or in the service's local line; Redisson-style: asleep on the channel; the
//! raw baseline: an attempt failed; rslock: Redis ran its `SET`, which failed), then the holder keeps the lock 1 ms more.
//! PING round trips are sampled between hand-offs in the same run. The holder's and the
//! waiter's side run on two peers (with `--current-thread`, two threads with a current-thread
//! runtime each).
//!
//! Acquire attempts per wake-up are counted in a separate phase, for the variants across two
//! instances: the waiter's connections then go through a relay that counts the script calls
//! (EVALSHA) and plain `SET`s sent through it ([`Relay`]), and the attempts of a hand-off are
//! the waiter's script calls (rslock: its `SET`s) from the holder's release call until the
//! waiter's acquire returned (its release comes after). The relay adds a hop, so no latency is taken from that phase.
//!
//! Targets, across services: median wake-up at most 1 PING round trip, p99 at most 2, at most
//! one acquire attempt per wake-up, and fewer Redis commands per hand-off than the
//! Redisson-style baseline. rslock's figures are printed as informational checks against the
//! same bounds.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockService;
use serde_json::json;
use tokio::runtime::Handle;

use crate::conn::Endpoint;
use crate::ctx::{Counts, Ctx, LEASE, Peer};
use crate::error::{BoxError, Result};
use crate::raw::{self, Raw};
use crate::redisson::Redisson;
use crate::redlock::{self, Rslock};
use crate::relay::Relay;
use crate::report::{Samples, Scenario, Target, f1, per_op};

const NAMES: [&str; 5] = [
    "LockService, 2 services (pub/sub)",
    "LockService, same service",
    "Redisson-style, 2 services (pub/sub)",
    "baseline (raw redis, spin)",
    "rslock (1 node), 2 managers (retry after sleep)",
];
const ACROSS: usize = 0;
const SAME: usize = 1;
const REDISSON: usize = 2;
const SPIN: usize = 3;
const RSLOCK: usize = 4;
/// The variants whose waiter's attempts are counted (holder and waiter in two instances).
const COUNTED: [usize; 4] = [ACROSS, REDISSON, SPIN, RSLOCK];
const KEY: &str = "bench:s4";
const PINGS_PER_HANDOFF: usize = 5;
/// The S4 targets: median and p99 wake-up within this many PING round trips.
const TARGET_MEDIAN_RTTS: f64 = 1.0;
const TARGET_P99_RTTS: f64 = 2.0;
const HOLD_AFTER_BLOCKED: Duration = Duration::from_millis(1);
const PROBE_LIMIT: Duration = Duration::from_secs(5);

fn elapsed_between(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1e6
    } else {
        -((from - to).as_secs_f64() * 1e6)
    }
}

/// One hand-off: the wake-up in us from the release returning and from the release call, and
/// the waiter's script calls from the release call to its grant (when counted).
struct Wake {
    from_return: f64,
    from_call: f64,
    attempts: Option<u64>,
}

/// Timestamps of the holder's release and of the waiter's grant, and the script counter at
/// the release call and at the grant.
struct Moments {
    called: Instant,
    released: Instant,
    acquired: Instant,
    before: Option<u64>,
    seen: Option<u64>,
}

impl Moments {
    fn wake(&self) -> Wake {
        Wake {
            from_return: elapsed_between(self.released, self.acquired),
            from_call: elapsed_between(self.called, self.acquired),
            attempts: self.before.zip(self.seen).map(|(b, s)| s - b),
        }
    }
}

/// Holds on for [`HOLD_AFTER_BLOCKED`] after the waiter blocked, then releases with `release`
/// and waits for the waiter (`waiter`: when it got the lock and the script calls counted then):
/// the moments of one hand-off.
async fn release_to_waiter(
    scripts: Option<Arc<AtomicU64>>,
    release: impl Future<Output = Result<()>>,
    waiter: tokio::task::JoinHandle<Result<(Instant, Option<u64>)>>,
) -> Result<Wake> {
    tokio::time::sleep(HOLD_AFTER_BLOCKED).await;
    let before = load(&scripts);
    let called = Instant::now();
    release.await?;
    let released = Instant::now();
    let (acquired, seen) = waiter.await??;
    Ok(Moments {
        called,
        released,
        acquired,
        before,
        seen,
    }
    .wake())
}

fn load(counter: &Option<Arc<AtomicU64>>) -> Option<u64> {
    counter.as_ref().map(|c| c.load(Ordering::SeqCst))
}

/// Both sides of every variant: the holder's on one peer, the waiter's on another.
#[derive(Clone)]
struct Sides {
    a: LockService,
    b: LockService,
    redisson_a: Redisson,
    redisson_b: Redisson,
    rslock_a: Rslock,
    rslock_b: Rslock,
    holder: Raw,
    waiter: Raw,
    probe: Raw,
    /// The waiter's peer runtime.
    waiter_rt: Handle,
    /// The script calls of the waiter's side (its connections go through a relay), if counted.
    scripts: Option<Arc<AtomicU64>>,
    /// The plain `SET`s of the waiter's side (rslock's attempts), if counted.
    sets: Option<Arc<AtomicU64>>,
}

impl Sides {
    async fn handoff(self, variant: usize) -> Result<Wake> {
        match variant {
            ACROSS => self.lib_handoff(false).await,
            SAME => self.lib_handoff(true).await,
            REDISSON => self.redisson_handoff().await,
            RSLOCK => self.rslock_handoff().await,
            _ => self.raw_handoff().await,
        }
    }

    /// One hand-off between two of our services, or within one.
    async fn lib_handoff(mut self, same_service: bool) -> Result<Wake> {
        // A service that got the lock by hand-off stays registered as waiting for a while;
        // clear that so the probe below sees this hand-off's waiter.
        let queue = "lock:{bench:s4}:wq";
        self.probe.unlink(queue).await?;
        let guard = self
            .a
            .lock(KEY)
            .lease(LEASE)
            .wait(Duration::from_secs(2))
            .await?;
        let waiting = if same_service {
            self.a.clone()
        } else {
            self.b.clone()
        };
        let scripts = self.scripts.clone();
        let task = self.waiter_rt.spawn(async move {
            let guard = waiting
                .lock(KEY)
                .lease(LEASE)
                .wait(Duration::from_secs(10))
                .await?;
            let acquired = Instant::now();
            let seen = load(&scripts);
            guard.release().await?;
            Ok::<_, BoxError>((acquired, seen))
        });
        // A waiter of another service registers in the lock's waiting set when its attempt
        // fails; a waiter of the holder's own service waits in the local line without asking
        // Redis.
        let asked = Instant::now();
        while !(if same_service {
            self.a.inspect(KEY).await?.local_waiters == 1
        } else {
            self.probe.key_type(queue).await? == "zset"
        }) {
            if asked.elapsed() > PROBE_LIMIT {
                return Err("S4: the waiter never registered as waiting".into());
            }
            tokio::task::yield_now().await;
        }
        let release = async {
            guard.release().await?;
            Ok(())
        };
        release_to_waiter(self.scripts.clone(), release, task).await
    }

    /// One hand-off between two Redisson-style services.
    async fn redisson_handoff(self) -> Result<Wake> {
        let owner = self.redisson_a.owner();
        let wait = Duration::from_secs(2);
        self.redisson_a.lock(KEY, &owner, LEASE, wait).await?;
        let (waiting, scripts) = (self.redisson_b.clone(), self.scripts.clone());
        let task = self.waiter_rt.spawn(async move {
            let owner = waiting.owner();
            waiting
                .lock(KEY, &owner, LEASE, Duration::from_secs(10))
                .await?;
            let acquired = Instant::now();
            let seen = load(&scripts);
            waiting.unlock(KEY, &owner, LEASE).await?;
            Ok::<_, BoxError>((acquired, seen))
        });
        let asked = Instant::now();
        while self.redisson_b.parked() == 0 {
            if asked.elapsed() > PROBE_LIMIT {
                return Err("S4 Redisson-style: the waiter never went to sleep".into());
            }
            tokio::task::yield_now().await;
        }
        let release = async {
            self.redisson_a.unlock(KEY, &owner, LEASE).await?;
            Ok(())
        };
        release_to_waiter(self.scripts.clone(), release, task).await
    }

    /// One hand-off between two rslock managers; the waiter retries after rslock's sleeps.
    async fn rslock_handoff(mut self) -> Result<Wake> {
        let guard = self.rslock_a.acquire(KEY).await?;
        // rslock tells nothing while it waits: the waiter is blocked once Redis ran its SET
        // (which failed, the key being held)
        let before = self.probe.calls("set").await?;
        let (waiting, sets) = (self.rslock_b.clone(), self.sets.clone());
        let task = self.waiter_rt.spawn(async move {
            let guard = waiting.acquire(KEY).await?;
            let acquired = Instant::now();
            let seen = load(&sets);
            guard.release().await;
            Ok::<_, BoxError>((acquired, seen))
        });
        let asked = Instant::now();
        while self.probe.calls("set").await? == before {
            if asked.elapsed() > PROBE_LIMIT {
                return Err("S4 rslock: the waiter never tried".into());
            }
            tokio::task::yield_now().await;
        }
        let release = async {
            guard.release().await;
            Ok(())
        };
        release_to_waiter(self.sets.clone(), release, task).await
    }

    /// One hand-off between two baseline connections; the waiter spins.
    async fn raw_handoff(mut self) -> Result<Wake> {
        let key = raw::key(KEY);
        let token = raw::token();
        if !self.holder.try_acquire(&key, &token).await? {
            return Err("S4 baseline: the key was held".into());
        }
        let blocked = Arc::new(AtomicBool::new(false));
        let (mut spinner, flag, waiter_key) = (self.waiter.clone(), blocked.clone(), key.clone());
        let scripts = self.scripts.clone();
        let task = self.waiter_rt.spawn(async move {
            let token = raw::token();
            while !spinner.try_acquire(&waiter_key, &token).await? {
                flag.store(true, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
            let acquired = Instant::now();
            let seen = load(&scripts);
            spinner.release(&waiter_key, &token).await?;
            Ok::<_, BoxError>((acquired, seen))
        });
        let asked = Instant::now();
        while !blocked.load(Ordering::SeqCst) {
            if asked.elapsed() > PROBE_LIMIT {
                return Err("S4 baseline: the waiter never tried".into());
            }
            tokio::task::yield_now().await;
        }
        let release = async {
            self.holder.release(&key, &token).await?;
            Ok(())
        };
        release_to_waiter(self.scripts.clone(), release, task).await
    }
}

/// Connects both sides: the holder's on `holder`, the waiter's on `waiter`, directly or
/// through `relay` (whose counters then count the waiter's script calls and `SET`s).
async fn connect(ctx: &Ctx, holder: &Peer, waiter: &Peer, relay: Option<&Relay>) -> Result<Sides> {
    let redis_b = match relay {
        Some(relay) => ctx.redis.via(relay.url()),
        None => ctx.redis.clone(),
    };
    let a = connect_side(holder, ctx.redis.clone()).await?;
    let b = connect_side(waiter, redis_b).await?;
    Ok(Sides {
        a: a.service,
        b: b.service,
        redisson_a: a.redisson,
        redisson_b: b.redisson,
        rslock_a: a.rslock,
        rslock_b: b.rslock,
        holder: a.raw,
        waiter: b.raw,
        probe: Raw::connect(&ctx.redis).await?,
        waiter_rt: waiter.handle().clone(),
        scripts: relay.map(Relay::scripts),
        sets: relay.map(Relay::sets),
    })
}

/// One side's instance of every variant.
struct Side {
    service: LockService,
    redisson: Redisson,
    raw: Raw,
    rslock: Rslock,
}

/// One side's service, Redisson-style service, raw connection and rslock manager, made on
/// `peer`'s runtime.
async fn connect_side(peer: &Peer, redis: Endpoint) -> Result<Side> {
    peer.run(async move {
        Ok(Side {
            service: LockService::connect(redis.config()).await?,
            redisson: Redisson::connect(&redis).await?,
            raw: Raw::connect(&redis).await?,
            rslock: Rslock::connect(&redis).await?,
        })
    })
    .await
}

/// How many of `n` hand-offs `variant` runs: all, but with `--quick` a third (at least one) for
/// rslock, whose every wake-up waits out one of its sleeps (up to 200 ms; the others' take
/// microseconds), so that the quick run stays quick.
fn share(ctx: &Ctx, variant: usize, n: usize) -> usize {
    if ctx.quick && variant == RSLOCK {
        (n / 3).max(1)
    } else {
        n
    }
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Scenario> {
    let (handoffs, counted) = if ctx.quick { (20, 10) } else { (200, 50) };
    let peers = ctx.peers(2)?;
    let (holder, waiter) = (&peers[0], &peers[1]);
    let sides = connect(ctx, holder, waiter, None).await?;
    let mut ping = Raw::connect(&ctx.redis).await?;
    for variant in 0..NAMES.len() {
        for _ in 0..share(ctx, variant, 5) {
            holder.run(sides.clone().handoff(variant)).await?;
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
            for _ in 0..share(ctx, variant, handoffs / rounds) {
                for _ in 0..PINGS_PER_HANDOFF {
                    let t = Instant::now();
                    ping.ping().await?;
                    rtt.push(t.elapsed());
                }
                let w = holder.run(sides.clone().handoff(variant)).await?;
                samples.push_us(w.from_return);
                call_samples.push_us(w.from_call);
            }
            let mut c = ctx.read()?;
            if variant == RSLOCK {
                c.sent_plain(&redlock::PLAIN);
            }
            counts[variant].add(&c);
            wake[variant].extend(&samples);
            from_call[variant].extend(&call_samples);
        }
    }
    drop(sides);

    // The attempts: the waiter's side through a counting relay.
    let relay = Relay::start(SocketAddr::from((Ipv4Addr::LOCALHOST, ctx.masters[0]))).await?;
    let sides = connect(ctx, holder, waiter, Some(&relay)).await?;
    let mut attempts = vec![Vec::<u64>::new(); NAMES.len()];
    for variant in COUNTED {
        holder.run(sides.clone().handoff(variant)).await?;
        for _ in 0..share(ctx, variant, counted) {
            let w = holder.run(sides.clone().handoff(variant)).await?;
            attempts[variant].extend(w.attempts);
        }
    }
    drop(sides);
    drop(relay);

    let rtt_median = rtt.median();
    let attempts_mean = |i: usize| {
        let a = &attempts[i];
        a.iter().sum::<u64>() as f64 / a.len().max(1) as f64
    };
    let attempts_max = |i: usize| attempts[i].iter().copied().max().unwrap_or(0);
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
            "attempts/wake-up: mean",
            "max",
        ],
        rows: Vec::new(),
        notes: vec![
            "median/p99 = from the holder's release returning to the waiter's acquire \
             returning (the target's measure); from release call = from calling release"
                .into(),
            format!(
                "per hand-off: holder acquire + waiter's failed attempt(s) (Redisson-style: and \
                 its subscribe, its attempt after it, its unsubscribe; rslock: a SET and a \
                 compare-and-delete EVALSHA each) + release + waiter acquire + waiter release; \
                 the baseline spins during the {HOLD_AFTER_BLOCKED:?} hold after the waiter was \
                 seen blocked"
            ),
            format!(
                "attempts/wake-up: the waiter's script calls (EVALSHA; rslock: its SETs) from the \
                 holder's release call until its acquire returned, counted by a relay in front \
                 of the waiter's connections in {counted} more hand-offs per variant (not \
                 timed); the same service's hand-off happens inside the release script"
            ),
            format!(
                "{}: rslock 0.10's LockManager::acquire with its defaults (3 attempts per lock() \
                 call, a random 0-200 ms sleep between two, none between two calls) and the 5 s \
                 lease as its TTL; it has no pub/sub: the waiter's next attempt after the \
                 release ends its wake-up; {} timed hand-offs, {} counted{}",
                NAMES[RSLOCK],
                wake[RSLOCK].len(),
                attempts[RSLOCK].len(),
                if ctx.quick {
                    " (--quick: a third of the others', its wake-ups wait out its sleeps)"
                } else {
                    ""
                }
            ),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({"ping_rtt": rtt.json()}),
    };
    for (i, name) in NAMES.iter().enumerate() {
        let (w, c, n) = (&wake[i], &counts[i], wake[i].len() as u64);
        let counted = !attempts[i].is_empty();
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
            if counted {
                format!("{:.2}", attempts_mean(i))
            } else {
                "-".into()
            },
            if counted {
                attempts_max(i).to_string()
            } else {
                "-".into()
            },
        ]);
        scenario.variants.push(json!({
            "variant": name,
            "wakeup": w.json(),
            "median_in_ping_rtts": w.median() / rtt_median,
            "p99_in_ping_rtts": w.pct(0.99) / rtt_median,
            "from_release_call": from_call[i].json(),
            "from_release_call_median_in_ping_rtts": from_call[i].median() / rtt_median,
            "redis": c.json(n),
            "attempts_per_wakeup": if counted {
                json!({
                    "n": attempts[i].len(),
                    "mean": attempts_mean(i),
                    "max": attempts_max(i),
                })
            } else {
                json!(null)
            },
        }));
    }
    let rtts = |x: f64| format!("{:.2} RTTs", x / rtt_median);
    let (median, p99) = (wake[ACROSS].median(), wake[ACROSS].pct(0.99));
    scenario.targets.push(Target::new(
        format!(
            "{}: median wake-up <= {TARGET_MEDIAN_RTTS} PING RTT",
            NAMES[ACROSS]
        ),
        rtts(median),
        median / rtt_median <= TARGET_MEDIAN_RTTS,
    ));
    scenario.targets.push(Target::new(
        format!(
            "{}: p99 wake-up <= {TARGET_P99_RTTS} PING RTTs",
            NAMES[ACROSS]
        ),
        rtts(p99),
        p99 / rtt_median <= TARGET_P99_RTTS,
    ));
    scenario.targets.push(Target::new(
        format!("{}: at most 1 acquire attempt per wake-up", NAMES[ACROSS]),
        format!(
            "max {}, mean {:.2} over {} hand-offs",
            attempts_max(ACROSS),
            attempts_mean(ACROSS),
            attempts[ACROSS].len()
        ),
        attempts_max(ACROSS) <= 1 && !attempts[ACROSS].is_empty(),
    ));
    let per_handoff = |i: usize| counts[i].commands() as f64 / wake[i].len().max(1) as f64;
    scenario.targets.push(Target::new(
        format!("{}: cmds/hand-off < {}", NAMES[ACROSS], NAMES[REDISSON]),
        format!("{:.2} vs {:.2}", per_handoff(ACROSS), per_handoff(REDISSON)),
        per_handoff(ACROSS) < per_handoff(REDISSON),
    ));
    let (median, p99) = (wake[RSLOCK].median(), wake[RSLOCK].pct(0.99));
    scenario.targets.push(Target::info(
        format!(
            "{}: median wake-up <= {TARGET_MEDIAN_RTTS} PING RTT",
            NAMES[RSLOCK]
        ),
        rtts(median),
        median / rtt_median <= TARGET_MEDIAN_RTTS,
    ));
    scenario.targets.push(Target::info(
        format!(
            "{}: p99 wake-up <= {TARGET_P99_RTTS} PING RTTs",
            NAMES[RSLOCK]
        ),
        rtts(p99),
        p99 / rtt_median <= TARGET_P99_RTTS,
    ));
    scenario.targets.push(Target::info(
        format!("{}: at most 1 acquire attempt per wake-up", NAMES[RSLOCK]),
        format!(
            "max {}, mean {:.2} over {} hand-offs",
            attempts_max(RSLOCK),
            attempts_mean(RSLOCK),
            attempts[RSLOCK].len()
        ),
        attempts_max(RSLOCK) <= 1 && !attempts[RSLOCK].is_empty(),
    ));
    let same = wake[SAME].median();
    scenario.targets.push(Target::info(
        format!(
            "{}: median wake-up <= {TARGET_MEDIAN_RTTS} PING RTT",
            NAMES[SAME]
        ),
        rtts(same),
        same / rtt_median <= TARGET_MEDIAN_RTTS,
    ));
    Ok(scenario)
}
