//! The figures the history checker (`lock_tests::history`) makes of what the workers of a
//! load (`super::load`) recorded: the [`Outcome`] of a finished scenario (grants, overlaps,
//! recovery after each fault, the row of the report table), the assertions every scenario
//! makes on it, and [`print_table`].

use std::collections::BTreeMap;
use std::time::Duration;

use lock_tests::history::{self, Excess, History, LogEntry, Overlap, ResourceCheck, Row};

use super::load::{Family, Fault, Recovery};

/// The figures of a finished scenario.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) family: Family,
    /// The seed of the workers' choices (see the module docs of `super::load`).
    pub(crate) seed: u64,
    pub(crate) row: Row,
    pub(crate) history: History,
    /// Pairs that overlapped and may not ([`History::conflicts`]).
    pub(crate) overlaps: Vec<Overlap>,
    /// More permits held than the semaphore has ([`History::over_permits`]).
    pub(crate) excess: Vec<Excess>,
    /// Read shares that saw a torn write ([`History::torn_reads`]).
    pub(crate) torn_reads: Vec<usize>,
    /// Writes left half done ([`History::half_writes`]).
    pub(crate) half_writes: Vec<usize>,
    /// Refused writes no newer grant explains ([`History::unexplained_rejections`]).
    pub(crate) unexplained: Vec<usize>,
    /// Pairs of grants with one token ([`History::shared_tokens`]).
    pub(crate) shared_tokens: usize,
    pub(crate) resource: ResourceCheck,
    pub(crate) fence_inversions: usize,
    /// First message of each error kind.
    pub(crate) samples: BTreeMap<String, String>,
    pub(crate) unparsed: Vec<String>,
    /// How long the load ran.
    pub(crate) ran: Duration,
    /// How long the faults lasted, summed (instantaneous ones count 0).
    pub(crate) faulted: Duration,
    /// The recovery time after each fault, in ms.
    pub(crate) recoveries: String,
    /// When the last fault ended (ns, [`monotonic_ns`](history::monotonic_ns)).
    pub(crate) last_fault_end: Option<u64>,
}

