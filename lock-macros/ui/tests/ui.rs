//! Compile-time behaviour of `#[distributed_lock]`: every `pass` case compiles (and its trivial
//! `main` runs), every `fail` case is exactly the one error in its `.stderr` file.
//!
//! After changing a message, regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p lock-macros-ui --test ui` and review the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
