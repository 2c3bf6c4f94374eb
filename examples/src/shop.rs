//! The flash sale, independent of the web framework: goods with a stock in Redis, and a
//! purchase that reads the stock, does some checkout work and writes the stock back.
//!
//! The read-check-write is deliberately not atomic on Redis (no `DECR`, no script): the
//! distributed lock around [`buy`] is what keeps two purchases of the same goods from
//! interleaving, across threads, tasks and processes. [`buy_unlocked`] runs the very same steps
//! without the lock, to show what the lock prevents.

use std::fmt;
use std::time::Duration;

use lock_runtime::{LockError, distributed_lock};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde::Serialize;

/// Where the goods live: stock and sold counters in Redis, shared by every instance.
#[derive(Clone)]
pub struct Store {
    redis: MultiplexedConnection,
    namespace: String,
    checkout: Duration,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("namespace", &self.namespace)
            .field("checkout", &self.checkout)
            .finish_non_exhaustive()
    }
}

/// The state of one goods item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Goods {
    /// The goods id.
    pub goods: u64,
    /// Units left.
    pub stock: i64,
    /// Units sold since the last restock.
    pub sold: i64,
}

/// A successful purchase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Purchase {
    /// The goods id.
    pub goods: u64,
    /// Units left after this purchase, as this purchase wrote it.
    pub left: i64,
    /// The fencing token of the lock hold this purchase ran under (none without the lock).
    pub fence: Option<u64>,
}

/// Why a purchase failed.
#[derive(Debug)]
pub enum ShopError {
    /// The lock could not be taken (timeout, Redis down, ...).
    Lock(LockError),
    /// No stock left.
    SoldOut {
        /// The goods id.
        goods: u64,
    },
    /// The goods were never stocked.
    NotFound {
        /// The goods id.
        goods: u64,
    },
    /// Reading or writing the stock failed.
    Store(redis::RedisError),
}

impl From<LockError> for ShopError {
    fn from(error: LockError) -> Self {
        ShopError::Lock(error)
    }
}

impl From<redis::RedisError> for ShopError {
    fn from(error: redis::RedisError) -> Self {
        ShopError::Store(error)
    }
}

impl fmt::Display for ShopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShopError::Lock(e) => write!(f, "{e}"),
            ShopError::SoldOut { goods } => write!(f, "goods {goods} are sold out"),
            ShopError::NotFound { goods } => write!(f, "goods {goods} do not exist"),
            ShopError::Store(_) => f.write_str("the stock store is unavailable"),
        }
    }
}

impl std::error::Error for ShopError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ShopError::Lock(e) => Some(e),
            ShopError::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl ShopError {
    /// The short machine-readable code used in JSON bodies (lock errors use the library's).
    pub fn code(&self) -> &'static str {
        match self {
            ShopError::Lock(_) => "lock",
            ShopError::SoldOut { .. } => "sold_out",
            ShopError::NotFound { .. } => "not_found",
            ShopError::Store(_) => "store_unavailable",
        }
    }

    /// The JSON body for the errors that are not lock errors.
    pub fn json(&self) -> String {
        serde_json::json!({ "error": self.code(), "message": self.to_string() }).to_string()
    }
}

