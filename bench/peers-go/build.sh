#!/usr/bin/env bash
# Builds pp-grpc-go-server, the grpc-go peer of the RPC benchmark, into
# target/peers/grpc-go/ of the repository and prints the binary's path on
# stdout (one line; every diagnostic goes to stderr).
#
# usage: bench/peers-go/build.sh            (from any directory)
#        bench/peers-go/build.sh --tidy     (maintenance: after changing the
#            imports or go.mod's versions, rewrite go.mod and go.sum here from
#            `go mod tidy` run on the assembled module, then build)
#
# The Go code for the schema is generated at build time, never committed:
# protoc (Debian's protobuf-compiler, installed with apt-get when missing)
# with protoc-gen-go at the google.golang.org/protobuf version of go.mod and
# protoc-gen-go-grpc at the version pinned below, both installed with
# `go install` into target/peers/grpc-go/bin. The build directory holds a
# copy of main.go, go.mod and go.sum plus the generated package
# (src/socialnetwork), and `go build -mod=readonly` builds that: modules come
# from go.sum exactly, nothing is re-resolved.
#
# Idempotent: nothing is rebuilt while the binary is newer than main.go,
# go.mod, go.sum, this script and the .proto, and was built by the same Go
# and generators.
set -euo pipefail

die() { echo "build.sh: $*" >&2; exit 1; }

# protoc-gen-go-grpc's own module (google.golang.org/grpc/cmd/protoc-gen-go-grpc).
protoc_gen_go_grpc_version=v1.6.2

tidy=0
case ${1:-} in
  "") ;;
  --tidy) tidy=1 ;;
  *) die "usage: build.sh [--tidy]" ;;
esac

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/../.." && pwd)
proto_dir=$repo/protos/socialnetwork
proto=$proto_dir/social_network.proto
out_dir=$repo/target/peers/grpc-go
bin=$out_dir/pp-grpc-go-server
tools=$out_dir/bin
src=$out_dir/src
stamp=$out_dir/build.stamp
[[ -f $proto ]] || die "no such file: $proto"
command -v go >/dev/null 2>&1 || die "no go toolchain on PATH"
mkdir -p -- "$out_dir"

module=$(awk '$1 == "module" { print $2 }' "$here/go.mod")
protobuf_version=$(awk '$1 == "google.golang.org/protobuf" { print $2 }' "$here/go.mod")
[[ -n $module && -n $protobuf_version ]] ||
  die "go.mod must name the module and require google.golang.org/protobuf"

stamp_text="$(go version) protoc-gen-go=$protobuf_version protoc-gen-go-grpc=$protoc_gen_go_grpc_version"
if [[ $tidy -eq 0 && -x $bin && -f $stamp && $(cat -- "$stamp") == "$stamp_text" ]]; then
  fresh=1
  for f in "$here/main.go" "$here/go.mod" "$here/go.sum" "$here/build.sh" "$proto"; do
    [[ $bin -nt $f ]] || fresh=0
  done
  if [[ $fresh -eq 1 ]]; then
    echo "$bin"
    exit 0
  fi
fi

# --- protoc -----------------------------------------------------------------
if ! command -v protoc >/dev/null 2>&1; then
  [[ $(id -u) -eq 0 ]] || die "protoc is missing; install protobuf-compiler"
  log=$out_dir/apt.log
  echo "build.sh: installing protobuf-compiler (log: $log)" >&2
  if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q protobuf-compiler >"$log" 2>&1 ||
         { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -q protobuf-compiler >>"$log" 2>&1; }; }; then
    cat -- "$log" >&2
    die "apt-get install failed (log above)"
  fi
fi

# --- Generators (pinned) ----------------------------------------------------
# `go install pkg@version` builds exactly that version, whatever module the
# working directory is in. Reinstalled when the version asked for changes.
install_tool() {  # install_tool NAME PACKAGE VERSION
  local name=$1 package=$2 version=$3
  if [[ -x $tools/$name && $(cat -- "$tools/$name.version" 2>/dev/null) == "$version" ]]; then
    return 0
  fi
  echo "build.sh: go install $package@$version" >&2
  (cd -- "$out_dir" && GOBIN=$tools go install "$package@$version") >&2 ||
    die "go install $package@$version failed"
  printf '%s\n' "$version" >"$tools/$name.version"
}
mkdir -p -- "$tools"
install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$protobuf_version"
install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
  "$protoc_gen_go_grpc_version"

# --- Assemble the module and generate ---------------------------------------
rm -rf -- "$src"
mkdir -p -- "$src/socialnetwork"
cp -- "$here/main.go" "$here/go.mod" "$src/"
[[ -f $here/go.sum ]] && cp -- "$here/go.sum" "$src/"
# The .proto has no go_package option: M maps it to the package's import path.
map=Msocial_network.proto=$module/socialnetwork
protoc -I"$proto_dir" \
  --plugin=protoc-gen-go="$tools/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$tools/protoc-gen-go-grpc" \
  --go_out="$src/socialnetwork" --go_opt=paths=source_relative --go_opt="$map" \
  --go-grpc_out="$src/socialnetwork" --go-grpc_opt=paths=source_relative --go-grpc_opt="$map" \
  "$proto" || die "protoc failed on $proto"

if [[ $tidy -eq 1 ]]; then
  (cd -- "$src" && go mod tidy) >&2 || die "go mod tidy failed"
  cp -- "$src/go.mod" "$src/go.sum" "$here/"
fi

# --- Build --------------------------------------------------------------------
(cd -- "$src" && go build -mod=readonly -trimpath -buildvcs=false -o "$bin.tmp" .) >&2 ||
  die "go build failed"
mv -f -- "$bin.tmp" "$bin"
printf '%s\n' "$stamp_text" >"$stamp"
echo "$bin"
