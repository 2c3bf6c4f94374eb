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
    /// The goods bought.
    pub goods: u64,
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
    /// Units sold by each instance, by the name in its receipts.
    pub per_instance: BTreeMap<String, u64>,
    /// Each target's share of the run, in the order of the targets.
    pub per_target: Vec<InstanceReport>,
    /// Latency percentiles of all purchases: p50, p90, p99, max.
    pub latency: [Duration; 4],
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// What a shop instance says about itself (`GET /about`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShopInfo {
    /// Its name.
    pub instance: String,
    /// Its web framework.
    pub framework: String,
    /// The simulated checkout inside a purchase.
    pub checkout: Option<Duration>,
    /// The key a purchase locks, with its placeholder.
    pub lock_key: Option<String>,
    /// How long a purchase waits for the lock, as the attribute writes it (`"2s"`).
    pub lock_wait: Option<String>,
}

/// One target's share of a run.
#[derive(Debug, Clone)]
pub struct InstanceReport {
    /// The target's base URL.
    pub target: String,
    /// What it said about itself, when it answered `GET /about`.
    pub shop: Option<ShopInfo>,
    /// Purchases sent to it.
    pub requests: u64,
    /// Purchases it answered 200.
    pub sold: u64,
    /// Purchases it answered 409 `sold_out`.
    pub sold_out: u64,
    /// Purchases it answered 409 `lock_timeout`.
    pub lock_timeouts: u64,
    /// Everything else.
    pub errors: u64,
    /// Latency p50 and p99 of its purchases.
    pub latency: [Duration; 2],
}

impl InstanceReport {
    /// `shop-1 (axum)`, or the URL for a target that did not say.
    pub fn label(&self) -> String {
        match &self.shop {
            Some(shop) if shop.framework.is_empty() => shop.instance.clone(),
            Some(shop) => format!("{} ({})", shop.instance, shop.framework),
            None => self.target.clone(),
        }
    }
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
        )?;
        if self.per_target.is_empty() {
            return Ok(());
        }
        let labels: Vec<String> = self.per_target.iter().map(InstanceReport::label).collect();
        let width = labels.iter().map(String::len).max().unwrap_or(0).max(8);
        write!(
            f,
            "\n  {:<width$}  {:>8}  {:>5}  {:>8}  {:>12}  {:>6}  {:>10}  {:>10}",
            "instance", "requests", "sold", "sold out", "lock timeout", "errors", "p50", "p99"
        )?;
        for (label, t) in labels.iter().zip(&self.per_target) {
            write!(
                f,
                "\n  {label:<width$}  {:>8}  {:>5}  {:>8}  {:>12}  {:>6}  {:>10}  {:>10}",
                t.requests,
                t.sold,
                t.sold_out,
                t.lock_timeouts,
                t.errors,
                ms(t.latency[0]),
                ms(t.latency[1])
            )?;
        }
        Ok(())
    }
}

