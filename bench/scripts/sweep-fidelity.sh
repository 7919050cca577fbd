#!/usr/bin/env bash
# sweep-fidelity.sh: does a size measure the same alone as inside a sweep?
#
# For every transport and size, runs `all_reduce_perf -b S -e S` (the size alone) and one sweep
# that contains it (`-b 8 -e MAX -f 8` by default), alternating alone and sweep runs, ROUNDS
# rounds, and compares the size's out-of-place time: median alone, median in the sweep, their
# ratio (sweep / alone) and the spread of the per-round ratios. A ratio outside 1 +- TOL is
# reported as a MISS and the script exits 1 (a benchmark, not a unit test: run it on a quiet
# machine).
#
#   bench/scripts/sweep-fidelity.sh [--rounds 5] [--np 2] [--transports "shm tcp"]
#       [--sizes "8 4K 256K 2M"] [--sweep "-b 8 -e 16M -f 8"] [--tol 0.15] [--no-build]
#       [-- extra busbw flags, e.g. --rotate max]
#
# The sweep must contain every size (the script checks). Each run uses -n 20 -w 3 -c 0 unless
# the extra flags say otherwise. BUSBW=/path/to/busbw skips the build.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=5
NP=2
TRANSPORTS="shm tcp"
SIZES="8 4K 256K 2M"
SWEEP="-b 8 -e 16M -f 8"
TOL=0.15
BUILD=1
EXTRA=()
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --transports) TRANSPORTS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --sweep) SWEEP=$2; shift 2 ;;
    --tol) TOL=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "sweep-fidelity.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [[ -z ${BUSBW:-} ]]; then
    BUSBW="$ROOT/target/release/busbw"
    ((BUILD)) && (cd "$ROOT" && cargo build --release -p busbw --quiet)
fi
[[ -x $BUSBW ]] || { echo "sweep-fidelity.sh: $BUSBW is not executable" >&2; exit 3; }

to_bytes() {
    local s=$1
    case $s in
    *K) echo $(( ${s%K} * 1024 )) ;;
    *M) echo $(( ${s%M} * 1024 * 1024 )) ;;
    *G) echo $(( ${s%G} * 1024 * 1024 * 1024 )) ;;
    *) echo "$s" ;;
    esac
}

# run TRANSPORT FLAGS... -> "bytes time" per data row (out-of-place time, column 6)
run() {
    local tr=$1 out
    shift
    out=$("$BUSBW" all_reduce_perf --np "$NP" --transport "$tr" -n 20 -w 3 -c 0 "$@" "${EXTRA[@]}" 2>&1) \
        || { echo "busbw failed: $out" >&2; return 1; }
    awk '$0 !~ /^[[:space:]]*#/ && NF >= 8 && $1 ~ /^[0-9]+$/ { print $1, $6 }' <<<"$out"
}

RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT
echo "# sweep-fidelity.sh  $(date -u +%Y-%m-%dT%H:%M:%SZ)  $(lscpu | sed -n 's/^Model name: *//p')  cores $(nproc)"
echo "# busbw: $BUSBW ($("$BUSBW" --version 2>/dev/null || echo '?')); np $NP; sweep: $SWEEP; extra: ${EXTRA[*]:-none}"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2086
for tr in $TRANSPORTS; do
    for ((r = 1; r <= ROUNDS; r++)); do
        for s in $SIZES; do
            b=$(to_bytes "$s")
            run "$tr" -b "$b" -e "$b" | awk -v tr="$tr" -v r="$r" -v b="$b" '$1 == b { print tr, r, "alone", $1, $2 }' >>"$RESULTS"
        done
        run "$tr" $SWEEP | awk -v tr="$tr" -v r="$r" '{ print tr, r, "sweep", $1, $2 }' >>"$RESULTS"
    done
done

printf '\n%-4s %9s | %12s %12s | %7s %13s\n' tr bytes "alone us" "sweep us" ratio spread
MISSES=0
for tr in $TRANSPORTS; do
    for s in $SIZES; do
        b=$(to_bytes "$s")
        line=$(awk -v tr="$tr" -v b="$b" -v tol="$TOL" '
            function median(a, k,   i, j, t) {
                for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
                return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
            }
            $1 == tr && $4 == b && $3 == "alone" { al[++ka] = $5; byr[$2, "a"] = $5 }
            $1 == tr && $4 == b && $3 == "sweep" { sw[++ks] = $5; byr[$2, "s"] = $5; rounds[$2] = 1 }
            END {
                if (!ka || !ks) { printf "%-4s %9s | missing: the sweep does not contain this size\n", tr, b; exit 2 }
                ma = median(al, ka); ms = median(sw, ks); ratio = ms / ma
                for (r in rounds) if ((r, "a") in byr && byr[r, "a"] > 0) {
                    x = byr[r, "s"] / byr[r, "a"]; if (!n++ || x < lo) lo = x; if (n == 1 || x > hi) hi = x
                }
                miss = (ratio > 1 + tol || ratio < 1 - tol)
                printf "%-4s %9s | %12.2f %12.2f | %7.2f %6.2f..%-6.2f%s\n", tr, b, ma, ms, ratio, lo, hi, miss ? "  MISS" : ""
                exit miss
            }' "$RESULTS") && rc=0 || rc=$?
        echo "$line"
        ((rc == 0)) || MISSES=$((MISSES + 1))
    done
done
echo "# ratio = median time in the sweep / median time alone (1.00: the same); tolerance +-$TOL"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
((MISSES == 0)) || { echo "# $MISSES size(s) measure differently inside the sweep"; exit 1; }
