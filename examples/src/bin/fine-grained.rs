//! `LockService` used directly: lock only the few lines that need it, with the lock's fencing
//! token stored next to the data.
//!
//! Ten workers book seats of one show. Preparing a booking (pricing, fraud checks) takes a while
//! and needs no lock; only reading and writing the seat does, so each worker holds `seat:<n>`
//! for a few milliseconds, and never two seats at once. A worker that finds the seat locked
//! does not wait (`try_lock`) but tries the next seat.
//!
//! ```text
//! cargo run -p lock-examples --bin fine-grained -- --config examples/config/single.toml
//! ```

use std::time::Duration;

use lock_examples::args::Args;
use lock_runtime::{LockConfig, LockService, Topology};
use redis::AsyncCommands;

const SEATS: u32 = 6;
const WORKERS: u32 = 10;

#[tokio::main]
async fn main() {
    let args = Args::from_env(
        "fine-grained [--config PATH]   (default examples/config/single.toml)",
        &["config"],
    );
    if let Err(e) = run(args
        .value("config")
        .unwrap_or("examples/config/single.toml"))
    .await
    {
        eprintln!("fine-grained: {e}");
        std::process::exit(1);
    }
}

async fn run(config: &str) -> Result<(), Box<dyn std::error::Error>> {
    let config = LockConfig::from_file(config)?;
    let Topology::Single { url } = config.topology().clone() else {
        return Err(
            "this example keeps its seats on a single Redis: use a single-mode config".into(),
        );
    };
    let locks = LockService::connect(config).await?;
    let mut redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let show = format!("show:{}", std::process::id());
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let (locks, mut redis, show) = (locks.clone(), redis.clone(), show.clone());
        workers.push(tokio::spawn(async move {
            // Slow preparation, outside any lock.
            tokio::time::sleep(Duration::from_millis(20 + u64::from(worker) * 3)).await;
            for seat in 0..SEATS {
                let key = format!("{show}:seat:{seat}");
                let guard = match locks.try_lock(&key).lease(Duration::from_secs(2)).await {
                    Ok(guard) => guard,
                    Err(e) if e.is_timeout() => continue, // someone is booking it: next seat
                    Err(e) => return Err(e.to_string()),
                };
                // The critical section: read, check, write, with this hold's fencing token.
                let taken: Option<String> =
                    redis.hget(&key, "by").await.map_err(|e| e.to_string())?;
                let booked = taken.is_none();
                if booked {
                    let fields = [
                        ("by", format!("worker-{worker}")),
                        ("fence", guard.fence().to_string()),
                    ];
                    let () = redis
                        .hset_multiple(&key, &fields)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                guard.release().await.map_err(|e| e.to_string())?;
                if booked {
                    return Ok(Some(seat));
                }
            }
            Ok(None)
        }));
    }
    for (worker, handle) in workers.into_iter().enumerate() {
        match handle.await?? {
            Some(seat) => println!("worker-{worker}: booked seat {seat}"),
            None => println!("worker-{worker}: no seat left"),
        }
    }
    for seat in 0..SEATS {
        let key = format!("{show}:seat:{seat}");
        let (by, fence): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("by")
            .arg("fence")
            .query_async(&mut redis)
            .await?;
        println!(
            "seat {seat}: {} (fence {})",
            by.unwrap_or_default(),
            fence.unwrap_or(0)
        );
        let () = redis.del(&key).await?;
    }
    Ok(())
}
