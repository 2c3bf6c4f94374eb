//! Fenced writes (`lock_runtime::fenced`) on a single server and on a cluster: the stores accept
//! a token that is newer than or equal to the last accepted one and reject an older one
//! (`ErrorKind::Stale`) without writing; bad tokens and keys that hold something else write
//! nothing. And the fault fencing exists for: a holder in another process, `SIGSTOP`ped past its
//! lease while another holder takes the lock and writes, writes with its old guard when it is
//! continued - Redis (`RedisValue`) and SQLite (`UPDATE ... WHERE fence <= ?`) both reject it.

use std::time::Duration;

use crate::common::{Fixture, Raw, Worker, eventually};
use lock_runtime::fenced::{RedisHash, RedisValue};
use lock_runtime::{ErrorKind, LockService};
use lock_tests::harness::{Kind, unique_key};
use lock_tests::history::monotonic_ns;
use redis::aio::ConnectionLike;

const LONG_WATCHDOG: Duration = Duration::from_secs(30);
const LEASE: Duration = Duration::from_secs(5);
/// A lease that runs out while the test goes on: the next `lock(..).wait(WAIT)` gets the lock.
const SHORT_LEASE: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(10);

/// Runs `$body` with `$conn` bound to a plain data connection to the fixture's topology (a
/// multiplexed connection, or a cluster connection).
macro_rules! with_data_conn {
    ($fx:expr, |$conn:ident| $body:expr) => {
        match $fx.raw().await {
            Raw::Single($conn) => $body,
            Raw::Cluster($conn) => $body,
        }
    };
}

/// A key for fenced data (not a lock key).
fn data_key(what: &str) -> String {
    unique_key(&format!("fenced-{what}"))
}

async fn newer_tokens_are_accepted_older_ones_are_stale(fx: Fixture) {
    let locks = fx.service(LONG_WATCHDOG).await;
    with_data_conn!(fx, |conn| value_accepts_newer_rejects_older(&locks, &conn)
        .await);
}

async fn value_accepts_newer_rejects_older<C>(locks: &LockService, conn: &C)
where
    C: ConnectionLike + Clone + Send + Sync,
{
    let key = unique_key("goods");
    let stock = RedisValue::new(conn, data_key("stock"));
    assert_eq!(stock.get::<u32>().await.unwrap(), None);
    assert_eq!(stock.fence().await.unwrap(), None);

    let first = locks.lock(&key).lease(SHORT_LEASE).await.unwrap();
    stock.set(&first, 10).await.unwrap();
    assert_eq!(stock.fence().await.unwrap(), Some(first.fence()));

    // The first lease runs out (the first holder is slow); the lock passes on.
    let second = locks.lock(&key).lease(LEASE).wait(WAIT).await.unwrap();
    assert!(second.fence() > first.fence());
    stock.set(&second, 9).await.unwrap();
    assert_eq!(stock.get::<u32>().await.unwrap(), Some(9));

    // The first holder writes again with its guard: rejected.
    let err = stock.set(&first, 7).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
    assert!(err.is_stale());
    assert_eq!(err.key(), Some(stock.key()));
    assert!(
        err.to_string().contains(&second.fence().to_string()),
        "{err}"
    );
    // The raw token is the same writer.
    let err = stock.set(&first.fence(), 7).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Stale);
    assert_eq!(
        stock.get::<u32>().await.unwrap(),
        Some(9),
        "value untouched"
    );
    assert_eq!(stock.fence().await.unwrap(), Some(second.fence()));

    // The same hold may write again (an equal token is accepted).
    stock.set(&second, 8).await.unwrap();
    assert_eq!(stock.get::<u32>().await.unwrap(), Some(8));
    let second_fence = second.fence();
    second.release().await.unwrap();

    // A locked body writes with its `Held`, and a re-entered hold carries the same token.
    let stock_in_body = stock.clone();
    let token = locks
        .lock(&key)
        .lease(LEASE)
        .run_nested(|held| async move {
            stock_in_body.set(&held, 6).await.unwrap();
            let inner = locks.lock(&key).await.unwrap();
            assert_eq!(inner.fence(), held.fence());
            stock_in_body.set(&inner, 5).await.unwrap();
            inner.release().await.unwrap();
            held.fence()
        })
        .await
        .unwrap();
    assert!(token > second_fence);
    assert_eq!(stock.get::<u32>().await.unwrap(), Some(5));
    assert_eq!(stock.fence().await.unwrap(), Some(token));
}

