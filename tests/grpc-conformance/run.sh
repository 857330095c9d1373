#!/usr/bin/env bash
# ConnectRPC's conformance suite against protoplane's gRPC server and client.
#
# The runner (connectconformance, pinned below) is installed from the Go
# module proxy into target/grpc-conformance/bin once; later runs reuse it.
# It embeds its test suites and reference peers (connect-go and grpc-go):
#   --mode server: its reference clients call `protoplane-grpc-conformance server`,
#                  once monolithic ("server") and once in split mode
#                  ("server-split": the service attached to an in-process
#                  protoplane engine, which speaks gRPC)
#   --mode server, "server-python": the same suite against the engine with
#                  the ConformanceService written as a plain grpcio servicer
#                  and attached from Python (python/tests/connect_server.py,
#                  the protoplane package; ./.venv from scripts/setup-python.sh)
#   --mode client: `protoplane-grpc-conformance client` calls its reference servers
# What protoplane claims (gRPC over HTTP/2, proto, identity + gzip, every
# stream kind, TLS and client certificates, receive limits) is in
# config.yaml; known-failing.txt may list only cases of features it does not
# claim. Prints one line per mode, "MODE: N passed, M failed", and exits
# non-zero when a case fails unexpectedly (or a known failure passes).
#
# usage: tests/grpc-conformance/run.sh [--bin PATH] [--mode server|server-split|server-python|client|all] [-- RUNNER-ARGS...]
#   --bin PATH   a built protoplane-grpc-conformance (else: cargo build --release)
#   --mode       run one mode only (default: all four, servers first)
#   RUNNER-ARGS  passed to connectconformance, e.g. -v, --trace, --run PATTERN
# Logs: target/grpc-conformance/{server,server-split,client}.log
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tests/grpc-conformance"
RUNNER_VERSION=v1.0.7
OUT="$ROOT/target/grpc-conformance"
BIN_DIR="$OUT/bin"

ADAPTER=""
MODES="server server-split server-python client"
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bin) ADAPTER="$2"; shift 2 ;;
        --mode)
            case "$2" in
                server | server-split | server-python | client) MODES="$2" ;;
                all) MODES="server server-split server-python client" ;;
                *) echo "--mode: server, server-split, server-python, client or all" >&2; exit 2 ;;
            esac
            shift 2 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done

mkdir -p "$BIN_DIR"
RUNNER="$BIN_DIR/connectconformance"
stamp="$BIN_DIR/.connectconformance.version"
if [[ ! -x "$RUNNER" || "$(cat "$stamp" 2>/dev/null)" != "$RUNNER_VERSION" ]]; then
    if ! command -v go >/dev/null; then echo "skipped: no Go toolchain to install connectconformance"; exit 0; fi
    echo "installing connectrpc.com/conformance/cmd/connectconformance@$RUNNER_VERSION"
    tmp="$(mktemp -d)"
    GOBIN="$tmp" GOFLAGS=-buildvcs=false go install "connectrpc.com/conformance/cmd/connectconformance@$RUNNER_VERSION"
    mv "$tmp/connectconformance" "$RUNNER"; rmdir "$tmp"
    echo "$RUNNER_VERSION" > "$stamp"
fi

if [[ -z "$ADAPTER" ]]; then
    cargo build --release --quiet -p protoplane-grpc-conformance --manifest-path "$ROOT/Cargo.toml"
    ADAPTER="$ROOT/target/release/protoplane-grpc-conformance"
fi
[[ -x "$ADAPTER" ]] || { echo "not an executable: $ADAPTER" >&2; exit 2; }

# The number of cases each mode runs, for the pinned runner and config.yaml:
# asserted, so a change that makes the runner skip cases (a feature dropped
# from config.yaml, a case that could not run) shows as a failure too.
declare -A EXPECTED=([server]=570 [server-split]=570 [server-python]=570 [client]=646)

status=0
for mode in $MODES; do
    log="$OUT/$mode.log"
    rc=0
    # The runner's peers and ours share the machine's two cores: at most
    # two servers at once, and four RPCs in flight in server mode, keep
    # timing-sensitive cases (deadlines, cancellation) well clear of
    # scheduling noise while a run still takes seconds.
    limits=(--max-servers 2)
    case $mode in
        server) runner_mode=server; adapter=("$ADAPTER" server); limits+=(--parallel 4) ;;
        server-split) runner_mode=server; adapter=("$ADAPTER" server --split); limits+=(--parallel 4) ;;
        server-python)
            runner_mode=server
            PY="$ROOT/.venv/bin/python"
            if ! "$PY" -c 'import protoplane, grpc_tools' 2>/dev/null; then
                echo "server-python: $PY cannot import protoplane (scripts/setup-python.sh installs it)"
                echo "server-python: 0 passed, 1 failed"
                status=1
                continue
            fi
            export PROTOPLANE_BIN="${PROTOPLANE_BIN:-$(dirname "$ADAPTER")/protoplane}"
            adapter=("$PY" "$ROOT/python/tests/connect_server.py")
            limits+=(--parallel 4) ;;
        client) runner_mode=client; adapter=("$ADAPTER" client) ;;
    esac
    "$RUNNER" --mode "$runner_mode" --conf "$HERE/config.yaml" \
        --known-failing "@$HERE/known-failing.txt" \
        "${limits[@]}" "${EXTRA[@]}" \
        -- "${adapter[@]}" >"$log" 2>&1 || rc=$?
    summary="$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1 || true)"
    if [[ -z "$summary" ]]; then
        echo "$mode: the runner ended without a summary (exit $rc); last lines of $log:"
        tail -20 "$log" | sed 's/^/    /'
        echo "$mode: 0 passed, 1 failed"
        status=1
        continue
    fi
    if [[ $rc -ne 0 ]]; then
        # The failing cases, each with the runner's reasons.
        awk '/^FAILED: /{show=1} /^(INFO: |Total cases:)/{show=0} show' "$log" | head -200 | sed 's/^/    /'
        status=1
    fi
    grep -E '^\(Another [0-9]+ failed as expected' "$log" || true
    grep -E '^Another [0-9]+ could not be run' "$log" && status=1
    echo "$mode: $summary"
    passed="${summary%% passed*}"
    if [[ -z "${EXTRA[*]}" && "$passed" != "${EXPECTED[$mode]}" ]]; then
        echo "$mode: expected ${EXPECTED[$mode]} cases to pass, $passed did"
        status=1
    fi
done
exit $status
