#!/usr/bin/env bash
# cluster-bw.sh: busbw AllReduce across a simulated cluster with shaped links, compared with
# the link itself. Builds a cluster of N network-namespace nodes (bench/tests/simcluster.sh)
# whose links are shaped to RATE (tbf, both directions), measures iperf3 between two nodes as
# the link reference, runs `busbw all_reduce_perf` with one rank per node up to MAX bytes
# (-c 0, few iterations), and reports busbw at MAX as a fraction of the shaped rate and of
# iperf3's goodput. For a ring AllReduce, busbw is what each link carries, so the ideal is
# the link's goodput. Always tears the cluster down. Needs root.
#
#   bench/scripts/cluster-bw.sh [--nodes 4] [--rate 1gbit] [--mtu 1500] [--min 32M] [--max 256M]
#                               [--iters 3] [--no-build] [-- extra busbw flags]
#
# BUSBW=/path/to/busbw skips the build and runs that binary.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIM="$ROOT/bench/tests/simcluster.sh"
NODES=4
RATE=1gbit
MTU=1500
MIN=32M
MAX=256M
ITERS=3
BUILD=1
EXTRA=()
while (($#)); do
    case $1 in
    --nodes) NODES=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --mtu) MTU=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h | --help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "cluster-bw.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

[[ $EUID -eq 0 ]] || { echo "cluster-bw.sh: needs root (network namespaces)" >&2; exit 2; }
((NODES >= 2)) || { echo "cluster-bw.sh: --nodes must be at least 2" >&2; exit 2; }
if ! command -v iperf3 >/dev/null; then
    echo "cluster-bw.sh: iperf3 is missing; install it with: apt-get install -y iperf3" >&2
    exit 2
fi

# shellcheck source=bench/scripts/sim-lib.sh
. "$ROOT/bench/scripts/sim-lib.sh"
sim_binary
# The shaped rate in bits/s (tc syntax: 1gbit, 500mbit, 100mbps ...).
rate_bits() {
    local r=${1,,} n
    [[ $r =~ ^([0-9]+)([kmgt]?)(bit|bps)$ ]] || { echo "bad rate $1" >&2; exit 2; }
    n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in k) n=$((n * 1000)) ;; m) n=$((n * 1000000)) ;;
        g) n=$((n * 1000000000)) ;; t) n=$((n * 1000000000000)) ;; esac
    [[ ${BASH_REMATCH[3]} == bps ]] && n=$((n * 8))
    echo "$n"
}
MAXB=$(bytes "$MAX")
RATEB=$(rate_bits "$RATE")

NAME="cbw$$"
WORK=$(mktemp -d /tmp/cluster-bw.XXXXXX)
cleanup() {
    bash "$SIM" down "$NAME" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash "$SIM" up "$NAME" "$NODES" --rate "$RATE" --mtu "$MTU" >&2
node() { local i=$1; shift; bash "$SIM" exec "$NAME" "$i" "$@"; }

IPERF_MBITS=$(sim_iperf3 "$WORK") || exit 1

# busbw: one rank per node, torchrun-style variables, rank 0 (the store) on node0.
PORT=29500
echo "# busbw all_reduce_perf, $NODES nodes x 1 rank, $MIN..$MAX" >&2
pids=()
for ((i = 0; i < NODES; i++)); do
    RANK=$i WORLD_SIZE=$NODES LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=node0 MASTER_PORT=$PORT \
        node "$i" "$BIN" all_reduce_perf -b "$MIN" -e "$MAX" -f 2 -n "$ITERS" -w 1 -c 0 -T 300 \
        "${EXTRA[@]}" >"$WORK/out.$i" 2>"$WORK/err.$i" &
    pids+=($!)
done
rc=0
for ((i = 0; i < NODES; i++)); do
    wait "${pids[$i]}" || { c=$?; ((c > rc)) && rc=$c; }
done
cat "$WORK/out.0"
if ((rc != 0)); then
    for ((i = 0; i < NODES; i++)); do sed "s/^/[node$i] /" "$WORK/err.$i" >&2; done
    echo "cluster-bw.sh: busbw failed with exit code $rc" >&2
    exit "$rc"
fi

# The row of MAX bytes. The printed busbw has 2 decimals, too coarse at these rates, so it is
# recomputed from the time columns (us; field 6 out-of-place, 10 in-place) as busbw does:
# algbw = size / time (GB/s, 1e9 B/s), busbw = algbw * 2(n-1)/n.
read -r OOP IP < <(awk -v s="$MAXB" -v n="$NODES" '!/^#/ && $1 == s {
    f = 2 * (n - 1) / n
    printf "%.6f %.6f\n", s / $6 / 1e3 * f, s / $10 / 1e3 * f }' "$WORK/out.0")
[[ -n ${OOP:-} ]] || { echo "cluster-bw.sh: no $MAXB-byte row in the table" >&2; exit 1; }
awk -v oop="$OOP" -v ip="$IP" -v rate="$RATEB" -v iperf="$IPERF_MBITS" -v n="$NODES" \
    -v max="$MAX" -v rname="$RATE" 'BEGIN {
    printf "#\n# cluster-bw: %d nodes x 1 rank, links shaped to %s (tbf both ways)\n", n, rname
    printf "# %-40s: %7.1f Mbit/s = %.3f of the shaped rate\n", "iperf3 goodput, 1 TCP stream", iperf, iperf * 1e6 / rate
    printf "# %-40s: %.4f GB/s = %7.1f Mbit/s\n", "busbw at " max ", out-of-place", oop, oop * 8000
    printf "# %-40s: %.4f GB/s = %7.1f Mbit/s\n", "busbw at " max ", in-place", ip, ip * 8000
    printf "# %-40s: %.3f, %.3f\n", "busbw / shaped rate (oop, in-place)", oop * 8e9 / rate, ip * 8e9 / rate
    printf "# %-40s: %.3f, %.3f\n", "busbw / iperf3 goodput (oop, in-place)", oop * 8000 / iperf, ip * 8000 / iperf
}'
