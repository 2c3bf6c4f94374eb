//! Fenced writes to SQLite: the database refuses a write from a lock holder whose lease ran out
//! while it was paused.
//!
//! Two instances sell goods 7 from one SQLite table under the lock `goods:<id>`. Instance A
//! takes the lock with a short lease and reads the stock - and then stalls (a GC pause, a VM
//! migration, a `SIGSTOP`) for longer than its lease. Instance B gets the lock, reads the same
//! stock and sells one. When A goes on, it writes the stock it computed before the stall: with
//! the fencing token in the `UPDATE`'s condition, that write changes 0 rows instead of undoing
//! B's sale.
//!
//! ```text
//! cargo run -p lock-examples --bin fenced_sqlite -- --config examples/config/single.toml
//! cargo run -p lock-examples --bin fenced_sqlite -- --redis-url redis://127.0.0.1:6379
//! ```

use std::time::Duration;

use lock_examples::args::Args;
use lock_runtime::{LockConfig, LockService};
use rusqlite::Connection;

const USAGE: &str = "\
fenced_sqlite [--config PATH | --redis-url URL]
  --config PATH      lock config (default $LOCK_CONFIG, else examples/config/single.toml)
  --redis-url URL    a single Redis server instead of a config file";

/// Instance A's lease: short, so that its stall outlasts it.
const SHORT_LEASE: Duration = Duration::from_millis(300);

#[tokio::main]
async fn main() {
    let args = Args::from_env(USAGE, &["config", "redis-url"]);
    if let Err(e) = run(&args).await {
        eprintln!("fenced_sqlite: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let config = match args.value("redis-url") {
        Some(url) => LockConfig::single(url),
        None => LockConfig::from_file(
            args.value("config")
                .map(str::to_owned)
                .or_else(|| std::env::var(lock_runtime::CONFIG_ENV).ok())
                .unwrap_or_else(|| "examples/config/single.toml".to_owned()),
        )?,
    };
    // Two services: two instances of an application, each with its own connections.
    let instance_a = LockService::connect(config.clone()).await?;
    let instance_b = LockService::connect(config).await?;

    let db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE goods (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL,
                             fence INTEGER NOT NULL DEFAULT 0);
         INSERT INTO goods (id, stock) VALUES (7, 10);",
    )?;
    let key = format!("goods:7:{}", std::process::id());

    let a = instance_a.lock(&key).lease(SHORT_LEASE).await?;
    let stock_a = stock(&db)?;
    println!(
        "A: holds {key} (token {}, lease {SHORT_LEASE:?}), reads stock {stock_a}",
        a.fence()
    );
    println!("A: stalls for longer than its lease ...");
    // A does nothing from here until it writes; meanwhile B asks for the lock, which Redis
    // grants once A's lease has run out.

    let b = instance_b
        .lock(&key)
        .wait(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .await?;
    let stock_b = stock(&db)?;
    let rows = sell(&db, stock_b - 1, b.fence())?;
    println!(
        "B: holds {key} (token {}) once A's lease ran out, reads stock {stock_b}, \
         writes {}: {rows} row changed",
        b.fence(),
        stock_b - 1
    );
    b.release().await?;

    let rows = sell(&db, stock_a - 1, a.fence())?;
    println!(
        "A: goes on and writes {} with its token {}: {rows} rows changed - the row carries a newer token",
        stock_a - 1,
        a.fence()
    );
    assert_eq!(rows, 0, "the stale write must change nothing");
    if let Err(e) = a.release().await {
        println!("A: release: {e}");
    }

    let (stock, fence): (i64, i64) =
        db.query_row("SELECT stock, fence FROM goods WHERE id = 7", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?;
    println!("goods 7: stock {stock}, fence {fence} (B's sale stands; A must start over)");
    Ok(())
}

fn stock(db: &Connection) -> rusqlite::Result<i64> {
    db.query_row("SELECT stock FROM goods WHERE id = 7", [], |row| row.get(0))
}

/// Writes the stock only when `fence` is newer than the token of the row's last write; returns
/// the number of rows changed (0: a newer holder has written, nothing changed). Use `fence <= ?2`
/// to let one hold write the row more than once.
fn sell(db: &Connection, stock: i64, fence: u64) -> Result<usize, Box<dyn std::error::Error>> {
    let fence = i64::try_from(fence)?; // SQLite integers are signed 64-bit
    let rows = db.execute(
        "UPDATE goods SET stock = ?1, fence = ?2 WHERE id = 7 AND fence < ?2",
        (stock, fence),
    )?;
    Ok(rows)
}
