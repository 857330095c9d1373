#!/usr/bin/env bash
# Many backends from the command line: `protoplane load --target ... --lb`
# against four `protoplane serve --metrics-addr` processes, each server's
# share read from its own /metrics (what a check from outside reads).
#
#   - round_robin over `ipv4:A,B,C,D`: every server within 5% of a quarter
#     of the calls the load generator made (`calls_made`);
#   - pick_first over the same list: the first server takes every call;
#   - `dns:///localhost:PORT` connects and is served;
#   - weighted_round_robin (gRFC A58) over the same four, which report
#     their load (`serve --orca`: measured CPU utilization and call rate
#     in every call's trailers), two of them spending 200 µs of CPU more
#     per call (`--work-us 200`): each light server gets at least twice
#     the calls of each heavy one (a quarter each under round_robin);
#   - hedging (gRFC A6) around a slow server: round robin over three
#     servers and one that waits 100 ms before each call (`--delay-us`);
#     with `hedgingPolicy` (another attempt every 10 ms, four at most:
#     round robin may send a hedge to the slow server too) no call waits
#     for it: p99 under half its delay, and the p99 without hedging and
#     the ratio printed;
#   - round_robin under load while one server is stopped with SIGTERM (a
#     graceful drain): no call fails, and the three others take the rest.
#
# usage: tests/lb/run.sh [--protoplane PATH]
# Logs: target/lb-check/*
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PP="$ROOT/target/release/protoplane"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --protoplane) PP="$2"; shift 2 ;;
        *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done
OUT="$ROOT/target/lb-check"
rm -rf "$OUT"; mkdir -p "$OUT"
source "$ROOT/tests/lib/backends.sh"
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

login_data
for i in 0 1 2 3; do
    work=(); [[ $i -ge 2 ]] && work=(--work-us 200)
    start_backend "$i" --orca "${work[@]}"
done
SERVER_PIDS=("${PIDS[@]}")
LIST="ipv4:127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]},127.0.0.1:${PORTS[3]}"

load() { # name target policy extra...
    local name="$1" target="$2" lb="$3"; shift 3
    run_load "$name" --target "$target" --lb "$lb" "$@"
}

# Round robin: a quarter each.
read -r -a before <<<"$(counts)"
read -r made errors < <(load rr "$LIST" round_robin --requests 8000)
read -r -a after <<<"$(counts)"
got=(); for i in 0 1 2 3; do got+=($((after[i] - before[i]))); done
if python3 - "$made" "${got[@]}" <<'EOF'
import sys
made, got = int(sys.argv[1]), [int(x) for x in sys.argv[2:]]
q = made / 4
sys.exit(0 if sum(got) == made and all(abs(n - q) <= 0.05 * q for n in got) else 1)
EOF
then pass "round_robin: ${got[*]} of $made calls (each within 5% of a quarter), $errors failed"
else fail "round_robin: ${got[*]} of $made calls, not a quarter each within 5%"; fi
[[ "$errors" == 0 ]] || fail "round_robin: $errors failed calls"

# Pick first: all on the first address.
read -r -a before <<<"$(counts)"
read -r made errors < <(load pf "$LIST" pick_first --requests 2000)
read -r -a after <<<"$(counts)"
got=(); for i in 0 1 2 3; do got+=($((after[i] - before[i]))); done
if [[ "${got[0]}" == "$made" && "${got[1]}${got[2]}${got[3]}" == 000 && "$errors" == 0 ]]; then
    pass "pick_first: ${got[*]} of $made calls (all on the first address)"
else fail "pick_first: ${got[*]} of $made calls, $errors failed"; fi

# DNS.
read -r made errors < <(load dns "dns:///localhost:${PORTS[2]}" pick_first --requests 500)
if [[ "$errors" == 0 && "$made" -ge 500 ]]; then pass "dns:///localhost:${PORTS[2]}: $made calls"
else fail "dns:///localhost: $made calls, $errors failed"; fi

# Weighted round robin: the heavy servers report more CPU per call.
cat >"$OUT/wrr.json" <<'EOF'
{"loadBalancingConfig": [{"weighted_round_robin": {"blackoutPeriod": "1s", "weightUpdatePeriod": "0.2s"}}]}
EOF
read -r -a before <<<"$(counts)"
read -r made errors < <(load wrr "$LIST" round_robin --service-config "$OUT/wrr.json" --warmup 3 --duration 3)
read -r -a after <<<"$(counts)"
got=(); for i in 0 1 2 3; do got+=($((after[i] - before[i]))); done
if python3 - "${got[@]}" <<'EOF'
import sys
light, heavy = [int(x) for x in sys.argv[1:3]], [int(x) for x in sys.argv[3:5]]
sys.exit(0 if min(light) >= 2 * max(heavy) > 0 else 1)
EOF
then pass "weighted_round_robin (service config): light ${got[0]} ${got[1]}, heavy (--work-us 200) ${got[2]} ${got[3]} of $made calls (warm-up included), $errors failed"
else fail "weighted_round_robin: light ${got[0]} ${got[1]}, heavy ${got[2]} ${got[3]}: light not at least twice heavy"; fi
[[ "$errors" == 0 ]] || fail "weighted_round_robin: $errors failed calls"

# Hedging around a slow server.
start_backend 4 --delay-us 100000
SLOW_LIST="ipv4:127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]},127.0.0.1:${PORTS[4]}"
cat >"$OUT/hedge.json" <<'EOF'
{"methodConfig": [{"name": [{"service": "socialnetwork.SocialNetwork"}],
  "hedgingPolicy": {"maxAttempts": 4, "hedgingDelay": "0.01s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}
EOF
p99() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["latency_us"]["p99"])' "$OUT/load-$1.json"; }
read -r made_off errors_off < <(load hedge-off "$SLOW_LIST" round_robin --requests 1600)
read -r made_on errors_on < <(load hedge-on "$SLOW_LIST" round_robin --requests 1600 --service-config "$OUT/hedge.json")
off="$(p99 hedge-off)"; on="$(p99 hedge-on)"
if [[ "$errors_off$errors_on" == 00 ]] && python3 -c "import sys; sys.exit(0 if $on < 50000 else 1)"; then
    pass "hedging around a server 100 ms slow: p99 $(printf '%.0f' "$on") µs hedged, $(printf '%.0f' "$off") µs without ($(python3 -c "print(f'{$on / $off:.2f}')")×), $made_on and $made_off calls, none failed"
else fail "hedging: p99 $on µs hedged (not under 50 ms?), $off µs without; $errors_on and $errors_off failed"; fi

# A server drained under load (SIGTERM): no call fails.
load drain "$LIST" round_robin --duration 3 >"$OUT/drain.out" &
LOAD=$!
sleep 1
kill -TERM "${SERVER_PIDS[1]}"
wait "$LOAD" || { fail "load during the drain"; cat "$OUT/load-drain.txt"; }
read -r made errors <"$OUT/drain.out"
if [[ "$errors" == 0 ]]; then
    pass "round_robin while server 1 drained (SIGTERM at 1 s of 3): $made calls, none failed"
else fail "round_robin while a server drained: $errors of $made calls failed"; fi
exit "$failed"
