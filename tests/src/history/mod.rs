//! A history checker for critical sections taken by several processes while faults are
//! injected, and a fenced resource that checks tokens.
//!
//! The checker is this module. The fenced resource the workers write to is in [`resource`], and
//! the table the fault tests print their figures in is in [`report`]; their items are
//! re-exported here.
//!
//! # What is recorded
//!
//! Workers (`lock-worker … history …`, see `src/bin/lock-worker.rs`) loop: lock, critical work,
//! one write to the fenced resource carrying `guard.fence()`, release. Each critical section
//! becomes one [`Section`]: the worker, the lock key, the owner, the fencing token, and its
//! `start` and `end` on one clock. The bookkeeping is the worker's own view of when it acts as
//! the holder:
//!
//! * a section **starts** when `lock().await` has returned `Ok` (the worker cannot act as holder
//!   earlier);
//! * it **ends** right before `release()` is called, or when the worker stops because the lock
//!   was lost (`guard.lost()` fired during the work, or `guard.is_lost()` was true before the
//!   write), whichever comes first. Everything the worker does as holder, the write included,
//!   lies between the two.
//!
//! Two sections **overlap** when one started before the other ended (`b.start < a.end` for
//! `a.start <= b.start`): two workers acted as holders at the same time. Sections are checked
//! per [`History`], and a history holds the sections that guard *one resource*, whatever lock
//! key they took: two workers that protect one resource with different lock keys are exactly
//! the mistake this must catch, so the lock keys are recorded but do not partition the check.
//!
//! # The family: what may overlap
//!
//! A section records what it held ([`Hold`]): the lock alone (a mutex, or the write hold of a
//! read-write lock), a read share, or permits of a semaphore. What may be open at the same time
//! follows from that, and each rule is a method of [`History`]:
//!
//! * **[`conflicts`](History::conflicts)**: two sections open at once of which at least one held
//!   the lock alone (a mutex holder or a writer with anyone), or one a read share and the other
//!   permits (two kinds on one resource). Read shares overlap read shares, permits permits. For a
//!   mutex every overlap is a conflict.
//! * **[`over_permits`](History::over_permits)**: moments at which the sections open together
//!   held more permits than the semaphore has. Permits count by the same bookkeeping as a mutex
//!   section, with no margin either way: from `lock()` returning to right before `release()` or
//!   to the moment the holder noticed the loss. No margin is needed on the safe side: a holder
//!   that keeps to its validity deadline (`lost()` fires at it, before Redis expires the grant)
//!   has ended its section before anyone can be granted the permit it held; none is allowed on
//!   the other, so a holder that acts past its lease (stopped) is counted, and flagged by
//!   `lost` as in a mutex overlap. When the sections disagree about the semaphore's size (a
//!   deploy that changes it: each grant fits the caller's count), the largest of the open
//!   sections' counts is the limit, which no run of grants can exceed.
//! * **[`torn_reads`](History::torn_reads)**: read shares that saw a write in progress. A writer
//!   of a read-write lock writes in two parts (see [`resource`]); a reader reads both parts at
//!   the start of its hold and again at its end, and a reader that saw the parts differ, or saw
//!   them change between its two looks, was not excluded from a writer.
//! * **[`half_writes`](History::half_writes)**: writers whose first part the resource accepted
//!   and whose second it refused: a newer writer wrote in between.
//! * **[`shared_tokens`](History::shared_tokens)** and
//!   **[`fence_inversions`](History::fence_inversions)**: every grant of every kind (read shares
//!   and permits included) has a token of its own, larger than that of every grant it excludes
//!   that ended before it started (two read shares, or two permits, granted close together may
//!   start their sections in the other order than Redis granted them).
//! * **[`unexplained_rejections`](History::unexplained_rejections)**: writes the resource refused
//!   although no grant with a larger token had written before. Permit holders of a semaphore
//!   with more than one permit hold at the same time, and a write of an older permit after a
//!   newer one's is refused - that is what its token is for, and it is explained; a refusal no
//!   newer grant explains means the tokens themselves went wrong (lost with a server, say).
//!
//! # One clock
//!
//! `start` and `end` are `CLOCK_MONOTONIC` in nanoseconds ([`monotonic_ns`]), read by every
//! worker process and by the test process on the one machine the tests run on. On Linux that
//! clock is system-wide (one counter since boot for every process, not per process), never
//! steps (NTP only slews it), and keeps counting while a process is stopped, so sections of
//! different processes and the fault times the test records compare directly, to the
//! nanosecond. Redis's `TIME` was the other candidate and is worse here: reading it costs a
//! round trip whose length the faults under test stretch (so the timestamp would be off by up
//! to the injected latency), the server under test is the one being stalled or killed, and
//! after a failover it is another server's clock. (The price: the checker needs all processes
//! on one host, which the harness guarantees - it only starts loopback topologies.)

