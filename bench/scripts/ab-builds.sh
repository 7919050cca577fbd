#!/usr/bin/env bash
# ab-builds.sh: two builds of busbw on the same machine in the same run, alternating, to tell a
# regression from noise (BENCHMARKS.md, "Host path after the offload hooks").
#
#   git worktree add /tmp/base <commit> && (cd /tmp/base && cargo build --release -p busbw)
#   cargo build --release -p busbw
#   bench/scripts/ab-builds.sh /tmp/base/target/release/busbw target/release/busbw [PAIRS] [NP]
#
# Each pair runs both builds once per transport (shm, tcp): all_reduce_perf at 8 B, 1 KiB,
# 128 KiB and 16 MiB, 20 timed iterations, no validation. Prints per transport and size the
# median out-of-place time of each build and their ratio (after / before).
# AB_COLL picks another collective's binary name (alltoall_perf, ...), AB_EXTRA adds flags
# (AB_EXTRA="--algo tree"), AB_SIZES runs the sizes it lists instead, each alone
# (AB_SIZES="8 256K 16M").
set -euo pipefail

(($# >= 2)) || { echo "usage: $0 BEFORE_BINARY AFTER_BINARY [PAIRS] [NP]" >&2; exit 2; }
BEFORE=$1 AFTER=$2 PAIRS=${3:-7} NP=${4:-2}
COLL=${AB_COLL:-all_reduce_perf}
read -r -a EXTRA <<<"${AB_EXTRA:-}"
for b in "$BEFORE" "$AFTER"; do
    [[ -x $b ]] || { echo "ab-builds: $b is not an executable file" >&2; exit 2; }
done
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

for ((pair = 1; pair <= PAIRS; pair++)); do
    for which in before after; do
        bin=$BEFORE
        [[ $which == after ]] && bin=$AFTER
        for tr in shm tcp; do
            if [[ -n ${AB_SIZES:-} ]]; then
                for size in $AB_SIZES; do
                    "$bin" "$COLL" --np "$NP" --transport "$tr" -b "$size" -e "$size" -n 20 -w 5 -c 0 "${EXTRA[@]}" 2>/dev/null |
                        awk -v w="$which" -v t="$tr" '/^ +[0-9]+ +[0-9]+ +float/ {print w, t, $1, $6}' >>"$OUT"
                done
                continue
            fi
            "$bin" "$COLL" --np "$NP" --transport "$tr" -b 8 -e 32M -f 128 -n 20 -w 5 -c 0 "${EXTRA[@]}" 2>/dev/null |
                awk -v w="$which" -v t="$tr" '/^ +[0-9]+ +[0-9]+ +float/ {print w, t, $1, $6}' >>"$OUT"
        done
    done
done

python3 - "$OUT" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    which, tr, size, time = line.split()
    d[(tr, int(size), which)].append(float(time))
print(f"{'transport':<9} {'bytes':>9} {'before(us)':>11} {'after(us)':>11} {'after/before':>12}")
for tr in ("shm", "tcp"):
    for size in sorted({k[1] for k in d if k[0] == tr}):
        b = statistics.median(d[(tr, size, "before")])
        a = statistics.median(d[(tr, size, "after")])
        print(f"{tr:<9} {size:>9} {b:>11.2f} {a:>11.2f} {a / b:>12.3f}")
EOF
