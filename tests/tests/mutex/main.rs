//! The mutex (`LockService::lock`): its semantics on a single node, across OS processes, and
//! the same semantics on every topology.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod processes;
mod single_node;
mod topologies;
