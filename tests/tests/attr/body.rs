//! `#[distributed_lock]` fns against a real Redis: order of acquire, body and release, early
//! returns, panics, cancellation, timeouts, re-entry through nested calls and loss.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Fixture, eventually};
use lock_runtime::{ErrorKind, LockError, LockService, distributed_lock};
use lock_tests::harness::unique_key;
use tokio::sync::Notify;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Records the `WARN` events of the thread it is the default subscriber of, as text: message and
/// fields.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<String>>>);

impl Events {
    fn warnings(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

struct Text<'a>(&'a mut String);

impl Visit for Text<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut text = String::new();
            event.record(&mut Text(&mut text));
            self.0.lock().unwrap().push(text);
        }
    }
}

/// Short enough that renewal and loss show within a test.
const WATCHDOG: Duration = Duration::from_millis(300);

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Business(&'static str),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl AppError {
    fn lock_kind(&self) -> Option<ErrorKind> {
        match self {
            AppError::Lock(e) => Some(e.kind()),
            AppError::Business(_) => None,
        }
    }
}

/// The global service every annotated fn uses, and a second one to look from outside.
async fn setup() -> (&'static LockService, LockService) {
    let fx = Fixture::single().await;
    let global = lock_runtime::init(fx.config(WATCHDOG)).await.unwrap();
    (global, fx.service(WATCHDOG).await)
}

#[distributed_lock(key = "order:<key>", wait = "2s")]
async fn inspect_inside(
    key: &str,
    probe: &LockService,
) -> Result<(u32, Option<u64>, Option<u64>), AppError> {
    let info = probe.inspect(&format!("order:{key}")).await?;
    Ok((info.hold_count, info.fence, lock_runtime::current_fence()))
}

#[tokio::test]
async fn the_body_runs_holding_the_lock_and_it_is_released_after() {
    let (_, probe) = setup().await;
    let key = unique_key("order");
    let (count, fence, current) = inspect_inside(&key, &probe).await.unwrap();
    assert_eq!(count, 1);
    assert_eq!(fence, current, "current_fence() is the token of the hold");
    assert!(current.is_some());
    assert!(
        lock_runtime::current_fence().is_none(),
        "no fence outside a body"
    );
    assert!(
        !probe.is_locked(&format!("order:{key}")).await.unwrap(),
        "released when the fn returns"
    );
}

#[distributed_lock(key = "early:<key>")]
async fn fails_early(key: String, fail: bool) -> Result<u32, AppError> {
    let parsed: Result<u32, AppError> = if fail {
        Err(AppError::Business("nope"))
    } else {
        Ok(7)
    };
    let value = parsed?;
    Ok(value)
}

#[tokio::test]
async fn question_mark_returns_release_the_lock() {
    let (_, probe) = setup().await;
    let key = unique_key("early");
    assert!(matches!(
        fails_early(key.clone(), true).await,
        Err(AppError::Business("nope"))
    ));
    assert!(!probe.is_locked(&format!("early:{key}")).await.unwrap());
    assert_eq!(fails_early(key.clone(), false).await.unwrap(), 7);
    assert!(!probe.is_locked(&format!("early:{key}")).await.unwrap());
}

// The two fns below hold with a 30 s lease (the global service's watchdog is 300 ms): only the
// background release of the dropped guard frees them within the test's 2 s, never a lease
// running out.
#[distributed_lock(key = "panic:<key>", lease = "30s")]
async fn panics(key: String) -> Result<(), AppError> {
    if !key.is_empty() {
        panic!("the body panics");
    }
    Ok(())
}

