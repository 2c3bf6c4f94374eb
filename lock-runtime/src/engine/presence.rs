//! What a service tells operators through Redis, off the lock path, with plain commands (no
//! script call, no lock key touched): which locks its callers wait for, and a journal of the
//! rare events another process cannot see - force-unlocks and holds lost while held. Both are
//! read by `inspect`, `list` and `journal` (lockctl, its console). A failure here is logged and
//! never reaches a lock call.
//!
//! * Reports: the hash `<prefix>services`, one field per service with waiting callers: its id
//!   -> `<until, unix ms>` followed by one `\n<lock key>\t<callers>` per lock. A service
//!   reports every second while callers wait (and once more, empty, when none are left: the
//!   field goes), each report lasts three seconds, and the hash expires three seconds after
//!   the last report of any service; a report that ran out (its service died) is ignored by
//!   readers and removed by the next service to report after a while.
//! * The journal: the stream `<prefix>journal`, about the last 500 entries, expiring a week
//!   after the last one; fields `what` (`force-unlocked`, `lost`), `kind`, `key`, `by` (the
//!   service id), `owner` (a lost hold's owner field) and `detail` (why it was lost).

use std::collections::HashMap;
use std::sync::Weak;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::core::Engine;
use crate::error::LockError;
use crate::events::LockEvent;
use crate::inspect::{JournalEntry, JournalKind, ServiceWaiters, service_name};
use crate::vocab::LockKind;

/// How often a service with waiting callers reports them.
pub(crate) const REPORT_PERIOD: Duration = Duration::from_secs(1);
/// How long a report lasts: three periods, so one late report does not drop a service.
const REPORT_TTL: Duration = Duration::from_secs(3);
/// Reports that ran out this long ago are removed (generous: the clocks of the services'
/// machines may differ a little).
const REPORT_STALE: Duration = Duration::from_secs(30);
/// About how many entries the journal keeps.
const JOURNAL_KEPT: u32 = 500;
/// The journal expires this long after its last entry.
const JOURNAL_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Engine {
    /// The services hash (see `presence.lua`).
    pub(crate) fn services_key(&self) -> String {
        format!("{}services", self.config.prefix())
    }

    /// The journal stream (see `journal.lua`).
    pub(crate) fn journal_key(&self) -> String {
        format!("{}journal", self.config.prefix())
    }
}

/// Reports waiting callers and journals rare events until the service is dropped or shuts
/// down.
pub(crate) async fn run(inner: Weak<Engine>) {
    let Some((closing, Some(mut events))) = inner
        .upgrade()
        .map(|inner| (inner.closing.clone(), inner.events.take_journal()))
    else {
        return;
    };
    let mut tick = tokio::time::interval(REPORT_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported = false;
    let mut reports = 0u32;
    loop {
        tokio::select! {
            () = closing.cancelled() => {
                if let Some(inner) = inner.upgrade().filter(|_| reported) {
                    report(&inner, "").await;
                }
                return;
            }
            _ = tick.tick() => {
                let Some(inner) = inner.upgrade() else { return };
                let lines = report_lines(&inner);
                if !lines.is_empty() || reported {
                    reported = report(&inner, &lines).await && !lines.is_empty();
                    reports = reports.wrapping_add(1);
                    if reports % 30 == 1 {
                        prune(&inner).await;
                    }
                }
            }
            event = events.recv() => {
                let (Some(event), Some(inner)) = (event, inner.upgrade()) else { return };
                if !journal_event(&inner, &event).await {
                    // Redis is away: what queued meanwhile would reach it late, each entry
                    // after a timeout of its own; drop it
                    let mut dropped = 0;
                    while events.try_recv().is_ok() {
                        dropped += 1;
                    }
                    if dropped > 0 {
                        tracing::debug!(dropped, "journal entries dropped");
                    }
                }
            }
        }
    }
}

/// This service's waiting callers: one `\n<lock key>\t<callers>` per lock, with `%`, a line
/// break and a tab of the key written `%25`, `%0A`, `%09`.
fn report_lines(inner: &Engine) -> String {
    inner
        .local
        .waiting_lines()
        .iter()
        .map(|(key, n)| format!("\n{}\t{n}", report_key(key)))
        .collect()
}

/// A lock key as a report line holds it.
fn report_key(key: &str) -> String {
    key.replace('%', "%25")
        .replace('\n', "%0A")
        .replace('\t', "%09")
}

/// A lock key as [`report_key`] wrote it.
fn reported_key(text: &str) -> String {
    text.replace("%0A", "\n")
        .replace("%09", "\t")
        .replace("%25", "%")
}

/// Writes this service's report (`""` removes it); whether Redis took it.
async fn report(inner: &Engine, lines: &str) -> bool {
    let key = inner.services_key();
    let result = if lines.is_empty() {
        inner
            .backend
            .command::<i64>(
                "report",
                redis::cmd("HDEL").arg(&key).arg(&inner.service_id),
            )
            .await
    } else {
        let until = unix_ms(SystemTime::now()) + millis(REPORT_TTL);
        let set = inner
            .backend
            .command::<i64>(
                "report",
                redis::cmd("HSET")
                    .arg(&key)
                    .arg(&inner.service_id)
                    .arg(format!("{until}{lines}")),
            )
            .await;
        match set {
            Ok(_) => {
                inner
                    .backend
                    .command::<i64>(
                        "report",
                        redis::cmd("PEXPIRE").arg(&key).arg(millis(REPORT_TTL)),
                    )
                    .await
            }
            e => e,
        }
    };
    match result {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(error = %e, "could not report waiting callers");
            false
        }
    }
}

