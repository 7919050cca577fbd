#!/usr/bin/env bash
# vs-openmpi.sh: busbw AllReduce against OpenMPI's MPI_Allreduce, same machine, same run.
#
# Builds the peer benchmark bench/peer/mpi_allreduce.c with mpicc and the memcpy reference
# bench/peer/memcpy_bw.c with cc (into target/peer/, never committed), builds busbw release if
# needed, then for every case (ranks x transport) and size runs busbw and the peer
# ALTERNATELY, busbw first (A B A B ...), PAIRS pairs.  Both do float32 sum, out of place and
# then in place (nccl-tests' two columns; the peer with -i 1, MPI_IN_PLACE), the
# same bytes, the same -n and -w, and both report the time as the MAX over ranks of the mean
# per-op time (busbw with -a 3; the peer does MPI_Allreduce MAX of its per-rank time), so
# busbw = bytes/1e9/time * 2(n-1)/n is computed the same way on both sides.
#
#   shm: busbw --transport shm   vs  mpirun --mca pml ob1 --mca btl self,vader
#   tcp: busbw --transport tcp   vs  mpirun --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo
#
# Prints per case and size the median busbw of each, the ratio busbw/openmpi of the medians and
# the spread (min..max of the per-pair ratios), out of place, then the same ratio and spread in
# place, plus, measured in the same run as the physical
# references, a single-core memcpy bandwidth, iperf3's TCP loopback goodput and the floor of
# a two-process 8-byte exchange over TCP loopback (bench/peer/tcp_exchange.c: one socket for
# both directions, and one per direction as busbw's TCP transport has them).  The peer
# validates every size (exit 7 on a wrong element); busbw runs with -c 0.
#
# Iterations are calibrated per case and size before the pairs (CALIB_SECS, default 0.3 s
# of the slower side's timed loop, at least 5), so that both run in steady state.
#
# Both sides rotate their buffers over the same window (--rotate, default busbw's 8M; 0 keeps
# them still, both then run sizes that fit a core's cache from that cache): iteration k uses
# bytes * (k mod floor(WINDOW/bytes)) into the buffers, busbw with --rotate WINDOW and the peer
# with -r WINDOW.
#
# busbw runs with --algo auto (BUSBW_ALGO to change it): like OpenMPI's tuned collectives,
# which switch from recursive doubling to a ring as messages grow, it picks its algorithm per
# size, so both sides run their own best choice.
#
#   bench/scripts/vs-openmpi.sh [--pairs 3] [--np "2 4"] [--transports "shm tcp"]
#                               [--sizes "8 128K 1M 8M 32M 128M"] [--no-build] [--raw FILE]
#                               [--rt] [--rotate 8M]
#
# --rt runs both sides (and the references) under SCHED_FIFO priority 1 (chrt -f 1): on a
# machine shared with builds and other jobs this keeps their CPU time out of both
# measurements alike. Both sides spin while they wait, so each run holds the cores it uses.
#
# BUSBW=/path/to/busbw skips the cargo build and runs that binary.  BUSBW_AVG (default 3)
# is busbw's -a.  Needs Debian's OpenMPI and iperf3:
#   apt-get install -y openmpi-bin libopenmpi-dev iperf3
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PAIRS=3
NPS="2 4"
TRANSPORTS="shm tcp"
SIZES="8 128K 1M 8M 32M 128M"
BUILD=1
RAW=""
RT=()
AVG=${BUSBW_AVG:-3}
ALGO=${BUSBW_ALGO:-auto}
ROTATE=8M
while (($#)); do
    case $1 in
    --pairs) PAIRS=$2; shift 2 ;;
    --np) NPS=$2; shift 2 ;;
    --transports) TRANSPORTS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --raw) RAW=$2; shift 2 ;;
    --rt) RT=(chrt -f 1); shift ;;
    --rotate) ROTATE=$2; shift 2 ;;
    -h|--help) sed -n '2,46p' "$0"; exit 0 ;;
    *) echo "vs-openmpi.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

for tool in mpicc mpirun; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "vs-openmpi.sh: $tool not found; install OpenMPI with:" >&2
        echo "    apt-get update && apt-get install -y openmpi-bin libopenmpi-dev" >&2
        exit 3
    fi
