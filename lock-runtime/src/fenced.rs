//! # Why a lock is not enough
//!
//! A lock has a lease, so that a crashed holder cannot keep it forever. But a holder that is
//! merely *paused* - a long GC or allocator stall, a VM migration, a `SIGSTOP`, a page-in from a
//! slow disk, a network path that holds its packets - does not know that its lease ran out
//! meanwhile. Redis has long since granted the lock to the next holder, which read the data and
//! wrote it; then the paused one wakes up and writes what it computed from the old data,
//! undoing the newer write. [`LockGuard::lost`](crate::LockGuard::lost) cannot help: the pause
//! can fall between the last check and the write.
//!
//! What helps is the store itself: every grant carries a fencing token
//! ([`LockGuard::fence`](crate::LockGuard::fence)) that is larger than the token of every
//! earlier grant of the same lock. The writer sends its token with the write, the store keeps
//! the token of the last write it accepted and refuses a write whose token is older. The paused
//! holder's token is older than the newer holder's, so its write is refused - however long it
//! slept, whatever it believes about its lock.
//!
//! # On Redis
//!
//! [`RedisValue`] is one value, [`RedisHash`] several fields written together. Each lives in
//! one Redis hash (so in one cluster slot) with the token of its last accepted write beside
//! the data, and every write is one Lua script that compares and writes at once:
//!
//! | type | Redis key | fields |
//! |---|---|---|
//! | `RedisValue::new(&conn, "stock:7")` | hash `stock:7` | `value`, `fence` |
//! | `RedisHash::new(&conn, "order:9")` | hash `order:9` | your fields, `fence` |
//!
//! ```no_run
//! use lock_runtime::fenced::RedisValue;
//! use lock_runtime::{ErrorKind, LockService};
//! use std::time::Duration;
//!
//! # async fn demo(locks: LockService, redis: redis::aio::MultiplexedConnection)
//! # -> Result<(), lock_runtime::LockError> {
//! let stock = RedisValue::new(&redis, "stock:7");
//! let guard = locks.lock("goods:7").lease(Duration::from_secs(5)).await?;
//! let left: u32 = stock.get().await?.unwrap_or(10);
//! match stock.set(&guard, left - 1).await {
//!     Ok(()) => {}
//!     // a newer holder of "goods:7" has written: this hold was lost, nothing was written
//!     Err(e) if e.kind() == ErrorKind::Stale => println!("too late: {e}"),
//!     Err(e) => return Err(e),
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! A write carrying a token *equal* to the stored one is accepted: it comes from the same hold
//! (the same grant, or a re-entry of it), which may write as often as it likes. Only a strictly
//! older token is [`ErrorKind::Stale`], and then nothing is written. A token of 0 (never a
//! lock's token) is [`ErrorKind::InvalidArgument`]; a key that holds something else than
//! fenced data (another Redis type, a `fence` field that is not a token) is
//! [`ErrorKind::InvalidKey`]; in both cases nothing is written.
//!
//! The writer is anything [`Fenced`]: a [`LockGuard`], the [`Held`] of a locked body, or a raw
//! `u64` token (for example [`current_fence`] inside an annotated fn).
//!
//! # Read holds do not write
//!
//! Fenced writes come from exclusive holds: a mutex, a write lock, a permit. A read share is
//! held beside other readers and does not exclude a writer whose lease ran out unnoticed, so
//! its token cannot say which of them may write:
//!
//! * [`ReadGuard`](crate::ReadGuard) is not [`Fenced`]: passing it to a write does not
//!   compile.
//! * In the body of a read lock, [`current_fence`] is `None`, and its [`Held`] is refused
//!   ([`ErrorKind::InvalidArgument`]); nothing is written.
//! * A read share's own token ([`ReadGuard::fence`](crate::ReadGuard::fence)) is issued for
//!   it from the lock's counter: larger than the token of every write granted before it, and
//!   never the token of a write grant. It orders what the reader saw after the writes before
//!   it; no writer ever holds it, so a writer whose lease ran out cannot write with a token a
//!   reader has too (a raw `u64` copy of it written anyway is newer than that writer's, whose
//!   write is then [`ErrorKind::Stale`]). A read inside a write body of the same owner (a
//!   downgrade) shares the write's token.
//!
//! # In a SQL database
//!
//! The same pattern needs no help from this crate: keep a `fence` column next to the data and
//! make the token part of the `UPDATE`'s condition, so that the database compares and writes in
//! one statement:
//!
//! ```sql
//! UPDATE goods SET stock = $1, fence = $2 WHERE id = $3 AND fence < $2
//! ```
//!
//! Check the number of rows affected: 0 means the row's token is not older than `$2` - another
//! hold has written, the write is stale and nothing changed (or the row does not exist: tell
//! the two apart with a `SELECT` if it matters). Write `fence <= $2` instead to let the same
//! hold write the row twice, as [`RedisValue`] does. `examples/src/bin/fenced_sqlite.rs` runs
//! this against SQLite.
//!
//! # What the tokens promise
//!
//! Tokens strictly increase per lock key, across grants, expiry, release and force-unlock, also
//! when the server's clock steps back: they come from a counter per cluster slot that never
//! expires. Each is also at least the Redis server's clock in microseconds when it was issued
//! (see the crate docs' "Data on Redis"), so they keep increasing when a counter is lost (in a
//! failover that dropped the last writes) as long as the clock of the server issuing them does
//! not go back by more than the time in between. Tokens of *different* lock keys
//! are not ordered against each other: guard each piece of data with one lock key, and give
//! every writer of it that lock.
//!
//! The check is only as good as the store's memory of the last token: a store that loses it
//! (a Redis without persistence that restarts, a failover that loses the last write) accepts
//! any token afterwards. Keep fenced data where it is as durable as the data itself.
//!
//! [`RedisValue`]: crate::fenced::RedisValue
//! [`RedisHash`]: crate::fenced::RedisHash
//! [`Fenced`]: crate::fenced::Fenced
//! [`LockGuard`]: crate::LockGuard
//! [`Held`]: crate::Held
//! [`current_fence`]: crate::current_fence
//! [`ErrorKind::Stale`]: crate::ErrorKind::Stale
//! [`ErrorKind::InvalidArgument`]: crate::ErrorKind::InvalidArgument
//! [`ErrorKind::InvalidKey`]: crate::ErrorKind::InvalidKey

