#!/usr/bin/env bash
# gate-trials.sh: randomized trials of the gate (`busbw tiers`) on a simulated cluster, one
# fault at a time, and whether the verdict names exactly that fault (issue 39).
#
# Builds one cluster of NODES network-namespace nodes (bench/tests/simcluster.sh) with OCI
# topology labels (local blocks of 2, network blocks of 4) and every link shaped to RATE, then
# runs TRIALS trials of each case, each with a fresh random target (seeded):
#   node       one node's egress throttled to SLOW for the whole run
#   link       the link between two nodes throttled to SLOW, both ways
#   straggler  one node throttled to SLOW for ON seconds, free for OFF seconds, again and
#              again (a flapping NIC or a noisy neighbour: its links' medians can be healthy)
#   healthy    nothing
#   hung       one node's busbw (not node0's: it serves the job's store) stopped (SIGSTOP)
#              a second after the job is up; that case runs at -T HUNG_T (10 s) instead of
#              60, since the gate gives up on a node within a few -T
#   uplink     one local block's uplink at SLOW (simcluster.sh throttle-uplink: its nodes to
#              every node outside it and back); only with --cases, not by default
# Each trial runs the gate on every node at `-b 16M -e 16M -n 3 --budget BUDGET` and reads
# rank 0's JSON report. A trial is exact when the verdict names the fault and nothing else
# (slow node, slow link, straggler, unreachable node or slow uplink; nothing for healthy).
# Prints a line per trial and per case: exact trials, median and slowest time to the verdict
# (all ranks exited). Needs root.
#
#   bench/scripts/gate-trials.sh [--trials 10] [--cases "node link straggler healthy hung"]
#       [--nodes 8] [--rate 1gbit] [--slow 300mbit] [--flap 0.5,0.5] [--budget 30s]
#       [--seed 39] [--no-build] [-- extra busbw tiers flags]
#
# BUSBW=/path/to/busbw skips the build and runs that binary.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIM="$ROOT/bench/tests/simcluster.sh"
TRIALS=10
CASES="node link straggler healthy hung"
HUNG_T=10
NODES=8
RATE=1gbit
SLOW=300mbit
FLAP=0.5,0.5
BUDGET=30s
SEED=39
BUILD=1
EXTRA=()
while (($#)); do
    case $1 in
    --trials) TRIALS=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --slow) SLOW=$2; shift 2 ;;
    --flap) FLAP=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h | --help) sed -n '2,28s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "gate-trials.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
[[ $EUID -eq 0 ]] || { echo "gate-trials.sh: needs root (network namespaces)" >&2; exit 2; }
((NODES >= 4 && NODES % 4 == 0)) || { echo "gate-trials.sh: --nodes must be a multiple of 4 (blocks of 2 in network blocks of 4)" >&2; exit 2; }
[[ $FLAP =~ ^([0-9.]+),([0-9.]+)$ ]] || { echo "gate-trials.sh: --flap is ON,OFF in seconds" >&2; exit 2; }
ON=${BASH_REMATCH[1]} OFF=${BASH_REMATCH[2]}
for c in $CASES; do
    case $c in node | link | straggler | healthy | hung | uplink) ;; *)
        echo "gate-trials.sh: unknown case '$c' (node, link, straggler, healthy, hung, uplink)" >&2; exit 2 ;;
    esac
done

# shellcheck source=bench/scripts/sim-lib.sh
. "$ROOT/bench/scripts/sim-lib.sh"
sim_binary

