#!/usr/bin/env bash
# The whole test suite: the README's second command, and what CI runs.
#
# Installs what it needs (Python packages into ./.venv, cargo-fuzz, grpc-go's
# interop binaries, grpcurl and h2spec from the Go module proxy into
# target/go-bin),
# builds the workspace once in release mode, and runs everything from that build:
#   1. formatting and clippy (-D warnings)
#   2. every Rust test (unit, integration, dataset round trips, CLI contract),
#      and the loom model of the shared-memory ring protocol
#   3. the cross-check against Python `protobuf` (random + non-canonical messages),
#      and Google's conformance runner (protobuf 27.1's, built once per
#      machine from crates.io's protobuf-src and cached) against
#      `protoplane conformance-testee`, its failure lists asserted
#   4. gRPC interop against real peers: grpc-go's interop client and server,
#      grpcurl through reflection, TLS; Python grpcio client and server; both
#      clients also against `protoplane engine` (split mode), with a Rust
#      application and with a grpcio servicer attached from Python (the
#      package in python/, whose pytest suite runs too); ConnectRPC's
#      conformance suite (connectconformance, from the Go module proxy)
#      against the server, monolithic and split, and against the client;
#      h2spec (HTTP/2 conformance) against the server, monolithic and split;
#      keepalive against grpc-go; a real Prometheus scraping the metrics and
#      a real OpenTelemetry Collector receiving traces across grpc-go hops
#   5. the socialnetwork example's binaries, monolithic and attached to
#      `protoplane engine`
#   6. smoke runs of `protoplane demo --split`, `protoplane bench rpc`,
#      `protoplane bench split --quick`, `protoplane sim --quick`,
#      `protoplane bench offload --quick` and `protoplane bench wire`
#      (protoplane only)
#   7. every benchmark peer builds (bench/peers-rs and bench/peers-rpc
#      type-checked, the C++ and Go peers built)
#   8. the wire engine's instruction counts against the committed baseline
#      (scripts/icount.sh under valgrind: a regression shows in review)
#   9. a short fuzzing run of every fuzz target (FUZZ_SECONDS each, default 8)
# Only HyperProtoBench (third-party, ../shared/datasets) is not in the
# repository: what needs it says so in one line and skips when it is absent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Seconds per fuzz target: a smoke run (every target built and run on its
# corpus and a few thousand new inputs); the long campaigns are
# `scripts/fuzz.sh N`, outside CI.
FUZZ_SECONDS="${FUZZ_SECONDS:-8}"

