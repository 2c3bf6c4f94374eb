//! `#[distributed_lock]` with `kind = "read" | "write"` and `keys = [..]` against a real Redis:
//! readers share, writers exclude; multi-key transfers in opposite directions neither deadlock
//! nor lose money; `wait = "0s"` skips the body of every kind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::common::{Fixture, Raw, eventually};
use lock_runtime::{ErrorKind, LockError, LockService, distributed_lock};
use lock_tests::harness::unique_key;
use tokio::task::JoinSet;

/// Short enough that renewal and loss show within a test.
const WATCHDOG: Duration = Duration::from_millis(300);

/// The global service every annotated fn uses, a second one to look from outside, and the
/// fixture (for raw connections).
async fn setup() -> (Fixture, LockService) {
    let fx = Fixture::single().await;
    lock_runtime::init(fx.config(WATCHDOG)).await.unwrap();
    let probe = fx.service(WATCHDOG).await;
    (fx, probe)
}

fn kind_of<T>(result: Result<T, LockError>) -> Option<ErrorKind> {
    result.err().map(|e| e.kind())
}

/// Who is inside the bodies of one read-write lock, and every time someone was where they must
/// not be.
#[derive(Default)]
struct Room {
    readers: AtomicU32,
    writers: AtomicU32,
    most_readers: AtomicU32,
    overlaps: AtomicU32,
}

