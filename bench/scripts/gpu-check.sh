#!/usr/bin/env bash
# gpu-check.sh: the device-buffer check for one GPU host (issue 10; docs/cuda.md). Takes a
# prebuilt binary, because a GPU host may have CUDA but no Rust toolchain:
#
#   cargo build --release --features cuda          # anywhere; no CUDA toolkit needed
#   bench/scripts/gpu-check.sh target/release/busbw [--quick] [--host]
#
# --host drops -g 1 and the kernel table: the same runs on host memory, which checks the
# script itself on a machine without a GPU.
#
# 1. Every collective with device buffers (-g 1) on 1, 2 and 4 local ranks sharing the GPU
#    (NCCL_TESTS_DEVICE=0 unless set), every type, validated; the reductions also with every
#    op. Over shared memory these run GPU to GPU (CUDA IPC between the rank processes) where
#    the driver allows it; rank 0's path line, printed once below, says which. AllReduce 2
#    ranks once more over TCP, and 4 ranks with the tree and with recursive doubling (every
#    op) over TCP too: a named transport stages device data through pinned host memory, so
#    these check the staged engines on the device.
# 2. `busbw gpu-bench`: each reduction kernel's bandwidth against a device-to-device copy.
#
# Prints one line per run, then the kernel table last. Exit 0 only if every run exited 0
# with "#wrong" 0 everywhere ("Out of bounds values : 0 OK"); 1 otherwise; 2 on bad usage.
# Designed to finish in well under 5 minutes on one GPU (--quick: smaller sizes).
set -uo pipefail

usage() { echo "usage: $0 BUSBW_BINARY [--quick] [--host]" >&2; exit 2; }
(($# >= 1)) || usage
BIN=$1
shift
MAX=8M
KBYTES=256M
GPU=(-g 1)
while (($#)); do
    case $1 in
    --quick) MAX=256K; KBYTES=32M; shift ;;
    --host) GPU=(); shift ;;
    *) usage ;;
    esac
done
[[ -x $BIN ]] || { echo "gpu-check: $BIN is not an executable file" >&2; exit 2; }
export NCCL_TESTS_DEVICE=${NCCL_TESTS_DEVICE:-0}
LOG=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$LOG"' EXIT

REDUCING="all_reduce_perf reduce_scatter_perf reduce_perf"
OTHERS="all_gather_perf broadcast_perf alltoall_perf scatter_perf gather_perf sendrecv_perf hypercube_perf"
failed=0
runs=0
start=$SECONDS

# check NAME NP [flags...]: one validated run; a line with its verdict.
check() {
    local name=$1 np=$2
    shift 2
    local out="$LOG/$name-$np-$runs.txt" rc
    runs=$((runs + 1))
    timeout 120 "$BIN" "$name" --np "$np" "${GPU[@]}" -n 5 -w 1 -c 1 -T 60 "$@" >"$out" 2>&1
    rc=$?
    local oob
    oob=$(grep -m1 '^# Out of bounds values' "$out" || echo "(no footer)")
    if [[ $rc -eq 0 && $oob == *": 0 OK"* ]]; then
        printf 'ok    np=%d %-20s %s\n' "$np" "$name" "$*"
    else
        failed=$((failed + 1))
        printf 'FAIL  np=%d %-20s %s: exit %d, %s\n' "$np" "$name" "$*" "$rc" "$oob"
        tail -n 5 "$out" | sed 's/^/      /'
    fi
}

for np in 1 2 4; do
    for c in $REDUCING; do
        check "$c" "$np" -b 8 -e "$MAX" -f 32 -d all -o all
    done
    for c in $OTHERS; do
        check "$c" "$np" -b 8 -e "$MAX" -f 32 -d all
    done
done
check all_reduce_perf 2 -b 8 -e "$MAX" -f 32 -d all --transport tcp
# Staged: the tree drives the device like the ring; recursive doubling is staged around the call.
check all_reduce_perf 4 -b 8 -e "$MAX" -f 32 -d all -o all --algo tree --transport tcp
check all_reduce_perf 4 -b 8 -e "$MAX" -f 32 -d all -o all --algo rd --transport tcp
# Which path the local ranks took (GPU to GPU, or staged and why not).
grep -h -m1 'device buffers:' "$LOG"/all_reduce_perf-2-*.txt 2>/dev/null | head -n 1 | sed 's/^/# path: /'

echo "# $runs collective runs, $failed failed, $((SECONDS - start)) s"
echo "#"
if ((${#GPU[@]} == 0)); then
    echo "# --host: no kernel table"
elif ! "$BIN" gpu-bench -b "$KBYTES" -n 20; then
    echo "gpu-check: gpu-bench failed" >&2
    failed=$((failed + 1))
fi
((failed == 0))
