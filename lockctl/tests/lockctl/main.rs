//! The `lockctl` binary against real Redis topologies (single node and cluster) while this test
//! holds locks of every kind, and its web console in headless Chromium through chromedriver.
//!
//! The modules: [`cli`] (the commands, their output and exit codes), [`terminal`] (text that
//! could drive a terminal, the unlock prompt on a pseudo-terminal), [`console_http`] (the
//! console's API and what it refuses), [`console_browser`] (the page in headless Chromium).
//! Here: the fixture and the helpers they share.

mod cli;
mod console_browser;
mod console_http;
mod terminal;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use lock_runtime::{LockConfig, LockService};
use lock_tests::harness::{Kind, Topology, shared, spawn_child};
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

fn find<'a>(list: &'a [Value], kind: &str, key: &str) -> &'a Value {
    list.iter()
        .find(|l| l["kind"] == kind && l["key"] == key)
        .unwrap_or_else(|| panic!("no {kind} {key} in {list:#?}"))
}

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