/// Plain lines on what a locked and an unlocked run of the same load show, with their numbers:
/// the race the checkout widens, what the lock prevents, why the locked endpoint is slower and
/// what a shop would do about it, and lock timeouts.
pub fn explain(locked: &Report, unlocked: &Report) -> String {
    let shop = locked
        .per_target
        .iter()
        .chain(&unlocked.per_target)
        .find_map(|t| t.shop.clone());
    let checkout = shop.as_ref().and_then(|s| s.checkout);
    let key = shop
        .as_ref()
        .and_then(|s| s.lock_key.as_deref())
        .map_or_else(
            || "the goods".to_owned(),
            |k| format!("\"{}\"", k.replace("<goods>", &locked.goods.to_string())),
        );
    let wait = shop.as_ref().and_then(|s| s.lock_wait.clone());
    let wait_ms = wait
        .as_deref()
        .and_then(|w| lock_duration::parse_millis(w).ok());
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let n = locked.instances;
    let checkout_text = checkout.map_or_else(|| "some time".to_owned(), ms);

    let mut paragraphs = Vec::new();
    let mut race = format!(
        "The race: a purchase reads the stock, spends {checkout_text} in a simulated checkout \
         (charging the card, writing the order), then writes back the stock it read minus one. \
         A purchase that reads the stock during another one's checkout sees the same units. "
    );
    if unlocked.oversold() > 0 {
        race += &format!(
            "Without the lock the {n} instances sold {} units of a stock of {}: {} oversold. \
             The checkout only widens the window; a shorter one makes the race rarer, not \
             impossible.",
            unlocked.sold,
            unlocked.stock,
            unlocked.oversold()
        );
    } else {
        race += &format!(
            "Without the lock the {n} instances sold {} units of a stock of {} this time, \
             overselling nothing: the window is only {checkout_text} wide, and more purchases \
             in flight widen the race.",
            unlocked.sold, unlocked.stock
        );
    }
    paragraphs.push(race);

    let frameworks = frameworks(&locked.per_target);
    let passes_per_s = locked.requests as f64 / locked.elapsed.as_secs_f64().max(f64::EPSILON);
    paragraphs.push(format!(
        "The lock: with #[distributed_lock] on {key} the read, the checkout and the write run \
         for one purchase at a time across the {n} processes{frameworks}: {} sold, {} oversold, \
         stock left {}. The hot lock passed {passes_per_s:.0} times a second across the {n} \
         processes ({} purchases in {}).",
        locked.sold,
        locked.oversold(),
        locked.stock_left,
        locked.requests,
        secs(locked.elapsed),
    ));

    let pass = locked.elapsed / u32::try_from(locked.requests.max(1)).unwrap_or(u32::MAX);
    if locked.elapsed > unlocked.elapsed {
        paragraphs.push(format!(
            "Why the locked endpoint is slower ({} against {}, p50 {} against {}): every \
             purchase passes the lock, also the {} that found the goods sold out: they queue for \
             {key} one after the other just to read a stock of 0. A real shop checks the stock before taking the lock and answers \"sold out\" at \
             once, and takes the lock only while there is stock left (checking again inside \
             it): then only purchases that can still succeed wait for the lock, and a sold-out \
             answer costs what it costs here without the lock.",
            secs(locked.elapsed),
            secs(unlocked.elapsed),
            ms(locked.latency[0]),
            ms(unlocked.latency[0]),
            locked.sold_out,
        ));
    }

    let wait_text = match (wait_ms, wait) {
        (Some(ms), Some(w)) if ms % 1000 == 0 => format!("{} s (wait = \"{w}\")", ms / 1000),
        (Some(ms), Some(w)) => format!("{ms} ms (wait = \"{w}\")"),
        _ => "the attribute's wait".to_owned(),
    };
    let mut timeouts = format!(
        "Lock timeouts: a purchase waits at most {wait_text} for the lock, then answers 409 \
         lock_timeout (rejected, nothing sold). "
    );
    let in_flight = locked.concurrency.min(locked.requests);
    let queue = pass * u32::try_from(in_flight).unwrap_or(u32::MAX);
    if locked.lock_timeouts == 0 {
        timeouts += &format!(
            "None of the {} purchases timed out: with {in_flight} in flight and one passing the \
             lock every {} on average, a purchase waited about {} (p50 {}, p99 {}).",
            locked.requests,
            ms(pass),
            ms(queue),
            ms(locked.latency[0]),
            ms(locked.latency[2]),
        );
        if let Some(wait_ms) = wait_ms.filter(|_| !pass.is_zero()) {
            let limit = Duration::from_millis(wait_ms).as_secs_f64() / pass.as_secs_f64();
            timeouts += &format!(
                " At that pace purchases would start to time out with more than about {limit:.0} \
                 in flight, or sooner when each one holds the lock longer."
            );
        }
    } else {
        timeouts += &format!(
            "{} of the {} purchases timed out: with {in_flight} in flight and one passing the \
             lock every {} on average, the queue ahead of a purchase took about {} (p99 {}). Fewer \
             purchases in flight, or the stock check before the lock, keep the queue shorter.",
            locked.lock_timeouts,
            locked.requests,
            ms(pass),
            ms(queue),
            ms(locked.latency[2]),
        );
    }
    paragraphs.push(timeouts);

    let mut out = String::from("What the two runs show:");
    for paragraph in paragraphs {
        out.push('\n');
        out += &wrap(&paragraph, 96, "  - ", "    ");
    }
    out
}

