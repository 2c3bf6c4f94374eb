//! The `#[distributed_lock]` attribute of [`lock_runtime`](https://docs.rs/lock-runtime).
//!
//! Depend on `lock-runtime`, not on this crate: it re-exports the attribute as
//! `lock_runtime::distributed_lock`, documented there with examples (they are compiled and
//! checked as lock-runtime's doctests), and the code the attribute generates calls into it.
//!
//! ```text
//! #[distributed_lock(key = "goods:<id>", lease = "5s", wait = "2s")]
//! async fn decrease_stock(id: u64, qty: u32) -> Result<u32, AppError> {
//!     // Runs only while this process holds the lock "goods:<id>".
//! }
//! ```

mod args;
mod duration;
mod expand;
mod key;

use proc_macro::TokenStream;

/// The `#[distributed_lock]` attribute, defined in the `lock-macros` crate and re-exported, with
/// its documentation and examples, as
/// [`lock_runtime::distributed_lock`](https://docs.rs/lock-runtime/latest/lock_runtime/attr.distributed_lock.html):
/// depend on `lock-runtime`, the code the attribute generates calls into it.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