pub mod report;
pub mod resource;

pub use report::{Row, table};
pub use resource::{FENCED_WRITE, FENCED_WRITE_END, LogEntry, ResourceCheck, resource_log_key};

#[cfg(test)]
use report::COLUMNS;

use std::collections::BTreeMap;
use std::time::Duration;

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on this machine (see the
/// module docs).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always available on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What became of the write of a section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// The resource accepted the token.
    Accepted,
    /// The resource refused the token as stale.
    Rejected,
    /// Not attempted: the worker saw the lock lost first.
    Skipped,
    /// The write failed (the resource did not answer).
    Failed,
    /// A writer of a read-write lock whose first part was accepted and whose second part was
    /// refused: a newer writer wrote in between (see the module docs).
    Half,
    /// None: a read share reads, it does not write.
    Reader,
}

impl Write {
    /// The letter the worker prints: `1`, `0`, `-`, `e`, `h`, `r`.
    pub fn as_str(self) -> &'static str {
        match self {
            Write::Accepted => "1",
            Write::Rejected => "0",
            Write::Skipped => "-",
            Write::Failed => "e",
            Write::Half => "h",
            Write::Reader => "r",
        }
    }

    fn parse(s: &str) -> Option<Write> {
        Some(match s {
            "1" => Write::Accepted,
            "0" => Write::Rejected,
            "-" => Write::Skipped,
            "e" => Write::Failed,
            "h" => Write::Half,
            "r" => Write::Reader,
            _ => return None,
        })
    }

    /// The resource accepted the write (its first part, for a writer of a read-write lock):
    /// it is in the resource's log as accepted.
    pub fn accepted(self) -> bool {
        matches!(self, Write::Accepted | Write::Half)
    }
}

/// What a section held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The lock alone: a mutex, or the write hold of a read-write lock.
    Exclusive,
    /// A read share of a read-write lock.
    Read,
    /// `count` permits of a semaphore of `of` permits (the count this worker passes).
    Permits {
        /// Permits this grant holds.
        count: u32,
        /// The semaphore's size, as this worker knows it.
        of: u32,
    },
}

impl Hold {
    /// What the worker prints: `x`, `r`, `p<count>/<of>`.
    pub fn as_string(self) -> String {
        match self {
            Hold::Exclusive => "x".to_owned(),
            Hold::Read => "r".to_owned(),
            Hold::Permits { count, of } => format!("p{count}/{of}"),
        }
    }

    fn parse(s: &str) -> Option<Hold> {
        Some(match s {
            "x" => Hold::Exclusive,
            "r" => Hold::Read,
            _ => {
                let (count, of) = s.strip_prefix('p')?.split_once('/')?;
                Hold::Permits {
                    count: count.parse().ok()?,
                    of: of.parse().ok()?,
                }
            }
        })
    }

    /// Whether two holds of these kinds may be open at the same time on one resource (permits
    /// only within the semaphore's size, see [`History::over_permits`]).
    pub fn may_share(self, other: Hold) -> bool {
        matches!(
            (self, other),
            (Hold::Read, Hold::Read) | (Hold::Permits { .. }, Hold::Permits { .. })
        )
    }
}

/// The two fields of the resource as a reader read them at one moment: `fence` (set by a
/// writer's first part) and `done` (its second); 0 for a field not written yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The `fence` field.
    pub fence: u64,
    /// The `done` field.
    pub done: u64,
}

