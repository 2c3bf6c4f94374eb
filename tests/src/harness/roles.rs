//! Who is master now: sentinel and cluster queries, and waiting for a failover to finish.

use std::sync::Arc;
use std::time::Duration;

use super::node::NodeKind;
use super::topology::blocking;
use super::{Topology, cluster, sentinel, util};

impl Topology {
    /// The master port named by most sentinels (`SENTINEL GET-MASTER-ADDR-BY-NAME mymaster`).
    ///
    /// # Panics
    ///
    /// If this is not a sentinel topology, or no sentinel answers.
    pub fn current_master(&self) -> u16 {
        assert!(
            !self.inner.sentinels.is_empty(),
            "current_master() needs a sentinel topology, this is {:?}",
            self.inner.spec
        );
        sentinel::vote(&self.inner.sentinels).unwrap_or_else(|| {
            panic!(
                "no sentinel answered GET-MASTER-ADDR-BY-NAME {}",
                sentinel::MASTER_NAME
            )
        })
    }

    /// Waits until every running sentinel names the same master other than `old` and that
    /// server reports `role:master`; returns its port.
    ///
    /// # Panics
    ///
    /// After `timeout`, with the sentinels' log tails.
    pub async fn wait_for_new_master(&self, old: u16, timeout: Duration) -> u16 {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let found = util::poll_until(timeout, || {
                sentinel::agreed_new_master(&inner.running(NodeKind::Sentinel), old)
            });
            found.unwrap_or_else(|waited| {
                panic!(
                    "no new master replaced {old} within {waited:?}; sentinels say {:?}\n{}",
                    inner
                        .sentinels
                        .iter()
                        .map(|&s| sentinel::master_addr(s))
                        .collect::<Vec<_>>(),
                    inner.log_tails(NodeKind::Sentinel)
                )
            })
        })
        .await
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    ///
    /// # Panics
    ///
    /// If no running node answers, or this is not a cluster.
    pub fn key_slot(&self, key: &str) -> u16 {
        self.inner
            .running(NodeKind::Server)
            .into_iter()
            .find_map(|p| util::query(p, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).ok())
            .unwrap_or_else(|| panic!("no cluster node answered CLUSTER KEYSLOT {key}"))
    }

    /// The port of the master serving `slot`, from `CLUSTER NODES` of the first running node
    /// that answers. During a failover that node's view may lag; see
    /// [`Topology::wait_for_new_slot_owner`].
    ///
    /// # Panics
    ///
    /// If no running node answers or no master serves `slot`.
    pub fn master_for_slot(&self, slot: u16) -> u16 {
        self.inner
            .running(NodeKind::Server)
            .into_iter()
            .find_map(|p| cluster::slot_owner(p, slot, &self.inner.announced))
            .unwrap_or_else(|| panic!("no cluster node reports a master for slot {slot}"))
    }

    /// Waits until every running node reports `cluster_state:ok` and names the same master
    /// other than `old` for `slot`, and that node reports `role:master`; returns its port.
    ///
    /// # Panics
    ///
    /// After `timeout`, with the nodes' log tails.
    pub async fn wait_for_new_slot_owner(&self, slot: u16, old: u16, timeout: Duration) -> u16 {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            let found = util::poll_until(timeout, || {
                let running = inner.running(NodeKind::Server);
                let announced = &inner.announced;
                let owner = cluster::slot_owner(*running.first()?, slot, announced)?;
                let healed = owner != old
                    && util::role(owner).as_deref() == Some("master")
                    && running.iter().all(|&p| {
                        cluster::node_ok(p, None)
                            && cluster::slot_owner(p, slot, announced) == Some(owner)
                    });
                healed.then_some(owner)
            });
            found.unwrap_or_else(|waited| {
                panic!(
                    "slot {slot} did not move away from {old} within {waited:?}\n{}",
                    inner.log_tails(NodeKind::Server)
                )
            })
        })
        .await
    }
}
