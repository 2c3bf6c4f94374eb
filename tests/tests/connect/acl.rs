//! The narrowest ACL the locks need: the `ACL SETUSER` line of README.md ("TLS and ACL"),
//! applied as it is written, runs the whole lock family - mutex, read/write, semaphore,
//! `lock_all`, watchdog renewal, wake-ups, `force_unlock`, `inspect`, replica
//! acknowledgements - on a single server, a master with replicas and a cluster, with no
//! command or key refused (`ACL LOG` stays empty). A user missing one of its commands, or with
//! another key pattern, gets `ErrorKind::Auth` naming the user.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::Fixture;
use lock_runtime::{ErrorKind, LockConfig, LockError, LockKind, LockService};
use lock_tests::harness::{Spec, unique_key};

const README: &str = include_str!("../../../README.md");
const USER: &str = "lock-service";
const PASSWORD: &str = "acl-test-pw";

/// The arguments of README's `ACL SETUSER lock-service reset on >... <rules>` line after
/// `ACL SETUSER`, with this test's password.
fn readme_acl() -> Vec<String> {
    let line = README
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(&format!("ACL SETUSER {USER} ")))
        .expect("README.md has an `ACL SETUSER lock-service ...` line");
    let args: Vec<String> = line
        .split_whitespace()
        .skip(2)
        .map(|arg| match arg.starts_with('>') {
            true => format!(">{PASSWORD}"),
            false => arg.to_owned(),
        })
        .collect();
    assert!(args.iter().any(|a| a == "-@all"), "{line}");
    assert!(args.iter().any(|a| a == &format!(">{PASSWORD}")), "{line}");
    args
}

/// `ACL SETUSER <args>` on every data node of the fixture (ACLs are per node), and an empty
/// `ACL LOG`.
fn set_user(fx: &Fixture, args: &[String]) {
    for port in fx.topo().node_ports() {
        let mut con = fx.topo().conn(port);
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(args);
        let () = cmd
            .query(&mut con)
            .unwrap_or_else(|e| panic!("ACL SETUSER {args:?} on {port}: {e}"));
        let () = redis::cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .query(&mut con)
            .unwrap();
    }
}

/// `ACL LOG` entries of every data node: what was refused (`port: reason object user`).
fn acl_log(fx: &Fixture) -> Vec<String> {
    let mut refused = Vec::new();
    for port in fx.topo().node_ports() {
        // all of them: without a count, `ACL LOG` gives the last 10, and the users of this
        // suite's runs refuse more than that on one server
        let entries: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
            .arg("LOG")
            .arg(1000)
            .query(&mut fx.topo().conn(port))
            .unwrap();
        for entry in entries {
            let field = |name: &str| match entry.get(name) {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            };
            refused.push(format!(
                "{port}: {} {} {}",
                field("reason"),
                field("object"),
                field("username")
            ));
        }
    }
    refused
}

fn config(fx: &Fixture, user: &str) -> LockConfig {
    let config = fx
        .config(Duration::from_millis(900))
        .with_credentials(Some(user.to_owned()), Some(PASSWORD.to_owned()))
        .with_connect_timeout(Duration::from_secs(3));
    if fx.topo().spec() == Spec::Single {
        config
    } else {
        config.with_sync_replicas(1, Duration::from_millis(500))
    }
}

/// What went wrong in [`lock_family`]: a lock call failed, or something did not happen.
#[derive(Debug)]
enum Trouble {
    Lock(LockError),
    Wrong(String),
}

impl std::fmt::Display for Trouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trouble::Lock(e) => write!(f, "{e:?}"),
            Trouble::Wrong(what) => f.write_str(what),
        }
    }
}

