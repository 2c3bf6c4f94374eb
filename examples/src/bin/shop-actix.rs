//! The flash-sale shop on actix-web; see `lock_examples::actix_shop`. On Ctrl-C or SIGTERM
//! actix-web stops taking requests and gives those under way [`GRACE`] to finish; then the shop
//! releases its locks (`lock_runtime::shutdown`).

use actix_web::{App, HttpServer};
use lock_examples::actix_shop::{Shop, configure};
use lock_examples::args::Args;
use lock_examples::setup::{GRACE, SHOP_OPTIONS, SHOP_USAGE, ShopSetup, announce, release_locks};
use lock_runtime::middleware::actix::OwnerScope;

#[actix_web::main]
async fn main() {
    let args = Args::from_env(&format!("shop-actix\n\n{SHOP_USAGE}"), SHOP_OPTIONS);
    if let Err(e) = run(&args).await {
        eprintln!("shop-actix: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> Result<(), String> {
    // Connects the global lock service before the workers start.
    let setup = ShopSetup::from_args(args).await?;
    let listener = std::net::TcpListener::bind(setup.listen)
        .map_err(|e| format!("bind {}: {e}", setup.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let shop = Shop {
        store: setup.store,
        instance: setup
            .instance
            .unwrap_or_else(|| addr.port().to_string())
            .into(),
    };
    let scope = setup.scope;
    let server = HttpServer::new(move || {
        let shop = shop.clone();
        App::new()
            .wrap(OwnerScope::with_config(scope.clone()))
            .configure(|cfg| configure(cfg, shop))
    })
    // actix-web's own signal handling: SIGTERM stops gracefully within the timeout, Ctrl-C at once
    .shutdown_timeout(GRACE.as_secs())
    .listen(listener)
    .map_err(|e| format!("listen {addr}: {e}"))?
    .run();
    announce(addr);
    let served = server.await.map_err(|e| format!("serve: {e}"));
    release_locks("shop-actix").await;
    served
}
