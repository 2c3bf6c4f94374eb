//! Segmented hot stock: one item's stock split over several counters, each behind a lock of
//! its own, so that several buyers of the same item are in a critical section at once.
//!
//! Under one lock `goods:<id>` a hot item sells one purchase per hold, and every buyer of every
//! instance waits in one line. [`SegmentedStock`] splits the stock over `N` counters
//! `goods:<id>:seg:<i>` (the overselling article's "segment the hot stock"), each sold only
//! under the lock of the same name: up to `N` buyers hold locks at the same time, each in a
//! different segment, and each segment still never oversells.
//!
//! ```no_run
//! # async fn demo(locks: lock_runtime::LockService) -> Result<(), lock_examples::shop::ShopError> {
//! use std::num::NonZeroU32;
//! use lock_examples::segmented::{BuyOutcome, SegmentedStock};
//! use lock_examples::shop::Store;
//!
//! let store = Store::connect("redis://127.0.0.1:6379", "shop").await?;
//! let stock = SegmentedStock::new(&store, 42, 8);
//! stock.restock(&locks, 500).await?; // 63 63 63 63 62 62 62 62
//! match stock.buy(&locks, NonZeroU32::MIN).await? {
//!     BuyOutcome::Bought(sale) => println!("segment {} has {} left", sale.segment, sale.left),
//!     BuyOutcome::SoldOut => println!("sold out"),
//!     BuyOutcome::TooLarge { largest } => println!("at most {largest} in one purchase"),
//!     BuyOutcome::Busy => println!("try again"),
//! }
//! # Ok(()) }
//! ```
//!
//! # A buy
//! 1. It starts at the next segment in round-robin order (the first start is random per
//!    [`SegmentedStock`] value, so that instances do not all begin at segment 0).
//! 2. It tries each segment's lock once without waiting (`try_lock`). Holding it, it reads the
//!    segment's stock; when the segment has `qty` units it sells them there and is done;
//!    otherwise it releases the lock and moves on. A busy segment is passed over for now.
//! 3. Then it waits for the segments it found busy, one after the other, for at most the wait
//!    (default 2 s) in all, and does the same with each.
//!
//! It reports [`BuyOutcome::SoldOut`] only when it saw every segment empty (stock never comes
//! back during a sale, so the item was sold out then); [`BuyOutcome::Busy`] when some segment
//! stayed locked by others until the wait ran out. With one segment a buy is a plain wait for
//! the lock `goods:<id>:seg:0`.
//!
//! # Trade-offs
//! - **A buy is served from one segment.** Taking units from two segments would mean holding
//!   two locks at once (in a fixed order, to avoid deadlocks) and give back the concurrency the
//!   split bought. So a buy of more units than any single segment holds gets
//!   [`BuyOutcome::TooLarge`] (with the largest segment's stock) even when the segments
//!   together hold enough. Keep the number of segments well below the stock divided by the
//!   largest quantity a buyer may take; near the end of a sale, a buyer can retry with
//!   `largest`.
//! - **The end of a sale costs more.** The last units are scattered: a buy may look at every
//!   segment before it finds one, and "sold out" costs one lock call per segment. Reading the
//!   total stock takes `N` reads, and a restock takes every segment's lock.
//! - **It pays when holds are long compared with a lock call.** Segments let more buyers work
//!   at once; when the section under the lock is a couple of Redis calls, one key's hand-off is
//!   already fast and the extra lock calls of passing over busy segments eat part of the gain
//!   (see the bench's S5).
//!
//! # Fencing
//! Each segment keeps, next to its counter, the fencing token of the last hold that read it
//! (`goods:<id>:seg:<i>:fence`). A write is accepted only from that hold: a holder that was
//! paused past its lease while a newer holder read the segment finds its write refused, and
//! the buy moves on as if the segment had been busy ([`Activity::stale_writes`] counts them).
//! The lock keeps buyers from getting in each other's way; the token makes a lease that ran out
//! harmless.

use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use lock_runtime::LockService;
use redis::Script;
use serde::Serialize;

use crate::shop::{ShopError, Store};

/// See `segmented/read.lua`.
static READ: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("segmented/read.lua")));
/// See `segmented/write.lua`.
static WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("segmented/write.lua")));

/// One item's stock split over segments, each sold under a lock of its own. Clones share the
/// round-robin position and the [`Activity`] counters.
#[derive(Debug, Clone)]
pub struct SegmentedStock {
    store: Store,
    goods: u64,
    lease: Duration,
    wait: Duration,
    shared: Arc<Shared>,
}

