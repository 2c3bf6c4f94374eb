//! The engine every lock kind runs on: acquire with waiting (`acquire`), release with hand-off
//! and give-back of grants nobody will use (`release`), shared script calls (`batch`), the
//! in-process holds, waiter lines and hand-offs (`local`, `line`, `handoff`), the guard core
//! (`guard`), renewal (`watchdog`), wake-ups (`notify`) and the service's graceful end
//! (`shutdown`). It knows no kind: a kind describes itself with a [`Kind`] (its scripts,
//! whether its holds are shared, re-entrant, handed off) and the engine does the rest.
//!
//! Redis calls that change lock state run in their own tasks and report back over a channel, so
//! cancelling the caller's future never loses a reply: a grant that arrives after its caller left
//! is released right away, and a release always completes its bookkeeping.

mod acquire;
mod all_at_once;
mod batch;
mod batcher;
mod core;
pub(crate) mod guard;
mod handoff;
mod holds;
mod ids;
mod kind;
mod line;
pub(crate) mod local;
pub(crate) mod names;
pub(crate) mod notify;
pub(crate) mod presence;
pub(crate) mod push;
mod registered;
mod release;
pub(crate) mod reply;
pub(crate) mod shutdown;
mod target;
pub(crate) mod watchdog;

pub(crate) use self::acquire::CallSite;
pub(crate) use self::batcher::MAX_OPS;
pub(crate) use self::core::Engine;
pub(crate) use guard::Guard;
pub(crate) use kind::Kind;
#[cfg(test)]
pub(crate) use kind::MAX_KINDS;
pub(crate) use names::KeyNames;
pub(crate) use target::Target;