use std::fmt;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError, Script, ToRedisArgs};

use crate::context::Held;
use crate::error::{ErrorKind, LockError};
use crate::kinds::mutex::LockGuard;
use crate::kinds::rw::WriteGuard;
use crate::kinds::semaphore::Permit;

/// The hash field holding the token of the last accepted write.
const FENCE_FIELD: &str = "fence";
/// The hash field holding a [`RedisValue`]'s value.
const VALUE_FIELD: &str = "value";
/// What a failed write is called in its error message.
const WRITE: &str = "fenced write";

/// The compare-and-set of every fenced write (its header names KEYS, ARGV and replies).
static SET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("fenced/set.lua")));

/// A writer that carries a fencing token: the holder of a lock, or the token itself.
///
/// Implemented for [`LockGuard`] (its [`fence`](LockGuard::fence)), [`WriteGuard`], [`Permit`],
/// for [`Held`] (the lock a locked body runs under; the body of a read lock gives 0, which
/// every write refuses) and for `u64` (a raw token, e.g. from
/// [`current_fence`](crate::current_fence) or read back from a request). Not for
/// [`ReadGuard`](crate::ReadGuard): a read share does not write (see the
/// [module docs](self#read-holds-do-not-write)).
///
/// ```no_run
/// # async fn demo(stock: lock_runtime::fenced::RedisValue<redis::aio::MultiplexedConnection>) -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{LockError, current_fence, distributed_lock};
///
/// #[distributed_lock(key = "goods:<id>")]
/// async fn restock(stock: &lock_runtime::fenced::RedisValue<redis::aio::MultiplexedConnection>, id: u64) -> Result<(), LockError> {
///     let token: u64 = current_fence().expect("inside a locked body"); // a u64 is Fenced too
///     stock.set(&token, 100).await
/// }
/// restock(&stock, 7).await?;
/// # Ok(()) }
/// ```
pub trait Fenced {
    /// The fencing token writes carry: larger tokens belong to newer holders of the lock.
    fn fencing_token(&self) -> u64;
}