impl Snapshot {
    /// A write was in progress (or left half done): the two parts differ.
    pub fn torn(self) -> bool {
        self.fence != self.done
    }

    fn parse(s: &str) -> Option<Snapshot> {
        let (fence, done) = s.split_once(':')?;
        Some(Snapshot {
            fence: fence.parse().ok()?,
            done: done.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.fence, self.done)
    }
}

/// What a read share saw: the resource at the start of its hold and at its end (`None` when
/// it did not look again: the hold was lost first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Right after `lock()` returned.
    pub first: Snapshot,
    /// Right before the section ended.
    pub last: Option<Snapshot>,
}

impl Seen {
    /// What the worker prints: `<fence>:<done>` or `<fence>:<done>/<fence>:<done>`.
    pub fn as_string(&self) -> String {
        match self.last {
            Some(last) => format!("{}/{last}", self.first),
            None => self.first.to_string(),
        }
    }

    fn parse(s: &str) -> Option<Seen> {
        let (first, last) = match s.split_once('/') {
            Some((first, last)) => (first, Some(Snapshot::parse(last)?)),
            None => (s, None),
        };
        Some(Seen {
            first: Snapshot::parse(first)?,
            last,
        })
    }

    /// The reader was not excluded from a writer: it saw a write in progress, or one made
    /// during its hold.
    pub fn torn(&self) -> bool {
        self.first.torn() || self.last.is_some_and(|l| l.torn() || l != self.first)
    }
}

/// One critical section, as a worker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The worker (process) that held the lock.
    pub worker: String,
    /// The lock key it took.
    pub key: String,
    /// The owner id of the grant.
    pub owner: String,
    /// The fencing token of the grant.
    pub fence: u64,
    /// When `lock()` returned (ns, [`monotonic_ns`]).
    pub start: u64,
    /// Right before `release()`, or when the loss was noticed (ns, [`monotonic_ns`]).
    pub end: u64,
    /// What became of its write.
    pub write: Write,
    /// `guard.is_lost()` at the end of the section: the library had told the holder (by then)
    /// that the lock was lost.
    pub lost: bool,
    /// What it held.
    pub hold: Hold,
    /// What a read share saw of the resource (`None` for the other holds, and for a read share
    /// that read nothing).
    pub seen: Option<Seen>,
}

/// A line a history worker prints, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `ready`: connected, about to take the first lock.
    Ready,
    /// `cs <owner> <fence> <start_ns> <end_ns> <write 1|0|-|e|h|r> <lost 0|1> [<hold x|r|pN/M>
    /// [<seen>|-]]` (a line without a hold is a mutex's: `x`).
    Section(Section),
    /// `err <op> <kind> <ns> [message]`: `op` is `lock`, `release` or `write`; `kind` an
    /// `ErrorKind` (`Backend`, `Timeout`, ...) or `Redis` for the resource; when the worker saw
    /// the error ([`monotonic_ns`]).
    Error {
        /// `lock`, `release` or `write`.
        op: String,
        /// The error kind.
        kind: String,
        /// When the call returned the error.
        at: u64,
    },
    /// `stop-point <fence>`: the worker holds the lock, checked it is not lost, and waits
    /// before its write so that the test can stop it there.
    StopPoint {
        /// The token of the hold.
        fence: u64,
    },
    /// `done`: the worker stopped taking locks.
    Done,
}

/// Parses a line of a history worker `worker` that locks `key`. `None` for a line that is
/// none of the [`Event`]s.
pub fn parse_line(worker: &str, key: &str, line: &str) -> Option<Event> {
    let mut words = line.split_whitespace();
    match words.next()? {
        "ready" => Some(Event::Ready),
        "done" => Some(Event::Done),
        "stop-point" => Some(Event::StopPoint {
            fence: words.next()?.parse().ok()?,
        }),
        "err" => Some(Event::Error {
            op: words.next()?.to_owned(),
            kind: words.next()?.to_owned(),
            at: words.next()?.parse().ok()?,
        }),
        "cs" => {
            let owner = words.next()?.to_owned();
            let fence = words.next()?.parse().ok()?;
            let start = words.next()?.parse().ok()?;
            let end = words.next()?.parse().ok()?;
            let write = Write::parse(words.next()?)?;
            let lost = match words.next()? {
                "1" => true,
                "0" => false,
                _ => return None,
            };
            let hold = match words.next() {
                Some(h) => Hold::parse(h)?,
                None => Hold::Exclusive,
            };
            let seen = match words.next() {
                None | Some("-") => None,
                Some(s) => Some(Seen::parse(s)?),
            };
            if words.next().is_some() {
                return None;
            }
            Some(Event::Section(Section {
                worker: worker.to_owned(),
                key: key.to_owned(),
                owner,
                fence,
                start,
                end,
                write,
                lost,
                hold,
                seen,
            }))
        }
        _ => None,
    }
}

