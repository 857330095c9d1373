#!/usr/bin/env bash
# Create the repo-local Python virtualenv used by the conformance cross-check
# (tests/conformance/crosscheck.py).
#
# Idempotent: the requirement list is written to a stamp file inside the venv
# after a successful install; when the stamp matches, nothing is done.
#
# grpcio-tools bundles protoc (`python -m grpc_tools.protoc`), so no system
# protoc is needed. grpcio-tools 1.76.0 declares protobuf>=6.31.1,<7, which
# admits the pinned protobuf 6.33.1; grpcio is pinned to the matching release
# (grpcio-tools only asks for grpcio>=1.76.0) so the venv is reproducible.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.protoplane-requirements"
REQUIREMENTS="protobuf==6.33.1
grpcio==1.76.0
grpcio-tools==1.76.0"

if [[ -x "$VENV/bin/python" && -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$REQUIREMENTS" ]]; then
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi

# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    $(printf '%s\n' "$REQUIREMENTS")

# Sanity check: both the runtime and the bundled compiler import.
"$VENV/bin/python" -c 'import google.protobuf, grpc_tools.protoc' >/dev/null

printf '%s' "$REQUIREMENTS" > "$STAMP"
echo "setup-python: $VENV ready ($(paste -sd' ' - <<<"$REQUIREMENTS"))"