impl Fenced for LockGuard {
    fn fencing_token(&self) -> u64 {
        self.fence()
    }
}

impl Fenced for WriteGuard {
    fn fencing_token(&self) -> u64 {
        self.fence()
    }
}

impl Fenced for Permit {
    fn fencing_token(&self) -> u64 {
        self.fence()
    }
}

/// The body of a read lock carries no token for writes (0: every write refuses it).
impl Fenced for Held {
    fn fencing_token(&self) -> u64 {
        if self.is_read() { 0 } else { self.fence() }
    }
}

impl Fenced for u64 {
    fn fencing_token(&self) -> u64 {
        *self
    }
}

impl<T: Fenced + ?Sized> Fenced for &T {
    fn fencing_token(&self) -> u64 {
        (**self).fencing_token()
    }
}

/// One Redis value that accepts writes only from the newest holder of a lock.
///
/// Stored as the hash `<key>` with the fields `value` and `fence` (the token of the last
/// accepted write); see the [module docs](self). Cloning is cheap when the connection's clone
/// is (as for [`MultiplexedConnection`](redis::aio::MultiplexedConnection),
/// [`ConnectionManager`](redis::aio::ConnectionManager) and the cluster connection).
///
/// ```no_run
/// # async fn demo(
/// #     locks: lock_runtime::LockService,
/// #     redis: redis::aio::MultiplexedConnection,
/// # ) -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::fenced::RedisValue;
///
/// let stock = RedisValue::new(&redis, "stock:7");
/// let guard = locks.lock("goods:7").await?;
/// stock.set(&guard, 41).await?; // Err(kind Stale) for a holder whose lock passed on
/// assert_eq!(stock.get::<u32>().await?, Some(41));
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisValue<C> {
    conn: C,
    key: String,
}

impl<C> RedisValue<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    /// The value stored at `key`, read and written through a clone of `conn`.
    pub fn new(conn: &C, key: impl Into<String>) -> Self {
        RedisValue {
            conn: conn.clone(),
            key: key.into(),
        }
    }

    /// The Redis key of the hash.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Writes `value` when `holder`'s token is not older than the token of the last accepted
    /// write, and stores the token with it. A token equal to the stored one is accepted (the
    /// same hold writing again).
    ///
    /// # Errors
    /// * [`ErrorKind::Stale`]: a newer holder has written; nothing was written.
    /// * [`ErrorKind::InvalidArgument`]: the token is 0, or `value` is not exactly one Redis
    ///   argument; nothing was written.
    /// * [`ErrorKind::InvalidKey`]: the key holds something else than a fenced value; nothing
    ///   was written.
    /// * [`ErrorKind::Backend`] (or [`ErrorKind::Auth`]): Redis failed or could not be reached.
    ///
    /// # Cancel safety
    /// The write is one script call: dropping the future before it completes leaves the value
    /// either written or untouched, never half-written.
    pub async fn set(
        &self,
        holder: &impl Fenced,
        value: impl ToRedisArgs,
    ) -> Result<(), LockError> {
        let value = one_arg(&self.key, "the value", &value)?;
        let token = token_of(&self.key, holder)?;
        let mut conn = self.conn.clone();
        fenced_set(
            &mut conn,
            &self.key,
            token,
            &[(VALUE_FIELD.as_bytes(), &value)],
        )
        .await
    }

    /// The value of the last accepted write, or `None` when nothing was written yet.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`] when the key is not a hash; [`ErrorKind::Backend`] when Redis
    /// fails or the value does not convert to `T`.
    pub async fn get<T: FromRedisValue>(&self) -> Result<Option<T>, LockError> {
        let mut conn = self.conn.clone();
        redis::cmd("HGET")
            .arg(&self.key)
            .arg(VALUE_FIELD)
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_error(&self.key, "read", e))
    }

    /// The token of the last accepted write, or `None` when nothing was written yet.
    ///
    /// # Errors
    /// As [`get`](Self::get); [`ErrorKind::InvalidKey`] when the stored token is not one.
    pub async fn fence(&self) -> Result<Option<u64>, LockError> {
        let mut conn = self.conn.clone();
        read_fence(&mut conn, &self.key).await
    }
}

