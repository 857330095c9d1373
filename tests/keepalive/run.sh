#!/usr/bin/env bash
# grpc-go's client against `protoplane serve`'s connection lifecycle
# (gRFC A9), with main.go here (built against the grpc-go of go.mod into
# target/go-bin):
#   - age: --max-connection-age 0.3; the client calls health Check for
#     2 s: no call fails, and the client opened at least 4 connections;
#   - idle: --max-connection-idle 0.3; one call, 1 s idle: the channel is
#     IDLE (the server's GOAWAY reached it), the next call succeeds on a
#     second connection;
#   - control: the same idle wait without --max-connection-idle keeps the
#     one connection READY.
#
# usage: tests/keepalive/run.sh [--protoplane PATH]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PP="$ROOT/target/release/protoplane"
[[ "${1:-}" == "--protoplane" ]] && PP="$2"
if ! command -v go >/dev/null; then echo "skipped: no Go toolchain"; exit 0; fi
BIN="$ROOT/target/go-bin"
OUT="$ROOT/target/keepalive-check"
mkdir -p "$BIN" "$OUT"
(cd "$ROOT/tests/keepalive" && GOFLAGS=-buildvcs=false go build -mod=readonly -o "$BIN/keepalive-client" .)

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

serve() { # log flags...
    local log="$OUT/$1.log"; shift
    "$PP" serve --port 0 "$@" >"$log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do
        PORT="$(grep -om1 '^listening on .*:[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
        [[ -n "$PORT" ]] && return 0
        sleep 0.1
    done
    echo "server did not start: $*"; cat "$log"; return 1
}

failed=0
expect() { # label got want
    if [[ "$2" == "$3" ]]; then echo "ok    $1: $2"; else echo "FAIL  $1: got \"$2\", want \"$3\""; failed=1; fi
}

serve age --max-connection-age 0.3
read -r _ ok _ bad _ conns _ _ < <("$BIN/keepalive-client" -addr "127.0.0.1:$PORT" -mode age -seconds 2 2>"$OUT/age-client.log")
expect "age: failed calls ($ok ok)" "$bad" 0
expect "age: at least 4 connections in 2 s ($conns)" "$([[ $conns -ge 4 ]] && echo yes || echo no)" yes

serve idle --max-connection-idle 0.3
read -r _ ok _ bad _ conns _ state < <("$BIN/keepalive-client" -addr "127.0.0.1:$PORT" -mode idle -seconds 1 2>"$OUT/idle-client.log")
expect "idle: failed calls" "$bad" 0
expect "idle: channel state after 1 s idle" "$state" IDLE
expect "idle: connections" "$conns" 2

serve control
read -r _ ok _ bad _ conns _ state < <("$BIN/keepalive-client" -addr "127.0.0.1:$PORT" -mode idle -seconds 1 2>"$OUT/control-client.log")
expect "control: channel state after 1 s idle" "$state" READY
expect "control: connections" "$conns" 1
exit "$failed"