async fn tokens_compare_as_numbers_not_as_text(fx: Fixture) {
    with_data_conn!(fx, |conn| {
        // "9" > "10" as text; 2^53 + 1 and 2^53 are one double in Lua.
        for (older, newer) in [(9u64, 10u64), ((1 << 53) + 1, (1 << 53) + 2), (1, u64::MAX)] {
            let value = RedisValue::new(&conn, data_key("numbers"));
            value.set(&older, "older").await.unwrap();
            value.set(&newer, "newer").await.unwrap();
            let err = value.set(&older, "older again").await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Stale, "{older} after {newer}: {err}");
            let err = value.set(&(newer - 1), "just older").await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Stale, "{} after {newer}", newer - 1);
            assert_eq!(
                value.get::<String>().await.unwrap().as_deref(),
                Some("newer")
            );
            assert_eq!(value.fence().await.unwrap(), Some(newer));
        }
    });
}

async fn bad_tokens_and_foreign_keys_write_nothing(fx: Fixture) {
    let mut raw = fx.raw().await;
    with_data_conn!(fx, |conn| {
        let value = RedisValue::new(&conn, data_key("bad"));
        let err = value.set(&0u64, "x").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        let err = value.set(&5u64, vec!["a", "b"]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert_eq!(value.get::<String>().await.unwrap(), None);
        assert!(!fx.exists(value.key()), "nothing written");

        // A fence field that is not a token: refused, nothing written.
        let corrupt = RedisValue::new(&conn, data_key("corrupt"));
        corrupt.set(&5u64, "kept").await.unwrap();
        raw_hset(&mut raw, corrupt.key(), "fence", "abc").await;
        let err = corrupt.set(&7u64, "new").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
        assert!(err.to_string().contains("abc"), "{err}");
        assert_eq!(
            corrupt.get::<String>().await.unwrap().as_deref(),
            Some("kept")
        );
        assert_eq!(
            corrupt.fence().await.unwrap_err().kind(),
            ErrorKind::InvalidKey
        );

        // A key of another type.
        let string_key = data_key("string");
        raw.set(&string_key, 1).await;
        let err = RedisValue::new(&conn, string_key.as_str())
            .set(&7u64, "x")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
        assert_eq!(raw.get(&string_key).await, Some(1), "untouched");
        let err = RedisValue::new(&conn, string_key.as_str())
            .get::<String>()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    });
}

async fn a_hash_writes_all_fields_or_none(fx: Fixture) {
    let locks = fx.service(LONG_WATCHDOG).await;
    with_data_conn!(fx, |conn| {
        let key = unique_key("order");
        let order = RedisHash::new(&conn, data_key("order"));
        let first = locks.lock(&key).lease(SHORT_LEASE).await.unwrap();
        order
            .set_fields(&first, &[("status", "paid"), ("amount", "30")])
            .await
            .unwrap();
        let second = locks.lock(&key).lease(LEASE).wait(WAIT).await.unwrap();
        order
            .set_fields(&second, &[("status", "shipped"), ("carrier", "post")])
            .await
            .unwrap();

        let err = order
            .set_fields(&first, &[("status", "refunded"), ("amount", "0")])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Stale, "{err}");
        let field = |name: &'static str| {
            let order = order.clone();
            async move { order.get_field::<String>(name).await.unwrap() }
        };
        assert_eq!(field("status").await.as_deref(), Some("shipped"));
        assert_eq!(field("amount").await.as_deref(), Some("30"), "untouched");
        assert_eq!(field("carrier").await.as_deref(), Some("post"));
        assert_eq!(order.fence().await.unwrap(), Some(second.fence()));

        // The same hold again: accepted.
        order.set_fields(&second, &[("amount", 25)]).await.unwrap();
        assert_eq!(field("amount").await.as_deref(), Some("25"));

        // The token's own field, no fields, a zero token: refused before anything is written.
        for err in [
            order
                .set_fields(&second, &[("status", "x"), ("fence", "1")])
                .await
                .unwrap_err(),
            order
                .set_fields::<&str, &str>(&second, &[])
                .await
                .unwrap_err(),
            order
                .set_fields(&0u64, &[("status", "x")])
                .await
                .unwrap_err(),
        ] {
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        }
        assert_eq!(field("status").await.as_deref(), Some("shipped"));
        assert_eq!(order.fence().await.unwrap(), Some(second.fence()));
        second.release().await.unwrap();
    });
}