#[distributed_lock(key = "slow:<key>", wait = "forever", lease = "30s")]
async fn slow(key: String, entered: &AtomicU32) -> Result<(), AppError> {
    entered.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

#[tokio::test]
async fn a_panicking_or_cancelled_call_releases_in_the_background() {
    let (_, probe) = setup().await;
    let key = unique_key("panic");
    let task = tokio::spawn(panics(key.clone()));
    assert!(task.await.unwrap_err().is_panic());
    eventually(
        "lock of the panicked call freed",
        Duration::from_secs(2),
        || async { !probe.is_locked(&format!("panic:{key}")).await.unwrap() },
    )
    .await;

    let key = unique_key("slow");
    let entered = AtomicU32::new(0);
    let call = slow(key.clone(), &entered);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), call)
            .await
            .is_err(),
        "cancelled"
    );
    assert_eq!(entered.load(Ordering::SeqCst), 1);
    eventually(
        "lock of the cancelled call freed",
        Duration::from_secs(2),
        || async { !probe.is_locked(&format!("slow:{key}")).await.unwrap() },
    )
    .await;
}

#[distributed_lock(key = "busy:<key>", wait = "200ms")]
async fn gives_up_quickly(key: &str, ran: &AtomicU32) -> Result<(), AppError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn a_timeout_skips_the_body_and_returns_the_lock_error() {
    let (_, probe) = setup().await;
    let key = unique_key("busy");
    let held = probe.lock(format!("busy:{key}")).await.unwrap();
    let ran = AtomicU32::new(0);
    let started = Instant::now();
    let err = gives_up_quickly(&key, &ran).await.unwrap_err();
    assert_eq!(err.lock_kind(), Some(ErrorKind::Timeout));
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the body must not run without the lock"
    );
    held.release().await.unwrap();
    gives_up_quickly(&key, &ran).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[distributed_lock(key = "account:<id>", wait = "1s")]
async fn transfer(id: u64, probe: &LockService) -> Result<u32, AppError> {
    // a nested locked call on the same key in the same call chain re-enters
    audit(id, probe).await
}

#[distributed_lock(key = "account:<id>", wait = "1s")]
async fn audit(id: u64, probe: &LockService) -> Result<u32, AppError> {
    Ok(probe.inspect(&format!("account:{id}")).await?.hold_count)
}

#[tokio::test]
async fn nested_annotated_calls_on_the_same_key_reenter() {
    let (_, probe) = setup().await;
    let id = unique_number();
    // re-entered (waiting for itself would have timed out after 1 s): Redis holds one grant,
    // the re-entry is counted by the holding process
    assert_eq!(transfer(id, &probe).await.unwrap(), 1);
    assert!(!probe.is_locked(&format!("account:{id}")).await.unwrap());
}

#[distributed_lock(key = "short:<key>", lease = "300ms")]
async fn outlives_its_lease(key: &str, finished: &AtomicU32) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    finished.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "short:<key>", lease = "300ms", on_lost = "continue")]
async fn outlives_its_lease_and_continues(
    key: &str,
    entered: &Notify,
    taken: &Notify,
) -> Result<u64, AppError> {
    let fence = lock_runtime::current_fence().expect("inside a locked body");
    entered.notify_one();
    // runs on while another service holds the lock
    taken.notified().await;
    Ok(fence)
}

#[tokio::test]
async fn a_lease_running_out_stops_the_body_unless_told_to_continue() {
    let (_, probe) = setup().await;
    let key = unique_key("short");
    let finished = AtomicU32::new(0);
    let started = Instant::now();
    let err = outlives_its_lease(&key, &finished).await.unwrap_err();
    assert_eq!(err.lock_kind(), Some(ErrorKind::Lost));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "stopped at the lease, not after the body"
    );
    assert_eq!(finished.load(Ordering::SeqCst), 0, "the body was stopped");

    // on_lost = "continue": the body goes on after the lock was lost - really lost: another
    // service takes it while the body runs - and a warning says so
    let events = Events::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(events.clone()));
    let (entered, taken) = (Notify::new(), Notify::new());
    let other = async {
        entered.notified().await;
        let guard = probe
            .lock(format!("short:{key}"))
            .wait(Duration::from_secs(3))
            .await
            .expect("another service takes the lock once the lease ran out");
        taken.notify_one();
        guard
    };
    let (body, other) = tokio::join!(
        outlives_its_lease_and_continues(&key, &entered, &taken),
        other
    );
    let body_fence = body.expect("the body ran to its end");
    assert!(
        other.fence() > body_fence,
        "another holder ({}) while the body ({body_fence}) ran",
        other.fence()
    );
    let warnings = events.warnings();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("lock lost while the body runs")
                && w.contains(&format!("short:{key}"))
                && w.contains("lease ran out")),
        "warning of the loss: {warnings:#?}"
    );
    other.release().await.unwrap();
}

