#!/usr/bin/env bash
# gRPC interop tests between protoplane and grpcio (the Python gRPC library).
#
#   tests/grpcio/run.sh [--protoplane PATH] [--only server|client|split|python]
#                       [--server-cmd CMD] [--client-cmd CMD] [--case-timeout S]
#
#   (a) protoplane as the server: `protoplane interop-server --port 0` is
#       started, the port is read from its `listening on [HOST:]PORT` stdout
#       line, and the grpcio client suite (client_tests.py) runs against it.
#   (b) protoplane as the client: the grpcio interop server (interop_server.py)
#       is started and `protoplane interop-client --server_host 127.0.0.1
#       --server_port P --test_case C` runs once per case (CLIENT_CASES below),
#       each under `timeout`.
#   (c) split mode: `protoplane engine --grpc-port 0 --attach SOCK` with the
#       interop service in an attached `protoplane interop-server --attach
#       SOCK` process; once the engine logs `attached for
#       grpc.testing.TestService`, client_tests.py runs against the engine's
#       gRPC port (its cases reported as `split NAME`). Skipped with
#       --server-cmd, which replaces the server only (a).
#   (d) split mode with a policy: the engine started with a [policy]
#       (policy_client.py writes it) and the interop service attached;
#       policy_client.py checks with grpcio that a rule denies, a rate and
#       a concurrency limit refuse (RESOURCE_EXHAUSTED, RetryInfo), and
#       `protoplane admin SOCK reload` installs a new policy with a stream
#       open.  Part of --only split.
#   (e) split mode with a Python application: the engine with a plain
#       grpcio servicer of the interop service attached from Python
#       (python/tests/interop_servicer.py, `python -m protoplane.serve`),
#       client_tests.py against the engine (the compression cases left out:
#       a grpcio servicer cannot see or choose compression). --only python.
#
# One line per case, `PASS name (1.234s)` or `FAIL name (1.234s)`, then a
# summary; exit status 1 if anything failed.  Logs of the last run are kept in
# target/grpcio-interop/.  The Python side's stubs are compiled from the
# repository's own interop schema, protos/interop/grpc_testing.proto, into
# target/grpcio-gen/ (grpcio_stubs.py).
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
case "$ONLY" in ""|server|client|split|python) ;; *) echo "run.sh: --only takes server, client, split or python" >&2; exit 2 ;; esac

if [[ -n "$SERVER_CMD" ]]; then read -r -a SERVER <<<"$SERVER_CMD"; else SERVER=("$PROTOPLANE" interop-server); fi
if [[ -n "$CLIENT_CMD" ]]; then read -r -a CLIENT <<<"$CLIENT_CMD"; else CLIENT=("$PROTOPLANE" interop-client); fi

# Whether step $1 (server, client or split) runs.
want() { [[ -z "$ONLY" || "$ONLY" == "$1" ]]; }
needs_protoplane=0
if [[ -z "$SERVER_CMD" ]] && { want server || want split; }; then needs_protoplane=1; fi
if [[ -z "$CLIENT_CMD" ]] && want client; then needs_protoplane=1; fi
if [[ $needs_protoplane -eq 1 && ! -x "$PROTOPLANE" ]]; then
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
SOCK_DIR=""

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null
    done
    [[ -n "$SOCK_DIR" ]] && rm -rf "$SOCK_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ns() { date +%s%N; }
# Elapsed time since $1 (from now_ns) as seconds with millisecond precision.
elapsed() { local ms=$((($(now_ns) - $1) / 1000000)); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }
indent() { sed 's/^/    /'; }

