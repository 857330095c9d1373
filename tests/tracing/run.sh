#!/usr/bin/env bash
# One trace across protoplane and grpc-go hops, read back from a real
# OpenTelemetry Collector; and the engine's structured log lines.
#
# Built here from the Go module proxy: an OpenTelemetry Collector (the
# official otlpreceiver and the contrib fileexporter, collector/) and a
# grpc-go forwarding proxy instrumented with otelgrpc (hop/). Then:
#
#   protoplane load ──► grpc-go hop ──► protoplane serve            (monolithic)
#   protoplane load ──► grpc-go hop ──► protoplane engine ─► serve --attach (split)
#
# with every process exporting spans over OTLP/gRPC to the collector
# (`--otlp-endpoint`, `--service-name`), which writes what it received as
# OTLP JSON. The check reads that file and, for every call the load
# generator made (`calls_made` in its --json report), finds the chain
#   load's client span → hop's server span → hop's client span →
#   the backend's server span
# in one trace, each span's parent the one before it: the trace context
# went from protoplane's client to grpc-go (W3C traceparent, read by
# otelgrpc) and from grpc-go to protoplane's server (and, in split mode,
# through the engine to the application). The backend's spans carry
# rpc.system, rpc.service, rpc.method, rpc.grpc.status_code 0 and the
# client's address (network.peer.address, in split mode too).
#
# Metrics over OTLP: serve and the engine push theirs to the same collector
# every 500 ms (OTEL_METRIC_EXPORT_INTERVAL) and at exit; the last push of
# each counts exactly the calls its load made (grpc.server.call.started and
# grpc.server.call.duration's count, A66's names), and the engine's own
# families come along.
#
# Also through a grpc-go hop: protoplane's interop huge_unary (16 MiB each
# way), three times. grpc-go's client pings as it reads (BDP), and the
# server must not take those pings for abuse.
#
# The engine runs with --log-format json: its "attached" line must be one
# JSON object with level INFO, the target protoplane_engine and the
# application's id as a field.
#
# usage: tests/tracing/run.sh [--protoplane PATH]
# Logs: target/tracing-check/*
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PP="$ROOT/target/release/protoplane"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --protoplane) PP="$2"; shift 2 ;;
        *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done
if ! command -v go >/dev/null; then echo "skipped: no Go toolchain"; exit 0; fi
OUT="$ROOT/target/tracing-check"
rm -rf "$OUT"; mkdir -p "$OUT"
PROTO_DIR="$ROOT/protos/socialnetwork"
REQUESTS=200

echo "building the collector and the grpc-go hop (Go module proxy)"
(cd "$ROOT/tests/tracing/collector" && GOFLAGS=-buildvcs=false go build -mod=readonly -o "$OUT/otelcol" .) \
    >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log" >&2; exit 1; }
(cd "$ROOT/tests/tracing/hop" && GOFLAGS=-buildvcs=false go build -mod=readonly -o "$OUT/hop" .) \
    >>"$OUT/build.log" 2>&1 || { cat "$OUT/build.log" >&2; exit 1; }

