//! `lockctl serve`: a small web console over one lock service.
//!
//! A background task lists the locks every interval and keeps the latest list and the changes
//! seen between two lists (holds acquired, released, expired; locks force-unlocked here) merged
//! with the runtime's journal on Redis (locks force-unlocked and holds lost, by any service), with
//! when the last list was read and why the last refresh failed: a list older than two
//! intervals, or one kept after a failed refresh, is *stale*, and `/api/state` says so. The page
//! (HTML, JS and CSS embedded in the binary; nothing from a CDN) polls `GET /api/state` and
//! counts the leases down between polls. `POST /api/unlock` force-unlocks a lock when the
//! console was started with `--allow-unlock`, and answers 403 otherwise.
//!
//! The console has no login. What keeps other sites' pages out of it, on whatever address it
//! listens:
//!
//! * it answers only requests whose `Host` names it: a loopback name (`localhost`,
//!   `127.0.0.1`, `[::1]`), the address it listens on or the one the connection reached (an IP
//!   literal), with its port, or a name given with `--allow-host NAME[:PORT]`; anything else
//!   gets 421. A page of another site whose host name was rebound to the console's address
//!   (DNS rebinding) sends its own name, so it can neither read the locks nor unlock one;
//! * a request that says where it comes from (`Origin`) must come from one of those names
//!   (403 otherwise);
//! * an unlock must carry the token embedded in the page (`X-Lockctl-Token`, random for each
//!   start of the console, compared in constant time; 403 without it), so only the console's
//!   own page, as served to a browser that could read it, unlocks.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Json, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use lock_runtime::{
    HoldMode, JournalEntry, JournalKind, LockInfo, LockKind, LockService, RedisNodes, Topology,
};
use serde_json::{Value, json};

use crate::{Failure, render};

/// Where the console listens unless `--listen` says otherwise.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7373";

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

const INDEX_HTML: &str = include_str!("../assets/console.html");
const CONSOLE_JS: &str = include_str!("../assets/console.js");
const CONSOLE_CSS: &str = include_str!("../assets/console.css");

/// The page may load only what the binary serves.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// The header by which the page sends its unlock token.
const TOKEN_HEADER: &str = "x-lockctl-token";

/// Where the page template takes the token.
const TOKEN_SLOT: &str = "{{unlock-token}}";

/// A host name (or IP literal) the console answers to besides its own addresses:
/// `--allow-host NAME[:PORT]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllowedHost {
    /// Lowercase; an IPv6 literal in brackets.
    name: String,
    /// `None`: any port (and none).
    port: Option<u16>,
}

/// Parses `--allow-host`: `NAME`, `NAME:PORT`, `[IPV6]`, `[IPV6]:PORT`.
pub(crate) fn parse_allowed_host(text: &str) -> Result<AllowedHost, String> {
    let (name, port) = split_host(text).ok_or_else(|| {
        format!("{text:?} is not a host name with an optional port, like locks.example:7373")
    })?;
    Ok(AllowedHost { name, port })
}

/// A `Host` header (or the host part of an `Origin`): its lowercase name (an IPv6 literal in
/// brackets) and port; `None` when it is no host name.
fn split_host(text: &str) -> Option<(String, Option<u16>)> {
    let (name, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            after => Some(after.strip_prefix(':')?),
        };
        (format!("[{inside}]"), port)
    } else {
        match text.split_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (text.to_owned(), None),
        }
    };
    let port = match port {
        Some(port) => Some(port.parse::<u16>().ok()?),
        None => None,
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
    if name.is_empty() || !(name.starts_with('[') || name.chars().all(plain)) {
        return None;
    }
    Some((name.to_ascii_lowercase(), port))
}

/// `ip` as a `Host` names it: `10.0.0.5`, `[fe80::1]`.
fn host_name(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The local address a connection reached (an unspecified `--listen` address serves several).
#[derive(Debug, Clone, Copy)]
struct LocalAddr(Option<SocketAddr>);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for LocalAddr {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        LocalAddr(stream.io().local_addr().ok())
    }
}

/// Compares a token with the console's in time that depends only on their lengths.
fn same_token(given: &[u8], token: &[u8]) -> bool {
    if given.len() != token.len() {
        return false;
    }
    let differ = given
        .iter()
        .zip(token)
        .fold(0u8, |acc, (a, b)| std::hint::black_box(acc | (a ^ b)));
    differ == 0
}

