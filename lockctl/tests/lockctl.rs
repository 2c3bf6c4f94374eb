//! The `lockctl` binary against real Redis topologies (single node and cluster) while this test
//! holds locks of every kind, and its web console in headless Chromium through chromedriver.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{ErrorKind, LockConfig, LockGuard, LockService, Permit, WriteGuard, owner};
use lock_tests::harness::{Kind, Spec, Topology, shared, spawn_child, unique_key};
use serde_json::Value;

const LOCKCTL: &str = env!("CARGO_BIN_EXE_lockctl");

/// A topology with a config file for it and a service holding locks on it.
struct Fixture {
    _dir: tempfile::TempDir,
    config: PathBuf,
    locks: LockService,
}

impl Fixture {
    async fn new(kind: Kind) -> Fixture {
        let topo = shared(kind).await;
        let redis = match kind {
            Kind::Single => format!("mode = \"single\"\nurl = {:?}", topo.url()),
            Kind::Cluster => format!("mode = \"cluster\"\nnodes = {:?}", topo.node_urls()),
            Kind::Sentinel => format!(
                "mode = \"sentinel\"\nmaster_name = {:?}\nsentinels = {:?}",
                topo.master_name(),
                topo.sentinel_urls()
            ),
            Kind::MasterReplicas => format!(
                "mode = \"master-slave\"\nmaster = {:?}\nreplicas = {:?}",
                topo.master_url(),
                topo.replica_urls()
            ),
        };
        Fixture::on(&redis, "").await
    }

    /// A fixture on a single node of its own, which the test may stop, whose service is named
    /// `instance_name`.
    async fn private(topo: &Topology, instance_name: &str) -> Fixture {
        let redis = format!("mode = \"single\"\nurl = {:?}", topo.url());
        Fixture::on(&redis, &format!("instance_name = {instance_name:?}\n")).await
    }

    /// A fixture on the `[redis]` section `redis`, with `lock` added to the `[lock]` section.
    async fn on(redis: &str, lock: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("lock.toml");
        // a short watchdog: a watched hold that was force-unlocked learns it within a second
        let text = format!("[redis]\n{redis}\n\n[lock]\nwatchdog_timeout = \"3s\"\n{lock}");
        std::fs::write(&config, text).unwrap();
        let locks = LockService::connect(LockConfig::from_file(&config).unwrap())
            .await
            .unwrap();
        Fixture {
            _dir: dir,
            config,
            locks,
        }
    }

    /// Another service on the same Redis, named `instance_name`.
    async fn other_service(&self, instance_name: &str) -> LockService {
        let config = LockConfig::from_file(&self.config)
            .unwrap()
            .with_instance_name(instance_name);
        LockService::connect(config).await.unwrap()
    }

    /// Runs `lockctl --config <file> args...` with stdin closed.
    async fn lockctl(&self, args: &[&str]) -> Run {
        let mut all = vec!["--config", self.config.to_str().unwrap()];
        all.extend_from_slice(args);
        lockctl(&all).await
    }
}

/// What a run of the binary printed, and its exit code.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

async fn lockctl(args: &[&str]) -> Run {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output: Output = tokio::task::spawn_blocking(move || {
        Command::new(LOCKCTL)
            .args(&args)
            .env_remove("LOCK_CONFIG")
            .stdin(Stdio::null())
            .output()
            .expect("run lockctl")
    })
    .await
    .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Polls `check` every 50 ms until it holds; panics naming `what` after `within`.
async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

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

fn find<'a>(list: &'a [Value], kind: &str, key: &str) -> &'a Value {
    list.iter()
        .find(|l| l["kind"] == kind && l["key"] == key)
        .unwrap_or_else(|| panic!("no {kind} {key} in {list:#?}"))
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

/// Fails when `out` holds a character that drives a terminal (a control character other than
/// the line ends, a bidi control) or a line that starts as the forged row of a key.
fn assert_printable(what: &str, out: &str) {
    for c in out.chars() {
        let raw = (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        assert!(!raw, "{what}: a raw {c:?} in the output: {out:?}");
    }
    assert!(
        !out.lines().any(|l| l.starts_with("FORGED")),
        "{what}: a forged row: {out:?}"
    );
}

/// A pseudo-terminal: (its controlling side, the terminal a process reads from).
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: plain libc calls on a descriptor this function owns; `name` is NUL-terminated
    // by ptsname_r on success
    let (master, path) = unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = std::fs::File::from_raw_fd(fd);
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0, "grantpt");
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0, "unlockpt");
        let mut name = [0 as libc::c_char; 128];
        let named = libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len());
        assert_eq!(named, 0, "ptsname_r");
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_owned();
        (master, path)
    };
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    (master, terminal)
}

