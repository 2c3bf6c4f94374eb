//! Operating the locks: introspection, metrics and events, tracing spans, what locks leave
//! on Redis, and the global registry.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
#[path = "../web_common/mod.rs"]
mod web_common;

mod inspect;
mod leftovers;
mod metrics;
mod nodes;
mod operators;
mod registry;
mod tracing_spans;
