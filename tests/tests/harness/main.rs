//! Tests of the test harness: its topologies (`servers`) and its fault proxy (`proxy`).

mod proxy;
mod servers;
