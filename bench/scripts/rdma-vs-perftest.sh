#!/usr/bin/env bash
# rdma-vs-perftest.sh: busbw over verbs against perftest on the same SoftRoCE link, side by
# side. Two guests of the test bed (rdma-vm.sh), one rank each; ROUNDS rounds, each running, in
# turn: ib_write_bw (1 MiB, one direction and both), busbw broadcast_perf at 1 and 4 MiB (on
# two ranks a one-way transfer, like ib_write_bw), busbw sendrecv_perf at 1 and 4 MiB (both
# directions at once, like ib_write_bw -b), ib_write_lat and ib_send_lat (8 B), busbw
# sendrecv_perf at 8 B with and without the eager path, busbw all_reduce_perf (8 B to 2 MiB).
# rxe is software and the guests are emulated: only the ratios of one run mean anything.
# Prints medians over the rounds and the ratios.
#
#   rdma-vs-perftest.sh [BUSBW] [ROUNDS]     (BUSBW: a verbs build, default target/release/busbw)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
busbw=$(realpath "${1:-$here/../../target/release/busbw}")
rounds=${2:-3}
[[ -x $busbw ]] || { echo "${0##*/}: $busbw is not built (cargo build --release -p busbw --features verbs)" >&2; exit 2; }
# (doctor exits non-zero on a host without RDMA devices: read its words, not its status.)
doctor=$("$busbw" doctor 2>&1 || true)
grep -q 'built without the `verbs` feature' <<<"$doctor" &&
    { echo "${0##*/}: $busbw has no verbs feature (cargo build --release -p busbw --features verbs)" >&2; exit 2; }
out=$(mktemp -d /tmp/rdma-vs-perftest.XXXXXX)

# In each guest. vm0 serves perftest and hosts rank 0; vm1 is the client and rank 1.
cat >"$out/guest.sh" <<EOF
set -u
B=$busbw
R=$rounds
EOF
cat >>"$out/guest.sh" <<'EOF'
i=$VM_INDEX
peer=vm1; [ "$i" = 1 ] && peer=vm0
# perftest: the server on vm0; the client retries until the server listens.
pt() { # name, then the perftest command without the server name
    local name=$1; shift
    if [ "$i" = 0 ]; then
        "$@" >"$VM_OUT/$name" 2>&1
    else
        for _ in $(seq 100); do "$@" vm0 >"$VM_OUT/$name" 2>&1 && break; sleep 0.3; done
    fi
    sleep 1
}
bb() { # name, port, busbw arguments
    local name=$1 port=$2; shift 2
    # perftest's ack timeout (-u 14, 67 ms) rather than NCCL's 20 (4.3 s): rxe under emulation
    # drops packets of long bursts, and each tail drop then costs one ack timeout.
    RANK=$i WORLD_SIZE=2 MASTER_ADDR=vm0 MASTER_PORT=$port NCCL_IB_TIMEOUT=14 \
        BUSBW_IB_EAGER=${BUSBW_IB_EAGER:-4096} "$B" "$@" \
        --transport verbs -T 300 \
        >"$VM_OUT/$name" 2>&1
    sleep 1
}
for r in $(seq "$R"); do
    pt "r$r.write_bw" ib_write_bw -d rxe0 -x 1 -F -s 1048576 -n 200 --report_gbits
    bb "r$r.broadcast_bw" $((30003 + r * 10)) broadcast_perf -b 1M -e 4M -f 4 -n 20 -w 2
    pt "r$r.write_bw_bidir" ib_write_bw -d rxe0 -x 1 -F -s 1048576 -n 200 -b --report_gbits
    bb "r$r.sendrecv_bw" $((30000 + r * 10)) sendrecv_perf -b 1M -e 4M -f 4 -n 20 -w 2
    pt "r$r.write_lat" ib_write_lat -d rxe0 -x 1 -F -s 8 -n 2000
    pt "r$r.send_lat" ib_send_lat -d rxe0 -x 1 -F -s 8 -n 2000
    bb "r$r.sendrecv_lat" $((30001 + r * 10)) sendrecv_perf -b 8 -e 8 -n 2000 -w 100
    BUSBW_IB_EAGER=0 bb "r$r.sendrecv_lat_rv" $((30004 + r * 10)) sendrecv_perf -b 8 -e 8 -n 2000 -w 100
    bb "r$r.all_reduce" $((30002 + r * 10)) all_reduce_perf -b 8 -e 2M -f 8 -n 20 -w 3
