//! A lock holder in a process of its own that keeps writing with its fencing token, for the
//! paused-holder test of `tests/tests/family/fenced.rs`.
//!
//! ```text
//! fenced-writer <config.toml> <lock key> <value key> <lease ms> <sqlite file> <goods id>
//! ```
//!
//! Takes `<lock key>` with the lease and writes with its token to two stores:
//!
//! * the row `<goods id>` of the table `goods (id, stock, fence)` in the SQLite file:
//!   `UPDATE goods SET stock = ?1, fence = ?2 WHERE id = ?3 AND fence <= ?2` (`<=`: this hold
//!   writes the row twice). First stock 9, then prints `held <fence> sql=<rows changed>`;
//! * the `RedisValue` `<value key>` (on the topology of the config: single or cluster): every
//!   10 ms `paused-holder <n>`, printing `write <n> <sent> redis=<ok|stale>` (`<sent>`: when the
//!   write started, `CLOCK_MONOTONIC` ns, one clock for all processes), until a write is
//!   rejected as stale (or 30 s passed);
//!
//! then the SQLite row once more (stock 8), printing `sql=<rows changed>`, and `done`; exits
//! with status 0 (an unexpected error panics: status 101).
//!
//! It never looks at `lost()` or `is_lost()`: it stands for a holder that checked its lock and
//! was then paused (the test `SIGSTOP`s it during the Redis writes) for longer than its lease.
//! The second SQLite write comes after the Redis writes only so that the pause never catches
//! the process inside SQLite: a stopped process holding SQLite's write lock would block the
//! other holder's write.

use std::io::Write as _;
use std::time::{Duration, Instant};

use lock_runtime::fenced::RedisValue;
use lock_runtime::{ErrorKind, LockConfig, LockGuard, LockService, Topology};
use lock_tests::history::monotonic_ns;
use redis::aio::ConnectionLike;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Ok([config, key, value_key, lease_ms, sqlite, goods]) = <[String; 6]>::try_from(args)
    else {
        panic!(
            "usage: fenced-writer <config.toml> <lock key> <value key> <lease ms> <sqlite file> \
             <goods id>"
        );
    };
    let config = LockConfig::from_file(config).expect("config file");
    let topology = config.topology().clone();
    let locks = LockService::connect(config).await.expect("connect");
    let writer = Writer {
        locks,
        key,
        value_key,
        lease: Duration::from_millis(lease_ms.parse().expect("lease ms")),
        db: rusqlite::Connection::open(sqlite).expect("open the SQLite file"),
        goods: goods.parse().expect("goods id"),
    };
    // Connected before the lock is taken, so that the lease is spent on writing.
    match topology {
        Topology::Single { url } => {
            let conn = redis::Client::open(url)
                .expect("redis url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect to redis");
            writer.run(&conn).await;
        }
        Topology::Cluster { nodes } => {
            let conn = redis::cluster::ClusterClient::new(nodes)
                .expect("cluster nodes")
                .get_async_connection()
                .await
                .expect("connect to the cluster");
            writer.run(&conn).await;
        }
        other => panic!(
            "fenced-writer runs on single or cluster, not {}",
            other.mode()
        ),
    }
}

struct Writer {
    locks: LockService,
    key: String,
    value_key: String,
    lease: Duration,
    db: rusqlite::Connection,
    goods: i64,
}

impl Writer {
    async fn run<C>(&self, conn: &C)
    where
        C: ConnectionLike + Clone + Send + Sync,
    {
        self.db
            .busy_timeout(Duration::from_secs(5))
            .expect("busy timeout");
        let value = RedisValue::new(conn, self.value_key.as_str());
        let guard = self
            .locks
            .lock(self.key.as_str())
            .lease(self.lease)
            .await
            .expect("lock");
        let fence = i64::try_from(guard.fence()).expect("the token fits SQLite's integer");
        let rows = self.set_stock(9, fence);
        say(&format!("held {} sql={rows}", guard.fence()));
        write_until_stale(&guard, &value).await;
        say(&format!("sql={}", self.set_stock(8, fence)));
        say("done");
        // The lease ran out long ago: the release finds the lock held by someone else.
        let _ = guard.release().await;
    }

    /// The fenced `UPDATE`; returns the number of rows it changed.
    fn set_stock(&self, stock: i64, fence: i64) -> usize {
        self.db
            .execute(
                "UPDATE goods SET stock = ?1, fence = ?2 WHERE id = ?3 AND fence <= ?2",
                (stock, fence, self.goods),
            )
            .expect("UPDATE goods")
    }
}

async fn write_until_stale<C>(guard: &LockGuard, value: &RedisValue<C>)
where
    C: ConnectionLike + Clone + Send + Sync,
{
    let until = Instant::now() + Duration::from_secs(30);
    for round in 1u32.. {
        let sent = monotonic_ns();
        let outcome = match value.set(guard, format!("paused-holder {round}")).await {
            Ok(()) => "ok",
            Err(e) if e.kind() == ErrorKind::Stale => "stale",
            Err(e) => panic!("fenced write: {e}"),
        };
        say(&format!("write {round} {sent} redis={outcome}"));
        if outcome == "stale" || Instant::now() >= until {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Prints one line and flushes it at once (the test reads stdout as it goes).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
