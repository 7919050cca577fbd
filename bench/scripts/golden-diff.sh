#!/usr/bin/env bash
# golden-diff.sh: the same fixed runs through two busbw binaries, their nccl-tests table, JSON
# and CSV compared with every measured value masked (times, bandwidths, auto's measured
# choice, the variance warnings, pids). A restructuring must leave them identical.
#
#   bench/scripts/golden-diff.sh BEFORE_BINARY AFTER_BINARY
#
# Exits 1 and prints the differences when the masked outputs differ. Takes about 10 s.
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 BEFORE_BINARY AFTER_BINARY" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
before=$(realpath "$1") after=$(realpath "$2")
for side in before after; do
    bin=$before
    [[ $side == after ]] && bin=$after
    mkdir "$work/$side"
    (
        cd "$work/$side"
        "$bin" all_reduce_perf --np 2 --transport tcp -b 8 -e 64K -f 8 -n 3 -w 1 -d all \
            --export-json run.json --export-csv run.csv >table.txt 2>&1 || echo "rc=$?" >>table.txt
        "$bin" alltoall_perf --np 3 -b 1K -e 16K -f 4 -n 2 >a2a.txt 2>&1 || echo "rc=$?" >>a2a.txt
        "$bin" reduce_perf --np 3 -b 1K -e 4K -f 2 -n 2 -r -1 -d float -o all >reduce.txt 2>&1 ||
            echo "rc=$?" >>reduce.txt
    )
done
status=0
for k in table:table.txt table:a2a.txt table:reduce.txt json:run.json csv:run.csv; do
    kind=${k%%:*} file=${k#*:}
    if [[ ! -f $work/before/$file || ! -f $work/after/$file ]]; then
        echo "$file: written by one binary only"
        status=1
        continue
    fi
    python3 "$here/golden-mask.py" "$kind" "$work/before/$file" >"$work/b"
    python3 "$here/golden-mask.py" "$kind" "$work/after/$file" >"$work/a"
    if diff -u "$work/b" "$work/a" >"$work/d"; then
        echo "$file: identical apart from measured values"
    else
        echo "$file: differs"
        cat "$work/d"
        status=1
    fi
done
exit $status
