#!/usr/bin/env bash
# The flash-sale demo: three shop instances (separate processes: two on axum, one on actix-web)
# sell goods with stock 10 from one Redis while a few thousand concurrent purchases arrive, first
# through the endpoint guarded by #[distributed_lock], then through the same code without the
# lock. The report ends with what the two runs show, explained with their numbers.
#
#   bash scripts/demo.sh            # 3000 purchases per endpoint
#   bash scripts/demo.sh --quick    # 600 purchases (also: DEMO_QUICK=1), for CI
#
# Both build shop-axum, shop-actix and loadgen in cargo's dev profile, sharing the build of the
# dependencies with the test suite (scripts/test.sh): the first build takes about 2 minutes on 2
# cores, later ones seconds.
#
# Installs redis-server with apt when it is missing, starts a private redis-server on a free
# loopback port in a temporary directory, and stops everything it started when it exits.
# Exits non-zero unless the locked endpoint oversold nothing and the unlocked one oversold.
#
# Environment: DEMO_REQUESTS, DEMO_CONCURRENCY, DEMO_STOCK override the load; REDIS_SERVER_BIN
# and REDIS_CLI_BIN the binaries.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

quick="${DEMO_QUICK:-0}"
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        -h | --help)
            sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
            exit 0
            ;;
        *)
            echo "unknown argument: $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

if [ "$quick" = 1 ]; then
    requests="${DEMO_REQUESTS:-600}"
    concurrency="${DEMO_CONCURRENCY:-32}"
else
    requests="${DEMO_REQUESTS:-3000}"
    concurrency="${DEMO_CONCURRENCY:-64}"
fi
stock="${DEMO_STOCK:-10}"
# The binary of each instance: shop-1 and shop-2 on axum, shop-3 on actix-web, all three taking
# the same lock on the same Redis.
shops=(shop-axum shop-axum shop-actix)
instances=${#shops[@]}
redis_server="${REDIS_SERVER_BIN:-redis-server}"
redis_cli="${REDIS_CLI_BIN:-redis-cli}"

step() {
    printf '\n==> %s\n' "$*"
}

have() {
    command -v "$1" >/dev/null 2>&1
}

# --- Redis -----------------------------------------------------------------------------------

if ! have "$redis_server" || ! have "$redis_cli"; then
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if have sudo; then
            sudo=(sudo)
        else
            echo "redis-server is missing and this is not root (no sudo): install" \
                "redis-server and redis-tools" >&2
            exit 1
        fi
    fi
    step "installing redis-server redis-sentinel redis-tools (apt)"
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y \
        --no-install-recommends redis-server redis-sentinel redis-tools
fi

# --- clean-up --------------------------------------------------------------------------------

work="$(mktemp -d "${TMPDIR:-/tmp}/lock-demo.XXXXXX")"
pids=()

# shellcheck disable=SC2317 # runs from the EXIT trap
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ "${#pids[@]}" -gt 0 ]; then
        echo
        echo "stopping ${#pids[@]} process(es) the demo started"
        kill "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the build -------------------------------------------------------------------------------

target_dir="$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
bin="$target_dir/debug"
built=1
for b in shop-axum shop-actix loadgen; do
    [ -x "$bin/$b" ] || built=0
done
if [ "$built" = 1 ]; then
    step "building shop-axum, shop-actix and loadgen (cargo dev profile; seconds unless sources changed)"
else
    step "building shop-axum, shop-actix and loadgen (cargo dev profile): a first build compiles" \
        "about 160 crates, about 2 minutes on 2 cores; scripts/test.sh reuses it"
fi
# No -p: cargo then resolves the dependencies' features for the whole workspace, as the test suite
# does (with -p lock-examples, tokio would lack lock-tests' "process" and everything built on
# tokio would be compiled again for the tests).
cargo build --bin shop-axum --bin shop-actix --bin loadgen

# --- a private Redis -------------------------------------------------------------------------