done
command -v cc >/dev/null 2>&1 || { echo "vs-openmpi.sh: cc not found (apt-get install -y gcc)" >&2; exit 3; }

OUTDIR="$ROOT/target/peer"
mkdir -p "$OUTDIR"
PEER="$OUTDIR/mpi_allreduce"
MEMCPY="$OUTDIR/memcpy_bw"
EXCHANGE="$OUTDIR/tcp_exchange"
mpicc -O2 -o "$PEER" "$ROOT/bench/peer/mpi_allreduce.c"
cc -O2 -o "$MEMCPY" "$ROOT/bench/peer/memcpy_bw.c"
cc -O2 -o "$EXCHANGE" "$ROOT/bench/peer/tcp_exchange.c"

if [[ -n ${BUSBW:-} ]]; then
    :
else
    BUSBW="$ROOT/target/release/busbw"
    if ((BUILD)); then
        (cd "$ROOT" && cargo build --release -p busbw --quiet)
    fi
fi
[[ -x $BUSBW ]] || { echo "vs-openmpi.sh: $BUSBW is not executable" >&2; exit 3; }

MPIRUN=(mpirun --oversubscribe --bind-to none)
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)

# bytes of a size like 128K / 1M (binary multiples)
to_bytes() {
    local s=$1
    case $s in
    *K) echo $(( ${s%K} * 1024 )) ;;
    *M) echo $(( ${s%M} * 1024 * 1024 )) ;;
    *G) echo $(( ${s%G} * 1024 * 1024 * 1024 )) ;;
    *) echo "$s" ;;
    esac
}
# iterations and warmup per size for the calibration probes
iters_for() {
    local b=$1
    if ((b <= 4096)); then echo "1000 20"
    elif ((b <= 262144)); then echo "200 10"
    elif ((b <= 2097152)); then echo "50 5"
    elif ((b <= 8388608)); then echo "10 2"
    elif ((b <= 33554432)); then echo "5 1"
    else echo "3 1"; fi
}
human() {
    local b=$1
    if ((b >= 1048576 && b % 1048576 == 0)); then echo "$((b / 1048576)) MiB"
    elif ((b >= 1024 && b % 1024 == 0)); then echo "$((b / 1024)) KiB"
    else echo "$b B"; fi
}

RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT
FAILS=0

run_busbw() { # np transport bytes iters warmup -> "time busbw ip_time ip_busbw"
    local out
    out=$("${RT[@]}" "$BUSBW" all_reduce_perf --np "$1" --transport "$2" -b "$3" -e "$3" -f 2 \
        -n "$4" -w "$5" -c 0 -a "$AVG" --algo "$ALGO" --rotate "$ROTATE" 2>&1) || { echo "busbw failed: $out" >&2; return 1; }
    awk '$0 !~ /^[[:space:]]*#/ && NF >= 12 { print $6, $8, $10, $12; found=1; exit } END { if (!found) exit 1 }' <<<"$out" \
        || { echo "busbw: no data row in: $out" >&2; return 1; }
}
run_peer() { # np transport bytes iters warmup -> "time busbw ip_time ip_busbw"
    local btl
    if [[ $2 == shm ]]; then btl=(--mca pml ob1 --mca btl self,vader)
    else btl=(--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo); fi
    local out
    out=$("${RT[@]}" "${MPIRUN[@]}" -np "$1" "${btl[@]}" "$PEER" -b "$3" -e "$3" -f 2 -n "$4" -w "$5" -r "$(to_bytes "$ROTATE")" -i 1 2>&1) \
        || { echo "peer failed (rc $?): $out" >&2; return 1; }
    awk '$0 !~ /^[[:space:]]*#/ && NF >= 10 { print $3, $5, $7, $9; found=1; exit } END { if (!found) exit 1 }' <<<"$out" \
        || { echo "peer: no data row in: $out" >&2; return 1; }
}