NAME="gt$$"
WORK=$(mktemp -d /tmp/gate-trials.XXXXXX)
FLAPPER=""
cleanup() {
    [[ -z $FLAPPER ]] || kill "$FLAPPER" 2>/dev/null || true
    bash "$SIM" down "$NAME" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash "$SIM" up "$NAME" "$NODES" --mtu 9000 --blocks 2,4 --tier-rates "$RATE,$RATE,$RATE" >&2
LABELS=/run/simcluster/$NAME.labels.json
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; $NODES nodes, links $RATE, faults at $SLOW, straggler $ON s on / $OFF s off; busbw tiers -b 16M -e 16M -n 3 --budget $BUDGET ${EXTRA[*]}"

RANDOM=$SEED
PORT=$((20000 + $$ % 20000))

# One gate run at -T $1; prints the seconds until every rank exited (but node $2's, when
# given: it is stopped a second after the job is up, and killed once the others are done).
# Reports in $WORK/r.<i>.json.
gate() {
    local timeout=$1 victim=${2:-} i pids=() t0 t1
    PORT=$((PORT + 1))
    rm -f "$WORK"/r.*.json
    t0=$(date +%s.%N)
    for ((i = 0; i < NODES; i++)); do
        env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            RANK="$i" WORLD_SIZE="$NODES" MASTER_ADDR=node0 MASTER_PORT="$PORT" \
            bash "$SIM" exec "$NAME" "$i" "$BIN" tiers -b 16M -e 16M -n 3 -T "$timeout" \
            --topology-preset oci --topology-file "$LABELS" --transport tcp \
            --budget "$BUDGET" --export-json "$WORK/r.$i.json" "${EXTRA[@]}" \
            >"$WORK/out.$i" 2>&1 &
        pids+=($!)
    done
    if [[ -n $victim ]]; then
        # Rank 0 writes its report's header once the job is up.
        for ((i = 0; i < 600; i++)); do
            [[ -e $WORK/r.0.json ]] && break
            sleep 0.1
        done
        sleep 1
        pkill -STOP -f "$WORK/r.$victim.json" || true
    fi
    for ((i = 0; i < NODES; i++)); do
        [[ $i == "$victim" ]] || wait "${pids[$i]}" || true
    done
    t1=$(date +%s.%N)
    if [[ -n $victim ]]; then
        pkill -KILL -f "$WORK/r.$victim.json" || true
        wait "${pids[$victim]}" 2>/dev/null || true
    fi
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", b - a }'
}

# What rank 0's verdict names, one word each: node:N, link:A-B, straggler:N, unreachable:N,
# uplink:N1,N2,... (the nodes behind it).
named() {
    python3 - "$WORK/r.0.json" <<'EOF'
import json, sys
try:
    v = json.load(open(sys.argv[1]))["tier_report"]["verdict"]
except Exception as e:
    print(f"no-report({type(e).__name__})")
    sys.exit(0)
out = [f"node:{s['node']}" for s in v["suspect_nodes"]]
out += ["link:" + "-".join(sorted([l["a"], l["b"]])) for l in v["slow_links"]]
out += [f"straggler:{s['node']}" for s in v.get("stragglers", [])]
out += [f"unreachable:{u['node']}" for u in v.get("unreachable_nodes", [])]
out += ["uplink:" + ",".join(u["nodes"]) for u in v.get("slow_uplinks", [])]
print(" ".join(sorted(out)) or "-")
EOF
}

SUMMARY=()
for c in $CASES; do
    times=()
    exact=0
    for ((t = 1; t <= TRIALS; t++)); do
        a=$((RANDOM % NODES))
        b=$(((a + 1 + RANDOM % (NODES - 1)) % NODES))
        case $c in
        node) want="node:node$a"; bash "$SIM" throttle "$NAME" "$a" "$SLOW" ;;
        link)
            want="link:$(printf '%s\n' "node$a" "node$b" | sort | paste -sd-)"
            bash "$SIM" throttle-link "$NAME" "$a" "$b" "$SLOW"
            ;;
        straggler)
            want="straggler:node$a"
            bash "$SIM" flap "$NAME" "$a" "$SLOW" "$ON" "$OFF" &
            FLAPPER=$!
            ;;
        healthy) want="-" ;;
        hung) a=$((1 + RANDOM % (NODES - 1))); want="unreachable:node$a" ;;
        uplink)
            # The block of node a: local blocks of 2 (simcluster.sh up --blocks 2,4).
            want="uplink:node$((a / 2 * 2)),node$((a / 2 * 2 + 1))"
            bash "$SIM" throttle-uplink "$NAME" "$a" "$SLOW"
            ;;
        esac
        if [[ $c == hung ]]; then secs=$(gate "$HUNG_T" "$a"); else secs=$(gate 60); fi
        case $c in
        node) bash "$SIM" throttle "$NAME" "$a" off ;;
        link) bash "$SIM" throttle-link "$NAME" "$a" "$b" off ;;
        uplink) bash "$SIM" throttle-uplink "$NAME" "$a" off ;;
        straggler) kill "$FLAPPER"; wait "$FLAPPER" 2>/dev/null || true; FLAPPER="" ;;
        esac
        got=$(named)
        ok=no
        if [[ $got == "$want" ]]; then ok=yes; exact=$((exact + 1)); fi
        times+=("$secs")
        printf '%-9s trial %2d  fault %-22s verdict %-40s exact %-3s %6.1f s\n' "$c" "$t" "$want" "$got" "$ok" "$secs"
    done
    med=$(printf '%s\n' "${times[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    max=$(printf '%s\n' "${times[@]}" | sort -g | tail -1)
    SUMMARY+=("$(printf '%-9s exact %2d of %2d   median %5.1f s   slowest %5.1f s' "$c" "$exact" "$TRIALS" "$med" "$max")")
done
echo "#"
printf '# %s\n' "${SUMMARY[@]}"
