#!/usr/bin/env bash
# The in-network computation's fault matrix: every application as separate
# processes (`protoplane inc run`) under each failure the README's failure
# model lists, one line per case with the run's own verdict. Every run
# checks each value against an independent computation of the inputs; the
# member-crash case under `MemberLoss: fail` must end `exact: no` with the
# reason (that is its correct outcome). Usage: scripts/inc-faults.sh [SEEDS]
set -u
cd "$(dirname "$0")/.."
seeds=${1:-3}
cargo build --release -q -p protoplane-cli -p protoplane-inc-examples || exit 1
bin=target/release/protoplane
faults=(--loss 0.1 --dup 0.1 --reorder 0.1)
failed=0
run() { # expected-verdict case-name args...
  local want=$1 name=$2
  shift 2
  local start out last err
  start=$(date +%s%N)
  err=$(mktemp)
  out=$("$bin" inc run --timeout-s 120 "$@" 2>"$err")
  last=$(printf '%s\n' "$out" | tail -1)
  local ok=yes
  [ "$last" = "exact: $want" ] || { ok=NO; failed=$((failed + 1)); }
  printf '%-58s %-11s %6.1f s  as expected: %s\n' "$name" "$last" \
    "$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { print (b - a) / 1e9 }')" "$ok"
  [ "$ok" = yes ] || { printf '%s\n' "$out" | tail -40; tail -20 "$err"; } >&2
  rm -f "$err"
}
for app in sync-agg async-agg key-value agreement; do
  for seed in $(seq 1 "$seeds"); do
    run yes "$app clean, seed $seed" --app "$app" --seed "$seed"
    run yes "$app 10% loss/dup/reorder, seed $seed" --app "$app" --seed "$seed" "${faults[@]}"
  done
  run yes "$app no switch, faults" --app "$app" --no-switch "${faults[@]}"
  run yes "$app two switches, faults" --app "$app" --switches 2 "${faults[@]}"
  run yes "$app controller killed and restarted" --app "$app" --restart-controller-ms 100
  run yes "$app switch killed mid-run, 5% loss" --app "$app" --scale 16 --kill-switch-ms 150 --loss 0.05
  run yes "$app forged datagrams" --app "$app" --attack
done
run yes "key-value client restarted as the same member" --app key-value --restart-client 1
run yes "async-agg client restarted as the same member" --app async-agg --restart-client 1
run no "sync-agg member killed, MemberLoss fail" --app sync-agg --scale 16 --kill-client 3 --kill-client-ms 150
for seed in $(seq 1 "$seeds"); do
  run yes "sync-agg member killed, MemberLoss continue, seed $seed" --app sync-agg --scale 16 \
    --seed "$seed" --kill-client 3 --kill-client-ms $((100 * seed)) --member-loss continue --loss 0.05
done
run yes "agreement 10,000 instances, 10% loss/dup/reorder" --app agreement --scale 50 "${faults[@]}"
echo "cases not as expected: $failed"
[ "$failed" = 0 ]
