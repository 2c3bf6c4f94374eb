//! S3RW, a read-write lock under mixed load: 16 readers and 2 writers on ONE key, each in a
//! loop for a fixed time (in slices interleaved with the other variants, rotating the order).
//!
//! A reader's critical section reads a shared counter, yields and reads it again (a write in
//! between is a violation, as is a writer inside); a writer's is S3's non-atomic read / yield /
//! write of the counter (anyone else inside is a violation). Variants: the raw `SET NX PX`
//! lock and our mutex, where readers exclude each other too (what a read-write lock is for),
//! and our read-write lock in 1 service and in 2 (8 readers + 1 writer each); then the raw
//! lock, the mutex and the read-write lock again with read sections that sleep 1 ms (where
//! sharing them can pay).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockService;
use serde_json::json;

use super::{breakdown, ms, run_workers};
use crate::ctx::{Counts, Ctx, LEASE, within};
use crate::error::Result;
use crate::raw::{self, Raw};
use crate::report::{Samples, Scenario, cost_cells, ratio};

const READERS: usize = 16;
const WRITERS: usize = 2;
const KEY: &str = "bench:s3rw";
/// The longer read section of the second set of variants.
const READ_HOLD: Duration = Duration::from_millis(1);

#[derive(Clone, Copy)]
enum Kind {
    /// The raw lock, every worker exclusive, on one connection.
    Raw,
    /// Our mutex, every worker exclusive, in one service.
    Mutex,
    /// Our read-write lock in this many services.
    Rw { services: usize },
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Raw => "baseline (raw, all exclusive), 1 conn".into(),
            Kind::Mutex => "LockService mutex (all exclusive), 1 service".into(),
            Kind::Rw { services: 1 } => "read/write lock, 1 service".into(),
            Kind::Rw { services } => format!(
                "read/write lock, {services} services x {}+{}",
                READERS / services,
                WRITERS / services
            ),
        }
    }
}

#[derive(Clone)]
enum Via {
    Raw(Raw),
    Service(LockService),
}

#[derive(Default)]
struct Gate {
    counter: AtomicU64,
    readers_in: AtomicU64,
    writers_in: AtomicU64,
    most_readers: AtomicU64,
    violations: AtomicU64,
}

