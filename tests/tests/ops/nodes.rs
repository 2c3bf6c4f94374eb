//! `LockService::nodes` on real topologies: every server listed with its role and health, and
//! a server that is down (killed, or stopped in a cluster) shown as unhealthy while the call
//! still succeeds.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::common::Fixture;
use lock_runtime::{ErrorKind, LockService, NodeRole, NodeStatus, RedisNodes};
use lock_tests::harness::{Kind, Spec};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn addr(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

fn addrs(ports: impl IntoIterator<Item = u16>) -> BTreeSet<String> {
    ports.into_iter().map(addr).collect()
}

fn of_role(view: &RedisNodes, role: NodeRole) -> BTreeSet<String> {
    view.with_role(role).map(|n| n.address.clone()).collect()
}

fn node<'a>(view: &'a RedisNodes, address: &str) -> &'a NodeStatus {
    view.nodes
        .iter()
        .find(|n| n.address == address)
        .unwrap_or_else(|| panic!("{address} not listed: {view:#?}"))
}

/// Calls `nodes()` until `check` accepts the view; panics with `what` and the last view after
/// `within`. Every call must succeed.
async fn view_until(
    locks: &LockService,
    what: &str,
    within: Duration,
    check: impl Fn(&RedisNodes) -> bool,
) -> RedisNodes {
    let deadline = Instant::now() + within;
    loop {
        let view = locks.nodes().await.expect("nodes()");
        if check(&view) {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "not within {within:?}: {what}\n{view:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every node of the topology, with the expected role, all healthy (waiting a moment for a
/// transient cluster flag on a busy machine to clear).
async fn every_server_is_listed_healthy(fx: Fixture) {
    let locks = fx.service(SECS(30)).await;
    let topo = fx.topo();
    let view = view_until(
        &locks,
        "every node healthy",
        SECS(10),
        RedisNodes::all_healthy,
    )
    .await;
    assert_eq!(view.mode, fx.topology().mode());
    let masters = of_role(&view, NodeRole::Master);
    let replicas = of_role(&view, NodeRole::Replica);
    let sentinels = of_role(&view, NodeRole::Sentinel);
    match fx.kind() {
        Kind::Single => {
            assert_eq!(view.nodes.len(), 1, "{view:#?}");
            assert_eq!(masters, addrs([topo.master_port()]));
            assert!(view.nodes[0].latency.is_some());
        }
        Kind::MasterReplicas => {
            assert_eq!(view.nodes.len(), 3, "{view:#?}");
            assert_eq!(
                view.nodes[0].address,
                addr(topo.master_port()),
                "master first"
            );
            assert_eq!(masters, addrs([topo.master_port()]));
            assert_eq!(replicas, addrs(topo.replica_ports()));
            // every one of them was asked itself
            assert!(view.nodes.iter().all(|n| n.latency.is_some()), "{view:#?}");
            for replica in view.with_role(NodeRole::Replica) {
                assert_eq!(
                    replica.replica_of.as_deref(),
                    Some(&*addr(topo.master_port()))
                );
            }
        }
        Kind::Sentinel => {
            assert_eq!(view.nodes.len(), 6, "{view:#?}");
            assert_eq!(masters, addrs([topo.current_master()]));
            assert_eq!(replicas.len(), 2, "{view:#?}");
            assert_eq!(sentinels, addrs(topo.sentinel_ports()));
            let data_nodes: BTreeSet<String> = masters.union(&replicas).cloned().collect();
            assert_eq!(data_nodes, addrs(topo.node_ports()));
            assert!(
                view.with_role(NodeRole::Sentinel)
                    .all(|n| n.latency.is_some())
            );
            assert!(node(&view, &addr(topo.current_master())).latency.is_some());
        }
        Kind::Cluster => {
            assert_eq!(view.nodes.len(), 6, "{view:#?}");
            assert_eq!(masters.len(), 3, "{view:#?}");
            assert_eq!(replicas.len(), 3, "{view:#?}");
            let all: BTreeSet<String> = masters.union(&replicas).cloned().collect();
            assert_eq!(all, addrs(topo.node_ports()));
            // one replica per master, each after its master
            let followed: BTreeSet<String> = view
                .with_role(NodeRole::Replica)
                .map(|n| n.replica_of.clone().expect("a replica's master"))
                .collect();
            assert_eq!(followed, masters);
            for (i, n) in view.nodes.iter().enumerate() {
                if n.role == NodeRole::Replica {
                    assert_eq!(n.replica_of.as_ref(), Some(&view.nodes[i - 1].address));
                }
            }
            // one node answered, and its round trip is the latency
            assert_eq!(
                view.nodes.iter().filter(|n| n.latency.is_some()).count(),
                1,
                "{view:#?}"
            );
        }
    }
    assert!(
        view.nodes
            .iter()
            .all(|n| n.detail.is_none() || n.role == NodeRole::Replica)
    );
}

topology_tests!(every_server_is_listed_healthy);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_slave_a_killed_replica_is_unhealthy_and_the_call_succeeds() {
    let fx = Fixture::own(Spec::master_replicas()).await;
    let locks = LockService::connect(fx.config(SECS(30)).with_response_timeout(SECS(1)))
        .await
        .unwrap();
    let topo = fx.topo();
    let [killed, alive] = topo.replica_ports()[..] else {
        panic!("two replicas")
    };
    topo.kill(killed);
    let view = locks.nodes().await.expect("the call succeeds");
    assert_eq!(view.nodes.len(), 3, "{view:#?}");
    let down = node(&view, &addr(killed));
    assert_eq!(down.role, NodeRole::Replica, "as configured");
    assert!(!down.healthy);
    assert_eq!(down.latency, None);
    let why = down.detail.as_deref().unwrap();
    assert!(why.starts_with("not reachable"), "{why}");
    assert!(node(&view, &addr(alive)).healthy, "{view:#?}");
    assert!(node(&view, &addr(topo.master_port())).healthy, "{view:#?}");

    topo.restart(killed).await;
    view_until(&locks, "the restarted replica healthy", SECS(10), |v| {
        node(v, &addr(killed)).healthy
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_killed_sentinel_is_unhealthy_and_the_call_succeeds() {
    let fx = Fixture::own(Spec::sentinel()).await;
    let locks = LockService::connect(fx.config(SECS(30)).with_response_timeout(SECS(1)))
        .await
        .unwrap();
    let topo = fx.topo();
    let sentinel = topo.sentinel_ports()[0];
    topo.kill(sentinel);
    let view = locks.nodes().await.expect("the call succeeds");
    let down = node(&view, &addr(sentinel));
    assert_eq!(down.role, NodeRole::Sentinel);
    assert!(!down.healthy);
    let why = down.detail.as_deref().unwrap();
    assert!(why.starts_with("not reachable"), "{why}");
    assert_eq!(
        view.nodes.iter().filter(|n| !n.healthy).count(),
        1,
        "{view:#?}"
    );
    assert!(node(&view, &addr(topo.current_master())).healthy);

    // a replica that is gone drops out of its master's list
    let replica = topo.replica_ports()[0];
    topo.kill(replica);
    let view = view_until(
        &locks,
        "the killed replica no longer listed",
        SECS(10),
        |v| v.nodes.iter().all(|n| n.address != addr(replica)),
    )
    .await;
    assert_eq!(view.with_role(NodeRole::Replica).count(), 1, "{view:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_stopped_node_is_flagged_by_the_others() {
    let fx = Fixture::own(Spec::cluster()).await;
    let locks = fx.service(SECS(30)).await;
    let view = view_until(
        &locks,
        "every node healthy",
        SECS(10),
        RedisNodes::all_healthy,
    )
    .await;
    let replica = view
        .with_role(NodeRole::Replica)
        .next()
        .expect("a replica")
        .address
        .clone();
    let port: u16 = replica.rsplit_once(':').unwrap().1.parse().unwrap();

    let stopped = fx.stop(&[port]);
    // cluster-node-timeout is 2 s: pfail after it, fail once the masters agree
    let view = view_until(&locks, "the stopped node flagged", SECS(20), |v| {
        let n = node(v, &replica);
        !n.healthy
            && n.detail.as_deref().is_some_and(|d| {
                d.contains("fail") || d.starts_with("not reachable") || d.contains("link down")
            })
    })
    .await;
    let flagged = node(&view, &replica);
    assert_eq!(flagged.role, NodeRole::Replica, "{view:#?}");
    assert_eq!(view.nodes.len(), 6, "{view:#?}");

    drop(stopped);
    view_until(&locks, "the continued node healthy again", SECS(20), |v| {
        node(v, &replica).healthy
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_an_unreachable_server_is_an_error() {
    let fx = Fixture::own(Spec::Single).await;
    let locks = LockService::connect(fx.config(SECS(30)).with_response_timeout(SECS(1)))
        .await
        .unwrap();
    fx.topo().kill(fx.topo().master_port());
    let err = locks.nodes().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&addr(fx.topo().master_port())) && message.contains("not reachable"),
        "{message}"
    );
}
