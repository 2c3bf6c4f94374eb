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
//!
//! Here: the server, its routes and the page. [`guard`] checks `Host`, `Origin` and the unlock
//! token and sets the security headers; [`refresh`] keeps the list of locks, its staleness and
//! the events; [`nodes`] describes the Redis servers for the page's header.

mod guard;
mod nodes;
mod refresh;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Json, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lock_runtime::{LockKind, LockService};
use serde_json::{Value, json};

pub(crate) use guard::{AllowedHost, parse_allowed_host};
use guard::{Gate, LocalAddr};
use refresh::{Refresher, now_ms, staleness};

use crate::{Failure, render};

/// Where the console listens unless `--listen` says otherwise.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7373";

const INDEX_HTML: &str = include_str!("../../assets/console.html");
const CONSOLE_JS: &str = include_str!("../../assets/console.js");
const CONSOLE_CSS: &str = include_str!("../../assets/console.css");

/// Where the page template takes the token.
const TOKEN_SLOT: &str = "{{unlock-token}}";

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
    /// What a request must show: `Host`, `Origin`, the unlock token.
    gate: Arc<Gate>,
    /// The page, with the token.
    page: String,
    /// The locks as last listed, and the events.
    refresher: Arc<Refresher>,
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
    let gate = Arc::new(Gate::new(bound, options.allow_hosts.clone()));
    let page = INDEX_HTML.replace(TOKEN_SLOT, gate.token());
    println!(
        "lockctl console on http://{bound}/ (redis {}, prefix {:?}, force-unlock {})",
        locks.config().topology().mode(),
        locks.config().prefix(),
        if options.allow_unlock { "on" } else { "off" }
    );
    let refresher = Arc::new(Refresher::new(
        locks.clone(),
        options.pattern.clone(),
        options.interval,
    ));
    let console = Arc::new(Console {
        locks,
        options,
        gate: gate.clone(),
        page,
        refresher: refresher.clone(),
    });
    refresher.refresh().await;
    tokio::spawn(Refresher::run(Arc::downgrade(&refresher)));
    let app = Router::new()
        .route("/", get(index))
        .route("/console.js", get(script))
        .route("/console.css", get(style))
        .route("/api/state", get(state))
        .route("/api/unlock", post(unlock))
        .layer(middleware::from_fn_with_state(gate, guard::guard))
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

async fn state(State(console): State<Arc<Console>>) -> Json<Value> {
    let snap = console.refresher.snapshot();
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
        "redis": nodes::redis_json(config.topology(), snap.nodes.as_ref(), stale_since.is_none()),
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
    if !console.gate.carries_token(&headers) {
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
            console
                .refresher
                .snapshot()
                .force_unlocked(kind, key, &removed, at);
            console.refresher.wake();
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
    fn the_page_has_a_slot_for_the_token() {
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