/// A random token of 32 bytes, in hex.
fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) listen: SocketAddr,
    pub(crate) allow_unlock: bool,
    pub(crate) allow_hosts: Vec<AllowedHost>,
    pub(crate) pattern: Option<String>,
    pub(crate) interval: Duration,
}

struct Console {
    locks: LockService,
    options: Options,
    /// The address bound (the port is the OS's when `--listen` gave port 0).
    bound: SocketAddr,
    /// What an unlock must carry in [`TOKEN_HEADER`]; embedded in the page.
    token: String,
    /// The page, with the token.
    page: String,
    snapshot: Mutex<Snapshot>,
    /// Wakes the refresher early (after an unlock).
    refresh: tokio::sync::Notify,
}

#[derive(Default)]
struct Snapshot {
    /// When the list was read (ms since the epoch): the last successful refresh; 0 before the
    /// first one.
    taken_ms: u64,
    locks: Vec<LockInfo>,
    /// Why the last refresh failed, if it did (`None` once one succeeded again).
    error: Option<String>,
    /// The last refresh that failed, and why, also after later ones succeeded.
    last_error: Option<(u64, String)>,
    /// When the refreshes started failing, while they fail.
    failing_since_ms: Option<u64>,
    events: VecDeque<Value>,
    next_event: u64,
    /// Locks force-unlocked here since the last list: their holders are not "released".
    unlocked: Vec<(LockKind, String)>,
    /// The journal entries already among the events, oldest first (at most [`JOURNAL_SEEN`]).
    journal_seen: VecDeque<String>,
    /// The last probe of the Redis servers: when (ms) and what it found (the header's JSON),
    /// or why it failed.
    nodes: Option<(u64, Result<Value, String>)>,
}

