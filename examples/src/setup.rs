//! Start-up and stop shared by the shop binaries: options, the global lock service, the stock
//! store; the stop signal and the release of the locks on the way out.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use lock_runtime::middleware::OwnerScopeConfig;
use lock_runtime::{LockConfig, Topology};

use crate::args::Args;
use crate::shop::Store;

/// The options of `shop-axum` and `shop-actix`.
pub const SHOP_USAGE: &str = "\
options:
  --listen ADDR          address to listen on (default 127.0.0.1:3000; port 0 picks a free one)
  --config PATH          lock config (default $LOCK_CONFIG, else examples/config/single.toml)
  --redis URL            Redis for the stock (default: the config's url in single mode)
  --instance NAME        name in purchase responses (default: the port)
  --checkout-ms N        checkout work inside a purchase, in ms (default 5)
  --trust-request-id     make the x-request-id header the lock owner (trusted callers only)

Prints `listening on http://ADDR` once it accepts connections. On Ctrl-C or SIGTERM it stops
taking requests, gives those under way up to 1 s to finish, releases its locks and exits.";

/// The options [`SHOP_USAGE`] describes.
pub const SHOP_OPTIONS: &[&str] = &[
    "listen",
    "config",
    "redis",
    "instance",
    "checkout-ms",
    "trust-request-id",
];

/// A shop instance's settings, with the global lock service connected.
#[derive(Debug)]
pub struct ShopSetup {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The stock.
    pub store: Store,
    /// The instance's name, when given.
    pub instance: Option<String>,
    /// The middleware's configuration.
    pub scope: OwnerScopeConfig,
}

impl ShopSetup {
    /// Reads the options, connects the global lock service and the store.
    ///
    /// # Errors
    /// A bad option, config file, or unreachable Redis.
    pub async fn from_args(args: &Args) -> Result<ShopSetup, String> {
        let listen: SocketAddr = args.parsed("listen", ([127, 0, 0, 1], 3000).into())?;
        let path = args
            .value("config")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os(lock_runtime::CONFIG_ENV).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("examples/config/single.toml"));
        let config = LockConfig::from_file(&path).map_err(|e| e.to_string())?;
        let redis = match (args.value("redis"), config.topology()) {
            (Some(url), _) => url.to_owned(),
            (None, Topology::Single { url }) => url.clone(),
            (None, other) => {
                return Err(format!(
                    "{}: mode {:?} has no single url: give the stock's Redis with --redis",
                    path.display(),
                    other.mode()
                ));
            }
        };
        lock_runtime::init(config)
            .await
            .map_err(|e| format!("lock service: {e}"))?;
        let checkout = Duration::from_millis(args.parsed("checkout-ms", 5)?);
        let store = Store::connect(&redis, "shop")
            .await
            .map_err(|e| format!("stock store {redis}: {e}"))?
            .with_checkout(checkout);
        let mut scope = OwnerScopeConfig::new();
        if args.flag("trust-request-id") {
            scope = scope.trust_request_id_as_owner();
        }
        Ok(ShopSetup {
            listen,
            store,
            instance: args.value("instance").map(str::to_owned),
            scope,
        })
    }
}

/// Prints the line scripts wait for and flushes it.
pub fn announce(addr: SocketAddr) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on http://{addr}");
    let _ = out.flush();
}

/// How long requests under way get to finish after Ctrl-C or SIGTERM (a purchase takes a few
/// ms; one still running after this is cut short and its lock released, rather than left held
/// until its 5 s lease runs out).
pub const GRACE: Duration = Duration::from_secs(1);

/// Resolves on Ctrl-C (SIGINT) or SIGTERM; watches for them from the call on (call it before
/// announcing the server). Needs a tokio runtime.
///
/// # Errors
/// When the signals cannot be watched.
pub fn stop_signal() -> Result<impl Future<Output = ()> + Send + 'static, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let watch = |kind: SignalKind| signal(kind).map_err(|e| format!("watching {kind:?}: {e}"));
    let (mut terminate, mut interrupt) = (
        watch(SignalKind::terminate())?,
        watch(SignalKind::interrupt())?,
    );
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// Shuts the global lock service down on the way out, so that the locks of requests cut short
/// are free at once instead of when their leases run out (see `lock_runtime::shutdown`).
pub async fn release_locks(program: &str) {
    match lock_runtime::shutdown().await {
        Ok(()) => eprintln!("{program}: stopped; its locks are released"),
        Err(e) => eprintln!("{program}: stopped; {e}"),
    }
}

#[cfg(test)]
mod tests {
    use lock_runtime::LockConfig;

    #[test]
    fn every_example_config_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let mut modes = Vec::new();
        for name in ["single", "cluster", "sentinel", "master-slave"] {
            let config = LockConfig::from_file(dir.join(format!("{name}.toml")))
                .unwrap_or_else(|e| panic!("{name}.toml: {e}"));
            modes.push(config.topology().mode());
        }
        assert_eq!(modes, ["single", "cluster", "sentinel", "master-slave"]);
    }
}
