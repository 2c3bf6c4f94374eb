//! What every kind of hold shares: smoke checks of the family, `extend`, and fenced writes.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod extend;
mod fenced;
mod smoke;