impl Console {
    fn snapshot(&self) -> MutexGuard<'_, Snapshot> {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a `Host` header (or an origin's host) names this console: a loopback name or
    /// the address listened on or reached (`local`), with the console's port (none for port
    /// 80), or a name of `--allow-host`.
    fn answers_to(&self, host: &str, local: Option<SocketAddr>) -> bool {
        let Some((name, port)) = split_host(host) else {
            return false;
        };
        let own_port = self.bound.port();
        let own = port == Some(own_port) || (port.is_none() && own_port == 80);
        let mut addresses = vec![self.bound.ip()];
        addresses.extend(local.map(|l| l.ip()));
        let own_name = ["localhost", "127.0.0.1", "[::1]"].contains(&name.as_str())
            || addresses
                .iter()
                .any(|ip| !ip.is_unspecified() && host_name(*ip) == name);
        if own && own_name {
            return true;
        }
        self.options
            .allow_hosts
            .iter()
            .any(|a| a.name == name && (a.port.is_none() || a.port == port))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Serves the console until Ctrl-C.
pub(crate) async fn serve(locks: LockService, options: Options) -> Result<(), Failure> {
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| Failure::Usage(format!("cannot listen on {}: {e}", options.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::Usage(format!("cannot listen on {}: {e}", options.listen)))?;
    if !bound.ip().is_loopback() {
        eprintln!(
            "lockctl: warning: the console listens on {bound}, not on loopback: whoever can \
             reach it sees every lock and holder{}; it answers to its IP addresses and the \
             names given with --allow-host",
            if options.allow_unlock {
                " and can force-unlock them"
            } else {
                ""
            }
        );
    }
    let token = new_token();
    let page = INDEX_HTML.replace(TOKEN_SLOT, &token);
    println!(
        "lockctl console on http://{bound}/ (redis {}, prefix {:?}, force-unlock {})",
        locks.config().topology().mode(),
        locks.config().prefix(),
        if options.allow_unlock { "on" } else { "off" }
    );
    let console = Arc::new(Console {
        locks,
        options,
        bound,
        token,
        page,
        snapshot: Mutex::new(Snapshot::default()),
        refresh: tokio::sync::Notify::new(),
    });
    refresh(&console).await;
    tokio::spawn(refresher(Arc::downgrade(&console)));
    let app = Router::new()
        .route("/", get(index))
        .route("/console.js", get(script))
        .route("/console.css", get(style))
        .route("/api/state", get(state))
        .route("/api/unlock", post(unlock))
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<LocalAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| Failure::Usage(format!("the console stopped: {e}")))
}

async fn refresher(console: std::sync::Weak<Console>) {
    loop {
        let Some(c) = console.upgrade() else { return };
        let interval = c.options.interval;
        let _ = tokio::time::timeout(interval, c.refresh.notified()).await;
        refresh(&c).await;
    }
}

/// Lists the locks and records what changed since the last list, and what the journal has
/// that the events do not.
async fn refresh(console: &Console) {
    let probed = console.snapshot().nodes.as_ref().map(|(at, _)| *at);
    let failing = console.snapshot().error.is_some();
    // the servers are probed beside the list, every few seconds, and at each refresh while the
    // list fails (the header then says which server is down)
    let probe_due = failing
        || probed.is_none_or(|at| now_ms().saturating_sub(at) >= NODES_EVERY.as_millis() as u64);
    let probe = async {
        match probe_due {
            true => Some(console.locks.nodes().await),
            false => None,
        }
    };
    let (listed, nodes) = tokio::join!(
        console.locks.list(console.options.pattern.as_deref()),
        probe
    );
    let taken = now_ms();
    if let Some(nodes) = nodes {
        let nodes = nodes.map(|n| nodes_json(&n)).map_err(|e| e.to_string());
        console.snapshot().nodes = Some((taken, nodes));
    }
    // the journal only adds events: when it cannot be read, the list still counts
    let journal = match &listed {
        Ok(_) => console
            .locks
            .journal(JOURNAL_READ)
            .await
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let mut snap = console.snapshot();
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
                let pattern = console.options.pattern.as_deref();
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

/// Whether the list shown is stale at `now` (ms), and since when: a refresh failed after it
/// was read, or it is older than two intervals (a refresh that hangs, on a Redis that stopped
/// answering without closing its connections).
fn staleness(snap: &Snapshot, interval: Duration, now: u64) -> Option<u64> {
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

/// Refuses requests whose `Host` does not name the console (421: a page of another site that
/// points its host name at the console's address must not read the locks) or whose `Origin`
/// is another site (403), and sets the security headers of every answer.
async fn guard(State(console): State<Arc<Console>>, request: Request, next: Next) -> Response {
    let local = request
        .extensions()
        .get::<ConnectInfo<LocalAddr>>()
        .and_then(|c| c.0.0);
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if !host.is_some_and(|host| console.answers_to(host, local)) {
        let message = format!(
            "misdirected request: the Host header ({}) does not name this console; it answers \
             to localhost, 127.0.0.1, [::1] and its own address with its port, and to the \
             names given with `lockctl serve --allow-host NAME[:PORT]`\n",
            host.map_or_else(|| "none".to_owned(), |h| format!("{h:?}"))
        );
        return (StatusCode::MISDIRECTED_REQUEST, message).into_response();
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let named = origin
            .to_str()
            .ok()
            .and_then(|o| {
                o.strip_prefix("http://")
                    .or_else(|| o.strip_prefix("https://"))
            })
            .is_some_and(|host| console.answers_to(host, local));
        if !named {
            let message = format!(
                "forbidden: requests from the origin {origin:?} are refused; the console takes \
                 them only from its own page\n"
            );
            return (StatusCode::FORBIDDEN, message).into_response();
        }
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn index(State(console): State<Arc<Console>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        console.page.clone(),
    )
        .into_response()
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", CONSOLE_JS)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", CONSOLE_CSS)
}

/// The host and port (or socket path) of a Redis URL, without its user, password or query;
/// `None` when that cannot be told safely (an `@` after the host: a password with a `/`, `?`
/// or `#` in it, or in a query).
fn address_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if tail.contains('@') {
        return None;
    }
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if !host.is_empty() {
        return Some(host);
    }
    // a Unix socket (`redis+unix:///run/redis.sock`): its path
    let path = tail.split(['?', '#']).next().unwrap_or_default();
    (!path.is_empty()).then_some(path)
}

/// The servers the configuration names, with their roles there.
fn configured_nodes(topology: &Topology) -> Vec<(&str, &'static str)> {
    fn shown(url: &str) -> &str {
        address_of(url).unwrap_or("(address not shown)")
    }
    match topology {
        Topology::Single { url } => vec![(shown(url), "master")],
        Topology::Cluster { nodes } => nodes.iter().map(|n| (shown(n), "seed")).collect(),
        Topology::Sentinel { sentinels, .. } => {
            sentinels.iter().map(|n| (shown(n), "sentinel")).collect()
        }
        Topology::MasterSlave { master, replicas } => std::iter::once((shown(master), "master"))
            .chain(replicas.iter().map(|r| (shown(r), "replica")))
            .collect(),
        _ => Vec::new(),
    }
}

/// The servers `nodes()` found, as the page's header shows them.
fn nodes_json(nodes: &RedisNodes) -> Value {
    let list: Vec<Value> = nodes
        .nodes
        .iter()
        .map(|n| {
            json!({
                "address": n.address,
                "role": n.role.as_str(),
                "healthy": n.healthy,
                "latency_ms": n.latency.map(|l| l.as_secs_f64() * 1000.0),
                "replica_of": n.replica_of,
                "detail": n.detail,
            })
        })
        .collect();
    json!({ "mode": nodes.mode, "nodes": list })
}

/// The topology as the page's header shows it: the servers as last probed (`"health":
/// "probe"`, with `probed_ms`); before the first probe, or when no server answered it, the
/// nodes of the configuration, healthy while the console's refreshes succeed (`"health":
/// "refresh"`).
fn redis_json(
    topology: &Topology,
    probe: Option<&(u64, Result<Value, String>)>,
    healthy: bool,
) -> Value {
    let master_name = match topology {
        Topology::Sentinel { master_name, .. } => Some(master_name.as_str()),
        _ => None,
    };
    if let Some((at, Ok(found))) = probe {
        let mut found = found.clone();
        found["master_name"] = json!(master_name);
        found["health"] = json!("probe");
        found["probed_ms"] = json!(at);
        return found;
    }
    let failed = probe.and_then(|(_, r)| r.as_ref().err());
    let nodes: Vec<Value> = configured_nodes(topology)
        .into_iter()
        .map(|(address, role)| {
            json!({
                "address": address,
                "role": role,
                "healthy": healthy && failed.is_none(),
                "latency_ms": null,
                "detail": failed,
            })
        })
        .collect();
    json!({
        "mode": topology.mode(),
        "master_name": master_name,
        "nodes": nodes,
        "health": "refresh",
    })
}

async fn state(State(console): State<Arc<Console>>) -> Json<Value> {
    let snap = console.snapshot();
    let config = console.locks.config();
    let now = now_ms();
    let stale_since = staleness(&snap, console.options.interval, now);
    Json(json!({
        "now_ms": now,
        "taken_ms": snap.taken_ms,
        "last_ok_ms": (snap.taken_ms != 0).then_some(snap.taken_ms),
        "last_error": snap.last_error.as_ref().map(|(at, message)| {
            json!({ "at_ms": at, "message": message })
        }),
        "stale": stale_since.is_some(),
        "stale_since_ms": stale_since,
        "interval_ms": console.options.interval.as_millis() as u64,
        "allow_unlock": console.options.allow_unlock,
        "mode": config.topology().mode(),
        "redis": redis_json(config.topology(), snap.nodes.as_ref(), stale_since.is_none()),
        "prefix": config.prefix(),
        "pattern": console.options.pattern,
        "error": snap.error,
        "locks": snap.locks.iter().map(render::json).collect::<Vec<_>>(),
        "events": snap.events.iter().take(50).collect::<Vec<_>>(),
    }))
}

/// `{"kind": "mutex" | "rw" | "semaphore", "key": "..."}`
async fn unlock(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let refuse = |status: StatusCode, message: String| {
        (status, Json(json!({ "error": message }))).into_response()
    };
    if !console.options.allow_unlock {
        return refuse(
            StatusCode::FORBIDDEN,
            "force-unlock is off: start the console with `lockctl serve --allow-unlock`".into(),
        );
    }
    // Host and Origin were checked by the guard; only the console's page knows the token
    let token = headers.get(TOKEN_HEADER).map(|t| t.as_bytes());
    if !token.is_some_and(|t| same_token(t, console.token.as_bytes())) {
        return refuse(
            StatusCode::FORBIDDEN,
            "unlock refused: the unlock token of the console's page is missing or wrong \
             (header X-Lockctl-Token; reload the page after the console restarted)"
                .into(),
        );
    }
    let (Some(kind), Some(key)) = (
        body.get("kind").and_then(Value::as_str),
        body.get("key").and_then(Value::as_str),
    ) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "expected {\"kind\": \"mutex\" | \"rw\" | \"semaphore\", \"key\": \"...\"}".into(),
        );
    };
    let kind: LockKind = match kind.parse() {
        Ok(kind) => kind,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match console.locks.force_unlock_kind(kind, key).await {
        Ok(Some(removed)) => {
            let at = now_ms();
            {
                let mut snap = console.snapshot();
                let kept = removed.kept.as_ref().map(|k| &k.holder);
                for h in removed.holders.iter().chain(kept) {
                    push_event(&mut snap, event("force-unlocked", kind, key, h, at));
                }
                snap.unlocked.push((kind, key.to_owned()));
            }
            console.refresh.notify_one();
            Json(json!({ "removed": render::json(&removed) })).into_response()
        }
        Ok(None) => refuse(
            StatusCode::NOT_FOUND,
            format!("nothing removed: {} `{key}` is not held", kind.noun()),
        ),
        Err(e) => refuse(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        let parsed = |s: &str| split_host(s);
        assert_eq!(
            parsed("Locks.Example:80"),
            Some(("locks.example".into(), Some(80)))
        );
        assert_eq!(parsed("localhost"), Some(("localhost".into(), None)));
        assert_eq!(parsed("[::1]:7373"), Some(("[::1]".into(), Some(7373))));
        assert_eq!(parsed("[::1]"), Some(("[::1]".into(), None)));
        for bad in [
            "", ":80", "a:b", "a:1:2", "::1", "[::1", "[x]:1", "a/b", "a b", "a:",
        ] {
            assert_eq!(parsed(bad), None, "{bad}");
        }
        assert!(parse_allowed_host("http://x").is_err());
        assert_eq!(
            parse_allowed_host("Proxy.Example:8443"),
            Ok(AllowedHost {
                name: "proxy.example".into(),
                port: Some(8443)
            })
        );
    }

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

    #[test]
    fn addresses_without_credentials() {
        assert_eq!(address_of("redis://127.0.0.1:6379"), Some("127.0.0.1:6379"));
        assert_eq!(
            address_of("rediss://ops:s3cret@redis.internal:6380/2?db=1"),
            Some("redis.internal:6380")
        );
        assert_eq!(address_of("redis://:p@w@host:1"), Some("host:1"));
        assert_eq!(
            address_of("redis+unix:///run/redis.sock?db=1"),
            Some("/run/redis.sock")
        );
        // where the password ends is unclear: nothing shown
        assert_eq!(address_of("redis://u:p?w@host:1"), None);
        assert_eq!(address_of("redis://u:1234/x@host:1"), None);
        assert_eq!(address_of("redis://host:1?password=p@ss"), None);
        let topology = Topology::MasterSlave {
            master: "redis://u:pw@10.0.0.1:6379".into(),
            replicas: vec!["redis://10.0.0.2:6379?password=pw".into()],
        };
        let shown = redis_json(&topology, None, true).to_string();
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("10.0.0.1:6379"), "{shown}");
        assert!(shown.contains("10.0.0.2:6379"), "{shown}");
    }

    #[test]
    fn tokens() {
        let token = new_token();
        assert_eq!(token.len(), 64);
        assert_ne!(token, new_token());
        assert!(same_token(token.as_bytes(), token.as_bytes()));
        assert!(!same_token(b"", token.as_bytes()));
        assert!(!same_token(&token.as_bytes()[1..], token.as_bytes()));
        let mut other = token.clone().into_bytes();
        other[63] ^= 1;
        assert!(!same_token(&other, token.as_bytes()));
        assert!(INDEX_HTML.contains(TOKEN_SLOT));
    }

    #[test]
    fn the_assets_load_nothing_from_elsewhere() {
        for asset in [INDEX_HTML, CONSOLE_JS, CONSOLE_CSS] {
            assert!(!asset.contains("http://"), "{asset}");
            assert!(!asset.contains("https://"), "{asset}");
        }
        // holders' names come from request input: never parsed as HTML
        assert!(!CONSOLE_JS.contains("innerHTML"));
    }
}
