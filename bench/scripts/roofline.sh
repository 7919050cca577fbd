#!/usr/bin/env bash
# roofline.sh: busbw's shared-memory AllReduce against what the machine allows, in one run
# (issue 40, point 1).
#
#   bench/scripts/roofline.sh [--np 2] [--rounds 3]
#                             [--sizes "8 512 4K 32K 256K 2M 16M 64M 128M 256M"] [--no-build]
#
# References, measured in the same run:
#   copy    one core's memcpy of 256 MiB (bench/peer/memcpy_bw.c), alone and with NP
#           processes copying at once (per process; the bandwidth each rank has when all
#           stream together)
#   floor   the bare two-process exchange through shared memory (bench/peer/shm_exchange.c:
#           copy in, flag, copy out, both ways at once), per size
#   pattern the direct AllReduce's memory traffic without its protocol, NP processes at once
#           (bench/peer/reduce_pattern.c), per size: in place, and out of place with streaming
#           and with ordinary stores (the faster counts): what the machine allows each column
# Then busbw all_reduce_perf --np NP --transport shm (float sum, auto, --rotate 0: the same
# buffers every call, as the exchange and the pattern use theirs), ROUNDS rounds alternating
# with the references, and per size the median out-of-place and in-place time
# against the bound. The direct AllReduce (auto's choice on shared memory) has each rank read
# its slice of every input (S bytes in all) and write it into every output (S bytes): at
# least S / copy_NP, copy_NP counting each byte read once and written once. Printed: the
# bound, each time as a fraction of it (bound / time: 1.00 is the machine), busbw as a
# fraction of one core's copy bandwidth (issue 40's goal: 0.45 from 16 MiB), each column
# against its pattern and the pattern's own out-of-place/in-place ratio (the machine's part
# of busbw's), and with NP=2 each time against the exchange floor (goal: 1.25 at most up to
# 4 KiB).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NP=2 ROUNDS=3 SIZES="8 512 4K 32K 256K 2M 16M 64M 128M 256M" BUILD=1
while (($#)); do
    case $1 in
    --np) NP=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h | --help) sed -n '2,28s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "roofline.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $NP =~ ^[0-9]+$ && $NP -ge 2 ]] || { echo "roofline.sh: --np takes a rank count of 2 or more" >&2; exit 2; }
BUSBW=${BUSBW:-$ROOT/target/release/busbw}
OUT=$ROOT/target/peer
mkdir -p "$OUT"
cc -O2 -o "$OUT/memcpy_bw" "$ROOT/bench/peer/memcpy_bw.c"
cc -O2 -o "$OUT/shm_exchange" "$ROOT/bench/peer/shm_exchange.c"
cc -O3 -march=native -o "$OUT/reduce_pattern" "$ROOT/bench/peer/reduce_pattern.c" -lpthread
if ((BUILD)); then (cd "$ROOT" && cargo build --release -q -p busbw); fi
[[ -x $BUSBW ]] || { echo "roofline.sh: $BUSBW not built (drop --no-build)" >&2; exit 2; }

bytes() { numfmt --from=iec "$1"; }
PATTERN_SIZES=()
for s in $SIZES; do b=$(bytes "$s"); ((b < 32768)) || PATTERN_SIZES+=("$b"); done
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
for ((r = 1; r <= ROUNDS; r++)); do
    "$OUT/memcpy_bw" | awk '{print "copy1", $5}' >>"$LOG"
    for ((p = 0; p < NP; p++)); do "$OUT/memcpy_bw" & done | awk '{print "copyN", $5}' >>"$LOG"
    wait
    if ((NP == 2)); then
        # shellcheck disable=SC2046 # one argument per size
        "$OUT/shm_exchange" $(for s in $SIZES; do bytes "$s"; done) | awk '{print "floor", $2, $4}' >>"$LOG"
    fi
    # No rotation, as busbw's runs below. Below 32 KiB a call is its protocol, judged against
    # the exchange floor instead.
    if ((${#PATTERN_SIZES[@]})); then
        "$OUT/reduce_pattern" "$NP" 9 "${PATTERN_SIZES[@]}" >>"$LOG"
    fi
    for s in $SIZES; do
        b=$(bytes "$s")
        iters=$((b <= 65536 ? 2000 : b <= 4194304 ? 100 : 10))
        "$BUSBW" all_reduce_perf --np "$NP" --transport shm -b "$b" -e "$b" -n "$iters" -w 5 -c 0 --algo auto --rotate 0 \
            | awk -v b="$b" '$1 == b {print "busbw", b, $6, $10, $NF}' >>"$LOG"
    done
    echo "# round $r/$ROUNDS done" >&2
done

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores; $(date -u +%F); NP=$NP, $ROUNDS rounds, medians"
awk -v np="$NP" '
function median(key,   n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n ? a[int((n + 1) / 2)] : 0
}
{ if ($1 == "busbw") { k = $1 " " $2; vals[k " oop"] = vals[k " oop"] " " $3; vals[k " ip"] = vals[k " ip"] " " $4; algo[$2] = $5; sizes[$2] = 1 }
  else if ($1 == "floor") { vals["floor " $2] = vals["floor " $2] " " $3 }
  else if ($1 == "pattern") { vals["pip " $2] = vals["pip " $2] " " $3; vals["poop " $2] = vals["poop " $2] " " ($4 < $5 ? $4 : $5) }
  else vals[$1] = vals[$1] " " $2 }
END {
    c1 = median("copy1"); cn = median("copyN")
    printf "copy, one core: %.2f GB/s; with %d copying at once: %.2f GB/s each\n\n", c1, np, cn
    printf "| size (B) | out of place (us) | in place (us) | bound (us) | oop / bound | ip / bound | busbw oop / copy1 | oop / ip | pattern oop (us) | pattern ip (us) | pattern oop / ip | oop / pattern | ip / pattern |%s\n", np == 2 ? " floor (us) | oop / floor |" : ""
    printf "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|%s\n", np == 2 ? "---:|---:|" : ""
    n = 0; for (s in sizes) order[++n] = s + 0
    for (i = 2; i <= n; i++) { t = order[i]; for (j = i - 1; j >= 1 && order[j] > t; j--) order[j + 1] = order[j]; order[j + 1] = t }
    for (i = 1; i <= n; i++) {
        s = order[i]; o = median("busbw " s " oop"); p = median("busbw " s " ip")
        bound = s / (cn * 1e3)
        busbw = s / (o * 1e3) * 2 * (np - 1) / np
        line = sprintf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |", s, o, p, bound, bound / o, bound / p, busbw / c1, o / p)
        po = median("poop " s); pi = median("pip " s)
        line = line (pi > 0 ? sprintf(" %.2f | %.2f | %.2f | %.2f | %.2f |", po, pi, po / pi, o / po, p / pi) : " - | - | - | - | - |")
        if (np == 2) { f = median("floor " s); line = line sprintf(" %.3f | %.2f |", f, f > 0 ? o / f : 0) }
        print line
    }
}' "$LOG"
