#!/bin/bash
# Runs the three schemes one after the other, each in its own server
# process (so per-thread CPU accounting sees one server only), and prints
# the client's report for each.
#
#   bash examples/imageservice/compare.sh [SIZE] [REQUESTS] [CONCURRENCY]
#
# Build first: cargo build --release -p protoplane-example-imageservice
set -eu
size=${1:-64k}
requests=${2:-2000}
concurrency=${3:-8}
bin=${CARGO_TARGET_DIR:-target}/release
port=${PORT:-50561}
for scheme in cpu-only offload-host rpcacc; do
  "$bin/image-server" --scheme "$scheme" --port "$port" >/dev/null &
  pid=$!
  trap 'kill $pid 2>/dev/null' EXIT
  for _ in $(seq 50); do
    "$bin/image-client" stats --target "127.0.0.1:$port" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin/image-client" run --target "127.0.0.1:$port" --size "$size" \
    --requests "$requests" --concurrency "$concurrency" --warmup 20
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  trap - EXIT
  echo
done