/// The result of [`SegmentedStock::buy`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum BuyOutcome {
    /// Sold from one segment.
    Bought(SegmentSale),
    /// Every segment was seen empty.
    SoldOut,
    /// No segment held the quantity asked for, though not all were empty.
    TooLarge {
        /// The most units one segment held when it was looked at.
        largest: i64,
    },
    /// Some segment was locked by others until the wait ran out, and no other could serve.
    Busy,
}

/// A purchase served by one segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentSale {
    /// The goods id.
    pub goods: u64,
    /// The segment it was sold from.
    pub segment: u32,
    /// Units sold.
    pub qty: u32,
    /// Units left in that segment after this purchase.
    pub left: i64,
    /// The fencing token of the segment lock's hold the purchase ran under.
    pub fence: u64,
}

/// What the buys of a [`SegmentedStock`] (and its clones) in this process did, since it was
/// made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Activity {
    /// Segment locks acquired.
    pub holds: u64,
    /// The most segment locks held at the same moment.
    pub max_holding: usize,
    /// Times a segment's lock was busy: a try that found it held, or a wait that ran out.
    pub busy: u64,
    /// Times a buy got a segment's lock while another buy of this process was still inside
    /// the same segment. Always 0 while the lock excludes; the tests check it.
    pub overlaps: u64,
    /// Writes refused because a newer hold had read the segment (the hold had outlived its
    /// lease).
    pub stale_writes: u64,
}

#[derive(Debug)]
struct Shared {
    next: AtomicUsize,
    /// Buys inside each segment right now.
    inside: Box<[AtomicUsize]>,
    holding: AtomicUsize,
    max_holding: AtomicUsize,
    holds: AtomicU64,
    busy: AtomicU64,
    overlaps: AtomicU64,
    stale_writes: AtomicU64,
}

/// Marks a buy inside a segment, from just after its lock was acquired until just before it
/// is released.
struct Inside<'a> {
    shared: &'a Shared,
    segment: usize,
}

impl Shared {
    fn enter(&self, segment: usize) -> Inside<'_> {
        if self.inside[segment].fetch_add(1, Ordering::SeqCst) > 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let holding = self.holding.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_holding.fetch_max(holding, Ordering::SeqCst);
        self.holds.fetch_add(1, Ordering::SeqCst);
        Inside {
            shared: self,
            segment,
        }
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.shared.holding.fetch_sub(1, Ordering::SeqCst);
        self.shared.inside[self.segment].fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one look at a segment found.
enum Seen {
    Unseen,
    /// Locked by others (or our write was refused as stale).
    Busy,
    /// Fewer units than asked for.
    Short(i64),
    Sold(SegmentSale),
}

/// Splits `stock` over `segments` counters: `stock / segments` each, the remainder one unit
/// each to the first ones (500 over 8: 63 63 63 63 62 62 62 62). No segment is taken as one.
pub fn split_stock(stock: u64, segments: u32) -> Vec<u64> {
    let n = u64::from(segments.max(1));
    let (each, rest) = (stock / n, stock % n);
    (0..n).map(|i| each + u64::from(i < rest)).collect()
}

impl SegmentedStock {
    /// The stock of `goods` in `store`, split over `segments` counters (0 is taken as 1). Buys
    /// hold a segment's lock for at most 5 s and wait at most 2 s in all for busy segments;
    /// the checkout inside a purchase is the store's ([`Store::with_checkout`]).
    pub fn new(store: &Store, goods: u64, segments: u32) -> SegmentedStock {
        let segments = segments.max(1) as usize;
        // A random first segment per value: instances do not all start at segment 0.
        let start = RandomState::new().hash_one(goods) as usize;
        SegmentedStock {
            store: store.clone(),
            goods,
            lease: Duration::from_secs(5),
            wait: Duration::from_secs(2),
            shared: Arc::new(Shared {
                next: AtomicUsize::new(start),
                inside: (0..segments).map(|_| AtomicUsize::new(0)).collect(),
                holding: AtomicUsize::new(0),
                max_holding: AtomicUsize::new(0),
                holds: AtomicU64::new(0),
                busy: AtomicU64::new(0),
                overlaps: AtomicU64::new(0),
                stale_writes: AtomicU64::new(0),
            }),
        }
    }

    /// How long a buy holds a segment's lock at most (default 5 s).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a buy waits in all for segments that others hold (default 2 s).
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The goods id.
    pub fn goods(&self) -> u64 {
        self.goods
    }

