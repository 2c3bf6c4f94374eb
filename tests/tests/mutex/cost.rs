//! What lock operations cost Redis, counted on a server of its own: the commands an
//! uncontended pair runs inside its script calls, and the calls concurrent callers share.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Fixture, Monitor, lock_key, script_call, script_calls};
use lock_tests::harness::{Spec, unique_key};

const LONG_WATCHDOG: Duration = Duration::from_secs(30);

/// The commands scripts ran on `lock` (its key, counter and waiting set), by name, in order:
/// the `MONITOR` lines of the `lua` client.
fn script_commands(monitor: &Monitor) -> Vec<String> {
    monitor
        .lines()
        .iter()
        .filter(|l| l.contains(" lua] "))
        .filter_map(|l| l.split(" lua] ").nth(1))
        .filter_map(|rest| rest.split(' ').next())
        .map(|name| name.trim_matches('"').to_lowercase())
        .collect()
}

/// 64 callers, each on a key of its own, at once.
const CALLERS: usize = 64;
/// The acquire + release pairs each of them makes.
const PAIRS: usize = 20;

/// A service of `fx`'s whose script is loaded and whose connections are up, so that counting
/// starts with its first lock operation.
async fn warmed_service(fx: &Fixture) -> lock_runtime::LockService {
    let locks = fx.service(LONG_WATCHDOG).await;
    locks
        .lock(unique_key("warm-up"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locks
}

/// [`CALLERS`] tasks, started together, each lock and release a key of its own [`PAIRS`]
/// times.
async fn concurrent_callers(locks: &lock_runtime::LockService, name: &str) {
    let start = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CALLERS {
        let (locks, start) = (locks.clone(), start.clone());
        let key = unique_key(&format!("{name}-{i}"));
        tasks.spawn(async move {
            start.wait().await;
            for _ in 0..PAIRS {
                locks.lock(&key).await.unwrap().release().await.unwrap();
            }
        });
    }
    tasks.join_all().await;
}

/// An uncontended acquire takes the free lock in one write: its script draws the token (`TIME`,
/// `SET .. GET` on the slot's counter) and sets the lock with `SET NX`; the release reads the
/// lock and deletes it. Five commands in two script calls per pair, never the waiting set -
/// also for a service that waited for the lock before, once its wait is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_runs_five_commands_in_two_script_calls() {
    let fx = Fixture::own(Spec::Single).await;
    let (a, b) = (
        fx.service(LONG_WATCHDOG).await,
        fx.service(LONG_WATCHDOG).await,
    );
    let key = unique_key("pair-cost");
    let lock = lock_key(&key);
    // the script is loaded and the connections are up before counting
    a.lock(&key).await.unwrap().release().await.unwrap();
    let port = fx.topo().master_port();
    let pair = ["time", "set", "set", "get", "del"];

    let monitor = Monitor::start(port, |l| l.contains("pair-cost") || l.contains(" lua] ")).await;
    for _ in 0..3 {
        a.lock(&key).await.unwrap().release().await.unwrap();
    }
    monitor.sync().await;
    let calls = monitor.lines().iter().filter(|l| script_call(l)).count();
    assert_eq!(calls, 6, "{:#?}", monitor.lines());
    assert_eq!(
        script_commands(&monitor),
        pair.repeat(3),
        "{:#?}",
        monitor.lines()
    );

    // B waits while A holds (registered as waiting), then takes its turn: the waiting set is
    // used while a service waits
    let held = a.lock(&key).await.unwrap();
    let (b2, k) = (b.clone(), key.clone());
    let waiter = tokio::spawn(async move { b2.lock(&k).wait(Duration::from_secs(10)).await });
    let queue = format!("{lock}:wq");
    crate::common::eventually("B registered as waiting", Duration::from_secs(5), || {
        let queue = queue.clone();
        let mut con = fx.redis();
        async move {
            let n: i64 = redis::cmd("ZCARD").arg(&queue).query(&mut con).unwrap();
            n == 1
        }
    })
    .await;
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();

    // A never waited: its pairs stay as cheap
    let monitor = Monitor::start(port, |l| l.contains("pair-cost") || l.contains(" lua] ")).await;
    a.lock(&key).await.unwrap().release().await.unwrap();
    monitor.sync().await;
    assert_eq!(script_commands(&monitor), pair, "{:#?}", monitor.lines());
}

/// The README's figure: "64 concurrent callers share about one call per ten operations". 64
/// tasks lock and release keys of their own; the script calls Redis ran (`INFO commandstats`, on
/// a server of its own) are at most one per five operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_callers_share_script_calls() {
    let fx = Fixture::own(Spec::Single).await;
    let locks = warmed_service(&fx).await;
    let mut con = fx.redis();
    let calls_before = script_calls(&mut con);
    concurrent_callers(&locks, "batched").await;
    let calls = script_calls(&mut con) - calls_before;
    let ops = CALLERS * PAIRS * 2;
    println!("{ops} operations in {calls} script calls");
    assert!(
        calls as usize * 5 <= ops,
        "{ops} operations of {CALLERS} concurrent callers took {calls} script calls"
    );
}

