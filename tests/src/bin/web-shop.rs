//! A minimal flash-sale shop as a separate OS process, for the web tests that check exclusion
//! between processes (`tests/tests/web/processes.rs`).
//!
//! ```text
//! web-shop <axum|actix> <port> <lock config.toml> <stock redis url> <instance name> [checkout ms]
//! ```
//!
//! Starts the global lock service from the config file, binds `127.0.0.1:<port>` and prints
//! `listening 127.0.0.1:<port>` once it accepts connections (a failure to start is printed as
//! `error <what>` and the process exits with status 1). It serves, with the library's owner-scope
//! middleware of the chosen framework:
//!
//! | route | what |
//! |---|---|
//! | `POST /goods/{id}/buy` | one unit under `#[distributed_lock(key = "shop:<id>")]`: read the stock, sleep the checkout time, write it back decreased; 200 `{"instance","left","fence"}` |
//! | `POST /goods/{id}/buy-unlocked` | the same steps without the lock |
//! | `GET /sales` | `{"instance","sold"}`: units this process sold on the locked route |
//!
//! The stock is the Redis string `web-shop:{<id>}:stock` on the stock server; a purchase with no
//! stock left answers 409 `{"error":"sold_out"}`, a missing stock 404, a failing stock server 503.
//! Lock errors answer as the library makes them (409 `lock_timeout`, 503 `lock_unavailable`, ...).
//!
//! On SIGTERM or Ctrl-C it stops taking connections, gives the requests under way [`GRACE`] to
//! finish, shuts the global lock service down (`lock_runtime::shutdown`: its locks are released
//! on Redis), prints `stopped` (or `error shutdown <why>`) and exits with status 0.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, distributed_lock};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

/// How long the requests under way get to finish once the shop is told to stop.
const GRACE: Duration = Duration::from_millis(100);

/// Units this process sold on the locked route.
static SOLD: AtomicU64 = AtomicU64::new(0);

/// What every request handler needs.
#[derive(Clone)]
struct Shop {
    redis: MultiplexedConnection,
    instance: String,
    checkout: Duration,
}

/// Why a purchase failed.
#[derive(Debug)]
enum ShopError {
    Lock(LockError),
    SoldOut,
    NotFound,
    Store(redis::RedisError),
}

impl From<LockError> for ShopError {
    fn from(error: LockError) -> Self {
        ShopError::Lock(error)
    }
}

impl From<redis::RedisError> for ShopError {
    fn from(error: redis::RedisError) -> Self {
        ShopError::Store(error)
    }
}

impl ShopError {
    /// Status and JSON body of the errors that are not lock errors.
    fn answer(&self) -> (u16, String) {
        let (status, body) = match self {
            ShopError::SoldOut => (409, json!({ "error": "sold_out" })),
            ShopError::NotFound => (404, json!({ "error": "not_found" })),
            ShopError::Store(e) => (
                503,
                json!({ "error": "store_unavailable", "message": e.to_string() }),
            ),
            ShopError::Lock(_) => unreachable!("lock errors answer as the library makes them"),
        };
        (status, body.to_string())
    }
}

fn stock_key(goods: u64) -> String {
    format!("web-shop:{{{goods}}}:stock")
}

/// Reads the stock, does the checkout work, writes it back decreased: not atomic on Redis, so
/// only the lock around it keeps two purchases from selling the same unit.
async fn purchase(shop: &Shop, goods: u64) -> Result<Value, ShopError> {
    let mut redis = shop.redis.clone();
    let stock: Option<i64> = redis.get(stock_key(goods)).await?;
    let stock = stock.ok_or(ShopError::NotFound)?;
    if stock <= 0 {
        return Err(ShopError::SoldOut);
    }
    tokio::time::sleep(shop.checkout).await;
    let () = redis.set(stock_key(goods), stock - 1).await?;
    Ok(json!({
        "instance": shop.instance,
        "left": stock - 1,
        "fence": lock_runtime::current_fence(),
    }))
}

#[distributed_lock(key = "shop:<goods>", lease = "5s", wait = "2s")]
async fn buy(shop: &Shop, goods: u64) -> Result<Value, ShopError> {
    let sold = purchase(shop, goods).await?;
    SOLD.fetch_add(1, Ordering::SeqCst);
    Ok(sold)
}

fn sales(shop: &Shop) -> Value {
    json!({ "instance": shop.instance, "sold": SOLD.load(Ordering::SeqCst) })
}

mod on_axum {
    use axum::Router;
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::http::header::CONTENT_TYPE;
    use axum::response::{IntoResponse, Response};
    use axum::routing::{get, post};
    use lock_runtime::middleware::tower::OwnerScopeLayer;

    use super::{Shop, ShopError};

    impl IntoResponse for ShopError {
        fn into_response(self) -> Response {
            if let ShopError::Lock(error) = self {
                return error.into_response();
            }
            let (status, body) = self.answer();
            let status = StatusCode::from_u16(status).expect("a status code");
            (status, [(CONTENT_TYPE, "application/json")], body).into_response()
        }
    }

    fn json(value: serde_json::Value) -> Response {
        axum::Json(value).into_response()
    }

    async fn buy(State(shop): State<Shop>, Path(goods): Path<u64>) -> Result<Response, ShopError> {
        Ok(json(super::buy(&shop, goods).await?))
    }

    async fn buy_unlocked(
        State(shop): State<Shop>,
        Path(goods): Path<u64>,
    ) -> Result<Response, ShopError> {
        Ok(json(super::purchase(&shop, goods).await?))
    }

