//! The second baseline: a reentrant lock in the style of Redisson's `RedissonLock`, written
//! with the plain `redis` crate: the peer that waits without polling.
//!
//! A lock `name` is the hash `redisson:{name}` (owner -> hold count) with the lease as its
//! expiry. An owner is its service's random id and its task's id (`<uuid>:<task>`), as
//! Redisson names a holder by its client's UUID and thread id. Acquire is one EVALSHA:
//!
//! ```lua
//! if exists(key) == 0 or hexists(key, owner) == 1 then
//!     hincrby(key, owner, 1); pexpire(key, lease); return nil
//! end
//! return pttl(key)
//! ```
//!
//! release one EVALSHA, which publishes `0` on the lock's channel
//! `redisson_lock__channel:{name}` when the last hold of the owner goes:
//!
//! ```lua
//! if hexists(key, owner) == 0 then return nil end
//! if hincrby(key, owner, -1) > 0 then pexpire(key, lease); return 0 end
//! del(key); publish(channel, 0); return 1
//! ```
//!
//! Waiting is `RedissonLock.tryLock(wait, lease)`'s: after a failed attempt the waiter
//! subscribes to the lock's channel on its service's one subscriber connection (one
//! subscription per channel, shared by the service's waiters of that lock and dropped in the
//! background when the last of them leaves, as Redisson's `PublishSubscribe` does), tries
//! again, then sleeps on the channel's semaphore until a message or for the lock's remaining
//! lease (the PTTL the attempt returned), and tries again. Each message releases one permit
//! (`LockPubSub.onMessage`): one waiter of the service wakes per release. On a cluster the
//! channel is a shard channel (`SSUBSCRIBE`, `SPUBLISH`), as Redisson uses on Redis 7
//! clusters.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Script};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::conn::{Conn, Endpoint};
use crate::error::Result;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 \
         then \
           redis.call('hincrby', KEYS[1], ARGV[2], 1) \
           redis.call('pexpire', KEYS[1], ARGV[1]) \
           return nil \
         end \
         return redis.call('pttl', KEYS[1])",
    )
});

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end \
         local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1) \
         if counter > 0 then \
           redis.call('pexpire', KEYS[1], ARGV[2]) \
           return 0 \
         end \
         redis.call('del', KEYS[1]) \
         redis.call(ARGV[4], KEYS[2], ARGV[1]) \
         return 1",
    )
});

/// The message a release publishes (Redisson's `UNLOCK_MESSAGE`).
const UNLOCK_MESSAGE: &str = "0";
/// Subscribe / unsubscribe of one channel go one at a time (Redisson's per-channel semaphore),
/// striped over this many locks.
const STRIPES: usize = 16;

/// One service (one application instance): a command connection, a subscriber connection and
/// the channels its waiters listen on. Clones share them.
#[derive(Clone)]
pub(crate) struct Redisson {
    inner: Arc<Inner>,
}

struct Inner {
    con: Conn,
    subscriber: Conn,
    /// This service's random id, the first half of its owners' names.
    id: String,
    /// `publish` on one server, `spublish` on a cluster.
    publish: &'static str,
    entries: Arc<Entries>,
    stripes: Vec<tokio::sync::Mutex<()>>,
    /// Waiters of this service sleeping on a channel now.
    parked: AtomicUsize,
}

/// Channel -> (waiters using the subscription, the semaphore a message releases).
type Channels = HashMap<String, (usize, Arc<Semaphore>)>;
type Entries = Mutex<Channels>;

impl Redisson {
    /// Connects a new service; its message dispatcher runs on the current runtime.
    pub(crate) async fn connect(redis: &Endpoint) -> Result<Redisson> {
        let (push, messages) = tokio::sync::mpsc::unbounded_channel();
        let subscriber = redis.subscriber(push).await?;
        let con = redis.connection().await?;
        let entries: Arc<Entries> = Arc::default();
        tokio::spawn(dispatch(messages, entries.clone()));
        Ok(Redisson {
            inner: Arc::new(Inner {
                con,
                subscriber,
                id: random_uuid(),
                publish: if redis.is_cluster() {
                    "spublish"
                } else {
                    "publish"
                },
                entries,
                stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
                parked: AtomicUsize::new(0),
            }),
        })
    }

    /// The owner name of the calling task: `<service uuid>:<task id>` (the thread's id outside
    /// a task).
    pub(crate) fn owner(&self) -> String {
        match tokio::task::try_id() {
            Some(task) => format!("{}:{task}", self.inner.id),
            None => format!("{}:{:?}", self.inner.id, std::thread::current().id()),
        }
    }

    /// Waiters of this service sleeping until a message or a lease runs out.
    pub(crate) fn parked(&self) -> usize {
        self.inner.parked.load(Ordering::SeqCst)
    }

    /// Acquires (or re-enters) the lock `name` for `owner` with `lease`, waiting at most `wait`.
    pub(crate) async fn lock(
        &self,
        name: &str,
        owner: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + wait;
        let key = key(name);
        if self.attempt(&key, owner, lease).await?.is_none() {
            return Ok(());
        }
        let channel = channel(name);
        let latch = self.subscribe(&channel).await?;
        let waited = self
            .wait_for(&key, owner, lease, deadline, &latch)
            .await
            .map_err(|e| format!("Redisson-style `{name}`: {e}"));
        // the subscription is dropped in the background; the caller goes on at once
        let service = self.clone();
        tokio::spawn(async move { service.unsubscribe(&channel).await });
        Ok(waited?)
    }

