//! The baseline: the simplest correct Redis lock, written with the plain `redis` crate.
//!
//! Acquire is one EVALSHA of a `SET key token NX PX lease` script, release one EVALSHA of a
//! compare-and-delete script. Spin policy, the same in every scenario: a waiter whose attempt
//! failed calls `tokio::task::yield_now()` and tries again at once.
//!
//! The fenced baseline (S1, S2) is the same lock with what any fenced lock adds to an acquire:
//! in the same script, the server clock and the lock slot's token counter. It prices fencing
//! itself, apart from any library: a fenced lock cannot be cheaper per unbatched acquire.

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

/// The baseline's acquire plus what every fenced lock adds to one: in the same script, the
/// server clock and the token counter of the lock's slot (`max(last + 1, clock)`, as the
/// library draws its tokens); the lock's value is the token and the holder's token. Replies
/// the fencing token, or false when the key was held.
static FENCED_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local t = redis.call('time') \
         local token = t[1] .. string.sub('00000' .. t[2], -6) \
         local last = redis.call('set', KEYS[2], token, 'GET') \
         if last and (#last > #token or (#last == #token and last >= token)) then \
           token = string.format('%d', tonumber(last) + 1) \
           redis.call('set', KEYS[2], token) \
         end \
         if redis.call('set', KEYS[1], token .. '|' .. ARGV[1], 'NX', 'PX', ARGV[2]) then \
           return token \
         end \
         return false",
    )
});

/// Compare-and-delete of a value `FENCED_ACQUIRE` wrote: its tail after the token is `'|' ..`
/// the holder's token.
static FENCED_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local v = redis.call('get', KEYS[1]) \
         if v and string.sub(v, -#ARGV[1] - 1) == '|' .. ARGV[1] then \
           return redis.call('del', KEYS[1]) \
         end \
         return 0",
    )
});

/// The fenced baseline's name in the reports.
pub(crate) const FENCED_NAME: &str = "fenced baseline (raw + token)";
/// What the reports say of it.
pub(crate) const FENCED_NOTE: &str = "fenced baseline (raw + token): the baseline's acquire \
     script with, before its SET NX PX, what any fenced lock adds: TIME and SET .. GET on the \
     token counter in the lock's slot (a token of max(last + 1, clock), as the library draws \
     them); release compares the holder's token in the value and deletes. One script call per \
     acquire, unbatched: the price of fencing itself, not a target";

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
        self.compare_and_delete(&RELEASE, "baseline", key, token)
            .await
    }

    /// `script`'s compare-and-delete of `key` held with `token`; an error naming `lock` when
    /// it was not.
    async fn compare_and_delete(
        &mut self,
        script: &Script,
        lock: &str,
        key: &str,
        token: &str,
    ) -> Result<()> {
        let deleted: i64 = script
            .key(key)
            .arg(token)
            .invoke_async(&mut self.con)
            .await?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(format!("{lock}: `{key}` was not held by {token} at release").into())
        }
    }

    /// One attempt of the fenced baseline ([`FENCED_ACQUIRE`]) on `key`, whose counter is
    /// [`fence_key`]`(key)`: the fencing token, or `None` when the key was held.
    pub(crate) async fn try_acquire_fenced(
        &mut self,
        key: &str,
        token: &str,
    ) -> Result<Option<u64>> {
        let lease_ms = LEASE.as_millis() as u64;
        let fence: Option<u64> = FENCED_ACQUIRE
            .key(key)
            .key(fence_key(key))
            .arg(token)
            .arg(lease_ms)
            .invoke_async(&mut self.con)
            .await?;
        Ok(fence)
    }

    /// The fenced baseline's compare-and-delete; an error when the lock was not held with
    /// `token`.
    pub(crate) async fn release_fenced(&mut self, key: &str, token: &str) -> Result<()> {
        self.compare_and_delete(&FENCED_RELEASE, "fenced baseline", key, token)
            .await
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

/// The fenced baseline's token counter for the lock key `key` (one of [`key`]'s): in its slot.
pub(crate) fn fence_key(key: &str) -> String {
    format!("{key}:fence")
}
