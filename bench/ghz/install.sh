#!/usr/bin/env bash
# Installs ghz (https://ghz.sh), the gRPC load generator `protoplane bench
# rpc` runs next to `protoplane load`, at a pinned version into
# target/tools/ of the repository, and prints its path on stdout (one line;
# go's output and every diagnostic go to stderr).
#
# usage: bench/ghz/install.sh    (from any directory)
#
# Built from source with `go install` (the Go module proxy), so it needs a Go
# toolchain new enough for the pinned version (v0.121.0 builds with Go 1.26).
# Idempotent: once target/tools/ghz exists and was installed at this version,
# nothing is fetched or built again.
set -euo pipefail

die() { echo "install.sh: $*" >&2; exit 1; }

version=v0.121.0

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/../.." && pwd)
tools=$repo/target/tools
bin=$tools/ghz
# `go install` builds ghz without its release version string (`ghz
# --version` says "dev"), so the installed version is recorded beside it.
marker=$tools/ghz.version

if [[ -x $bin && $(cat -- "$marker" 2>/dev/null) == "$version" ]]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null 2>&1 || die "no go toolchain on PATH (ghz is built from source)"
mkdir -p -- "$tools"
echo "install.sh: go install github.com/bojand/ghz/cmd/ghz@$version" >&2
# From the tools directory, so no go.mod around it is consulted or changed.
(cd -- "$tools" && GOBIN=$tools go install "github.com/bojand/ghz/cmd/ghz@$version") >&2 ||
  die "go install github.com/bojand/ghz/cmd/ghz@$version failed"
[[ -x $bin ]] || die "$bin missing after go install"
printf '%s\n' "$version" >"$marker"
echo "$bin"
