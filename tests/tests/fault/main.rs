//! Faults: servers killed, restarted, failed over or stalled under the locks, lost replies
//! between a service and a cluster, the safety promises under single faults, and calls bounded
//! by timeouts.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod cluster_replies;
mod nodes;
mod safety;
mod timeouts;