# One release build serves the tests, the smoke runs and the benchmark
# smoke: it builds the test targets together with the binaries, so cargo
# resolves features once (dev-dependencies add features to tokio and the
# crates above it; a build of the binaries alone would then be compiled a
# second time for the tests). The suite checks behaviour and makes no
# timing claims, so that build is made for compile time: no link-time
# optimization (thin LTO re-optimizes every crate at each of the suite's
# ~70 links: test binaries, examples, tools) and opt-level 1 (every crate
# is compiled twice anyway: as a library and as its unit tests). What depends on code generation
# keeps the repository's profile: the loom model, the instruction counts
# and the fuzz targets, as do benchmarks run outside this suite. Set both
# variables (lto = "thin", opt-level = 3) to run the suite on the shipped
# profile.
export CARGO_PROFILE_RELEASE_LTO="${CARGO_PROFILE_RELEASE_LTO:-false}"
export CARGO_PROFILE_RELEASE_OPT_LEVEL="${CARGO_PROFILE_RELEASE_OPT_LEVEL:-1}"
# A one-shot build gains nothing from incremental state, and that state
# (debug builds: the fuzz harness checks, build scripts) doubles the disk a
# clean clone needs.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
passed=0
failed=0
# Each step's wall time, printed as a table at the end: CI's budget is 35
# minutes on a 2-core machine, and this is where it goes.
step_names=()
step_starts=()
step() {
    step_names+=("$*")
    step_starts+=("$SECONDS")
    echo; echo "==> $*"
}
times() {
    local i end
    echo
    echo "step times (wall, seconds):"
    for i in "${!step_names[@]}"; do
        if [[ $((i + 1)) -lt ${#step_names[@]} ]]; then end=${step_starts[$((i + 1))]}; else end=$SECONDS; fi
        printf '%6d  %s\n' $((end - step_starts[i])) "${step_names[i]}"
    done
    printf '%6d  total\n' "$SECONDS"
}
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAILED: $*"; }

step "format and lints"
if cargo fmt --all -- --check; then ok; else bad "cargo fmt"; fi
if cargo clippy --release --workspace --all-targets --quiet -- -D warnings; then ok; else bad "clippy"; fi

step "build (release, once: binaries, examples and tests)"
cargo build --release --workspace --lib --bins --tests --examples --quiet

step "Rust tests"
if cargo test --release --workspace; then ok; else bad "cargo test"; fi

step "the ring protocol under loom (every interleaving of the real ring code)"
# A cfg of our own (tokio reacts to plain `loom`) and a target directory of
# its own, so the main build is not rebuilt.
if RUSTFLAGS="--cfg protoplane_loom" CARGO_TARGET_DIR=target/loom CARGO_PROFILE_RELEASE_OPT_LEVEL=3 \
    cargo test --release -p protoplane-shm --test loom; then ok; else bad "loom"; fi

step "cross-check against Python protobuf"
scripts/setup-python.sh
if .venv/bin/python tests/conformance/crosscheck.py --protoplane target/release/protoplane \
    --out-dir tests/conformance/out; then ok; else bad "crosscheck"; fi

step "Google's conformance suite (binary, JSON, text format, editions), failure lists asserted"
if tests/conformance/run.sh target/release/protoplane; then ok; else bad "conformance suite"; fi

step "gRPC interop: grpc-go client and server, grpcurl, TLS"
if tests/interop/run.sh --protoplane target/release/protoplane; then ok; else bad "interop (grpc-go)"; fi

step "gRPC interop: Python grpcio client and server (also split mode)"
if tests/grpcio/run.sh --protoplane target/release/protoplane; then ok; else bad "interop (grpcio)"; fi

step "Python services: the package's pytest suite against a real engine, and bench python --quick"
# scripts/setup-python.sh (run by the cross-check step) installed the
# package from python/ into the venv. The suite attaches sync and async
# grpcio servicers with `python -m protoplane.serve` and calls them with
# grpcio; the smoke serves the social-network servicer four ways (grpcio
# aio and sync, and the engine with each) and fails on a failed call.
if PROTOPLANE_BIN="$PWD/target/release/protoplane" .venv/bin/python -m pytest -q -p no:cacheprovider python/tests; then
    ok
else
    bad "python package (pytest python/tests)"
fi
if target/release/protoplane bench python --quick --csv target/bench/python-smoke.csv \
    >target/bench-python-smoke.md 2>/dev/null \
    && [[ $(wc -l <target/bench/python-smoke.csv) -eq 9 ]] \
    && awk -F, 'NR > 1 && $8 != 0 { bad = 1 } END { exit bad }' target/bench/python-smoke.csv; then
    ok
else
    bad "bench python smoke"; cat target/bench-python-smoke.md
fi

step "HTTP/2 conformance: h2spec against the gRPC server (monolithic and split), count asserted"
if tests/h2spec/run.sh --protoplane target/release/protoplane; then ok; else bad "h2spec"; fi

step "keepalive: grpc-go's client against serve's connection age and idle (A9), grpc-go's server enforcing pings on load --keepalive-time (A8)"
if tests/keepalive/run.sh --protoplane target/release/protoplane; then ok; else bad "keepalive (grpc-go)"; fi

step "metrics: a real Prometheus scrapes serve and engine --metrics-addr (counts asserted, promtool lint)"
if tests/metrics/run.sh --protoplane target/release/protoplane; then ok; else bad "metrics (Prometheus)"; fi

step "tracing: one trace across protoplane and grpc-go hops (monolithic and split), read back from a real OpenTelemetry Collector; JSON log lines"
if tests/tracing/run.sh --protoplane target/release/protoplane; then ok; else bad "tracing (OpenTelemetry Collector)"; fi

step "many backends: load --target ipv4:/dns:/// --lb round_robin|pick_first over four serve processes (shares from their /metrics), a drain under load"
if tests/lb/run.sh --protoplane target/release/protoplane; then ok; else bad "load balancing (load --lb)"; fi

step "xDS: load --target xds:/// against go-control-plane (weights, endpoints changed under load, a route change, a NACK, weighted clusters, grpc-go's xDS client as reference, a LOGICAL_DNS cluster, mutual TLS to the control plane)"
if tests/xds/run.sh --protoplane target/release/protoplane; then ok; else bad "xDS (go-control-plane)"; fi

step "gRPC conformance: ConnectRPC's suite against the server (monolithic, split, split with a Python servicer) and the client"
if tests/grpc-conformance/run.sh --bin target/release/protoplane-grpc-conformance; then
    ok
else
    bad "gRPC conformance"
fi

step "the socialnetwork example, monolithic and split"
if examples/socialnetwork/tests/split.sh; then ok; else bad "socialnetwork example"; fi

step "the README's first service (examples/kv): monolithic, split with engine --proto, the guide's TOML"
if examples/kv/tests/guide.sh; then ok; else bad "first-service guide (examples/kv)"; fi

step "RPC smoke: the demo, bench rpc and bench intercept (protoplane only, no timing claims)"
if target/release/protoplane demo --split --seconds 0.3 >target/demo.txt 2>&1 \
    && grep -q '^lean / TCP' target/demo.txt && grep -q 'answered token "t42-ada"' target/demo.txt \
    && grep -q 'answered token "t42-ada" through the engine' target/demo.txt; then
    ok
else
    bad "demo"; tail -20 target/demo.txt
fi
if target/release/protoplane bench rpc --rounds 1 --seconds 0.5 --concurrency 1,8 \
    --impls protoplane-grpc,protoplane-grpc-spin,protoplane-h2,protoplane-lean --load-spin --no-ghz >target/bench-rpc-smoke.md 2>/dev/null \
    && ! grep -q 'load failed' target/bench-rpc-smoke.md; then
    ok
else
    bad "bench rpc smoke"; cat target/bench-rpc-smoke.md
fi
if target/release/protoplane bench intercept --rounds 1 --calls 20000 >target/bench-intercept-smoke.md 2>&1 \
    && grep -q '^| 4 |' target/bench-intercept-smoke.md; then
    ok
else
    bad "bench intercept smoke"; cat target/bench-intercept-smoke.md
fi

step "bench split smoke (--quick: every experiment runs, no timing claims)"
if target/release/protoplane bench split --quick --no-tonic --csv target/bench/split-smoke.csv \
    >target/bench-split-smoke.md 2>/dev/null \
    && ! grep -qE 'load failed|did not' target/bench-split-smoke.md \
    && [[ $(wc -l <target/bench/split-smoke.csv) -gt 8 ]] \
    && awk -F, 'NR > 1 && $16 != 0 { bad = 1 } END { exit bad }' target/bench/split-smoke.csv; then
    ok
else
    bad "bench split smoke"; cat target/bench-split-smoke.md
fi

step "offload smoke: sim and bench offload --quick (every experiment runs, no timing claims)"
mkdir -p target/bench
if target/release/protoplane sim --quick --out target/sim --csv target/bench/sim-smoke.csv \
    >target/sim-smoke.md 2>&1 \
    && target/release/protoplane bench offload --quick --csv target/bench/offload-smoke.csv \
    >target/offload-smoke.md 2>&1 \
    && [[ $(cut -d, -f1 target/bench/offload-smoke.csv | sort -u \
        | grep -cxE 'one-shot|co-serialize|per-field|functional|image-service|field-update') -eq 6 ]] \
    && awk -F, '$1 == "image-service" && $3 == "failed" && $4 != 0 { bad = 1 }
                $1 == "field-update" && $2 == "auto-update" && $3 == "ok" && $4 != 1 { bad = 1 }
                END { exit bad }' target/bench/offload-smoke.csv; then
    ok
else
    bad "offload smoke"; cat target/sim-smoke.md target/offload-smoke.md
fi

step "wire benchmark smoke: one message set through every worker (no timing claims)"
# protoplane, its generated decoders, prost, buffa and protobuf C++ each
# decode and encode the social-network requests once (bench wire builds the
# Rust peers and the C++ workers itself, with this suite's code generation),
# so a harness that stops building or a worker that breaks fails here.
# Generated requests stand in for the recorded ones when ../shared is absent.
# Every worker's columns are in the report: protoplane (view), its
# generated code (view gen), C++, prost, buffa.
every_worker_column() {
    local header
    header=$(grep -m1 '^| message |' target/bench/smoke.md) || return 1
    for col in '| pp view |' '| pp view gen |' '| C++ arena |' '| prost fresh |' '| buffa view |'; do
        [[ $header == *"$col"* ]] || { echo "no column ${col//|/} in the wire smoke"; return 1; }
    done
}
if target/release/protoplane bench wire --impls protoplane,protoplane-gen,prost,buffa,cpp --quick \
    --only socialnetwork --markdown target/bench/smoke.md >target/bench-wire-smoke.log 2>&1 \
    && ! grep -qE 'did not build|missing' target/bench/smoke.md && every_worker_column; then
    ok
else
    bad "wire benchmark smoke"; tail -30 target/bench-wire-smoke.log
fi

step "benchmark peers build (every harness the repository ships, no timing)"
# A change that breaks a peer fails here, not on the next benchmark run:
# the RPC peer is type-checked (its build script generates the prost code
# it serves), the gRPC C++ and Go peers are built; the wire peers (Rust and
# C++) were built and run by the wire smoke above.
peers_log=target/peers-build.log
mkdir -p target/peers
: >"$peers_log"
peers_failed=()
cargo check --quiet --manifest-path bench/peers-rpc/Cargo.toml >>"$peers_log" 2>&1 || peers_failed+=(peers-rpc)
bench/peers-go/build.sh >>"$peers_log" 2>&1 || peers_failed+=(peers-go)
bench/peers-grpc-cpp/build.sh >>"$peers_log" 2>&1 || peers_failed+=(peers-grpc-cpp)
if [[ ${#peers_failed[@]} -eq 0 ]]; then
    ok
else
    bad "benchmark peers: ${peers_failed[*]} (log: $peers_log)"; tail -30 "$peers_log"
fi

step "instruction counts of decode and encode against bench/icount-baseline.tsv"
if ! command -v valgrind >/dev/null && command -v apt-get >/dev/null; then
    apt-get install -y -qq valgrind >/dev/null 2>&1 || sudo -n apt-get install -y -qq valgrind >/dev/null 2>&1 || true
fi
# The baseline was counted on the repository's profile: the same here.
if CARGO_PROFILE_RELEASE_LTO=thin CARGO_PROFILE_RELEASE_OPT_LEVEL=3 scripts/icount.sh; then
    ok
else
    bad "icount (scripts/icount.sh; --update after an intended change)"
fi

if [[ "${SKIP_FUZZ:-0}" != 1 && -x scripts/fuzz.sh ]]; then
    step "fuzz smoke (${FUZZ_SECONDS}s per target)"
    if CARGO_PROFILE_RELEASE_OPT_LEVEL=3 scripts/fuzz.sh "$FUZZ_SECONDS"; then ok; else bad "fuzz"; fi
fi

times
echo
echo "test.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
