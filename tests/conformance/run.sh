#!/usr/bin/env bash
# Google's protobuf conformance suite against protoplane: the official
# runner (tests/conformance/runner.sh installs it) drives
# `protoplane conformance-testee`, one process speaking the runner's pipe
# protocol, through both of its suites:
#   * binary and JSON (protobuf and JSON in, protobuf and JSON out;
#     proto2, proto3 and edition 2023 messages), failures expected:
#     failure_list.txt;
#   * text format (text in, protobuf and text out), failures expected:
#     text_format_failure_list.txt.
# Required and Recommended tests alike (--enforce_recommended). The runner
# fails on any test that fails and is not listed, and on any listed test
# that passes (the lists only shrink). Tests the testee answers "skipped"
# (Google's internal JSPB format) are counted, and their number may not
# grow past skipped_max.txt.
#
#   tests/conformance/run.sh [PROTOPLANE_BIN]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${1:-${PROTOPLANE_BIN:-$repo/target/release/protoplane}}
[[ -x $bin ]] || { echo "conformance: no protoplane binary at $bin" >&2; exit 1; }
runner=$("$here/runner.sh")
out=$repo/target/conformance
rm -rf -- "$out"
mkdir -p -- "$out"

set +e
"$runner/bin/conformance_test_runner" --enforce_recommended --maximum_edition 2023 \
  --failure_list "$here/failure_list.txt" \
  --text_format_failure_list "$here/text_format_failure_list.txt" \
  --output_dir "$out" \
  "$bin" conformance-testee --include "$runner/include" >"$out/runner.log" 2>&1
status=$?
set -e

grep -E "^CONFORMANCE SUITE" "$out/runner.log" || true
skipped=$(grep -E "^CONFORMANCE SUITE" "$out/runner.log" |
  sed -E 's/.* ([0-9]+) skipped.*/\1/' | awk '{s += $1} END {print s + 0}')
max=$(tr -dc 0-9 <"$here/skipped_max.txt")
if ((status != 0)); then
  grep -B2 -A40 "These tests" "$out/runner.log" | head -80 >&2 || tail -40 "$out/runner.log" >&2
  echo "conformance: the runner failed (exit $status); everything it said: $out/runner.log" >&2
  exit 1
fi
if ((skipped > max)); then
  echo "conformance: $skipped tests skipped, more than the $max of skipped_max.txt" >&2
  exit 1
fi
echo "conformance: passed ($skipped skipped, at most $max)"
