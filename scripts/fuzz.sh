#!/usr/bin/env bash
# Runs the fuzz targets of fuzz/ (cargo-fuzz + libFuzzer) for a while each.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]        default 60
#
# 1. installs cargo-fuzz if missing and builds the targets with nightly;
# 2. seeds fuzz/corpus/<target>/ (fuzz/examples/seed.rs) from the shared
#    datasets, ../shared beside the checkout (skipped if absent), and from
#    tests/conformance/out (crosscheck.py --out-dir), if present;
# 3. runs decode, decode_gen (the generated decoders against the
#    table-driven one), block, grpc, lean, tables, json, text, ring (the engine's
#    side of the shared-memory rings against a hostile application),
#    http2_frame (the HTTP/2 server connection on a peer's bytes), hpack
#    (header compression, decoder alone and against the encoder), inc
#    (the in-network-computation switch and host agents of one application
#    against hostile datagrams, another application's state unchanged)
#    and inc_control (the switch's control plane, the controller's protocol
#    and the line reader they arrive through on a peer's JSON lines, and
#    the NetFilter parser) and inc_face (the RPC face cutting fields out of
#    a server's response bytes) and cu (compute units against hostile task
#    descriptors) and attach (the attach handshake) and versions (an
#    application's descriptor set judged against the engine's schema),
#    each for SECONDS_PER_TARGET seconds.
#
# Prints per target how many inputs libFuzzer executed. Exits non-zero if any
# target crashed, leaked, timed out or ran out of memory; the reproducer is
# in fuzz/artifacts/<target>/ (replay: cargo +nightly fuzz run <target> FILE)
# and the run's log next to it in fuzz/artifacts/<target>.log.
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "usage: $0 [SECONDS_PER_TARGET]" >&2
  exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="$(dirname "$repo")/shared"
targets=(decode decode_gen block grpc lean tables json text ring http2_frame hpack inc inc_control inc_face cu attach versions metrics_http orca service_config dns xds)

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: needs the nightly toolchain (rustup toolchain install nightly)" >&2
  exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

cd "$repo/fuzz"
cargo +nightly fuzz build
cargo run --quiet --example seed -- "$repo/fuzz/corpus" "$shared" "$repo/tests/conformance/out"

failed=()
for target in "${targets[@]}"; do
  log="$repo/fuzz/artifacts/$target.log"
  mkdir -p "$repo/fuzz/artifacts/$target" "$repo/fuzz/corpus/$target"
  status=0
  cargo +nightly fuzz run "$target" "$repo/fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    >"$log" 2>&1 || status=$?
  # libFuzzer's final stats: number_of_executed_runs in older releases,
  # number_of_executed_units in current ones.
  runs="$(sed -n 's/^stat::number_of_executed_\(runs\|units\): *\([0-9]*\).*/\2/p' "$log" | tail -n 1)"
  if [ "$status" -eq 0 ]; then
    echo "fuzz: $target: ${runs:-unknown} runs in ${seconds}s, no crash"
  else
    echo "fuzz: $target: crashed after ${runs:-unknown} runs (exit $status)"
    failed+=("$target")
    grep -E '^(==[0-9]+==|thread .* panicked|SUMMARY|Test unit written|Base64:)' "$log" | head -n 20 || true
    for artifact in $(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log"); do
      echo "fuzz: $target: reproducer $artifact ($(wc -c <"$artifact") bytes, up to 512 shown):"
      head -c 512 "$artifact" | od -An -tx1 -v
    done
    echo "fuzz: $target: full log in $log"
  fi
done

if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz: crashes in: ${failed[*]}"
  exit 1
fi
echo "fuzz: no crashes"