    /// The number of segments.
    pub fn segments(&self) -> u32 {
        u32::try_from(self.shared.inside.len()).unwrap_or(u32::MAX)
    }

    /// The lock of `segment`: `goods:<id>:seg:<segment>`.
    pub fn lock_key(&self, segment: u32) -> String {
        format!("goods:{}:seg:{segment}", self.goods)
    }

    /// The Redis key of `segment`'s stock counter, `<namespace>:goods:<id>:seg:<segment>`.
    pub fn stock_key(&self, segment: u32) -> String {
        self.store.key(self.goods, &format!("seg:{segment}"))
    }

    fn fence_key(&self, segment: u32) -> String {
        format!("{}:fence", self.stock_key(segment))
    }

    /// What the buys did so far (these counters are per process).
    pub fn activity(&self) -> Activity {
        let s = &*self.shared;
        Activity {
            holds: s.holds.load(Ordering::SeqCst),
            max_holding: s.max_holding.load(Ordering::SeqCst),
            busy: s.busy.load(Ordering::SeqCst),
            overlaps: s.overlaps.load(Ordering::SeqCst),
            stale_writes: s.stale_writes.load(Ordering::SeqCst),
        }
    }

    /// Sets the stock to `stock`, split with [`split_stock`]; each segment is written under its
    /// lock, so a restock never interleaves with a purchase of the same segment. Returns the
    /// segments' stock.
    ///
    /// # Errors
    /// [`ShopError::Lock`] when a segment's lock cannot be taken within the wait;
    /// [`ShopError::Store`] when Redis fails.
    pub async fn restock(&self, locks: &LockService, stock: u64) -> Result<Vec<u64>, ShopError> {
        let shares = split_stock(stock, self.segments());
        for (segment, share) in (0..).zip(&shares) {
            // A refused write means a newer hold read the segment meanwhile: take it again.
            while !self.write_segment(locks, segment, *share).await? {}
        }
        Ok(shares)
    }

    async fn write_segment(
        &self,
        locks: &LockService,
        segment: u32,
        stock: u64,
    ) -> Result<bool, ShopError> {
        let guard = locks
            .lock(self.lock_key(segment))
            .lease(self.lease)
            .wait(self.wait)
            .await?;
        let fence = guard.fence();
        let written = match self.read(segment, fence).await? {
            Read::Stale => false,
            Read::Stock(_) | Read::Missing => self.write(segment, fence, stock).await?,
        };
        release(guard).await;
        Ok(written)
    }

    /// The stock of each segment.
    ///
    /// # Errors
    /// [`ShopError::NotFound`] when the goods were never stocked in segments;
    /// [`ShopError::Store`] when Redis fails.
    pub async fn stock(&self) -> Result<Vec<i64>, ShopError> {
        let keys: Vec<String> = (0..self.segments()).map(|i| self.stock_key(i)).collect();
        let stock: Vec<Option<i64>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut self.store.connection())
            .await?;
        stock
            .into_iter()
            .map(|s| s.ok_or(ShopError::NotFound { goods: self.goods }))
            .collect()
    }

    /// Buys `qty` units from one segment (see the [module docs](self) for the order in which
    /// segments are tried and what each outcome means).
    ///
    /// # Errors
    /// [`ShopError::Lock`] for lock errors other than a busy segment (Redis unavailable, ...);
    /// [`ShopError::NotFound`] when a segment was never stocked; [`ShopError::Store`] when
    /// Redis fails.
    ///
    /// # Cancel safety
    /// Dropping the future releases the segment lock it holds (in the background); a purchase
    /// is either written or not, never half.
    pub async fn buy(&self, locks: &LockService, qty: NonZeroU32) -> Result<BuyOutcome, ShopError> {
        let n = self.shared.inside.len();
        let start = self.shared.next.fetch_add(1, Ordering::Relaxed) % n;
        let order = || (0..n).map(move |k| (start + k) % n);
        let mut seen: Vec<Seen> = (0..n).map(|_| Seen::Unseen).collect();
        let deadline = Instant::now() + self.wait;
        // With one segment a first try without waiting would only cost a call.
        if n > 1 {
            for i in order() {
                match self.look(locks, i, qty, Duration::ZERO).await? {
                    Seen::Sold(sale) => return Ok(BuyOutcome::Bought(sale)),
                    other => seen[i] = other,
                }
            }
        }
        for i in order() {
            if matches!(seen[i], Seen::Unseen | Seen::Busy) {
                let wait = deadline.saturating_duration_since(Instant::now());
                match self.look(locks, i, qty, wait).await? {
                    Seen::Sold(sale) => return Ok(BuyOutcome::Bought(sale)),
                    other => seen[i] = other,
                }
            }
        }
        let mut largest = 0;
        for s in &seen {
            match s {
                Seen::Short(stock) => largest = largest.max(*stock),
                _ => return Ok(BuyOutcome::Busy),
            }
        }
        Ok(if largest > 0 {
            BuyOutcome::TooLarge { largest }
        } else {
            BuyOutcome::SoldOut
        })
    }

