//! The mutex (`LockService::lock`): its semantics on a single node, across OS processes, on
//! every topology, and its fair waiting and wake-ups.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod processes;
mod single_node;
mod topologies;
mod waiting;