impl From<LockError> for Trouble {
    fn from(e: LockError) -> Self {
        Trouble::Lock(e)
    }
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Trouble> {
    if ok {
        Ok(())
    } else {
        Err(Trouble::Wrong(what()))
    }
}

/// Every kind of lock and every service call, with a waiter woken by a release, a hold renewed
/// by the watchdog, a lease running out and a force-unlock.
async fn lock_family(a: &LockService, b: &LockService) -> Result<(), Trouble> {
    // a waiter in another service, woken by the release
    let key = unique_key("acl");
    let held = a.lock(&key).await?;
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let guard = b.lock(&key).wait(Duration::from_secs(5)).await?;
            let waited = started.elapsed();
            guard.release().await?;
            Ok::<_, LockError>(waited)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.inspect(&key).await?.local_waiters == 0 {
        if waiter.is_finished() {
            let outcome = waiter.await.expect("waiter task");
            return Err(outcome.map_or_else(Trouble::Lock, |waited| {
                Trouble::Wrong(format!("the waiter got a held lock after {waited:?}"))
            }));
        }
        check(Instant::now() < deadline, || {
            "the waiter did not line up".into()
        })?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // held past renewals of the 900 ms watchdog (renewed every 300 ms; a loaded machine may
    // delay one), with the other service registered
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let info = a.inspect(&key).await?;
    check(info.holder.is_some(), || format!("not renewed: {info:?}"))?;
    check(info.waiting_services == 1, || {
        format!("no waiting service: {info:?}")
    })?;
    held.release().await?;
    let waited = waiter.await.expect("waiter task")?;
    check(waited < Duration::from_secs(4), || {
        format!("woken late: {waited:?}")
    })?;

    // a lease that runs out
    let short = unique_key("acl");
    let _gone = a.lock(&short).lease(Duration::from_millis(100)).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.try_lock(&short).await?.release().await?;

    // read / write
    let rw = unique_key("acl-rw");
    let r1 = a.read(&rw).await?;
    let r2 = b.read(&rw).await?;
    let write = b.write(&rw).try_once().await.map(|_| ());
    check(
        write
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::Timeout),
        || format!("a write next to reads: {write:?}"),
    )?;
    // the listing (lockctl) sees the read holds: SCAN
    let listed = a.list(Some(&rw)).await?;
    check(listed.len() == 1, || format!("list of {rw}: {listed:?}"))?;
    r1.release().await?;
    r2.release().await?;
    b.write(&rw).await?.release().await?;

    // semaphore: A holds both permits while a caller of A and one of B wait; A's releases may
    // hand a permit to its own waiter only within its share while B waits (ZCOUNT, ZSCORE)
    let name = unique_key("acl-sem");
    let sem = a.semaphore(&name, 2);
    let p1 = sem.acquire().await?;
    let p2 = sem.acquire().await?;
    let available = sem.available().await?;
    check(available == 0, || {
        format!("{available} permits left of 2 taken")
    })?;
    let waiting = [sem.clone(), b.semaphore(&name, 2)].map(|sem| {
        tokio::spawn(async move {
            sem.acquire()
                .wait(Duration::from_secs(5))
                .await?
                .release()
                .await
        })
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // both services registered on Redis, and both callers parked: A counts its own now
        // (a caller whose attempt is on its way is not counted, and A's release would pass it
        // over), B's as it reported it (every second)
        let info = a.inspect_kind(LockKind::Semaphore, &name).await?;
        let parked: u32 = info.waiters.iter().filter_map(|w| w.waiting).sum();
        if info.waiting_services == 2 && parked == 2 {
            break;
        }
        check(Instant::now() < deadline, || {
            format!("the semaphore's waiters did not register: {info:?}")
        })?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    p1.release().await?;
    p2.release().await?;
    for waiter in waiting {
        waiter.await.expect("semaphore waiter task")?;
    }

    // lock_all
    let keys = [unique_key("acl-all"), unique_key("acl-all")];
    a.lock_all(keys.clone()).await?.release().await?;

    // force_unlock and is_locked
    let forced = unique_key("acl");
    let _held = a.lock(&forced).await?;
    check(b.force_unlock(&forced).await?, || {
        "force_unlock removed nothing".into()
    })?;
    check(!b.is_locked(&forced).await?, || {
        "still locked after force_unlock".into()
    })?;
    // the journal of force-unlocks (a stream: XADD, XREVRANGE)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let journal = a.journal(20).await?;
        if journal.iter().any(|e| e.key == forced) {
            break;
        }
        check(Instant::now() < deadline, || {
            format!("the force-unlock of {forced} never reached the journal: {journal:?}")
        })?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn readme_acl_runs_the_lock_family(spec: Spec) {
    let fx = Fixture::own(spec).await;
    set_user(&fx, &readme_acl());
    let a = LockService::connect(config(&fx, USER)).await.unwrap();
    let b = LockService::connect(config(&fx, USER)).await.unwrap();
    if let Err(trouble) = lock_family(&a, &b).await {
        panic!("{trouble}; refused: {:?}", acl_log(&fx));
    }
    assert_eq!(
        acl_log(&fx),
        Vec::<String>::new(),
        "refused under the README's ACL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_runs_the_lock_family_on_a_single_server() {
    readme_acl_runs_the_lock_family(Spec::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_runs_the_lock_family_on_a_master_with_replicas() {
    readme_acl_runs_the_lock_family(Spec::master_replicas()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_runs_the_lock_family_on_a_cluster() {
    readme_acl_runs_the_lock_family(Spec::cluster()).await;
}

/// The topology where the library sends `command`: the cluster client's, replica
/// acknowledgements and the master check, or everything else (a single server).
fn needs(command: &str) -> Spec {
    match command {
        "spublish" | "ssubscribe" | "sunsubscribe" | "cluster|slots" | "ping" => Spec::cluster(),
        "wait" | "role" => Spec::master_replicas(),
        _ => Spec::Single,
    }
}

/// How the lock family fared for one user: its trouble, and what `ACL LOG` says it was refused.
struct Outcome {
    trouble: Option<Trouble>,
    refused: Vec<String>,
}

async fn run_as(fx: &Fixture, user: &str) -> Outcome {
    let run = async {
        let a = LockService::connect(config(fx, user)).await?;
        let b = LockService::connect(config(fx, user)).await?;
        lock_family(&a, &b).await?;
        // the services unsubscribe from channels nobody waits on at their next sweep (every
        // 300 ms here): keep them for that long, or until something was refused
        let deadline = Instant::now() + Duration::from_millis(1_500);
        while acl_log(fx)
            .iter()
            .all(|e| !e.ends_with(&format!(" {user}")))
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    };
    let trouble = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .unwrap_or_else(|_| panic!("{user}: the lock family did not finish within 20 s"))
        .err();
    let refused = acl_log(fx)
        .into_iter()
        .filter(|entry| entry.ends_with(&format!(" {user}")))
        .collect();
    Outcome { trouble, refused }
}

/// Every command of the README's line is needed: a user without it fails with `Auth` naming the
/// user, or is refused the command (`ACL LOG`; a refused unsubscribe is only logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_of_the_readme_acl_is_needed() {
    let args = readme_acl();
    let commands: Vec<String> = args
        .iter()
        .filter_map(|a| a.strip_prefix('+'))
        .map(str::to_owned)
        .collect();
    let (single, replicas, cluster) = tokio::join!(
        Fixture::own(Spec::Single),
        Fixture::own(Spec::master_replicas()),
        Fixture::own(Spec::cluster())
    );
    let (single, replicas, cluster) = (Arc::new(single), Arc::new(replicas), Arc::new(cluster));
    let fixture = |spec: Spec| match spec {
        Spec::Single => Arc::clone(&single),
        Spec::MasterReplicas { .. } => Arc::clone(&replicas),
        _ => Arc::clone(&cluster),
    };
    let user_without = |command: &str| format!("{USER}-no-{}", command.replace('|', "-"));
    for command in &commands {
        let mut without: Vec<String> = args
            .iter()
            .filter(|a| a.strip_prefix('+') != Some(command.as_str()))
            .cloned()
            .collect();
        without[0] = user_without(command);
        set_user(&fixture(needs(command)), &without);
    }
    // scripts and libraries load once per server: the users without `script|load` and without
    // `function|load` go first, one at a time
    let loads = ["script|load", "function|load"];
    let mut outcomes = Vec::new();
    // (the one without `function|load` loads the scripts it falls back to: it goes second)
    for load in loads.iter().filter(|l| commands.iter().any(|c| c == *l)) {
        let outcome = run_as(&fixture(needs(load)), &user_without(load)).await;
        outcomes.push(((*load).to_owned(), outcome));
    }
    let mut runs = tokio::task::JoinSet::new();
    for command in commands.iter().filter(|c| !loads.contains(&c.as_str())) {
        let (fx, user) = (fixture(needs(command)), user_without(command));
        let command = command.clone();
        runs.spawn(async move { (command, run_as(&fx, &user).await) });
    }
    outcomes.extend(runs.join_all().await);
    let mut unneeded = Vec::new();
    for (command, outcome) in &outcomes {
        let user = user_without(command);
        match &outcome.trouble {
            Some(Trouble::Lock(e)) if e.kind() == ErrorKind::Auth => {
                assert!(e.to_string().contains(&format!("user `{user}`")), "{e}");
            }
            Some(trouble) if !outcome.refused.is_empty() => {
                // refused, and the library noticed something else first (e.g. a timeout)
                let _ = trouble;
            }
            Some(trouble) => panic!("without `{command}`: {trouble}, nothing refused"),
            None if !outcome.refused.is_empty() => {}
            None => unneeded.push(command.clone()),
        }
    }
    assert!(
        unneeded.is_empty(),
        "not needed by the lock family: {unneeded:?}"
    );
}

/// A user who may not call or load Functions gets the whole lock family through `EVALSHA`:
/// nothing fails, and the Function command is all that is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_functions_gets_the_lock_family_as_scripts() {
    let (single, cluster) = tokio::join!(Fixture::own(Spec::Single), Fixture::own(Spec::cluster()));
    for (fx, refused_command) in [(&single, "fcall"), (&cluster, "function|load")] {
        let mut args: Vec<String> = readme_acl()
            .into_iter()
            .filter(|a| a != &format!("+{refused_command}"))
            .collect();
        let user = format!("{USER}-scripts");
        args[0].clone_from(&user);
        set_user(fx, &args);
        let outcome = run_as(fx, &user).await;
        if let Some(trouble) = outcome.trouble {
            panic!("without `{refused_command}`: {trouble}");
        }
        let refused = &outcome.refused;
        assert!(
            !refused.is_empty(),
            "`{refused_command}` was never asked for"
        );
        assert!(
            refused
                .iter()
                .all(|e| e.contains(&format!(" {refused_command} "))),
            "without `{refused_command}`, refused {refused:?}"
        );
    }
}

/// The key pattern matters: the same commands on other keys are an `Auth` error naming the user.
#[tokio::test]
async fn a_user_for_other_keys_is_an_auth_error() {
    let fx = Fixture::own(Spec::Single).await;
    let user = format!("{USER}-other-keys");
    let mut args: Vec<String> = readme_acl()
        .into_iter()
        .map(|a| {
            if a == "~lock:*" {
                "~app:*".to_owned()
            } else {
                a
            }
        })
        .collect();
    args[0] = user.clone();
    set_user(&fx, &args);
    let locks = LockService::connect(config(&fx, &user)).await.unwrap();
    let err = locks.lock(unique_key("acl")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains(&format!("user `{user}`")), "{err}");
    assert!(!err.to_string().contains(PASSWORD), "{err}");
}