impl Store {
    /// Connects to the Redis at `url`; keys start with `namespace`.
    ///
    /// # Errors
    /// When Redis cannot be reached.
    pub async fn connect(url: &str, namespace: &str) -> Result<Store, redis::RedisError> {
        let redis = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Store {
            redis,
            namespace: namespace.to_owned(),
            checkout: Duration::from_millis(5),
        })
    }

    /// How long the checkout step in the middle of a purchase takes (default 5 ms): the window
    /// in which an unprotected purchase can be overtaken.
    pub fn with_checkout(mut self, checkout: Duration) -> Self {
        self.checkout = checkout;
        self
    }

    /// The checkout step's duration.
    pub fn checkout(&self) -> Duration {
        self.checkout
    }

    /// The Redis key of `field` of `goods`: `<namespace>:goods:<goods>:<field>`.
    pub(crate) fn key(&self, goods: u64, field: &str) -> String {
        format!("{}:goods:{goods}:{field}", self.namespace)
    }

    /// A handle on the store's Redis connection (shared: clones multiplex on it).
    pub(crate) fn connection(&self) -> MultiplexedConnection {
        self.redis.clone()
    }

    /// Sets the stock of `goods` and its sold counter to zero.
    ///
    /// # Errors
    /// When Redis fails.
    pub async fn restock(&self, goods: u64, stock: i64) -> Result<Goods, ShopError> {
        let mut redis = self.redis.clone();
        let () = redis::pipe()
            .set(self.key(goods, "stock"), stock)
            .set(self.key(goods, "sold"), 0)
            .query_async(&mut redis)
            .await?;
        Ok(Goods {
            goods,
            stock,
            sold: 0,
        })
    }

    /// The stock and sold counter of `goods`.
    ///
    /// # Errors
    /// [`ShopError::NotFound`] for goods never stocked; when Redis fails.
    pub async fn goods(&self, goods: u64) -> Result<Goods, ShopError> {
        let mut redis = self.redis.clone();
        let (stock, sold): (Option<i64>, Option<i64>) = redis
            .mget(&[self.key(goods, "stock"), self.key(goods, "sold")])
            .await?;
        let stock = stock.ok_or(ShopError::NotFound { goods })?;
        Ok(Goods {
            goods,
            stock,
            sold: sold.unwrap_or(0),
        })
    }

    /// One purchase, with no protection of its own: read the stock, check it, do the checkout
    /// work, write the stock back, count the sale.
    async fn purchase(&self, goods: u64) -> Result<Purchase, ShopError> {
        let mut redis = self.redis.clone();
        let stock: Option<i64> = redis.get(self.key(goods, "stock")).await?;
        let stock = stock.ok_or(ShopError::NotFound { goods })?;
        if stock <= 0 {
            return Err(ShopError::SoldOut { goods });
        }
        tokio::time::sleep(self.checkout).await; // charge the card, write the order, ...
        let () = redis.set(self.key(goods, "stock"), stock - 1).await?;
        let _: i64 = redis.incr(self.key(goods, "sold"), 1).await?;
        Ok(Purchase {
            goods,
            left: stock - 1,
            fence: lock_runtime::current_fence(),
        })
    }
}

/// The lock a purchase takes, as the attributes of [`buy`] and [`buy_many`] write it (`GET /about`
/// shows it; keep the two in step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LockTerms {
    /// The key, with its placeholder.
    pub key: &'static str,
    /// How long a hold lasts at most.
    pub lease: &'static str,
    /// How long a purchase waits for the lock before it answers 409 `lock_timeout`.
    pub wait: &'static str,
}

/// The terms of [`buy`]'s lock.
pub const BUY_LOCK: LockTerms = LockTerms {
    key: "goods:<goods>",
    lease: "5s",
    wait: "2s",
};

/// Buys one unit of `goods` while holding the lock `goods:<goods>`: at most 5 s, waiting at
/// most 2 s for it (then the caller gets a lock timeout, an HTTP 409). See [`BUY_LOCK`].
///
/// # Errors
/// [`ShopError::SoldOut`], [`ShopError::NotFound`], [`ShopError::Lock`], [`ShopError::Store`].
#[distributed_lock(key = "goods:<goods>", lease = "5s", wait = "2s")]
pub async fn buy(store: &Store, goods: u64) -> Result<Purchase, ShopError> {
    store.purchase(goods).await
}

/// Buys `units` units of `goods` in one locked call. Each unit goes through [`buy`], which
/// takes the same lock again: inside one owner scope (one request) that re-enters instead of
/// waiting for itself.
///
/// # Errors
/// As [`buy`]; units bought before a failure stay bought.
#[distributed_lock(key = "goods:<goods>", lease = "5s", wait = "2s")]
pub async fn buy_many(store: &Store, goods: u64, units: u32) -> Result<Vec<Purchase>, ShopError> {
    let mut bought = Vec::new();
    for _ in 0..units {
        bought.push(buy(store, goods).await?);
    }
    Ok(bought)
}

/// The same purchase as [`buy`] without the lock: concurrent calls oversell.
///
/// # Errors
/// As [`buy`], except lock errors.
pub async fn buy_unlocked(store: &Store, goods: u64) -> Result<Purchase, ShopError> {
    store.purchase(goods).await
}