impl Room {
    fn check(&self, writer: bool) {
        let (readers, writers) = (
            self.readers.load(Ordering::SeqCst),
            self.writers.load(Ordering::SeqCst),
        );
        let bad = match writer {
            true => readers > 0 || writers > 1,
            false => writers > 0,
        };
        if bad {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[distributed_lock(key = "catalog:<key>", kind = "read", wait = "20s")]
async fn read_catalog(key: String, room: Arc<Room>, hold: Duration) -> Result<(), LockError> {
    let now = room.readers.fetch_add(1, Ordering::SeqCst) + 1;
    room.most_readers.fetch_max(now, Ordering::SeqCst);
    room.check(false);
    tokio::time::sleep(hold).await;
    room.check(false);
    room.readers.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "catalog:<key>", kind = "write", wait = "20s")]
async fn write_catalog(key: String, room: Arc<Room>, hold: Duration) -> Result<(), LockError> {
    room.writers.fetch_add(1, Ordering::SeqCst);
    room.check(true);
    tokio::time::sleep(hold).await;
    room.check(true);
    room.writers.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_bodies_run_together_and_write_bodies_alone() {
    let (_fx, probe) = setup().await;
    let key = unique_key("catalog");

    // readers alone: they hold the lock at the same time
    let room = Arc::new(Room::default());
    let mut calls = JoinSet::new();
    for _ in 0..3 {
        calls.spawn(read_catalog(
            key.clone(),
            room.clone(),
            Duration::from_millis(400),
        ));
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap().unwrap();
    }
    let most = room.most_readers.load(Ordering::SeqCst);
    assert!(
        most >= 2,
        "read bodies ran together: at most {most} at once"
    );

    // readers and writers mixed: a writer is always alone
    let room = Arc::new(Room::default());
    let mut calls = JoinSet::new();
    for round in 0..4 {
        for _ in 0..3 {
            calls.spawn(read_catalog(
                key.clone(),
                room.clone(),
                Duration::from_millis(60),
            ));
        }
        calls.spawn(write_catalog(
            key.clone(),
            room.clone(),
            Duration::from_millis(60),
        ));
        if round % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap().unwrap();
    }
    assert_eq!(
        room.overlaps.load(Ordering::SeqCst),
        0,
        "a write body overlapped another body"
    );
    assert!(room.most_readers.load(Ordering::SeqCst) >= 1);
    assert!(!probe.is_locked(&format!("catalog:{key}")).await.unwrap());
}

/// Accounts kept on Redis; the bodies read, wait, then write, so two transfers on one account at
/// the same time lose money.
#[distributed_lock(keys = ["account:<bank>:<from>", "account:<bank>:<to>"], wait = "10s")]
async fn transfer(
    bank: String,
    from: u32,
    to: u32,
    amount: u64,
    mut raw: Raw,
    inside: Arc<Inside>,
) -> Result<(), LockError> {
    inside.enter(&[from, to]);
    let (from_key, to_key) = (format!("{bank}:{from}"), format!("{bank}:{to}"));
    let from_balance = raw.get(&from_key).await.unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let to_balance = raw.get(&to_key).await.unwrap_or(0);
    let moved = amount.min(from_balance);
    raw.set(&from_key, from_balance - moved).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    raw.set(&to_key, to_balance + moved).await;
    inside.leave(&[from, to]);
    Ok(())
}

/// Which accounts transfer bodies are in, and every time two were in one account at once.
#[derive(Default)]
struct Inside {
    accounts: std::sync::Mutex<Vec<u32>>,
    overlaps: AtomicU32,
}

impl Inside {
    fn enter(&self, accounts: &[u32]) {
        let mut inside = self.accounts.lock().unwrap();
        if accounts.iter().any(|a| inside.contains(a)) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        inside.extend_from_slice(accounts);
    }

    fn leave(&self, accounts: &[u32]) {
        let mut inside = self.accounts.lock().unwrap();
        for account in accounts {
            let at = inside.iter().position(|a| a == account).unwrap();
            inside.swap_remove(at);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_both_ways_neither_deadlock_nor_lose_money() {
    let (fx, probe) = setup().await;
    let bank = unique_key("bank");
    let mut raw = fx.raw().await;
    for account in 1..=3 {
        raw.set(&format!("{bank}:{account}"), 1_000).await;
    }
    let inside = Arc::new(Inside::default());
    let mut calls = JoinSet::new();
    for round in 0..8u64 {
        // a -> b and b -> a at the same time, and a third account in the mix
        for (from, to) in [(1, 2), (2, 1), (2, 3), (3, 1)] {
            calls.spawn(transfer(
                bank.clone(),
                from,
                to,
                10 + round,
                fx.raw().await,
                inside.clone(),
            ));
        }
    }
    let started = Instant::now();
    let all = async {
        while let Some(done) = calls.join_next().await {
            done.unwrap().unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("the transfers finished");
    let mut total = 0;
    for account in 1..=3 {
        total += raw.get(&format!("{bank}:{account}")).await.unwrap();
    }
    assert_eq!(total, 3_000, "money was lost or made");
    assert_eq!(inside.overlaps.load(Ordering::SeqCst), 0);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no deadlock waited out"
    );
    for account in 1..=3 {
        let key = format!("account:{bank}:{account}");
        assert!(!probe.is_locked(&key).await.unwrap(), "{key} released");
    }
}

#[distributed_lock(key = "account:<bank>:<id>", wait = "1s")]
async fn audit(bank: &str, id: u32, probe: &LockService) -> Result<u32, LockError> {
    Ok(probe
        .inspect(&format!("account:{bank}:{id}"))
        .await?
        .hold_count)
}

/// What a multi-key body sees of its locks.
#[derive(Debug, PartialEq)]
struct Seen {
    key: String,
    fence: u64,
    fence_on_redis: Option<u64>,
    audits: (u32, u32),
}

#[distributed_lock(keys = ["account:<bank>:<from>", "account:<bank>:<to>"], wait = "2s")]
async fn transfer_and_audit(
    bank: &str,
    from: u32,
    to: u32,
    probe: &LockService,
) -> Result<Seen, LockError> {
    let key = lock_runtime::current_lock_key().expect("inside a locked body");
    let fence = lock_runtime::current_fence().expect("inside a locked body");
    let fence_on_redis = probe.inspect(&key).await?.fence;
    // nested calls on either key re-enter (waiting would time out after 1 s)
    let audits = (
        audit(bank, from, probe).await?,
        audit(bank, to, probe).await?,
    );
    Ok(Seen {
        key,
        fence,
        fence_on_redis,
        audits,
    })
}

#[tokio::test]
async fn multi_key_bodies_reenter_every_key_and_read_the_first_lock_taken() {
    let (_fx, probe) = setup().await;
    let bank = unique_key("bank");
    let there = transfer_and_audit(&bank, 1, 2, &probe).await.unwrap();
    let back = transfer_and_audit(&bank, 2, 1, &probe).await.unwrap();
    assert_eq!(there.audits, (1, 1), "one grant per key on Redis");
    assert_eq!(back.audits, (1, 1));
    assert_eq!(
        there.key, back.key,
        "the first lock taken does not depend on the order the keys are listed in"
    );
    assert!(there.key.starts_with(&format!("account:{bank}:")));
    assert_eq!(Some(there.fence), there.fence_on_redis);
    assert_eq!(Some(back.fence), back.fence_on_redis);
    assert!(back.fence > there.fence, "a fresh grant, a newer token");
    assert!(lock_runtime::current_fence().is_none());
}

#[distributed_lock(keys = ["watched:<key>:a", "watched:<key>:b"], wait = "1s")]
async fn runs_until_one_is_lost(key: &str, entered: &AtomicU32) -> Result<(), LockError> {
    entered.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

#[tokio::test]
async fn losing_any_key_stops_a_multi_key_body() {
    let (_fx, probe) = setup().await;
    for lost in ["a", "b"] {
        let key = unique_key("watched");
        let entered = AtomicU32::new(0);
        let call = runs_until_one_is_lost(&key, &entered);
        let unlock = async {
            eventually("body entered", Duration::from_secs(2), || async {
                entered.load(Ordering::SeqCst) == 1
            })
            .await;
            let lost_key = format!("watched:{key}:{lost}");
            assert!(probe.force_unlock(&lost_key).await.unwrap());
            Instant::now()
        };
        let (result, unlocked_at) = tokio::join!(call, unlock);
        assert_eq!(kind_of(result), Some(ErrorKind::Lost), "lost {lost}");
        assert!(
            unlocked_at.elapsed() < WATCHDOG * 3,
            "noticed at the next renewal"
        );
        for other in ["a", "b"] {
            let other = format!("watched:{key}:{other}");
            eventually("the other key released", Duration::from_secs(2), || async {
                !probe.is_locked(&other).await.unwrap()
            })
            .await;
        }
    }
}

#[distributed_lock(keys = ["lapse:<key>:a", "lapse:<key>:b"], lease = "500ms", wait = "4s")]
async fn both_for_a_short_lease(
    key: &str,
    other_holds: &AtomicBool,
    entered: &AtomicU32,
    overlaps: &AtomicU32,
) -> Result<(), LockError> {
    entered.fetch_add(1, Ordering::SeqCst);
    if other_holds.load(Ordering::SeqCst) {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

/// A multi-key body with a 500 ms lease takes its first key at once and waits for the second
/// (held 1.5 s by another service) while the first one's lease runs out and a third service
/// takes it (for 1.5 s). The body does not start while that service holds its first key: it
/// runs once both are its own again, within its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_body_never_runs_while_another_service_holds_one_of_its_keys() {
    let (fx, probe) = setup().await;
    let third = fx.service(WATCHDOG).await;
    let key = unique_key("lapse");
    let (first, second) = (format!("lapse:{key}:a"), format!("lapse:{key}:b"));
    let busy = probe
        .lock(&second)
        .lease(Duration::from_millis(1500))
        .await
        .unwrap();
    let (other_holds, entered, overlaps) =
        (AtomicBool::new(false), AtomicU32::new(0), AtomicU32::new(0));
    let call = both_for_a_short_lease(&key, &other_holds, &entered, &overlaps);
    let other_side = async {
        eventually(
            "the body's first key taken",
            Duration::from_secs(3),
            || async { probe.is_locked(&first).await.unwrap() },
        )
        .await;
        // granted once the body's lease of the key ran out
        let hold = third
            .lock(&first)
            .lease(Duration::from_secs(30))
            .wait(Duration::from_secs(3))
            .await
            .unwrap();
        other_holds.store(true, Ordering::SeqCst);
        // the third service's hold lasts 1.5 s
        tokio::time::sleep(Duration::from_millis(1500)).await;
        other_holds.store(false, Ordering::SeqCst);
        hold.release().await.unwrap();
    };
    let (result, ()) = tokio::join!(call, other_side);
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "the body ran while another service held one of its keys ({result:?})"
    );
    result.unwrap();
    assert_eq!(entered.load(Ordering::SeqCst), 1);
    for k in [&first, &second] {
        eventually(
            "released after the body",
            Duration::from_secs(2),
            || async { !probe.is_locked(k).await.unwrap() },
        )
        .await;
    }
    drop(busy);
}

#[distributed_lock(key = "job:<key>", wait = "0s")]
async fn try_lock(key: &str, ran: &AtomicU32) -> Result<(), LockError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "job:<key>", kind = "read", wait = "0s")]
async fn try_read(key: &str, ran: &AtomicU32) -> Result<(), LockError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "job:<key>", kind = "write", wait = "0s")]
async fn try_write(key: &str, ran: &AtomicU32) -> Result<(), LockError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(keys = ["job:<key>:a", "job:<key>:b"], wait = "0s")]
async fn try_both(key: &str, ran: &AtomicU32) -> Result<(), LockError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Asserts that `call` gave up at once with a timeout and did not run its body.
fn skipped(what: &str, result: Result<(), LockError>, started: Instant, ran: &AtomicU32) {
    assert_eq!(kind_of(result), Some(ErrorKind::Timeout), "{what}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "{what}: the body did not run"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{what}: tried once"
    );
}

#[tokio::test]
async fn wait_zero_skips_the_body_of_every_kind_when_the_lock_is_taken() {
    let (_fx, probe) = setup().await;

    let key = unique_key("job");
    let ran = AtomicU32::new(0);
    let held = probe.lock(format!("job:{key}")).await.unwrap();
    let started = Instant::now();
    skipped("lock", try_lock(&key, &ran).await, started, &ran);
    held.release().await.unwrap();
    try_lock(&key, &ran).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1, "runs once the lock is free");

    let key = unique_key("job");
    let ran = AtomicU32::new(0);
    let writing = probe.write(format!("job:{key}")).await.unwrap();
    let started = Instant::now();
    skipped("read", try_read(&key, &ran).await, started, &ran);
    writing.release().await.unwrap();
    try_read(&key, &ran).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1, "runs once the writer left");

    let key = unique_key("job");
    let ran = AtomicU32::new(0);
    let reading = probe.read(format!("job:{key}")).await.unwrap();
    let started = Instant::now();
    skipped("write", try_write(&key, &ran).await, started, &ran);
    reading.release().await.unwrap();
    try_write(&key, &ran).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1, "runs once the reader left");

