#!/usr/bin/env bash
# gRPC interop tests between protoplane and grpcio (the Python gRPC library).
#
#   tests/grpcio/run.sh [--protoplane PATH] [--only server|client]
#                       [--server-cmd CMD] [--client-cmd CMD] [--case-timeout S]
#
#   (a) protoplane as the server: `protoplane interop-server --port 0` is
#       started, the port is read from its `listening on [HOST:]PORT` stdout
#       line, and the grpcio client suite (client_tests.py) runs against it.
#   (b) protoplane as the client: the grpcio interop server (interop_server.py)
#       is started and `protoplane interop-client --server_host 127.0.0.1
#       --server_port P --test_case C` runs once per case (CLIENT_CASES below),
#       each under `timeout`.
#
# One line per case, `PASS name (1.234s)` or `FAIL name (1.234s)`, then a
# summary; exit status 1 if anything failed.  Logs of the last run are kept in
# target/grpcio-interop/.  Skips (exit 0, `skipped: ...`) when the interop
# schemas ../shared/protos/grpc-testing are absent; they are read from there at
# test time and compiled into target/grpcio-gen/, never copied into the repo.
#
# --server-cmd / --client-cmd replace `PATH interop-server` / `PATH
# interop-client` with any command taking the same flags, e.g. grpc-go's
# interop client (`--client-cmd /path/to/go/client`) or this directory's own
# server (`--server-cmd "python tests/grpcio/interop_server.py"`), which is how
# the harness itself is checked.  The words of CMD are split on spaces.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tests/grpcio"
PROTOPLANE="$ROOT/target/release/protoplane"
SERVER_CMD=""
CLIENT_CMD=""
ONLY=""
CASE_TIMEOUT=60          # seconds per interop-client case
SUITE_TIMEOUT=900        # seconds for the whole client_tests.py run
STARTUP_TIMEOUT=30       # seconds for a server to print its port

# grpc-go's interop client cases, then protoplane's extras.
CLIENT_CASES=(
    empty_unary large_unary client_streaming server_streaming ping_pong empty_stream
    status_code_and_message special_status_message custom_metadata
    unimplemented_method unimplemented_service
    timeout_on_sleeping_server cancel_after_begin cancel_after_first_response
    huge_unary client_compressed_unary server_compressed_unary
)

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --protoplane) PROTOPLANE="$2"; shift 2 ;;
        --server-cmd) SERVER_CMD="$2"; shift 2 ;;
        --client-cmd) CLIENT_CMD="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --case-timeout) CASE_TIMEOUT="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
case "$ONLY" in ""|server|client) ;; *) echo "run.sh: --only takes server or client" >&2; exit 2 ;; esac

PROTO_ROOT="${GRPC_TESTING_PROTO_ROOT:-$ROOT/../shared/protos/grpc-testing}"
if [[ ! -f "$PROTO_ROOT/grpc/testing/test.proto" ]]; then
    echo "skipped: no ../shared/protos/grpc-testing (gRPC interop schemas)"
    exit 0
fi
export GRPC_TESTING_PROTO_ROOT="$PROTO_ROOT"   # read by grpcio_stubs.py

if [[ -n "$SERVER_CMD" ]]; then read -r -a SERVER <<<"$SERVER_CMD"; else SERVER=("$PROTOPLANE" interop-server); fi
if [[ -n "$CLIENT_CMD" ]]; then read -r -a CLIENT <<<"$CLIENT_CMD"; else CLIENT=("$PROTOPLANE" interop-client); fi

if [[ ( -z "$SERVER_CMD" && "$ONLY" != client ) || ( -z "$CLIENT_CMD" && "$ONLY" != server ) ]] \
    && [[ ! -x "$PROTOPLANE" ]]; then
    echo "FAIL: no protoplane binary at $PROTOPLANE (build it with: cargo build --release)"
    exit 1
fi

"$ROOT/scripts/setup-python.sh" || { echo "FAIL: scripts/setup-python.sh"; exit 1; }
PY="$ROOT/.venv/bin/python"
"$PY" "$HERE/grpcio_stubs.py" "$ROOT/target/grpcio-gen" >/dev/null || { echo "FAIL: stub generation"; exit 1; }

LOGS="$ROOT/target/grpcio-interop"
rm -rf "$LOGS"
mkdir -p "$LOGS"

