//! The report table of the fault tests.
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

#[cfg(doc)]
use super::{History, ResourceCheck};

/// One line of the fault table.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// The scenario.
    pub scenario: String,
    /// The faults injected, e.g. `DEBUG SLEEP 0.5 s x3`.
    pub faults: String,
    /// Sections recorded.
    pub grants: usize,
    /// [`History::peak`].
    pub peak: u32,
    /// Pairs of sections that overlapped and may not ([`History::conflicts`]).
    pub overlaps: usize,
    /// Stretches with more permits held than the semaphore has ([`History::over_permits`]);
    /// `None` for a lock without permits.
    pub over_permits: Option<usize>,
    /// Read shares that saw a torn write ([`History::torn_reads`]) and writes left half done
    /// ([`History::half_writes`]); `None` for a lock without read shares.
    pub torn: Option<usize>,
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
    fn cells(&self) -> [String; COLUMNS] {
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
        let maybe = |n: Option<usize>| n.map_or("-".to_owned(), |n| n.to_string());
        [
            self.scenario.clone(),
            self.faults.clone(),
            self.grants.to_string(),
            self.peak.to_string(),
            self.overlaps.to_string(),
            maybe(self.over_permits),
            maybe(self.torn),
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

/// The columns of [`table`].
pub(super) const COLUMNS: usize = 11;

/// The rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    const HEAD: [&str; COLUMNS] = [
        "scenario",
        "faults injected",
        "grants",
        "most at once",
        "overlaps",
        "over n permits",
        "torn reads",
        "stale writes accepted",
        "stale writes rejected",
        "errors by kind",
        "recovery time",
    ];
    let cells: Vec<[String; COLUMNS]> = rows.iter().map(Row::cells).collect();
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
