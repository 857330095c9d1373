#!/usr/bin/env bash
# Builds the protobuf C++ benchmark worker for one schema.
#
#   bench/cpp/build.sh SCHEMA_KEY OUT_DIR PROTO_FILE [-I DIR]...
#
# SCHEMA_KEY  key compiled into the worker (jobs with another `schema` column
#             are skipped), e.g. hyperprotobench/bench0 or socialnetwork.
# OUT_DIR     build directory; the worker is OUT_DIR/pp-cpp-worker.
# PROTO_FILE  the schema's .proto file. Imported .proto files are compiled
#             too (except protobuf's well-known types, which are in
#             libprotobuf).
# -I DIR      protoc import paths (default: the directory of PROTO_FILE).
#
# Installs libprotobuf-dev, protobuf-compiler and g++ with apt-get when protoc,
# the protobuf headers or g++ are missing. Idempotent: nothing is rebuilt when
# the worker is newer than harness.cc, this script and every .proto it was
# built from, and was built with the same schema key and flags. On success it
# prints exactly one line, the path of the worker; diagnostics go to stderr.
set -euo pipefail

die() { echo "build.sh: $*" >&2; exit 1; }

[[ $# -ge 3 ]] || die "usage: build.sh SCHEMA_KEY OUT_DIR PROTO_FILE [-I DIR]..."
key=$1 out_dir=$2 proto=$3
shift 3
[[ $key =~ ^[A-Za-z0-9._/-]+$ ]] || die "schema key '$key' must match [A-Za-z0-9._/-]+"
[[ -f $proto ]] || die "no such file: $proto"

includes=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -I) [[ $# -ge 2 ]] || die "-I needs a directory"; includes+=("$2"); shift 2 ;;
    -I*) includes+=("${1#-I}"); shift ;;
    *) die "unexpected argument '$1'" ;;
  esac
done
[[ ${#includes[@]} -gt 0 ]] || includes=("$(dirname -- "$proto")")

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
harness=$here/harness.cc
self=$here/build.sh
mkdir -p -- "$out_dir"
out_dir=$(cd -- "$out_dir" && pwd)
bin=$out_dir/pp-cpp-worker
deps_list=$out_dir/protos.list     # .proto files the last build used
stamp=$out_dir/build.stamp         # key and flags of the last build

CXX=${CXX:-g++}
cxxflags=(-O2 -std=c++17 -DNDEBUG)
stamp_text="key=$key cxx=$CXX flags=${cxxflags[*]} proto=$(realpath -- "$proto") includes=${includes[*]}"

# --- Up to date? ------------------------------------------------------------
up_to_date() {
  [[ -x $bin && -f $stamp && -f $deps_list ]] || return 1
  [[ $(cat -- "$stamp") == "$stamp_text" ]] || return 1
  [[ $bin -nt $harness && $bin -nt $self ]] || return 1
  local f
  while IFS= read -r f; do
    [[ -f $f && $bin -nt $f ]] || return 1
  done <"$deps_list"
}
if up_to_date; then
  echo "$bin"
  exit 0
fi

# --- Toolchain --------------------------------------------------------------
if ! command -v protoc >/dev/null 2>&1 || ! command -v "$CXX" >/dev/null 2>&1 ||
   [[ ! -f /usr/include/google/protobuf/message.h ]]; then
  [[ $(id -u) -eq 0 ]] || die "protoc, g++ or the protobuf headers are missing; install libprotobuf-dev protobuf-compiler g++"
  log=$out_dir/apt.log
  if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
           libprotobuf-dev protobuf-compiler g++ >"$log" 2>&1 ||
         { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
             libprotobuf-dev protobuf-compiler g++ >>"$log" 2>&1; }; }; then
    cat -- "$log" >&2
    die "apt-get install failed (log above)"
  fi
fi

# --- protoc -----------------------------------------------------------------
gen=$out_dir/gen
rm -rf -- "$gen"
mkdir -p -- "$gen"
iflags=()
for d in "${includes[@]}"; do iflags+=("-I$d"); done

# Every .proto the schema depends on (physical paths), from protoc's
# make-style dependency file.
protoc "${iflags[@]}" --dependency_out="$gen/deps.d" \
  --descriptor_set_out=/dev/null "$proto" || die "protoc failed on $proto"
mapfile -t all_protos < <(
  sed -e '1s/^[^:]*://' -e 's/\\$//' "$gen/deps.d" | tr ' \t' '\n\n' | sed '/^$/d')
# Well-known types (google/protobuf/*.proto shipped with protoc) are compiled
# into libprotobuf; everything else gets generated code.
protos=()
for f in "${all_protos[@]}"; do
  case $(realpath -- "$f") in
    /usr/include/google/protobuf/*|/usr/local/include/google/protobuf/*) ;;
    *) protos+=("$f") ;;
  esac
done
[[ ${#protos[@]} -gt 0 ]] || die "protoc reported no input files for $proto"

protoc "${iflags[@]}" --cpp_out="$gen" "${protos[@]}" || die "protoc --cpp_out failed"
mapfile -t sources < <(find "$gen" -name '*.pb.cc' | sort)
[[ ${#sources[@]} -gt 0 ]] || die "protoc generated no .pb.cc"

# --- Compile (two jobs at a time) and link ---------------------------------
objs=()
pids=()
compile() {  # compile SRC OBJ [extra flags...]
  local src=$1 obj=$2
  shift 2
  "$CXX" "${cxxflags[@]}" "$@" -I"$gen" -c -o "$obj" "$src" 2>"$obj.log" ||
    { cat -- "$obj.log" >&2; return 1; }
}
obj=$gen/harness.o
compile "$harness" "$obj" "-DPP_SCHEMA_KEY=\"$key\"" & pids+=($!)
objs+=("$obj")
i=0
for src in "${sources[@]}"; do
  obj=$gen/unit$i.o
  i=$((i + 1))
  objs+=("$obj")
  if [[ ${#pids[@]} -ge 2 ]]; then
    wait "${pids[0]}" || die "compilation failed"
    pids=("${pids[@]:1}")
  fi
  compile "$src" "$obj" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || die "compilation failed"; done

"$CXX" -o "$bin.tmp" "${objs[@]}" -lprotobuf -lpthread || die "link failed"
mv -f -- "$bin.tmp" "$bin"

for f in "${protos[@]}"; do realpath -- "$f"; done >"$deps_list"
printf '%s\n' "$stamp_text" >"$stamp"
echo "$bin"