/// Under load the calls on their way stay about the same size, also on a current-thread
/// runtime, where one thread sends the calls and reads their replies: an operation that finds a
/// slot free while a call is on its way waits for the callers that are ready with it (those the
/// last reply answered) and goes with them. Before, the first of those callers took the free
/// slot for its operation alone: calls of one operation alternated with calls of all the others,
/// so Redis and the client took turns instead of working at once. 64 tasks on keys of their own;
/// the operations each script call carried (`MONITOR`: one key per operation on one server).
#[tokio::test(flavor = "current_thread")]
async fn on_a_current_thread_runtime_concurrent_callers_share_calls_evenly() {
    let fx = Fixture::own(Spec::Single).await;
    let locks = warmed_service(&fx).await;
    let monitor = Monitor::start(fx.topo().master_port(), script_call).await;
    concurrent_callers(&locks, "even").await;
    monitor.sync().await;
    // `"FCALL" "<function>" "<numkeys>" ...` (or `"EVALSHA" "<sha>" "<numkeys>"`)
    let sizes: Vec<usize> = monitor
        .lines()
        .iter()
        .filter_map(|l| l.split('"').nth(5)?.parse().ok())
        .collect();
    let ops: usize = sizes.iter().sum();
    assert_eq!(ops, CALLERS * PAIRS * 2, "{sizes:?}");
    let alone = sizes.iter().filter(|&&n| n == 1).count();
    println!("{ops} operations in {} calls: {sizes:?}", sizes.len());
    assert!(
        alone * 20 <= sizes.len(),
        "{alone} of {} calls carried one operation: {sizes:?}",
        sizes.len()
    );
}

/// Locks of one cluster slot granted in one call share the slot's fence counter: the call reads
/// it once (`SET .. GET`), draws the next tokens from the one it drew and writes the last one
/// once, after its operations ran; the tokens still strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_reads_the_counter_of_a_slot_once() {
    let fx = Fixture::own(Spec::cluster()).await;
    let locks = fx.service(LONG_WATCHDOG).await;
    // three keys whose lock keys hash to one slot (Redis tells the slots: CLUSTER KEYSLOT)
    let prefix = unique_key("one-slot");
    let candidates: Vec<String> = (0..40_000).map(|i| format!("{prefix}-{i}")).collect();
    let mut pipe = redis::pipe();
    for key in &candidates {
        pipe.cmd("CLUSTER").arg("KEYSLOT").arg(lock_key(key));
    }
    let slots: Vec<u16> = pipe.query(&mut fx.redis()).unwrap();
    let mut by_slot = std::collections::HashMap::<u16, Vec<String>>::new();
    let (slot, keys) = candidates
        .iter()
        .zip(&slots)
        .find_map(|(key, &slot)| {
            let same = by_slot.entry(slot).or_default();
            same.push(key.clone());
            (same.len() == 3).then(|| (slot, same.clone()))
        })
        .expect("three of 40,000 keys share a slot");
    // the script is loaded and the connections are up before counting
    locks.lock(&keys[0]).await.unwrap().release().await.unwrap();

    let port = fx.topo().master_for_slot(slot);
    let monitor = Monitor::start(port, |l| l.contains(" lua] ") && l.contains(":fence:{")).await;
    let all = locks.lock_all(keys.clone()).await.unwrap();
    monitor.sync().await;
    let counter: Vec<String> = monitor.lines();
    let reads = counter.iter().filter(|l| l.ends_with("\"get\"")).count();
    assert_eq!(reads, 1, "{counter:#?}");
    assert_eq!(
        counter.len(),
        2,
        "one read and one write per call: {counter:#?}"
    );
    let tokens: Vec<u64> = all.guards().iter().map(|g| g.fence()).collect();
    assert!(
        tokens.windows(2).all(|w| w[1] == w[0] + 1),
        "tokens drawn one after another: {tokens:?}"
    );
    let last = format!("\"{}\"", tokens.last().unwrap());
    assert!(
        counter[1].contains(&last),
        "the last token is stored: {counter:#?}"
    );
    all.release().await.unwrap();
}

/// On one server every lock draws its tokens from the server's one counter, so the operations of
/// one call share it whatever their keys: eight locks granted in one call read the counter once
/// and write it once (on a counter per slot it was eight reads and eight writes), and their
/// tokens follow one another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_server_a_call_reads_and_writes_the_counter_once() {
    let fx = Fixture::own(Spec::Single).await;
    let locks = fx.service(LONG_WATCHDOG).await;
    let keys: Vec<String> = (0..8)
        .map(|i| unique_key(&format!("one-counter-{i}")))
        .collect();
    // the script is loaded and the connections are up before counting
    locks.lock(&keys[0]).await.unwrap().release().await.unwrap();

    let monitor = Monitor::start(fx.topo().master_port(), |l| {
        script_call(l) || (l.contains(" lua] ") && l.contains(":fence:{"))
    })
    .await;
    let all = locks.lock_all(keys.clone()).await.unwrap();
    monitor.sync().await;
    let lines = monitor.lines();
    let calls = lines.iter().filter(|l| script_call(l)).count();
    assert_eq!(calls, 1, "the eight acquires share one call: {lines:#?}");
    let counter: Vec<&String> = lines.iter().filter(|l| l.contains(" lua] ")).collect();
    assert_eq!(counter.len(), 2, "one read and one write: {counter:#?}");
    assert!(counter[0].ends_with("\"get\""), "{counter:#?}");
    let mut tokens: Vec<u64> = all.guards().iter().map(|g| g.fence()).collect();
    tokens.sort_unstable();
    assert!(
        tokens.windows(2).all(|w| w[1] == w[0] + 1),
        "tokens drawn one after another: {tokens:?}"
    );
    let last = tokens.last().unwrap().to_string();
    assert!(
        counter[1].contains(&format!("\"{last}\"")),
        "the last token is stored: {counter:#?}"
    );
    all.release().await.unwrap();
    // the next call goes on from it
    let next = locks.lock(&keys[0]).await.unwrap();
    assert!(next.fence() > *tokens.last().unwrap());
    next.release().await.unwrap();
}
