//! The `#[distributed_lock]` attribute of [`lock_runtime`](https://docs.rs/lock-runtime).
//!
//! Depend on `lock-runtime`, not on this crate: it re-exports the attribute as
//! `lock_runtime::distributed_lock`, and the code the attribute generates calls into it.
//!
//! ```no_run
//! use lock_runtime::{LockError, distributed_lock};
//!
//! #[derive(Debug)]
//! enum AppError {
//!     Lock(LockError),
//!     OutOfStock,
//! }
//!
//! impl From<LockError> for AppError {
//!     fn from(error: LockError) -> Self {
//!         AppError::Lock(error)
//!     }
//! }
//!
//! #[distributed_lock(key = "goods:<id>", lease = "5s", wait = "2s")]
//! async fn decrease_stock(id: u64, qty: u32) -> Result<u32, AppError> {
//!     // Runs only while this process holds the lock "goods:<id>".
//!     # let stock: u32 = 10;
//!     stock.checked_sub(qty).ok_or(AppError::OutOfStock)
//! }
//! ```
//!
//! See [`distributed_lock`] for the arguments, the key syntax and the generated code.

mod args;
mod duration;
mod expand;
mod key;

use proc_macro::TokenStream;

/// Runs an `async fn` only while holding the distributed lock named by its `key`.
///
/// ```no_run
/// use lock_runtime::{LockError, distributed_lock};
/// # #[derive(Debug)]
/// # struct AppError;
/// # impl From<LockError> for AppError {
/// #     fn from(_: LockError) -> Self { AppError }
/// # }
/// # async fn load_stock(_: u64) -> Result<u32, AppError> { Ok(10) }
/// # struct Path<T>(T);
/// # struct Json<T>(T);
/// # struct Receipt;
/// # struct CurrentUser { id: u64 }
/// # struct Shop { id: u64 }
///
/// #[distributed_lock(key = "goods:<id>", lease = "5s", wait = "2s")]
/// async fn decrease_stock(id: u64, qty: u32) -> Result<u32, AppError> {
///     let stock = load_stock(id).await?;
///     Ok(stock - qty)
/// }
///
/// // Placeholders name any binding of the parameters, including pattern parameters such as
/// // axum extractors, and fields of them.
/// #[distributed_lock(key = "order:<order_id>:user:<user.id>")]
/// async fn pay(Path(order_id): Path<u64>, user: CurrentUser) -> Result<Json<Receipt>, AppError> {
///     # let _ = (order_id, user);
///     Ok(Json(Receipt))
/// }
///
/// impl Shop {
///     #[distributed_lock(key = "shop:<self.id>:goods:<goods_id>", lease = "500ms")]
///     async fn sell(&self, goods_id: u64) -> Result<(), AppError> {
///         // The fencing token of this hold, to store next to the data it protects.
///         let fence = lock_runtime::current_fence();
///         # let _ = (goods_id, fence);
///         Ok(())
///     }
/// }
/// ```
///
/// # Arguments
///
/// | argument  | value                                       | default                            |
/// |-----------|---------------------------------------------|------------------------------------|
/// | `key`     | key template, see below (required)          | -                                  |
/// | `lease`   | duration: the lock expires after it         | none: the watchdog renews the lock |
/// | `wait`    | duration, or `"forever"`                    | the config's `default_wait`        |
/// | `on_lost` | `"fail"` or `"continue"`                    | `"fail"`                           |
/// | `crate`   | path of the runtime crate, e.g. `"::deps::lock_runtime"` | `"::lock_runtime"`    |
///
/// Every value is a string literal. Durations use the grammar of the config file: a number
/// (fractions allowed) and a unit, no spaces: `ms`, `s`, `m`, `h` or `d` (`"500ms"`, `"1.5s"`,
/// `"2m"`, `"1h"`, `"7d"`). Redis expires keys in milliseconds, so a duration must be a whole
/// number of them. A zero lease, an unknown unit and a value above `u64::MAX` milliseconds are
/// compile errors.
///
/// - `wait`: how long the call waits for the lock. When it runs out the body does not run and
///   the fn returns `Err(E::from(timeout error))`. `wait = "0s"` tries once: the scheduled-job
///   pattern "run it here unless another instance already does".
/// - `on_lost`: what happens when the lock is lost while the body runs (the watchdog found it
///   gone, or a fixed `lease` ran out). `"fail"` stops the body and returns
///   `Err(E::from(lost error))`; `"continue"` lets the body finish and logs a warning.
/// - `crate`: for crates that reach the runtime under another path (re-exports, renamed
///   dependencies).
///
/// # Key
///
/// Literal text plus placeholders: `<name>` or `<name.field.field>` (tuple fields as numbers,
/// `<pair.0>`). `name` is `self` or any name bound by the fn's parameters, also inside
/// patterns (`Path(order_id): Path<u64>`, `(a, b): (u8, u8)`, `Point { x, .. }: Point`).
/// Values are formatted with `Display`; a value that is not `Display` is a compile error at the
/// placeholder. `<<` is a literal `<`; `{` and `}` are plain text, so a Redis cluster hash tag
/// such as `"{order}:<id>"` is kept. The key is built before the body runs, from borrows of
/// the arguments.
///
/// The template as written (`goods:<id>`) names the lock in metrics and events (the `key`
/// label of `lock_runtime::metrics`): one time series per annotated fn, never one per goods.
///
/// # Requirements
///
/// - An `async fn` with a body: a free fn, a method with any receiver, generic, with
///   `impl Trait` or pattern parameters; also a method of an `#[async_trait]` impl (the
///   impl's attribute rewrites it first; the lock is taken inside the boxed future it returns).
/// - Its return type can carry a lock error: acquisition errors (timeout, lost lock, backend
///   errors) are returned through it.
///   - `Result<T, E>` where `E: From<lock_runtime::LockError>` (also `std::result::Result`,
///     and one-argument aliases such as `anyhow::Result<T>` or `io::Result<T>`: the bound is
///     checked on the error type, at the error type);
///   - any other type implementing the runtime's output trait, checked by the compiler as a
///     whole: result aliases of any name (`AppResult<T>`), axum's `Response` (feature `tower`)
///     and actix-web's `HttpResponse` (feature `actix-web`), where the lock error becomes the
///     response (409 for a timeout, 503 when Redis is unavailable);
///   - not `impl Trait` (write `Result<impl IntoResponse, LockError>` instead), and not a tuple
///     error type such as `(StatusCode, String)`, which can never implement `From<LockError>`:
///     both are compile errors that say what to write.
///
/// Each mistake is one compile error pointing at the offending token; the fn is then left as
/// it was, so nothing else is reported.
///
/// # Generated code
///
/// The signature, attributes, docs, visibility, generics and receiver are kept; the body
/// becomes (with `__private` standing for `::lock_runtime::__private`)
///
/// ```ignore
/// let __lock_key = ::std::format!("goods:{}", ToString::to_string(__private::key_part(&id)));
/// let __lock_spec = __private::LockSpec { key: __lock_key, metric_label: "goods:<id>", .. };
/// __private::run_locked(__lock_spec, async move { /* body */ }).await
/// ```
///
/// `run_locked` acquires the lock through the global registry, runs the body as the locked body
/// of the call chain (so a nested annotated call on the same key re-enters, while concurrent
/// calls - also `join!`ed ones - exclude each other) and releases
/// the lock after it, also on `?` early returns; a panic or a cancelled call releases in the
/// background. `?` and `return` in the body behave as before. The fn's future is `Send` when
/// it was `Send` without the attribute.
///
/// Set `LOCK_MACROS_DEBUG=1` (or `LOCK_MACROS_DEBUG=<fn name>`) while compiling to print the
/// expansion to stderr. Cargo does not rebuild when only that variable changes: touch the file
/// or run `cargo clean -p <your crate>` first.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
