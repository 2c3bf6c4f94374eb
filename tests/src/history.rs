//! A history checker for critical sections taken by several processes while faults are
//! injected, and a fenced resource that checks tokens.
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
//!
//! # The fenced resource
//!
//! The data the lock protects is a Redis hash `res:{<id>}` (field `fence`: the highest token
//! accepted so far) with a log list `res:{<id>}:log` beside it (one hash tag, so both share a
//! slot anywhere). Workers write through [`FENCED_WRITE`], a script that accepts a write only
//! when its token is greater than the stored one and appends `<token> <worker> <1|0>` to the
//! log either way; Redis runs scripts one at a time, so the log is the order in which the
//! resource saw the writes. [`ResourceCheck`] reads it back:
//!
//! * **stale writes accepted**: accepted writes whose token is not greater than an earlier
//!   accepted one. The script makes this impossible by construction; it is counted so that a
//!   broken script (or a resource that lost its state) shows up rather than passes silently.
//! * **stale writes rejected**: writes the script refused. These are the interesting figure: a
//!   holder that woke up from a pause longer than its lease and wrote with its old token, after
//!   a newer holder had written. With leases kept, every write carries a greater token than
//!   the one before it (tokens increase with every grant, and no two holders overlap), so any
//!   rejection there means tokens were issued out of order.
//!
//! The resource lives on a `redis-server` of its own that the injected faults never touch (the
//! tests use the test binary's shared single server), not on the lock topology. A resource is
//! something else than the lock service - a database, a file store - and the fence check is
//! only as good as the resource's memory: on a lock server that is failed over or restarted
//! without persistence, the stored token would vanish with the lock data and the check would
//! accept anything afterwards, which says nothing about the lock. On a stalled lock server the
//! writes would stall too and stretch the sections with a fault the lock never sees.
//!
//! # Figures
//!
//! A [`Row`] per scenario (faults injected, grants, overlaps, stale writes accepted and
//! rejected, errors by kind, recovery time) and [`table`] to print them. Recovery time is
//! measured per fault from its end (for an instantaneous fault such as a kill or a dropped
//! reply: the moment it happened) to the first section that started after it (by the worker
//! the fault hit, when it hit only one); the row shows the longest. A stopped holder is the
//! exception: the lock recovers when another worker gets it, so that is measured from the
//! moment the holder was stopped to the first grant to another worker.

use std::collections::BTreeMap;
use std::fmt::Write as _;
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

/// The token-checking write: `KEYS[1]` the resource hash, `KEYS[2]` its log list, `ARGV[1]`
/// the fencing token (decimal), `ARGV[2]` the writer's name. Accepts (sets `fence` and
/// `writer`, returns 1) only when the token is greater than the stored `fence`, else returns
/// 0; appends `<token> <writer> <1|0>` to the log either way.
///
/// Tokens are compared as decimal strings (longer is greater, equal lengths compare
/// bytewise), which is exact for every `u64`; Lua numbers are doubles and would not be.
pub const FENCED_WRITE: &str = r"
local token = ARGV[1]
if not string.match(token, '^[1-9]%d*$') then
  return redis.error_reply('fenced write: token must be a positive decimal, got ' .. token)
end
local stored = redis.call('HGET', KEYS[1], 'fence') or '0'
local newer = #token > #stored or (#token == #stored and token > stored)
if newer then
  redis.call('HSET', KEYS[1], 'fence', token, 'writer', ARGV[2])
end
redis.call('RPUSH', KEYS[2], token .. ' ' .. ARGV[2] .. ' ' .. (newer and '1' or '0'))
if newer then return 1 end
return 0
";

/// The key of the log list of the resource `resource` (`res:{id}` → `res:{id}:log`).
pub fn resource_log_key(resource: &str) -> String {
    format!("{resource}:log")
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
}

impl Write {
    /// The letter the worker prints: `1`, `0`, `-`, `e`.
    pub fn as_str(self) -> &'static str {
        match self {
            Write::Accepted => "1",
            Write::Rejected => "0",
            Write::Skipped => "-",
            Write::Failed => "e",
        }
    }

    fn parse(s: &str) -> Option<Write> {
        Some(match s {
            "1" => Write::Accepted,
            "0" => Write::Rejected,
            "-" => Write::Skipped,
            "e" => Write::Failed,
            _ => return None,
        })
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
}