/// The fault fencing is for. A `fenced-writer` process takes the lock with a 400 ms lease,
/// writes to SQLite, and keeps writing to a `RedisValue`; it is `SIGSTOP`ped, the lease runs
/// out, this test takes the lock and writes both stores with the newer token; then the writer
/// is continued and writes with its old guard: both stores reject it, and keep this test's
/// writes.
async fn a_holder_paused_past_its_lease_cannot_write(fx: Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let config = fx.config_file(dir.path(), LONG_WATCHDOG, "");
    let db_path = dir.path().join("shop.db");
    let db = rusqlite::Connection::open(&db_path).unwrap();
    db.execute_batch(
        "CREATE TABLE goods (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, \
         fence INTEGER NOT NULL); INSERT INTO goods VALUES (7, 10, 0);",
    )
    .unwrap();
    let (key, value_key) = (unique_key("goods"), data_key("stock"));
    let mut writer = Worker::spawn_program(
        env!("CARGO_BIN_EXE_fenced-writer"),
        &[
            config.to_str().unwrap(),
            &key,
            &value_key,
            "400",
            db_path.to_str().unwrap(),
            "7",
        ],
    );
    let held = writer.line(Duration::from_secs(30)).await;
    let old_fence: u64 = held
        .strip_prefix("held ")
        .and_then(|rest| rest.strip_suffix(" sql=1"))
        .and_then(|fence| fence.parse().ok())
        .unwrap_or_else(|| panic!("expected `held <fence> sql=1`, got {held:?}"));
    let first = writer.line(Duration::from_secs(30)).await;
    assert!(
        first.starts_with("write 1 ") && first.ends_with(" redis=ok"),
        "the holder writes while its lock is valid: {first:?}"
    );

    let pid = writer.pid();
    signal(pid, libc::SIGSTOP);
    eventually("the writer is stopped", Duration::from_secs(5), || async {
        is_stopped(pid)
    })
    .await;

    // The lease runs out while the writer sleeps; the lock passes to this test.
    let locks = fx.service(LONG_WATCHDOG).await;
    let newer = locks
        .lock(&key)
        .lease(LEASE)
        .wait(Duration::from_secs(10))
        .await
        .expect("the stopped holder's lease runs out");
    assert!(newer.fence() > old_fence);
    assert!(is_stopped(pid), "the writer stayed stopped");
    with_data_conn!(fx, |conn| {
        RedisValue::new(&conn, value_key.as_str())
            .set(&newer, "new-holder")
            .await
            .unwrap();
    });
    let token = i64::try_from(newer.fence()).unwrap();
    let rows = db
        .execute(
            "UPDATE goods SET stock = ?1, fence = ?2 WHERE id = ?3 AND fence < ?2",
            (5, token, 7),
        )
        .unwrap();
    assert_eq!(rows, 1, "the newer holder's SQL write");

    // Read before the SIGCONT: the writer may run before this task reads the clock again.
    let resumed = monotonic_ns();
    signal(pid, libc::SIGCONT);
    // Writes sent before the stop were accepted (the last may have been on its way); the first
    // write sent after the resume must be rejected.
    loop {
        let line = writer.line(Duration::from_secs(30)).await;
        let parts: Vec<&str> = line.split(' ').collect();
        let ["write", round, sent, outcome] = parts[..] else {
            panic!("unexpected line from the writer: {line:?}");
        };
        let sent: u64 = sent.parse().unwrap();
        match outcome {
            "redis=stale" => break,
            "redis=ok" if sent < resumed => {}
            _ => panic!(
                "write {round} of the resumed holder, sent after the resume with its old token \
                 {old_fence}, was accepted over the newer holder's token {}: {line:?}",
                newer.fence()
            ),
        }
    }
    assert_eq!(
        writer.line(Duration::from_secs(30)).await,
        "sql=0",
        "SQLite rejects the old token"
    );
    assert_eq!(writer.line(Duration::from_secs(30)).await, "done");
    assert!(writer.success(Duration::from_secs(10)).await);

    with_data_conn!(fx, |conn| {
        let value = RedisValue::new(&conn, value_key.as_str());
        assert_eq!(
            value.get::<String>().await.unwrap().as_deref(),
            Some("new-holder")
        );
        assert_eq!(value.fence().await.unwrap(), Some(newer.fence()));
    });
    let row: (i64, i64) = db
        .query_row("SELECT stock, fence FROM goods WHERE id = 7", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(row, (5, token), "the newer holder's row");
    newer.release().await.unwrap();
}

/// A writer's lease runs out while it still has its guard; a reader of another service gets the
/// read lock and tries to write from its body. A read share does not write: its `Held` is
/// refused, `current_fence()` is `None` in its body, and its own token is newer than the stale
/// writer's (never equal), so when a raw copy of it is written anyway, the stale writer's late
/// write is refused. Of the reader's writes and the stale writer's, never both get through.
async fn a_read_hold_never_writes_beside_a_stale_writer(fx: Fixture) {
    let (writers, readers) = (
        fx.service(LONG_WATCHDOG).await,
        fx.service(LONG_WATCHDOG).await,
    );
    let key = unique_key("fenced-read");
    with_data_conn!(fx, |conn| {
        let value = RedisValue::new(&conn, data_key("read"));
        let stale = writers.write(&key).lease(SHORT_LEASE).await.unwrap();
        // the reader gets in once the writer's lease ran out (its guard is still there)
        let (from_body, fence_in_body, read_token) = readers
            .read(&key)
            .wait(WAIT)
            .run_nested(|held| {
                let value = value.clone();
                async move {
                    let written = value.set(&held, "from a read body").await;
                    (written, lock_runtime::current_fence(), held.fence())
                }
            })
            .await
            .unwrap();
        let late = value.set(&stale, "stale writer").await;
        assert!(
            !(from_body.is_ok() && late.is_ok()),
            "both the read body's and the stale writer's writes were accepted"
        );
        let err = from_body.expect_err("a read body's fenced write is refused");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert_eq!(fence_in_body, None, "current_fence() in a read body");
        assert!(
            read_token > stale.fence(),
            "a read share's token {read_token} is not newer than the stale writer's {}",
            stale.fence()
        );
        // a raw copy of the reader's token, written anyway, makes the stale write stale
        let raw = readers.read(&key).wait(WAIT).await.unwrap();
        assert_ne!(raw.fence(), stale.fence());
        value.set(&raw.fence(), "reader's raw token").await.unwrap();
        let again = value.set(&stale, "stale writer again").await;
        assert_eq!(again.unwrap_err().kind(), ErrorKind::Stale);
        raw.release().await.unwrap();
    });
}

async fn raw_hset(raw: &mut Raw, key: &str, field: &str, value: &str) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(key).arg(field).arg(value);
    let _: i64 = match raw {
        Raw::Single(c) => cmd.query_async(c).await.unwrap(),
        Raw::Cluster(c) => cmd.query_async(c).await.unwrap(),
    };
}