#[distributed_lock(key = "watched:<key>", wait = "1s")]
async fn runs_until_lost(key: &str, entered: &AtomicU32) -> Result<(), AppError> {
    entered.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

#[tokio::test]
async fn a_force_unlock_found_by_renewal_stops_the_body() {
    let (_, probe) = setup().await;
    let key = unique_key("watched");
    let entered = AtomicU32::new(0);
    let call = runs_until_lost(&key, &entered);
    let unlock = async {
        eventually("body entered", Duration::from_secs(2), || async {
            entered.load(Ordering::SeqCst) == 1
        })
        .await;
        assert!(probe.force_unlock(&format!("watched:{key}")).await.unwrap());
        Instant::now()
    };
    let (result, unlocked_at) = tokio::join!(call, unlock);
    assert_eq!(result.unwrap_err().lock_kind(), Some(ErrorKind::Lost));
    assert!(
        unlocked_at.elapsed() < WATCHDOG * 3,
        "noticed at the next renewal"
    );
}

struct Shop {
    id: u32,
}

impl Shop {
    #[distributed_lock(key = "shop:<self.id>:goods:<goods_id>", lease = "2s")]
    async fn sell(&self, goods_id: u64, probe: &LockService) -> Result<bool, AppError> {
        probe
            .is_locked(&format!("shop:{}:goods:{goods_id}", self.id))
            .await
            .map_err(Into::into)
    }
}

#[tokio::test]
async fn methods_build_keys_from_self() {
    let (_, probe) = setup().await;
    let shop = Shop {
        id: unique_number() as u32,
    };
    assert!(shop.sell(5, &probe).await.unwrap());
    // and the future of an annotated method can be spawned (it is Send)
    let handle =
        tokio::spawn(async move { shop.sell(6, &LockService::clone(&probe)).await.map(|_| ()) });
    handle.await.unwrap().unwrap();
}

fn unique_number() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    (nanos as u64) ^ (u64::from(std::process::id()) << 40)
}

#[distributed_lock(key = "job:<name>", wait = "0s", hold_at_least = "2s")]
async fn scheduled_job(name: &str, runs: &AtomicU32) -> Result<(), AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// `hold_at_least` on the attribute: the fn returns at once, the lock stays taken (by nobody)
/// until the minimum hold ends, and a second firing meanwhile - here or in another service -
/// skips the body.
#[tokio::test]
async fn a_minimum_hold_keeps_the_job_from_running_again_until_it_ends() {
    let (_, probe) = setup().await;
    let name = unique_key("nightly");
    let key = format!("job:{name}");
    let runs = AtomicU32::new(0);
    let started = Instant::now();
    scheduled_job(&name, &runs).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the fn waited out the minimum hold: {:?}",
        started.elapsed()
    );
    let kept = probe.inspect(&key).await.unwrap().kept.expect("kept");
    assert!(kept.left > Duration::from_millis(500), "{kept:?}");
    let again = scheduled_job(&name, &runs).await.unwrap_err();
    assert!(
        matches!(&again, AppError::Lock(e) if e.is_timeout()),
        "{again:?}"
    );
    let elsewhere = probe.try_lock(&key).await.unwrap_err();
    assert!(elsewhere.is_timeout(), "{elsewhere}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // once it ends, the next run of the schedule runs
    eventually("the minimum hold ends", Duration::from_secs(10), || async {
        !probe.is_locked(&key).await.unwrap()
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );
    scheduled_job(&name, &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
