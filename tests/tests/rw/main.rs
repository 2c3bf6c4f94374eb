//! The read-write lock (`LockService::read`, `LockService::write`) against real Redis, one
//! module per promise: readers share, a writer excludes readers and writers (`exclusion`); a
//! waiting writer stops new readers, so writers do not starve, also when it waits past its
//! registration, and a dead writer's registration does not stall a live writer (`preference`);
//! downgrade inside a write body, a reader still re-enters its own share, upgrades refused
//! (`reentry`); one lease per reader, a crashed reader's share runs out, extend after a loss
//! (`leases`); wake-ups: a write release wakes every waiting reader or one writer head per
//! service, readers kept out sleep until woken, a reader waiting past its registration is
//! woken by the release (`wakeups`); write fencing tokens (`fencing`); cancellation
//! (`cancel`); and exclusion through a faulty network (`faults`). What several of them use is
//! in `support`.
//!
//! Exclusion is checked on a shared resource with concurrency counters (`Room`), never by
//! timing. The exclusion, writer-preference and wake-up checks run on every topology (see
//! `topology_tests!` at the end of `exclusion`, `preference` and `wakeups`).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod cancel;
mod exclusion;
mod faults;
mod fencing;
mod leases;
mod preference;
mod reentry;
mod support;
mod wakeups;