START=$(date +%s)
echo "# vs-openmpi.sh  $(date -u +%Y-%m-%dT%H:%M:%SZ)  host $(hostname)  cores $(nproc)"
echo "# busbw: $BUSBW ($("$BUSBW" --version 2>/dev/null || echo '?'))"
echo "# openmpi: $(mpirun --version 2>/dev/null | head -1)"
echo "# pairs $PAIRS (busbw then openmpi, alternating), sizes: $SIZES, busbw -a $AVG -c 0 --algo $ALGO, both rotate over $ROTATE, peer validates${RT:+, both under ${RT[*]}}"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

read -r _ mb mreps mbest mmed < <("${RT[@]}" "$MEMCPY")
echo "# memcpy reference (1 core, $(human "$mb"), $mreps reps): best $mbest GB/s, median $mmed GB/s (bytes copied per second)"
# TCP loopback reference: one iperf3 stream for 3 s.
IPERF="NA"
if command -v iperf3 >/dev/null 2>&1; then
    port=$((20000 + RANDOM % 20000))
    "${RT[@]}" iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
    srv=$!
    for _ in $(seq 50); do
        ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
        sleep 0.1
    done
    IPERF=$("${RT[@]}" iperf3 -c 127.0.0.1 -p "$port" -t 3 -f g 2>/dev/null |
        awk '/receiver/ { for (i = 1; i < NF; i++) if ($(i + 1) == "Gbits/sec") v = $i } END { print v ? v : "NA" }')
    wait "$srv" 2>/dev/null || true
fi
echo "# iperf3 TCP loopback reference (1 stream, 3 s): $IPERF Gbit/s"
# The floor under a small TCP AllReduce of two ranks: send 8 bytes, receive 8 bytes, nothing else.
read -r _ _ _ _ X1 < <("${RT[@]}" "$EXCHANGE" 8 50000 100 1)
read -r _ _ _ _ X2 < <("${RT[@]}" "$EXCHANGE" 8 50000 100 2)
echo "# TCP loopback 8 B exchange floor (tcp_exchange, 50000 iters): $X1 us on one socket, $X2 us on one socket per direction"

# Iterations per case and size, calibrated so that each side's timed loop runs about
# CALIB_SECS (0.3 s): a fixed 5 or 20 iterations of a large size measure a peer short of its
# steady state. Both sides then run the same count: from one probe of each (the short counts
# of iters_for), the slower side's time per operation sets it (at least 5, warmup a tenth).
declare -A ITERS
CALIB_SECS=${CALIB_SECS:-0.3}
calibrate() { # np transport bytes -> "iters warmup"
    local n w a o t
    read -r n w < <(iters_for "$3")
    a=$(run_busbw "$1" "$2" "$3" "$n" "$w" | cut -d' ' -f1) || a=""
    o=$(run_peer "$1" "$2" "$3" "$n" "$w" | cut -d' ' -f1) || o=""
    awk -v a="${a:-0}" -v o="${o:-0}" -v n="$n" -v w="$w" -v secs="$CALIB_SECS" 'BEGIN {
        t = a > o ? a : o
        if (t <= 0) { print n, w; exit }
        k = int(secs * 1e6 / t); if (k < 5) k = 5; if (k > 200000) k = 200000
        wu = int(k / 10); if (wu < 2) wu = 2; if (wu > 1000) wu = 1000
        print k, wu }'
}

for np in $NPS; do
    for tr in $TRANSPORTS; do
        for s in $SIZES; do
            b=$(to_bytes "$s")
            ITERS[$np $tr $b]=$(calibrate "$np" "$tr" "$b")
        done
        for ((p = 1; p <= PAIRS; p++)); do
            for s in $SIZES; do
                b=$(to_bytes "$s")
                read -r n w <<<"${ITERS[$np $tr $b]}"
                if a=$(run_busbw "$np" "$tr" "$b" "$n" "$w"); then :; else a="NA NA NA NA"; FAILS=$((FAILS + 1)); fi
                if o=$(run_peer "$np" "$tr" "$b" "$n" "$w"); then :; else o="NA NA NA NA"; FAILS=$((FAILS + 1)); fi
                echo "$np $tr $b $p $n $a $o" >>"$RESULTS"
            done
        done
        echo "# done: np=$np $tr ($(( $(date +%s) - START )) s)"
    done
done

