//! Every call is bounded, also by a server that stalls rather than dies: `response_timeout` ends
//! a call the server does not answer, `connect_timeout` a connect whose handshake is never
//! answered. The servers are stopped with SIGSTOP: the kernel still completes TCP connects to
//! them (a killed server refuses them at once, which the other suites cover), but nothing
//! answers. Each stall is short (one call), so that no sentinel or cluster node fails the
//! stopped server over. Every body runs on each topology, on a topology of its own.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use crate::common::{Fixture, eventually, lock_key};
use lock_runtime::{ErrorKind, LockError, LockService};
use lock_tests::harness::{Kind, unique_key};

const RESPONSE_TIMEOUT: Duration = Duration::from_millis(400);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(400);
/// What "within about the timeout" allows on top of it: scheduling on a loaded machine.
const SLACK: Duration = Duration::from_millis(600);

/// Runs `call` while the processes on `ports` are stopped, and checks that it fails with
/// `Backend` after about `timeout`: not before it (the stall, not a refused connection, ended
/// it), and not much after.
async fn stalled<T: std::fmt::Debug>(
    fx: &Fixture,
    ports: &[u16],
    what: &str,
    timeout: Duration,
    call: impl IntoFuture<Output = Result<T, LockError>>,
) -> LockError {
    let stopped = fx.stop(ports);
    let started = Instant::now();
    let outcome = tokio::time::timeout(timeout + SLACK, call).await;
    let took = started.elapsed();
    drop(stopped);
    let err = outcome
        .unwrap_or_else(|_| panic!("{what} against a stalled server still runs after {took:?}"))
        .expect_err(what);
    assert_eq!(err.kind(), ErrorKind::Backend, "{what}: {err}");
    assert!(
        took >= timeout.mul_f64(0.9),
        "{what} failed after {took:?}, before the timeout ({timeout:?}): {err}"
    );
    println!("{what}: {took:?}: {err}");
    err
}

/// Lock, release, inspect, is_locked and force_unlock against a stalled server each return
/// `Backend` within about `response_timeout`, and the service works again once the server
/// answers.
async fn a_stalled_server_ends_each_call_at_the_response_timeout(fx: Fixture) {
    let locks = LockService::connect(
        fx.config(Duration::from_secs(30))
            .with_response_timeout(RESPONSE_TIMEOUT),
    )
    .await
    .unwrap();
    let key = unique_key("stalled");
    let node = [fx.node_for(&lock_key(&key))];
    let held = locks.lock(&key).await.unwrap();

    let other = unique_key("stalled");
    let node_of_other = [fx.node_for(&lock_key(&other))];
    stalled(
        &fx,
        &node_of_other,
        "lock",
        RESPONSE_TIMEOUT,
        locks.lock(&other).wait(Duration::from_secs(10)),
    )
    .await;
    stalled(&fx, &node, "inspect", RESPONSE_TIMEOUT, locks.inspect(&key)).await;
    stalled(
        &fx,
        &node,
        "is_locked",
        RESPONSE_TIMEOUT,
        locks.is_locked(&key),
    )
    .await;
    stalled(
        &fx,
        &node,
        "force_unlock",
        RESPONSE_TIMEOUT,
        locks.force_unlock(&key),
    )
    .await;
    stalled(&fx, &node, "release", RESPONSE_TIMEOUT, held.release()).await;

    // the failed release is repeated until Redis answers: the lock is free again, and the
    // acquire that failed left nothing behind
    eventually(
        "the lock is free once the server answers again",
        Duration::from_secs(5),
        || async { locks.inspect(&key).await.is_ok_and(|i| i.holder.is_none()) },
    )
    .await;
    for k in [&key, &other] {
        locks
            .lock(k)
            .wait(Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("{k} after the stalls: {e}"))
            .release()
            .await
            .unwrap();
    }
}

/// A connect to a stalled topology fails with `Backend` within about `connect_timeout`: the
/// server (single), the master (master-slave, sentinel: the sentinels still name it) or every
/// node (cluster) is stopped.
async fn a_stalled_server_ends_a_connect_at_the_connect_timeout(fx: Fixture) {
    let ports = match fx.kind() {
        Kind::Cluster => fx.topo().node_ports(),
        _ => vec![fx.topo().master_port()],
    };
    let config = fx
        .config(Duration::from_secs(30))
        .with_connect_timeout(CONNECT_TIMEOUT);
    let err = stalled(
        &fx,
        &ports,
        "connect",
        CONNECT_TIMEOUT,
        LockService::connect(config.clone()),
    )
    .await;
    assert!(err.to_string().contains("connect"), "{err}");
    // and the same configuration connects once the servers answer
    let locks = LockService::connect(config).await.unwrap();
    let key = unique_key("after-stall");
    locks.lock(&key).await.unwrap().release().await.unwrap();
}

/// "Every operation is bounded by `response_timeout`" (README) also under load: six concurrent
/// acquires against a stalled server each fail within about the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_against_a_stalled_server_end_at_the_response_timeout() {
    let fx = Fixture::own(lock_tests::harness::Spec::Single).await;
    let locks = LockService::connect(
        fx.config(Duration::from_secs(30))
            .with_response_timeout(RESPONSE_TIMEOUT),
    )
    .await
    .unwrap();
    let warm = locks.lock(unique_key("warm-up")).await.unwrap();
    warm.release().await.unwrap();
    let stopped = fx.stop(&[fx.topo().master_port()]);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let locks = locks.clone();
        calls.spawn(async move {
            let started = Instant::now();
            let outcome = locks
                .lock(unique_key("queued"))
                .wait(Duration::from_secs(10))
                .await;
            (started.elapsed(), outcome.map(drop))
        });
    }
    let outcomes = calls.join_all().await;
    drop(stopped);
    for (took, outcome) in &outcomes {
        assert_eq!(outcome.as_ref().unwrap_err().kind(), ErrorKind::Backend);
        assert!(
            *took < RESPONSE_TIMEOUT + RESPONSE_TIMEOUT / 2,
            "an acquire failed after {took:?} (response_timeout {RESPONSE_TIMEOUT:?}): \
             {outcomes:?}"
        );
    }
}

// Each on a topology of its own: they stop servers.
topology_tests!(
    own: [
        a_stalled_server_ends_each_call_at_the_response_timeout,
        a_stalled_server_ends_a_connect_at_the_connect_timeout,
    ],
);