PIDS=()
# (The hops start in a command substitution: their ids go to a file.)
cleanup() { for p in "${PIDS[@]}" $(cat "$OUT/hop.pids" 2>/dev/null); do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Waits for a line matching $2 in log $1 and prints its last field.
await() {
    local log="$1" pattern="$2" v
    for _ in $(seq 1 150); do
        v="$(grep -E "$pattern" "$log" | head -1 | awk '{print $NF}' || true)"
        [[ -n "$v" ]] && { echo "$v"; return 0; }
        sleep 0.1
    done
    echo "no \"$pattern\" in $log:" >&2; cat "$log" >&2; return 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for i in $(seq 1 16); do
    echo "{\"reqId\": \"$i\", \"username\": \"user$i\", \"password\": \"pw$i\"}"
done | "$PP" encode --proto "$PROTO_DIR/social_network.proto" -I "$PROTO_DIR" \
    --type socialnetwork.LoginRequest --delimited >"$OUT/login.ldelim"

export OTLP_GRPC_PORT TRACES_FILE="$OUT/traces.json" METRICS_FILE="$OUT/metrics.json"
# Metrics pushed every 500 ms (and at exit), not every minute.
export OTEL_METRIC_EXPORT_INTERVAL=500
OTLP_GRPC_PORT="$(free_port)"
"$OUT/otelcol" --config "$ROOT/tests/tracing/collector/config.yaml" >"$OUT/collector.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q "Everything is ready" "$OUT/collector.log" && break; sleep 0.1; done
grep -q "Everything is ready" "$OUT/collector.log" || { echo "the collector did not start" >&2; cat "$OUT/collector.log" >&2; exit 1; }
OTLP="http://127.0.0.1:$OTLP_GRPC_PORT"

# Monolithic backend.
"$PP" serve --port 0 --otlp-endpoint "$OTLP" --service-name pp-backend >"$OUT/serve.log" 2>&1 &
SERVE_PID=$!; PIDS+=($SERVE_PID)
SERVE="$(await "$OUT/serve.log" '^listening on')"

# Split backend: the engine (JSON logs) and the application.
SOCK="$OUT/engine.sock"
RUST_LOG=info "$PP" engine --log-format json --grpc-port 0 --attach "$SOCK" \
    --otlp-endpoint "$OTLP" --service-name pp-engine >"$OUT/engine.log" 2>&1 &
ENGINE_PID=$!; PIDS+=($ENGINE_PID)
ENGINE="$(await "$OUT/engine.log" '^grpc listening on')"
await "$OUT/engine.log" '^attach at' >/dev/null
"$PP" serve --attach "$SOCK" --otlp-endpoint "$OTLP" --service-name pp-backend-split >"$OUT/app.log" 2>&1 &
APP_PID=$!; PIDS+=($APP_PID)
await "$OUT/engine.log" 'attached for' >/dev/null

hop() { # name upstream -> prints the hop's address
    "$OUT/hop" --upstream "$2" --otlp "127.0.0.1:$OTLP_GRPC_PORT" --service-name "grpc-go-hop-$1" \
        >"$OUT/hop-$1.log" 2>"$OUT/hop-$1.err" &
    echo $! >>"$OUT/hop.pids"
    await "$OUT/hop-$1.log" '^listening on'
}
HOP_MONO="$(hop mono "$SERVE")"
HOP_SPLIT="$(hop split "$ENGINE")"

load() { # name target
    "$PP" load --target "$2" --method socialnetwork.SocialNetwork/Login \
        --proto "$PROTO_DIR/social_network.proto" -I "$PROTO_DIR" --data "$OUT/login.ldelim" \
        --requests "$REQUESTS" --concurrency 4 --otlp-endpoint "$OTLP" --service-name "pp-client-$1" \
        --json "$OUT/load-$1.json" >"$OUT/load-$1.txt" 2>&1 \
        || { echo "load through the $1 hop failed:" >&2; cat "$OUT/load-$1.txt" >&2; exit 1; }
}
load mono "$HOP_MONO"
load split "$HOP_SPLIT"
mapfile -t HOP_PIDS <"$OUT/hop.pids"

# The backends flush their spans (and serve and the engine their metrics)
# when they stop; the hops flush on SIGTERM.
kill -TERM "$SERVE_PID" "$APP_PID"
wait "$SERVE_PID" "$APP_PID" || true
kill -TERM "$ENGINE_PID"
wait "$ENGINE_PID" || true
for p in "${HOP_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done

# grpc-go's client (the hop's) pings as it reads a large response (its BDP
# pings, each after a WINDOW_UPDATE): the server must count the data it
# sends on that credit, not take the pings for abuse (ENHANCE_YOUR_CALM).
"$PP" interop-server --port 0 >"$OUT/interop-server.log" 2>&1 &
PIDS+=($!)
INTEROP="$(await "$OUT/interop-server.log" '^listening on')"
HOP_BIG="$(hop big "$INTEROP")"
for i in 1 2 3; do
    if ! "$PP" interop-client --server_host 127.0.0.1 --server_port "${HOP_BIG##*:}" \
        --test_case huge_unary >"$OUT/huge-$i.log" 2>&1; then
        echo "FAIL  huge_unary (16 MiB each way) through the grpc-go hop, run $i:" >&2
        cat "$OUT/huge-$i.log" >&2
        exit 1
    fi
done
echo "ok    huge_unary (16 MiB each way) through the grpc-go hop, 3 runs: no too_many_pings"

python3 - "$OUT" <<'PYEOF'
import json, sys, time
out = sys.argv[1]
want = {m: json.load(open(f"{out}/load-{m}.json"))["calls_made"] for m in ("mono", "split")}

def spans():
    found = []
    try:
        lines = open(f"{out}/traces.json").read().splitlines()
    except FileNotFoundError:
        return found
    for line in lines:
        if not line.strip():
            continue
        for rs in json.loads(line).get("resourceSpans", []):
            attrs = {a["key"]: a["value"] for a in rs.get("resource", {}).get("attributes", [])}
            service = attrs.get("service.name", {}).get("stringValue", "")
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    s["service"] = service
                    s["attrs"] = {a["key"]: a["value"] for a in s.get("attributes", [])}
                    found.append(s)
    return found

def chains(all_spans, mode):
    by_parent = {}
    for s in all_spans:
        by_parent.setdefault((s["traceId"], s.get("parentSpanId", "")), []).append(s)
    def child(s, service, kind):
        for c in by_parent.get((s["traceId"], s["spanId"]), []):
            if c["service"] == service and c["kind"] == kind:
                return c
        return None
    backend = "pp-backend" if mode == "mono" else "pp-backend-split"
    complete, bad = 0, []
    roots = [s for s in all_spans if s["service"] == f"pp-client-{mode}" and s["kind"] == 3]
    for root in roots:
        h1 = child(root, f"grpc-go-hop-{mode}", 2)
        h2 = h1 and child(h1, f"grpc-go-hop-{mode}", 3)
        b = h2 and child(h2, backend, 2)
        if not b:
            bad.append(root["spanId"])
            continue
        a = b["attrs"]
        ok = (a.get("rpc.system", {}).get("stringValue") == "grpc"
              and a.get("rpc.service", {}).get("stringValue") == "socialnetwork.SocialNetwork"
              and a.get("rpc.method", {}).get("stringValue") == "Login"
              and str(a.get("rpc.grpc.status_code", {}).get("intValue")) == "0"
              and a.get("network.peer.address", {}).get("stringValue") == "127.0.0.1"
              and b["name"] == "socialnetwork.SocialNetwork/Login"
              and "parentSpanId" not in root)
        if ok:
            complete += 1
        else:
            bad.append(f"{root['spanId']}: backend span {json.dumps(b)[:400]}")
    return len(roots), complete, bad

deadline = time.time() + 20
while True:
    found = spans()
    results = {m: chains(found, m) for m in want}
    if all(results[m][1] >= want[m] for m in want) or time.time() > deadline:
        break
    time.sleep(0.25)

failed = False
for m in want:
    roots, complete, bad = results[m]
    line = f"{m}: {want[m]} calls made, {roots} client spans, {complete} complete traces (client → grpc-go → grpc-go → backend)"
    if roots == want[m] and complete == want[m]:
        print("ok   ", line)
    else:
        print("FAIL ", line)
        for b in bad[:5]:
            print("      missing or wrong:", b)
        failed = True
print(f"      ({len(found)} spans in the collector's file)")

# Metrics over OTLP: the last push of serve (monolithic) and of the engine
# (split) counts exactly the calls each load made, under A66's names.
def last_points(service, metric):
    points = []
    try:
        lines = open(f"{out}/metrics.json").read().splitlines()
    except FileNotFoundError:
        return points
    for line in lines:
        if not line.strip():
            continue
        for rm in json.loads(line).get("resourceMetrics", []):
            attrs = {a["key"]: a["value"] for a in rm.get("resource", {}).get("attributes", [])}
            if attrs.get("service.name", {}).get("stringValue") != service:
                continue
            for sm in rm.get("scopeMetrics", []):
                for m in sm.get("metrics", []):
                    if m["name"] == metric:
                        data = m.get("sum") or m.get("histogram") or m.get("gauge") or {}
                        points.append(data.get("dataPoints", []))
    return points[-1] if points else []

def login(points, key):
    for p in points:
        a = {x["key"]: x["value"].get("stringValue") for x in p.get("attributes", [])}
        if a.get("grpc.method") == "socialnetwork.SocialNetwork/Login" and a.get("grpc.status", "OK") == "OK":
            return float(p.get(key, 0))
    return None

for mode, service in (("mono", "pp-backend"), ("split", "pp-engine")):
    started = login(last_points(service, "grpc.server.call.started"), "asDouble")
    ended = login(last_points(service, "grpc.server.call.duration"), "count")
    ok = started == want[mode] and ended == want[mode]
    print("ok   " if ok else "FAIL ", f"{service} metrics over OTLP: grpc.server.call.started {started}, grpc.server.call.duration count {ended} for Login; {want[mode]} calls made")
    failed |= not ok
apps = last_points("pp-engine", "protoplane_engine_applications")
ok = bool(apps)
print("ok   " if ok else "FAIL ", f"pp-engine's own families over OTLP: protoplane_engine_applications {[p.get('asDouble') for p in apps]}")
failed |= not ok

# The engine's JSON log line for the attachment.
attached = [l for l in open(f"{out}/engine.log") if "attached for" in l]
try:
    rec = json.loads(attached[0])
    ok = (rec.get("level") == "INFO" and rec.get("target") == "protoplane_engine"
          and "socialnetwork.SocialNetwork" in rec["fields"]["message"]
          and isinstance(rec["fields"].get("app"), int))
except Exception as e:
    ok, rec = False, f"{e}: {attached[:1]}"
print("ok   " if ok else "FAIL ", "engine --log-format json: the attach line is one JSON object with level, target and fields", "" if ok else rec)
failed |= not ok
sys.exit(1 if failed else 0)
PYEOF
