#!/usr/bin/env bash
# Interop against real gRPC peers, from the test suite:
#   1. grpc-go's interop client  -> `protoplane interop-server`
#   2. `protoplane interop-client` -> grpc-go's interop server
#   3. grpcurl lists, describes and calls a protoplane server through
#      server reflection and the health service.
#   4. split mode: 1 and 3 (and TLS) against `protoplane engine` with the
#      interop service in an attached `interop-server --attach` process.
#   5. split mode with a Python application: 1 against the engine with a
#      plain grpcio servicer of the interop service attached from Python
#      (python/tests/interop_servicer.py, the protoplane package).
# The Go peers are installed from the Go module proxy at pinned versions
# into target/go-bin (once; later runs reuse them).
#
# usage: tests/interop/run.sh [--protoplane PATH]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PP="$ROOT/target/release/protoplane"
[[ "${1:-}" == "--protoplane" ]] && PP="$2"
GRPC_GO=v1.85.0
GRPCURL=v1.9.4
BIN="$ROOT/target/go-bin"
mkdir -p "$BIN"

install() { # name module@version
    local stamp="$BIN/.$1.version"
    if [[ -x "$BIN/$1" && "$(cat "$stamp" 2>/dev/null)" == "$2" ]]; then return; fi
    echo "installing $2"
    local tmp; tmp="$(mktemp -d)"
    GOBIN="$tmp" GOFLAGS=-buildvcs=false go install "$2"
    mv "$tmp"/* "$BIN/$1"; rmdir "$tmp"
    echo "$2" > "$stamp"
}
if ! command -v go >/dev/null; then echo "skipped: no Go toolchain"; exit 0; fi
install grpc-interop-client "google.golang.org/grpc/interop/client@$GRPC_GO"
install grpc-interop-server "google.golang.org/grpc/interop/server@$GRPC_GO"
install grpcurl "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
LOG="$(mktemp -d)"

# Starts a server that prints "listening on HOST:PORT"; sets PORT.
start() {
    local out="$LOG/$1.out"; shift
    "$@" >"$out" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do
        PORT="$(grep -om1 'listening on .*:[0-9]*' "$out" | grep -o '[0-9]*$' || true)"
        [[ -n "$PORT" ]] && return 0
        sleep 0.1
    done
    echo "server did not start: $*"; cat "$out"; return 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

failed=0
run_case() { # label command...
    local label="$1"; shift
    local t0=$SECONDS
    if timeout 60 "$@" >"$LOG/case.log" 2>&1; then
        echo "PASS $label ($((SECONDS - t0))s)"
    else
        echo "FAIL $label"; sed 's/^/    /' "$LOG/case.log" | tail -5; failed=$((failed + 1))
    fi
}

GO_CASES="empty_unary large_unary client_streaming server_streaming ping_pong empty_stream
 status_code_and_message special_status_message custom_metadata unimplemented_method
 unimplemented_service timeout_on_sleeping_server cancel_after_begin cancel_after_first_response"

echo "== grpc-go interop client ($GRPC_GO) -> protoplane interop-server"
start pp-server "$PP" interop-server --port 0
for c in $GO_CASES; do
    run_case "$c" "$BIN/grpc-interop-client" --server_host 127.0.0.1 --server_port "$PORT" --test_case "$c"
done
PP_PORT="$PORT"

echo "== protoplane interop-client -> grpc-go interop server ($GRPC_GO)"
GO_PORT="$(free_port)"
"$BIN/grpc-interop-server" --port "$GO_PORT" >"$LOG/go-server.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$GO_PORT") 2>/dev/null && break; sleep 0.1; done
for c in $GO_CASES; do
    run_case "$c" "$PP" interop-client --server_host 127.0.0.1 --server_port "$GO_PORT" --test_case "$c"
done

echo "== TLS both ways (grpc-go's test certificates, read from its module)"
CERTS="$(go env GOMODCACHE)/google.golang.org/grpc@$GRPC_GO/testdata"
if [[ -f "$CERTS/server1.pem" ]]; then
    start pp-tls "$PP" interop-server --port 0 --tls_cert "$CERTS/server1.pem" --tls_key "$CERTS/server1.key"
    for c in large_unary ping_pong; do
        run_case "tls $c (go client)" "$BIN/grpc-interop-client" --server_host 127.0.0.1 --server_port "$PORT" \
            --use_tls --use_test_ca --server_host_override foo.test.google.fr --test_case "$c"
    done
    GO_TLS="$(free_port)"
    "$BIN/grpc-interop-server" --port "$GO_TLS" --use_tls >"$LOG/go-tls.out" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$GO_TLS") 2>/dev/null && break; sleep 0.1; done
    for c in large_unary ping_pong; do
        run_case "tls $c (protoplane client)" "$PP" interop-client --server_host 127.0.0.1 --server_port "$GO_TLS" \
            --use_tls --ca_file "$CERTS/ca.pem" --server_host_override foo.test.google.fr --test_case "$c"
    done
else
    echo "skipped: no grpc-go test certificates at $CERTS"
fi

echo "== grpcurl ($GRPCURL) -> protoplane, through reflection"
G="$BIN/grpcurl"
expect_out() { # label expected-substring command...
    local label="$1" want="$2"; shift 2
    if timeout 30 "$@" >"$LOG/g.out" 2>&1 && grep -qF -- "$want" "$LOG/g.out"; then
        echo "PASS $label"
    else
        echo "FAIL $label (wanted '$want')"; sed 's/^/    /' "$LOG/g.out" | tail -5; failed=$((failed + 1))
    fi
}
expect_out "list" "grpc.testing.TestService" "$G" -plaintext "127.0.0.1:$PP_PORT" list
expect_out "list methods" "grpc.testing.TestService.FullDuplexCall" "$G" -plaintext "127.0.0.1:$PP_PORT" list grpc.testing.TestService
expect_out "describe" "int32 response_size = 2;" "$G" -plaintext "127.0.0.1:$PP_PORT" describe grpc.testing.SimpleRequest
expect_out "call" '"body": "AAAA"' "$G" -plaintext -d '{"responseSize": 3}' "127.0.0.1:$PP_PORT" grpc.testing.TestService/UnaryCall
expect_out "health" '"status": "SERVING"' "$G" -plaintext "127.0.0.1:$PP_PORT" grpc.health.v1.Health/Check

echo "== split mode: grpc-go interop client -> protoplane engine + attached interop-server"
# Starts an engine and an application attached to it; sets PORT to the
# engine's gRPC port once the application is attached.
start_split() { # label engine-args...
    local label="$1"; shift
    local sock="$LOG/$label.sock"
    start "$label-engine" "$PP" engine --grpc-port 0 --attach "$sock" --max-message $((32 << 20)) "$@"
    "$PP" interop-server --attach "$sock" >"$LOG/$label-app.out" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do
        grep -q 'attached for grpc.testing.TestService' "$LOG/$label-engine.out" && return 0
        sleep 0.1
    done
    echo "application did not attach"; cat "$LOG/$label-engine.out" "$LOG/$label-app.out"; return 1
}
start_split split
for c in $GO_CASES; do
    run_case "split $c" "$BIN/grpc-interop-client" --server_host 127.0.0.1 --server_port "$PORT" --test_case "$c"
done
SPLIT_PORT="$PORT"
expect_out "split list" "grpc.testing.TestService" "$G" -plaintext "127.0.0.1:$SPLIT_PORT" list
expect_out "split describe" "int32 response_size = 2;" "$G" -plaintext "127.0.0.1:$SPLIT_PORT" describe grpc.testing.SimpleRequest
expect_out "split call" '"body": "AAAA"' "$G" -plaintext -d '{"responseSize": 3}' "127.0.0.1:$SPLIT_PORT" grpc.testing.TestService/UnaryCall
expect_out "split health" '"status": "SERVING"' "$G" -plaintext "127.0.0.1:$SPLIT_PORT" grpc.health.v1.Health/Check
if [[ -f "$CERTS/server1.pem" ]]; then
    start_split split-tls --tls_cert "$CERTS/server1.pem" --tls_key "$CERTS/server1.key"
    for c in large_unary ping_pong; do
        run_case "split tls $c (go client)" "$BIN/grpc-interop-client" --server_host 127.0.0.1 --server_port "$PORT" \
            --use_tls --use_test_ca --server_host_override foo.test.google.fr --test_case "$c"
    done
fi

echo "== split mode, Python: grpc-go interop client -> protoplane engine + a grpcio servicer attached from Python"
# python/tests/interop_servicer.py is a plain grpcio TestServiceServicer,
# attached with the package's entry point (python -m protoplane.serve);
# the venv and the package come from scripts/setup-python.sh.
PY="$ROOT/.venv/bin/python"
if [[ -x "$PY" ]] && "$PY" -c 'import protoplane, grpc_tools' 2>/dev/null; then
    GEN="$LOG/py-gen"; mkdir -p "$GEN"
    "$PY" -m grpc_tools.protoc -I"$ROOT/protos/interop" --python_out="$GEN" --grpc_python_out="$GEN" \
        "$ROOT/protos/interop/grpc_testing.proto"
    start py-engine "$PP" engine --grpc-port 0 --attach "$LOG/py.sock" --max-message $((32 << 20))
    "$PY" -m protoplane.serve --attach "$LOG/py.sock" -I "$GEN" -I "$ROOT/python/tests" \
        interop_servicer:TestService >"$LOG/py-app.out" 2>&1 &
    PIDS+=($!)
    attached=0
    for _ in $(seq 200); do
        grep -q 'attached for grpc.testing.TestService' "$LOG/py-engine.out" && { attached=1; break; }
        sleep 0.1
    done
    if [[ $attached -eq 1 ]]; then
        for c in $GO_CASES; do
            run_case "python $c" "$BIN/grpc-interop-client" --server_host 127.0.0.1 --server_port "$PORT" --test_case "$c"
        done
    else
        echo "FAIL python: the servicer did not attach"; cat "$LOG/py-engine.out" "$LOG/py-app.out" | tail -20
        failed=$((failed + 1))
    fi
else
    echo "FAIL python: $PY cannot import protoplane (scripts/setup-python.sh installs the package)"
    failed=$((failed + 1))
fi

if [[ $failed -gt 0 ]]; then echo "interop: $failed failed"; exit 1; fi
echo "interop: all passed"
