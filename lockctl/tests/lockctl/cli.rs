//! The commands against every topology: `list`, `show`, `unlock` (with `--json`), waiters per
//! service and kept locks, and the exit codes and messages of mistakes.

use std::process::Command;
use std::time::{Duration, Instant};

use lock_runtime::{ErrorKind, LockConfig, LockGuard, LockService, Permit, WriteGuard, owner};
use lock_tests::harness::{Kind, unique_key};
use serde_json::Value;

use crate::{Fixture, LOCKCTL, Run, find, lockctl};

/// Locks of every kind held by this process, each taken for a request.
struct Held {
    base: String,
    mutexes: Vec<(String, LockGuard)>,
    rw: String,
    write: WriteGuard,
    sem: String,
    permit: Permit,
}

async fn hold_every_kind(locks: &LockService, mutexes: usize) -> Held {
    let base = unique_key("ctl");
    let mut held = Vec::new();
    for i in 0..mutexes {
        let key = format!("{base}:goods:{i}");
        // the chain's label is the request id: the owner is `req-42#<n>`; no lease: watched
        let guard = owner::chain("req-42", async { locks.lock(&key).await })
            .await
            .unwrap();
        held.push((key, guard));
    }
    let rw = format!("{base}:catalog");
    let write = owner::chain("req-43", async {
        locks.write(&rw).lease(Duration::from_secs(60)).await
    })
    .await
    .unwrap();
    let sem = format!("{base}:pdf");
    let permit = owner::chain("req-44", async {
        let sem = locks.semaphore(&sem, 4);
        sem.acquire_many(3).lease(Duration::from_secs(60)).await
    })
    .await
    .unwrap();
    Held {
        base,
        mutexes: held,
        rw,
        write,
        sem,
        permit,
    }
}

fn json_list(run: &Run) -> Vec<Value> {
    assert_eq!(run.code, 0, "{run:?}");
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run:?}"))
}

