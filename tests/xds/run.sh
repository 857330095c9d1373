#!/usr/bin/env bash
# xds:/// targets against a real control plane: a Go program built on
# Envoy's go-control-plane (tests/xds/controlplane: its SnapshotCache and
# ADS server, installed from the Go module proxy here), which takes a
# snapshot per line on stdin. Four `protoplane serve --metrics-addr`
# backends; `protoplane load --target xds:///sn`; each backend's share
# read from its own /metrics.
#
#   1. endpoint weights: two endpoints weighted 1 and 3 get 1:3 of the
#      calls (each within 5%);
#   2. endpoints replaced under load (one removed, one added) with no
#      failed call, and the removed one gets no new call a second after;
#   3. a route change (another cluster) is applied: every call goes there;
#   4. a bad resource (a STATIC cluster) is NACKed, named in the NACK, and
#      the last good configuration stays in use: calls still succeed;
#   5. weighted clusters 70/30 (gRFC A28) split the calls within 5%;
#   6. grpc-go's own xDS client (tests/xds/grpcgo-client) as the reference:
#      on the snapshot of 5, it and `protoplane load` (4000 calls each)
#      give every backend the same share of the calls within 5 points;
#   7. a LOGICAL_DNS cluster (gRFC A37), localhost:PORT: every call goes
#      to that backend, resolved by DNS, not EDS;
#   8. mutual TLS to the management server (gRFC A65 `tls` credentials):
#      a second control plane serving TLS and requiring client
#      certificates (openssl-made CA); calls succeed with the bootstrap's
#      CA and client certificate, and all fail with another CA's roots.
#
# usage: tests/xds/run.sh [--protoplane PATH]
# Logs: target/xds-check/*
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PP="$ROOT/target/release/protoplane"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --protoplane) PP="$2"; shift 2 ;;
        *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done
OUT="$ROOT/target/xds-check"
rm -rf "$OUT"; mkdir -p "$OUT" "$ROOT/target/go-bin"
CP="$ROOT/target/go-bin/xds-controlplane"

echo "building the control plane (go-control-plane, from the Go module proxy)"
(cd "$ROOT/tests/xds/controlplane" && GOFLAGS=-buildvcs=false go build -mod=readonly -o "$CP" .) >"$OUT/build.log" 2>&1 ||
    { cat "$OUT/build.log" >&2; exit 1; }
# grpc-go's own xDS client (tests/xds/grpcgo-client), the reference for the
# last check. A failed build fails that check (below), it is not skipped.
GG="$ROOT/target/go-bin/xds-grpcgo-client"
echo "building grpc-go's xDS client (google.golang.org/grpc, from the Go module proxy)"
GG_BUILT=0
(cd "$ROOT/tests/xds/grpcgo-client" && GOFLAGS=-buildvcs=false go build -mod=readonly -o "$GG" .) >"$OUT/build-grpcgo.log" 2>&1 &&
    GG_BUILT=1

