#!/usr/bin/env bash
# Instruction-count regression check: noise-free where wall-clock timing
# on a shared machine is not (and hardware counters are not available).
#
# Builds crates/wire/examples/icount.rs in release, runs it under
# callgrind, takes the inclusive instruction count (Ir) of each of its
# per-operation functions (op_decode_owned, op_decode_view, op_encode)
# from `callgrind_annotate --inclusive=yes`, prints them, and compares
# them with the committed baseline bench/icount-baseline.tsv.
#
# Usage: scripts/icount.sh [--update]
#   --update             rewrite the baseline with this run's counts
#   ICOUNT_TOLERANCE=P   allowed increase, in percent (default 2)
#   ICOUNT_BASELINE=F    another baseline file (default bench/icount-baseline.tsv)
# Exit status: 0 ok, 1 a regression past the tolerance (or the workload
# changed: run --update), 2 cannot run (no valgrind, no baseline, …).
#
# The counts depend on the compiler (rustc / LLVM), glibc and valgrind;
# the baseline records the versions it was made with and the script warns
# when they differ. Between two runs with the same toolchain they are
# identical to the instruction (see the example's notes on allocation).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BASELINE="${ICOUNT_BASELINE:-bench/icount-baseline.tsv}"
TOLERANCE="${ICOUNT_TOLERANCE:-2}"
OPS=(decode_owned decode_view encode)

update=0
case "${1:-}" in
    "") ;;
    --update) update=1 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "icount.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac
if ! [[ "$TOLERANCE" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    echo "icount.sh: ICOUNT_TOLERANCE must be a number of percent, got '$TOLERANCE'" >&2
    exit 2
fi
for tool in valgrind callgrind_annotate; do
    if ! command -v "$tool" >/dev/null; then
        echo "icount.sh: $tool not found (Debian: apt-get install valgrind)" >&2
        exit 2
    fi
done

cargo build --release --quiet -p protoplane-wire --example icount
bin="${CARGO_TARGET_DIR:-target}/release/examples/icount"
outdir="${CARGO_TARGET_DIR:-target}/icount"
mkdir -p "$outdir"
profile="$outdir/callgrind.out"

# The program's last line is `messages_per_op N`. Callgrind's own chatter
# goes to a log file, kept beside the profile for when something fails.
if ! valgrind --tool=callgrind --callgrind-out-file="$profile" --log-file="$outdir/valgrind.log" \
    "$bin" >"$outdir/stdout.txt"; then
    echo "icount.sh: the workload failed under valgrind; see $outdir/" >&2
    exit 2
fi
messages=$(awk '$1 == "messages_per_op" { print $2 }' "$outdir/stdout.txt")
if [[ -z "$messages" ]]; then
    echo "icount.sh: no messages_per_op line in $outdir/stdout.txt" >&2
    exit 2
fi

# Inclusive Ir per function. With inlining, debug info splits a function
# into one `file:function` line per source file its code came from; the
# line of the function's own file (tagged with the object, `[...]`)
# carries the whole inclusive count and is the largest, so take the max.
callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$profile" 2>/dev/null \
    >"$outdir/annotate.txt"
declare -A count
for op in "${OPS[@]}"; do
    n=$(awk -v fn=":icount::op_$op" '
        /^ *[0-9,]+ / && (index($0, fn " [") || substr($0, length($0) - length(fn) + 1) == fn) {
            ir = $1; gsub(/,/, "", ir); if (ir + 0 > max) max = ir + 0
        }
        END { if (max > 0) printf "%d\n", max }' "$outdir/annotate.txt")
    if [[ -z "$n" ]]; then
        echo "icount.sh: no inclusive count for icount::op_$op in $outdir/annotate.txt" >&2
        exit 2
    fi
    count[$op]=$n
done

toolchain="$(rustc --version) | $(valgrind --version) | glibc $(ldd --version | awk 'NR == 1 { print $NF }')"

if ((update)); then
    {
        echo "# Instruction counts of crates/wire/examples/icount.rs under callgrind"
        echo "# (scripts/icount.sh --update). Toolchain: $toolchain"
        printf 'op\tinstructions\tmessages\n'
        for op in "${OPS[@]}"; do printf '%s\t%s\t%s\n' "$op" "${count[$op]}" "$messages"; done
    } >"$BASELINE"
fi

if [[ ! -f "$BASELINE" ]]; then
    echo "icount.sh: no baseline at $BASELINE (create it with --update)" >&2
    exit 2
fi
base_toolchain=$(sed -n 's/^# .*Toolchain: //p' "$BASELINE")
if [[ "$base_toolchain" != "$toolchain" ]]; then
    echo "icount.sh: warning: baseline made with '$base_toolchain'," >&2
    echo "icount.sh:          this run uses     '$toolchain'; counts may differ for that alone" >&2
fi

status=0
printf '%-14s %14s %12s %14s %9s\n' op instructions "per message" baseline change
for op in "${OPS[@]}"; do
    read -r base base_messages < <(awk -F'\t' -v op="$op" '$1 == op { print $2, $3 }' "$BASELINE") ||
        true
    new=${count[$op]}
    if [[ -z "${base:-}" ]]; then
        verdict="no baseline"
        status=1
        base="-"
        change="-"
    elif [[ "$base_messages" != "$messages" ]]; then
        verdict="workload changed ($base_messages -> $messages messages): run --update"
        status=1
        change="-"
    else
        change=$(awk -v n="$new" -v b="$base" 'BEGIN { printf "%+.2f%%", (n - b) * 100 / b }')
        if awk -v n="$new" -v b="$base" -v t="$TOLERANCE" 'BEGIN { exit !(n > b * (1 + t / 100)) }'; then
            verdict="REGRESSION (> +$TOLERANCE%)"
            status=1
        elif awk -v n="$new" -v b="$base" -v t="$TOLERANCE" 'BEGIN { exit !(n < b * (1 - t / 100)) }'; then
            verdict="improved (--update to lock it in)"
        else
            verdict="ok"
        fi
    fi
    per=$(awk -v n="$new" -v m="$messages" 'BEGIN { printf "%.1f", n / m }')
    printf '%-14s %14s %12s %14s %9s  %s\n' "$op" "$new" "$per" "$base" "$change" "$verdict"
    unset base base_messages
done
echo "($messages messages per op; profile: $profile)"
exit "$status"
