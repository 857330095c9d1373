#!/usr/bin/env bash
# The metrics endpoint (`--metrics-addr`) read by a real Prometheus.
#
# Prometheus and promtool come from Debian (installed here when missing:
# `apt-get install prometheus`). The script starts
#   - `protoplane serve --metrics-addr` (monolithic), and
#   - `protoplane engine --metrics-addr` with `protoplane serve --attach`
#     (split),
# runs `protoplane load --requests N` against each, and has a Prometheus
# server scrape both every second. Then it asks Prometheus, over its HTTP
# API, what it stored:
#   - both targets are up (Prometheus parsed every scrape);
#   - `grpc_server_call_started_total` and the histograms' `_count` for
#     Login equal the calls the load generator made (`calls_made` in its
#     --json report: the measured ones and those of its start), on both;
#   - `histogram_quantile` over `grpc_server_call_duration_seconds_bucket`
#     gives a latency inside the load generator's own min..max;
#   - the engine reports one attached application and as many calls
#     opened with it (`protoplane_engine_calls_total`) as the load made.
# `promtool check metrics` lints each exposition as well.
#
# usage: tests/metrics/run.sh [--protoplane PATH]
# Logs: target/metrics-check/*
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PP="$ROOT/target/release/protoplane"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --protoplane) PP="$2"; shift 2 ;;
        *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done
OUT="$ROOT/target/metrics-check"
rm -rf "$OUT"; mkdir -p "$OUT"
PROTO_DIR="$ROOT/protos/socialnetwork"
DATA="$OUT/login.ldelim"
REQUESTS=3000

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    echo "installing prometheus (Debian)"
    install() { DEBIAN_FRONTEND=noninteractive "$@" apt-get install -y -qq --no-install-recommends prometheus >"$OUT/apt.log" 2>&1; }
    install env || install sudo -n env || { echo "cannot install prometheus (see $OUT/apt.log)" >&2; exit 1; }
fi

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Waits for a line matching $2 in log $1 and prints its last field.
await() {
    local log="$1" pattern="$2" v
    for _ in $(seq 1 100); do
        v="$(grep -E "$pattern" "$log" | head -1 | awk '{print $NF}' || true)"
        [[ -n "$v" ]] && { echo "$v"; return 0; }
        sleep 0.1
    done
    echo "no \"$pattern\" in $log:" >&2; cat "$log" >&2; return 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
hostport() { sed -E 's#^http://##; s#/metrics$##' <<<"$1"; }

# Login requests, written here (no dataset needed).
for i in $(seq 1 32); do
    echo "{\"reqId\": \"$i\", \"username\": \"user$i\", \"password\": \"pw$i\"}"
done | "$PP" encode --proto "$PROTO_DIR/social_network.proto" -I "$PROTO_DIR" \
    --type socialnetwork.LoginRequest --delimited >"$DATA"

# Monolithic.
"$PP" serve --port 0 --metrics-addr 127.0.0.1:0 >"$OUT/serve.log" 2>&1 &
PIDS+=($!)
SERVE_METRICS="$(hostport "$(await "$OUT/serve.log" '^metrics on')")"
SERVE_PORT="$(await "$OUT/serve.log" '^listening on' | sed 's/.*://')"

# Split: an engine, one application attached.
SOCK="$OUT/engine.sock"
"$PP" engine --grpc-port 0 --attach "$SOCK" --metrics-addr 127.0.0.1:0 >"$OUT/engine.log" 2>&1 &
PIDS+=($!)
ENGINE_METRICS="$(hostport "$(await "$OUT/engine.log" '^metrics on')")"
ENGINE_PORT="$(await "$OUT/engine.log" '^grpc listening on' | sed 's/.*://')"
await "$OUT/engine.log" '^attach at' >/dev/null
"$PP" serve --attach "$SOCK" >"$OUT/app.log" 2>&1 &
PIDS+=($!)
await "$OUT/engine.log" 'attached for' >/dev/null

PROM_PORT="$(free_port)"
cat >"$OUT/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: serve
    static_configs: [{targets: ['$SERVE_METRICS']}]
  - job_name: engine
    static_configs: [{targets: ['$ENGINE_METRICS']}]
EOF
prometheus --config.file="$OUT/prometheus.yml" --storage.tsdb.path="$OUT/tsdb" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$OUT/prometheus.log" 2>&1 &
PIDS+=($!)
PROM="http://127.0.0.1:$PROM_PORT"
for _ in $(seq 1 100); do curl -sf "$PROM/-/ready" >/dev/null && break; sleep 0.2; done
curl -sf "$PROM/-/ready" >/dev/null || { echo "prometheus did not start" >&2; cat "$OUT/prometheus.log" >&2; exit 1; }

load() { # name port
    "$PP" load --target "127.0.0.1:$2" --method socialnetwork.SocialNetwork/Login \
        --proto "$PROTO_DIR/social_network.proto" -I "$PROTO_DIR" --data "$DATA" \
        --requests "$REQUESTS" --concurrency 8 --json "$OUT/load-$1.json" >"$OUT/load-$1.txt" 2>&1
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["calls_made"], j["latency_us"]["min"], j["latency_us"]["max"])' "$OUT/load-$1.json"
}
read -r SERVE_CALLS SERVE_MIN SERVE_MAX < <(load serve "$SERVE_PORT")
read -r ENGINE_CALLS ENGINE_MIN ENGINE_MAX < <(load engine "$ENGINE_PORT")
echo "load: $SERVE_CALLS calls to serve, $ENGINE_CALLS through the engine"

