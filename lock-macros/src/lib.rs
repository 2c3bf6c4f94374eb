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
//! The body can also run under a read or write hold of a read-write lock (`kind = "read"` /
//! `"write"`), or under several locks taken all or none (`keys = [..]`):
//!
//! ```no_run
//! # use lock_runtime::{LockError, distributed_lock};
//! #[distributed_lock(key = "catalog:<shop>", kind = "read")]
//! async fn list_goods(shop: u64) -> Result<Vec<u64>, LockError> {
//!     // Runs alongside other readers of "catalog:<shop>", never alongside a writer.
//!     # let _ = shop;
//!     Ok(Vec::new())
//! }
//!
//! #[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "2s")]
//! async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), LockError> {
//!     // Runs holding both accounts' locks; transfer(a, b) and transfer(b, a) cannot deadlock.
//!     # let _ = (from, to, amount);
//!     Ok(())
//! }
//! ```
//!
//! See [`distributed_lock`] for the arguments, the key syntax and the generated code.

mod args;
mod duration;
mod expand;
mod key;

use proc_macro::TokenStream;

/// Runs an `async fn` only while holding the distributed lock named by its `key` (or the locks
/// named by its `keys`).
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
/// | `key`     | key template, see below                     | - (`key` or `keys` is required)    |
/// | `keys`    | array of key templates: several locks       | - (`key` or `keys` is required)    |
/// | `kind`    | `"lock"`, `"read"` or `"write"`; with `key` | `"lock"`: the mutex                |
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
///   pattern "run it here unless another instance already does". This holds for every `kind`
///   and for `keys` (which then gives back the locks it did take).
/// - `on_lost`: what happens when the lock is lost while the body runs (the watchdog found it
///   gone, or a fixed `lease` ran out; with `keys`, any one of the locks). `"fail"` stops the
///   body and returns `Err(E::from(lost error))`; `"continue"` lets the body finish and logs a
///   warning.
/// - `crate`: for crates that reach the runtime under another path (re-exports, renamed
///   dependencies).
///
/// # Kind
///
/// `kind` says which lock of `key` the body runs under, as the runtime's `LockService` method
/// of the same name takes it:
///
/// - `"lock"` (the default, so usually left out): the mutex `key`, one holder at a time
///   (`LockService::lock`).
/// - `"read"`: a read hold of the read-write lock `key`: any number of readers at once, no
///   writer meanwhile (`LockService::read`). A waiting writer stops new readers.
/// - `"write"`: the write hold of the read-write lock `key`: no other writer and no reader
///   meanwhile (`LockService::write`).
///
/// The read-write lock `key` and the mutex `key` are different locks (different Redis keys):
/// a `kind = "write"` fn does not exclude a fn with the same `key` and no `kind`. Nested calls
/// of the same call chain re-enter: a `"read"` fn called from the body of a `"write"` fn on the
/// same key runs at once (a downgrade); the other way round would be an upgrade, refused with a
/// `WouldDeadlock` error instead of waiting for itself. Inside the body,
/// `lock_runtime::current_fence()` is the token of the write hold (`None` in a read body: a
/// read share does not make fenced writes).
///
/// ```no_run
/// # use lock_runtime::{LockError, distributed_lock};
/// # struct Price;
/// #[distributed_lock(key = "prices:<region>", kind = "read", wait = "1s")]
/// async fn quote(region: &str, goods_id: u64) -> Result<Price, LockError> {
///     # let _ = (region, goods_id);
///     Ok(Price)
/// }
///
/// #[distributed_lock(key = "prices:<region>", kind = "write", lease = "30s")]
/// async fn reprice(region: &str) -> Result<(), LockError> {
///     # let _ = region;
///     Ok(())
/// }
/// ```
///
/// # Several keys
///
/// `keys = ["..", ".."]` instead of `key` runs the body holding every one of the mutexes its
/// templates name (`LockService::lock_all`). They are taken all or none, one after another in
/// the order of their Redis keys - the same order in every process, whatever order they are
/// listed in - so two calls locking the same accounts in opposite order cannot deadlock. `wait`
/// covers taking all of them; when it runs out, the locks already taken are released and the
/// body does not run. A key listed twice (two placeholders with the same value) is locked once.
///
/// ```no_run
/// # use lock_runtime::{LockError, distributed_lock};
/// #[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "2s", lease = "10s")]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), LockError> {
///     // the token of the first lock taken, the same account whichever way the money goes
///     let fence = lock_runtime::current_fence();
///     # let _ = (from, to, amount, fence);
///     Ok(())
/// }
/// ```
///
/// - Only mutexes lock several keys: `keys` with `kind = "read"` or `"write"` is a compile
///   error (`kind = "lock"` is accepted).
/// - Each template is checked like `key`; a mistake points at the template it is in.
/// - Inside the body, a nested lock call on any of the keys re-enters its hold.
///   `lock_runtime::current_fence()` and `current_lock_key()` read the first lock in the order
///   they were taken (the one whose Redis key sorts first), so `transfer(a, b)` and
///   `transfer(b, a)` report the same account's lock. For the token of each lock, take them
///   with `LockService::lock_all` and read `MultiGuard::fence`.
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
/// The template as written (`goods:<id>`; with `keys`, the templates joined with `,`) names the
/// lock in metrics and events (the `key` label of `lock_runtime::metrics`): one time series
/// per annotated fn, never one per goods.
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
/// let __lock_spec = __private::LockSpec {
///     locks: __private::Locks::Lock(__lock_key),
///     metric_label: "goods:<id>",
///     ..
/// };
/// __private::run_locked(__lock_spec, async move { /* body */ }).await
/// ```
///
/// (`Locks::Read` / `Locks::Write` by `kind`; with `keys`, `Locks::All` of a `Vec` of keys
/// built the same way.)
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
