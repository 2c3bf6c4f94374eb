//! Distributed locks on Redis for async Rust: reentrant, fenced, renewed by a watchdog, woken by
//! notifications instead of polling.
//!
//! # The attribute
//!
//! ```no_run
//! use lock_runtime::{distributed_lock, LockError};
//!
//! #[distributed_lock(key = "goods:<id>", lease = "5s", wait = "2s")]
//! async fn decrease_stock(id: u64, qty: u32) -> Result<u32, LockError> {
//!     // runs only while this call holds the lock "goods:<id>"
//!     let _token = lock_runtime::current_fence(); // write it next to the data
//!     Ok(qty)
//! }
//!
//! # async fn start() -> Result<(), LockError> {
//! lock_runtime::init_from_file("lock.toml").await?; // or let the first call find lock.toml
//! decrease_stock(42, 1).await?;
//! # Ok(()) }
//! ```
//!
//! `kind = "read"` / `kind = "write"` run the body under a read or write hold of the
//! read-write lock `key`; `keys = ["account:<from>", "account:<to>"]` under all of several
//! mutexes (see the lock family below and [`distributed_lock`]).
//!
//! # The programmatic API
//!
//! ```no_run
//! use lock_runtime::{ErrorKind, LockConfig, LockService};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), lock_runtime::LockError> {
//! let config = LockConfig::from_toml_str(r#"
//!     [redis]
//!     mode = "single"
//!     url = "redis://127.0.0.1:6379"
//!     [lock]
//!     prefix = "lock:"
//!     watchdog_timeout = "30s"
//! "#)?;
//! let locks = LockService::connect(config).await?;
//!
//! match locks.lock("goods:42").lease(Duration::from_secs(5)).wait(Duration::from_secs(2)).await {
//!     Ok(guard) => {
//!         // ... the critical section; guard.fence() is this grant's fencing token
//!         guard.release().await?;
//!     }
//!     Err(e) if e.kind() == ErrorKind::Timeout => println!("busy, try later"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
//!
//! [`cookbook`]: recipes for a flash sale, a job that runs once per schedule, a transfer
//! between two accounts, a rate-limited API, a read-mostly catalog and fenced writes to SQL.
//!
//! # The lock family
//!
//! | kind | call | guard | when to use it | tested in (`tests/tests/`) |
//! |---|---|---|---|---|
//! | mutex | [`LockService::lock`] | [`LockGuard`] | one holder at a time | `mutex/` |
//! | read-write | [`LockService::read`], [`LockService::write`] | [`ReadGuard`], [`WriteGuard`] | read often, write rarely: readers together, a writer alone (writer preference, downgrade, no upgrade) | `rw/` |
//! | multi-key | [`LockService::lock_all`] | [`MultiGuard`] | one operation over several keys, all or nothing, no deadlock | `multi/keys.rs` |
//! | semaphore | [`LockService::semaphore`] | [`Permit`] | at most n at once cluster-wide; permits expire with their lease | `semaphore/` |
//!
//! [`fenced`] makes the data itself reject a holder whose lock passed to someone else (a Redis
//! value or hash that accepts only newer tokens; the SQL pattern for databases).
//!
//! Every kind runs on the same engine and keeps the mutex's promises (below). Every guard has
//! `fence()`, `lost()`, `is_lost()`, `valid_until()`, `extend(d)` and `release()`; every
//! request has `.lease(d)`, `.wait(d)` and `.try_once()`.
//!
//! ```no_run
//! # async fn work(_fence: u64) -> Result<u32, lock_runtime::LockError> { Ok(0) }
//! # async fn demo(
//! #     locks: lock_runtime::LockService,
//! #     conn: redis::aio::MultiplexedConnection,
//! # ) -> Result<(), lock_runtime::LockError> {
//! use std::time::Duration;
//! let secs = Duration::from_secs;
//!
//! // read-write: many readers or one writer
//! let r = locks.read("catalog:7").wait(secs(2)).await?; // shared
//! r.release().await?;
//! let mut w = locks.write("catalog:7").lease(secs(5)).await?; // exclusive, fenced
//! // extend a hold: the lease is 10 s from now
//! w.extend(secs(10)).await?;
//! w.release().await?;
//! // all-or-nothing over several keys (a transfer between two accounts)
//! let g = locks.lock_all(["account:1", "account:2"]).wait(secs(2)).await?;
//! let _from = g.fence("account:1"); // the fencing token of each key
//! g.release().await?;
//! // a semaphore with expiring permits (a crashed holder's permit comes back)
//! let sem = locks.semaphore("pdf-render", 4); // 4 permits cluster-wide
//! let p = sem.acquire().lease(secs(30)).wait(secs(5)).await?; // also acquire_many(n)
//! p.release().await?;
//! // run a closure under a lock; skip when another instance runs it
//! let n = locks
//!     .lock("job:nightly")
//!     .try_once()
//!     .run(|g| async move { work(g.fence()).await })
//!     .await?;
//! // fenced writes: the store rejects a stale holder
//! let guard = locks.lock("stock:7").await?;
//! let new_stock = 41;
//! let store = lock_runtime::fenced::RedisValue::new(&conn, "stock:7");
//! store.set(&guard, new_stock).await?; // Err(kind Stale) for an older token
//! guard.release().await?;
//! # let _ = n; Ok(()) }
//! ```
//!
//! # What a lock gives
//!
//! | property | how | tested in (`tests/tests/`) |
//! |---|---|---|
//! | mutual exclusion | every acquire / release runs in a Lua script; only the owner can release | `mutex/single_node.rs`, `mutex/processes.rs`, `mutex/topologies.rs` |
//! | throughput | under load the acquires and releases of one service share script calls (one round trip and one script run for many) | `mutex/single_node.rs`, `family/smoke.rs` |
//! | no deadlock | every lock has a lease: the one you give, or the watchdog's (renewed every third while held) | `mutex/single_node.rs`, `mutex/processes.rs`, `fault/safety.rs` |
//! | reentrancy | along one call chain: calls inside a locked body re-enter its lock; concurrent children (`join!`) exclude each other (see [`owner`]) | `attr/call_chains.rs`, `mutex/single_node.rs`, `mutex/processes.rs` |
//! | generations | every grant carries the id of the attempt that made it: stale guards never touch a newer grant, unknown outcomes are undone exactly | `fault/safety.rs`, `fault/cluster_replies.rs` |
//! | loss detection | [`LockGuard::lost`] fires at the hold's validity deadline (lease from the send time of the last grant or renewal, less a drift margin), before Redis can grant the lock to anyone else | `fault/safety.rs`, `mutex/topologies.rs` |
//! | fencing | [`LockGuard::fence`] strictly increases per key across grants | `mutex/single_node.rs`, `mutex/topologies.rs`, `family/fenced.rs` |
//! | fair waiting | waiters in one process line up in arrival order; releases hand the lock to the head in the same round trip; services waiting elsewhere get turns | `mutex/waiting.rs` |
//! | no polling | waiters sleep until a release message (one subscriber connection per service) or the lock's remaining lease | `mutex/waiting.rs`, `mutex/topologies.rs` |
//! | cancellation | dropping a guard releases it in the background; an acquire that was cancelled or whose reply never came is given back by its grant id | `mutex/single_node.rs`, `mutex/topologies.rs`, `fault/safety.rs` |
//!
//! # Features
//!
//! | feature | default | gives |
//! |---|---|---|
//! | `macros` | yes | the `#[distributed_lock]` attribute |
//! | `tower` | no | `middleware::tower`: a lock-owner scope per request for axum / tower, request ids, `IntoResponse` for [`LockError`] |
//! | `actix-web` | no | `middleware::actix`: the same for actix-web, `ResponseError` for [`LockError`] |
//! | `tls` | no | `rediss://` URLs with a custom CA and client certificates (mutual TLS), through rustls (no OpenSSL); see [`TlsConfig`] and [`config`](config#tls) |
//! | `blocking` | no | `lock_runtime::blocking`: the locks for synchronous code, each call blocking the calling thread (its own runtime thread, as `reqwest::blocking`) |
//! | `testing` | no | `lock_runtime::testing`: a private `redis-server` per test process and the global service on it, for your tests (a dev-dependency feature) |
//! | `metrics` | no | acquire, wait and hold times, grants, timeouts, losses, renewals, waiters and Redis calls through the [`metrics`](https://docs.rs/metrics/0.24) facade: see [`metrics`] for the names; the application installs the recorder |
//!
//! # Observing the locks
//!
//! [`LockService::events`] is a broadcast of what happens to held locks ([`LockEvent`]:
//! renewed, renewal failed, lost with its [`LossReason`], force-unlocked); [`metrics`] lists
//! the metrics recorded with the `metrics` feature, labelled with the lock's kind and a bounded
//! name (the attribute's key template, or a request's
//! [`metric_label`](LockRequest::metric_label)); `tracing` logs each grant at `DEBUG` and
//! renewal failures, losses and force-unlocks at `WARN` / `ERROR` (see [`events`]).
//! [`LockService::nodes`] lists the Redis servers in use with their roles and health
//! ([`RedisNodes`]), for an operator's console.
//!
//! # Topologies
//!
//! The config file's `redis.mode` picks one; the code does not change ([`config`] has the format).
//!
//! | mode | connects to | failover |
//! |---|---|---|
//! | `single` | one server | reconnects when it is back |
//! | `master-slave` | the configured master (checked with `ROLE`) | none: fails with `Backend` until the master is back |
//! | `sentinel` | the master most sentinels name | switches to the promoted master, moves wake-up subscriptions |
//! | `cluster` | every master, by the lock's hash slot; sharded pub/sub | the cluster client follows the promotion |
//!
//! `redis.sync_replicas` makes every grant wait for replica acknowledgements
//! ([`ErrorKind::ReplicaSync`] when they do not come in time).
//!
//! # Data on Redis
//!
//! A lock `goods:42` with prefix `lock:` lives in the string `lock:{goods:42}` (state, fencing
//! token, grant ids and owner in one value; its expiry is the lease), with
//! `lock:{goods:42}:wq` (services waiting), `lock:{goods:42}:wh` (their head waiters, to whom
//! a release grants the lock) and the channel `lock:{goods:42}:ch` while services wait. The whole key is the hash tag, which keeps them in one cluster slot;
//! `%`, `{`, `}` in a key are written `%25`, `%7B`, `%7D`, so no key can choose its slot or name
//! another lock's keys. Fencing tokens come from counters that never expire: one per cluster
//! slot on Redis Cluster (`lock:fence:{<n>}`), one for every lock on one server
//! (`lock:fence:{3560}`, slot 0's): tokens keep increasing per lock when the server's clock
//! steps back, and no key is left per lock name.

