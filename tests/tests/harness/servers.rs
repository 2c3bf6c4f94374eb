//! Tests of the harness itself: every topology starts, answers, survives kill/restart where it
//! should, and leaves no process or port behind.

use std::collections::HashSet;
use std::env;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use lock_tests::harness::{Kind, Spec, Topology, shared, spawn_child, unique_key};
use redis::Commands;

const DEADLINE: Duration = Duration::from_secs(20);

/// Env var that turns `child_process_helper` into a real test body (see the leak tests).
const CHILD_MODE: &str = "HARNESS_TEST_CHILD_MODE";

fn port_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// `true` once the process is gone or a zombie nobody reaped yet (it holds no sockets then).
fn process_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn unique_keys_never_repeat() {
    let keys: HashSet<String> = (0..1000).map(|_| unique_key("t")).collect();
    assert_eq!(keys.len(), 1000);
    assert!(
        keys.iter()
            .all(|k| k.starts_with("t:") && !k.contains(['{', '}']))
    );
}

#[tokio::test]
async fn single_answers_set_and_get() {
    let started = Instant::now();
    let topo = shared(Kind::Single).await;
    eprintln!("single ready in {:?}", started.elapsed());
    assert_eq!(topo.ports().len(), 1);
    assert_eq!(topo.url(), topo.master_url());
    assert!(topo.sentinel_urls().is_empty() && topo.replica_urls().is_empty());

    let key = unique_key("harness:single");
    let mut con = topo.conn(topo.master_port());
    let _: () = con.set(&key, "v1").unwrap();
    let got: String = con.get(&key).unwrap();
    assert_eq!(got, "v1");
}

#[tokio::test]
async fn master_replicas_replicate_a_write() {
    let started = Instant::now();
    let topo = Topology::start(Spec::master_replicas()).await;
    eprintln!("master + 2 replicas ready in {:?}", started.elapsed());
    assert_eq!(topo.replica_ports().len(), 2);

    let key = unique_key("harness:repl");
    let _: () = topo.conn(topo.master_port()).set(&key, "v").unwrap();
    for port in topo.replica_ports() {
        let mut con = topo.conn(port);
        wait_for("replica sees the write", || {
            con.get::<_, Option<String>>(&key).unwrap().as_deref() == Some("v")
        });
        let err = con.set::<_, _, ()>(&key, "w").unwrap_err();
        assert_eq!(
            err.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "{err}"
        );
    }
}

#[tokio::test]
async fn sentinels_report_the_master_and_replicas() {
    let started = Instant::now();
    let topo = shared(Kind::Sentinel).await;
    eprintln!("sentinel 1m+2r+3s ready in {:?}", started.elapsed());
    assert_eq!(topo.master_name(), "mymaster");
    assert_eq!(topo.sentinel_ports().len(), 3);
    assert_eq!(topo.current_master(), topo.master_port());
    for port in topo.sentinel_ports() {
        let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(topo.master_name())
            .query(&mut topo.conn(port))
            .unwrap();
        assert_eq!(replicas.len(), 2, "sentinel {port}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_after_master_kill() {
    let topo = Topology::start(Spec::sentinel()).await;
    let old = topo.master_port();
    topo.kill(old);
    let killed = Instant::now();
    let new = topo.wait_for_new_master(old, DEADLINE).await;
    eprintln!(
        "sentinel failover: {old} -> {new} in {:?}",
        killed.elapsed()
    );
    assert!(topo.replica_ports().contains(&new));
    assert_eq!(topo.current_master(), new);
    let key = unique_key("harness:failover");
    let _: () = topo.conn(new).set(&key, 1).unwrap();

    // The old master comes back as a replica of the new one.
    topo.restart(old).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut topo.conn(old)).unwrap();
    assert_eq!(role[0], redis::Value::BulkString(b"slave".to_vec()));
}

#[tokio::test]
async fn cluster_is_ok_and_routes_keys_to_every_master() {
    let started = Instant::now();
    let topo = shared(Kind::Cluster).await;
    eprintln!("cluster 3m+3r ready in {:?}", started.elapsed());
    assert_eq!(topo.node_ports().len(), 6);
    assert_eq!(topo.replica_ports().len(), 3);
    for port in topo.node_ports() {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut topo.conn(port))
            .unwrap();
        assert!(info.contains("cluster_state:ok"), "node {port}: {info}");
    }

    // One key per master, written through the cluster client and read back on the owner.
    let prefix = unique_key("harness:cluster");
    let mut per_master = std::collections::HashMap::new();
    for i in 0..200 {
        let key = format!("{prefix}:{i}");
        let owner = topo.master_for_slot(topo.key_slot(&key));
        per_master.entry(owner).or_insert(key);
    }
    assert_eq!(per_master.len(), 3, "keys landed on {per_master:?}");
    let client = redis::cluster::ClusterClient::new(topo.node_urls()).unwrap();
    let mut cluster = client.get_connection().unwrap();
    for (owner, key) in &per_master {
        let _: () = cluster.set(key, *owner).unwrap();
        let got: u16 = topo.conn(*owner).get(key).unwrap();
        assert_eq!(got, *owner);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_after_master_kill_and_restart() {
    let topo = Topology::start(Spec::cluster()).await;
    let old = topo.master_for_slot(0);
    topo.kill(old);
    let killed = Instant::now();
    let new = topo.wait_for_new_slot_owner(0, old, DEADLINE).await;
    eprintln!("cluster failover: {old} -> {new} in {:?}", killed.elapsed());
    assert!(topo.replica_ports().contains(&new));

    let restarted = Instant::now();
    topo.restart(old).await;
    eprintln!(
        "killed cluster master rejoined in {:?}",
        restarted.elapsed()
    );
    wait_for("the old master rejoins as a replica", || {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut topo.conn(old)).unwrap();
        role[0] == redis::Value::BulkString(b"slave".to_vec())
    });
    assert_eq!(topo.master_for_slot(0), new);
}

/// The ports named in a `CLUSTER SLOTS` reply (every node of every range).
fn ports_in_cluster_slots(reply: &redis::Value) -> Vec<u16> {
    let redis::Value::Array(ranges) = reply else {
        panic!("CLUSTER SLOTS: {reply:?}");
    };
    let mut ports = Vec::new();
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            panic!("CLUSTER SLOTS range: {range:?}");
        };
        for node in &fields[2..] {
            let redis::Value::Array(node) = node else {
                panic!("CLUSTER SLOTS node: {node:?}");
            };
            match &node[1] {
                redis::Value::Int(port) => ports.push(u16::try_from(*port).unwrap()),
                other => panic!("CLUSTER SLOTS port: {other:?}"),
            }
        }
    }
    ports
}

