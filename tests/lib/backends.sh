# Shared by the many-backend checks (tests/lb/run.sh, tests/xds/run.sh):
# social-network Login requests, `protoplane serve` backends with their
# metrics endpoints, each backend's count of Login calls from its own
# /metrics, and a load run's outcome. Source it after setting PP, OUT and
# ROOT; it keeps PIDS (killed on exit), PORTS and METRICS.

PROTO_DIR="$ROOT/protos/socialnetwork"
DATA="$OUT/login.ldelim"
METHOD=socialnetwork.SocialNetwork/Login
PIDS=(); PORTS=(); METRICS=()

await() { # log pattern: the last field of the first matching line
    local log="$1" pattern="$2" v
    for _ in $(seq 1 150); do
        v="$(grep -E "$pattern" "$log" | head -1 | awk '{print $NF}' || true)"
        [[ -n "$v" ]] && { echo "$v"; return 0; }
        sleep 0.1
    done
    echo "no \"$pattern\" in $log:" >&2; cat "$log" >&2; return 1
}
hostport() { sed -E 's#^http://##; s#/metrics$##' <<<"$1"; }

# 32 Login requests, written here (no dataset needed).
login_data() {
    for i in $(seq 1 32); do
        echo "{\"reqId\": \"$i\", \"username\": \"user$i\", \"password\": \"pw$i\"}"
    done | "$PP" encode --proto "$PROTO_DIR/social_network.proto" -I "$PROTO_DIR" \
        --type socialnetwork.LoginRequest --delimited >"$DATA"
}

# Starts backend $1 (`serve` with extra flags after it); its port and
# metrics address go to PORTS[$1] and METRICS[$1].
start_backend() {
    local i="$1"; shift
    "$PP" serve --port 0 --metrics-addr 127.0.0.1:0 "$@" >"$OUT/serve-$i.log" 2>&1 &
    PIDS+=($!)
    METRICS[$i]="$(hostport "$(await "$OUT/serve-$i.log" '^metrics on')")"
    PORTS[$i]="$(await "$OUT/serve-$i.log" '^listening on' | sed 's/.*://')"
}

# Login calls backend $1 has counted.
served() {
    curl -sf "http://${METRICS[$1]}/metrics" |
        awk -v m="grpc_method=\"$METHOD\"" 'index($0, "grpc_server_call_started_total{") == 1 && index($0, m) { print $NF }' |
        head -1 | awk '{ print ($1 == "" ? 0 : $1) }'
}
counts() { local c=(); for i in "${!METRICS[@]}"; do c+=("$(served "$i")"); done; echo "${c[@]}"; }

# A load run (`load --method Login` with the arguments given) named $1:
# prints "calls_made failed" (an aborted run counts as a failure).
run_load() {
    local name="$1"; shift
    "$PP" load --method "$METHOD" --proto "$PROTO_DIR/social_network.proto" -I "$PROTO_DIR" \
        --data "$DATA" --concurrency 16 --json "$OUT/load-$name.json" --quiet "$@" >"$OUT/load-$name.txt" 2>&1 ||
        { echo "FAIL  load $name:" >&2; cat "$OUT/load-$name.txt" >&2; return 1; }
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["calls_made"], sum(j["errors"].values()) + (j["aborted"] is not None))' "$OUT/load-$name.json"
}

failed=0
pass() { echo "ok    $*"; }
fail() { echo "FAIL  $*"; failed=1; }
