#!/usr/bin/env bash
# The standing mutation check of the lock engine: cargo-mutants changes the engine's code one
# mutation at a time (lock-runtime/src/engine/: acquire, release, local, line, holds, batch,
# guard, watchdog: the release, give-back, renewal and hand-off paths by default) and runs the single-node suites against each; a mutant that no test
# catches is "missed". Installs cargo-mutants with cargo when it is missing, and Redis with apt
# through scripts/test.sh's rules.
#
#   bash scripts/mutants.sh            # release, give-back, renewal and hand-off paths
#   bash scripts/mutants.sh --all      # every function of the engine files (hours on 2 cores)
#
# Results: mutants.out/ (missed.txt, caught.txt, timeout.txt, unviable.txt).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! cargo mutants --version >/dev/null 2>&1; then
    echo "==> installing cargo-mutants (cargo install, a few minutes)"
    cargo install cargo-mutants --locked
fi
if ! command -v redis-server >/dev/null 2>&1; then
    echo "==> installing redis-server redis-sentinel redis-tools (apt)"
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        redis-server redis-sentinel redis-tools
fi

files=(
    -f lock-runtime/src/engine/acquire.rs
    -f lock-runtime/src/engine/release.rs
    -f lock-runtime/src/engine/local.rs
    -f lock-runtime/src/engine/line.rs
    -f lock-runtime/src/engine/holds.rs
    -f lock-runtime/src/engine/batch.rs
    -f lock-runtime/src/engine/batcher.rs
    -f lock-runtime/src/engine/guard.rs
    -f lock-runtime/src/engine/watchdog.rs
)
select=(-F 'release|give_back|renew|hand|drop_grant|add_guard|leave|end_release|begin_release')
if [ "${1:-}" = "--all" ]; then
    select=()
fi

# The single-node suites; the partition test is left out (it takes ~10 s and is about lost(),
# which the guard tests cover too). The baseline is checked here rather than by cargo-mutants,
# whose baseline runs only the mutated package's own tests (none of these).
echo "==> baseline: the suites pass on the unmutated tree"
suites='(binary(mutex) & test(/^single_node::/)) | (binary(attr) & test(/^call_chains::/))
    | (binary(fault) & test(/^safety::/) & !test(partitioned))'
cargo nextest run -p lock-tests -E "$suites"
exec cargo mutants "${files[@]}" "${select[@]}" \
    --baseline=skip --test-package=lock-tests --test-tool nextest --timeout 180 \
    -- -E "$suites"
