//! The flash-sale shop on axum; see `lock_examples::axum_shop`.

use lock_examples::args::Args;
use lock_examples::axum_shop::{Shop, router};
use lock_examples::setup::{SHOP_OPTIONS, SHOP_USAGE, ShopSetup, announce};

#[tokio::main]
async fn main() {
    let args = Args::from_env(&format!("shop-axum\n\n{SHOP_USAGE}"), SHOP_OPTIONS);
    if let Err(e) = run(&args).await {
        eprintln!("shop-axum: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let setup = ShopSetup::from_args(args).await?;
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
    announce(addr);
    axum::serve(listener, router(shop, setup.scope))
        .await
        .map_err(|e| format!("serve: {e}"))
}