#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(hidden)]
pub mod __private;
mod backend;
#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
pub mod config;
mod context;
#[doc = include_str!("cookbook.md")]
pub mod cookbook {}
mod detach;
mod driver;
mod engine;
mod error;
pub mod events;
/// Fenced writes: data that rejects a write from a holder whose lock has passed to someone else.
pub mod fenced;
pub mod inspect;
mod kinds;
pub mod metrics;
#[cfg(any(feature = "tower", feature = "actix-web"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "tower", feature = "actix-web"))))]
pub mod middleware;
mod nodes;
pub mod owner;
mod registry;
mod scripts;
mod service;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod vocab;

pub use config::{DefaultWait, LockConfig, TlsConfig, Topology};
pub use context::{Held, current_fence, current_lock_key};
pub use error::{ErrorKind, LockError};
pub use events::LockEvent;
pub use inspect::{Holder, JournalEntry, JournalKind, Kept, LockInfo, ServiceWaiters};
pub use kinds::multi::{MultiGuard, MultiRequest};
pub use kinds::mutex::{LockGuard, LockRequest};
pub use kinds::rw::{ReadGuard, ReadRequest, RwRequest, WriteGuard, WriteRequest};
pub use kinds::semaphore::{Permit, PermitRequest, Semaphore};
pub use nodes::{NodeRole, NodeStatus, RedisNodes};
pub use owner::OwnerId;
pub use registry::{
    CONFIG_ENV, DEFAULT_CONFIG_FILE, global, init, init_from_env, init_from_file, shutdown,
    try_global,
};
pub use service::LockService;
pub use vocab::{HoldMode, LockKind, LossReason};

#[doc = include_str!("distributed_lock.md")]
///
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use lock_macros::distributed_lock;

/// The crate's README, whose examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
