//! Segmented hot stock (`lock_examples::segmented`) on a real Redis: many buyers of three
//! services sell one item split over 8 segments without overselling, and really hold several
//! segment locks at once; the outcomes a single buyer sees (too large, busy, sold out).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::common::Fixture;
use lock_examples::segmented::{BuyOutcome, SegmentSale, SegmentedStock};
use lock_examples::shop::Store;
use lock_runtime::LockService;
use lock_tests::harness::unique_key;

const WATCHDOG: Duration = Duration::from_secs(30);
const SERVICES: usize = 3;
const TASKS_PER_SERVICE: usize = 16;
const STOCK: u64 = 500;
const SEGMENTS: u32 = 8;

async fn store(fx: &Fixture) -> Store {
    Store::connect(&fx.topo().url(), &unique_key("segmented"))
        .await
        .unwrap()
        // a checkout inside the hold: holds overlap, and so would the purchases without the lock
        .with_checkout(Duration::from_millis(1))
}

fn one(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// What one sale of many buyers did.
struct Sale {
    sales: Vec<SegmentSale>,
    sold_out_answers: usize,
}

/// `SERVICES` x `TASKS_PER_SERVICE` buyers of one unit each time: each makes `demand` purchases,
/// or, without a demand, buys until it is told the goods are sold out. After a sold-out answer
/// it checks that every segment is empty indeed.
async fn sell(stock: &SegmentedStock, services: &[LockService], demand: Option<usize>) -> Sale {
    let mut tasks = Vec::new();
    for task in 0..SERVICES * TASKS_PER_SERVICE {
        let (stock, locks) = (stock.clone(), services[task % SERVICES].clone());
        tasks.push(tokio::spawn(async move {
            let (mut sales, mut sold_out_answers, mut busy) = (Vec::new(), 0, 0);
            while demand.is_none_or(|d| sales.len() + sold_out_answers < d) {
                match stock.buy(&locks, one(1)).await.unwrap() {
                    BuyOutcome::Bought(sale) => sales.push(sale),
                    BuyOutcome::SoldOut => {
                        let left = stock.stock().await.unwrap();
                        assert!(
                            left.iter().all(|s| *s == 0),
                            "sold out answered while the segments hold {left:?}"
                        );
                        sold_out_answers += 1;
                        if demand.is_none() {
                            break;
                        }
                    }
                    BuyOutcome::Busy => {
                        // a segment stayed busy for the whole wait (10 s): try again, a few times
                        busy += 1;
                        assert!(busy < 10, "busy {busy} times");
                    }
                    other @ BuyOutcome::TooLarge { .. } => panic!("one unit: {other:?}"),
                }
            }
            (sales, sold_out_answers)
        }));
    }
    let mut sale = Sale {
        sales: Vec::new(),
        sold_out_answers: 0,
    };
    for task in tasks {
        let (sales, sold_out) = task.await.unwrap();
        sale.sales.extend(sales);
        sale.sold_out_answers += sold_out;
    }
    sale
}

/// The checks every sale must pass: units sold once each, segment by segment, with tokens in
/// sale order; the segments hold what was not sold; the locks excluded and were held several at
/// a time; none is left held.
async fn check(stock: &SegmentedStock, services: &[LockService], sale: &Sale, initial: &[u64]) {
    let left = stock.stock().await.unwrap();
    assert!(left.iter().all(|s| *s >= 0), "negative stock: {left:?}");
    let remaining: i64 = left.iter().sum();
    assert_eq!(
        remaining,
        STOCK as i64 - sale.sales.len() as i64,
        "oversold: {} sales but the segments went from {initial:?} to {left:?}",
        sale.sales.len()
    );
    let mut by_segment: BTreeMap<u32, Vec<&SegmentSale>> = BTreeMap::new();
    for s in &sale.sales {
        by_segment.entry(s.segment).or_default().push(s);
    }
    for segment in 0..stock.segments() {
        let sales = by_segment.entry(segment).or_default();
        sales.sort_by_key(|s| s.fence);
        let lefts: Vec<i64> = sales.iter().map(|s| s.left).collect();
        let start = initial[segment as usize] as i64;
        let expected: Vec<i64> = (left[segment as usize]..start).rev().collect();
        assert_eq!(
            lefts, expected,
            "segment {segment}: in token order each sale leaves one unit less"
        );
    }
    let activity = stock.activity();
    eprintln!("{} sales, {activity:?}", sale.sales.len());
    assert_eq!(
        activity.overlaps, 0,
        "two buyers inside one segment at once: {activity:?}"
    );
    assert_eq!(activity.stale_writes, 0, "{activity:?}");
    assert!(
        activity.max_holding > 1,
        "the buyers never held two segment locks at once: {activity:?}"
    );
    for segment in 0..stock.segments() {
        assert!(
            !services[0]
                .is_locked(&stock.lock_key(segment))
                .await
                .unwrap(),
            "segment {segment} still locked"
        );
    }
}

async fn services(fx: &Fixture) -> Vec<LockService> {
    let mut services = Vec::new();
    for _ in 0..SERVICES {
        services.push(fx.service(WATCHDOG).await);
    }
    services
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_buyers_sell_exactly_the_stock_across_segments() {
    let fx = Fixture::single().await;
    let services = services(&fx).await;
    let stock =
        SegmentedStock::new(&store(&fx).await, 1, SEGMENTS).with_wait(Duration::from_secs(10));
    let initial = stock.restock(&services[0], STOCK).await.unwrap();
    assert_eq!(initial, [63, 63, 63, 63, 62, 62, 62, 62]);

    let sale = sell(&stock, &services, None).await;

    assert_eq!(sale.sales.len() as u64, STOCK, "sold = min(demand, stock)");
    assert_eq!(sale.sold_out_answers, SERVICES * TASKS_PER_SERVICE);
    check(&stock, &services, &sale, &initial).await;
    assert_eq!(stock.stock().await.unwrap(), [0; SEGMENTS as usize]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demand_below_the_stock_is_served_in_full() {
    let fx = Fixture::single().await;
    let services = services(&fx).await;
    let stock =
        SegmentedStock::new(&store(&fx).await, 2, SEGMENTS).with_wait(Duration::from_secs(10));
    let initial = stock.restock(&services[0], STOCK).await.unwrap();
    let per_task = 8;

    let sale = sell(&stock, &services, Some(per_task)).await;

    let demand = SERVICES * TASKS_PER_SERVICE * per_task;
    assert!(demand < STOCK as usize);
    assert_eq!(sale.sales.len(), demand, "sold = min(demand, stock)");
    assert_eq!(sale.sold_out_answers, 0);
    check(&stock, &services, &sale, &initial).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buy_is_served_from_one_segment() {
    let fx = Fixture::single().await;
    let locks = fx.service(WATCHDOG).await;
    let stock = SegmentedStock::new(&store(&fx).await, 3, 4);
    assert_eq!(stock.restock(&locks, 10).await.unwrap(), [3, 3, 2, 2]);

    // 10 units in all, but no segment holds 4
    assert_eq!(
        stock.buy(&locks, one(4)).await.unwrap(),
        BuyOutcome::TooLarge { largest: 3 }
    );
    let mut served = Vec::new();
    for _ in 0..2 {
        let BuyOutcome::Bought(sale) = stock.buy(&locks, one(3)).await.unwrap() else {
            panic!("a segment holds 3");
        };
        assert_eq!((sale.qty, sale.left), (3, 0));
        served.push(sale.segment);
    }
    served.sort_unstable();
    assert_eq!(served, [0, 1]);
    assert_eq!(
        stock.buy(&locks, one(3)).await.unwrap(),
        BuyOutcome::TooLarge { largest: 2 }
    );
    for _ in 0..2 {
        assert!(matches!(
            stock.buy(&locks, one(2)).await.unwrap(),
            BuyOutcome::Bought(_)
        ));
    }
    assert_eq!(
        stock.buy(&locks, one(1)).await.unwrap(),
        BuyOutcome::SoldOut
    );
    assert_eq!(stock.stock().await.unwrap(), [0, 0, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_segment_is_never_taken_for_sold_out() {
    let fx = Fixture::single().await;
    let (locks, other) = (fx.service(WATCHDOG).await, fx.service(WATCHDOG).await);
    let stock = SegmentedStock::new(&store(&fx).await, 4, 4).with_wait(Duration::from_millis(200));
    assert_eq!(stock.restock(&locks, 1).await.unwrap(), [1, 0, 0, 0]);

    // the one segment with stock is held by another service: busy, not sold out
    let held = other.lock(stock.lock_key(0)).await.unwrap();
    assert_eq!(stock.buy(&locks, one(1)).await.unwrap(), BuyOutcome::Busy);
    assert!(stock.activity().busy >= 2, "tried, then waited");
    held.release().await.unwrap();

    let BuyOutcome::Bought(sale) = stock.buy(&locks, one(1)).await.unwrap() else {
        panic!("segment 0 has a unit");
    };
    assert_eq!((sale.segment, sale.left), (0, 0));
    assert_eq!(
        stock.buy(&locks, one(1)).await.unwrap(),
        BuyOutcome::SoldOut
    );
}
