#!/usr/bin/env bash
# Builds pp-tonic-server in release mode and prints the binary's path on
# stdout (cargo's progress goes to stderr). Idempotent: a second run is a
# no-op build that prints the same path.
#
# usage: bench/peers-rpc/build.sh    (from any directory)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# --locked: build exactly the committed Cargo.lock, never re-resolve it.
cargo build --release --locked --manifest-path "$here/Cargo.toml" --bin pp-tonic-server >&2

# Cargo resolves a relative CARGO_TARGET_DIR against the working directory.
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-$here/target}")
bin="$target_dir/release/pp-tonic-server"
[[ -x "$bin" ]] || { echo "build.sh: $bin missing after the build" >&2; exit 1; }
echo "$bin"
