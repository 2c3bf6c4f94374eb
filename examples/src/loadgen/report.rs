//! [`Report`]: what a load run did, for people and for scripts.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::Endpoint;

/// What a run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The endpoint loaded.
    pub endpoint: Endpoint,
    /// Number of instances.
    pub instances: usize,
    /// Purchases in flight at once.
    pub concurrency: usize,
    /// The stock before the run.
    pub stock: i64,
    /// Purchases sent.
    pub requests: usize,
    /// Purchases answered 200.
    pub sold: u64,
    /// Purchases answered 409 `sold_out`.
    pub sold_out: u64,
    /// Purchases answered 409 `lock_timeout`.
    pub lock_timeouts: u64,
    /// Everything else (transport errors, other statuses).
    pub errors: u64,
    /// The first few error descriptions.
    pub error_samples: Vec<String>,
    /// The stock after the run, as the shop reports it.
    pub stock_left: i64,
    /// The shop's own sold counter after the run.
    pub sold_recorded: i64,
    /// Units sold by each instance.
    pub per_instance: BTreeMap<String, u64>,
    /// Latency percentiles of all purchases: p50, p90, p99, max.
    pub latency: [Duration; 4],
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl Report {
    /// Units sold beyond the stock: what the lock must keep at 0.
    pub fn oversold(&self) -> u64 {
        self.sold
            .saturating_sub(u64::try_from(self.stock).unwrap_or(0))
    }

    /// One `key=value` line for scripts: `RESULT endpoint=locked requests=.. oversold=..`.
    pub fn summary_line(&self) -> String {
        let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1000.0);
        format!(
            "RESULT endpoint={} requests={} sold={} sold_out={} lock_timeout={} errors={} \
             stock_left={} oversold={} p50_ms={} p90_ms={} p99_ms={}",
            self.endpoint.name(),
            self.requests,
            self.sold,
            self.sold_out,
            self.lock_timeouts,
            self.errors,
            self.stock_left,
            self.oversold(),
            ms(self.latency[0]),
            ms(self.latency[1]),
            ms(self.latency[2]),
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
        let secs = self.elapsed.as_secs_f64();
        let path = self.endpoint.path();
        writeln!(
            f,
            "{} endpoint (POST /goods/<id>/{path}): {} instances, {} purchases, {} at a time, stock {}",
            self.endpoint.name(),
            self.instances,
            self.requests,
            self.concurrency,
            self.stock
        )?;
        let rate = self.requests as f64 / secs.max(1e-9);
        writeln!(
            f,
            "  requests    {:>6}   in {secs:.2} s ({rate:.0} req/s)",
            self.requests
        )?;
        let by: Vec<String> = self
            .per_instance
            .iter()
            .map(|(i, n)| format!("{i}: {n}"))
            .collect();
        writeln!(f, "  sold        {:>6}   ({})", self.sold, by.join(", "))?;
        writeln!(
            f,
            "  rejected    {:>6}   (sold out {}, lock timeout {})",
            self.sold_out + self.lock_timeouts,
            self.sold_out,
            self.lock_timeouts
        )?;
        writeln!(f, "  errors      {:>6}", self.errors)?;
        for sample in &self.error_samples {
            writeln!(f, "                       {sample}")?;
        }
        writeln!(
            f,
            "  stock left  {:>6}   (sold counter in Redis: {})",
            self.stock_left, self.sold_recorded
        )?;
        writeln!(f, "  oversold    {:>6}", self.oversold())?;
        write!(
            f,
            "  latency     p50 {}   p90 {}   p99 {}   max {}",
            ms(self.latency[0]),
            ms(self.latency[1]),
            ms(self.latency[2]),
            ms(self.latency[3])
        )
    }
}

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn oversold_is_what_was_sold_beyond_the_stock() {
        let mut report = Report {
            endpoint: Endpoint::Unlocked,
            instances: 3,
            concurrency: 8,
            stock: 10,
            requests: 100,
            sold: 25,
            sold_out: 75,
            lock_timeouts: 0,
            errors: 0,
            error_samples: Vec::new(),
            stock_left: 0,
            sold_recorded: 25,
            per_instance: BTreeMap::from([("a".to_owned(), 25)]),
            latency: [Duration::from_millis(2); 4],
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(report.oversold(), 15);
        assert!(report.summary_line().contains(" oversold=15 p50_ms=2.0 "));
        let text = report.to_string();
        assert!(
            text.contains("oversold        15") && text.contains("(a: 25)"),
            "{text}"
        );
        report.sold = 7;
        assert_eq!(report.oversold(), 0);
    }
}