    /// Releases one hold of `owner`; the last one deletes the lock and publishes the message.
    pub(crate) async fn unlock(&self, name: &str, owner: &str, lease: Duration) -> Result<()> {
        let released: Option<i64> = RELEASE
            .key(key(name))
            .key(channel(name))
            .arg(UNLOCK_MESSAGE)
            .arg(lease.as_millis() as u64)
            .arg(owner)
            .arg(self.inner.publish)
            .invoke_async(&mut self.inner.con.clone())
            .await?;
        match released {
            Some(_) => Ok(()),
            None => {
                Err(format!("Redisson-style: `{name}` was not held by {owner} at release").into())
            }
        }
    }

    /// One attempt: `None` when acquired, else the lock's remaining lease in ms (-1: none).
    async fn attempt(&self, key: &str, owner: &str, lease: Duration) -> Result<Option<i64>> {
        Ok(ACQUIRE
            .key(key)
            .arg(lease.as_millis() as u64)
            .arg(owner)
            .invoke_async(&mut self.inner.con.clone())
            .await?)
    }

    /// Attempts, each followed by a sleep until a message or the remaining lease.
    async fn wait_for(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        deadline: Instant,
        latch: &Semaphore,
    ) -> Result<()> {
        loop {
            let Some(ttl) = self.attempt(key, owner, lease).await? else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                return Err("not acquired within the wait".into());
            }
            let left = deadline - now;
            let sleep = match u64::try_from(ttl) {
                Ok(ttl) => left.min(Duration::from_millis(ttl)),
                Err(_) => left,
            };
            self.inner.parked.fetch_add(1, Ordering::SeqCst);
            let woken = tokio::time::timeout(sleep, latch.acquire()).await;
            self.inner.parked.fetch_sub(1, Ordering::SeqCst);
            if let Ok(Ok(permit)) = woken {
                permit.forget();
            }
        }
    }

    fn stripe(&self, channel: &str) -> &tokio::sync::Mutex<()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        channel.hash(&mut hasher);
        &self.inner.stripes[hasher.finish() as usize % STRIPES]
    }

    /// Joins the service's subscription to `channel`, subscribing when it is the first waiter.
    async fn subscribe(&self, channel: &str) -> Result<Arc<Semaphore>> {
        let _turn = self.stripe(channel).lock().await;
        let latch = {
            let mut entries = self.entries()?;
            if let Some((waiters, latch)) = entries.get_mut(channel) {
                *waiters += 1;
                return Ok(latch.clone());
            }
            let latch = Arc::new(Semaphore::new(0));
            entries.insert(channel.to_owned(), (1, latch.clone()));
            latch
        };
        if let Err(e) = self.inner.subscriber.clone().subscribe(channel).await {
            self.entries()?.remove(channel);
            return Err(e);
        }
        Ok(latch)
    }

    /// Leaves the subscription to `channel`; the last waiter unsubscribes.
    async fn unsubscribe(&self, channel: &str) -> Result<()> {
        let _turn = self.stripe(channel).lock().await;
        let last = {
            let mut entries = self.entries()?;
            match entries.get_mut(channel) {
                Some((waiters, _)) if *waiters > 1 => {
                    *waiters -= 1;
                    false
                }
                Some(_) => {
                    entries.remove(channel);
                    true
                }
                None => false,
            }
        };
        if last {
            self.inner.subscriber.clone().unsubscribe(channel).await?;
        }
        Ok(())
    }

    fn entries(&self) -> Result<std::sync::MutexGuard<'_, Channels>> {
        Ok(self
            .inner
            .entries
            .lock()
            .map_err(|_| "Redisson-style: entries poisoned")?)
    }
}

/// Routes each unlock message to the semaphore of its channel: one permit per message.
async fn dispatch(mut messages: UnboundedReceiver<PushInfo>, entries: Arc<Entries>) {
    while let Some(push) = messages.recv().await {
        if !matches!(push.kind, PushKind::Message | PushKind::SMessage) {
            continue;
        }
        let mut data = push.data.into_iter();
        let (Some(channel), Some(message)) = (data.next(), data.next()) else {
            continue;
        };
        let (Ok(channel), Ok(message)) = (
            redis::from_redis_value::<String>(channel),
            redis::from_redis_value::<String>(message),
        ) else {
            continue;
        };
        if message != UNLOCK_MESSAGE {
            continue;
        }
        let Ok(entries) = entries.lock() else { return };
        if let Some((_, latch)) = entries.get(&channel) {
            latch.add_permits(1);
        }
    }
}

/// The lock's hash.
fn key(name: &str) -> String {
    format!("redisson:{{{name}}}")
}

/// The lock's channel (in the lock's slot on a cluster).
fn channel(name: &str) -> String {
    format!("redisson_lock__channel:{{{name}}}")
}

/// A random version-4 UUID (from the standard library's randomly keyed hasher).
fn random_uuid() -> String {
    let state = std::collections::hash_map::RandomState::new();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let word = |salt: u64| {
        let mut hasher = state.build_hasher();
        hasher.write_u64(salt);
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        hasher.finish()
    };
    let (a, b) = (word(1), word(2));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_look_like_version_4_and_differ() {
        let (a, b) = (random_uuid(), random_uuid());
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, b);
    }
}
