#!/usr/bin/env bash
# rdma-ab.sh: two verbs builds of busbw on the same SoftRoCE link, alternating, to tell a
# regression from noise where rxe under emulation swings from one run to the next. Two guests
# of the test bed (rdma-vm.sh), one rank each; every round runs both builds, in turn (the first
# build first in odd rounds, second in even ones): sendrecv_perf at 8 B (2000 iterations) and
# at 1 and 4 MiB, all_reduce_perf at 8 B and 2 MiB. Prints the medians over the rounds of the
# out-of-place time of each build and their ratio (after / before).
#
#   rdma-ab.sh BEFORE AFTER [ROUNDS]      (both built with --features verbs; needs root)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
(($# >= 2)) || { echo "usage: ${0##*/} BEFORE AFTER [ROUNDS]" >&2; exit 2; }
before=$(realpath "$1") after=$(realpath "$2") rounds=${3:-3}
for b in "$before" "$after"; do
    [[ -x $b ]] || { echo "${0##*/}: $b is not an executable file" >&2; exit 2; }
    doctor=$("$b" doctor 2>&1 || true)
    grep -q 'built without the `verbs` feature' <<<"$doctor" &&
        { echo "${0##*/}: $b has no verbs feature (cargo build --release -p busbw --features verbs)" >&2; exit 2; }
done
out=$(mktemp -d /tmp/rdma-ab.XXXXXX)

cat >"$out/guest.sh" <<EOF
set -u
A=$before
B=$after
R=$rounds
EOF
cat >>"$out/guest.sh" <<'EOF'
i=$VM_INDEX
port=31000
bb() { # build label, name, busbw arguments
    local bin=$1 name=$2; shift 2
    port=$((port + 1))
    # perftest's ack timeout (67 ms) rather than NCCL's 4.3 s, as rdma-vs-perftest.sh does.
    RANK=$i WORLD_SIZE=2 MASTER_ADDR=vm0 MASTER_PORT=$port NCCL_IB_TIMEOUT=14 "$bin" "$@" \
        --transport verbs -T 300 >"$VM_OUT/$name" 2>&1
    sleep 1
}
for r in $(seq "$R"); do
    order="a b"; [ $((r % 2)) = 0 ] && order="b a"
    for w in $order; do
        bin=$A; [ "$w" = b ] && bin=$B
        bb "$bin" "r$r.$w.lat" sendrecv_perf -b 8 -e 8 -n 2000 -w 100 -c 0
        bb "$bin" "r$r.$w.bw" sendrecv_perf -b 1M -e 4M -f 4 -n 20 -w 2 -c 0
        bb "$bin" "r$r.$w.ar" all_reduce_perf -b 8 -e 2M -f 262144 -n 20 -w 3 -c 0
    done
done
EOF
bash "$here/rdma-vm.sh" run --guests 2 --smp 1 --mem 1536 --out "$out" --timeout 3000 -- \
    "bash $out/guest.sh"

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
time_at() { awk -v s="$2" '!/^#/ && $1 == s { print $6 }' "$1"; }    # out-of-place time us
collect() { for ((r = 1; r <= rounds; r++)); do time_at "$out/vm0/r$r.$1.$2" "$3"; done | median; }
echo "# busbw A/B over verbs on SoftRoCE (rxe0, two qemu TCG guests), medians of $rounds rounds"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf "%-12s %9s %12s %12s %8s\n" figure bytes "before(us)" "after(us)" ratio
for f in "lat 8" "bw 1048576" "bw 4194304" "ar 8" "ar 2097152"; do
    read -r name size <<<"$f"
    a=$(collect a "$name" "$size") b=$(collect b "$name" "$size")
    coll=sendrecv; [ "$name" = ar ] && coll=all_reduce
    awk -v c="$coll" -v s="$size" -v a="$a" -v b="$b" \
        'BEGIN { printf "%-12s %9d %12.2f %12.2f %8.3f\n", c, s, a, b, (a > 0 ? b / a : 0) }'
done
echo "# raw output in $out"