/// Two sections that were open at the same time: indexes into [`History::sections`], `first`
/// started first (or at the same instant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlap {
    /// The section that started first.
    pub first: usize,
    /// The section that started while `first` was open.
    pub second: usize,
}

/// The critical sections that guard one resource, and the errors the workers saw.
#[derive(Debug, Clone, Default)]
pub struct History {
    sections: Vec<Section>,
    errors: BTreeMap<String, u64>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Records a section.
    pub fn record(&mut self, section: Section) {
        self.sections.push(section);
    }

    /// Counts an error of `kind` in operation `op`.
    pub fn error(&mut self, op: &str, kind: &str) {
        *self.errors.entry(format!("{op} {kind}")).or_default() += 1;
    }

    /// Records an event; returns `true` if it was a section or an error.
    pub fn apply(&mut self, event: &Event) -> bool {
        match event {
            Event::Section(s) => self.record(s.clone()),
            Event::Error { op, kind, .. } => self.error(op, kind),
            _ => return false,
        }
        true
    }

    /// The sections, in the order they were recorded.
    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// Errors by `"<op> <kind>"`.
    pub fn errors(&self) -> &BTreeMap<String, u64> {
        &self.errors
    }

    /// Number of grants (sections).
    pub fn grants(&self) -> usize {
        self.sections.len()
    }

    /// Every pair of sections that were open at the same time (see the module docs).
    pub fn overlaps(&self) -> Vec<Overlap> {
        let mut order: Vec<usize> = (0..self.sections.len()).collect();
        order.sort_by_key(|&i| (self.sections[i].start, self.sections[i].end));
        let mut found = Vec::new();
        for (n, &a) in order.iter().enumerate() {
            let open_until = self.sections[a].end;
            for &b in &order[n + 1..] {
                if self.sections[b].start >= open_until {
                    break;
                }
                found.push(Overlap {
                    first: a,
                    second: b,
                });
            }
        }
        found
    }

    /// The overlapping pairs that may not overlap: one of them held the lock alone, or the two
    /// held different kinds of shared holds ([`Hold::may_share`]). For a mutex, every overlap.
    pub fn conflicts(&self) -> Vec<Overlap> {
        self.overlaps()
            .into_iter()
            .filter(|o| {
                !self.sections[o.first]
                    .hold
                    .may_share(self.sections[o.second].hold)
            })
            .collect()
    }

    /// Every stretch of time in which the permit sections open together held more permits than
    /// the largest semaphore size among them (see the module docs). Sections are open from
    /// `start` up to, not including, `end`, as for [`overlaps`](Self::overlaps).
    pub fn over_permits(&self) -> Vec<Excess> {
        // (time, 0 = close | 1 = open, section): at one instant closes come first
        let mut events: Vec<(u64, u8, usize)> = Vec::new();
        for (i, s) in self.sections.iter().enumerate() {
            // a section that ended as it started was never open
            if let (Hold::Permits { .. }, true) = (s.hold, s.start < s.end) {
                events.push((s.start, 1, i));
                events.push((s.end, 0, i));
            }
        }
        events.sort_unstable();
        let mut open: Vec<usize> = Vec::new();
        let mut found = Vec::new();
        let mut current: Option<Excess> = None;
        for (at, kind, i) in events {
            if kind == 1 {
                open.push(i);
            } else {
                open.retain(|&o| o != i);
            }
            let (mut held, mut limit) = (0, 0);
            for &o in &open {
                if let Hold::Permits { count, of } = self.sections[o].hold {
                    held += count;
                    limit = limit.max(of);
                }
            }
            match (&mut current, held > limit) {
                (None, true) => {
                    current = Some(Excess {
                        from: at,
                        to: at,
                        held,
                        limit,
                        sections: open.clone(),
                    });
                }
                (Some(excess), true) => {
                    excess.held = excess.held.max(held);
                    excess.limit = excess.limit.max(limit);
                    if kind == 1 {
                        excess.sections.push(i);
                    }
                }
                (Some(_), false) => {
                    let mut excess = current.take().expect("an excess is open");
                    excess.to = at;
                    excess.sections.sort_unstable();
                    found.push(excess);
                }
                (None, false) => {}
            }
        }
        found
    }