/// A line a history worker prints, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `ready`: connected, about to take the first lock.
    Ready,
    /// `cs <owner> <fence> <start_ns> <end_ns> <write 1|0|-|e> <lost 0|1>`.
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
            Some(Event::Section(Section {
                worker: worker.to_owned(),
                key: key.to_owned(),
                owner,
                fence,
                start,
                end,
                write,
                lost,
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

    /// Pairs of sections where one ended before the other started but has the greater or equal
    /// token: tokens that did not increase with the order of the grants.
    pub fn fence_inversions(&self) -> usize {
        let mut order: Vec<&Section> = self.sections.iter().collect();
        order.sort_by_key(|s| s.start);
        let mut inversions = 0;
        for (n, later) in order.iter().enumerate() {
            inversions += order[..n]
                .iter()
                .filter(|earlier| earlier.end < later.start && earlier.fence >= later.fence)
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
        let mut starts: Vec<u64> = self.sections.iter().map(|s| s.start).collect();
        starts.sort_unstable();
        let mut by_worker: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for s in &self.sections {
            by_worker.entry(&s.worker).or_default().push(s.start);
        }
        let mut best: Option<Bypass> = None;
        for (worker, mut own) in by_worker {
            own.sort_unstable();
            for pair in own.windows(2) {
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

/// One write in the resource's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The token it carried.
    pub fence: u64,
    /// The writer's name.
    pub worker: String,
    /// Whether the script accepted it.
    pub accepted: bool,
}

impl LogEntry {
    /// Parses `<token> <worker> <1|0>`.
    pub fn parse(line: &str) -> Option<LogEntry> {
        let mut words = line.split(' ');
        let fence = words.next()?.parse().ok()?;
        let worker = words.next()?.to_owned();
        let accepted = match words.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        Some(LogEntry {
            fence,
            worker,
            accepted,
        })
    }
}

/// What the fenced resource's log says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceCheck {
    /// Writes accepted.
    pub accepted: usize,
    /// Accepted writes whose token was not greater than an earlier accepted one.
    pub stale_accepted: usize,
    /// Writes the script refused as stale.
    pub stale_rejected: usize,
}

impl ResourceCheck {
    /// Checks a log, in the order the resource saw the writes.
    pub fn of(log: &[LogEntry]) -> ResourceCheck {
        let mut check = ResourceCheck::default();
        let mut highest = 0;
        for entry in log {
            if entry.accepted {
                check.accepted += 1;
                if entry.fence <= highest {
                    check.stale_accepted += 1;
                }
                highest = highest.max(entry.fence);
            } else {
                check.stale_rejected += 1;
            }
        }
        check
    }
}

/// One line of the fault table.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// The scenario.
    pub scenario: String,
    /// The faults injected, e.g. `DEBUG SLEEP 0.5 s x3`.
    pub faults: String,
    /// Sections recorded.
    pub grants: usize,
    /// Pairs of overlapping sections.
    pub overlaps: usize,
    /// See [`ResourceCheck::stale_accepted`].
    pub stale_accepted: usize,
    /// See [`ResourceCheck::stale_rejected`].
    pub stale_rejected: usize,
    /// Errors by `"<op> <kind>"`.
    pub errors: BTreeMap<String, u64>,
    /// The longest recovery time over the faults, and how many faults it was taken over;
    /// `None` inside when a fault was never followed by a grant.
    pub recovery: Option<(Option<Duration>, usize)>,
}

impl Row {
    fn cells(&self) -> [String; 8] {
        let errors = if self.errors.is_empty() {
            "-".to_owned()
        } else {
            self.errors
                .iter()
                .map(|(kind, n)| format!("{kind} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let recovery = match self.recovery {
            None => "-".to_owned(),
            Some((None, _)) => "never".to_owned(),
            Some((Some(d), 1)) => format_duration(d),
            Some((Some(d), n)) => format!("max {} ({n} faults)", format_duration(d)),
        };
        [
            self.scenario.clone(),
            self.faults.clone(),
            self.grants.to_string(),
            self.overlaps.to_string(),
            self.stale_accepted.to_string(),
            self.stale_rejected.to_string(),
            errors,
            recovery,
        ]
    }
}

fn format_duration(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    }
}

/// The rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    const HEAD: [&str; 8] = [
        "scenario",
        "faults injected",
        "grants",
        "overlaps",
        "stale writes accepted",
        "stale writes rejected",
        "errors by kind",
        "recovery time",
    ];
    let cells: Vec<[String; 8]> = rows.iter().map(Row::cells).collect();
    let mut widths = HEAD.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[&str]| {
        out.push('|');
        for (c, w) in row.iter().zip(widths) {
            let _ = write!(out, " {c:<w$} |");
        }
        out.push('\n');
    };
    line(&mut out, &HEAD);
    let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    line(
        &mut out,
        &rule.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    for row in &cells {
        line(
            &mut out,
            &row.iter().map(String::as_str).collect::<Vec<_>>(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(worker: &str, fence: u64, start: u64, end: u64) -> Section {
        Section {
            worker: worker.into(),
            key: "k".into(),
            owner: format!("o{fence}"),
            fence,
            start,
            end,
            write: Write::Accepted,
            lost: false,
        }
    }

    #[test]
    fn parses_worker_lines() {
        assert_eq!(parse_line("w0", "k", "ready"), Some(Event::Ready));
        assert_eq!(
            parse_line("w0", "k", "cs ab12 17 100 250 0 1"),
            Some(Event::Section(Section {
                write: Write::Rejected,
                lost: true,
                owner: "ab12".into(),
                ..section("w0", 17, 100, 250)
            }))
        );
        assert_eq!(
            parse_line("w0", "k", "err lock Backend 42 redis did not answer"),
            Some(Event::Error {
                op: "lock".into(),
                kind: "Backend".into(),
                at: 42,
            })
        );
        assert_eq!(
            parse_line("w0", "k", "stop-point 9"),
            Some(Event::StopPoint { fence: 9 })
        );
        assert_eq!(parse_line("w0", "k", "cs ab12 17 100"), None);
        assert_eq!(parse_line("w0", "k", "hello"), None);
    }

    #[test]
    fn sections_one_after_another_do_not_overlap() {
        let mut h = History::new();
        h.record(section("a", 1, 0, 10));
        h.record(section("b", 2, 10, 20));
        h.record(section("a", 3, 25, 30));
        assert!(h.overlaps().is_empty());
        assert_eq!(h.fence_inversions(), 0);
    }

    #[test]
    fn finds_every_overlapping_pair() {
        let mut h = History::new();
        h.record(section("a", 1, 0, 100)); // a paused holder
        h.record(section("b", 2, 50, 60));
        h.record(section("c", 3, 70, 80));
        h.record(section("b", 4, 120, 130));
        let pairs = h.overlaps();
        assert_eq!(
            pairs,
            vec![
                Overlap {
                    first: 0,
                    second: 1
                },
                Overlap {
                    first: 0,
                    second: 2
                }
            ]
        );
    }

    #[test]
    fn different_lock_keys_on_one_resource_still_overlap() {
        let mut h = History::new();
        h.record(section("a", 5, 0, 10));
        h.record(Section {
            key: "other".into(),
            ..section("b", 7, 5, 15)
        });
        assert_eq!(h.overlaps().len(), 1);
    }

    #[test]
    fn counts_tokens_that_did_not_increase_with_the_grants() {
        let mut h = History::new();
        h.record(section("a", 5, 0, 10));
        h.record(section("b", 3, 20, 30));
        h.record(section("c", 6, 40, 50));
        assert_eq!(h.fence_inversions(), 1);
    }

    #[test]
    fn recovery_is_the_first_grant_after_a_fault() {
        let mut h = History::new();
        h.record(section("a", 1, 0, 10));
        h.record(section("b", 2, 500, 510));
        h.record(section("a", 3, 700, 710));
        assert_eq!(h.first_grant_after(100, None), Some(400));
        assert_eq!(h.first_grant_after(100, Some("a")), Some(600));
        assert_eq!(h.first_grant_after(800, None), None);
        assert_eq!(h.first_grant_to_others_after(100, "b"), Some(600));
        assert_eq!(h.grants_after(100), 2);
    }

    #[test]
    fn bypass_counts_grants_to_others_between_two_grants_of_one_worker() {
        let mut h = History::new();
        for (i, w) in ["a", "b", "c", "a", "b", "b", "b", "a", "c"]
            .iter()
            .enumerate()
        {
            let t = i as u64 * 10;
            h.record(section(w, i as u64 + 1, t, t + 5));
        }
        assert_eq!(
            h.longest_bypass(),
            Some(Bypass {
                worker: "c".into(),
                others: 5,
                waited: Duration::from_nanos(60)
            })
        );
    }

    #[test]
    fn resource_log_counts_stale_writes() {
        let log: Vec<LogEntry> = ["3 a 1", "5 b 1", "4 a 0", "4 c 1", "9 b 1"]
            .iter()
            .map(|l| LogEntry::parse(l).unwrap())
            .collect();
        assert_eq!(
            ResourceCheck::of(&log),
            ResourceCheck {
                accepted: 4,
                stale_accepted: 1,
                stale_rejected: 1
            }
        );
    }

    #[test]
    fn table_has_one_line_per_row_and_aligned_columns() {
        let row = Row {
            scenario: "single".into(),
            faults: "DEBUG SLEEP x3".into(),
            grants: 42,
            errors: BTreeMap::from([("lock Backend".to_owned(), 2)]),
            recovery: Some((Some(Duration::from_millis(12)), 3)),
            ..Row::default()
        };
        let t = table(&[row]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[2].contains("lock Backend 2"));
        assert!(lines[2].contains("max 12.0 ms (3 faults)"));
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
    }
}
