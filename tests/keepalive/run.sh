#!/usr/bin/env bash
# grpc-go against protoplane's keepalive and connection lifecycle (gRFC
# A8, A9), with main.go here (built against the grpc-go of go.mod into
# target/go-bin). grpc-go's client against `protoplane serve`:
#   - age: --max-connection-age 0.3; the client calls health Check for
#     2 s: no call fails, and the client opened at least 4 connections;
#   - idle: --max-connection-idle 0.3; one call, 1 s idle: the channel is
#     IDLE (the server's GOAWAY reached it), the next call succeeds on a
#     second connection;
#   - control: the same idle wait without --max-connection-idle keeps the
#     one connection READY.
# grpc-go's server (health, keepalive.EnforcementPolicy) against
# `protoplane load --keepalive-time` (2 calls/s for 3 s, pings allowed
# with no call open):
#   - MinTime 1s, pings every 50 ms: grpc-go sends GOAWAY too_many_pings,
#     the channel dials again, no call fails (more than one connection);
#   - MinTime 1s, pings every 1.5 s: one connection;
#   - MinTime 10ms, pings every 50 ms: one connection (within the policy).
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
(cd "$ROOT/tests/keepalive" && GOFLAGS=-buildvcs=false go build -mod=readonly -o "$BIN/keepalive-peer" .)

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
read -r _ ok _ bad _ conns _ _ < <("$BIN/keepalive-peer" -addr "127.0.0.1:$PORT" -mode age -seconds 2 2>"$OUT/age-client.log")
expect "age: failed calls ($ok ok)" "$bad" 0
expect "age: at least 4 connections in 2 s ($conns)" "$([[ $conns -ge 4 ]] && echo yes || echo no)" yes

serve idle --max-connection-idle 0.3
read -r _ ok _ bad _ conns _ state < <("$BIN/keepalive-peer" -addr "127.0.0.1:$PORT" -mode idle -seconds 1 2>"$OUT/idle-client.log")
expect "idle: failed calls" "$bad" 0
expect "idle: channel state after 1 s idle" "$state" IDLE
expect "idle: connections" "$conns" 2

serve control
read -r _ ok _ bad _ conns _ state < <("$BIN/keepalive-peer" -addr "127.0.0.1:$PORT" -mode idle -seconds 1 2>"$OUT/control-client.log")
expect "control: channel state after 1 s idle" "$state" READY
expect "control: connections" "$conns" 1

# Login-free: grpc.health.v1 Check with an empty request.
"$PP" encode --proto "$ROOT/protos/grpc/health.proto" -I "$ROOT/protos/grpc" \
    --type grpc.health.v1.HealthCheckRequest --delimited <<<'{}' >"$OUT/check.ldelim"
go_server() { # label min-time keepalive-time
    local log="$OUT/go-server-$1.log"
    "$BIN/keepalive-peer" -mode server -min-time "$2" -permit-without-stream >"$log" 2>&1 &
    local pid=$!
    PIDS+=($pid)
    local port=""
    for _ in $(seq 100); do
        port="$(grep -om1 'listening on .*:[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
        [[ -n "$port" ]] && break
        sleep 0.1
    done
    "$PP" load --target "127.0.0.1:$port" --method grpc.health.v1.Health/Check \
        --proto "$ROOT/protos/grpc/health.proto" -I "$ROOT/protos/grpc" --data "$OUT/check.ldelim" \
        --rate 2 --duration 3 --keepalive-time "$3" --keepalive-permit-without-stream \
        --json "$OUT/load-$1.json" >"$OUT/load-$1.txt" 2>&1
    kill "$pid" 2>/dev/null || true
    LOAD_FAILED="$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(sum(j["errors"].values()))' "$OUT/load-$1.json")"
    GO_CONNS="$(grep -c '^connection' "$log" || true)"
}
go_server strict 1s 0.05
expect "grpc-go MinTime 1s, pings every 50 ms: failed calls" "$LOAD_FAILED" 0
expect "grpc-go MinTime 1s, pings every 50 ms: sent away, dialled again ($GO_CONNS connections)" \
    "$([[ $GO_CONNS -ge 2 ]] && echo yes || echo no)" yes
go_server slow 1s 1.5
expect "grpc-go MinTime 1s, pings every 1.5 s: connections" "$GO_CONNS" 1
go_server within 10ms 0.05
expect "grpc-go MinTime 10ms, pings every 50 ms: failed calls" "$LOAD_FAILED" 0
expect "grpc-go MinTime 10ms, pings every 50 ms: connections" "$GO_CONNS" 1
exit "$failed"
