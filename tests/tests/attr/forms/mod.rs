//! The forms `#[distributed_lock]` accepts, one module per form: each module's fns compile
//! as they are written there, and its test runs them under the lock on a real Redis and checks
//! that every body ran and returned its value.
//!
//! The forms it refuses, each a compile error at the offending token, are the trybuild cases
//! of `lock-macros/ui` (`tests/ui/fail`).

use lock_runtime::LockConfig;

use crate::common::Fixture;

mod async_trait_methods;
mod body_control_flow;
mod durations;
mod free_fn_with_all_arguments;
mod generics;
mod impl_trait_args;
mod keys_from_expressions;
mod kinds_and_keys;
// written as users write them, on one line: `cargo fmt` would spread them over three
#[rustfmt::skip]
mod one_line_bodies;
mod pattern_params;
mod positional_key_and_literal_braces;
mod receivers;
mod result_aliases_and_crate_path;
mod send_futures;
mod shadowed_names;
mod web_responses_and_aliases;

/// Sets up the global service, which every annotated fn uses, on this binary's single server
/// with the default settings.
async fn setup() {
    let fx = Fixture::single().await;
    lock_runtime::init(LockConfig::new(fx.topology()))
        .await
        .unwrap();
}