    /// The most holds open at one moment, permits counted by their number: how much sharing a
    /// run exercised (read shares together, permits held together; 1 for a mutex).
    pub fn peak(&self) -> u32 {
        let mut events: Vec<(u64, i64)> = Vec::new();
        for s in &self.sections {
            let weight = match s.hold {
                Hold::Permits { count, .. } => i64::from(count),
                Hold::Exclusive | Hold::Read => 1,
            };
            events.push((s.start, weight));
            events.push((s.end, -weight));
        }
        // at one instant closes (negative) come first
        events.sort_unstable();
        let (mut now, mut most) = (0i64, 0i64);
        for (_, delta) in events {
            now += delta;
            most = most.max(now);
        }
        u32::try_from(most).unwrap_or(u32::MAX)
    }

    /// Read shares that saw a write in progress or one made during their hold
    /// ([`Seen::torn`]): indexes into [`sections`](Self::sections).
    pub fn torn_reads(&self) -> Vec<usize> {
        (0..self.sections.len())
            .filter(|&i| self.sections[i].seen.is_some_and(|seen| seen.torn()))
            .collect()
    }

    /// Writers whose write the resource took only half of ([`Write::Half`]).
    pub fn half_writes(&self) -> Vec<usize> {
        (0..self.sections.len())
            .filter(|&i| self.sections[i].write == Write::Half)
            .collect()
    }

    /// Pairs of sections with the same token. Every grant has a token of its own (workers
    /// never re-enter a hold, and a read share's token is issued for it).
    pub fn shared_tokens(&self) -> usize {
        let mut by_token: BTreeMap<u64, usize> = BTreeMap::new();
        for s in &self.sections {
            *by_token.entry(s.fence).or_default() += 1;
        }
        by_token.values().map(|&n| n * (n - 1) / 2).sum()
    }

    /// Sections whose write the resource refused (wholly or its second part) although no
    /// section with a greater token that started before this one ended had a write accepted:
    /// nothing newer the lock granted explains the refusal.
    pub fn unexplained_rejections(&self) -> Vec<usize> {
        (0..self.sections.len())
            .filter(|&i| {
                let s = &self.sections[i];
                matches!(s.write, Write::Rejected | Write::Half)
                    && !self.sections.iter().any(|newer| {
                        newer.fence > s.fence && newer.write.accepted() && newer.start < s.end
                    })
            })
            .collect()
    }

    /// Pairs of sections that exclude each other (not both read shares, not both permits)
    /// where one ended before the other started but has the greater or equal token: tokens that
    /// did not increase with the order of the grants.
    ///
    /// Holds that exclude each other are granted in the order of their sections: the later one
    /// could not be granted on Redis until the earlier was released there, after its section
    /// ended. Two read shares (or two permits) are not: a share granted first, whose reply was
    /// held up on its way, starts its section after a share granted later has ended its own;
    /// their tokens are in the order of the grants, not of the sections. Every grant's own
    /// token is checked by [`shared_tokens`](Self::shared_tokens) for those.
    pub fn fence_inversions(&self) -> usize {
        let mut order: Vec<&Section> = self.sections.iter().collect();
        order.sort_by_key(|s| s.start);
        let mut inversions = 0;
        for (n, later) in order.iter().enumerate() {
            inversions += order[..n]
                .iter()
                .filter(|earlier| {
                    earlier.end < later.start
                        && earlier.fence >= later.fence
                        && !earlier.hold.may_share(later.hold)
                })
                .count();
        }
        inversions
    }

