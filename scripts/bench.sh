#!/usr/bin/env bash
# Benchmarks lock-runtime against a raw redis-crate lock on a redis-server of its own (a free
# loopback port; any system redis service is left alone). Arguments go to the bench binary:
#   bash scripts/bench.sh            # full run, release build
#   bash scripts/bench.sh --quick    # a few seconds
# Installs redis-server / redis-sentinel / redis-cli with apt when redis-server is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v "${REDIS_SERVER_BIN:-redis-server}" >/dev/null 2>&1; then
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        sudo=(sudo)
    fi
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y \
        redis-server redis-sentinel redis-tools
fi

exec cargo run --release -p lock-bench -- "$@"
