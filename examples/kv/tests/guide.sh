#!/usr/bin/env bash
# The README's "Your first service", run: kv-server on a port of its own,
# grpcurl Put and Get through server reflection (and NOT_FOUND for a
# missing key); then `protoplane engine --proto kv.proto` with `kv-server
# --attach`, the same calls through the engine; an engine without --proto
# refusing the application with the guide's advice; and an engine started
# from the guide's TOML (its ports and paths swapped for free ones).
#
# usage: examples/kv/tests/guide.sh [--bin DIR]
#   DIR holds protoplane and kv-server (default target/release). grpcurl
#   comes from target/go-bin (tests/interop/run.sh installs it) or PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BIN="$ROOT/target/release"
[[ "${1:-}" == "--bin" ]] && BIN="$2"
for b in protoplane kv-server; do
    [[ -x "$BIN/$b" ]] || { echo "FAIL: no $BIN/$b (cargo build --release --workspace)"; exit 1; }
done
GRPCURL="$ROOT/target/go-bin/grpcurl"
[[ -x "$GRPCURL" ]] || GRPCURL="$(command -v grpcurl || true)"
if [[ -z "$GRPCURL" ]]; then
    command -v go >/dev/null || { echo "skipped: no grpcurl and no Go toolchain to install it"; exit 0; }
    tmp="$(mktemp -d)"
    GOBIN="$tmp" GOFLAGS=-buildvcs=false go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4
    mkdir -p "$ROOT/target/go-bin"; mv "$tmp/grpcurl" "$ROOT/target/go-bin/grpcurl"; rmdir "$tmp"
    GRPCURL="$ROOT/target/go-bin/grpcurl"
fi
PROTO_DIR="$ROOT/examples/kv/proto"

PIDS=()
LOG="$(mktemp -d)"
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$LOG"; }
trap cleanup EXIT
# Waits for a line matching $2 in $1; prints its last field.
await() {
    for _ in $(seq 100); do
        local v; v="$(grep -m1 -- "$2" "$1" 2>/dev/null | awk '{print $NF}' || true)"
        [[ -n "$v" ]] && { echo "$v"; return 0; }
        sleep 0.1
    done
    echo "no \"$2\" in $1:" >&2; cat "$1" >&2; return 1
}
failed=0
check() { # label want command...
    local label="$1" want="$2"; shift 2
    local got; got="$("$@" 2>&1 | tr -d ' \n' || true)"
    if [[ "$got" == *"$want"* ]]; then echo "PASS $label"; else echo "FAIL $label: $got"; failed=1; fi
}
calls() { # where host:port
    check "$1: Put" '{}' "$GRPCURL" -plaintext -d '{"key": "greeting", "value": "hello"}' "$2" kv.KeyValue/Put
    check "$1: Get" '{"value":"hello"}' "$GRPCURL" -plaintext -d '{"key": "greeting"}' "$2" kv.KeyValue/Get
    check "$1: Get a missing key" 'Code:NotFound' "$GRPCURL" -plaintext -d '{"key": "nope"}' "$2" kv.KeyValue/Get
}

echo "== monolithic: kv-server on its own port"
"$BIN/kv-server" 0 >"$LOG/kv.log" 2>&1 &
PIDS+=($!)
calls monolithic "$(await "$LOG/kv.log" '^listening on')"

echo "== split: protoplane engine --proto kv.proto, kv-server --attach"
"$BIN/protoplane" engine --grpc-port 0 --attach "$LOG/kv.sock" \
    --proto "$PROTO_DIR/kv.proto" -I "$PROTO_DIR" >"$LOG/engine.log" 2>&1 &
PIDS+=($!)
ENGINE="$(await "$LOG/engine.log" '^grpc listening on')"
await "$LOG/engine.log" '^attach at' >/dev/null
"$BIN/kv-server" --attach "$LOG/kv.sock" >"$LOG/app.log" 2>&1 &
PIDS+=($!)
await "$LOG/app.log" 'attached to' >/dev/null
calls split "$ENGINE"

echo "== an engine without the schema refuses the application, saying what to do"
"$BIN/protoplane" engine --grpc-port 0 --attach "$LOG/bare.sock" >"$LOG/bare.log" 2>&1 &
PIDS+=($!)
await "$LOG/bare.log" '^attach at' >/dev/null
check "refusal names --proto" "startitwith--protoFILE" timeout 10 "$BIN/kv-server" --attach "$LOG/bare.sock"

echo "== the guide's TOML configuration"
python3 - "$ROOT/README.md" "$LOG" "$PROTO_DIR" >"$LOG/engine.toml" <<'PY'
import re, sys
readme, log, protos = sys.argv[1:]
text = open(readme).read()
guide = text[text.index("## Your first service"):]
guide = guide[: guide.index("\n## ", 3)]
toml = re.search(r"```toml\n(.*?)```", guide, re.S).group(1)
toml = toml.replace('"127.0.0.1:50052"', '"127.0.0.1:0"').replace('"127.0.0.1:9464"', '"127.0.0.1:0"')
toml = toml.replace('"/tmp/kv.sock"', '"%s/toml.sock"' % log)
toml = toml.replace('"examples/kv/proto/kv.proto"', '"%s/kv.proto"' % protos)
toml = toml.replace('"examples/kv/proto"', '"%s"' % protos)
print(toml)
PY
"$BIN/protoplane" engine --config "$LOG/engine.toml" >"$LOG/toml.log" 2>&1 &
PIDS+=($!)
TOML_ENGINE="$(await "$LOG/toml.log" '^grpc listening on')"
METRICS="$(await "$LOG/toml.log" '^metrics on')"
"$BIN/kv-server" --attach "$LOG/toml.sock" >"$LOG/toml-app.log" 2>&1 &
PIDS+=($!)
await "$LOG/toml-app.log" 'attached to' >/dev/null
calls "engine from the guide's TOML" "$TOML_ENGINE"
check "its metrics endpoint counts the calls" 'grpc_server_call_started_total{grpc_method="kv.KeyValue/Get"}2' curl -s "$METRICS"
exit "$failed"