    /// Nanoseconds from `at` to the first section that started after it (of `worker` only,
    /// when given); `None` when none did.
    pub fn first_grant_after(&self, at: u64, worker: Option<&str>) -> Option<u64> {
        self.sections
            .iter()
            .filter(|s| s.start > at && worker.is_none_or(|w| s.worker == w))
            .map(|s| s.start - at)
            .min()
    }

    /// When every worker that had a section was granted again after `at` (ns,
    /// [`monotonic_ns`]): the latest of their first grants after it; `None` when one was not.
    pub fn all_back_after(&self, at: u64) -> Option<u64> {
        let workers: std::collections::BTreeSet<&str> =
            self.sections.iter().map(|s| s.worker.as_str()).collect();
        workers
            .into_iter()
            .map(|w| self.first_grant_after(at, Some(w)).map(|d| at + d))
            .collect::<Option<Vec<u64>>>()
            .and_then(|backs| backs.into_iter().max())
    }

    /// Nanoseconds from `at` to the first section of a worker other than `worker` that started
    /// after it; `None` when none did.
    pub fn first_grant_to_others_after(&self, at: u64, worker: &str) -> Option<u64> {
        self.sections
            .iter()
            .filter(|s| s.start > at && s.worker != worker)
            .map(|s| s.start - at)
            .min()
    }

    /// Number of sections that started after `at`.
    pub fn grants_after(&self, at: u64) -> usize {
        self.sections.iter().filter(|s| s.start > at).count()
    }

    /// The most grants the other workers got between two consecutive grants of one worker
    /// (`None` without two grants of one worker): a measure of fairness. With every worker in
    /// line it is the number of other workers; a worker starved while the others kept taking
    /// the lock shows as a large count.
    pub fn longest_bypass(&self) -> Option<Bypass> {
        self.longest_bypass_after(0)
    }

    /// [`longest_bypass`](Self::longest_bypass) over the grants of each worker that started at
    /// `since` or later: fairness once every worker is back after a fault (`since`: the last
    /// of their first grants after it), without the race of who reaches a new master first.
    pub fn longest_bypass_after(&self, since: u64) -> Option<Bypass> {
        let mut starts: Vec<u64> = self.sections.iter().map(|s| s.start).collect();
        starts.sort_unstable();
        let mut by_worker: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for s in &self.sections {
            by_worker.entry(&s.worker).or_default().push(s.start);
        }
        let mut best: Option<Bypass> = None;
        for (worker, mut own) in by_worker {
            own.sort_unstable();
            for pair in own.windows(2).filter(|pair| pair[0] >= since) {
                let (from, to) = (pair[0], pair[1]);
                let others =
                    starts.partition_point(|&t| t < to) - starts.partition_point(|&t| t <= from);
                if best.as_ref().is_none_or(|b| others > b.others) {
                    best = Some(Bypass {
                        worker: worker.to_owned(),
                        others,
                        waited: Duration::from_nanos(to - from),
                    });
                }
            }
        }
        best
    }

    /// Sections whose write the resource rejected.
    pub fn rejected_writes(&self) -> usize {
        self.sections
            .iter()
            .filter(|s| s.write == Write::Rejected)
            .count()
    }
}

/// A stretch of time in which permit holders held more permits than the semaphore has
/// ([`History::over_permits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excess {
    /// When it began (ns, [`monotonic_ns`]).
    pub from: u64,
    /// When it ended.
    pub to: u64,
    /// The most permits held during it.
    pub held: u32,
    /// The semaphore's size (the largest among the open sections').
    pub limit: u32,
    /// Every section open during it, indexes into [`History::sections`].
    pub sections: Vec<usize>,
}

/// Grants to others between two consecutive grants of one worker ([`History::longest_bypass`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypass {
    /// The worker that waited.
    pub worker: String,
    /// Grants to the other workers meanwhile.
    pub others: usize,
    /// Between its two grants.
    pub waited: Duration,
}

#[cfg(test)]
mod tests;