[[ -n $RAW ]] && { echo "# np transport bytes pair iters busbw_time_us busbw_GBps busbw_ip_time_us busbw_ip_GBps ompi_time_us ompi_GBps ompi_ip_time_us ompi_ip_GBps"; cat "$RESULTS"; } >"$RAW"

echo
printf '%-4s %-4s %9s %6s | %12s %12s | %12s %12s | %7s %13s | %12s %12s %7s %13s\n' \
    np tr size iters "busbw us" "busbw GB/s" "ompi us" "ompi GB/s" ratio "spread" "ip busbw us" "ip ompi us" "ip ratio" "ip spread"
printf '%s\n' "-------------------------------------------------------------------------------------------------------------------------------------------------------"
for np in $NPS; do
    for tr in $TRANSPORTS; do
        for s in $SIZES; do
            b=$(to_bytes "$s")
            awk -v np="$np" -v tr="$tr" -v b="$b" -v label="$(human "$b")" '
                function median(a, k,   i, j, t) {
                    for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
                    return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
                }
                # busbw in GB/s recomputed from the time column (busbw prints only 2 decimals)
                function bw(t) { return b / 1e9 / (t * 1e-6) * 2 * (np - 1) / np }
                # fields: np tr bytes pair iters | busbw: time GB/s ip_time ip_GB/s | ompi: the same
                $1 == np && $2 == tr && $3 == b {
                    iters = $5
                    if ($6 != "NA") { at[++ka] = $6; ab[ka] = bw($6); ait[ka] = $8; aib[ka] = bw($8) }
                    if ($10 != "NA") { ot[++ko] = $10; ob[ko] = bw($10); oit[ko] = $12; oib[ko] = bw($12) }
                    if ($6 != "NA" && $10 != "NA" && $6 > 0 && $8 > 0) {
                        r = $10 / $6; kr++      # busbw ratio = inverse time ratio (same bytes, same factor)
                        if (kr == 1 || r < rmin) rmin = r
                        if (kr == 1 || r > rmax) rmax = r
                        r = $12 / $8
                        if (kr == 1 || r < imin) imin = r
                        if (kr == 1 || r > imax) imax = r
                    }
                }
                END {
                    mat = ka ? median(at, ka) : "NA"; vab = ka ? median(ab, ka) : 0; mab = ka ? sprintf("%.4g", vab) : "NA"
                    mot = ko ? median(ot, ko) : "NA"; vob = ko ? median(ob, ko) : 0; mob = ko ? sprintf("%.4g", vob) : "NA"
                    ratio = (ka && ko && vob > 0) ? sprintf("%.2f", vab / vob) : "NA"
                    spread = kr ? sprintf("%.2f..%.2f", rmin, rmax) : "NA"
                    mait = ka ? median(ait, ka) : "NA"; viab = ka ? median(aib, ka) : 0
                    moit = ko ? median(oit, ko) : "NA"; viob = ko ? median(oib, ko) : 0
                    iratio = (ka && ko && viob > 0) ? sprintf("%.2f", viab / viob) : "NA"
                    ispread = kr ? sprintf("%.2f..%.2f", imin, imax) : "NA"
                    printf "%-4s %-4s %9s %6s | %12s %12s | %12s %12s | %7s %13s | %12s %12s %7s %13s\n", np, tr, label, iters, mat, mab, mot, mob, ratio, spread, mait, moit, iratio, ispread
                }' "$RESULTS"
        done
    done
done
echo
echo "# GB/s = busbw recomputed from the out-of-place time (bytes/1e9/time x 2(n-1)/n); us = median time (max over ranks)
# ratio = median busbw(busbw) / median busbw(openmpi), >1 means busbw is faster; spread = min..max of per-pair ratios
# ip: the same in place (the median in-place times, then ratio and spread)"
echo "# memcpy reference: best $mbest GB/s, median $mmed GB/s on one core; iperf3 TCP loopback: $IPERF Gbit/s"
echo "# TCP 8 B exchange floor: $X1 us (one socket), $X2 us (one socket per direction)"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg); wall $(( $(date +%s) - START )) s; failed runs: $FAILS"
((FAILS == 0)) || exit 1
