//! Re-entry follows one call chain: a locked body's nested calls re-enter its lock, while
//! concurrent children of one request or one body (`join!`), and tasks spawned from it, never
//! share a hold with each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::Fixture;
use axum::Router;
use axum::body::Body;
use axum::routing::get;
use lock_runtime::middleware::tower::OwnerScopeLayer;
use lock_runtime::{ErrorKind, LockError, LockService, distributed_lock, owner};
use lock_tests::harness::unique_key;
use tower::ServiceExt;

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

async fn setup() -> &'static LockService {
    let fx = Fixture::single().await;
    lock_runtime::init(fx.config(Duration::from_secs(30)))
        .await
        .unwrap()
}

/// How many bodies run at once, and the most seen.
#[derive(Default)]
struct Concurrency {
    now: AtomicU32,
    max: AtomicU32,
}

impl Concurrency {
    async fn run(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn max(&self) -> u32 {
        self.max.load(Ordering::SeqCst)
    }
}

#[distributed_lock(key = "account:<account>", wait = "5s")]
async fn debit(account: &str, seen: &Concurrency) -> Result<(), AppError> {
    seen.run().await;
    Ok(())
}

/// Not locked itself: settles three debits of one account at once.
async fn settle_batch(account: &str, seen: &Concurrency) -> Result<(), AppError> {
    let (a, b, c) = tokio::join!(
        debit(account, seen),
        debit(account, seen),
        debit(account, seen)
    );
    a.and(b).and(c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_children_of_one_request_exclude_each_other() {
    setup().await;
    let account = unique_key("acct");
    let seen = Arc::new(Concurrency::default());
    let app = {
        let (account, seen) = (account.clone(), seen.clone());
        Router::new()
            .route(
                "/",
                get(move || async move {
                    settle_batch(&account, &seen).await.unwrap();
                    "settled"
                }),
            )
            .layer(OwnerScopeLayer::new())
    };
    let response = app
        .oneshot(
            axum::http::Request::builder()
                .uri("/")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(seen.max(), 1, "the three debits of one request ran at once");
}

#[distributed_lock(key = "ledger:<account>", wait = "5s")]
async fn inner_entry(account: &str, seen: &Concurrency) -> Result<(), AppError> {
    seen.run().await;
    Ok(())
}

#[distributed_lock(key = "ledger:<account>", wait = "5s")]
async fn outer_entry(account: &str, seen: &Concurrency) -> Result<(), AppError> {
    // both children re-enter this body's hold (no deadlock), one at a time
    let (a, b) = tokio::join!(inner_entry(account, seen), inner_entry(account, seen));
    a.and(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_of_a_locked_body_re_enter_it_one_at_a_time() {
    setup().await;
    let account = unique_key("ledger");
    let seen = Concurrency::default();
    owner::chain("job-1", outer_entry(&account, &seen))
        .await
        .unwrap();
    assert_eq!(seen.max(), 1, "two children were inside the hold at once");
}

#[distributed_lock(key = "report:<name>", wait = "5s")]
async fn nested_report(name: &str, locks: &LockService) -> Result<u64, AppError> {
    // a plain lock call on the same key in the body re-enters too
    let again = locks.lock(format!("report:{name}")).await?;
    let fence = again.fence();
    again.release().await?;
    Ok(fence)
}

#[distributed_lock(key = "report:<name>", wait = "5s")]
async fn spawning_report(name: &str) -> Result<ErrorKind, AppError> {
    let key = format!("report:{name}");
    let child = owner::spawn(async move {
        let locks = lock_runtime::global().await.unwrap();
        locks.lock(key).wait(Duration::from_secs(5)).await.map(drop)
    });
    let err = child.await.unwrap().unwrap_err();
    Ok(err.kind())
}

#[tokio::test]
async fn nested_calls_re_enter_and_a_spawned_task_is_told_it_would_deadlock() {
    let locks = setup().await;
    let name = unique_key("report");
    let fence = nested_report(&name, locks).await.unwrap();
    assert!(fence > 0);
    assert!(!locks.is_locked(&format!("report:{name}")).await.unwrap());
    let started = std::time::Instant::now();
    let kind = spawning_report(&name).await.unwrap();
    assert_eq!(kind, ErrorKind::WouldDeadlock);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once, not after the wait"
    );
    assert!(!locks.is_locked(&format!("report:{name}")).await.unwrap());
}

#[tokio::test]
async fn a_labelled_chain_shows_its_label_in_the_holder() {
    let locks = setup().await;
    let key = unique_key("label");
    let holder = owner::chain("req-42", async {
        let guard = locks.lock(&key).await.unwrap();
        let holder = locks.inspect(&key).await.unwrap().holder.unwrap();
        assert!(guard.owner().as_str().starts_with("req-42#"));
        guard.release().await.unwrap();
        holder
    })
    .await;
    assert!(holder.contains(":req-42#"), "{holder}");
}

#[distributed_lock(key = "plain:<name>", wait = "300ms")]
async fn plain_section(name: &str) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn a_plain_lock_call_opens_no_body() {
    let locks = setup().await;
    let name = unique_key("plain");
    // a guard held in a fn is no locked body: a call made next to it is another owner, which
    // would wait for a guard that goes only after it returns
    let guard = locks.lock(format!("plain:{name}")).await.unwrap();
    let err = plain_section(&name).await.unwrap_err();
    assert_eq!(err.0.kind(), ErrorKind::WouldDeadlock);
    guard.release().await.unwrap();
    // run() makes one
    locks
        .lock(format!("plain:{name}"))
        .run(|_| plain_section(&name))
        .await
        .unwrap();
}

#[async_trait::async_trait]
trait Ledger {
    async fn post(&self, account: &str, seen: &Concurrency) -> Result<u64, AppError>;
}

struct Books;

#[async_trait::async_trait]
impl Ledger for Books {
    #[distributed_lock(key = "books:<account>", wait = "5s")]
    async fn post(&self, account: &str, seen: &Concurrency) -> Result<u64, AppError> {
        seen.run().await;
        Ok(lock_runtime::current_fence().expect("inside the locked body"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_trait_methods_run_under_the_lock() {
    let locks = setup().await;
    let account = unique_key("books");
    let seen = Concurrency::default();
    let books = Books;
    let (a, b, c) = tokio::join!(
        books.post(&account, &seen),
        books.post(&account, &seen),
        books.post(&account, &seen)
    );
    let fences = [a.unwrap(), b.unwrap(), c.unwrap()];
    assert_eq!(seen.max(), 1, "the three posts ran at once");
    assert!(fences.iter().all(|f| *f > 0));
    assert!(!locks.is_locked(&format!("books:{account}")).await.unwrap());
}

#[distributed_lock(key = "thrice:<name>", wait = "5s")]
async fn lock_three_times(name: &str, locks: &LockService) -> Result<ErrorKind, AppError> {
    let key = format!("thrice:{name}");
    let first = locks.lock(&key).await?;
    let second = locks.lock(&key).wait(Duration::from_secs(3)).await;
    drop(first);
    Ok(second.map(drop).unwrap_err().kind())
}

/// A second lock call on a key whose guard the same task holds at the same level (outside any
/// locked body, or as a plain re-entry in the same body) can never be granted by waiting: it is
/// refused at once with `WouldDeadlock`, not after its whole wait. Trying once still says the
/// lock is busy, and another task still waits for the guard as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_lock_of_a_key_this_task_holds_is_refused_at_once() {
    let locks = setup().await;
    let key = unique_key("relock");
    let wait = Duration::from_secs(3);

    // outside a locked body
    let held = locks.lock(&key).await.unwrap();
    let started = std::time::Instant::now();
    let err = locks.lock(&key).wait(wait).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldDeadlock, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    for how in ["run", "distributed_lock"] {
        assert!(
            err.to_string().contains(how),
            "the error says how to re-enter: {err}"
        );
    }
    let busy = locks.try_lock(&key).await.unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Timeout, "{busy}");
    // another task waits for the guard and gets it once it is released
    let waiter = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move { locks.lock(&key).wait(Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "another task waits");
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();

    // concurrent children of one task that take plain guards directly are at one site: the
    // one that would wait is refused; as chains of their own they take turns
    let child = |chain: Option<&'static str>| {
        let work = async {
            let guard = locks.lock(&key).wait(Duration::from_secs(5)).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await
        };
        async move {
            match chain {
                Some(label) => owner::chain(label, work).await,
                None => work.await,
            }
        }
    };
    let (a, b) = tokio::join!(child(None), child(None));
    let refused = [&a, &b]
        .iter()
        .filter(|r| {
            r.as_ref()
                .is_err_and(|e| e.kind() == ErrorKind::WouldDeadlock)
        })
        .count();
    assert_eq!(refused, 1, "{a:?} {b:?}");
    assert!(a.is_ok() || b.is_ok(), "{a:?} {b:?}");
    let (a, b) = tokio::join!(child(Some("job-a")), child(Some("job-b")));
    a.unwrap();
    b.unwrap();

    // "lock three times" as plain re-entries in one `run` body
    let started = std::time::Instant::now();
    let kinds = locks
        .lock(&key)
        .run_nested(|_| async {
            let first = locks.lock(&key).await.unwrap();
            let second = locks.lock(&key).wait(wait).await.map(drop);
            let third = locks.lock(&key).wait(wait).await.map(drop);
            drop(first);
            [second.unwrap_err().kind(), third.unwrap_err().kind()]
        })
        .await
        .unwrap();
    assert_eq!(kinds, [ErrorKind::WouldDeadlock; 2]);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );

    // the same in an annotated fn
    let name = unique_key("thrice");
    let started = std::time::Instant::now();
    let kind = lock_three_times(&name, locks).await.unwrap();
    assert_eq!(kind, ErrorKind::WouldDeadlock);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    assert!(!locks.is_locked(&key).await.unwrap());
    assert!(!locks.is_locked(&format!("thrice:{name}")).await.unwrap());
}

/// A locked fn's future holds its body boxed: one that joins two locked calls is no bigger than
/// one of them, however deep such calls nest (carried by value, the body was stored once per
/// layer of the engine: 100 KB for `outer_entry`, which overflowed a test thread's 2 MB stack in
/// a debug build).
#[test]
fn a_locked_fn_future_does_not_grow_with_the_locked_calls_in_its_body() {
    let seen = Concurrency::default();
    let inner = std::mem::size_of_val(&inner_entry("a", &seen));
    let outer = std::mem::size_of_val(&outer_entry("a", &seen));
    assert!(
        outer <= inner,
        "the future of a locked fn joining two locked calls takes {outer} bytes, one call {inner}"
    );
}
