//! Compile errors of `#[distributed_lock]`: every case in `tests/ui/fail` fails to compile with
//! exactly the error in its `.stderr` file, pointing at the offending token.
//!
//! The forms the attribute accepts are compiled and run as ordinary code in the attribute
//! tests of lock-tests (`tests/tests/attr/forms/`). With compile-fail cases only, trybuild
//! checks them with `cargo check`, so its own build of lock-runtime and its dependencies
//! (`target/tests/trybuild`) is metadata only, without code generation.
//!
//! After changing a message, regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p lock-macros-ui --test ui` and review the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
}