fn signal(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: signals a child process of this test by its pid.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

/// `true` while process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn is_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
}

macro_rules! fenced_tests {
    ($($test:ident),* $(,)?) => {
        fenced_tests!(@kind single, Kind::Single, $($test),*);
        fenced_tests!(@kind cluster, Kind::Cluster, $($test),*);
    };
    (@kind $module:ident, $kind:expr, $($test:ident),*) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(Fixture::shared($kind).await).await;
                }
            )*
        }
    };
}

fenced_tests!(
    newer_tokens_are_accepted_older_ones_are_stale,
    tokens_compare_as_numbers_not_as_text,
    bad_tokens_and_foreign_keys_write_nothing,
    a_hash_writes_all_fields_or_none,
    a_holder_paused_past_its_lease_cannot_write,
    a_read_hold_never_writes_beside_a_stale_writer,
);

/// Fencing counters: one per cluster slot (`<prefix>fence:{<n>}`; on one server one for every
/// lock, slot 0's), never expiring, so tokens keep increasing when the server's clock steps
/// back, and nothing is left per lock key.
mod counters {
    use std::collections::HashSet;
    use std::time::Duration;

    use lock_runtime::{LockConfig, LockService};
    use lock_tests::harness::{FakeClock, Spec, Topology};
    use redis::AsyncCommands;

    async fn service(topology: &Topology) -> LockService {
        LockService::connect(LockConfig::single(topology.url()))
            .await
            .expect("connect")
    }

