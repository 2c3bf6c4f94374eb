//! Text and JSON forms of the locks.
//!
//! Keys, owners, request ids, instance names and process ids come from request input or other
//! services' configuration by way of Redis: every
//! text form passes them through [`text`], so that a key cannot drive the terminal (escape
//! sequences that set its title, clear it or colour it), forge a row with a newline, or
//! reorder what follows it with a bidi override. The JSON forms need nothing: JSON escapes
//! control characters itself.

use std::borrow::Cow;
use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{HoldMode, Holder, LockInfo, ServiceWaiters};
use serde_json::{Value, json};

/// Whether `c` must not reach a terminal as it is: control characters (C0, DEL, C1), the
/// bidi embeddings, overrides, isolates and marks, and the Unicode line and paragraph
/// separators.
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}'
                | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `s` as it may be printed: the characters above escaped visibly (`\x1b`, `\n`, `\t`,
/// `\u{202e}`), and a backslash doubled so that an escape never reads as text of the key.
/// Every text output of text from Redis (or typed by the user) goes through here.
pub(crate) fn text(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c == '\\' || escaped(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if escaped(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if escaped(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A message of several lines (an error): each line through [`text`].
pub(crate) fn message(s: &str) -> String {
    s.lines().map(text).collect::<Vec<_>>().join("\n")
}

/// `1.2s`, `45.0s`, `3m05s`, `2h10m`, `-` for none.
pub(crate) fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000)
    }
}

fn lease(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), duration)
}

