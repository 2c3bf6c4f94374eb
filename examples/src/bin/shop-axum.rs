//! The flash-sale shop on axum; see `lock_examples::axum_shop`. Serves the lock metrics on
//! `GET /metrics` (`lock_examples::prometheus`) and prints each lock it loses to stderr
//! (`LockService::events`). On Ctrl-C or SIGTERM it stops taking requests, gives those under
//! way [`GRACE`] to finish and releases its locks (`lock_runtime::shutdown`).

use lock_examples::args::Args;
use lock_examples::axum_shop::{Shop, router};
use lock_examples::prometheus;
use lock_examples::setup::{
    GRACE, SHOP_OPTIONS, SHOP_USAGE, ShopSetup, announce, release_locks, stop_signal,
};
use lock_runtime::LockEvent;
use tokio::sync::broadcast::error::RecvError;

#[tokio::main]
async fn main() {
    let args = Args::from_env(&format!("shop-axum\n\n{SHOP_USAGE}"), SHOP_OPTIONS);
    if let Err(e) = run(&args).await {
        eprintln!("shop-axum: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let metrics = prometheus::install()?;
    let setup = ShopSetup::from_args(args).await?;
    let locks = lock_runtime::global().await.map_err(|e| e.to_string())?;
    tokio::spawn(report_losses(locks.events()));
    let listener = tokio::net::TcpListener::bind(setup.listen)
        .await
        .map_err(|e| format!("bind {}: {e}", setup.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let shop = Shop {
        store: setup.store,
        instance: setup
            .instance
            .unwrap_or_else(|| addr.port().to_string())
            .into(),
    };
    let stop = stop_signal()?;
    announce(addr);
    let app = prometheus::route(router(shop, setup.scope), metrics);
    let (stopped, mut stopping) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        stop.await;
        let _ = stopped.send(true);
    });
    let grace_over = async move {
        let _ = stopping.wait_for(|stopped| *stopped).await;
        tokio::time::sleep(GRACE).await;
    };
    tokio::select! {
        served = std::future::IntoFuture::into_future(server) => {
            served.map_err(|e| format!("serve: {e}"))?;
        }
        () = grace_over => eprintln!("shop-axum: requests still under way after {GRACE:?} are cut short"),
    }
    release_locks("shop-axum").await;
    Ok(())
}

/// Prints every lock this shop loses while holding it (a purchase outlived its 5 s lease, or
/// someone force-unlocked it).
async fn report_losses(mut events: tokio::sync::broadcast::Receiver<LockEvent>) {
    loop {
        match events.recv().await {
            Ok(LockEvent::Lost {
                key, fence, reason, ..
            }) => eprintln!("shop-axum: lost the lock {key} (token {fence}): {reason}"),
            Ok(_) => {}
            Err(RecvError::Lagged(missed)) => eprintln!("shop-axum: {missed} lock events missed"),
            Err(RecvError::Closed) => return,
        }
    }
}
