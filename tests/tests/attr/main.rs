//! The `#[distributed_lock]` attribute against a real Redis: the body under the lock, the
//! other kinds, re-entry along call chains, a service started without configuration, and
//! every form of fn the attribute accepts.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod body;
mod call_chains;
mod first_hour;
mod forms;
mod kinds;