    pub(super) async fn serve(
        listener: std::net::TcpListener,
        shop: Shop,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = Router::new()
            .route("/goods/{id}/buy", post(buy))
            .route("/goods/{id}/buy-unlocked", post(buy_unlocked))
            .route(
                "/sales",
                get(|State(shop): State<Shop>| async move { json(super::sales(&shop)) }),
            )
            .with_state(shop)
            .layer(OwnerScopeLayer::new());
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        super::announce(&listener.local_addr()?);
        let (stopped, mut stopping) = tokio::sync::watch::channel(false);
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            stop.await;
            let _ = stopped.send(true);
        });
        let grace_over = async move {
            let _ = stopping.wait_for(|stopped| *stopped).await;
            tokio::time::sleep(super::GRACE).await;
        };
        tokio::select! {
            served = std::future::IntoFuture::into_future(server) => served,
            () = grace_over => Ok(()),
        }
    }
}

mod on_actix {
    use actix_web::http::StatusCode;
    use actix_web::http::header::ContentType;
    use actix_web::{App, HttpResponse, HttpServer, ResponseError, web};
    use lock_runtime::middleware::actix::OwnerScope;

    use super::{Shop, ShopError};

    impl std::fmt::Display for ShopError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }

    impl ResponseError for ShopError {
        fn status_code(&self) -> StatusCode {
            match self {
                ShopError::Lock(error) => error.status_code(),
                other => StatusCode::from_u16(other.answer().0).expect("a status code"),
            }
        }

        fn error_response(&self) -> HttpResponse {
            if let ShopError::Lock(error) = self {
                return error.error_response();
            }
            HttpResponse::build(self.status_code())
                .insert_header(ContentType::json())
                .body(self.answer().1)
        }
    }

    async fn buy(shop: web::Data<Shop>, goods: web::Path<u64>) -> Result<HttpResponse, ShopError> {
        Ok(HttpResponse::Ok().json(super::buy(&shop, goods.into_inner()).await?))
    }

    async fn buy_unlocked(
        shop: web::Data<Shop>,
        goods: web::Path<u64>,
    ) -> Result<HttpResponse, ShopError> {
        Ok(HttpResponse::Ok().json(super::purchase(&shop, goods.into_inner()).await?))
    }

    async fn sales(shop: web::Data<Shop>) -> HttpResponse {
        HttpResponse::Ok().json(super::sales(&shop))
    }

    pub(super) async fn serve(
        listener: std::net::TcpListener,
        shop: Shop,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let addr = listener.local_addr()?;
        let server = HttpServer::new(move || {
            App::new()
                .wrap(OwnerScope::new())
                .app_data(web::Data::new(shop.clone()))
                .route("/goods/{id}/buy", web::post().to(buy))
                .route("/goods/{id}/buy-unlocked", web::post().to(buy_unlocked))
                .route("/sales", web::get().to(sales))
        })
        .workers(2)
        .disable_signals()
        .listen(listener)?
        .run();
        super::announce(&addr);
        let handle = server.handle();
        tokio::select! {
            served = server => served,
            () = stop => {
                // stop taking connections; the requests under way get the grace, then go
                let stopped = handle.stop(true);
                if tokio::time::timeout(super::GRACE, stopped).await.is_err() {
                    handle.stop(false).await;
                }
                Ok(())
            }
        }
    }
}

/// Tells the test that the shop accepts connections.
fn announce(addr: &std::net::SocketAddr) {
    use std::io::Write as _;
    println!("listening {addr}");
    let _ = std::io::stdout().flush();
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT); watches for them from the call on (before the shop
/// announces itself, so a signal right after the announcement is not missed).
fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let watch = |kind: SignalKind| {
        signal(kind).unwrap_or_else(|e| fail(format_args!("watching signal {kind:?}: {e}")))
    };
    let (mut terminate, mut interrupt) = (
        watch(SignalKind::terminate()),
        watch(SignalKind::interrupt()),
    );
    async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    }
}

/// Prints why the shop could not start and exits.
fn fail(what: impl std::fmt::Display) -> ! {
    println!("error {what}");
    std::process::exit(1);
}

async fn run(args: Vec<String>) {
    let [framework, port, config, stock_url, instance, rest @ ..] = &args[..] else {
        fail(
            "usage: web-shop <axum|actix> <port> <lock config.toml> <stock redis url> \
             <instance name> [checkout ms]",
        );
    };
    let checkout_ms: u64 = match rest.first() {
        Some(ms) => ms.parse().unwrap_or_else(|_| fail("checkout ms")),
        None => 5,
    };
    if let Err(e) = lock_runtime::init_from_file(config).await {
        fail(format_args!("lock config {config}: {e}"));
    }
    let redis = redis::Client::open(stock_url.as_str())
        .unwrap_or_else(|e| fail(format_args!("stock url {stock_url}: {e}")));
    let redis = redis
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| fail(format_args!("stock server {stock_url}: {e}")));
    let shop = Shop {
        redis,
        instance: instance.clone(),
        checkout: Duration::from_millis(checkout_ms),
    };
    let listener = std::net::TcpListener::bind(format!("127.0.0.1:{port}"))
        .unwrap_or_else(|e| fail(format_args!("bind 127.0.0.1:{port}: {e}")));
    let served = match framework.as_str() {
        "axum" => on_axum::serve(listener, shop, stop_signal()).await,
        "actix" => on_actix::serve(listener, shop, stop_signal()).await,
        other => fail(format_args!("unknown framework {other}")),
    };
    if let Err(e) = served {
        fail(format_args!("serve: {e}"));
    }
    let said = match lock_runtime::shutdown().await {
        Ok(()) => "stopped".to_owned(),
        Err(e) => format!("error shutdown {e}"),
    };
    // nobody may read any more: a closed stdout is no reason to fail the exit
    use std::io::Write as _;
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{said}").and_then(|()| stdout.flush());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("actix") {
        actix_web::rt::System::new().block_on(run(args));
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(run(args));
    }
}
