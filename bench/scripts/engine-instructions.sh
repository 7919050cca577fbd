#!/bin/bash
# Instructions per 8-byte call of the engine bench (collectives/benches/engine.rs), counted by
# callgrind: a loaded machine changes times, not instruction counts, so this compares two
# builds where a latency A/B would need a quiet machine. Two run lengths are subtracted so
# that start-up and the warm-up calls cancel out.
#
# usage: bench/scripts/engine-instructions.sh [CASE...]   (ring rd tree broadcast sendrecv)
# env:   CARGO_TARGET_DIR as usual; needs valgrind.
set -euo pipefail
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 2; }
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(ring rd tree broadcast sendrecv)
bin=$(cargo bench -p busbw-collectives --bench engine --no-run --message-format=json 2>/dev/null |
  python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="engine" and m.get("executable"): print(m["executable"])')
ir() { BUSBW_ENGINE_CALLS=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$2" 2>&1 |
  awk '/Collected/ {print $4}'; }
echo "# instructions per call (callgrind), $bin"
for c in "${cases[@]}"; do
  short=$(ir 2000 "$c"); long=$(ir 12000 "$c")
  # 5 rounds of the extra 10000 calls each.
  echo "$c $(( (long - short) / 50000 ))"
done