    /// Takes segment `i`'s lock (waiting at most `wait`) and sells `qty` from it if it can.
    async fn look(
        &self,
        locks: &LockService,
        i: usize,
        qty: NonZeroU32,
        wait: Duration,
    ) -> Result<Seen, ShopError> {
        let segment = u32::try_from(i).unwrap_or(u32::MAX);
        let acquired = locks
            .lock(self.lock_key(segment))
            .lease(self.lease)
            .wait(wait)
            .await;
        let guard = match acquired {
            Ok(guard) => guard,
            Err(e) if e.is_timeout() => {
                self.shared.busy.fetch_add(1, Ordering::SeqCst);
                return Ok(Seen::Busy);
            }
            Err(e) => return Err(e.into()),
        };
        let inside = self.shared.enter(i);
        let seen = self.sell(segment, qty, guard.fence()).await;
        drop(inside);
        release(guard).await;
        seen
    }

    /// The critical section: read the segment, check, check out, write it back.
    async fn sell(&self, segment: u32, qty: NonZeroU32, fence: u64) -> Result<Seen, ShopError> {
        let stock = match self.read(segment, fence).await? {
            Read::Stock(stock) => stock,
            Read::Missing => return Err(ShopError::NotFound { goods: self.goods }),
            Read::Stale => {
                self.shared.stale_writes.fetch_add(1, Ordering::SeqCst);
                return Ok(Seen::Busy);
            }
        };
        let want = i64::from(qty.get());
        if stock < want {
            return Ok(Seen::Short(stock));
        }
        let checkout = self.store.checkout();
        if !checkout.is_zero() {
            tokio::time::sleep(checkout).await; // charge the card, write the order, ...
        }
        let left = stock - want;
        if !self.write(segment, fence, left).await? {
            self.shared.stale_writes.fetch_add(1, Ordering::SeqCst);
            return Ok(Seen::Busy);
        }
        Ok(Seen::Sold(SegmentSale {
            goods: self.goods,
            segment,
            qty: qty.get(),
            left,
            fence,
        }))
    }

    async fn read(&self, segment: u32, fence: u64) -> Result<Read, ShopError> {
        let (state, stock): (i64, i64) = READ
            .key(self.stock_key(segment))
            .key(self.fence_key(segment))
            .arg(fence)
            .invoke_async(&mut self.store.connection())
            .await?;
        Ok(match state {
            1 => Read::Stock(stock),
            0 => Read::Stale,
            _ => Read::Missing,
        })
    }

    /// Writes the stock for the hold with token `fence`; false when refused.
    async fn write(
        &self,
        segment: u32,
        fence: u64,
        stock: impl redis::ToRedisArgs + Send + Sync,
    ) -> Result<bool, ShopError> {
        let written: i64 = WRITE
            .key(self.stock_key(segment))
            .key(self.fence_key(segment))
            .arg(fence)
            .arg(stock)
            .invoke_async(&mut self.store.connection())
            .await?;
        Ok(written == 1)
    }
}

enum Read {
    Stock(i64),
    Stale,
    Missing,
}

/// Releases a segment lock. An error is logged, not returned: what the hold protected is
/// already decided (a write is accepted or refused by its token), and the library gives a lock
/// back by itself when a release does not get through.
async fn release(guard: lock_runtime::LockGuard) {
    let key = guard.key().to_owned();
    if let Err(error) = guard.release().await {
        tracing::warn!(%key, %error, "releasing a segment lock failed");
    }
}

#[cfg(test)]
mod tests {
    use super::split_stock;

    #[test]
    fn the_remainder_goes_to_the_first_segments() {
        assert_eq!(split_stock(500, 8), [63, 63, 63, 63, 62, 62, 62, 62]);
        assert_eq!(split_stock(10, 4), [3, 3, 2, 2]);
        assert_eq!(split_stock(3, 5), [1, 1, 1, 0, 0]);
        assert_eq!(split_stock(7, 0), [7]);
        assert_eq!(split_stock(500, 8).iter().sum::<u64>(), 500);
    }
}