/// The replica of `master` in a cluster with one replica per master.
fn replica_of(topo: &Topology, master: u16) -> u16 {
    topo.replica_ports()
        .into_iter()
        .find(|&r| {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut topo.conn(r))
                .unwrap();
            // a replica names its master by the address the master announces: its proxy
            info.contains(&format!("master_port:{}", topo.proxy_for(master).port()))
        })
        .unwrap_or_else(|| panic!("no replica follows {master}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_cluster_announces_its_proxies_and_clients_route_through_them() {
    let started = Instant::now();
    let topo = Topology::start(Spec::proxied_cluster()).await;
    eprintln!("proxied cluster 3m+3r ready in {:?}", started.elapsed());
    assert!(topo.is_proxied());
    assert_eq!(topo.proxies().len(), 6);
    assert_eq!(topo.proxied_node_urls().len(), 6);
    let proxy_ports: HashSet<u16> = topo.proxies().iter().map(|p| p.port()).collect();
    for (port, proxy) in topo.node_ports().into_iter().zip(topo.proxies()) {
        assert_eq!(proxy.upstream().port(), port);
        assert_eq!(topo.proxy_for(port).port(), proxy.port());
        assert_ne!(proxy.port(), port);
    }

    // CLUSTER SLOTS and MOVED name the proxies; the harness still hands out real ports.
    let some_node = topo.node_ports()[3];
    let slots: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut topo.conn(some_node))
        .unwrap();
    // (replicas appear once the node has heard of their replication offset)
    let named = ports_in_cluster_slots(&slots);
    assert!(named.len() >= 3, "{slots:?}");
    assert!(named.iter().all(|p| proxy_ports.contains(p)), "{named:?}");
    let key = format!("{{{}}}", unique_key("harness:proxied"));
    let owner = topo.master_for_slot(topo.key_slot(&key));
    assert!(topo.node_ports().contains(&owner));
    let replicas = topo.replica_ports();
    let other = topo
        .node_ports()
        .into_iter()
        .find(|p| *p != owner && !replicas.contains(p))
        .unwrap();
    let moved = topo.conn(other).set::<_, _, ()>(&key, 1).unwrap_err();
    assert_eq!(
        moved.redirect_node().map(|(addr, _)| addr.to_owned()),
        Some(format!("127.0.0.1:{}", topo.proxy_for(owner).port())),
        "{moved}"
    );

    // Replicas replicate through their master's proxy, spared from its faults: a write to the
    // master reaches the replica while a drop is armed, and the drop stays armed.
    let proxy = topo.proxy_for(owner);
    assert_eq!(
        proxy.replication_connections().len(),
        1,
        "one replica per master"
    );
    let replica = replica_of(&topo, owner);
    proxy.drop_next_reply();
    let _: () = topo
        .conn(owner)
        .set(format!("{key}:replicated"), 1)
        .unwrap();
    wait_for("the write reaches the replica", || {
        let mut con = topo.conn(replica);
        let _: () = redis::cmd("READONLY").query(&mut con).unwrap();
        con.get::<_, Option<i64>>(format!("{key}:replicated"))
            .unwrap()
            .is_some()
    });
    assert_eq!(
        proxy.replies_dropped(),
        0,
        "the replication stream lost a chunk"
    );
    proxy.heal();

    // A cluster client seeded with the real ports routes through the proxies, so their faults
    // reach it.
    let before = proxy.accepted();
    let client = redis::cluster::ClusterClientBuilder::new(topo.node_urls())
        .retries(0)
        .build()
        .unwrap();
    let mut cluster = client.get_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("v")
        .query_async(&mut cluster)
        .await
        .unwrap();
    assert!(
        proxy.accepted() > before,
        "no connection through the owner's proxy"
    );
    proxy.drop_next_reply();
    let lost = redis::cmd("INCR")
        .arg(format!("{key}:n"))
        .query_async::<i64>(&mut cluster)
        .await;
    assert!(lost.is_err(), "{lost:?}");
    assert_eq!(proxy.replies_dropped(), 1);
    let ran: i64 = topo.conn(owner).get(format!("{key}:n")).unwrap();
    assert_eq!(ran, 1, "the server ran the command whose reply was lost");

    // A restarted node keeps announcing its proxy.
    let replica = topo.replica_ports()[0];
    topo.restart(replica).await;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut topo.conn(replica))
        .unwrap();
    let myself = nodes.lines().find(|l| l.contains("myself")).unwrap();
    assert!(
        myself.contains(&format!("127.0.0.1:{}@", topo.proxy_for(replica).port())),
        "{myself}"
    );

    // Dropping the topology closes the proxies too.
    let pids: Vec<u32> = topo
        .node_ports()
        .iter()
        .map(|&p| topo.pid(p).unwrap())
        .collect();
    drop(cluster);
    drop(topo);
    assert!(pids.iter().all(|&pid| process_dead(pid)));
    let deadline = Instant::now() + DEADLINE;
    while !proxy_ports.iter().all(|&p| port_free(p)) {
        assert!(
            Instant::now() < deadline,
            "proxy ports still bound after the drop"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn single_kill_and_restart_on_the_same_port() {
    let topo = Topology::start(Spec::Single).await;
    let port = topo.master_port();
    let key = unique_key("harness:restart");
    let _: () = topo.conn(port).set(&key, 1).unwrap();
    let first_pid = topo.pid(port).unwrap();

    topo.kill(port);
    assert!(!topo.is_running(port));
    assert_eq!(topo.pid(port), None);
    assert!(topo.try_conn(port).is_err());
    assert!(process_dead(first_pid));

    let started = Instant::now();
    topo.restart(port).await;
    eprintln!("single restarted in {:?}", started.elapsed());
    assert!(topo.is_running(port));
    assert_ne!(topo.pid(port), Some(first_pid));
    let mut con = topo.conn(port);
    // Nothing is persisted, so the restarted server is empty.
    assert_eq!(con.get::<_, Option<i64>>(&key).unwrap(), None);
}

#[tokio::test]
async fn replica_restart_relinks_and_resyncs() {
    let topo = Topology::start(Spec::MasterReplicas { replicas: 1 }).await;
    let replica = topo.replica_ports()[0];
    topo.kill(replica);
    let key = unique_key("harness:resync");
    let _: () = topo.conn(topo.master_port()).set(&key, "after").unwrap();
    topo.restart(replica).await;
    let got: Option<String> = topo.conn(replica).get(&key).unwrap();
    assert_eq!(got.as_deref(), Some("after"));
}

#[tokio::test]
async fn drop_kills_every_process_and_frees_the_ports() {
    let topo = Topology::start(Spec::Sentinel {
        replicas: 1,
        sentinels: 1,
        down_after_ms: 2000,
    })
    .await;
    let ports = topo.ports();
    assert_eq!(ports.len(), 3);
    let pids: Vec<u32> = ports.iter().map(|&p| topo.pid(p).unwrap()).collect();
    assert!(pids.iter().all(|&pid| !process_dead(pid)));
    drop(topo);
    for pid in pids {
        assert!(process_dead(pid), "pid {pid} survived the drop");
    }
    for port in ports {
        assert!(port_free(port), "port {port} still taken after the drop");
    }
}

#[test]
fn servers_outlive_the_runtime_that_started_them() {
    // The blocking-pool thread that ran the start-up exits with its runtime; the servers must
    // not die with that thread.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let topo = rt.block_on(Topology::start(Spec::Single));
    drop(rt);
    thread::sleep(Duration::from_millis(200));
    let pong: String = redis::cmd("PING")
        .query(&mut topo.conn(topo.master_port()))
        .unwrap();
    assert_eq!(pong, "PONG");
}

/// Body run in a child copy of this test binary by the tests below; a no-op otherwise.
#[test]
fn child_process_helper() {
    let Ok(mode) = env::var(CHILD_MODE) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let topo = rt.block_on(shared(Kind::Single));
    let port = topo.master_port();
    println!("HARNESS port={port} pid={}", topo.pid(port).unwrap());
    if mode == "worker-sigkill" {
        // A lock-worker started the way the lock tests start theirs, holding a lock.
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lock-worker"));
        cmd.args([&topo.url(), "hold", &unique_key("orphan"), "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // not this process's stderr: a surviving worker would hold run_child's pipe open
            .stderr(Stdio::null());
        // never waited for: this process SIGKILLs itself below, and the worker must die with it
        #[allow(clippy::zombie_processes)]
        let mut worker = spawn_child(cmd).unwrap();
        let mut line = String::new();
        BufReader::new(worker.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("held "), "{line}");
        println!("HARNESS worker={}", worker.id());
        // SAFETY: raising a signal on our own process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    if mode == "restart-port-taken" {
        // A killed node whose port another process takes and never frees.
        let topo = rt.block_on(Topology::start(Spec::Single));
        let port = topo.master_port();
        topo.kill(port);
        let _squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        let started = Instant::now();
        let restarted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            topo.restart_blocking(port);
        }));
        println!("HARNESS restart gave up after {:?}", started.elapsed());
        assert!(
            restarted.is_err(),
            "restarted on a port another process holds"
        );
        return;
    }
    if mode == "sigkill" {
        // Dies without unwinding or exit hooks, like a test binary killed on timeout.
        // SAFETY: raising a signal on our own process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

struct ChildRun {
    child_pid: u32,
    success: bool,
    output: String,
    /// The server port and pid the child printed.
    server: Option<(u16, u32)>,
}

fn run_child(mode: &str, envs: &[(&str, &str)]) -> ChildRun {
    let mut cmd = Command::new(env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "servers::child_process_helper",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_MODE, mode)
    .envs(envs.iter().copied())
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    // Like every child of a test, the copy dies with this process (harness::spawn_child).
    let child = spawn_child(cmd).unwrap();
    let child_pid = child.id();
    let out = child.wait_with_output().unwrap();
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let server = output.lines().find_map(|l| {
        let rest = &l[l.find("HARNESS port=")? + "HARNESS port=".len()..];
        let (port, pid) = rest.split_once(" pid=")?;
        Some((port.parse().ok()?, pid.trim().parse().ok()?))
    });
    ChildRun {
        child_pid,
        success: out.status.success(),
        output,
        server,
    }
}

#[test]
fn servers_die_with_a_sigkilled_test_process() {
    // Also checks that HARNESS_PORT_BASE gives each process its own window of 100 ports.
    let base: u16 = 41_000;
    let run = run_child("sigkill", &[("HARNESS_PORT_BASE", "41000")]);
    assert!(
        !run.success,
        "the child should have been killed:\n{}",
        run.output
    );
    let (port, pid) = run
        .server
        .unwrap_or_else(|| panic!("no server line:\n{}", run.output));
    let window = base + (run.child_pid % 50) as u16 * 100;
    assert!(
        (window..window + 100).contains(&port),
        "port {port} outside the window {window}..{}",
        window + 100
    );
    wait_for("the orphaned server dies", || process_dead(pid));
    wait_for("the orphaned server's port is free", || port_free(port));
}

#[test]
fn lock_workers_die_with_a_sigkilled_test_process() {
    let run = run_child("worker-sigkill", &[]);
    assert!(
        !run.success,
        "the child should have been killed:\n{}",
        run.output
    );
    let worker: u32 = run
        .output
        .lines()
        .find_map(|l| l.split_once("HARNESS worker=")?.1.trim().parse().ok())
        .unwrap_or_else(|| panic!("no worker line:\n{}", run.output));
    wait_for("the orphaned lock-worker dies", || process_dead(worker));
}

#[test]
fn exit_hook_removes_shared_topologies() {
    let run = run_child("exit", &[]);
    assert!(run.success, "{}", run.output);
    let (port, pid) = run
        .server
        .unwrap_or_else(|| panic!("no server line:\n{}", run.output));
    wait_for("the shared server dies at exit", || process_dead(pid));
    assert!(port_free(port));
    let prefix = format!("lock-harness-{}-", run.child_pid);
    let left: Vec<_> = std::fs::read_dir(env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "directories left behind: {left:?}");
}

#[test]
fn missing_server_binary_panics_with_the_install_hint() {
    let run = run_child("exit", &[("REDIS_SERVER_BIN", "/nonexistent/redis-server")]);
    assert!(!run.success, "{}", run.output);
    assert!(
        run.output.contains("REDIS_SERVER_BIN") && run.output.contains("scripts/test.sh"),
        "{}",
        run.output
    );
}

#[test]
fn restart_on_a_port_that_stays_taken_fails_clearly() {
    let run = run_child("restart-port-taken", &[("HARNESS_READY_TIMEOUT_SECS", "2")]);
    assert!(run.success, "{}", run.output);
    assert!(
        run.output
            .contains("was taken by another process while the node was down")
            && run.output.contains("was not freed within 2s"),
        "{}",
        run.output
    );
    let gave_up: f64 = run
        .output
        .lines()
        .find_map(|l| {
            l.split_once("HARNESS restart gave up after ")?
                .1
                .strip_suffix('s')?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no give-up line:\n{}", run.output));
    assert!(gave_up < 5.0, "bounded by the deadline: {gave_up} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_waits_out_another_server_on_its_port() {
    let topo = Topology::start(Spec::Single).await;
    let port = topo.master_port();
    topo.kill(port);
    // Another redis-server takes the port meanwhile: it answers PING like ours would.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ])
    .current_dir(dir.path())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let mut foreign = spawn_child(cmd).unwrap();
    wait_for("the other server answers", || {
        topo.try_conn(port)
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    });
    let foreign_pid = foreign.id();
    let freed = thread::spawn(move || {
        thread::sleep(Duration::from_millis(700));
        let _ = foreign.kill();
        let _ = foreign.wait();
    });
    let started = Instant::now();
    topo.restart(port).await;
    freed.join().unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "ready while the other server still held the port: {:?}",
        started.elapsed()
    );
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut topo.conn(port))
        .unwrap();
    let pid = topo.pid(port).unwrap();
    assert_ne!(pid, foreign_pid);
    assert!(info.contains(&format!("process_id:{pid}\r")), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_master_is_ready_with_its_replicas_relinked() {
    let topo = Topology::start(Spec::master_replicas()).await;
    let master = topo.master_port();
    topo.kill(master);
    topo.restart(master).await;
    // at once, no polling: the replicas are linked and acknowledge a write
    for replica in topo.replica_ports() {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut topo.conn(replica))
            .unwrap();
        assert!(
            info.contains(&format!("master_port:{master}\r"))
                && info.contains("master_link_status:up"),
            "replica {replica}: {info}"
        );
    }
    let mut con = topo.conn(master);
    let _: () = con.set(unique_key("harness:relinked"), 1).unwrap();
    let acks: usize = redis::cmd("WAIT").arg(2).arg(1000).query(&mut con).unwrap();
    assert_eq!(acks, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_sentinel_is_ready_once_the_others_see_it_again() {
    let topo = Topology::start(Spec::sentinel()).await;
    let [victim, others @ ..] = &topo.sentinel_ports()[..] else {
        unreachable!()
    };
    let flags_of_victim = |other: u16| -> Option<String> {
        let known: Vec<Vec<String>> = redis::cmd("SENTINEL")
            .arg("SENTINELS")
            .arg(topo.master_name())
            .query(&mut topo.conn(other))
            .unwrap();
        known.iter().find_map(|fields| {
            let map: std::collections::HashMap<&str, &str> = fields
                .chunks_exact(2)
                .map(|kv| (kv[0].as_str(), kv[1].as_str()))
                .collect();
            (map.get("port") == Some(&&*victim.to_string())).then(|| map["flags"].to_owned())
        })
    };
    topo.kill(*victim);
    // the others notice it is gone (down-after-milliseconds)
    wait_for("the other sentinels flag the killed one", || {
        others
            .iter()
            .all(|&o| flags_of_victim(o).is_some_and(|f| f.contains("s_down")))
    });
    topo.restart(*victim).await;
    for &other in others {
        assert_eq!(
            flags_of_victim(other).as_deref(),
            Some("sentinel"),
            "sentinel {other} still flags the restarted one"
        );
    }
    assert_eq!(topo.current_master(), topo.master_port());
}