    // one of the two keys taken: the other is given back, the body does not run
    for taken in ["a", "b"] {
        let key = unique_key("job");
        let ran = AtomicU32::new(0);
        let held = probe.lock(format!("job:{key}:{taken}")).await.unwrap();
        let started = Instant::now();
        skipped("keys", try_both(&key, &ran).await, started, &ran);
        for free in ["a", "b"].into_iter().filter(|k| *k != taken) {
            let free = format!("job:{key}:{free}");
            eventually(
                "the key it took given back",
                Duration::from_secs(2),
                || async { !probe.is_locked(&free).await.unwrap() },
            )
            .await;
        }
        held.release().await.unwrap();
        try_both(&key, &ran).await.unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "runs once both are free");
    }
}

#[distributed_lock(key = "prices:<key>", kind = "write", wait = "1s")]
async fn reprice(key: &str) -> Result<Option<u64>, LockError> {
    Ok(lock_runtime::current_fence())
}

#[distributed_lock(key = "prices:<key>", kind = "read", wait = "1s")]
async fn quote(key: &str) -> Result<Option<u64>, LockError> {
    Ok(lock_runtime::current_fence())
}

#[distributed_lock(key = "prices:<key>", kind = "write", wait = "1s")]
async fn reprice_and_quote(key: &str) -> Result<Option<u64>, LockError> {
    let write_fence = lock_runtime::current_fence();
    // a read of the same key inside the write body is a downgrade: granted at once
    let read_fence = quote(key).await?;
    assert_eq!(
        lock_runtime::current_fence(),
        write_fence,
        "back in the write body"
    );
    Ok(read_fence)
}

#[distributed_lock(key = "prices:<key>", kind = "read", wait = "1s")]
async fn quote_and_reprice(key: &str) -> Result<Option<u64>, LockError> {
    // a write of the same key inside the read body would wait for its own read share
    reprice(key).await
}

#[tokio::test]
async fn read_bodies_nest_in_write_bodies_and_writes_in_reads_are_refused() {
    let (_fx, probe) = setup().await;
    let key = unique_key("prices");
    let started = Instant::now();
    let read_fence = reprice_and_quote(&key).await.unwrap();
    assert_eq!(
        read_fence, None,
        "the read body ran; a read body has no token for fenced writes"
    );
    let refused = quote_and_reprice(&key).await;
    assert_eq!(kind_of(refused), Some(ErrorKind::WouldDeadlock));
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "neither waited for itself"
    );
    // both released: a write from another service gets it at once
    let write = probe.write(format!("prices:{key}")).try_once().await;
    write.unwrap().release().await.unwrap();
}
