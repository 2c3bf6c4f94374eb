//! The mutex (`LockService::lock`): its semantics on a single node, across OS processes, on
//! every topology, and its fair waiting and wake-ups (`waiting`, grants pushed across services in
//! `pushed`); what its operations cost Redis (`cost`);
//! and the blocking API (`blocking`).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod blocking;
mod cost;
mod processes;
mod pushed;
mod single_node;
mod topologies;
mod waiting;
