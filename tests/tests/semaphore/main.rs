//! The semaphore (`LockService::semaphore`) against real Redis, a module per promise: at most N
//! permits held at any time across services, `acquire_many` all or nothing, `available()` as
//! held, and invalid counts refused before anything is written (`permits`); permits that come
//! back with their lease when a holder crashes or stops, and watched permits renewed while held
//! and no longer once dropped (`leases`); waiters woken by releases without polling (`waiting`);
//! releases that hand their permits to the waiters of their own service, no more than that
//! service's share while others wait (`hand_offs`); cancelled acquires that give back what
//! Redis granted them (`cancellation`); and at most N permits while a fault proxy drops and
//! delays replies (`faults`). What several of them use is in `support` and `contention`.
//!
//! A semaphore `name` is the hash `lock:sem:{name}` on Redis (one field `p:<grant id>` per
//! grant), with `:wq` and the channel `:ch` after it, and the fence counter it draws
//! its tokens from (its slot's on a cluster, the server's one otherwise).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod cancellation;
mod contention;
mod faults;
mod hand_offs;
mod leases;
mod permits;
mod support;
mod waiting;
