#!/usr/bin/env bash
# Full check of the workspace: format, lints, docs, then every test against real Redis
# processes started by the harness in lock-tests (it picks its own free ports and leaves any
# system redis service alone).
#
# Installs redis-server / redis-sentinel / redis-cli, and chromium / chromedriver (the console
# test of lockctl), with apt when they are missing. Uses
# cargo-nextest (profile `ci` when $CI is set), installing it with cargo when it is missing: the
# suites need its process per test (tests of one binary set up process-wide state - the global
# lock service, the environment, the current directory - each its own way).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() {
    printf '\n==> %s\n' "$*"
}

have() {
    command -v "$1" >/dev/null 2>&1
}

apt_updated=0
# apt_install PACKAGE...: installs Debian packages (as root, or through sudo).
apt_install() {
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if have sudo; then
            sudo=(sudo)
        else
            echo "$* missing and this is not root (no sudo): install $*" >&2
            exit 1
        fi
    fi
    step "installing $* (apt)"
    if [ "$apt_updated" -eq 0 ]; then
        ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update
        apt_updated=1
    fi
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

install_redis() {
    apt_install redis-server redis-sentinel redis-tools
}

needs_redis=0
for bin in "${REDIS_SERVER_BIN:-redis-server}" "${REDIS_CLI_BIN:-redis-cli}"; do
    have "$bin" || needs_redis=1
done
# The harness can run sentinels as `redis-server --sentinel`, but the package is cheap.
if [ -z "${REDIS_SENTINEL_BIN:-}" ] && ! have redis-sentinel; then
    needs_redis=1
fi
if [ "$needs_redis" -eq 1 ]; then
    install_redis
fi
step "redis: $("${REDIS_SERVER_BIN:-redis-server}" --version)"

# lockctl's console test drives headless Chromium through chromedriver (WebDriver).
if ! have "${CHROMIUM_BIN:-chromium}" || ! have "${CHROMEDRIVER_BIN:-chromedriver}"; then
    apt_install chromium chromium-driver
fi
step "browser: $("${CHROMIUM_BIN:-chromium}" --version 2>/dev/null || true)"

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# The documented crates; the test, example and bench crates are checked by clippy above.
step "cargo doc --no-deps, the published crates and lockctl (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p lock-runtime -p lock-macros -p lock-duration -p lockctl

step "bash scripts/demo.sh --quick (the lock must prevent the oversell the unlocked endpoint shows)"
bash scripts/demo.sh --quick

step "lock-bench --quick (keeps the bench compiling and running; numbers are never asserted)"
# --bin, not -p lock-bench: features resolved for the whole workspace, so the bench reuses the
# dependencies the demo built (with -p, tokio, redis and actix are compiled again).
cargo run --bin lock-bench -- --quick

if ! cargo nextest --version >/dev/null 2>&1; then
    step "installing cargo-nextest (cargo install, a few minutes)"
    cargo install cargo-nextest --locked
fi
profile=default
if [ -n "${CI:-}" ]; then
    profile=ci
fi
# Doctests first: nextest does not run them, and its summary should be the last word.
step "cargo test --workspace --doc"
cargo test --workspace --doc
step "cargo nextest run --workspace --profile $profile"
cargo nextest run --workspace --profile "$profile"
