#!/usr/bin/env bash
# Builds pp-grpc-cpp-server, the gRPC C++ peer of the RPC benchmark, into
# target/peers/grpc-cpp/ of the repository and prints the binary's path on
# stdout (one line; every diagnostic goes to stderr).
#
# usage: bench/peers-grpc-cpp/build.sh    (from any directory)
#
# Uses Debian's gRPC (libgrpc++-dev 1.51, grpc_cpp_plugin from
# protobuf-compiler-grpc) and protobuf (libprotobuf-dev, protoc), installed
# with apt-get when missing. Idempotent: nothing is rebuilt while the binary
# is newer than server.cc, this script and the .proto, and was built with the
# same compiler, flags and library versions.
set -euo pipefail

die() { echo "build.sh: $*" >&2; exit 1; }

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/../.." && pwd)
proto_dir=$repo/protos/socialnetwork
proto=$proto_dir/social_network.proto
src=$here/server.cc
self=$here/build.sh
out_dir=$repo/target/peers/grpc-cpp
bin=$out_dir/pp-grpc-cpp-server
stamp=$out_dir/build.stamp
[[ -f $proto ]] || die "no such file: $proto"
mkdir -p -- "$out_dir"

CXX=${CXX:-g++}
cxxflags=(-O2 -std=c++17 -DNDEBUG)

# --- Toolchain --------------------------------------------------------------
packages=(libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler pkg-config g++)
have_toolchain() {
  command -v protoc >/dev/null 2>&1 && command -v grpc_cpp_plugin >/dev/null 2>&1 &&
    command -v "$CXX" >/dev/null 2>&1 && command -v pkg-config >/dev/null 2>&1 &&
    pkg-config --exists grpc++ protobuf
}
if ! have_toolchain; then
  [[ $(id -u) -eq 0 ]] || die "gRPC C++ toolchain missing; install ${packages[*]}"
  log=$out_dir/apt.log
  echo "build.sh: installing ${packages[*]} (log: $log)" >&2
  if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >"$log" 2>&1 ||
         { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >>"$log" 2>&1; }; }; then
    cat -- "$log" >&2
    die "apt-get install failed (log above)"
  fi
  have_toolchain || die "still no gRPC C++ toolchain after apt-get install"
fi

# --- Up to date? ------------------------------------------------------------
stamp_text="cxx=$CXX flags=${cxxflags[*]} grpc++=$(pkg-config --modversion grpc++) protobuf=$(pkg-config --modversion protobuf)"
if [[ -x $bin && -f $stamp && $(cat -- "$stamp") == "$stamp_text" &&
      $bin -nt $src && $bin -nt $self && $bin -nt $proto ]]; then
  echo "$bin"
  exit 0
fi

# --- Generate and compile ---------------------------------------------------
gen=$out_dir/gen
rm -rf -- "$gen"
mkdir -p -- "$gen"
protoc -I"$proto_dir" --cpp_out="$gen" --grpc_out="$gen" \
  --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" "$proto" ||
  die "protoc failed on $proto"

read -r -a pkg_cflags <<<"$(pkg-config --cflags grpc++ protobuf)"
read -r -a pkg_libs <<<"$(pkg-config --libs grpc++ protobuf)"
compile() {  # compile SRC OBJ: its diagnostics on stderr if it fails
  "$CXX" "${cxxflags[@]}" "${pkg_cflags[@]}" -I"$gen" -c -o "$2" "$1" 2>"$2.log" ||
    { cat -- "$2.log" >&2; return 1; }
}
# The generated service (the longest unit) alongside the rest, two compilers
# at a time (the machine has two cores).
objs=("$gen/server.o" "$gen/social_network.pb.o" "$gen/social_network.grpc.pb.o")
compile "$gen/social_network.grpc.pb.cc" "$gen/social_network.grpc.pb.o" & grpc_pid=$!
ok=1
compile "$src" "$gen/server.o" || ok=0
compile "$gen/social_network.pb.cc" "$gen/social_network.pb.o" || ok=0
wait "$grpc_pid" || ok=0
[[ $ok -eq 1 ]] || die "compilation failed"

"$CXX" -o "$bin.tmp" "${objs[@]}" "${pkg_libs[@]}" -lpthread || die "link failed"
mv -f -- "$bin.tmp" "$bin"
printf '%s\n' "$stamp_text" >"$stamp"
echo "$bin"
