//! Re-entry by the owner that holds the lock, on a single node: a read inside a write body
//! (downgrade) is granted at once and shares the write's token, a read inside a read body
//! re-enters its share although a writer waits, and a write asked for by an owner that holds a
//! read share (upgrade) is refused at once with `WouldDeadlock`.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use crate::common::{Fixture, eventually};
use crate::support::{
    LONG, ends_up_free, granted, spawn_read, spawn_write, waiting_key, writers_key, zcard,
};
use lock_runtime::{ErrorKind, OwnerId, owner};
use lock_tests::harness::unique_key;

/// Downgrade: a read inside a write body re-enters the call chain's owner and is granted at
/// once, although a writer and a reader of other services wait; when the write is released,
/// the read share stays and keeps the writer out until it is released too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_inside_a_write_body_is_granted_at_once() {
    let fx = Fixture::single().await;
    let (a, b, c) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );
    let key = unique_key("downgrade");
    let (share, other_writer, other_reader) = a
        .write(&key)
        .run_nested(|held| {
            let (a, b, c, fx, key) = (&a, &b, &c, &fx, key.clone());
            async move {
                let other_writer = spawn_write(b, &key);
                let other_reader = spawn_read(c, &key);
                eventually(
                    "a writer and a reader of other services wait",
                    Duration::from_secs(5),
                    || async {
                        zcard(fx, &writers_key(&key)) == 1 && zcard(fx, &waiting_key(&key)) == 2
                    },
                )
                .await;
                let plain =
                    tokio::time::timeout(Duration::from_secs(2), a.read(&key).into_future())
                        .await
                        .expect("a read inside the write body does not wait")
                        .unwrap();
                plain.release().await.unwrap();
                let share = a
                    .read(&key)
                    .try_once()
                    .await
                    .expect("a read inside the write body is granted at once");
                assert_eq!(share.fence(), held.fence(), "it shares the write's token");
                (share, other_writer, other_reader)
            }
        })
        .await
        .unwrap();
    // the write is released, the read share holds on
    let e = c.write(&key).try_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(!other_writer.is_finished() && !other_reader.is_finished());
    share.release().await.unwrap();
    let w = granted("the other writer", other_writer, Duration::from_secs(5)).await;
    assert!(!other_reader.is_finished());
    w.release().await.unwrap();
    granted("the other reader", other_reader, Duration::from_secs(5))
        .await
        .release()
        .await
        .unwrap();
    ends_up_free(&fx, &a, &key, Duration::from_secs(5)).await;
}

/// A read inside a read body re-enters the share at once, although a writer waits (which keeps
/// every new reader out - also another owner of the same service): writer preference never
/// makes a reader wait for a writer that waits for that reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_re_enters_its_share_while_a_writer_waits() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("re-read");
    let writer = a
        .read(&key)
        .run_nested(|held| {
            let (a, b, fx, key) = (&a, &b, &fx, key.clone());
            async move {
                let writer = spawn_write(b, &key);
                eventually("the writer waits", Duration::from_secs(5), || async {
                    zcard(fx, &writers_key(&key)) == 1
                })
                .await;
                let e = a
                    .read(&key)
                    .owner(OwnerId::new())
                    .try_once()
                    .await
                    .unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Timeout, "a new reader got in: {e}");
                let inner = a
                    .read(&key)
                    .try_once()
                    .await
                    .expect("the body's own share is re-entered at once");
                assert_eq!(inner.fence(), held.fence());
                inner.release().await.unwrap();
                assert!(!writer.is_finished());
                (writer, held.fence())
            }
        })
        .await
        .unwrap();
    let (writer, read_fence) = writer;
    let w = granted("the writer", writer, Duration::from_secs(2)).await;
    assert!(w.fence() > read_fence);
    w.release().await.unwrap();
    ends_up_free(&fx, &a, &key, Duration::from_secs(5)).await;
}

/// Upgrade: a write asked for by the owner that holds the lock for reading would wait for its
/// own share forever; it is refused at once with `WouldDeadlock` - inside a read body, inside
/// an owner scope, with an explicit owner. A write of another owner just waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_refused_at_once() {
    let fx = Fixture::single().await;
    let (a, b) = (fx.service(LONG).await, fx.service(LONG).await);
    let key = unique_key("upgrade");
    let refused = |e: lock_runtime::LockError, asked: Instant, how: &str| {
        assert_eq!(e.kind(), ErrorKind::WouldDeadlock, "{how}: {e}");
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{how}: refused after {:?}, not at once",
            asked.elapsed()
        );
    };

    let asked = Instant::now();
    let inner = a
        .read(&key)
        .run_nested(|_| async { a.write(&key).wait(Duration::from_secs(5)).await.map(drop) })
        .await
        .expect("the read body ran");
    refused(inner.unwrap_err(), asked, "in a read body");

    owner::scope(OwnerId::new(), async {
        let r = a.read(&key).await.unwrap();
        let asked = Instant::now();
        let e = a
            .write(&key)
            .wait(Duration::from_secs(5))
            .await
            .unwrap_err();
        refused(e, asked, "in an owner scope");
        // the refusal left the share alone
        let busy = b.write(&key).try_once().await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::Timeout);
        r.release().await.unwrap();
    })
    .await;

    let me = OwnerId::new();
    let r = a.read(&key).owner(me.clone()).await.unwrap();
    let asked = Instant::now();
    let e = a
        .write(&key)
        .owner(me)
        .wait(Duration::from_secs(5))
        .await
        .unwrap_err();
    refused(e, asked, "with an explicit owner");
    // another owner is no upgrade: it waits for the reader like any writer (in another task:
    // next to the read guard it would wait for a guard held by its own code)
    let (a2, k2) = (a.clone(), key.clone());
    let e = tokio::spawn(async move { a2.write(&k2).wait(Duration::from_millis(300)).await })
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    r.release().await.unwrap();
    ends_up_free(&fx, &b, &key, Duration::from_secs(5)).await;
}