passed=0
failed=0
PIDS=()

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ns() { date +%s%N; }
# Elapsed time since $1 (from now_ns) as seconds with millisecond precision.
elapsed() { local ms=$((($(now_ns) - $1) / 1000000)); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }
indent() { sed 's/^/    /'; }

# start_server NAME CMD... : run CMD --port 0 in the background and wait for its
# `listening on [HOST:]PORT` line; sets SERVER_PID and SERVER_PORT.
start_server() {
    local name="$1"; shift
    local out="$LOGS/$name.stdout" err="$LOGS/$name.stderr" deadline line
    "$@" --port 0 >"$out" 2>"$err" </dev/null &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    SERVER_PORT=""
    deadline=$((SECONDS + STARTUP_TIMEOUT))
    while [[ $SECONDS -lt $deadline ]]; do
        line="$(grep -m1 'listening on' "$out" 2>/dev/null)"
        if [[ -n "$line" ]]; then
            SERVER_PORT="$(sed -nE 's/^.*listening on (.*:)?([0-9]+)[[:space:]]*$/\2/p' <<<"$line")"
            if [[ -z "$SERVER_PORT" ]]; then
                echo "FAIL $name: cannot parse a port from: $line"
                return 1
            fi
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID"
            echo "FAIL $name: exited with status $? before listening; stderr:"
            tail -n 20 "$err" | indent
            return 1
        fi
        sleep 0.1
    done
    echo "FAIL $name: no 'listening on' line within ${STARTUP_TIMEOUT}s; stderr:"
    tail -n 20 "$err" | indent
    return 1
}

stop_server() {
    local pid keep=()
    kill "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
    for pid in "${PIDS[@]}"; do [[ $pid == "$SERVER_PID" ]] || keep+=("$pid"); done
    PIDS=("${keep[@]}")
}

# --- (a) protoplane server, grpcio client -------------------------------------
if [[ "$ONLY" != client ]]; then
    echo "==> (a) grpcio client suite against: ${SERVER[*]}"
    if start_server interop-server "${SERVER[@]}"; then
        # client_tests.py prints its own PASS/FAIL line per case.
        timeout "$SUITE_TIMEOUT" "$PY" "$HERE/client_tests.py" --target "127.0.0.1:$SERVER_PORT" \
            | tee "$LOGS/client_tests.log"
        rc=${PIPESTATUS[0]}
        n_pass=$(grep -c '^PASS ' "$LOGS/client_tests.log")
        n_fail=$(grep -c '^FAIL ' "$LOGS/client_tests.log")
        passed=$((passed + n_pass))
        failed=$((failed + n_fail))
        if [[ $rc -ne 0 && $n_fail -eq 0 ]]; then
            # Crashed or timed out without reporting a failing case.
            echo "FAIL client_tests.py (exit status $rc)"
            failed=$((failed + 1))
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "FAIL interop-server: died during the suite; stderr:"
            tail -n 20 "$LOGS/interop-server.stderr" | indent
            failed=$((failed + 1))
        fi
        stop_server
    else
        failed=$((failed + 1))
    fi
fi

# --- (b) grpcio server, protoplane client -------------------------------------
if [[ "$ONLY" != server ]]; then
    echo "==> (b) ${CLIENT[*]} against the grpcio interop server"
    if start_server grpcio-server "$PY" "$HERE/interop_server.py"; then
        for tc in "${CLIENT_CASES[@]}"; do
            log="$LOGS/client-$tc.log"
            start=$(now_ns)
            timeout "$CASE_TIMEOUT" "${CLIENT[@]}" --server_host 127.0.0.1 --server_port "$SERVER_PORT" \
                --test_case "$tc" >"$log" 2>&1 </dev/null
            rc=$?
            took=$(elapsed "$start")
            if [[ $rc -eq 0 ]]; then
                echo "PASS $tc (${took}s)"
                passed=$((passed + 1))
            else
                if [[ $rc -eq 124 ]]; then why="timed out after ${CASE_TIMEOUT}s"; else why="exit status $rc"; fi
                echo "FAIL $tc (${took}s): $why"
                tail -n 10 "$log" | indent
                failed=$((failed + 1))
            fi
        done
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "FAIL grpcio-server: died during the cases; stderr:"
            tail -n 20 "$LOGS/grpcio-server.stderr" | indent
            failed=$((failed + 1))
        fi
        stop_server
    else
        failed=$((failed + 1))
    fi
fi

echo "grpcio interop: $passed passed, $failed failed (logs: ${LOGS#"$ROOT"/})"
[[ $failed -eq 0 ]]