# start_server NAME CMD... : run CMD (which must be told to pick a free port)
# in the background and wait for its `[grpc ]listening on [HOST:]PORT` line;
# sets SERVER_PID and SERVER_PORT.
start_server() {
    local name="$1"; shift
    local out="$LOGS/$name.stdout" err="$LOGS/$name.stderr" deadline line
    "$@" >"$out" 2>"$err" </dev/null &
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

# stop PID... : stop background processes started here.
stop() {
    local pid keep=() p
    for pid in "$@"; do kill "$pid" 2>/dev/null; done
    for pid in "$@"; do wait "$pid" 2>/dev/null; done
    for p in "${PIDS[@]}"; do [[ " $* " == *" $p "* ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# alive NAME PID : counts a failure (with the end of NAME's stderr) if PID died.
alive() {
    kill -0 "$2" 2>/dev/null && return 0
    echo "FAIL $1: died during the run; stderr:"
    tail -n 20 "$LOGS/$1.stderr" | indent
    failed=$((failed + 1))
    return 1
}

# client_suite LOG PREFIX HOST:PORT : runs client_tests.py, printing its
# case lines with PREFIX before each name, and adds its counts to
# passed/failed.
client_suite() {
    local log="$LOGS/$1" prefix="$2" target="$3" rc n_pass n_fail
    shift 3
    # client_tests.py prints its own PASS/FAIL line per case.
    timeout "$SUITE_TIMEOUT" "$PY" "$HERE/client_tests.py" --target "$target" "$@" \
        | while IFS= read -r line; do
            if [[ $line =~ ^(PASS|FAIL)\ (.*)$ ]]; then
                line="${BASH_REMATCH[1]} $prefix${BASH_REMATCH[2]}"
            fi
            printf '%s\n' "$line"
        done | tee "$log"
    rc=${PIPESTATUS[0]}
    n_pass=$(grep -c '^PASS ' "$log")
    n_fail=$(grep -c '^FAIL ' "$log")
    passed=$((passed + n_pass))
    failed=$((failed + n_fail))
    if [[ $rc -ne 0 ]] && ! grep -q '^client_tests: ' "$log"; then
        # Crashed or timed out before its summary line.
        echo "FAIL ${prefix}client_tests.py (exit status $rc)"
        failed=$((failed + 1))
    fi
}

# --- (a) protoplane server, grpcio client -------------------------------------
if want server; then
    echo "==> (a) grpcio client suite against: ${SERVER[*]}"
    if start_server interop-server "${SERVER[@]}" --port 0; then
        client_suite client_tests.log "" "127.0.0.1:$SERVER_PORT"
        alive interop-server "$SERVER_PID"
        stop "$SERVER_PID"
    else
        failed=$((failed + 1))
    fi
fi

# --- (b) grpcio server, protoplane client -------------------------------------
if want client; then
    echo "==> (b) ${CLIENT[*]} against the grpcio interop server"
    if start_server grpcio-server "$PY" "$HERE/interop_server.py" --port 0; then
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
        alive grpcio-server "$SERVER_PID"
        stop "$SERVER_PID"
    else
        failed=$((failed + 1))
    fi
fi

# --- (c) split mode: protoplane engine + attached interop-server, grpcio client
if want split && [[ -n "$SERVER_CMD" ]]; then
    echo "==> (c) split mode: skipped (--server-cmd replaces the server of (a) only)"
elif want split; then
    echo "==> (c) grpcio client suite against protoplane engine + attached interop-server"
    SOCK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/pp-grpcio.XXXXXX")"
    SOCK="$SOCK_DIR/engine.sock"
    # 32 MiB each way, as the monolithic server and the suite's channels
    # allow: huge_unary sends and receives 16 MiB (the engine's default is 4).
    if start_server split-engine "$PROTOPLANE" engine --grpc-port 0 --attach "$SOCK" \
        --max-message $((32 << 20)); then
        ENGINE_PID=$SERVER_PID
        ENGINE_PORT=$SERVER_PORT
        "$PROTOPLANE" interop-server --attach "$SOCK" >"$LOGS/split-app.stdout" 2>"$LOGS/split-app.stderr" </dev/null &
        APP_PID=$!
        PIDS+=("$APP_PID")
        # The engine answers UNAVAILABLE until an application serves the
        # service, so the suite starts only once the engine says it attached.
        attached=0
        deadline=$((SECONDS + STARTUP_TIMEOUT))
        while [[ $SECONDS -lt $deadline ]]; do
            if grep -q 'attached for grpc.testing.TestService' "$LOGS/split-engine.stderr"; then attached=1; break; fi
            kill -0 "$APP_PID" 2>/dev/null || break
            sleep 0.1
        done
        if [[ $attached -eq 1 ]]; then
            client_suite split-client_tests.log "split " "127.0.0.1:$ENGINE_PORT"
            alive split-engine "$ENGINE_PID"
            alive split-app "$APP_PID"
        else
            if kill -0 "$APP_PID" 2>/dev/null; then
                why="did not attach within ${STARTUP_TIMEOUT}s"
            else
                wait "$APP_PID"
                why="exited with status $? before attaching"
            fi
            echo "FAIL split: interop-server --attach $why; engine stderr:"
            tail -n 20 "$LOGS/split-engine.stderr" | indent
            echo "    interop-server --attach stderr:"
            tail -n 20 "$LOGS/split-app.stderr" | indent
            failed=$((failed + 1))
        fi
        stop "$APP_PID" "$ENGINE_PID"
    else
        failed=$((failed + 1))
    fi
fi

# --- (d) the engine's policy, seen by grpcio clients (split mode) ------------
if want split && [[ -z "$SERVER_CMD" ]]; then
    echo "==> (d) grpcio clients against an engine with a [policy] (deny, limits, reload)"
    POL_DIR="$(mktemp -d "${TMPDIR:-/tmp}/pp-policy.XXXXXX")"
    "$PY" "$HERE/policy_client.py" --write-config "$POL_DIR/engine.toml"
    if start_server policy-engine "$PROTOPLANE" engine --grpc-port 0 --attach "$POL_DIR/engine.sock" \
        --config "$POL_DIR/engine.toml" --admin "$POL_DIR/admin.sock"; then
        POL_ENGINE=$SERVER_PID
        POL_PORT=$SERVER_PORT
        "$PROTOPLANE" interop-server --attach "$POL_DIR/engine.sock" >"$LOGS/policy-app.stdout" \
            2>"$LOGS/policy-app.stderr" </dev/null &
        POL_APP=$!
        PIDS+=("$POL_APP")
        attached=0
        deadline=$((SECONDS + STARTUP_TIMEOUT))
        while [[ $SECONDS -lt $deadline ]]; do
            if grep -q 'attached for grpc.testing.TestService' "$LOGS/policy-engine.stderr"; then attached=1; break; fi
            kill -0 "$POL_APP" 2>/dev/null || break
            sleep 0.1
        done
        if [[ $attached -eq 1 ]]; then
            timeout 120 "$PY" "$HERE/policy_client.py" --target "127.0.0.1:$POL_PORT" \
                --config "$POL_DIR/engine.toml" --admin "$POL_DIR/admin.sock" --protoplane "$PROTOPLANE" \
                | tee "$LOGS/policy_client.log"
            passed=$((passed + $(grep -c '^PASS ' "$LOGS/policy_client.log")))
            failed=$((failed + $(grep -c '^FAIL ' "$LOGS/policy_client.log")))
            if ! grep -q '^policy_client: ' "$LOGS/policy_client.log"; then
                echo "FAIL policy_client.py did not finish"
                failed=$((failed + 1))
            fi
            alive policy-engine "$POL_ENGINE"
        else
            echo "FAIL policy: the application did not attach; engine stderr:"
            tail -n 20 "$LOGS/policy-engine.stderr" | indent
            failed=$((failed + 1))
        fi
        stop "$POL_APP" "$POL_ENGINE"
    else
        failed=$((failed + 1))
    fi
    rm -rf "$POL_DIR"
fi

# --- (e) split mode, Python: a grpcio servicer attached from Python -------
if want python || [[ -z "$ONLY" ]]; then
    echo "==> (e) grpcio client suite against protoplane engine + a grpcio servicer attached from Python"
    if ! "$PY" -c 'import protoplane' 2>/dev/null; then
        echo "FAIL python: $PY cannot import protoplane (scripts/setup-python.sh installs the package)"
        failed=$((failed + 1))
    else
        PYS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/pp-python.XXXXXX")"
        mkdir -p "$PYS_DIR/gen"
        "$PY" -m grpc_tools.protoc -I"$ROOT/protos/interop" --python_out="$PYS_DIR/gen" \
            --grpc_python_out="$PYS_DIR/gen" "$ROOT/protos/interop/grpc_testing.proto"
        if start_server python-engine "$PROTOPLANE" engine --grpc-port 0 --attach "$PYS_DIR/engine.sock" \
            --max-message $((32 << 20)); then
            PYE_PID=$SERVER_PID
            PYE_PORT=$SERVER_PORT
            "$PY" -m protoplane.serve --attach "$PYS_DIR/engine.sock" -I "$PYS_DIR/gen" -I "$ROOT/python/tests" \
                interop_servicer:TestService >"$LOGS/python-app.stderr" 2>&1 </dev/null &
            PYA_PID=$!
            PIDS+=("$PYA_PID")
            attached=0
            deadline=$((SECONDS + STARTUP_TIMEOUT))
            while [[ $SECONDS -lt $deadline ]]; do
                if grep -q 'attached for grpc.testing.TestService' "$LOGS/python-engine.stderr"; then attached=1; break; fi
                kill -0 "$PYA_PID" 2>/dev/null || break
                sleep 0.1
            done
            if [[ $attached -eq 1 ]]; then
                # A grpcio servicer cannot see or choose compression: the
                # compression cases are about the server, not the package.
                client_suite python-client_tests.log "python " "127.0.0.1:$PYE_PORT" \
                    --skip client_compressed_unary --skip expect_compressed_rejects_uncompressed \
                    --skip server_compressed_unary --skip compressed_both_ways_streaming
                alive python-engine "$PYE_PID"
                alive python-app "$PYA_PID"
            else
                echo "FAIL python: the servicer did not attach"
                tail -n 20 "$LOGS/python-app.stderr" | indent
                failed=$((failed + 1))
            fi
            stop "$PYA_PID" "$PYE_PID"
        else
            failed=$((failed + 1))
        fi
        rm -rf "$PYS_DIR"
    fi
fi

summary="$passed passed, $failed failed"
echo "grpcio interop: $summary (logs: ${LOGS#"$ROOT"/})"
[[ $failed -eq 0 ]]
