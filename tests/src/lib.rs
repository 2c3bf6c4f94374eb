//! Integration tests of `lock-runtime` against real `redis-server` processes.
//!
//! The library part of this crate is the [`harness`]: it starts single-node, master-replicas,
//! sentinel and cluster topologies on free loopback ports and tears them down again. The test
//! suites live in `tests/tests/`.
//!
//! Quick start:
//!
//! ```no_run
//! use lock_tests::harness::{Kind, shared, unique_key};
//!
//! # async fn demo() {
//! let topo = shared(Kind::Single).await;
//! let key = unique_key("demo");
//! let mut con = topo.conn(topo.master_port());
//! let _: () = redis::cmd("SET").arg(&key).arg(1).query(&mut con).unwrap();
//! # }
//! ```
//!
//! [`history`] checks what lock workers in several processes recorded while faults were injected
//! (overlapping critical sections, stale writes a fenced resource accepted) and prints the
//! fault table of `tests/tests/fault/nodes.rs`.
//!
//! Run everything with `bash scripts/test.sh`; it installs the Redis binaries when they are
//! missing.

pub mod harness;
pub mod history;
