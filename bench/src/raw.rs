//! The baseline: the simplest correct Redis lock, written with the plain `redis` crate.
//!
//! Acquire is one EVALSHA of a `SET key token NX PX lease` script, release one EVALSHA of a
//! compare-and-delete script. Spin policy, the same in every scenario: a waiter whose attempt
//! failed calls `tokio::task::yield_now()` and tries again at once.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::Script;

use crate::conn::{Conn, Endpoint};
use crate::ctx::LEASE;
use crate::error::Result;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0",
    )
});

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end \
         return 0",
    )
});

/// A waiter gives up (the bench fails) after spinning this long.
const GIVE_UP: Duration = Duration::from_secs(30);

/// One multiplexed connection (a cluster connection on a cluster); clones share it.
#[derive(Clone)]
pub(crate) struct Raw {
    con: Conn,
}

impl Raw {
    pub(crate) async fn connect(redis: &Endpoint) -> Result<Raw> {
        Ok(Raw {
            con: redis.connection().await?,
        })
    }

    /// One attempt.
    pub(crate) async fn try_acquire(&mut self, key: &str, token: &str) -> Result<bool> {
        let lease_ms = LEASE.as_millis() as u64;
        let got: i64 = ACQUIRE
            .key(key)
            .arg(token)
            .arg(lease_ms)
            .invoke_async(&mut self.con)
            .await?;
        Ok(got == 1)
    }

    /// Spins until acquired; returns the number of failed attempts.
    pub(crate) async fn acquire(&mut self, key: &str, token: &str) -> Result<u64> {
        let started = Instant::now();
        let mut failed = 0;
        while !self.try_acquire(key, token).await? {
            failed += 1;
            if failed % 1024 == 0 && started.elapsed() > GIVE_UP {
                return Err(format!("baseline: `{key}` not acquired within {GIVE_UP:?}").into());
            }
            tokio::task::yield_now().await;
        }
        Ok(failed)
    }

    /// Compare-and-delete; an error when the lock was not held with `token`.
    pub(crate) async fn release(&mut self, key: &str, token: &str) -> Result<()> {
        let deleted: i64 = RELEASE
            .key(key)
            .arg(token)
            .invoke_async(&mut self.con)
            .await?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(format!("baseline: `{key}` was not held by {token} at release").into())
        }
    }

    /// One PING round trip.
    pub(crate) async fn ping(&mut self) -> Result<()> {
        redis::cmd("PING").query_async::<()>(&mut self.con).await?;
        Ok(())
    }

    /// `UNLINK key`, for probes that must not look like lock traffic.
    pub(crate) async fn unlink(&mut self, key: &str) -> Result<()> {
        redis::cmd("UNLINK")
            .arg(key)
            .query_async::<()>(&mut self.con)
            .await?;
        Ok(())
    }

    /// The calls of `command` Redis ran since its counters were reset (`INFO commandstats`),
    /// for probes that must not look like lock traffic.
    pub(crate) async fn calls(&mut self, command: &str) -> Result<u64> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.con)
            .await?;
        let prefix = format!("cmdstat_{command}:calls=");
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.split(',').next()?.parse().ok())
            .unwrap_or(0))
    }

    /// `TYPE key`, for probes that must not look like lock traffic.
    pub(crate) async fn key_type(&mut self, key: &str) -> Result<String> {
        Ok(redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut self.con)
            .await?)
    }
}

/// A token no other grant of this process uses.
pub(crate) fn token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("bench-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The baseline's key for a lock name (apart from the library's `lock:{...}` keys).
pub(crate) fn key(name: &str) -> String {
    format!("raw:{{{name}}}")
}