impl Outcome {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        scenario: &str,
        family: Family,
        seed: u64,
        history: History,
        faults: Vec<Fault>,
        log: &[LogEntry],
        samples: BTreeMap<String, String>,
        unparsed: Vec<String>,
        ran_ns: u64,
    ) -> Outcome {
        let overlaps = history.conflicts();
        let excess = history.over_permits();
        let (torn_reads, half_writes) = (history.torn_reads(), history.half_writes());
        let resource = ResourceCheck::of(log);
        let each: Vec<Option<u64>> = faults
            .iter()
            .map(|f| match &f.recovery {
                Recovery::AfterEnd(worker) => history.first_grant_after(f.end, worker.as_deref()),
                Recovery::OthersAfterBegin(holder) => {
                    history.first_grant_to_others_after(f.begin, holder)
                }
            })
            .collect();
        let recovery = (!faults.is_empty()).then(|| {
            let longest = if each.iter().any(Option::is_none) {
                None
            } else {
                each.iter()
                    .flatten()
                    .max()
                    .map(|&ns| Duration::from_nanos(ns))
            };
            (longest, faults.len())
        });
        let row = Row {
            scenario: scenario.to_owned(),
            faults: describe(&faults),
            grants: history.grants(),
            peak: history.peak(),
            overlaps: overlaps.len(),
            over_permits: matches!(family, Family::Semaphore { .. }).then_some(excess.len()),
            torn: matches!(family, Family::Rw { .. })
                .then_some(torn_reads.len() + half_writes.len()),
            stale_accepted: resource.stale_accepted,
            stale_rejected: resource.stale_rejected,
            errors: history.errors().clone(),
            recovery,
        };
        let faulted = faults.iter().map(|f| f.end - f.begin).sum();
        let last_fault_end = faults.iter().map(|f| f.end).max();
        let recoveries = each
            .iter()
            .map(|r| r.map_or("never".to_owned(), |ns| format!("{:.1}", ns as f64 / 1e6)))
            .collect::<Vec<_>>()
            .join(", ");
        Outcome {
            family,
            seed,
            row,
            unexplained: history.unexplained_rejections(),
            shared_tokens: history.shared_tokens(),
            excess,
            torn_reads,
            half_writes,
            fence_inversions: history.fence_inversions(),
            history,
            faulted: Duration::from_nanos(faulted),
            recoveries,
            last_fault_end,
            overlaps,
            resource,
            samples,
            unparsed,
            ran: Duration::from_nanos(ran_ns),
        }
    }

    /// Overlapping pairs in which neither holder had been told by the end of its section that
    /// the lock was lost, and stretches of too many permits in which none of the holders had.
    pub(crate) fn overlaps_unnoticed(&self) -> usize {
        let s = self.history.sections();
        let pairs = self
            .overlaps
            .iter()
            .filter(|o| !s[o.first].lost && !s[o.second].lost)
            .count();
        let stretches = self
            .excess
            .iter()
            .filter(|e| e.sections.iter().all(|&i| !s[i].lost))
            .count();
        pairs + stretches
    }

    /// Sections whose write the resource accepted, by the workers' account.
    pub(crate) fn accepted_by_workers(&self) -> usize {
        self.history
            .sections()
            .iter()
            .filter(|s| s.write.accepted())
            .count()
    }

    /// Read shares and write holds (of a read-write lock).
    fn reads_and_writes(&self) -> (usize, usize) {
        let s = self.history.sections();
        let reads = s.iter().filter(|s| s.hold == history::Hold::Read).count();
        (reads, s.len() - reads)
    }

    /// More figures, one line.
    pub(crate) fn notes(&self) -> String {
        let lost = self.history.sections().iter().filter(|s| s.lost).count();
        let mut by_worker: BTreeMap<&str, usize> = BTreeMap::new();
        for s in self.history.sections() {
            *by_worker.entry(&s.worker).or_default() += 1;
        }
        let by_worker = by_worker
            .iter()
            .map(|(w, n)| format!("{w} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let bypass = self.history.longest_bypass().map_or("-".to_owned(), |b| {
            format!(
                "{} ({} waited {:.2} s)",
                b.others,
                b.worker,
                b.waited.as_secs_f64()
            )
        });
        let kind = match self.family {
            Family::Mutex => String::new(),
            Family::Rw { .. } => {
                let (reads, writes) = self.reads_and_writes();
                format!(
                    "seed {}; {reads} read shares, {writes} writes; most holds at once {}; \
                     torn reads {}, writes left half done {}; ",
                    self.seed,
                    self.row.peak,
                    self.torn_reads.len(),
                    self.half_writes.len()
                )
            }
            Family::Semaphore { permits } => format!(
                "most permits held at once {} of {permits}; stretches over {permits} {}; \
                 writes refused {}, of them with no newer permit that wrote first {}; ",
                self.row.peak,
                self.excess.len(),
                self.resource.stale_rejected,
                self.unexplained.len()
            ),
        };
        format!(
            "{}: ran {:.1} s, faults lasted {:.1} s; {kind}grants by worker: {by_worker}; most \
             grants to others between two of one worker: {bypass}; recovery after each fault \
             (ms): {}; sections ending with the holder told lost: {lost}; overlaps or \
             stretches no holder was told of: {}; token inversions: {}; grants sharing a token: \
             {}; writes accepted: {} (workers' account {})",
            self.row.scenario,
            self.ran.as_secs_f64(),
            self.faulted.as_secs_f64(),
            self.recoveries,
            self.overlaps_unnoticed(),
            self.fence_inversions,
            self.shared_tokens,
            self.resource.accepted,
            self.accepted_by_workers(),
        )
    }

    /// Asserts what every scenario must show: no stale write accepted, and the workers' and
    /// the resource's accounts agree.
    pub(crate) fn assert_fenced(&self) {
        assert_eq!(
            self.resource.stale_accepted, 0,
            "{}: the resource accepted stale writes",
            self.row.scenario
        );
        assert_eq!(
            self.resource.accepted,
            self.accepted_by_workers(),
            "{}: the resource's log and the workers disagree on accepted writes",
            self.row.scenario
        );
        assert!(
            self.unparsed.is_empty(),
            "{}: workers printed unexpected lines: {:?}",
            self.row.scenario,
            self.unparsed
        );
    }

    /// No worker is passed over by more than `max_bypass` grants to others between two grants
    /// of its own: every waiting service hears the releases, also after the fault (a service
    /// whose wake-up subscription was lost keeps missing its turns while the others take the
    /// lock over and over). The permits of a semaphore of n are granted n at a time, so the
    /// others take n times as many in the same while: the bound is n times as large (a
    /// semaphore gives no turns to other services, and after a failover each worker finds the
    /// new master in its own time: 130 ms after the others cost a worker 28 grants).
    pub(crate) fn assert_fair(&self, max_bypass: usize) {
        self.assert_fair_since(0, max_bypass);
    }

    fn assert_fair_since(&self, since: u64, max_bypass: usize) {
        let max_bypass = match self.family {
            Family::Semaphore { permits } => max_bypass * permits as usize,
            Family::Mutex | Family::Rw { .. } => max_bypass,
        };
        if let Some(bypass) = self.history.longest_bypass_after(since) {
            assert!(
                bypass.others <= max_bypass,
                "{} (seed {}): {} waited {:?} while the others were granted the lock {} times",
                self.row.scenario,
                self.seed,
                bypass.worker,
                bypass.waited,
                bypass.others
            );
        }
    }

    /// [`assert_fair`](Self::assert_fair) after a failover, for the mutex: its releases give
    /// waiting services turns, so the others take few grants while one worker finds the new
    /// master. A read-write lock and a semaphore give no turns, and after a failover each
    /// worker finds the new master in its own time - up to a response timeout, when its call
    /// went to the dead master (one was granted again 520 ms after the others, which took 66
    /// read shares and writes meanwhile): a bound on grants would measure that race, not the
    /// lock. For them the scenarios wait until every worker was granted again instead.
    ///
    /// Counted from when every worker was granted again after the failover: who finds the new
    /// master first is a race too for the mutex (a worker whose call went to the dead master
    /// waits for its response timeout; one came back 570 ms after the others, which took 69
    /// grants meanwhile), and turns can only reach a service once it is registered on the new
    /// master. A service that keeps missing its turns from then on still shows.
    pub(crate) fn assert_fair_after_failover(&self, max_bypass: usize) {
        if self.family != Family::Mutex {
            return;
        }
        let since = self
            .last_fault_end
            .and_then(|end| self.history.all_back_after(end));
        let since = since.unwrap_or_else(|| {
            panic!(
                "{}: not every worker was granted again after the failover",
                self.row.scenario
            )
        });
        self.assert_fair_since(since, max_bypass);
    }

    /// What every scenario in which holders keep their leases must show, for every kind: no
    /// stale write accepted, at least `min_grants` grants; no two sections open together that
    /// may not be (a mutex holder or a writer with anyone); never more permits held than the
    /// semaphore has; no reader that saw a torn write, no write left half done; a token of its
    /// own for every grant, growing with the grants; no write refused (for a semaphore of more
    /// than one permit: none that a newer permit's write does not explain). And that the run
    /// exercised sharing, for the kinds that share: two read shares or two permits held at once.
    pub(crate) fn assert_leases_kept(&self, min_grants: usize) {
        self.assert_fenced();
        let scenario = format!("{} (seed {})", self.row.scenario, self.seed);
        assert!(
            self.row.grants >= min_grants,
            "{scenario}: only {} grants",
            self.row.grants
        );
        let s = self.history.sections();
        let shown: Vec<_> = self
            .overlaps
            .iter()
            .take(5)
            .map(|o| (&s[o.first], &s[o.second]))
            .collect();
        assert!(
            self.overlaps.is_empty(),
            "{scenario}: {} overlapping critical sections that exclude each other, e.g. \
             {shown:#?}",
            self.overlaps.len()
        );
        let shown: Vec<_> = self
            .excess
            .iter()
            .take(3)
            .map(|e| (e, e.sections.iter().map(|&i| &s[i]).collect::<Vec<_>>()))
            .collect();
        assert!(
            self.excess.is_empty(),
            "{scenario}: more permits held than the semaphore has, {} times, e.g. {shown:#?}",
            self.excess.len()
        );
        let shown: Vec<_> = self.torn_reads.iter().take(5).map(|&i| &s[i]).collect();
        assert!(
            self.torn_reads.is_empty(),
            "{scenario}: {} readers saw a torn write, e.g. {shown:#?}",
            self.torn_reads.len()
        );
        let shown: Vec<_> = self.half_writes.iter().take(5).map(|&i| &s[i]).collect();
        assert!(
            self.half_writes.is_empty(),
            "{scenario}: {} writes were left half done, e.g. {shown:#?}",
            self.half_writes.len()
        );
        let shown: Vec<_> = self.unexplained.iter().take(5).map(|&i| &s[i]).collect();
        assert!(
            self.unexplained.is_empty(),
            "{scenario}: {} writes refused with no newer grant that wrote first, e.g. {shown:#?}",
            self.unexplained.len()
        );
        if !self.family.concurrent_writers() {
            assert_eq!(
                self.resource.stale_rejected, 0,
                "{scenario}: writes were rejected as stale although no holder lost its lease",
            );
        }
        assert_eq!(
            self.fence_inversions, 0,
            "{scenario}: tokens did not grow with the grants",
        );
        assert_eq!(self.shared_tokens, 0, "{scenario}: grants shared a token");
        if self.family != Family::Mutex {
            assert!(
                self.row.peak >= 2,
                "{scenario}: no two holds were ever open together: the run did not exercise \
                 sharing"
            );
        }
    }
}

/// The faults, grouped by label: `label xN`.
fn describe(faults: &[Fault]) -> String {
    let mut counted: Vec<(&str, usize)> = Vec::new();
    for f in faults {
        match counted.iter_mut().find(|(l, _)| *l == f.label) {
            Some((_, n)) => *n += 1,
            None => counted.push((&f.label, 1)),
        }
    }
    if counted.is_empty() {
        return "none".to_owned();
    }
    counted
        .iter()
        .map(|(l, n)| {
            if *n == 1 {
                (*l).to_owned()
            } else {
                format!("{l} x{n}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Prints the table of `outcomes`, their notes and one sample message per error kind, in one
/// write.
pub(crate) fn print_table(outcomes: &[&Outcome]) {
    let rows: Vec<Row> = outcomes.iter().map(|o| o.row.clone()).collect();
    let mut text = String::from("\n");
    text.push_str(&history::table(&rows));
    for o in outcomes {
        text.push_str(&format!("  {}\n", o.notes()));
        for sample in o.samples.values() {
            let short: String = sample.chars().take(220).collect();
            text.push_str(&format!("    e.g. {short}\n"));
        }
    }
    print!("{text}");
}
