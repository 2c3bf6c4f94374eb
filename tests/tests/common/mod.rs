//! Helpers shared by the lock test suites.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lock_runtime::{LockConfig, LockService};
use lock_tests::harness::{Kind, Topology, shared};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A running topology and how to build lock services on it.
pub struct Fixture {
    pub topo: &'static Topology,
}

impl Fixture {
    pub async fn single() -> Fixture {
        Fixture {
            topo: shared(Kind::Single).await,
        }
    }

    /// A configuration for this topology with a short watchdog, so renewal shows in tests.
    pub fn config(&self, watchdog: Duration) -> LockConfig {
        LockConfig::single(self.topo.url()).with_watchdog_timeout(watchdog)
    }

    /// A new service (its own connections, watchdog, subscriber and waiter lines), like
    /// another instance of an application.
    pub async fn service(&self, watchdog: Duration) -> LockService {
        LockService::connect(self.config(watchdog))
            .await
            .expect("connect")
    }

    pub fn redis(&self) -> redis::Connection {
        self.topo.conn(self.topo.master_port())
    }
}

/// Polls `check` every 10 ms until it returns true; panics with `what` after `within`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `service` has `n` callers in line for `key`.
pub async fn waiters_in_line(service: &LockService, key: &str, n: usize) {
    eventually(
        &format!("{n} waiters in line for {key}"),
        Duration::from_secs(5),
        || async { service.inspect(key).await.unwrap().local_waiters == n },
    )
    .await;
}

/// A `lock-worker` process (see src/bin/lock-worker.rs).
pub struct Worker {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Worker {
    pub fn spawn(args: &[&str]) -> Worker {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn lock-worker");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Worker { child, lines }
    }

    /// The next line the worker prints, within `within`.
    pub async fn line(&mut self, within: Duration) -> String {
        tokio::time::timeout(within, self.lines.next_line())
            .await
            .expect("worker printed nothing in time")
            .expect("read worker output")
            .expect("worker exited")
    }

    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill worker");
    }

    pub async fn success(mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.child.wait())
            .await
            .expect("worker did not finish in time")
            .expect("wait worker")
            .success()
    }
}
