//! Tests of the test harness: its topologies (`servers`) and its fault proxy (`proxy`); and of
//! the workspace itself (`workspace`: what the published crates promise about their build).

mod proxy;
mod servers;
mod workspace;