/// `lockctl unlock args...` with a terminal as stdin, answering `answer` to its question.
async fn unlock_on_a_terminal(config: &Path, args: &[&str], answer: &str) -> Run {
    use std::io::Write;
    let (mut master, terminal) = pty();
    let mut cmd = Command::new(LOCKCTL);
    cmd.arg("--config")
        .arg(config)
        .arg("unlock")
        .args(args)
        .stdin(Stdio::from(terminal))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = spawn_child(cmd).expect("start lockctl unlock");
    // the terminal keeps the line until lockctl reads it
    master.write_all(answer.as_bytes()).unwrap();
    let output = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()),
    )
    .await
    .expect("lockctl unlock answers within 20 s")
    .unwrap();
    drop(master);
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The first refresh `lockctl watch` prints (stdout piped: no redraw).
async fn first_watch_block(config: &Path, pattern: &str) -> String {
    let mut cmd = Command::new(LOCKCTL);
    cmd.arg("--config")
        .arg(config)
        .args(["watch", pattern, "--interval", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = spawn_child(cmd).expect("start lockctl watch");
    let stdout = child.stdout.take().expect("piped stdout");
    let _watch = Process(child);
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || {
            // a block: the header, `N locks held`, a blank line, the table, a blank line
            let mut reader = BufReader::new(stdout);
            let mut block = Vec::new();
            let mut blanks = 0;
            while blanks < 2 {
                let mut line = Vec::new();
                if reader.read_until(b'\n', &mut line).unwrap() == 0 {
                    break;
                }
                blanks += usize::from(line == b"\n");
                block.extend_from_slice(&line);
            }
            String::from_utf8_lossy(&block).into_owned()
        }),
    )
    .await
    .expect("lockctl watch prints a refresh within 20 s")
    .unwrap()
}

/// Keys (and request ids) come from request input: no text output lets them drive the
/// terminal, forge a row or reorder the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_output_escapes_control_characters() {
    let fx = Fixture::new(Kind::Single).await;
    let locks = &fx.locks;
    let base = unique_key("esc");
    // sets the terminal title, clears the screen, colours what follows
    let title = format!("{base}:goods:\x1b]0;pwned\x07\x1b[2J\x1b[31mred\u{9b}31m");
    let forged = format!("{base}:goods:1\nFORGED-ROW  mutex  admin#1  req-1  1  9.9s  1  0");
    let bidi = format!("{base}:goods:\u{202e}fdp.exe\u{2066}");
    let mut guards = Vec::new();
    for key in [&title, &forged, &bidi] {
        let guard = owner::chain("req-\x1b[32m\u{202e}9\r", async {
            locks.lock(key).lease(Duration::from_secs(60)).await
        })
        .await
        .unwrap();
        guards.push(guard);
    }
    // an instance name comes from another service's configuration
    let other = fx.other_service("ops\u{202e}1").await;
    let named = format!("{base}:named");
    let named_guard = other
        .lock(&named)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    // the same key as a read-write lock too: `unlock` without --kind names the key in its error
    let read = locks
        .read(&title)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    let pattern = format!("{base}*");

    let run = fx.lockctl(&["list", &pattern]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_printable("list", &run.stdout);
    assert_eq!(run.stdout.lines().count(), 1 + 5, "{run:?}");
    for shown in [
        "\\x1b]0;pwned\\x07\\x1b[2J",
        "\\nFORGED-ROW",
        "\\u{202e}fdp.exe",
        "req-\\x1b[32m",
        "ops\\u{202e}1",
    ] {
        assert!(run.stdout.contains(shown), "{shown} not in {run:?}");
    }

    for key in [&title, &forged, &bidi] {
        let run = fx.lockctl(&["show", key, "--kind", "mutex"]).await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_printable("show", &run.stdout);
    }
    let run = fx
        .lockctl(&["show", &format!("{base}:free\x1b[2J\n\u{202e}")])
        .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert_printable("show of a free lock", &run.stdout);

    let run = fx.lockctl(&["show", &named]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("instance ops\\u{202e}1"), "{run:?}");
    assert_printable("show of a named holder", &run.stdout);

    let block = first_watch_block(&fx.config, &pattern).await;
    assert!(block.contains("5 locks held"), "{block:?}");
    assert!(block.contains("ops\\u{202e}1"), "{block:?}");
    assert_printable("watch", &block);
    named_guard.release().await.unwrap();

    // several kinds under one key: the error names the key
    let run = fx.lockctl(&["unlock", &title, "--yes"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_printable("unlock of several kinds", &run.stderr);
    read.release().await.unwrap();

    // the question on a terminal, answered no: nothing removed
    for key in [&title, &forged, &bidi] {
        let run = unlock_on_a_terminal(&fx.config, &[key], "n\n").await;
        assert_eq!(run.code, 1, "{run:?}");
        assert!(run.stdout.contains("Force-unlock the mutex"), "{run:?}");
        assert_printable("the unlock prompt", &run.stdout);
        assert!(locks.is_locked(key).await.unwrap());
    }
    // and what --yes removed
    for key in [&title, &forged, &bidi] {
        let run = fx.lockctl(&["unlock", key, "--yes"]).await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_printable("unlock --yes", &run.stdout);
        let run = fx.lockctl(&["unlock", key, "--yes"]).await;
        assert_eq!(run.code, 1, "{run:?}");
        assert_printable("unlock of a free lock", &run.stdout);
    }
    for guard in guards {
        let e = guard.release().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    }
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

// ---- the web console -------------------------------------------------------------------------

/// A child process killed (and reaped) when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `lockctl serve` on a free loopback port; returns it and its URL (from its first line).
async fn serve(config: &Path, extra: &[&str]) -> (Process, String) {
    serve_on(config, "127.0.0.1:0", extra).await
}

/// `lockctl serve --listen <listen>`; returns it and its URL (from its first line).
async fn serve_on(config: &Path, listen: &str, extra: &[&str]) -> (Process, String) {
    let mut cmd = Command::new(LOCKCTL);
    cmd.arg("--config")
        .arg(config)
        .args(["serve", "--listen", listen, "--interval", "300ms"])
        .args(extra)
        .stdout(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = spawn_child(cmd).expect("start lockctl serve");
    let stdout = child.stdout.take().expect("piped stdout");
    let process = Process(child);
    let line = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).unwrap();
            line
        }),
    )
    .await
    .expect("lockctl serve says where it listens")
    .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned();
    (process, url)
}