impl Gate {
    async fn read(&self, hold: Option<Duration>) {
        let inside = self.readers_in.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_readers.fetch_max(inside, Ordering::SeqCst);
        let seen = self.counter.load(Ordering::SeqCst);
        if self.writers_in.load(Ordering::SeqCst) > 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        match hold {
            Some(hold) => tokio::time::sleep(hold).await,
            None => tokio::task::yield_now().await,
        }
        if self.counter.load(Ordering::SeqCst) != seen {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.readers_in.fetch_sub(1, Ordering::SeqCst);
    }

    async fn write(&self) {
        let writers = self.writers_in.fetch_add(1, Ordering::SeqCst) + 1;
        if writers > 1 || self.readers_in.load(Ordering::SeqCst) > 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        let value = self.counter.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        self.counter.store(value + 1, Ordering::SeqCst);
        if self.readers_in.load(Ordering::SeqCst) > 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.writers_in.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a variant did, summed over its slices.
#[derive(Default)]
struct Outcome {
    seconds: f64,
    reads: u64,
    writes: u64,
    read_waits: Samples,
    write_waits: Samples,
    most_readers: u64,
    violations: u64,
    counter_exact: bool,
    counts: Counts,
}

#[derive(Default)]
struct Tally {
    reads: u64,
    writes: u64,
    read_waits: Samples,
    write_waits: Samples,
}

/// One critical section of a reader or a writer.
async fn once(
    via: &mut Via,
    kind: Kind,
    read_hold: Option<Duration>,
    gate: &Gate,
    writer: bool,
    tally: &mut Tally,
) -> Result<()> {
    let asked = Instant::now();
    let wait = Duration::from_secs(30);
    let critical = async {
        if writer {
            gate.write().await;
        } else {
            gate.read(read_hold).await;
        }
    };
    let waited = match (via, kind) {
        (Via::Raw(raw), _) => {
            let (key, token) = (raw::key(KEY), raw::token());
            raw.acquire(&key, &token).await?;
            let waited = asked.elapsed();
            critical.await;
            raw.release(&key, &token).await?;
            waited
        }
        (Via::Service(locks), Kind::Mutex) => {
            let guard = locks.lock(KEY).lease(LEASE).wait(wait).await?;
            let waited = asked.elapsed();
            critical.await;
            guard.release().await?;
            waited
        }
        (Via::Service(locks), _) if writer => {
            let guard = locks.write(KEY).lease(LEASE).wait(wait).await?;
            let waited = asked.elapsed();
            critical.await;
            guard.release().await?;
            waited
        }
        (Via::Service(locks), _) => {
            let guard = locks.read(KEY).lease(LEASE).wait(wait).await?;
            let waited = asked.elapsed();
            critical.await;
            guard.release().await?;
            waited
        }
    };
    if writer {
        tally.writes += 1;
        tally.write_waits.push(waited);
    } else {
        tally.reads += 1;
        tally.read_waits.push(waited);
    }
    Ok(())
}

async fn slice(
    ctx: &Ctx,
    (kind, read_hold): (Kind, Option<Duration>),
    length: Duration,
    total: &mut Outcome,
) -> Result<()> {
    let instances = match kind {
        Kind::Raw | Kind::Mutex => 1,
        Kind::Rw { services } => services,
    };
    let mut vias = Vec::new();
    for _ in 0..instances {
        vias.push(match kind {
            Kind::Raw => Via::Raw(Raw::connect(&ctx.redis).await?),
            _ => Via::Service(ctx.service().await?),
        });
    }
    let gate = Arc::new(Gate::default());
    let run = run_workers(ctx, READERS + WRITERS, |worker| {
        let mut via = vias[worker % instances].clone();
        let gate = gate.clone();
        let writer = worker >= READERS;
        async move {
            let end = Instant::now() + length;
            let mut tally = Tally::default();
            while Instant::now() < end {
                once(&mut via, kind, read_hold, &gate, writer, &mut tally).await?;
            }
            Ok(tally)
        }
    })
    .await?;
    total.seconds += run.seconds;
    let writes_before = total.writes;
    for t in &run.results {
        total.reads += t.reads;
        total.writes += t.writes;
        total.read_waits.extend(&t.read_waits);
        total.write_waits.extend(&t.write_waits);
    }
    total.most_readers = total
        .most_readers
        .max(gate.most_readers.load(Ordering::SeqCst));
    total.violations += gate.violations.load(Ordering::SeqCst);
    total.counter_exact &= gate.counter.load(Ordering::SeqCst) == total.writes - writes_before;
    total.counts.add(&run.counts);
    Ok(())
}

pub(super) async fn run(ctx: &Ctx) -> Result<Scenario> {
    let (slices, length) = if ctx.quick {
        (1, Duration::from_millis(200))
    } else {
        (3, Duration::from_secs(1))
    };
    // a read section of one yield (as S3's), and one that sleeps READ_HOLD
    let slow = Some(READ_HOLD);
    let kinds = [
        (Kind::Raw, None),
        (Kind::Mutex, None),
        (Kind::Rw { services: 1 }, None),
        (Kind::Rw { services: 2 }, None),
        (Kind::Raw, slow),
        (Kind::Mutex, slow),
        (Kind::Rw { services: 1 }, slow),
    ];
    let name = |(kind, hold): (Kind, Option<Duration>)| match hold {
        None => kind.name(),
        Some(hold) => format!("{}, {} ms reads", kind.name(), hold.as_millis()),
    };
    for kind in kinds {
        slice(
            ctx,
            kind,
            Duration::from_millis(50),
            &mut Outcome::default(),
        )
        .await?;
    }
    let mut outcomes: Vec<Outcome> = kinds
        .iter()
        .map(|_| Outcome {
            counter_exact: true,
            ..Outcome::default()
        })
        .collect();
    for round in 0..slices {
        for i in 0..kinds.len() {
            let variant = (round + i) % kinds.len();
            let kind = kinds[variant];
            let limit = length + Duration::from_secs(60);
            let what = format!("S3RW {}", name(kind));
            within(
                limit,
                what,
                slice(ctx, kind, length, &mut outcomes[variant]),
            )
            .await?;
        }
    }

    let mut scenario = Scenario {
        id: "S3RW",
        title: format!(
            "read-write lock: {READERS} readers + {WRITERS} writers on ONE key, each in a loop \
             for {:.1} s per variant ({slices} interleaved slices)",
            length.as_secs_f64() * slices as f64
        ),
        headers: vec![
            "variant",
            "reads/s",
            "writes/s",
            "reads vs baseline",
            "writer wait p99 ms",
            "writer wait max ms",
            "reader wait p99 ms",
            "most readers in",
            "violations",
            "cmds/op",
            "round trips/op",
            "client CPU us/op",
            "redis CPU us/op",
        ],
        rows: Vec::new(),
        notes: vec![
            "op = one read or write critical section; wait = from asking to acquired; reads vs \
             baseline: against the raw lock with the same read sections; \
             violations = a reader that saw a writer inside or the counter change, a writer \
             that saw anyone else inside (also the writers' counter checked exact)"
                .into(),
        ],
        targets: Vec::new(),
        variants: Vec::new(),
        extra: json!({"readers": READERS, "writers": WRITERS}),
    };
    let reads_per_s = |o: &Outcome| o.reads as f64 / o.seconds;
    let writes_per_s = |o: &Outcome| o.writes as f64 / o.seconds;
    for (&(kind, hold), o) in kinds.iter().zip(&outcomes) {
        // the raw lock with the same read sections
        let base = kinds
            .iter()
            .position(|&(k, h)| matches!(k, Kind::Raw) && h == hold)
            .map_or(&outcomes[0], |i| &outcomes[i]);
        let ops = o.reads + o.writes;
        let name = name((kind, hold));
        scenario.rows.push(
            vec![
                name.clone(),
                format!("{:.0}", reads_per_s(o)),
                format!("{:.0}", writes_per_s(o)),
                ratio(reads_per_s(o) / reads_per_s(base)),
                ms(o.write_waits.pct(0.99)),
                ms(o.write_waits.max()),
                ms(o.read_waits.pct(0.99)),
                o.most_readers.to_string(),
                format!(
                    "{}{}",
                    o.violations,
                    if o.violations == 0 && o.counter_exact {
                        " ok"
                    } else {
                        " WRONG"
                    }
                ),
            ]
            .into_iter()
            .chain(cost_cells(&o.counts, ops))
            .collect(),
        );
        if !matches!(kind, Kind::Raw) {
            scenario.notes.push(format!(
                "{name}: commands per op: {}",
                breakdown(&o.counts, ops)
            ));
        }
        scenario.variants.push(json!({
            "variant": name,
            "read_hold_ms": hold.map(|h| h.as_millis() as u64),
            "seconds": o.seconds,
            "reads": o.reads,
            "writes": o.writes,
            "reads_per_s": reads_per_s(o),
            "writes_per_s": writes_per_s(o),
            "ratio_reads_to_baseline": reads_per_s(o) / reads_per_s(base),
            "ratio_ops_to_baseline": (o.reads + o.writes) as f64 / o.seconds
                / ((base.reads + base.writes) as f64 / base.seconds),
            "writer_wait": o.write_waits.json(),
            "reader_wait": o.read_waits.json(),
            "most_readers_inside": o.most_readers,
            "violations": o.violations,
            "counter_exact": o.counter_exact,
            "redis": o.counts.json(ops),
        }));
    }
    Ok(scenario)
}
