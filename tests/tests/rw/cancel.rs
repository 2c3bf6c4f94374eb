//! Cancellation, on a single node: a read or write whose future is dropped gives everything
//! back - its place among the waiting services, and a grant that reached Redis after the
//! caller left.

use std::future::IntoFuture;
use std::time::Duration;

use crate::common::{Fixture, eventually};
use crate::support::{LONG, WAIT, ends_up_free, rw_key, waiting_key, writers_key, zcard};
use lock_runtime::{ErrorKind, LockConfig, LockService};
use lock_tests::harness::{Proxy, Topology, unique_key};

/// Cancelling a read or write that waits gives everything back: its place among the waiting
/// services, and a grant that reached Redis after the caller left. Two ways: the future is
/// dropped while it waits behind a writer (and a writer gives up on its wait), and the future is
/// dropped while Redis's grant is on its way back through a slow proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_read_or_write_gives_everything_back() {
    let fx = Fixture::single().await;
    let (h, b, c, d) = (
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    );

    // dropped while waiting
    let key = unique_key("cancel");
    let held = h.write(&key).await.unwrap();
    let reader = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.read(&key).await })
    };
    let writer = {
        let (c, key) = (c.clone(), key.clone());
        tokio::spawn(async move { c.write(&key).await })
    };
    eventually(
        "a reader and a writer wait",
        Duration::from_secs(5),
        || async { zcard(&fx, &waiting_key(&key)) == 2 && zcard(&fx, &writers_key(&key)) == 1 },
    )
    .await;
    // a reader of the writer's service waits behind it: polled once, it is in line
    let mut same_service_reader = Box::pin(c.read(&key).wait(WAIT).into_future());
    tokio::select! {
        biased;
        _ = &mut same_service_reader => panic!("a reader got in beside a writer"),
        () = std::future::ready(()) => {}
    }
    reader.abort();
    writer.abort();
    assert!(reader.await.unwrap_err().is_cancelled());
    assert!(writer.await.unwrap_err().is_cancelled());
    // and a writer that gives up on its wait
    let e = d
        .write(&key)
        .wait(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    eventually(
        "only the reader's service is still registered as waiting, no writer",
        Duration::from_secs(2),
        || async { zcard(&fx, &waiting_key(&key)) == 1 && zcard(&fx, &writers_key(&key)) == 0 },
    )
    .await;
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), same_service_reader)
        .await
        .expect("the reader behind the cancelled writer gets in at once")
        .unwrap()
        .release()
        .await
        .unwrap();
    ends_up_free(&fx, &d, &key, Duration::from_secs(1)).await;

    // dropped while the grant is on its way back
    let proxy = Proxy::start(Topology::addr_of(fx.topo().master_port())).await;
    let slow = LockService::connect(LockConfig::single(proxy.url()).with_watchdog_timeout(LONG))
        .await
        .unwrap();
    proxy.set_latency(Duration::from_millis(500));
    for write in [false, true] {
        let key = unique_key("cancel-late");
        let attempt = async {
            if write {
                slow.write(&key).await.map(drop)
            } else {
                slow.read(&key).await.map(drop)
            }
        };
        tokio::select! {
            _ = attempt => panic!("the reply came before the grant was seen on Redis"),
            () = eventually("granted on Redis", Duration::from_secs(5), || async {
                fx.exists(&rw_key(&key))
            }) => {}
        }
        ends_up_free(&fx, &d, &key, Duration::from_secs(5)).await;
    }
}