impl<C> fmt::Debug for RedisValue<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisValue")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Several fields of one Redis hash that accept writes only from the newest holder of a lock,
/// written together.
///
/// The hash `<key>` holds your fields and `fence`, the token of the last accepted write; one
/// token check covers all the fields of a write, which is one script call (all fields or none).
/// See the [module docs](self).
///
/// ```no_run
/// # async fn demo(
/// #     locks: lock_runtime::LockService,
/// #     redis: redis::aio::MultiplexedConnection,
/// # ) -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::fenced::RedisHash;
///
/// let order = RedisHash::new(&redis, "order:9");
/// let guard = locks.lock("order:9").await?;
/// order.set_fields(&guard, &[("state", "paid"), ("amount", "42")]).await?; // all or none
/// let state: Option<String> = order.get_field("state").await?;
/// # let _ = state;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisHash<C> {
    conn: C,
    key: String,
}

impl<C> RedisHash<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    /// The hash stored at `key`, read and written through a clone of `conn`.
    pub fn new(conn: &C, key: impl Into<String>) -> Self {
        RedisHash {
            conn: conn.clone(),
            key: key.into(),
        }
    }

    /// The Redis key of the hash.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Sets every `(field, value)` of `fields` when `holder`'s token is not older than the
    /// token of the last accepted write, and stores the token with them; otherwise writes
    /// nothing. A token equal to the stored one is accepted (the same hold writing again).
    ///
    /// # Errors
    /// * [`ErrorKind::Stale`]: a newer holder has written; nothing was written.
    /// * [`ErrorKind::InvalidArgument`]: the token is 0, `fields` is empty or names the field
    ///   `fence`, or a field or value is not exactly one Redis argument; nothing was written.
    /// * [`ErrorKind::InvalidKey`]: the key holds something else than a fenced hash; nothing
    ///   was written.
    /// * [`ErrorKind::Backend`] (or [`ErrorKind::Auth`]): Redis failed or could not be reached.
    ///
    /// # Cancel safety
    /// The write is one script call: dropping the future before it completes leaves the hash
    /// either written (every field) or untouched.
    pub async fn set_fields<F, V>(
        &self,
        holder: &impl Fenced,
        fields: &[(F, V)],
    ) -> Result<(), LockError>
    where
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        let mut pairs = Vec::with_capacity(fields.len());
        for (field, value) in fields {
            let field = one_arg(&self.key, "a field name", field)?;
            if field == FENCE_FIELD.as_bytes() {
                return Err(invalid(
                    &self.key,
                    "the field `fence` holds the fencing token and cannot be written",
                ));
            }
            pairs.push((field, one_arg(&self.key, "a field's value", value)?));
        }
        if pairs.is_empty() {
            return Err(invalid(&self.key, "no fields to write"));
        }
        let token = token_of(&self.key, holder)?;
        let pairs: Vec<(&[u8], &[u8])> = pairs
            .iter()
            .map(|(f, v)| (f.as_slice(), v.as_slice()))
            .collect();
        let mut conn = self.conn.clone();
        fenced_set(&mut conn, &self.key, token, &pairs).await
    }

    /// The value of `field`, or `None` when it was never written.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`] when the key is not a hash; [`ErrorKind::Backend`] when Redis
    /// fails or the value does not convert to `T`.
    pub async fn get_field<T: FromRedisValue>(
        &self,
        field: impl ToRedisArgs,
    ) -> Result<Option<T>, LockError> {
        let mut conn = self.conn.clone();
        redis::cmd("HGET")
            .arg(&self.key)
            .arg(field)
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_error(&self.key, "read", e))
    }

    /// The token of the last accepted write, or `None` when nothing was written yet.
    ///
    /// # Errors
    /// As [`get_field`](Self::get_field); [`ErrorKind::InvalidKey`] when the stored token is
    /// not one.
    pub async fn fence(&self) -> Result<Option<u64>, LockError> {
        let mut conn = self.conn.clone();
        read_fence(&mut conn, &self.key).await
    }
}