/// Removes the reports of services that stopped reporting long ago.
async fn prune(inner: &Engine) {
    let key = inner.services_key();
    let Ok(fields) = inner
        .backend
        .command::<Vec<(String, String)>>("report", redis::cmd("HGETALL").arg(&key))
        .await
    else {
        return;
    };
    let stale = unix_ms(SystemTime::now()).saturating_sub(millis(REPORT_STALE));
    let dead: Vec<&String> = fields
        .iter()
        .filter(|(_, report)| report_until(report) < stale)
        .map(|(service, _)| service)
        .collect();
    if !dead.is_empty() {
        let result = inner
            .backend
            .command::<i64>("report", redis::cmd("HDEL").arg(&key).arg(dead))
            .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "could not remove stale reports");
        }
    }
}

/// When a report runs out (unix ms).
fn report_until(report: &str) -> u64 {
    report
        .split('\n')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// Journals a force-unlock by this service or a hold of it lost while held; whether Redis took
/// it.
async fn journal_event(inner: &Engine, event: &LockEvent) -> bool {
    let (what, owner, detail) = match event {
        LockEvent::Lost { owner, reason, .. } => (
            JournalKind::Lost,
            Some(inner.owner_field(owner).to_string()),
            reason.to_string(),
        ),
        LockEvent::ForceUnlocked { .. } => (JournalKind::ForceUnlocked, None, String::new()),
        _ => return true,
    };
    let key = inner.journal_key();
    let mut add = redis::cmd("XADD");
    add.arg(&key)
        .arg("MAXLEN")
        .arg("~")
        .arg(JOURNAL_KEPT)
        .arg("*")
        .arg("what")
        .arg(what.as_str())
        .arg("kind")
        .arg(event.kind().as_str())
        .arg("key")
        .arg(event.key())
        .arg("by")
        .arg(&inner.service_id);
    if let Some(owner) = owner {
        add.arg("owner").arg(owner);
    }
    if !detail.is_empty() {
        add.arg("detail").arg(detail);
    }
    let result = match inner.backend.command::<String>("journal", &add).await {
        Ok(_) => {
            inner
                .backend
                .command::<i64>(
                    "journal",
                    redis::cmd("PEXPIRE").arg(&key).arg(millis(JOURNAL_TTL)),
                )
                .await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(error = %e, "could not journal an event");
            false
        }
    }
}

/// The waiting callers every service reported, per lock key on Redis: (service id, callers);
/// reports that ran out are left out.
pub(crate) async fn reported_waiters(
    inner: &Engine,
) -> Result<HashMap<String, Vec<(String, u32)>>, LockError> {
    let fields: Vec<(String, String)> = inner
        .backend
        .command("services", redis::cmd("HGETALL").arg(inner.services_key()))
        .await?;
    let now = unix_ms(SystemTime::now());
    let mut by_lock: HashMap<String, Vec<(String, u32)>> = HashMap::new();
    for (service, report) in fields {
        if report_until(&report) <= now {
            continue;
        }
        for line in report.split('\n').skip(1) {
            if let Some((lock, Ok(n))) = line.split_once('\t').map(|(l, n)| (l, n.parse())) {
                by_lock
                    .entry(reported_key(lock))
                    .or_default()
                    .push((service.clone(), n));
            }
        }
    }
    Ok(by_lock)
}

/// The waiters of the lock `lock` (its key on Redis): this service's counted now, the others
/// as they reported them, and services registered as waiting on Redis (`registered`) that did
/// not report, with an unknown count; sorted by service.
pub(crate) fn waiters_of(
    inner: &Engine,
    lock: &str,
    registered: &[String],
    reported: Option<&[(String, u32)]>,
) -> Vec<ServiceWaiters> {
    let mut counts: HashMap<&str, Option<u32>> = HashMap::new();
    for service in registered {
        counts.insert(service, None);
    }
    for (service, n) in reported.unwrap_or_default() {
        counts.insert(service, Some(*n));
    }
    let here = u32::try_from(inner.local.waiting_for(lock)).unwrap_or(u32::MAX);
    if here > 0 {
        counts.insert(&inner.service_id, Some(here));
    } else {
        counts.remove(inner.service_id.as_str());
    }
    let mut waiters: Vec<ServiceWaiters> = counts
        .into_iter()
        .map(|(service, waiting)| ServiceWaiters {
            service: service.to_owned(),
            instance_name: service_name(service).map(str::to_owned),
            waiting,
        })
        .collect();
    waiters.sort_by(|a, b| a.service.cmp(&b.service));
    waiters
}

/// Adds the counts other services reported for a lock to `waiters` (as [`waiters_of`] gives
/// them without reports); this service's own count stays the one counted here.
pub(crate) fn add_reported(
    inner: &Engine,
    waiters: &mut Vec<ServiceWaiters>,
    reported: &[(String, u32)],
) {
    for (service, n) in reported {
        if *service == inner.service_id {
            continue;
        }
        match waiters.iter_mut().find(|w| w.service == *service) {
            Some(w) => w.waiting = Some(*n),
            None => waiters.push(ServiceWaiters {
                service: service.clone(),
                instance_name: service_name(service).map(str::to_owned),
                waiting: Some(*n),
            }),
        }
    }
    waiters.sort_by(|a, b| a.service.cmp(&b.service));
}

/// The latest `limit` entries of the journal, newest first.
pub(crate) async fn journal(inner: &Engine, limit: usize) -> Result<Vec<JournalEntry>, LockError> {
    let entries: Vec<(String, Vec<(String, String)>)> = inner
        .backend
        .command(
            "journal",
            redis::cmd("XREVRANGE")
                .arg(inner.journal_key())
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(limit.max(1)),
        )
        .await?;
    Ok(entries
        .into_iter()
        .filter_map(|(id, fields)| {
            let fields: HashMap<String, String> = fields.into_iter().collect();
            let ms: u64 = id.split_once('-').map_or(&*id, |(ms, _)| ms).parse().ok()?;
            let by = fields.get("by").cloned();
            Some(JournalEntry {
                at: UNIX_EPOCH + Duration::from_millis(ms),
                what: JournalKind::parse(fields.get("what")?)?,
                kind: fields.get("kind")?.parse::<LockKind>().ok()?,
                key: fields.get("key")?.clone(),
                instance_name: by.as_deref().and_then(service_name).map(str::to_owned),
                service: by,
                owner: fields.get("owner").cloned(),
                detail: fields.get("detail").cloned(),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_keys_keep_line_breaks_tabs_and_percents() {
        for key in ["lock:{a}", "lock:{a\nb\t%0A%}", "lock:{%25}"] {
            let written = report_key(key);
            assert!(!written.contains(['\n', '\t']));
            assert_eq!(reported_key(&written), key);
        }
        assert_eq!(
            report_until("1700000000000\nlock:{a}\t2"),
            1_700_000_000_000
        );
        assert_eq!(report_until("junk"), 0);
    }
}
