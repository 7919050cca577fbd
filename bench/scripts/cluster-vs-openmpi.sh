#!/usr/bin/env bash
# cluster-vs-openmpi.sh: busbw AllReduce against OpenMPI's MPI_Allreduce across a simulated
# cluster with shaped links, with iperf3 on the same links as the reference.
#
# Builds a cluster of N network-namespace nodes (bench/tests/simcluster.sh, links shaped to
# RATE with tbf in both directions), measures iperf3 node0 -> node1 once, then per size runs
# busbw (one rank per node, torchrun-style variables) and OpenMPI (mpirun inside node0, its
# daemons started on the other nodes through an rsh agent that enters their namespaces; pml
# ob1, btl self,tcp on eth0, mpi_yield_when_idle 1: every "node" shares this machine's cores,
# which mpirun cannot see, and a peer that never yields measures 25 ms per 8-byte AllReduce
# here instead of ~0.1 ms) ALTERNATELY, busbw first, PAIRS pairs. Both do float32 sum,
# out-of-place, and report the MAX over ranks of the mean per-op time (busbw -a 3), so
# busbw = bytes/1e9/time * 2(n-1)/n is computed the same way for both. busbw runs -c 0; the
# peer validates every size.
#
# Prints per size the median time and busbw of each, busbw/openmpi (median of the per-pair
# ratios and their spread) and busbw as a fraction of iperf3's goodput. For a ring AllReduce
# every link carries busbw, so the ideal is the link's goodput. Always tears the cluster down.
#
#   bench/scripts/cluster-vs-openmpi.sh [--nodes 4] [--rate 1gbit] [--mtu 9000] [--pairs 3]
#                                       [--sizes "8 32M"] [--rt] [--no-build]
#                                       [-- extra busbw flags]
#
# busbw runs --algo auto (BUSBW_ALGO to change it): like OpenMPI's tuned AllReduce, which uses
# recursive doubling for short messages and a ring for long ones, it picks per size.
#
# --rt runs every process under SCHED_FIFO priority 1 (chrt -f 1), so builds and other jobs
# on a shared machine stay out of both measurements alike. BUSBW=/path/to/busbw skips the
# build. Needs root, Debian's OpenMPI (openmpi-bin libopenmpi-dev) and iperf3.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIM="$ROOT/bench/tests/simcluster.sh"
NODES=4
RATE=1gbit
MTU=9000
PAIRS=3
SIZES="8 32M"
BUILD=1
RT=()
ALGO=${BUSBW_ALGO:-auto}
EXTRA=()
while (($#)); do
    case $1 in
    --nodes) NODES=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --mtu) MTU=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --rt) RT=(chrt -f 1); shift ;;
    --no-build) BUILD=0; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h | --help) sed -n '2,25s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "cluster-vs-openmpi.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

die() { echo "cluster-vs-openmpi.sh: $*" >&2; exit 2; }
[[ $EUID -eq 0 ]] || die "needs root (network namespaces)"
((NODES >= 2)) || die "--nodes must be at least 2"
for tool in mpicc mpirun iperf3; do
    command -v "$tool" >/dev/null ||
        die "$tool is missing; install with: apt-get install -y openmpi-bin libopenmpi-dev iperf3"
done

mkdir -p "$ROOT/target/peer"
PEER="$ROOT/target/peer/mpi_allreduce"
mpicc -O2 -o "$PEER" "$ROOT/bench/peer/mpi_allreduce.c"

# shellcheck source=bench/scripts/sim-lib.sh
. "$ROOT/bench/scripts/sim-lib.sh"
sim_binary