/// `HH:MM:SS` (UTC) of `at`.
pub(crate) fn clock(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    format!(
        "{:02}:{:02}:{:02}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

/// The kind column: `mutex`, `rw`, `semaphore 3/4` (for a kind with permits: those held of
/// all).
fn kind_label(info: &LockInfo) -> String {
    let used: Option<u32> = info
        .holders
        .iter()
        .filter_map(|h| h.permits)
        .reduce(|a, b| a + b);
    match (used, info.permits) {
        (used, Some(all)) => format!("{} {}/{all}", info.kind, used.unwrap_or(0)),
        (Some(used), None) => format!("{} {used}", info.kind),
        (None, None) => info.kind.to_string(),
    }
}

/// The holder column: the first holder (`write:`/`read:` for a read-write lock) and how many
/// more there are.
fn holder_label(info: &LockInfo, now: SystemTime) -> String {
    let Some(first) = info.holders.first() else {
        return match &info.kept {
            Some(kept) => format!("done, kept until {} UTC", clock(now + kept.left)),
            None => "-".to_owned(),
        };
    };
    // the mode says which hold it is when the kind has several (`write:`, `read:`)
    let modes = HoldMode::ALL
        .iter()
        .filter(|m| m.kind() == info.kind)
        .count();
    let mut label = if modes > 1 {
        format!("{}:{}", first.mode, text(&first.owner))
    } else {
        text(&first.owner).into_owned()
    };
    if info.holders.len() > 1 {
        let _ = write!(label, " +{}", info.holders.len() - 1);
    }
    label
}

/// The instance name of a holder, `-` when it has none (an owner across processes, a hold of
/// an older version).
fn instance(h: Option<&Holder>) -> String {
    h.and_then(|h| h.instance_name.as_deref())
        .map_or_else(|| "-".to_owned(), |n| text(n).into_owned())
}

/// How long a hold has lasted: `2h13m`, `-` when unknown.
fn held(h: Option<&Holder>) -> String {
    lease(h.and_then(|h| h.held_for))
}

/// One service's waiting callers: `billing-2 3`, `billing-2 ?` when it does not report how
/// many.
fn waiter(w: &ServiceWaiters) -> String {
    let name = w.instance_name.as_deref().unwrap_or(&w.service);
    match w.waiting {
        Some(n) => format!("{} {n}", text(name)),
        None => format!("{} ?", text(name)),
    }
}

/// The waiting column: each service with its waiting callers (`billing-2 3, orders-1 1`),
/// else the number of services registered as waiting.
fn waiting_label(info: &LockInfo) -> String {
    if info.waiters.is_empty() {
        return info.waiting_services.to_string();
    }
    info.waiters
        .iter()
        .map(waiter)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One line per lock under a header; `(no locks held)` when there are none.
pub(crate) fn table(locks: &[LockInfo]) -> String {
    if locks.is_empty() {
        return "(no locks held)\n".to_owned();
    }
    let now = SystemTime::now();
    let header = [
        "KEY", "KIND", "HOLDER", "INSTANCE", "REQUEST", "HELD", "HOLDS", "LEASE", "FENCE",
        "WAITING",
    ]
    .map(str::to_owned);
    let rows: Vec<[String; 10]> = locks
        .iter()
        .map(|info| {
            let first = info.holders.first();
            [
                text(&info.key).into_owned(),
                kind_label(info),
                holder_label(info, now),
                instance(first.or(info.kept.as_ref().map(|k| &k.holder))),
                first
                    .and_then(|h| h.request_id.as_deref())
                    .map_or_else(|| "-".to_owned(), |r| text(r).into_owned()),
                held(first),
                info.hold_count.to_string(),
                lease(first.and_then(|h| h.lease_left)),
                info.fence.map_or_else(|| "-".to_owned(), |f| f.to_string()),
                waiting_label(info),
            ]
        })
        .collect();
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn holder_line(h: &Holder) -> String {
    let mut line = format!("{} {}", h.mode, text(&h.owner));
    if let Some(permits) = h.permits {
        let _ = write!(
            line,
            " ({permits} permit{})",
            if permits == 1 { "" } else { "s" }
        );
    }
    match &h.request_id {
        Some(request) => {
            let _ = write!(line, ", request {}", text(request));
        }
        None => line.push_str(", no request id"),
    }
    let _ = write!(line, ", holds {}", h.hold_count);
    if let Some(held) = h.held_for {
        let _ = write!(line, ", held for {}", duration(held));
    }
    if let Some(at) = h.granted_at {
        let _ = write!(line, " (since {} UTC)", clock(at));
    }
    let _ = write!(line, ", lease left {}", lease(h.lease_left));
    if let Some(name) = &h.instance_name {
        let _ = write!(line, ", instance {}", text(name));
    }
    match &h.instance {
        Some(instance) => {
            let _ = write!(line, ", process {}", text(instance));
        }
        None => line.push_str(", owner across processes"),
    }
    line
}

/// Everything known about one lock, a few lines.
pub(crate) fn detail(info: &LockInfo) -> String {
    let mut out = format!(
        "{} `{}` ({})\n",
        info.kind.noun(),
        text(&info.key),
        text(&info.redis_key)
    );
    let state = match &info.kept {
        _ if info.is_held() => "held".to_owned(),
        Some(kept) => format!(
            "done, kept until {} UTC (its minimum hold)",
            clock(SystemTime::now() + kept.left)
        ),
        None => "free".to_owned(),
    };
    let _ = writeln!(out, "  state:          {state}");
    if let Some(kept) = &info.kept {
        let _ = writeln!(out, "  released by:    {}", holder_line(&kept.holder));
    }
    if let Some(permits) = info.permits {
        let used: u32 = info.holders.iter().filter_map(|h| h.permits).sum();
        let _ = writeln!(out, "  permits:        {used} of {permits} held");
    }
    let _ = writeln!(out, "  lease left:     {}", lease(info.ttl));
    let _ = writeln!(
        out,
        "  fence:          {} (last issued: {})",
        info.fence.map_or_else(|| "-".to_owned(), |f| f.to_string()),
        info.last_fence
            .map_or_else(|| "none".to_owned(), |f| f.to_string())
    );
    let _ = writeln!(
        out,
        "  waiting:        {} service{}",
        info.waiting_services,
        if info.waiting_services == 1 { "" } else { "s" }
    );
    for w in &info.waiters {
        let callers = match w.waiting {
            Some(n) => format!("{n} caller{}", if n == 1 { "" } else { "s" }),
            None => "callers not reported".to_owned(),
        };
        let name = w.instance_name.as_deref().unwrap_or("-");
        let _ = writeln!(
            out,
            "    - {} ({}): {callers}",
            text(name),
            text(&w.service)
        );
    }
    let _ = writeln!(out, "  holders:        {}", info.holders.len());
    for h in &info.holders {
        let _ = writeln!(out, "    - {}", holder_line(h));
    }
    out
}

/// What `unlock` removed.
pub(crate) fn removed(info: &LockInfo) -> String {
    if let (true, Some(kept)) = (info.holders.is_empty(), &info.kept) {
        return format!(
            "removed {} `{}` ({}), done and kept for {} more, released by:\n    - {}\n",
            info.kind.noun(),
            text(&info.key),
            text(&info.redis_key),
            duration(kept.left),
            holder_line(&kept.holder)
        );
    }
    let mut out = format!(
        "removed {} `{}` ({}), held by {} holder{}:\n",
        info.kind.noun(),
        text(&info.key),
        text(&info.redis_key),
        info.holders.len(),
        if info.holders.len() == 1 { "" } else { "s" }
    );
    for h in &info.holders {
        let _ = writeln!(out, "    - {}", holder_line(h));
    }
    out
}

fn millis(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.as_millis() as u64))
}

/// Milliseconds since the epoch.
pub(crate) fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn holder_json(h: &Holder) -> Value {
    json!({
        "owner": h.owner,
        "request_id": h.request_id,
        "instance": h.instance,
        "instance_name": h.instance_name,
        "mode": h.mode.as_str(),
        "hold_count": h.hold_count,
        "granted_at_ms": h.granted_at.map(epoch_ms),
        "held_for_ms": millis(h.held_for),
        "lease_left_ms": millis(h.lease_left),
        "permits": h.permits,
    })
}

/// The JSON object of one lock.
pub(crate) fn json(info: &LockInfo) -> Value {
    let holders: Vec<Value> = info.holders.iter().map(holder_json).collect();
    let waiters: Vec<Value> = info
        .waiters
        .iter()
        .map(|w| {
            json!({
                "service": w.service,
                "instance_name": w.instance_name,
                "waiting": w.waiting,
            })
        })
        .collect();
    let kept = info.kept.as_ref().map(|k| {
        json!({
            "holder": holder_json(&k.holder),
            "left_ms": k.left.as_millis() as u64,
        })
    });
    json!({
        "key": info.key,
        "kind": info.kind.as_str(),
        "redis_key": info.redis_key,
        "held": info.is_held(),
        "holders": holders,
        "hold_count": info.hold_count,
        "ttl_ms": millis(info.ttl),
        "fence": info.fence,
        "last_fence": info.last_fence,
        "permits": info.permits,
        "waiting_services": info.waiting_services,
        "waiters": waiters,
        "kept": kept,
    })
}

/// A JSON array with one lock per line.
pub(crate) fn json_lines(locks: &[LockInfo]) -> String {
    if locks.is_empty() {
        return "[]\n".to_owned();
    }
    let lines: Vec<String> = locks.iter().map(|i| json(i).to_string()).collect();
    format!("[\n{}\n]\n", lines.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(Duration::from_millis(1234)), "1.2s");
        assert_eq!(duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(duration(Duration::from_secs(7800)), "2h10m");
        assert_eq!(lease(None), "-");
        assert_eq!(
            clock(UNIX_EPOCH + Duration::from_secs(3600 * 25 + 61)),
            "01:01:01"
        );
    }

    #[test]
    fn text_escapes_what_drives_a_terminal() {
        assert!(matches!(text("goods:42"), Cow::Borrowed("goods:42")));
        assert_eq!(text("a\x1b]0;t\x07b"), "a\\x1b]0;t\\x07b");
        assert_eq!(text("a\nb\r\t"), "a\\nb\\r\\t");
        assert_eq!(text("\x7f\u{9b}"), "\\x7f\\u{9b}");
        assert_eq!(text("\u{202e}fdp.exe\u{2066}"), "\\u{202e}fdp.exe\\u{2066}");
        assert_eq!(text("c:\\x1b"), "c:\\\\x1b");
        assert_eq!(text("ключ:7"), "ключ:7");
        assert_eq!(message("one\ntwo\x1b"), "one\ntwo\\x1b");
    }

    #[test]
    fn an_empty_list() {
        assert_eq!(table(&[]), "(no locks held)\n");
        assert_eq!(json_lines(&[]), "[]\n");
    }
}