/// One HTTP/1.1 request to the console, with `headers` besides Host (default: the console's
/// address) and Content-Type; the status code and the body.
async fn http(
    url: &str,
    method: &str,
    path: &str,
    host: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{extra}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        host.unwrap_or(&addr),
        body.len()
    );
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_api_without_allow_unlock() {
    let fx = Fixture::new(Kind::Single).await;
    let key = unique_key("api");
    let guard = owner::chain("req-7", async {
        fx.locks.lock(&key).lease(Duration::from_secs(30)).await
    })
    .await
    .unwrap();
    let (_serve, url) = serve(&fx.config, &[&format!("{key}*")]).await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let (status, body) = http(&url, "GET", "/api/state", None, &[], "").await;
    assert_eq!(status, 200, "{body}");
    let state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["allow_unlock"], false);
    let lock = find(state["locks"].as_array().unwrap(), "mutex", &key);
    assert_eq!(lock["holders"][0]["request_id"], "req-7");
    assert!(state["now_ms"].as_u64().unwrap() >= state["taken_ms"].as_u64().unwrap());

    // unlock is off: 403, and the lock stays
    let body = format!(r#"{{"kind":"mutex","key":"{key}"}}"#);
    let (status, answer) = http(&url, "POST", "/api/unlock", None, &[], &body).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("--allow-unlock"), "{answer}");
    assert!(fx.locks.is_locked(&key).await.unwrap());
    // another Host (a rebound DNS name) is refused
    let (status, _) = http(&url, "GET", "/api/state", Some("evil.example:80"), &[], "").await;
    assert_eq!(status, 421);
    // the page is served from the binary
    let (status, page) = http(&url, "GET", "/", None, &[], "").await;
    assert_eq!(status, 200);
    assert!(page.contains("/console.js"), "{page}");
    guard.release().await.unwrap();

    // a listen address that is none: a usage error
    let run = fx.lockctl(&["serve", "--listen", "not-an-address"]).await;
    assert_eq!(run.code, 2, "{run:?}");
}

/// The unlock token the console embedded in its page.
fn page_token(page: &str) -> String {
    let (_, rest) = page
        .split_once("<meta name=\"lockctl-token\" content=\"")
        .unwrap_or_else(|| panic!("no token in the page: {page}"));
    rest.split('"').next().unwrap().to_owned()
}