NAME="cvo$$"
WORK=$(mktemp -d /tmp/cluster-vs-openmpi.XXXXXX)
cleanup() {
    bash "$SIM" down "$NAME" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash "$SIM" up "$NAME" "$NODES" --rate "$RATE" --mtu "$MTU" >&2
node() { local i=$1; shift; bash "$SIM" exec "$NAME" "$i" "$@"; }

# mpirun starts its daemons with "AGENT [options] HOST COMMAND...": enter HOST's namespace.
AGENT="$WORK/rsh-agent"
cat >"$AGENT" <<EOF
#!/usr/bin/env bash
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
i=\${host#node}; i=\${i%%.*}
exec bash "$SIM" exec "$NAME" "\$i" sh -c "\$*"
EOF
chmod +x "$AGENT"
HOSTS=$(seq -s, -f 'node%g' 0 $((NODES - 1)))

IPERF=$(sim_iperf3 "$WORK" "${RT[@]}") || exit 1

PORT=29600
run_busbw() { # bytes iters warmup -> "time_us"
    local b=$1 pids=() i rc=0
    PORT=$((PORT + 1))
    for ((i = 0; i < NODES; i++)); do
        RANK=$i WORLD_SIZE=$NODES LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=node0 \
            MASTER_PORT=$PORT node "$i" "${RT[@]}" "$BIN" all_reduce_perf -b "$b" -e "$b" \
            -n "$2" -w "$3" -c 0 -a 3 -T 120 --algo "$ALGO" "${EXTRA[@]}" >"$WORK/b.$i" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    ((rc == 0)) || { sed 's/^/[busbw] /' "$WORK/b.0" >&2; return 1; }
    awk -v s="$b" '!/^#/ && $1 == s { print $6; exit }' "$WORK/b.0"
}
run_peer() { # bytes iters warmup -> "time_us"
    node 0 "${RT[@]}" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$NODES" \
        --host "$HOSTS" --mca plm_rsh_agent "$AGENT" --mca oob_tcp_if_include eth0 \
        --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include eth0 --mca mpi_yield_when_idle 1 \
        "$PEER" -b "$1" -e "$1" -f 2 -n "$2" -w "$3" >"$WORK/p" 2>&1 ||
        { sed 's/^/[openmpi] /' "$WORK/p" >&2; return 1; }
    awk -v s="$1" '!/^#/ && $1 == s { print $3; exit }' "$WORK/p"
}

echo "# busbw: $("$BIN" --version) ; openmpi: $(mpirun --version 2>/dev/null | head -1)"
echo "# $NODES nodes x 1 rank, links shaped to $RATE (tbf both ways), MTU $MTU; busbw --algo $ALGO; pairs $PAIRS (busbw first); iperf3 goodput $IPERF Mbit/s${RT:+; both under ${RT[*]}}"
printf "# %12s %12s %12s %10s %10s %8s %14s %10s\n" size busbw_us openmpi_us busbw_GBs ompi_GBs ratio "ratio_spread" "/iperf3"
for s in $SIZES; do
    b=$(bytes "$s")
    # Few iterations for long messages (each is ~0.1-1 s at 1 Gbit/s), many for latency.
    if ((b >= 1048576)); then n=5; w=2; else n=200; w=20; fi
    bt=()
    pt=()
    for ((p = 0; p < PAIRS; p++)); do
        bt+=("$(run_busbw "$b" "$n" "$w")")
        pt+=("$(run_peer "$b" "$n" "$w")")
    done
    printf '%s\n' "${bt[@]}" >"$WORK/bt"
    printf '%s\n' "${pt[@]}" >"$WORK/pt"
    paste "$WORK/bt" "$WORK/pt" | awk -v b="$b" -v n="$NODES" -v iperf="$IPERF" '
        function median(a, k,   i, j, t) {
            for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        { k++; bt[k] = $1; pt[k] = $2; r[k] = $2 / $1 }
        END {
            f = 2 * (n - 1) / n
            mb = median(bt, k); mp = median(pt, k); mr = median(r, k)
            lo = r[1]; hi = r[1]
            for (i = 1; i <= k; i++) { if (r[i] < lo) lo = r[i]; if (r[i] > hi) hi = r[i] }
            gb = b / mb / 1e3 * f; gp = b / mp / 1e3 * f
            printf "  %12d %12.2f %12.2f %10.6f %10.6f %8.3f %6.3f..%-6.3f %10.3f\n", b, mb, mp, gb, gp, mr, lo, hi, gb * 8000 / iperf
        }'
done
echo "# ratio = openmpi time / busbw time (= busbw busbw / openmpi busbw); /iperf3 = busbw's busbw over iperf3's goodput"
