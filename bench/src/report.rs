//! Samples, the human table, target verdicts and the JSON line of a scenario.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::ctx::{Counts, Ctx, Setup, round2};
use crate::error::Result;

/// Latencies in microseconds (signed: a wake-up can beat the release's reply).
#[derive(Debug, Default, Clone)]
pub(crate) struct Samples(Vec<f64>);

impl Samples {
    pub(crate) fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1e6);
    }

    pub(crate) fn push_us(&mut self, us: f64) {
        self.0.push(us);
    }

    pub(crate) fn extend(&mut self, other: &Samples) {
        self.0.extend_from_slice(&other.0);
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The `p`-quantile (nearest rank), 0 when empty.
    pub(crate) fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = (p * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    /// The mean, 0 when empty.
    pub(crate) fn mean(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.iter().sum::<f64>() / self.0.len() as f64
    }

    pub(crate) fn median(&self) -> f64 {
        self.pct(0.5)
    }

    pub(crate) fn max(&self) -> f64 {
        self.pct(1.0)
    }

    /// Median, p99 and max for JSON.
    pub(crate) fn json(&self) -> Value {
        json!({
            "n": self.len(),
            "median_us": round2(self.median()),
            "p99_us": round2(self.pct(0.99)),
            "max_us": round2(self.max()),
        })
    }
}

/// A target of the issue and how this run fared, or an informational check (a figure the
/// issue sets no target for in this setup, compared with a threshold all the same).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) what: String,
    pub(crate) measured: String,
    pub(crate) met: bool,
    pub(crate) informational: bool,
}

impl Target {
    pub(crate) fn new(what: impl Into<String>, measured: impl Into<String>, met: bool) -> Target {
        Target {
            what: what.into(),
            measured: measured.into(),
            met,
            informational: false,
        }
    }

    /// An informational check: printed as `(met)` / `(missed)`, never a target.
    pub(crate) fn info(what: impl Into<String>, measured: impl Into<String>, met: bool) -> Target {
        Target {
            informational: true,
            ..Target::new(what, measured, met)
        }
    }

    /// A target, or an informational check when `informational`.
    pub(crate) fn either(
        informational: bool,
        what: impl Into<String>,
        measured: impl Into<String>,
        met: bool,
    ) -> Target {
        Target {
            informational,
            ..Target::new(what, measured, met)
        }
    }

    pub(crate) fn verdict(&self) -> &'static str {
        match (self.informational, self.met) {
            (false, true) => "met",
            (false, false) => "MISSED",
            (true, true) => "(met)",
            (true, false) => "(missed)",
        }
    }
}

/// The result of one scenario: a table for people, a JSON line for machines.
#[derive(Debug)]
pub(crate) struct Scenario {
    pub(crate) id: &'static str,
    pub(crate) title: String,
    pub(crate) headers: Vec<&'static str>,
    pub(crate) rows: Vec<Vec<String>>,
    pub(crate) notes: Vec<String>,
    pub(crate) targets: Vec<Target>,
    /// One object per variant.
    pub(crate) variants: Vec<Value>,
    /// Scenario-wide figures (e.g. the PING round trip).
    pub(crate) extra: Value,
}

impl Scenario {
    pub(crate) fn print(&self) {
        println!("\n{} {}", self.id, self.title);
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut out = String::from("  ");
            for (i, (cell, w)) in cells.zip(&widths).enumerate() {
                if i == 0 {
                    out.push_str(&format!("{cell:<w$}"));
                } else {
                    out.push_str(&format!("  {cell:>w$}"));
                }
            }
            println!("{}", out.trim_end());
        };
        line(&mut self.headers.iter().copied());
        for row in &self.rows {
            line(&mut row.iter().map(String::as_str));
        }
        for note in &self.notes {
            println!("  note: {note}");
        }
        for t in &self.targets {
            println!("  target: {}: {} -> {}", t.what, t.measured, t.verdict());
        }
    }

    pub(crate) fn json_line(&self, setup: &Setup, redis_version: &str) -> String {
        let targets: Vec<Value> = self
            .targets
            .iter()
            .map(|t| {
                json!({
                    "target": t.what,
                    "measured": t.measured,
                    "met": t.met,
                    "informational": t.informational,
                })
            })
            .collect();
        let line = json!({
            "scenario": self.id,
            "title": self.title,
            "mode": setup.mode(),
            "runtime": setup.runtime(),
            "topology": setup.topology(),
            "redis_version": redis_version,
            "variants": self.variants,
            "targets": targets,
            "extra": self.extra,
        });
        format!("BENCH_JSON {line}")
    }
}

/// Times `per_round` calls of `pair(variant)` for each of `variants` variants, in `rounds`
/// rounds that rotate the variants' order (so that load from other processes hits them alike),
/// counting Redis commands per variant; returns each variant's samples and counts.
pub(crate) async fn interleaved_rounds(
    ctx: &Ctx,
    variants: usize,
    rounds: usize,
    per_round: usize,
    mut pair: impl AsyncFnMut(usize) -> Result<()>,
) -> Result<(Vec<Samples>, Vec<Counts>)> {
    let mut samples = vec![Samples::default(); variants];
    let mut counts = vec![Counts::default(); variants];
    for round in 0..rounds {
        for i in 0..variants {
            let variant = (round + i) % variants;
            let (round_samples, round_counts) = ctx
                .counted(async {
                    let mut s = Samples::default();
                    for _ in 0..per_round {
                        let t = Instant::now();
                        pair(variant).await?;
                        s.push(t.elapsed());
                    }
                    Ok(s)
                })
                .await?;
            samples[variant].extend(&round_samples);
            counts[variant].add(&round_counts);
        }
    }
    Ok((samples, counts))
}

/// The Redis and CPU columns of a table whose operation is an acquire + release pair; the
/// cells are [`pair_cost_cells`].
pub(crate) const PAIR_COST_HEADERS: [&str; 5] = [
    "cmds/pair",
    "round trips/pair",
    "script us/pair",
    "client CPU us/pair",
    "redis CPU us/pair",
];

/// The cells of [`PAIR_COST_HEADERS`] for `counts` over `pairs` pairs.
pub(crate) fn pair_cost_cells(counts: &Counts, pairs: u64) -> [String; 5] {
    let [commands, requests, client_cpu, server_cpu] = cost_cells(counts, pairs);
    let script = per_op(counts.request_usec(), pairs);
    [commands, requests, script, client_cpu, server_cpu]
}

/// The Redis and CPU cells of a table row for `counts` over `ops` operations, per operation:
/// commands, round trips, client CPU us and redis CPU us.
pub(crate) fn cost_cells(counts: &Counts, ops: u64) -> [String; 4] {
    [
        per_op(counts.commands(), ops),
        per_op(counts.requests(), ops),
        per_op(counts.client_cpu_us, ops),
        per_op(counts.server_cpu_us, ops),
    ]
}

/// `12.3` style.
pub(crate) fn f1(x: f64) -> String {
    format!("{x:.1}")
}

/// `1.23x` style.
pub(crate) fn ratio(x: f64) -> String {
    format!("{x:.2}x")
}

/// Per-operation count with two decimals.
pub(crate) fn per_op(count: u64, ops: u64) -> String {
    format!("{:.2}", count as f64 / ops.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut s = Samples::default();
        for i in 1..=100 {
            s.push_us(f64::from(i));
        }
        assert_eq!(s.median(), 50.0);
        assert_eq!(s.pct(0.99), 99.0);
        assert_eq!(s.max(), 100.0);
        assert_eq!(Samples::default().median(), 0.0);
    }
}