source "$ROOT/tests/lib/backends.sh"
cleanup() { exec 3>&- 4>&- 2>/dev/null || true; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

login_data
for i in 0 1 2 3; do start_backend "$i"; done

mkfifo "$OUT/cp.in"
"$CP" --port 0 <"$OUT/cp.in" >"$OUT/cp.log" 2>&1 &
PIDS+=($!)
exec 3>"$OUT/cp.in"
CP_ADDR="$(await "$OUT/cp.log" '^xds listening on')"
cat >"$OUT/bootstrap.json" <<EOF
{"xds_servers": [{"server_uri": "$CP_ADDR", "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
 "node": {"id": "protoplane-load", "cluster": "test", "locality": {"zone": "a"}}}
EOF
export GRPC_XDS_BOOTSTRAP="$OUT/bootstrap.json"

# A snapshot: version, the route's action (JSON), each cluster's endpoints
# as "name=port:weight,port:weight" ... and optional extra clusters JSON.
snapshot() { # version action endpoints-spec [cluster-type-of-c2]
    local version="$1" action="$2" spec="$3" c2type="${4:-EDS}"
    python3 - "$version" "$action" "$spec" "$c2type" <<'EOF' >&3
import json, sys
version, action, spec, c2type = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
endpoints = []
for part in spec.split():
    name, eps = part.split("=")
    endpoints.append({"cluster": name, "localities": [{"zone": "a", "weight": 1, "endpoints": [
        {"address": "127.0.0.1", "port": int(p), "weight": int(w)} for p, w in (e.split(":") for e in eps.split(","))]}]})
route = {"prefix": ""}; route.update(action)
print(json.dumps({"version": version,
    "listeners": [{"name": "sn", "route_config": "sn-routes"}],
    "routes": [{"name": "sn-routes", "domains": ["*"], "routes": [route]}],
    "clusters": [{"name": "c1", "eds_service_name": "c1"}, {"name": "c2", "eds_service_name": "c2", "type": c2type}],
    "endpoints": endpoints}), flush=True)
EOF
    await "$OUT/cp.log" "^snapshot $version set" >/dev/null
}

load() { # name extra...
    local name="$1"; shift
    run_load "$name" --target xds:///sn "$@"
}
delta() { local -n b=$1 a=$2; local d=(); for i in 0 1 2 3; do d+=($((a[i] - b[i]))); done; echo "${d[@]}"; }
P0=${PORTS[0]}; P1=${PORTS[1]}; P2=${PORTS[2]}; P3=${PORTS[3]}

# 1. Endpoint weights 1:3.
snapshot 1 '{"cluster": "c1"}' "c1=$P0:1,$P1:3 c2=$P3:1"
read -r -a before <<<"$(counts)"
read -r made errors < <(load weights --requests 8000)
read -r -a after <<<"$(counts)"
read -r -a got <<<"$(delta before after)"
if python3 -c "import sys; a,b=${got[0]},${got[1]}; t=a+b; sys.exit(0 if t==$made and abs(a-t/4)<=0.05*t/4 and abs(b-3*t/4)<=0.05*3*t/4 and ${got[2]}+${got[3]}==0 else 1)"; then
    pass "endpoint weights 1:3: ${got[0]} and ${got[1]} of $made calls (each within 5%), $errors failed"
else fail "endpoint weights 1:3: got ${got[*]} of $made calls"; fi
[[ "$errors" == 0 ]] || fail "endpoint weights: $errors failed calls"

# 2. Endpoints replaced under load: P1 removed, P2 added.
load swap --duration 4 >"$OUT/swap.out" &
LOAD=$!
sleep 1
snapshot 2 '{"cluster": "c1"}' "c1=$P0:1,$P2:1 c2=$P3:1"
sleep 1
removed_at="$(served 1)"
wait "$LOAD" || fail "load during the endpoint change"
read -r made errors <"$OUT/swap.out"
removed_end="$(served 1)"
if [[ "$errors" == 0 && "$removed_at" == "$removed_end" && "$(served 2)" -gt 0 ]]; then
    pass "endpoints replaced under load: $made calls, none failed; the removed endpoint got none after 1 s ($removed_end in all)"
else fail "endpoints replaced under load: $errors failed of $made; removed endpoint $removed_at -> $removed_end"; fi

# 3. A route change: everything to c2.
snapshot 3 '{"cluster": "c2"}' "c1=$P0:1,$P2:1 c2=$P3:1"
sleep 0.5
read -r -a before <<<"$(counts)"
read -r made errors < <(load route --requests 2000)
read -r -a after <<<"$(counts)"
read -r -a got <<<"$(delta before after)"
if [[ "${got[3]}" == "$made" && "$errors" == 0 ]]; then pass "route change applied: ${got[*]} of $made calls (all on c2)"
else fail "route change: ${got[*]} of $made calls, $errors failed"; fi

# 4. A bad resource pushed under load: c2 as a STATIC cluster is NACKed and
#    the running client keeps its last good c2.
read -r -a before <<<"$(counts)"
load nack --duration 3 >"$OUT/nack.out" &
LOAD=$!
sleep 1
snapshot 4 '{"cluster": "c2"}' "c1=$P0:1,$P2:1 c2=$P3:1" STATIC
wait "$LOAD" || fail "load during the bad push"
read -r made errors <"$OUT/nack.out"
read -r -a after <<<"$(counts)"
read -r -a got <<<"$(delta before after)"
nack="$(grep -E 'type=type.googleapis.com/envoy.config.cluster.v3.Cluster .*ack=no' "$OUT/cp.log" | head -1 || true)"
if [[ -n "$nack" && "$nack" == *STATIC* && "$errors" == 0 && "${got[3]}" == "$made" ]]; then
    pass "bad cluster NACKed (\"${nack##*detail=}\"), the last good one kept: $made calls on c2, none failed"
else fail "bad cluster: NACK line [$nack], ${got[*]} of $made calls, $errors failed"; fi

# 5. Weighted clusters 70/30.
snapshot 5 '{"weighted_clusters": [{"name": "c1", "weight": 70}, {"name": "c2", "weight": 30}]}' "c1=$P0:1 c2=$P3:1"
sleep 0.5
read -r -a before <<<"$(counts)"
read -r made errors < <(load weighted --requests 8000)
read -r -a after <<<"$(counts)"
read -r -a got <<<"$(delta before after)"
if python3 -c "import sys; a,b=${got[0]},${got[3]}; t=a+b; sys.exit(0 if t==$made and abs(a-0.7*t)<=0.05*0.7*t and abs(b-0.3*t)<=0.05*0.3*t else 1)"; then
    pass "weighted clusters 70/30: ${got[0]} and ${got[3]} of $made calls (each within 5%), $errors failed"
else fail "weighted clusters 70/30: got ${got[*]} of $made calls"; fi

# 6. grpc-go's own xDS client as the reference, on the snapshot of 5 (70/30
#    over c1 = P0 and c2 = P3): protoplane's load, then grpc-go's client
#    (tests/xds/grpcgo-client), 4000 calls each at concurrency 16; each
#    backend's count delta from its /metrics for each run. Passes if no
#    call failed and every backend's share differs by at most 5 points.
#    Not on the 1:3 snapshot of 1: grpc-go's round_robin ignores endpoint
#    weights (they feed only ring_hash and weighted pick_first there), so it
#    spreads those calls 50:50 where protoplane, like Envoy, gives 1:3.
REF="grpc-go xDS client as reference"
if [[ "$GG_BUILT" != 1 ]]; then
    fail "$REF: grpc-go's xDS client (tests/xds/grpcgo-client) could not be built (no Go module proxy, or a compile error): $(tail -3 "$OUT/build-grpcgo.log" | tr '\n' ' ')(all of it in $OUT/build-grpcgo.log)"
else
    N=4000
    read -r -a b0 <<<"$(counts)"
    read -r pmade perrors < <(load reference --requests "$N") || true
    read -r -a b1 <<<"$(counts)"
    gline="$("$GG" --target xds:///sn --requests "$N" --concurrency 16 2>"$OUT/grpcgo-client.log")" ||
        fail "$REF: grpc-go's client exited non-zero: $(tail -1 "$OUT/grpcgo-client.log")"
    read -r -a b2 <<<"$(counts)"
    read -r gmade gfailed <<<"$(sed -nE 's/^calls_made=([0-9]+) failed=([0-9]+)$/\1 \2/p' <<<"$gline")" || true
    read -r -a p <<<"$(delta b0 b1)"
    read -r -a g <<<"$(delta b1 b2)"
    spread="protoplane ${p[*]} of ${pmade:-?}, grpc-go ${g[*]} of ${gmade:-?} (backends 0-3)"
    if [[ "${perrors:-}" == 0 && "${gfailed:-}" == 0 ]] && python3 -c '
import sys
pm, gm = int(sys.argv[1]), int(sys.argv[2])
p, g = [int(x) for x in sys.argv[3].split()], [int(x) for x in sys.argv[4].split()]
sys.exit(0 if sum(p) == pm > 0 and sum(g) == gm > 0 and all(abs(a / pm - b / gm) <= 0.05 for a, b in zip(p, g)) else 1)
' "$pmade" "$gmade" "${p[*]}" "${g[*]}"; then
        pass "$REF: $spread, each backend's share within 5 points, none failed"
    else fail "$REF: $spread; failed calls: protoplane ${perrors:-?}, grpc-go ${gfailed:-?}"; fi
fi
# 7. A LOGICAL_DNS cluster: the route goes to "dns1", localhost:P1, which
#    no EDS resource describes.
python3 - "$P1" <<'EOF' >&3
import json, sys
print(json.dumps({"version": "7",
    "listeners": [{"name": "sn", "route_config": "sn-routes"}],
    "routes": [{"name": "sn-routes", "domains": ["*"], "routes": [{"prefix": "", "cluster": "dns1"}]}],
    "clusters": [{"name": "dns1", "type": "LOGICAL_DNS", "dns": "localhost:" + sys.argv[1]}],
    "endpoints": []}), flush=True)
EOF
await "$OUT/cp.log" "^snapshot 7 set" >/dev/null
sleep 0.5
read -r -a before <<<"$(counts)"
read -r made errors < <(load dns --requests 2000) || true
read -r -a after <<<"$(counts)"
read -r -a got <<<"$(delta before after)"
if [[ "${errors:-}" == 0 && "${got[1]}" == "$made" ]]; then
    pass "LOGICAL_DNS cluster (localhost:$P1): ${got[*]} of $made calls (all on backend 1), none failed"
else fail "LOGICAL_DNS cluster: ${got[*]} of ${made:-?} calls, ${errors:-?} failed"; fi

# 8. Mutual TLS to the management server: a CA, a server certificate for
#    127.0.0.1 and a client certificate (openssl), a second control plane
#    with --tls-cert/--client-ca, and one snapshot (everything to P0).
PKI="$OUT/pki"; mkdir -p "$PKI"
mkcert() { # name subject-alt-name-or-empty extended-key-usage
    local n="$1" san="$2" eku="$3"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/$n.key" \
        -out "$PKI/$n.csr" -subj "/CN=$n" 2>/dev/null
    { [[ -n "$san" ]] && echo "subjectAltName=$san"; echo "extendedKeyUsage=$eku"; } >"$PKI/$n.ext"
    openssl x509 -req -in "$PKI/$n.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" -CAcreateserial \
        -out "$PKI/$n.pem" -days 2 -extfile "$PKI/$n.ext" 2>/dev/null
}
TLS_OK=0
if openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/ca.key" \
        -out "$PKI/ca.pem" -days 2 -subj /CN=protoplane-test-ca 2>/dev/null &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/other.key" \
        -out "$PKI/other.pem" -days 2 -subj /CN=another-ca 2>/dev/null &&
    mkcert server IP:127.0.0.1 serverAuth && mkcert client "" clientAuth; then
    TLS_OK=1
fi
if [[ "$TLS_OK" != 1 ]]; then
    fail "mutual TLS to the management server: openssl could not make the certificates"
else
    mkfifo "$OUT/cp-tls.in"
    "$CP" --port 0 --tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key" --client-ca "$PKI/ca.pem" \
        <"$OUT/cp-tls.in" >"$OUT/cp-tls.log" 2>&1 &
    PIDS+=($!)
    exec 4>"$OUT/cp-tls.in"
    TLS_ADDR="$(await "$OUT/cp-tls.log" '^xds listening on')"
    python3 - "$P0" <<'EOF' >&4
import json, sys
print(json.dumps({"version": "t1",
    "listeners": [{"name": "sn", "route_config": "sn-routes"}],
    "routes": [{"name": "sn-routes", "domains": ["*"], "routes": [{"prefix": "", "cluster": "c1"}]}],
    "clusters": [{"name": "c1", "eds_service_name": "c1"}],
    "endpoints": [{"cluster": "c1", "localities": [{"zone": "a", "weight": 1, "endpoints": [
        {"address": "127.0.0.1", "port": int(sys.argv[1]), "weight": 1}]}]}]}), flush=True)
EOF
    await "$OUT/cp-tls.log" "^snapshot t1 set" >/dev/null
    tls_boot() { # file roots
        cat >"$1" <<EOF
{"xds_servers": [{"server_uri": "$TLS_ADDR", "server_features": ["xds_v3"], "channel_creds": [{"type": "tls",
  "config": {"ca_certificate_file": "$2", "certificate_file": "$PKI/client.pem", "private_key_file": "$PKI/client.key"}}]}],
 "node": {"id": "protoplane-tls", "cluster": "test"}}
EOF
    }
    tls_boot "$OUT/bootstrap-tls.json" "$PKI/ca.pem"
    tls_boot "$OUT/bootstrap-other-ca.json" "$PKI/other.pem"
    read -r -a before <<<"$(counts)"
    read -r made errors < <(GRPC_XDS_BOOTSTRAP="$OUT/bootstrap-tls.json" load tls --requests 1000) || true
    read -r -a after <<<"$(counts)"
    read -r -a got <<<"$(delta before after)"
    # Another CA: the handshake with the management server fails, the
    # client never gets its configuration, and each call ends at its
    # deadline.
    GRPC_XDS_BOOTSTRAP="$OUT/bootstrap-other-ca.json" "$PP" load --target xds:///sn --method "$METHOD" \
        --proto "$PROTO_DIR/social_network.proto" -I "$PROTO_DIR" --data "$DATA" --concurrency 4 \
        --requests 8 --timeout 1500 --json "$OUT/load-tls-other.json" >"$OUT/load-tls-other.txt" 2>&1 || true
    read -r bok bfailed bcodes < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); e=j["errors"]; print(j["ok"], sum(e.values()), ",".join(sorted(e)) or "-")' "$OUT/load-tls-other.json" 2>/dev/null) || true
    if [[ "${errors:-}" == 0 && "${made:-0}" -gt 0 && "${got[0]}" == "$made" && "${bok:-}" == 0 && "${bfailed:-0}" -gt 0 ]]; then
        pass "mutual TLS to the management server: $made calls with the right CA, none failed, all on the snapshot's endpoint; with another CA's roots none succeeded ($bfailed ended $bcodes, never configured)"
    else fail "mutual TLS: right CA ${made:-?} calls, ${errors:-?} failed, ${got[*]} served; other CA ${bok:-?} ok, ${bfailed:-?} failed (see $OUT/load-tls*.txt)"; fi
fi
exit "$failed"