async fn cli_scenario(kind: Kind) {
    let fx = Fixture::new(kind).await;
    // in a cluster, enough keys that every master has some
    let mutexes = if kind == Kind::Cluster { 12 } else { 2 };
    let held = hold_every_kind(&fx.locks, mutexes).await;
    let pattern = format!("{}*", held.base);

    // list: one line per lock, with holder, request id, lease and fence
    let run = fx.lockctl(&["list", &pattern]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("KEY"), "{run:?}");
    assert_eq!(lines.len(), 1 + mutexes + 2, "{run:?}");
    assert!(
        lines[0].contains(" INSTANCE ") && lines[0].contains(" HELD "),
        "{run:?}"
    );
    let instance = fx.locks.config().instance_name();
    for (key, guard) in &held.mutexes {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("{key} not listed: {run:?}"));
        assert!(line.contains(" mutex "), "{line}");
        assert!(line.contains(&format!(" {instance} ")), "{line}");
        assert!(line.contains("req-42#"), "{line}");
        assert!(line.contains(" req-42 "), "{line}");
        assert!(line.contains(&guard.fence().to_string()), "{line}");
    }
    let rw_line = lines.iter().find(|l| l.starts_with(&held.rw)).unwrap();
    assert!(rw_line.contains("write:req-43#"), "{rw_line}");
    let sem_line = lines.iter().find(|l| l.starts_with(&held.sem)).unwrap();
    assert!(sem_line.contains("semaphore 3/4"), "{sem_line}");
    assert!(sem_line.contains("req-44"), "{sem_line}");

    // --json: the same, for machines
    let list = json_list(&fx.lockctl(&["list", &pattern, "--json"]).await);
    assert_eq!(list.len(), mutexes + 2);
    for (key, guard) in &held.mutexes {
        let lock = find(&list, "mutex", key);
        let holder = &lock["holders"][0];
        assert_eq!(holder["request_id"], "req-42", "{lock}");
        assert!(holder["owner"].as_str().unwrap().starts_with("req-42#"));
        assert_eq!(holder["owner"], guard.owner().as_str());
        assert_eq!(lock["fence"], guard.fence());
        assert!(holder["lease_left_ms"].as_u64().unwrap() > 0, "{lock}");
        assert_eq!(holder["instance_name"], instance.as_str(), "{lock}");
        let held_for = holder["held_for_ms"].as_u64().unwrap();
        assert!(held_for < 60_000, "{lock}");
        assert!(holder["granted_at_ms"].as_u64().unwrap() > 0, "{lock}");
    }
    let rw = find(&list, "rw", &held.rw);
    assert_eq!(rw["holders"][0]["mode"], "write");
    assert_eq!(rw["holders"][0]["request_id"], "req-43");
    assert_eq!(rw["fence"], held.write.fence());
    let lease = rw["holders"][0]["lease_left_ms"].as_u64().unwrap();
    assert!((50_000..=60_000).contains(&lease), "{rw}");
    let sem = find(&list, "semaphore", &held.sem);
    assert_eq!(sem["permits"], 4);
    assert_eq!(sem["holders"][0]["permits"], 3);
    assert_eq!(sem["holders"][0]["request_id"], "req-44");

    // show: everything about one lock; the kind is found when only one is held
    let run = fx.lockctl(&["show", &held.rw]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .starts_with(&format!("read-write lock `{}`", held.rw)),
        "{run:?}"
    );
    assert!(run.stdout.contains("write req-43#"), "{run:?}");
    assert!(run.stdout.contains("request req-43"), "{run:?}");
    assert!(run.stdout.contains(", held for "), "{run:?}");
    assert!(
        run.stdout.contains(&format!(", instance {instance}")),
        "{run:?}"
    );
    let run = fx
        .lockctl(&["show", &held.sem, "--kind", "sem", "--json"])
        .await;
    let shown: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(shown["holders"][0]["owner"], held.permit.owner().as_str());
    // a lock nobody holds: 1
    let run = fx
        .lockctl(&["show", &format!("{}:nothing", held.base)])
        .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("no lock"), "{run:?}");
    let run = fx.lockctl(&["show", &held.rw, "--kind", "mutex"]).await;
    assert_eq!(run.code, 1, "{run:?}");

    // unlock: refused without a terminal and without --yes (2), nothing changes
    let (key, guard) = &held.mutexes[0];
    let run = fx.lockctl(&["unlock", key]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--yes"), "{run:?}");
    assert!(fx.locks.is_locked(key).await.unwrap());

    // unlock --yes removes it and says what it removed; the watched holder loses it
    let run = fx.lockctl(&["unlock", key, "--yes"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains(&format!("removed mutex `{key}`")),
        "{run:?}"
    );
    assert!(run.stdout.contains("request req-42"), "{run:?}");
    assert!(!fx.locks.is_locked(key).await.unwrap());
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder learns of the force-unlock at its next renewal");
    assert_eq!(lost.kind(), ErrorKind::Lost, "{lost}");
    // nothing left to remove: 1
    let run = fx.lockctl(&["unlock", key, "--yes"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("nothing removed"), "{run:?}");

    // the other kinds: their holders' releases are NotHeld
    let run = fx
        .lockctl(&["unlock", &held.rw, "--kind", "rw", "--yes"])
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("write req-43#"), "{run:?}");
    let e = held.write.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    let run = fx.lockctl(&["unlock", &held.sem, "--yes"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("(3 permits)"), "{run:?}");
    let e = held.permit.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    assert_eq!(
        fx.locks.semaphore(&held.sem, 4).available().await.unwrap(),
        4
    );

    let list = json_list(&fx.lockctl(&["list", &pattern, "--json"]).await);
    assert_eq!(list.len(), mutexes - 1, "{list:#?}");
    for (_, guard) in held.mutexes.into_iter().skip(1) {
        guard.release().await.unwrap();
    }
    let run = fx.lockctl(&["list", &pattern]).await;
    assert_eq!((run.code, run.stdout.as_str()), (0, "(no locks held)\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_on_a_single_node() {
    cli_scenario(Kind::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_on_a_cluster_scans_every_master() {
    cli_scenario(Kind::Cluster).await;
}

/// Who waits, per service, and a lock released under its minimum hold: done, kept until its
/// time, not held by anybody; on every topology.
async fn waiters_per_service_and_kept_locks(kind: Kind) {
    let fx = Fixture::new(kind).await;
    let base = unique_key("waits");
    let job = format!("{base}:job");
    let guard = fx
        .locks
        .lock(&job)
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    let billing = fx.other_service("billing-2").await;
    let waiter = {
        let (billing, job) = (billing.clone(), job.clone());
        tokio::spawn(async move { billing.lock(&job).wait(Duration::from_secs(30)).await })
    };
    let pattern = format!("{base}*");
    // services report their waiting callers every second
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let run = fx.lockctl(&["list", &pattern]).await;
        assert_eq!(run.code, 0, "{run:?}");
        if run.stdout.contains("billing-2 1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no waiting service listed: {run:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let run = fx.lockctl(&["show", &job]).await;
    assert!(
        run.stdout.contains("billing-2 (billing-2~") && run.stdout.contains("1 caller"),
        "{run:?}"
    );
    // the holder's instance (this process, unnamed: hostname:pid) and its age
    assert!(
        run.stdout.contains(&LockConfig::default_instance_name())
            && run.stdout.contains("held for"),
        "{run:?}"
    );
    let list = json_list(&fx.lockctl(&["list", &pattern, "--json"]).await);
    let waiters = &find(&list, "mutex", &job)["waiters"];
    assert_eq!(waiters[0]["instance_name"], "billing-2", "{waiters}");
    assert_eq!(waiters[0]["waiting"], 1, "{waiters}");
    guard.release().await.unwrap();
    let taken = waiter.await.unwrap().unwrap();
    taken.release().await.unwrap();

    // released under its minimum hold: done, kept
    let kept = format!("{base}:nightly");
    let guard = fx
        .locks
        .lock(&kept)
        .hold_at_least(Duration::from_secs(60))
        .await
        .unwrap();
    guard.release().await.unwrap();
    let run = fx.lockctl(&["list", &pattern]).await;
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("{kept} ")))
        .unwrap_or_else(|| panic!("{kept} not listed: {run:?}"));
    assert!(line.contains("done, kept until "), "{line}");
    let run = fx.lockctl(&["show", &kept]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains("state:          done, kept until "),
        "{run:?}"
    );
    assert!(run.stdout.contains("released by:"), "{run:?}");
    let list = json_list(&fx.lockctl(&["list", &pattern, "--json"]).await);
    let lock = find(&list, "mutex", &kept);
    assert_eq!(lock["holders"], serde_json::json!([]), "{lock}");
    let left = lock["kept"]["left_ms"].as_u64().unwrap();
    assert!((50_000..=60_000).contains(&left), "{lock}");
    // and force-unlocked like a held one
    let run = fx.lockctl(&["unlock", &kept, "--yes"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("done and kept for"), "{run:?}");
    let run = fx.lockctl(&["list", &pattern]).await;
    assert_eq!((run.code, run.stdout.as_str()), (0, "(no locks held)\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_shows_waiters_per_service_and_kept_locks_on_a_single_node() {
    waiters_per_service_and_kept_locks(Kind::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_shows_waiters_per_service_and_kept_locks_on_a_master_with_replicas() {
    waiters_per_service_and_kept_locks(Kind::MasterReplicas).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_shows_waiters_per_service_and_kept_locks_in_sentinel_mode() {
    waiters_per_service_and_kept_locks(Kind::Sentinel).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_shows_waiters_per_service_and_kept_locks_on_a_cluster() {
    waiters_per_service_and_kept_locks(Kind::Cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_and_messages_for_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    // no configuration at all: 2
    let run = lockctl(&["list"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--config"), "{run:?}");
    // a file that is not there, a malformed one: 2, naming the file
    let missing = dir.path().join("missing.toml");
    let run = lockctl(&["--config", missing.to_str().unwrap(), "list"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("missing.toml"), "{run:?}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[redis]\nmode = \"single\"\nurl = 7\n").unwrap();
    let run = lockctl(&["--config", bad.to_str().unwrap(), "list"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("redis.url"), "{run:?}");
    // usage: 2
    let run = lockctl(&["list", "--bogus"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let run = lockctl(&[
        "--config",
        bad.to_str().unwrap(),
        "show",
        "k",
        "--kind",
        "queue",
    ])
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("mutex, rw, semaphore"), "{run:?}");

    // Redis unreachable: 3, and the password in the URL is never printed
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // closed again: nothing listens there
    let down = dir.path().join("down.toml");
    std::fs::write(
        &down,
        format!(
            "[redis]\nmode = \"single\"\nurl = \"redis://ops:s3cret-pw@127.0.0.1:{port}\"\n\
             connect_timeout = \"500ms\"\n"
        ),
    )
    .unwrap();
    let run = lockctl(&["--config", down.to_str().unwrap(), "list"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains(&format!("127.0.0.1:{port}")), "{run:?}");
    assert!(!run.stderr.contains("s3cret-pw"), "{run:?}");
    assert!(!run.stdout.contains("s3cret-pw"), "{run:?}");

    // $LOCK_CONFIG is read when --config is not given
    let output = tokio::task::spawn_blocking(move || {
        Command::new(LOCKCTL)
            .args(["list"])
            .env("LOCK_CONFIG", &down)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(3));
}
