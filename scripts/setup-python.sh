#!/usr/bin/env bash
# Create the repo-local Python virtualenv used by the conformance cross-check
# (tests/conformance/crosscheck.py), the grpcio interop suites, `protoplane
# bench python` and the Python package's tests, and install the package
# (`pip install ./python`: maturin builds the extension from the workspace,
# reusing the workspace's target directory).
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
grpcio-tools==1.76.0
pytest==9.2.0
maturin==1.16.0"

# The package is built from this checkout every time (its sources change;
# cargo rebuilds only what did). PROTOPLANE_NO_PACKAGE=1 skips it.
install_package() {
    [[ "${PROTOPLANE_NO_PACKAGE:-}" == 1 ]] && return 0
    PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
        --force-reinstall --no-deps "$ROOT/python"
    "$VENV/bin/python" -c 'import protoplane._native' >/dev/null
}

if [[ -x "$VENV/bin/python" && -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$REQUIREMENTS" ]]; then
    install_package
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
install_package
echo "setup-python: $VENV ready ($(paste -sd' ' - <<<"$REQUIREMENTS"))"
