#!/usr/bin/env bash
# h2spec (HTTP/2 conformance: its generic, HPACK and RFC 7540 sections)
# against protoplane's gRPC server, monolithic (`protoplane serve`) and in
# split mode (`protoplane engine` in front of an attached application).
#
# h2spec is installed from the Go module proxy at a pinned version into
# target/go-bin (once; later runs reuse it). Each run prints h2spec's
# summary line; the number of passing cases is asserted (EXPECTED below),
# so a regression in the transport fails the suite.
#
# usage: tests/h2spec/run.sh [--protoplane PATH] [--transport native|h2]
#   --transport h2   the h2-crate server kept for comparison (not asserted:
#                    it prints its count for the record)
# Logs: target/h2spec/*.log
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PP="$ROOT/target/release/protoplane"
TRANSPORT=native
while [[ $# -gt 0 ]]; do
    case "$1" in
        --protoplane) PP="$2"; shift 2 ;;
        --transport) TRANSPORT="$2"; shift 2 ;;
        *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done
H2SPEC=v2.2.1
# All 145 cases of h2spec 2.2.1 pass on the native transport.
EXPECTED=145
BIN="$ROOT/target/go-bin"
OUT="$ROOT/target/h2spec"
mkdir -p "$BIN" "$OUT"

if ! command -v go >/dev/null; then echo "skipped: no Go toolchain to install h2spec"; exit 0; fi
stamp="$BIN/.h2spec.version"
if [[ ! -x "$BIN/h2spec" || "$(cat "$stamp" 2>/dev/null)" != "$H2SPEC" ]]; then
    echo "installing github.com/summerwind/h2spec@$H2SPEC"
    tmp="$(mktemp -d)"
    GOBIN="$tmp" GOFLAGS=-buildvcs=false go install "github.com/summerwind/h2spec/cmd/h2spec@$H2SPEC+incompatible"
    mv "$tmp/h2spec" "$BIN/h2spec"; rmdir "$tmp"
    echo "$H2SPEC" > "$stamp"
fi

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Starts a command that prints "listening on HOST:PORT" (or, for the
# engine, "grpc on HOST:PORT"); sets PORT.
start() {
    local log="$1"; shift
    "$@" >"$log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        PORT="$(grep -oE '(listening on|grpc on) 127\.0\.0\.1:[0-9]+' "$log" | head -1 | grep -oE '[0-9]+$' || true)"
        [[ -n "$PORT" ]] && return 0
        sleep 0.1
    done
    echo "did not start: $*" >&2; cat "$log" >&2; return 1
}

status=0
run() { # name port
    local log="$OUT/$1.log"
    # -o: seconds h2spec waits for a frame a case expects.
    "$BIN/h2spec" -h 127.0.0.1 -p "$2" -o 2 >"$log" 2>&1 || true
    local summary
    summary="$(grep -E '^[0-9]+ tests, ' "$log" | tail -1)"
    echo "h2spec $1: $summary"
    local passed
    passed="$(sed -nE 's/^[0-9]+ tests, ([0-9]+) passed.*/\1/p' <<<"$summary")"
    if [[ "$TRANSPORT" == native && "${passed:-0}" -lt "$EXPECTED" ]]; then
        echo "h2spec $1: expected $EXPECTED cases to pass, ${passed:-0} did; failures:"
        grep -E '^\s+× ' "$log" | sort -u | head -40
        status=1
    fi
}

start "$OUT/serve-$TRANSPORT.out" "$PP" serve --port 0 --grpc-transport "$TRANSPORT"
run "serve-$TRANSPORT" "$PORT"

if [[ "$TRANSPORT" == native ]]; then
    # Split mode: the engine terminates HTTP/2 for an attached application.
    sock="$(mktemp -u /tmp/protoplane-h2spec-XXXXXX.sock)"
    start "$OUT/engine.out" "$PP" engine --grpc-port 0 --attach "$sock"
    "$PP" interop-server --attach "$sock" >"$OUT/app.out" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        grep -q 'attached for grpc.testing.TestService' "$OUT/engine.out" && break
        sleep 0.1
    done
    run split "$PORT"
fi
exit $status