done
EOF
bash "$here/rdma-vm.sh" run --guests 2 --smp 1 --mem 1536 --out "$out" --timeout 3000 -- \
    "bash $out/guest.sh"

# Figures (from vm1, the perftest client, and vm0, rank 0 of busbw).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
bw_gbps() { awk '$1 == 1048576 { print $4 }' "$1"; }                 # BW average [Gb/s]
lat_us() { awk '$1 == 8 && NF >= 6 { print $6 }' "$1"; }             # t_avg [usec]
# out-of-place busbw in GB/s from the time column (the table rounds busbw to 0.01 GB/s); the
# factor is 1 for sendrecv and broadcast, 2(n-1)/n = 1 for all_reduce on two ranks.
busbw_at() { awk -v s="$2" '!/^#/ && $1 == s { printf "%.6f\n", s / ($6 * 1e3) }' "$1"; }
time_at() { awk -v s="$2" '!/^#/ && $1 == s { print $6 }' "$1"; }    # out-of-place time us
collect() { for ((r = 1; r <= rounds; r++)); do "$1" "$out/vm$2/r$r.$3" ${4:+"$4"}; done | median; }
wbw=$(collect bw_gbps 1 write_bw)
wbwb=$(collect bw_gbps 1 write_bw_bidir)
wlat=$(collect lat_us 1 write_lat)
slat=$(collect lat_us 1 send_lat)
sr1=$(collect busbw_at 0 sendrecv_bw 1048576)
sr4=$(collect busbw_at 0 sendrecv_bw 4194304)
bc1=$(collect busbw_at 0 broadcast_bw 1048576)
bc4=$(collect busbw_at 0 broadcast_bw 4194304)
sr8=$(collect time_at 0 sendrecv_lat 8)
rv8=$(collect time_at 0 sendrecv_lat_rv 8)
ar=$(collect busbw_at 0 all_reduce 2097152)
echo "# busbw vs perftest on SoftRoCE (rxe0, two qemu TCG guests), medians of $rounds rounds"
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
awk -v wbw="$wbw" -v wbwb="$wbwb" -v wlat="$wlat" -v slat="$slat" -v sr1="$sr1" -v sr4="$sr4" \
    -v bc1="$bc1" -v bc4="$bc4" -v sr8="$sr8" -v rv8="$rv8" -v ar="$ar" 'BEGIN {
    printf "ib_write_bw 1 MiB            %8.3f Gb/s = %.4f GB/s (-b, both directions together: %.3f Gb/s)\n", wbw, wbw / 8, wbwb
    printf "  per direction when both run: %.4f GB/s\n", wbwb / 16
    printf "busbw broadcast 1 MiB busbw  %8.4f GB/s  ratio to ib_write_bw %.2f (one way)\n", bc1, bc1 / (wbw / 8)
    printf "busbw broadcast 4 MiB busbw  %8.4f GB/s  ratio to ib_write_bw %.2f (one way)\n", bc4, bc4 / (wbw / 8)
    printf "busbw sendrecv 1 MiB busbw   %8.4f GB/s  ratio to ib_write_bw -b per direction %.2f\n", sr1, sr1 / (wbwb / 16)
    printf "busbw sendrecv 4 MiB busbw   %8.4f GB/s  ratio to ib_write_bw -b per direction %.2f\n", sr4, sr4 / (wbwb / 16)
    printf "busbw all_reduce 2 MiB busbw %8.4f GB/s\n", ar
    printf "ib_write_lat 8 B t_avg       %8.2f us (half a round trip)\n", wlat
    printf "ib_send_lat 8 B t_avg        %8.2f us\n", slat
    printf "busbw sendrecv 8 B time      %8.2f us  ratio to ib_write_lat %.2f, to its round trip %.2f\n", sr8, sr8 / wlat, sr8 / (2 * wlat)
    printf "  without the eager path     %8.2f us  ratio to ib_write_lat %.2f\n", rv8, rv8 / wlat
}'
echo "# raw output in $out"
