//! `lockctl serve`: a small web console over one lock service.
//!
//! A background task lists the locks every interval and keeps the latest list and the changes
//! seen between two lists (holds acquired and released, locks force-unlocked here). The page
//! (HTML, JS and CSS embedded in the binary; nothing from a CDN) polls `GET /api/state` and
//! counts the leases down between polls. `POST /api/unlock` force-unlocks a lock when the
//! console was started with `--allow-unlock`, and answers 403 otherwise.
//!
//! The console has no login: it binds to loopback unless told otherwise, answers only requests
//! whose `Host` is the loopback address it listens on (no DNS rebinding) when it does, and takes
//! an unlock only as a JSON body from its own origin (no cross-site form posts).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Json, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lock_runtime::{HoldMode, LockInfo, LockKind, LockService};
use serde_json::{Value, json};

use crate::{Failure, render};

/// Where the console listens unless `--listen` says otherwise.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7373";

/// How many recent events the console keeps.
const EVENTS_KEPT: usize = 200;

const INDEX_HTML: &str = include_str!("../assets/console.html");
const CONSOLE_JS: &str = include_str!("../assets/console.js");
const CONSOLE_CSS: &str = include_str!("../assets/console.css");

/// The page may load only what the binary serves.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) listen: SocketAddr,
    pub(crate) allow_unlock: bool,
    pub(crate) pattern: Option<String>,
    pub(crate) interval: Duration,
}

struct Console {
    locks: LockService,
    options: Options,
    /// The address bound (the port is the OS's when `--listen` gave port 0).
    bound: SocketAddr,
    snapshot: Mutex<Snapshot>,
    /// Wakes the refresher early (after an unlock).
    refresh: tokio::sync::Notify,
}

#[derive(Default)]
struct Snapshot {
    /// When the list was read (ms since the epoch); 0 before the first one.
    taken_ms: u64,
    locks: Vec<LockInfo>,
    /// Why the last refresh failed, if it did.
    error: Option<String>,
    events: VecDeque<Value>,
    next_event: u64,
    /// Locks force-unlocked here since the last list: their holders are not "released".
    unlocked: Vec<(LockKind, String)>,
}

impl Console {
    fn snapshot(&self) -> MutexGuard<'_, Snapshot> {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
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
             reach it sees every lock and holder{}",
            if options.allow_unlock {
                " and can force-unlock them"
            } else {
                ""
            }
        );
    }
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
    axum::serve(listener, app)
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

/// Lists the locks and records what changed since the last list.
async fn refresh(console: &Console) {
    let listed = console.locks.list(console.options.pattern.as_deref()).await;
    let taken = now_ms();
    let mut snap = console.snapshot();
    match listed {
        Ok(locks) => {
            if snap.taken_ms != 0 {
                let events = changes(&snap.locks, &locks, &snap.unlocked, taken);
                for event in events {
                    push_event(&mut snap, event);
                }
            }
            snap.unlocked.clear();
            snap.locks = locks;
            snap.taken_ms = taken;
            snap.error = None;
        }
        Err(e) => snap.error = Some(e.to_string()),
    }
}

fn push_event(snap: &mut Snapshot, mut event: Value) {
    event["id"] = json!(snap.next_event);
    snap.next_event += 1;
    snap.events.push_front(event);
    snap.events.truncate(EVENTS_KEPT);
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
        "owner": h.owner,
        "request_id": h.request_id,
        "permits": h.permits,
    })
}

/// The holds acquired and released between two lists (oldest first).
fn changes(
    before: &[LockInfo],
    after: &[LockInfo],
    unlocked: &[(LockKind, String)],
    at: u64,
) -> Vec<Value> {
    let (old, new) = (holds(before), holds(after));
    let mut events = Vec::new();
    for info in before {
        let id = (info.kind, info.key.as_str());
        if unlocked.iter().any(|(k, key)| (*k, key.as_str()) == id) {
            continue; // already told as "unlocked"
        }
        let now = new.get(&id);
        for (hold, h) in &old[&id] {
            if !now.is_some_and(|n| n.iter().any(|(other, _)| other == hold)) {
                events.push(event("released", info.kind, &info.key, h, at));
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

/// Refuses requests whose `Host` is not the loopback address the console listens on (a page
/// of another site that points a host name at 127.0.0.1 must not read the locks), and sets
/// the security headers of every answer.
async fn guard(State(console): State<Arc<Console>>, request: Request, next: Next) -> Response {
    if console.bound.ip().is_loopback() {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let port = console.bound.port();
        let allowed = [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
            console.bound.to_string(),
        ];
        if !allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
            return (StatusCode::FORBIDDEN, "unexpected Host header\n").into_response();
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

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", CONSOLE_JS)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", CONSOLE_CSS)
}

async fn state(State(console): State<Arc<Console>>) -> Json<Value> {
    let snap = console.snapshot();
    let config = console.locks.config();
    Json(json!({
        "now_ms": now_ms(),
        "taken_ms": snap.taken_ms,
        "interval_ms": console.options.interval.as_millis() as u64,
        "allow_unlock": console.options.allow_unlock,
        "mode": config.topology().mode(),
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
    // a JSON body already needs a CORS preflight from another origin; a browser also says
    // where the request comes from
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if origin != format!("http://{host}") {
            return refuse(
                StatusCode::FORBIDDEN,
                format!("unlock refused from origin {origin}"),
            );
        }
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
                for h in &removed.holders {
                    push_event(&mut snap, event("unlocked", kind, key, h, at));
                }
                snap.unlocked.push((kind, key.to_owned()));
            }
            console.refresh.notify_one();
            Json(json!({ "removed": render::json(&removed) })).into_response()
        }
        Ok(None) => refuse(
            StatusCode::NOT_FOUND,
            format!(
                "nothing removed: {} `{key}` is not held",
                render::noun(kind)
            ),
        ),
        Err(e) => refuse(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