/// ` (2 on axum, 1 on actix-web, sharing one lock on Redis)`, or nothing when the targets did not
/// say.
fn frameworks(targets: &[InstanceReport]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for shop in targets.iter().filter_map(|t| t.shop.as_ref()) {
        if shop.framework.is_empty() {
            continue;
        }
        match counts.iter_mut().find(|(name, _)| *name == shop.framework) {
            Some((_, count)) => *count += 1,
            None => counts.push((&shop.framework, 1)),
        }
    }
    if counts.is_empty() {
        return String::new();
    }
    let list: Vec<String> = counts
        .iter()
        .map(|(name, count)| format!("{count} on {name}"))
        .collect();
    format!(" ({}, sharing one lock on Redis)", list.join(", "))
}

/// `text` wrapped at `width` columns, the first line starting with `first`, the others with
/// `rest`.
fn wrap(text: &str, width: usize, first: &str, rest: &str) -> String {
    let mut out = String::from(first);
    let mut column = first.len();
    let mut line_empty = true;
    for word in text.split_whitespace() {
        if !line_empty && column + 1 + word.len() > width {
            out.push('\n');
            out += rest;
            column = rest.len();
            line_empty = true;
        }
        if !line_empty {
            out.push(' ');
            column += 1;
        }
        out += word;
        column += word.len();
        line_empty = false;
    }
    out
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

    fn instance(name: &str, framework: &str, sold: u64, sold_out: u64) -> InstanceReport {
        InstanceReport {
            target: format!("http://127.0.0.1/{name}"),
            shop: Some(ShopInfo {
                instance: name.to_owned(),
                framework: framework.to_owned(),
                checkout: Some(Duration::from_millis(5)),
                lock_key: Some("goods:<goods>".to_owned()),
                lock_wait: Some("2s".to_owned()),
            }),
            requests: sold + sold_out,
            sold,
            sold_out,
            lock_timeouts: 0,
            errors: 0,
            latency: [Duration::from_millis(3), Duration::from_millis(9)],
        }
    }

    fn report(endpoint: Endpoint, sold: u64, elapsed_ms: u64) -> Report {
        Report {
            endpoint,
            instances: 3,
            concurrency: 8,
            goods: 7,
            stock: 10,
            requests: 100,
            sold,
            sold_out: 100 - sold,
            lock_timeouts: 0,
            errors: 0,
            error_samples: Vec::new(),
            stock_left: 0,
            sold_recorded: i64::try_from(sold).unwrap(),
            per_instance: BTreeMap::from([("a".to_owned(), sold)]),
            per_target: vec![
                instance("a", "axum", sold, 33 - sold),
                instance("b", "axum", 0, 33),
                instance("c", "actix-web", 0, 34),
            ],
            latency: [Duration::from_millis(2); 4],
            elapsed: Duration::from_millis(elapsed_ms),
        }
    }

    #[test]
    fn oversold_is_what_was_sold_beyond_the_stock() {
        let mut report = report(Endpoint::Unlocked, 25, 1000);
        assert_eq!(report.oversold(), 15);
        assert!(report.summary_line().contains(" oversold=15 p50_ms=2.0 "));
        let text = report.to_string();
        assert!(
            text.contains("oversold        15") && text.contains("(a: 25)"),
            "{text}"
        );
        assert!(text.contains("\n  c (actix-web)  "), "{text}");
        report.sold = 7;
        assert_eq!(report.oversold(), 0);
    }

    #[test]
    fn the_explanation_uses_the_numbers_of_the_runs() {
        let locked = report(Endpoint::Locked, 10, 400);
        let unlocked = report(Endpoint::Unlocked, 25, 100);
        let text = explain(&locked, &unlocked);
        for expected in [
            "spends 5.0 ms in a simulated checkout",
            "sold 25 units of a stock of 10: 15 oversold",
            "(2 on axum, 1 on actix-web, sharing one lock on Redis): 10 sold, 0 oversold, stock left 0",
            "also the 90 that found the goods sold out",
            "queue for \"goods:7\" one after",
            "one passing the lock every 4.0 ms",
            "waits at most 2 s (wait = \"2s\")",
            "with 8 in flight",
            "more than about 500 in flight",
        ] {
            assert!(
                text.split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .contains(expected),
                "{expected:?} in\n{text}"
            );
        }
        assert!(text.lines().all(|line| line.len() <= 96), "{text}");
    }

    #[test]
    fn wrapping_keeps_words_whole() {
        assert_eq!(wrap("aa bb cc", 7, "- ", "  "), "- aa bb\n  cc");
        assert_eq!(wrap("", 7, "- ", "  "), "- ");
    }
}
