//! The background refresher: the snapshot of the locks it keeps (the list, when it was read,
//! why the last refresh failed, the header's probe of the servers), when that list is stale,
//! the events inferred between two lists (holds acquired, released, expired) and the runtime's
//! journal merged into them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{HoldMode, JournalEntry, JournalKind, LockInfo, LockKind, LockService};
use serde_json::{Value, json};

use super::nodes;
use crate::render;

/// How many recent events the console keeps.
const EVENTS_KEPT: usize = 200;

/// How often the Redis servers are probed for the header (more often while the list fails).
const NODES_EVERY: Duration = Duration::from_secs(5);

/// How many entries of the runtime's journal each refresh reads.
const JOURNAL_READ: usize = 50;

/// How many journal entries the console remembers having told (a journal read returns the
/// latest ones again).
const JOURNAL_SEEN: usize = 500;

/// How much longer than the time between two lists a hold's last seen lease may have been for
/// its disappearance to count as expired rather than released: the list is read over a while
/// (a scan), and the lease was read at some point of it.
const EXPIRY_MARGIN_MS: u64 = 250;

/// Lists the locks every interval, or sooner when woken, and keeps what it found.
pub(super) struct Refresher {
    locks: LockService,
    /// The locks listed, and the journal entries told: `lockctl serve PATTERN`.
    pattern: Option<String>,
    interval: Duration,
    snapshot: Mutex<Snapshot>,
    /// Wakes the refresher early (after an unlock).
    wake: tokio::sync::Notify,
}

/// What the console shows: the locks as last listed, the events, the last probe of the
/// servers.
#[derive(Default)]
pub(super) struct Snapshot {
    /// When the list was read (ms since the epoch): the last successful refresh; 0 before the
    /// first one.
    pub(super) taken_ms: u64,
    pub(super) locks: Vec<LockInfo>,
    /// Why the last refresh failed, if it did (`None` once one succeeded again).
    pub(super) error: Option<String>,
    /// The last refresh that failed, and why, also after later ones succeeded.
    pub(super) last_error: Option<(u64, String)>,
    /// When the refreshes started failing, while they fail.
    failing_since_ms: Option<u64>,
    pub(super) events: VecDeque<Value>,
    next_event: u64,
    /// Locks force-unlocked here since the last list: their holders are not "released".
    unlocked: Vec<(LockKind, String)>,
    /// The journal entries already among the events, oldest first (at most [`JOURNAL_SEEN`]).
    journal_seen: VecDeque<String>,
    /// The last probe of the Redis servers: when (ms) and what it found (the header's JSON),
    /// or why it failed.
    pub(super) nodes: Option<(u64, Result<Value, String>)>,
}