/// A page of another site whose host name was rebound to the console's address (DNS
/// rebinding) sends its own name as Host and Origin: it may neither read the locks nor unlock
/// one, also when the console listens on every address; nor may another origin, nor a request
/// without the page's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_refuses_rebound_hosts_other_origins_and_unlocks_without_token() {
    let fx = Fixture::new(Kind::Single).await;
    let key = unique_key("rebind");
    let guard = owner::chain("req-9", async {
        fx.locks.lock(&key).lease(Duration::from_secs(60)).await
    })
    .await
    .unwrap();
    let (_serve, listening) = serve_on(
        &fx.config,
        "0.0.0.0:0",
        &["--allow-unlock", &format!("{key}*")],
    )
    .await;
    let port = listening
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    // reached over loopback only
    let url = format!("http://127.0.0.1:{port}/");
    let body = format!(r#"{{"kind":"mutex","key":"{key}"}}"#);

    for host in ["evil.example".to_owned(), format!("evil.example:{port}")] {
        let origin = format!("http://{host}");
        for path in ["/api/state", "/"] {
            let (status, answer) = http(&url, "GET", path, Some(&host), &[], "").await;
            assert_eq!(status, 421, "GET {path} with Host {host}: {answer}");
            assert!(!answer.contains(&key), "{answer}");
        }
        let (status, answer) = http(
            &url,
            "POST",
            "/api/unlock",
            Some(&host),
            &[("Origin", &origin)],
            &body,
        )
        .await;
        assert_eq!(status, 421, "unlock with Host {host}: {answer}");
        assert!(answer.contains("Host"), "{answer}");
        assert!(
            fx.locks.is_locked(&key).await.unwrap(),
            "unlocked by {host}"
        );
    }

    // the console's own page carries the token
    let (status, page) = http(&url, "GET", "/", None, &[], "").await;
    assert_eq!(status, 200, "{page}");
    let token = page_token(&page);
    assert!(token.len() >= 32, "{token}");

    // a good Host, another origin: refused, even with the token
    let (status, answer) = http(
        &url,
        "POST",
        "/api/unlock",
        None,
        &[
            ("Origin", "http://evil.example"),
            ("X-Lockctl-Token", &token),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("evil.example"), "{answer}");
    // no token, a wrong one: refused
    let own_origin = format!("http://127.0.0.1:{port}");
    let wrong = "0".repeat(token.len());
    for headers in [
        vec![("Origin", own_origin.as_str())],
        vec![],
        vec![
            ("Origin", own_origin.as_str()),
            ("X-Lockctl-Token", wrong.as_str()),
        ],
    ] {
        let (status, answer) = http(&url, "POST", "/api/unlock", None, &headers, &body).await;
        assert_eq!(status, 403, "{headers:?}: {answer}");
        assert!(answer.contains("token"), "{answer}");
    }
    assert!(fx.locks.is_locked(&key).await.unwrap());

    // the page's own request unlocks
    let (status, answer) = http(
        &url,
        "POST",
        "/api/unlock",
        None,
        &[("Origin", &own_origin), ("X-Lockctl-Token", &token)],
        &body,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(!fx.locks.is_locked(&key).await.unwrap());
    let e = guard.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
}

/// `--allow-host NAME[:PORT]`: a name the console is reached by (a DNS name of the machine, a
/// reverse proxy's), with any port or with that port only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_allow_host_admits_the_names_given() {
    let fx = Fixture::new(Kind::Single).await;
    let key = unique_key("allowed");
    let _guard = fx
        .locks
        .lock(&key)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    let (_serve, url) = serve(
        &fx.config,
        &[
            "--allow-unlock",
            "--allow-host",
            "locks.internal",
            "--allow-host",
            "Proxy.Example:8443",
            &format!("{key}*"),
        ],
    )
    .await;
    let port = url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    for (host, status) in [
        (format!("locks.internal:{port}"), 200),
        ("locks.internal".to_owned(), 200),
        ("LOCKS.internal:9".to_owned(), 200),
        ("proxy.example:8443".to_owned(), 200),
        ("proxy.example".to_owned(), 421),
        (format!("proxy.example:{port}"), 421),
        (format!("localhost:{port}"), 200),
        (format!("[::1]:{port}"), 200),
        (format!("localhost.evil.example:{port}"), 421),
        ("127.0.0.1".to_owned(), 421),
    ] {
        let (got, answer) = http(&url, "GET", "/api/state", Some(&host), &[], "").await;
        assert_eq!(got, status, "Host {host}: {answer}");
    }
    // the Origin is held to the same names
    let (_, page) = http(&url, "GET", "/", None, &[], "").await;
    let token = page_token(&page);
    let body = format!(r#"{{"kind":"mutex","key":"{key}"}}"#);
    let (status, answer) = http(
        &url,
        "POST",
        "/api/unlock",
        Some("proxy.example:8443"),
        &[
            ("Origin", "https://evil.example:8443"),
            ("X-Lockctl-Token", &token),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(fx.locks.is_locked(&key).await.unwrap());
    let (status, answer) = http(
        &url,
        "POST",
        "/api/unlock",
        Some("proxy.example:8443"),
        &[
            ("Origin", "https://proxy.example:8443"),
            ("X-Lockctl-Token", &token),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(!fx.locks.is_locked(&key).await.unwrap());
}

/// Chromium and chromedriver: `$CHROMIUM_BIN` / `$CHROMEDRIVER_BIN`, else found on `PATH`.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let find = |var: &str, names: &[&str]| -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(var) {
            return Some(PathBuf::from(path)).filter(|p| p.is_file());
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
            .find(|p| p.is_file())
    };
    Some((
        find(
            "CHROMIUM_BIN",
            &["chromium", "chromium-browser", "google-chrome"],
        )?,
        find("CHROMEDRIVER_BIN", &["chromedriver"])?,
    ))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver and the Chromium it started: when dropped (a test that failed did not close
/// its session), chromedriver is killed, and so is every process of the browser's profile,
/// which would outlive it.
struct Driver {
    _chromedriver: Process,
    profile: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let flag = format!("--user-data-dir={}", self.profile.display());
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        for pid in procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.split(|b| *b == 0).any(|arg| arg == flag.as_bytes()) {
                // SAFETY: a plain kill(2) of a process of this test's browser
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// chromedriver on a free loopback port, and a WebDriver session of headless Chromium.
async fn webdriver(
    chromium: &Path,
    chromedriver: &Path,
    profile: &Path,
) -> (Driver, fantoccini::Client) {
    let port = free_port();
    let mut cmd = Command::new(chromedriver);
    cmd.arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let driver = Driver {
        _chromedriver: Process(spawn_child(cmd).expect("start chromedriver")),
        profile: profile.to_owned(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver did not listen on {port} within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let options = serde_json::json!({
        "binary": chromium,
        "args": [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,760",
            format!("--user-data-dir={}", profile.display()),
        ],
    });
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = tokio::time::timeout(
        Duration::from_secs(60),
        fantoccini::ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}")),
    )
    .await
    .expect("a browser session within 60 s")
    .expect("a browser session");
    (driver, client)
}

/// The text of the first element matching `css`, read in one script run (the page redraws
/// its table when the locks change).
async fn text_of(client: &fantoccini::Client, css: &str) -> String {
    let script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;";
    let text = client
        .execute(script, vec![Value::from(css)])
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    match text {
        Value::String(text) => text,
        other => panic!("no {css} on the page ({other})"),
    }
}

/// Clicks the element matching `css` (again when the page redrew it meanwhile).
async fn click(client: &fantoccini::Client, css: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let clicked = match client.find(fantoccini::Locator::Css(css)).await {
            Ok(element) => element.click().await,
            Err(e) => Err(e),
        };
        match clicked {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "cannot click {css}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Seconds in a lease cell (`41.3s`).
fn seconds(text: &str) -> f64 {
    text.trim()
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a lease in seconds: {text:?}"))
}

/// Makes the page's viewport `width` x `height` CSS pixels (the window of headless Chromium
/// may add a frame: it is measured and made up for).
async fn set_viewport(client: &fantoccini::Client, width: u32, height: u32) {
    let inner = "return [window.innerWidth, window.innerHeight];";
    let (mut w, mut h) = (width, height);
    for _ in 0..3 {
        client.set_window_size(w, h).await.unwrap();
        let got = client.execute(inner, vec![]).await.unwrap();
        let (got_w, got_h) = (got[0].as_u64().unwrap(), got[1].as_u64().unwrap());
        if (got_w, got_h) == (u64::from(width), u64::from(height)) {
            return;
        }
        // the frame: what the window has beyond the viewport
        w = (u64::from(w) + u64::from(width)).saturating_sub(got_w) as u32;
        h = (u64::from(h) + u64::from(height)).saturating_sub(got_h) as u32;
    }
    panic!("cannot make the viewport {width}x{height}");
}

/// What sticks out of the viewport sideways: the page's scroll width beyond its width, and
/// the elements (with their text) whose box leaves it.
async fn off_screen(client: &fantoccini::Client) -> Vec<String> {
    let script = r#"
        const width = document.documentElement.clientWidth;
        const out = [];
        if (document.documentElement.scrollWidth > width) {
            out.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + width);
        }
        for (const e of document.querySelectorAll("body *")) {
            const r = e.getBoundingClientRect();
            if (r.width > 0 && (r.right > width + 0.5 || r.left < -0.5)) {
                out.push(e.tagName + "." + e.className + " [" + Math.round(r.left) + ", " +
                    Math.round(r.right) + "] of " + width + ": " + (e.innerText || "").slice(0, 60));
            }
        }
        return out;"#;
    let found = client.execute(script, vec![]).await.unwrap();
    serde_json::from_value(found).unwrap()
}

/// Saves a screenshot of the page as `target/lockctl-<name>.png`; one `for_docs` also as
/// `<name>.png` in `$LOCKCTL_SCREENSHOTS_DIR` when that is set (the README's pictures: `docs/`).
async fn screenshot(client: &fantoccini::Client, name: &str, for_docs: bool) -> PathBuf {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
    let path = target.join(format!("lockctl-{name}.png"));
    std::fs::write(&path, &png).unwrap();
    if let Some(dir) = std::env::var_os("LOCKCTL_SCREENSHOTS_DIR").filter(|_| for_docs) {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
    }
    path
}

/// The texts of the elements matching `css` (none: empty), read in one script run.
async fn texts_of(client: &fantoccini::Client, css: &str) -> Vec<String> {
    let script = "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText);";
    let texts = client
        .execute(script, vec![Value::from(css)])
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    serde_json::from_value(texts).unwrap()
}

/// Waits until the text of an element matching `css` contains `wanted`.
async fn wait_for_text(client: &fantoccini::Client, css: &str, wanted: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let text = texts_of(client, css).await.join("\n");
        if text.contains(wanted) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {wanted:?} in {css} within {within:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The keys of the rows shown, top to bottom.
async fn shown_keys(client: &fantoccini::Client) -> Vec<String> {
    let script =
        "return [...document.querySelectorAll('#lock-rows tr.lock')].map(r => r.dataset.key);";
    serde_json::from_value(client.execute(script, vec![]).await.unwrap()).unwrap()
}

/// Types `text` into the key filter (replacing what was there).
async fn filter_keys(client: &fantoccini::Client, text: &str) {
    // WebDriver's clear fires no input event: empty it as a user's select-and-delete would
    let empty = "const f = document.getElementById('filter'); f.value = ''; \
                 f.dispatchEvent(new Event('input'));";
    client.execute(empty, vec![]).await.unwrap();
    let filter = client
        .find(fantoccini::Locator::Css("#filter"))
        .await
        .unwrap();
    if !text.is_empty() {
        filter.send_keys(text).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium() {
    let Some((chromium, chromedriver)) = browser() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the console test: chromium and chromedriver are missing \
             (scripts/test.sh installs the Debian packages chromium and chromium-driver)"
        );
        eprintln!(
            "SKIPPED console_in_chromium: chromium / chromedriver not installed (apt-get \
             install chromium chromium-driver; scripts/test.sh installs them)"
        );
        return;
    };
    let started = Instant::now();
    // a server of its own: the test stops it to see the page go stale
    let topo = Topology::start(Spec::Single).await;
    let fx = Fixture::private(&topo, "orders-1").await;
    let locks = &fx.locks;
    // the server is the test's own: the keys need no prefix of their own, and the screenshots
    // show keys as a service names them
    let key = "goods:42".to_owned();
    let lease = Duration::from_secs(45);
    let guard = owner::chain("req-42", async { locks.lock(&key).lease(lease).await })
        .await
        .unwrap();
    // another service, whose caller will wait for the nightly job (a service's own callers
    // wait behind its holds without registering on Redis); connected before the job is
    // taken, so that goods:42 is clearly the oldest hold
    let billing = fx.other_service("billing-2").await;
    // something of every kind on the page
    let job_key = "job:nightly".to_owned();
    let job = owner::chain("nightly-report", async { locks.lock(&job_key).await })
        .await
        .unwrap();
    let waiter = {
        let (locks, job_key) = (billing.clone(), job_key.clone());
        tokio::spawn(owner::chain("req-77", async move {
            locks.lock(&job_key).wait(Duration::from_secs(120)).await
        }))
    };
    let catalog = "catalog:7".to_owned();
    let r1 = owner::chain("req-50", async {
        locks.read(&catalog).lease(Duration::from_secs(30)).await
    })
    .await
    .unwrap();
    let r2 = owner::chain("req-51", async {
        locks.read(&catalog).lease(Duration::from_secs(20)).await
    })
    .await
    .unwrap();
    let second_goods = owner::chain("req-43", async {
        locks.lock("goods:43").lease(Duration::from_secs(90)).await
    })
    .await
    .unwrap();
    // a job done, its lock kept for its minimum hold
    let report = "report:daily".to_owned();
    let done = owner::chain("daily-report", async {
        locks
            .lock(&report)
            .hold_at_least(Duration::from_secs(120))
            .await
    })
    .await
    .unwrap();
    done.release().await.unwrap();
    let renders = locks.semaphore("pdf-render", 4);
    let permit = owner::chain("req-60", async {
        renders.acquire_many(2).lease(Duration::from_secs(40)).await
    })
    .await
    .unwrap();

    let (_serve, url) = serve(&fx.config, &["--allow-unlock"]).await;
    let profile = tempfile::tempdir().unwrap();
    let (_driver, client) = webdriver(&chromium, &chromedriver, profile.path()).await;
    let ready = started.elapsed();
    set_viewport(&client, 1280, 800).await;
    client.goto(&url).await.unwrap();
    let row = format!("tr.lock[data-key=\"{key}\"][data-kind=\"mutex\"]");
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(fantoccini::Locator::Css(&row))
        .await
        .expect("the held lock is shown");

    // the holder and the request it was taken for
    let owner_text = text_of(&client, &format!("{row} .owner")).await;
    assert_eq!(owner_text, guard.owner().as_str());
    assert!(owner_text.starts_with("req-42#"), "{owner_text}");
    let request = text_of(&client, &format!("{row} .request")).await;
    assert!(request.contains("req-42"), "{request}");
    assert!(!request.contains("req-42#"), "{request}");

    // the lease counts down
    let lease_text = |t: String| seconds(t.trim().trim_start_matches("lease").trim());
    let first = lease_text(text_of(&client, &format!("{row} .lease")).await);
    assert!(first > 0.0 && first <= lease.as_secs_f64(), "{first}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let second = loop {
        let now = lease_text(text_of(&client, &format!("{row} .lease")).await);
        if now < first - 0.5 {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the lease stayed at {now}s (first {first}s)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(second > first - 5.0, "{first} -> {second}");

    // which instance holds it, for how long
    assert_eq!(
        text_of(&client, &format!("{row} .instance")).await,
        "orders-1"
    );
    let age = text_of(&client, &format!("{row} .age")).await;
    let secs: u64 = age
        .strip_prefix("held ")
        .and_then(|a| a.strip_suffix('s'))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not an age: {age:?}"));
    assert!(secs < 60, "{age}");

    // who waits: the waiting callers of each service (services report them every second)
    let job_row = format!("tr.lock[data-key=\"{job_key}\"]");
    wait_for_text(
        &client,
        &format!("{job_row} .waiting"),
        "billing-2",
        Duration::from_secs(10),
    )
    .await;
    let waiting = text_of(&client, &format!("{job_row} .waiter-count")).await;
    assert_eq!(waiting, "1");

    // done, kept: nobody holds it
    let kept_row = format!("tr.lock.kept[data-key=\"{report}\"]");
    let kept = text_of(&client, &format!("{kept_row} .holders")).await;
    assert!(kept.contains("done, kept until "), "{kept}");
    assert!(
        texts_of(&client, &format!("{kept_row} .lease"))
            .await
            .is_empty(),
        "{kept}"
    );

    // a hold whose lease runs out while the console watches
    let cart = "cart:9".to_owned();
    let expiring = owner::chain("req-61", async {
        locks.lock(&cart).lease(Duration::from_secs(3)).await
    })
    .await
    .unwrap();
    client
        .wait()
        .at_most(Duration::from_millis(2500))
        .for_element(fantoccini::Locator::Css(&format!(
            "tr.lock[data-key=\"{cart}\"]"
        )))
        .await
        .expect("the console lists the hold before its lease runs out");

    // changes between refreshes become events, each kind named as what it was
    r2.release().await.unwrap();
    wait_for_text(&client, "#events", "released", Duration::from_secs(5)).await;
    let events = text_of(&client, "#events").await;
    assert!(events.contains(&format!("rw {catalog}")), "{events}");
    assert!(events.contains("request req-51"), "{events}");
    // the lease of the cart ran out: expired, not released
    let deadline = Instant::now() + Duration::from_secs(10);
    while !texts_of(&client, "#events li.event-expired")
        .await
        .join("\n")
        .contains(&cart)
    {
        assert!(
            Instant::now() < deadline,
            "no expired event of {cart}: {:?}",
            texts_of(&client, "#events li").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expired = texts_of(&client, "#events li.event-expired")
        .await
        .join("\n");
    assert!(expired.contains("expired"), "{expired}");
    assert!(expired.contains("request req-61"), "{expired}");
    let released = texts_of(&client, "#events li.event-released").await;
    assert!(!released.iter().any(|e| e.contains(&cart)), "{released:?}");
    drop(expiring);

    // filter by key: text, then a glob
    filter_keys(&client, "catalog").await;
    assert_eq!(shown_keys(&client).await, [catalog.as_str()]);
    filter_keys(&client, "*:nightly").await;
    assert_eq!(shown_keys(&client).await, [job_key.as_str()]);
    wait_for_text(&client, "#count", "1 of 6", Duration::from_secs(2)).await;
    filter_keys(&client, "").await;
    let keys = shown_keys(&client).await;
    assert_eq!(keys.len(), 6, "{keys:?}");
    // sorted by key, by waiters
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    client
        .find(fantoccini::Locator::Css("#sort"))
        .await
        .unwrap()
        .select_by_value("waiters")
        .await
        .unwrap();
    assert_eq!(shown_keys(&client).await[0], job_key);
    client
        .find(fantoccini::Locator::Css("#sort"))
        .await
        .unwrap()
        .select_by_value("age")
        .await
        .unwrap();
    assert_eq!(
        shown_keys(&client).await[0],
        key,
        "the oldest hold first: {:?}",
        texts_of(&client, "#lock-rows tr.lock").await
    );
    client
        .find(fantoccini::Locator::Css("#sort"))
        .await
        .unwrap()
        .select_by_value("key")
        .await
        .unwrap();

    // at 1280 px everything is on screen, the force-unlock buttons too
    let problems = off_screen(&client).await;
    assert!(problems.is_empty(), "at 1280 px: {problems:#?}");

    // force-unlock behind a confirmation
    click(&client, &format!("{row} button.unlock")).await;
    let confirm = client
        .find(fantoccini::Locator::Css("#confirm-yes"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !confirm.is_displayed().await.unwrap() {
        assert!(Instant::now() < deadline, "no confirmation dialog");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dialog = text_of(&client, "#confirm-text").await;
    assert!(
        dialog.contains(&key) && dialog.contains("req-42"),
        "{dialog}"
    );
    assert!(
        locks.is_locked(&key).await.unwrap(),
        "nothing happens before confirming"
    );
    confirm.click().await.unwrap();
    eventually(
        "the lock is gone on Redis",
        Duration::from_secs(5),
        || async { !locks.inspect(&key).await.unwrap().is_held() },
    )
    .await;
    eventually("the page shows it gone", Duration::from_secs(5), || async {
        client
            .find_all(fantoccini::Locator::Css(&row))
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    wait_for_text(
        &client,
        "#events li.event-force-unlocked",
        &key,
        Duration::from_secs(5),
    )
    .await;
    let unlocked = texts_of(&client, "#events li.event-force-unlocked")
        .await
        .join("\n");
    assert!(unlocked.contains("force-unlocked"), "{unlocked}");
    let e = guard.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    let other = text_of(&client, "#lock-rows").await;
    assert!(
        other.contains("nightly-report#"),
        "the other locks stay: {other}"
    );
    assert!(!text_of(&client, "#status").await.contains("stale"));
    // the header: the server, its role and health, as probed
    let port = topo.ports()[0];
    let node = text_of(&client, "#nodes .node.up").await;
    assert!(
        node.contains(&format!("127.0.0.1:{port}")) && node.contains("master"),
        "{node}"
    );
    let wide = screenshot(&client, "console-1280", true).await;

    // at 800 px: cards, nothing off screen
    set_viewport(&client, 800, 1000).await;
    let problems = off_screen(&client).await;
    assert!(problems.is_empty(), "at 800 px: {problems:#?}");
    let head_shown = client
        .execute(
            "return getComputedStyle(document.querySelector('#locks thead')).display;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(head_shown, "none", "the narrow layout has no table header");
    let narrow = screenshot(&client, "console-800", true).await;

    // without --allow-unlock there is no button
    let (_plain, plain_url) = serve(&fx.config, &[]).await;
    client.goto(&plain_url).await.unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(fantoccini::Locator::Css(&job_row))
        .await
        .unwrap();
    let buttons = client
        .find_all(fantoccini::Locator::Css("button.unlock"))
        .await
        .unwrap();
    assert!(
        buttons.is_empty(),
        "force-unlock is offered without --allow-unlock"
    );

    // Redis stops: the page says the data is stale, and so does the API
    client.goto(&url).await.unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(fantoccini::Locator::Css(&job_row))
        .await
        .unwrap();
    set_viewport(&client, 1280, 800).await;
    waiter.abort();
    topo.kill(port);
    wait_for_text(
        &client,
        "#stale",
        "Redis unreachable",
        Duration::from_secs(10),
    )
    .await;
    let status = client
        .execute(
            "const s = document.querySelector('#status'); \
             return [s.className, s.innerText, document.body.className];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(status[0], "status stale", "{status}");
    assert!(
        status[1].as_str().unwrap().starts_with("stale since"),
        "{status}"
    );
    assert!(status[2].as_str().unwrap().contains("is-stale"), "{status}");
    wait_for_text(
        &client,
        "#nodes .node.down",
        &format!("127.0.0.1:{port}"),
        Duration::from_secs(10),
    )
    .await;
    let banner = text_of(&client, "#stale").await;
    assert!(banner.contains("showing the locks as of"), "{banner}");
    assert!(
        text_of(&client, "#lock-rows")
            .await
            .contains("nightly-report#"),
        "the last list stays, dimmed"
    );
    let (code, body) = http(&url, "GET", "/api/state", None, &[], "").await;
    assert_eq!(code, 200, "{body}");
    let state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["stale"], true, "{state}");
    assert!(state["last_error"]["message"].is_string(), "{state}");
    assert!(
        state["last_ok_ms"].as_u64().unwrap() <= state["stale_since_ms"].as_u64().unwrap(),
        "{state}"
    );
    let stale = screenshot(&client, "console-stale", false).await;
    client.close().await.unwrap();

    // the holds went with the server
    drop((job, second_goods, r1, permit));
    eprintln!(
        "console_in_chromium: browser ready after {:.1}s, whole test {:.1}s; screenshots {}, \
         {}, {}",
        ready.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        wide.display(),
        narrow.display(),
        stale.display()
    );
}