impl<C> fmt::Debug for RedisHash<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisHash")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Runs the compare-and-set script: `fields` are written with `token`, or nothing is.
async fn fenced_set<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    token: u64,
    fields: &[(&[u8], &[u8])],
) -> Result<(), LockError> {
    let mut call = SET.key(key);
    call.arg(token);
    for (field, value) in fields {
        call.arg(*field).arg(*value);
    }
    let (written, stored): (i64, String) = call
        .invoke_async(conn)
        .await
        .map_err(|e| redis_error(key, WRITE, e))?;
    if written == 1 {
        Ok(())
    } else {
        Err(LockError::new(
            ErrorKind::Stale,
            format!(
                "fenced write to `{key}` rejected: its fencing token {token} is older than the \
                 token {stored} of the last accepted write (a newer holder of the lock has \
                 written; this hold was lost). Nothing was written"
            ),
        )
        .with_key(key))
    }
}

async fn read_fence<C: ConnectionLike>(conn: &mut C, key: &str) -> Result<Option<u64>, LockError> {
    let stored: Option<String> = redis::cmd("HGET")
        .arg(key)
        .arg(FENCE_FIELD)
        .query_async(conn)
        .await
        .map_err(|e| redis_error(key, "read the fencing token", e))?;
    match stored {
        None => Ok(None),
        Some(s) => match s.parse::<u64>() {
            Ok(token) if token > 0 => Ok(Some(token)),
            _ => Err(LockError::new(
                ErrorKind::InvalidKey,
                format!("the field `fence` of `{key}` is {s:?}, not a fencing token"),
            )
            .with_key(key)),
        },
    }
}

/// The holder's token; 0 is refused (no lock issues it, it would only ever mean "unset").
fn token_of(key: &str, holder: &impl Fenced) -> Result<u64, LockError> {
    match holder.fencing_token() {
        0 => Err(invalid(
            key,
            "the fencing token is 0: pass the token of an exclusive hold (LockGuard::fence, a \
             write lock, a permit); a read lock's body does not write",
        )),
        token => Ok(token),
    }
}

/// `arg` as exactly one Redis argument.
fn one_arg(key: &str, what: &str, arg: &impl ToRedisArgs) -> Result<Vec<u8>, LockError> {
    let mut args = arg.to_redis_args();
    if args.len() == 1 {
        Ok(args.pop().unwrap_or_default())
    } else {
        Err(invalid(
            key,
            &format!("{what} must be one Redis argument, got {}", args.len()),
        ))
    }
}

fn invalid(key: &str, why: &str) -> LockError {
    LockError::new(
        ErrorKind::InvalidArgument,
        format!("fenced write to `{key}`: {why}; nothing was written"),
    )
    .with_key(key)
}

/// A Redis error of a fenced operation: the script's own errors and `WRONGTYPE` are the
/// caller's to fix (`FENCEARG`: [`ErrorKind::InvalidArgument`], `FENCEKEY` and `WRONGTYPE`:
/// [`ErrorKind::InvalidKey`]); the rest is [`LockError::backend`]. The script checks everything
/// before its first write, so a write that failed with one of these wrote nothing.
fn redis_error(key: &str, what: &str, err: RedisError) -> LockError {
    let kind = match err.code() {
        Some("FENCEARG") => ErrorKind::InvalidArgument,
        Some("FENCEKEY" | "WRONGTYPE") => ErrorKind::InvalidKey,
        _ => return LockError::backend(&format!("{what} `{key}`"), err).with_key(key),
    };
    let detail = err.detail().unwrap_or("");
    let message = if what == WRITE {
        format!("{what} `{key}`: {detail}; nothing was written")
    } else {
        format!("{what} `{key}`: {detail}")
    };
    LockError::new(kind, message).with_key(key).with_source(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_tokens_and_references_are_fenced() {
        assert_eq!(7u64.fencing_token(), 7);
        assert_eq!((&&9u64).fencing_token(), 9);
    }

    #[test]
    fn a_zero_token_and_multi_argument_values_are_refused_before_redis() {
        let e = token_of("k", &0u64).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.key(), Some("k"));
        assert_eq!(token_of("k", &5u64).unwrap(), 5);
        assert_eq!(one_arg("k", "v", &"x").unwrap(), b"x");
        let e = one_arg("k", "the value", &vec![1, 2]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("got 2"), "{e}");
    }
}
