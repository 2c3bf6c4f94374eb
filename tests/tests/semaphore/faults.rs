//! At most N permits held while replies are lost: a fault proxy in front of a single server, or
//! of the cluster master serving the semaphore, drops, delays and resets; every error is a
//! `Backend` error or a `Timeout`, and nothing is stranded afterwards.

use std::time::Duration;

use crate::common::behind_proxy;
use crate::contention::{Load, assert_at_most_n, contend};
use crate::support::{LONG, sem_hash};
use lock_runtime::{ErrorKind, LockConfig, LockService, Topology as LockTopology};
use lock_tests::harness::{Spec, Topology, unique_key};
use rand::Rng;

/// A semaphore of 2 permits, three services (two through a fault proxy, one direct) x four
/// tasks, while the proxy delays replies and requests by varying amounts, drops replies
/// (resetting the connection: Redis ran the call, the caller never hears of it) and resets
/// connections: never more than 2 permits held, every error a `Backend` error or a `Timeout`,
/// and nothing stranded afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_permits_while_a_proxy_drops_and_delays_replies() {
    let configure = |c: LockConfig| {
        c.with_response_timeout(Duration::from_secs(1))
            .with_watchdog_timeout(LONG)
    };
    let (fx, proxy, first) = behind_proxy(configure).await;
    let second = LockService::connect(configure(LockConfig::single(proxy.url())))
        .await
        .unwrap();
    let direct = fx.service(LONG).await;
    let services = vec![first, second, direct.clone()];
    let name = unique_key("sem-faults");
    let load = Load {
        permits: 2,
        tasks: 4,
        rounds: 8,
        lease: LONG,
        wait: Duration::from_secs(5),
        work: Duration::from_millis(5),
    };
    let faults = async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut armed = 0;
        for i in 0u64.. {
            tick.tick().await;
            match i % 10 {
                0 => proxy.set_latency(Duration::from_millis(rand::rng().random_range(0..150))),
                3 => proxy
                    .set_request_latency(Duration::from_millis(rand::rng().random_range(0..80))),
                7 => {
                    proxy.set_latency(Duration::ZERO);
                    proxy.set_request_latency(Duration::ZERO);
                }
                9 if i % 40 == 9 => {
                    proxy.reset_all().await;
                }
                _ => {}
            }
            // a drop every other tick: the calls between the drops get through
            if i % 2 == 0 && proxy.replies_dropped() >= armed {
                proxy.drop_next_reply();
                armed += 1;
            }
        }
    };
    let tally = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::select! {
            tally = contend(&services, &direct, &name, load) => tally,
            () = faults => unreachable!(),
        }
    })
    .await
    .expect("the contending tasks did not finish within 120 s");
    proxy.heal();
    println!("{} replies dropped", proxy.replies_dropped());
    assert!(proxy.replies_dropped() > 0, "no reply was dropped");
    let unexpected: Vec<_> = tally
        .errors
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, kind, _)| !matches!(kind, ErrorKind::Backend | ErrorKind::Timeout))
        .cloned()
        .collect();
    assert!(
        unexpected.is_empty(),
        "errors other than Backend / Timeout: {unexpected:?}"
    );
    assert_at_most_n(Some(&fx), &direct, &name, load, &tally).await;
}

/// The same on a Redis Cluster whose nodes sit behind proxies: the proxy of the master serving
/// the semaphore drops a reply every ~50 ms and delays the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_permits_in_a_cluster_while_replies_are_lost() {
    let topo = Topology::start(Spec::proxied_cluster()).await;
    let connect = |nodes: Vec<String>| async move {
        let config = LockConfig::new(LockTopology::Cluster { nodes })
            .with_response_timeout(Duration::from_secs(1))
            .with_watchdog_timeout(LONG);
        LockService::connect(config).await.expect("connect")
    };
    let services = vec![
        connect(topo.proxied_node_urls()).await,
        connect(topo.proxied_node_urls()).await,
        connect(topo.node_urls()).await,
    ];
    let name = unique_key("sem-cluster-faults");
    let master = topo.master_for_slot(topo.key_slot(&sem_hash(&name)));
    let proxy = topo.proxy_for(master);
    let load = Load {
        permits: 2,
        tasks: 4,
        rounds: 8,
        lease: LONG,
        wait: Duration::from_secs(5),
        work: Duration::from_millis(5),
    };
    let faults = async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut armed = 0;
        for i in 0u64.. {
            tick.tick().await;
            if i % 10 == 0 {
                proxy.set_latency(Duration::from_millis(rand::rng().random_range(0..100)));
            }
            if proxy.replies_dropped() >= armed {
                proxy.drop_next_reply();
                armed += 1;
            }
        }
    };
    let sampler = services[2].clone();
    let tally = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::select! {
            tally = contend(&services, &sampler, &name, load) => tally,
            () = faults => unreachable!(),
        }
    })
    .await
    .expect("the contending tasks did not finish within 120 s");
    proxy.heal();
    println!("{} replies dropped", proxy.replies_dropped());
    assert!(proxy.replies_dropped() > 0, "no reply was dropped");
    let unexpected: Vec<_> = tally
        .errors
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, kind, _)| !matches!(kind, ErrorKind::Backend | ErrorKind::Timeout))
        .cloned()
        .collect();
    assert!(
        unexpected.is_empty(),
        "errors other than Backend / Timeout: {unexpected:?}"
    );
    assert_at_most_n(None, &sampler, &name, load, &tally).await;
    let mut con = topo.conn(master);
    let exists: bool = redis::cmd("EXISTS")
        .arg(sem_hash(&name))
        .query(&mut con)
        .unwrap();
    assert!(!exists, "the semaphore's hash is gone with its last grant");
}