port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Milliseconds since the epoch, for deadlines that do not drift on a slow machine (a poll loop
# counted in iterations takes longer than its nominal time when every iteration is slow).
now_ms() {
    if [ -n "${EPOCHREALTIME:-}" ]; then
        local t="${EPOCHREALTIME/[.,]/}"
        echo $((10#$t / 1000))
    else
        echo $(($(date +%s) * 1000))
    fi
}

# The process_id the redis-server on port $1 reports, or nothing if it does not answer.
redis_pid() {
    "$redis_cli" -p "$1" info server 2>/dev/null | sed -n 's/^process_id:\([0-9]*\).*/\1/p' || true
}

start_redis() {
    local port pid deadline
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        port=$((20000 + RANDOM % 40000))
        port_in_use "$port" && continue
        "$redis_server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$work" --logfile "$work/redis.log" &
        pid=$!
        deadline=$(($(now_ms) + 10000))
        while [ "$(now_ms)" -lt "$deadline" ]; do
            # Someone else may have taken the port between the check above and the start: only
            # our own process counts as up (it exits when it finds the port taken).
            if [ "$(redis_pid "$port")" = "$pid" ]; then
                pids+=("$pid")
                redis_port=$port
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break # lost the port to someone else: next one
            sleep 0.1
        done
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    echo "could not start redis-server (see $work/redis.log)" >&2
    return 1
}

step "starting a private redis-server"
start_redis
echo "redis-server $("$redis_server" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$redis_port"
sed "s#redis://127.0.0.1:6379#redis://127.0.0.1:$redis_port#" examples/config/single.toml \
    >"$work/lock.toml"

# --- the shop --------------------------------------------------------------------------------

# The URL of the first complete "listening on URL" line of the log file $1; nothing while there is
# none yet (or no file). `read` fails on a last line that has no newline yet, so a line the shop
# is still writing is never taken.
listening_url() {
    local line
    [ -r "$1" ] || return 0
    while IFS= read -r line; do
        case "$line" in
            "listening on "*)
                printf '%s\n' "${line#listening on }"
                return 0
                ;;
        esac
    done <"$1"
}

step "starting $instances shop instances: ${shops[*]}"
targets=()
for i in $(seq "$instances"); do
    shop="${shops[$((i - 1))]}"
    log="$work/shop-$i.log"
    # Created here, before the background process exists: the redirection of a background
    # command runs in the forked shell, possibly after the first poll below.
    : >"$log"
    "$bin/$shop" --config "$work/lock.toml" --listen 127.0.0.1:0 --instance "shop-$i" \
        >>"$log" 2>&1 &
    pid=$!
    pids+=("$pid")
    url=""
    deadline=$(($(now_ms) + 30000))
    while :; do
        url="$(listening_url "$log")"
        [ -n "$url" ] && break
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "shop-$i ($shop) exited during start-up:" >&2
            cat "$log" >&2 || true
            exit 1
        fi
        if [ "$(now_ms)" -ge "$deadline" ]; then
            echo "shop-$i ($shop) did not start within 30 s:" >&2
            cat "$log" >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    echo "shop-$i: $shop (pid $pid) on $url"
    targets+=(--target "$url")
done

# --- the load --------------------------------------------------------------------------------

step "$requests purchases of goods with stock $stock, $concurrency at a time, round-robin over the instances"
# In the background with `wait`: a TERM for this script runs its trap (which stops loadgen too)
# at once, instead of after loadgen has finished.
"$bin/loadgen" "${targets[@]}" --requests "$requests" --concurrency "$concurrency" \
    --stock "$stock" --goods 1 --endpoint both --check &
loadgen=$!
pids+=("$loadgen")
status=0
wait "$loadgen" || status=$?
unset 'pids[-1]' # reaped: its pid is no longer ours to signal
if [ "$status" -eq 0 ]; then
    echo
    echo "With #[distributed_lock] the $instances processes (axum and actix-web) sold exactly the stock; without it they oversold."
fi
exit "$status"
