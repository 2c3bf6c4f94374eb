//! Multi-key locks (`lock_all`) and what is built on them (segmented hot stock).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod keys;
mod segmented;