    async fn raw(topology: &Topology) -> redis::aio::MultiplexedConnection {
        redis::Client::open(topology.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    }

    /// Deletes whatever expired, as a later access would: `SCAN` visits every key and deletes
    /// the expired ones it meets (`KEYS` only skips them).
    async fn expire_what_ran_out(conn: &mut redis::aio::MultiplexedConnection) {
        let mut cursor = 0_u64;
        loop {
            let (next, _): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await
                .expect("SCAN");
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }

    async fn token(locks: &LockService, key: &str) -> u64 {
        let guard = locks
            .lock(key)
            .lease(Duration::from_secs(5))
            .await
            .expect("lock");
        let token = guard.fence();
        guard.release().await.expect("release");
        token
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokens_keep_increasing_when_the_server_clock_steps_back() {
        let clock = FakeClock::install();
        let topology = Topology::start(Spec::Single).await;
        let locks = service(&topology).await;
        let mut conn = raw(&topology).await;
        let mut last = token(&locks, "fence:clock").await;
        let mut rw_last = locks.write("fence:clock").await.expect("write").fence();
        // hours pass without a grant (far past any idle expiry a counter could have) ...
        clock.set_offset(6 * 3600);
        expire_what_ran_out(&mut conn).await;
        // ... then the clock steps back (an NTP step, a restored snapshot, a failover to a
        // node whose clock lags): every token issued since is the clock's, an hour behind
        for back in [-3600, -7200] {
            clock.set_offset(back);
            let next = token(&locks, "fence:clock").await;
            assert!(
                next > last,
                "a token went backwards after the clock stepped back {back} s: {next} <= {last}"
            );
            last = next;
            let write = locks.write("fence:clock").await.expect("write");
            assert!(write.fence() > rw_last, "{} <= {rw_last}", write.fence());
            rw_last = write.fence();
            write.release().await.expect("release");
        }
        drop(clock);
    }

    /// A call that grants several locks writes the counter once, after its operations ran:
    /// the last token it drew is what the next call goes on from, also when the clock then
    /// steps back below every token of the call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokens_of_one_call_stay_below_the_next_when_the_clock_steps_back() {
        let clock = FakeClock::install();
        let topology = Topology::start(Spec::Single).await;
        let locks = service(&topology).await;
        let keys: Vec<String> = (0..8).map(|i| format!("fence:one-call:{i}")).collect();
        for round in 0..2 {
            let all = locks.lock_all(keys.clone()).await.expect("lock_all");
            let highest = all
                .guards()
                .iter()
                .map(|g| g.fence())
                .max()
                .expect("eight tokens");
            all.release().await.expect("release");
            clock.set_offset(-3600 * (round + 1));
            let next = token(&locks, &keys[0]).await;
            assert!(
                next > highest,
                "round {round}: a token went backwards after a call of eight grants: {next} <= \
                 {highest}"
            );
        }
        drop(clock);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokens_keep_increasing_when_the_counter_is_deleted() {
        let topology = Topology::start(Spec::Single).await;
        let locks = service(&topology).await;
        let mut conn = raw(&topology).await;
        let first = token(&locks, "fence:deleted").await;
        let counters: Vec<String> = conn.keys("lock:fence:*").await.expect("KEYS");
        assert_eq!(counters.len(), 1, "the server's one counter: {counters:?}");
        let _: () = conn.del(&counters).await.expect("DEL");
        // the server clock is the backstop
        let second = token(&locks, "fence:deleted").await;
        assert!(second > first, "{second} <= {first}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_key_is_left_per_lock_key_only_counters_per_slot() {
        let topology = Topology::start(Spec::Single).await;
        let locks = service(&topology).await;
        let mut conn = raw(&topology).await;
        let keys: Vec<String> = (0..300).map(|i| format!("fence:left:{i}")).collect();
        for key in &keys {
            token(&locks, key).await;
            locks
                .write(key.clone())
                .await
                .expect("write")
                .release()
                .await
                .expect("release");
            let permit = locks
                .semaphore(key.clone(), 2)
                .acquire()
                .await
                .expect("permit");
            permit.release().await.expect("release");
        }
        let left: Vec<String> = conn.keys("*").await.expect("KEYS");
        let mut slots = HashSet::new();
        for key in left.iter().filter(|k| !k.starts_with("harness:")) {
            assert!(
                key.starts_with("lock:fence:{"),
                "a key was left behind by a lock: {key} (of {} left)",
                left.len()
            );
            let ttl: i64 = conn.pttl(key).await.expect("PTTL");
            assert_eq!(ttl, -1, "{key}: a counter never expires");
            assert!(slots.insert(key.clone()));
        }
        // one server: the one counter of all 900 locks (300 keys in 3 namespaces)
        assert_eq!(slots.len(), 1, "{left:?}");
    }
}