failed=0
check() { # what expected actual
    if [[ "$2" == "$3" ]]; then echo "ok    $1 = $3"; else echo "FAIL  $1: expected $2, Prometheus says $3"; failed=1; fi
}
# The value of an instant query with one result ("none" otherwise).
query() {
    curl -sf --data-urlencode "query=$1" "$PROM/api/v1/query" | python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if len(r) == 1 else "none (%d series)" % len(r))'
}
# Waits until Prometheus holds a scrape taken after the loads ended.
LOADED_AT="$(date +%s)"
for _ in $(seq 1 50); do
    t="$(query 'min(timestamp(up))')"
    [[ "$t" != none* ]] && python3 -c "import sys; sys.exit(0 if float('$t') > $LOADED_AT + 1 else 1)" && break
    sleep 0.2
done

LOGIN='grpc_method="socialnetwork.SocialNetwork/Login"'
# An instant query has been seen to find no `up` series for a target whose
# other series were all there (under load, in CI): `up` is read again for
# a few scrape intervals before it counts as missing.
up_of() { # job
    local v
    for _ in $(seq 1 25); do
        v="$(query "up{job=\"$1\"}")"
        [[ "$v" == 1 ]] && break
        sleep 0.2
    done
    echo "$v"
}
check 'up{job="serve"}' 1 "$(up_of serve)"
check 'up{job="engine"}' 1 "$(up_of engine)"
for job in serve engine; do
    calls=$([[ $job == serve ]] && echo "$SERVE_CALLS" || echo "$ENGINE_CALLS")
    check "$job: grpc_server_call_started_total{Login}" "$calls" \
        "$(query "grpc_server_call_started_total{job=\"$job\",$LOGIN}")"
    check "$job: sum(grpc_server_call_duration_seconds_count{Login})" "$calls" \
        "$(query "sum(grpc_server_call_duration_seconds_count{job=\"$job\",$LOGIN})")"
    check "$job: sum(grpc_server_call_rcvd_total_compressed_message_size_bytes_count{Login})" "$calls" \
        "$(query "sum(grpc_server_call_rcvd_total_compressed_message_size_bytes_count{job=\"$job\",$LOGIN})")"
done
check 'engine: protoplane_engine_applications' 1 "$(query 'protoplane_engine_applications')"
check 'engine: sum(protoplane_engine_calls_total)' "$ENGINE_CALLS" "$(query 'sum(protoplane_engine_calls_total)')"

# The median from the histogram lies within what the client saw (the
# server's share of a call is shorter than the client's round trip, and
# bucket interpolation stays inside a bucket: allow the bucket below min).
p50="$(query "histogram_quantile(0.5, sum by (le) (grpc_server_call_duration_seconds_bucket{job=\"serve\",$LOGIN}))")"
if python3 -c "import sys; v=float('$p50')*1e6; sys.exit(0 if 0 < v <= $SERVE_MAX else 1)" 2>/dev/null; then
    echo "ok    serve: histogram_quantile(0.5) = $p50 s (client saw ${SERVE_MIN}..${SERVE_MAX} µs per call)"
else
    echo "FAIL  serve: histogram_quantile(0.5) = $p50 s, not within 0..${SERVE_MAX} µs"; failed=1
fi

for m in "$SERVE_METRICS" "$ENGINE_METRICS"; do
    if curl -sf "http://$m/metrics" | promtool check metrics >"$OUT/promtool.log" 2>&1; then
        echo "ok    promtool check metrics: http://$m/metrics"
    else
        echo "FAIL  promtool check metrics: http://$m/metrics"; cat "$OUT/promtool.log"; failed=1
    fi
done
exit "$failed"