impl Refresher {
    pub(super) fn new(
        locks: LockService,
        pattern: Option<String>,
        interval: Duration,
    ) -> Refresher {
        Refresher {
            locks,
            pattern,
            interval,
            snapshot: Mutex::new(Snapshot::default()),
            wake: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn snapshot(&self) -> MutexGuard<'_, Snapshot> {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refreshes now rather than at the end of the interval (after an unlock).
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Refreshes every interval, or when woken, until the console is gone.
    pub(super) async fn run(refresher: Weak<Refresher>) {
        loop {
            let Some(r) = refresher.upgrade() else { return };
            let _ = tokio::time::timeout(r.interval, r.wake.notified()).await;
            r.refresh().await;
        }
    }

    /// Lists the locks and records what changed since the last list, and what the journal has
    /// that the events do not.
    pub(super) async fn refresh(&self) {
        let probed = self.snapshot().nodes.as_ref().map(|(at, _)| *at);
        let failing = self.snapshot().error.is_some();
        // the servers are probed beside the list, every few seconds, and at each refresh while the
        // list fails (the header then says which server is down)
        let probe_due = failing
            || probed
                .is_none_or(|at| now_ms().saturating_sub(at) >= NODES_EVERY.as_millis() as u64);
        let probe = async {
            match probe_due {
                true => Some(self.locks.nodes().await),
                false => None,
            }
        };
        let (listed, nodes) = tokio::join!(self.locks.list(self.pattern.as_deref()), probe);
        let taken = now_ms();
        if let Some(nodes) = nodes {
            let nodes = nodes
                .map(|n| nodes::nodes_json(&n))
                .map_err(|e| e.to_string());
            self.snapshot().nodes = Some((taken, nodes));
        }
        // the journal only adds events: when it cannot be read, the list still counts
        let journal = match &listed {
            Ok(_) => self.locks.journal(JOURNAL_READ).await.unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let mut snap = self.snapshot();
        match listed {
            Ok(locks) => {
                if snap.taken_ms != 0 {
                    let events = changes(&snap.locks, &locks, &snap.unlocked, snap.taken_ms, taken);
                    for event in events {
                        push_event(&mut snap, event);
                    }
                }
                // oldest first, so that the newest ends up first
                for entry in journal.iter().rev() {
                    let pattern = self.pattern.as_deref();
                    if !pattern.is_none_or(|p| glob_matches(p, &entry.key)) {
                        continue;
                    }
                    let id = journal_id(entry);
                    if snap.journal_seen.contains(&id) || told_here(&snap, entry) {
                        continue;
                    }
                    snap.journal_seen.push_back(id);
                    if snap.journal_seen.len() > JOURNAL_SEEN {
                        snap.journal_seen.pop_front();
                    }
                    push_event(&mut snap, journal_event(entry));
                }
                snap.unlocked.clear();
                snap.locks = locks;
                snap.taken_ms = taken;
                snap.error = None;
                snap.failing_since_ms = None;
            }
            Err(e) => {
                let message = e.to_string();
                snap.failing_since_ms.get_or_insert(taken);
                snap.last_error = Some((taken, message.clone()));
                snap.error = Some(message);
            }
        }
    }
}

impl Snapshot {
    /// Records a lock force-unlocked by this console: an event for each holder it removed,
    /// and the lock, whose holders the next list then does not tell as released.
    pub(super) fn force_unlocked(
        &mut self,
        kind: LockKind,
        key: &str,
        removed: &LockInfo,
        at: u64,
    ) {
        let kept = removed.kept.as_ref().map(|k| &k.holder);
        for h in removed.holders.iter().chain(kept) {
            push_event(self, event("force-unlocked", kind, key, h, at));
        }
        self.unlocked.push((kind, key.to_owned()));
    }
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whether the list shown is stale at `now` (ms), and since when: a refresh failed after it
/// was read, or it is older than two intervals (a refresh that hangs, on a Redis that stopped
/// answering without closing its connections).
pub(super) fn staleness(snap: &Snapshot, interval: Duration, now: u64) -> Option<u64> {
    let late_after = snap.taken_ms + 2 * interval.as_millis() as u64;
    match snap.failing_since_ms {
        Some(since) => Some(since.min(late_after)),
        None if now > late_after => Some(late_after),
        None => None,
    }
}

/// Adds an event, keeping the events newest first (a journal entry may be older than the
/// changes seen last).
fn push_event(snap: &mut Snapshot, mut event: Value) {
    event["id"] = json!(snap.next_event);
    snap.next_event += 1;
    let at = event["at_ms"].as_u64().unwrap_or(0);
    let place = snap
        .events
        .iter()
        .position(|e| e["at_ms"].as_u64().unwrap_or(0) <= at)
        .unwrap_or(snap.events.len());
    snap.events.insert(place, event);
    snap.events.truncate(EVENTS_KEPT);
}

/// Whether a journal entry is a force-unlock of this console, already told with its holders:
/// an event of the console's own for that lock at about that time.
fn told_here(snap: &Snapshot, entry: &JournalEntry) -> bool {
    let at = render::epoch_ms(entry.at);
    entry.what == JournalKind::ForceUnlocked
        && snap.events.iter().any(|e| {
            e["event"] == "force-unlocked"
                && e.get("source").is_none()
                && e["kind"] == entry.kind.as_str()
                && e["key"] == entry.key.as_str()
                && e["at_ms"].as_u64().is_some_and(|t| t.abs_diff(at) <= 5_000)
        })
}

/// What tells a journal entry apart from the others.
fn journal_id(entry: &JournalEntry) -> String {
    format!(
        "{}/{}/{}/{:?}/{:?}/{:?}",
        render::epoch_ms(entry.at),
        entry.what,
        entry.kind.as_str(),
        entry.key,
        entry.service,
        entry.owner
    )
}

/// The owner id in an owner field as Redis stores it (`<name>~<process>:<owner>`,
/// `<process>:<owner>`, `mesh:<owner>`; a process id is 32 hex digits).
fn owner_of_field(field: &str) -> &str {
    if let Some(owner) = field.strip_prefix("mesh:") {
        return owner;
    }
    let after_process = |s: &str| -> Option<usize> {
        let process = s.get(..32)?;
        (process.bytes().all(|b| b.is_ascii_hexdigit()) && s[32..].starts_with(':')).then_some(33)
    };
    if let Some(at) = after_process(field) {
        return &field[at..];
    }
    field
        .split_once('~')
        .and_then(|(_, rest)| Some(&rest[after_process(rest)?..]))
        .unwrap_or(field)
}

/// An event of the runtime's journal: a lock force-unlocked (by the service named), or a hold
/// lost (the service's).
fn journal_event(entry: &JournalEntry) -> Value {
    let owner = entry.owner.as_deref().map(owner_of_field);
    let mut event = json!({
        "at_ms": render::epoch_ms(entry.at),
        "event": entry.what.as_str(),
        "kind": entry.kind.as_str(),
        "key": entry.key,
        "owner": owner,
        "request_id": owner.and_then(lock_runtime::owner::request_id_of),
        "detail": entry.detail,
        "source": "journal",
    });
    match entry.what {
        JournalKind::ForceUnlocked => event["by"] = json!(entry.instance_name),
        _ => event["instance_name"] = json!(entry.instance_name),
    }
    event
}

/// Whether `key` matches the Redis glob `pattern` (`*`, `?`, `[abc]`, `[a-z]`, `[^a]`, `\x`).
fn glob_matches(pattern: &str, key: &str) -> bool {
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // p starts after `[`; the match and the length of the class up to its `]`
        let negate = matches!(p.first(), Some('^' | '!'));
        let mut i = usize::from(negate);
        let mut hit = false;
        while i < p.len() && p[i] != ']' {
            if p[i] == '\\' && i + 1 < p.len() {
                hit |= p[i + 1] == c;
                i += 2;
            } else if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
                hit |= (p[i]..=p[i + 2]).contains(&c);
                i += 3;
            } else {
                hit |= p[i] == c;
                i += 1;
            }
        }
        (i < p.len()).then_some((hit != negate, i + 1))
    }
    fn at(p: &[char], k: &[char]) -> bool {
        match p.first() {
            None => k.is_empty(),
            Some('*') => (0..=k.len()).any(|skip| at(&p[1..], &k[skip..])),
            Some('?') => !k.is_empty() && at(&p[1..], &k[1..]),
            Some('[') => match (
                k.first(),
                class(&p[1..], k.first().copied().unwrap_or('\0')),
            ) {
                (Some(_), Some((true, len))) => at(&p[1 + len..], &k[1..]),
                (_, Some(_)) => false,
                // an unclosed `[` is itself
                (_, None) => k.first() == Some(&'[') && at(&p[1..], &k[1..]),
            },
            Some('\\') if p.len() > 1 => k.first() == Some(&p[1]) && at(&p[2..], &k[1..]),
            Some(c) => k.first() == Some(c) && at(&p[1..], &k[1..]),
        }
    }
    let (p, k): (Vec<char>, Vec<char>) = (pattern.chars().collect(), key.chars().collect());
    at(&p, &k)
}

/// A hold as the events tell it apart: (field on Redis, mode).
type HoldId = (String, HoldMode);

fn holds(locks: &[LockInfo]) -> HashMap<(LockKind, &str), Vec<(HoldId, &lock_runtime::Holder)>> {
    let mut map = HashMap::new();
    for info in locks {
        let entry: &mut Vec<_> = map.entry((info.kind, info.key.as_str())).or_default();
        for h in &info.holders {
            entry.push(((h.field.clone(), h.mode), h));
        }
    }
    map
}

fn event(what: &str, kind: LockKind, key: &str, h: &lock_runtime::Holder, at: u64) -> Value {
    json!({
        "at_ms": at,
        "event": what,
        "kind": kind.as_str(),
        "key": key,
        "mode": h.mode.as_str(),
        "instance_name": h.instance_name,
        "owner": h.owner,
        "request_id": h.request_id,
        "permits": h.permits,
        "held_ms": h.held_for.map(|d| d.as_millis() as u64),
    })
}

/// The holds acquired, released and expired between two lists, read at `since` and `at` (ms).
///
/// A hold that is gone expired when its lease, as last seen, ran out before the second list
/// (within the time between the two, plus [`EXPIRY_MARGIN_MS`]); otherwise it was released.
/// Locks force-unlocked here meanwhile are told by their own events.
fn changes(
    before: &[LockInfo],
    after: &[LockInfo],
    unlocked: &[(LockKind, String)],
    since: u64,
    at: u64,
) -> Vec<Value> {
    let between = at.saturating_sub(since);
    let (old, new) = (holds(before), holds(after));
    let mut events = Vec::new();
    for info in before {
        let id = (info.kind, info.key.as_str());
        if unlocked.iter().any(|(k, key)| (*k, key.as_str()) == id) {
            continue; // already told as "force-unlocked"
        }
        let now = new.get(&id);
        for (hold, h) in &old[&id] {
            if !now.is_some_and(|n| n.iter().any(|(other, _)| other == hold)) {
                let what = match ran_out(h.lease_left, between) {
                    true => "expired",
                    false => "released",
                };
                events.push(event(what, info.kind, &info.key, h, at));
            }
        }
    }
    for info in after {
        let id = (info.kind, info.key.as_str());
        let was = old.get(&id);
        for (hold, h) in &new[&id] {
            if !was.is_some_and(|w| w.iter().any(|(other, _)| other == hold)) {
                events.push(event("acquired", info.kind, &info.key, h, at));
            }
        }
    }
    events
}

/// Whether a hold whose lease was `lease_left` at a list and that is gone `between` ms later
/// ran out of lease (rather than being released). A hold without a lease never runs out.
fn ran_out(lease_left: Option<Duration>, between: u64) -> bool {
    lease_left.is_some_and(|l| l.as_millis() as u64 <= between + EXPIRY_MARGIN_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_holds_expired_or_released() {
        let ms = Duration::from_millis;
        // the lease had 200 ms left and the next list came 300 ms later: it ran out
        assert!(ran_out(Some(ms(200)), 300));
        assert!(ran_out(Some(ms(300 + EXPIRY_MARGIN_MS)), 300));
        // 20 s left: somebody released it
        assert!(!ran_out(Some(ms(20_000)), 300));
        assert!(!ran_out(Some(ms(301 + EXPIRY_MARGIN_MS)), 300));
        assert!(!ran_out(None, 300));
    }

    #[test]
    fn staleness_after_failures_and_silence() {
        let interval = Duration::from_secs(1);
        let mut snap = Snapshot {
            taken_ms: 10_000,
            ..Snapshot::default()
        };
        assert_eq!(staleness(&snap, interval, 11_500), None);
        // no refresh for more than two intervals: stale since then
        assert_eq!(staleness(&snap, interval, 12_001), Some(12_000));
        // a failed refresh: stale at once
        snap.failing_since_ms = Some(11_000);
        assert_eq!(staleness(&snap, interval, 11_000), Some(11_000));
    }

    #[test]
    fn globs_as_redis_reads_them() {
        for (pattern, key, matches) in [
            ("goods:*", "goods:42", true),
            ("goods:*", "good:42", false),
            ("*", "", true),
            ("goods:?", "goods:4", true),
            ("goods:?", "goods:42", false),
            ("goods:[0-3]*", "goods:27", true),
            ("goods:[0-3]*", "goods:42", false),
            ("goods:[^0-3]*", "goods:42", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "axb", false),
            ("a[b", "a[b", true),
            ("*:job:*", "x:job:nightly", true),
        ] {
            assert_eq!(glob_matches(pattern, key), matches, "{pattern} {key}");
        }
    }

    #[test]
    fn owners_in_journal_fields() {
        let process = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            owner_of_field(&format!("orders-1~{process}:req-7#2")),
            "req-7#2"
        );
        assert_eq!(owner_of_field(&format!("{process}:a:b")), "a:b");
        assert_eq!(owner_of_field("mesh:op:7"), "op:7");
        assert_eq!(owner_of_field("plain"), "plain");
    }
}
