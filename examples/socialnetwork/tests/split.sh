#!/usr/bin/env bash
# The example's binaries as the README runs them, both ways:
#   1. monolithic: `sn-server 0` on a port of its own, `sn-client` calls Login;
#   2. split: `protoplane engine` with `sn-server --attach SOCK` attached, and
#      `sn-client` calls Login through the engine's gRPC port. The attach
#      handshake compares the example's generated schema with the engine's
#      built-in one and refuses a mismatch, so this also checks they agree.
#
# usage: examples/socialnetwork/tests/split.sh [--bin DIR]
#   DIR holds protoplane, sn-server and sn-client (default target/release,
#   from `cargo build --release --workspace`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BIN="$ROOT/target/release"
[[ "${1:-}" == "--bin" ]] && BIN="$2"
for b in protoplane sn-server sn-client; do
    [[ -x "$BIN/$b" ]] || { echo "FAIL: no $BIN/$b (build it with: cargo build --release --workspace)"; exit 1; }
done

PIDS=()
LOG="$(mktemp -d)"
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait
    rm -rf "$LOG"
}
trap cleanup EXIT

# Waits until file $1 has a line matching $2 while process $3 lives; prints
# the line.
await() {
    for _ in $(seq 200); do
        grep -m1 -- "$2" "$1" 2>/dev/null && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

failed=0
login() { # label port
    local out
    if out="$(timeout 30 "$BIN/sn-client" "127.0.0.1:$2" grace 2>&1)" && [[ "$out" == "token: t7-grace" ]]; then
        echo "PASS $1"
    else
        echo "FAIL $1: sn-client said:"; sed 's/^/    /' <<<"$out"; failed=$((failed + 1))
    fi
}

echo "== monolithic: sn-server on its own port"
"$BIN/sn-server" 0 >"$LOG/server.out" 2>&1 &
PIDS+=($!)
if line="$(await "$LOG/server.out" 'listening on' $!)"; then
    login "monolithic login" "${line##*:}"
else
    echo "FAIL monolithic: sn-server did not start"; sed 's/^/    /' "$LOG/server.out"; failed=$((failed + 1))
fi

echo "== split: sn-server --attach, through protoplane engine"
SOCK="$LOG/engine.sock"
"$BIN/protoplane" engine --grpc-port 0 --attach "$SOCK" >"$LOG/engine.out" 2>"$LOG/engine.err" &
ENGINE=$!
PIDS+=("$ENGINE")
if line="$(await "$LOG/engine.out" 'grpc listening on' "$ENGINE")"; then
    PORT="${line##*:}"
    "$BIN/sn-server" --attach "$SOCK" >"$LOG/app.out" 2>&1 &
    APP=$!
    PIDS+=("$APP")
    # The engine answers UNAVAILABLE until the application has attached.
    if await "$LOG/engine.err" 'attached for socialnetwork.SocialNetwork' "$APP" >/dev/null; then
        login "split login" "$PORT"
    else
        # A schema mismatch shows here: the engine refuses and sn-server exits.
        echo "FAIL split: sn-server --attach did not attach; engine:"
        sed 's/^/    /' "$LOG/engine.err"; echo "    sn-server:"; sed 's/^/    /' "$LOG/app.out"
        failed=$((failed + 1))
    fi
else
    echo "FAIL split: the engine did not start"; sed 's/^/    /' "$LOG/engine.out" "$LOG/engine.err"
    failed=$((failed + 1))
fi

if [[ $failed -gt 0 ]]; then echo "socialnetwork example: $failed failed"; exit 1; fi
echo "socialnetwork example: all passed"
