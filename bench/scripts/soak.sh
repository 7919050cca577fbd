#!/usr/bin/env bash
# soak.sh: run small sweeps in a loop with random faults and check that every run ended with
# either a full validated result or a clean failure that names a rank, and that nothing was
# left behind.
#
#   bench/scripts/soak.sh [MINUTES] [BUSBW]     default 5 minutes, target/debug/busbw
#
# Local runs (--np 2..4) get one of: no fault, kill -9 of a rank, SIGSTOP of a rank, SIGTERM
# of a rank, SIGTERM of the launcher. As root with network namespaces, every third run is on
# a simulated 3-node cluster (bench/tests/simcluster.sh) with one of: no fault, node 2's link
# down, node 2 killed (the node vanishes; the cluster is rebuilt). Every run must end within
# 3 x -T + 20 s. After each run no process of it may remain, and at the end no namespace.
# Prints one line per run and a summary; exits 1 on any bad run.
set -uo pipefail
cd "$(dirname "$0")/../.."
minutes=${1:-5}
busbw=${2:-target/debug/busbw}
[[ -x $busbw ]] || { echo "soak.sh: $busbw not built (cargo build -p busbw)" >&2; exit 2; }
busbw=$(realpath "$busbw")
sim=bench/tests/simcluster.sh
T=5
limit=$((3 * T + 20))
tag=soak$$
work=$(mktemp -d "/tmp/busbw-$tag.XXXX")
cluster=""
trap '[[ -n $cluster ]] && bash $sim down $cluster >/dev/null 2>&1; rm -rf "$work"' EXIT

runs=0 full=0 named=0 bad=0
declare -A faults

cluster_ok() {
    [[ $(id -u) == 0 ]] && ip netns list >/dev/null 2>&1 && unshare --net --uts true 2>/dev/null
}

# pids of processes whose command line mentions this soak's work directory
leftovers() { pgrep -f -- "$work" || true; }

# A line that names the failed rank (not just the rank reporting): the launcher's account,
# a survivor's "stopping because rank R on HOST ...", a root cause, a hang diagnosis.
named_re='error: .*rank [0-9]+ (on |\(pid )|stopped responding: rank [0-9]+ on |root cause reported by the job: .*rank [0-9]+|^busbw: rank [0-9]+ \(pid [0-9]+ on |busbw: SIG[A-Z]+ received'

# verdict RC OUT ERR: full validated table, or a failure naming a rank, or bad
judge() {
    local rc=$1 out=$2 err=$3
    # Only rank 0's process prints the table; the others' success is their exit code.
    if ((rc == 0)) && { [[ $out == *.[1-9].out ]] || grep -q '^# Out of bounds values : 0 OK' "$out"; }; then
        echo full
    elif ((rc != 0)) && grep -Eq "$named_re" "$err"; then
        echo named
    else
        echo bad
    fi
}

# wait_or_kill PID: wait for PID at most $limit s; 124 if it had to be killed
wait_or_kill() {
    local pid=$1 n=0
    while kill -0 "$pid" 2>/dev/null; do
        if ((n >= limit * 10)); then
            pkill -9 -f -- "$work" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 0.1
        n=$((n + 1))
    done
    wait "$pid"
}

rank_pid() { # rank_pid OUT R: the pid of rank R from the device table, once printed
    local n=0 p=""
    while ((n < 100)); do
        p=$(awk -v r="$2" '$1=="#" && $2=="Rank" && $3==r {print $7; exit}' "$1" 2>/dev/null)
        [[ -n $p ]] && { echo "$p"; return; }
        sleep 0.1
        n=$((n + 1))
    done
}

local_run() {
    local i=$1 np=$((2 + RANDOM % 3)) fault
    local f=(none kill9 sigstop sigterm-rank sigterm-launcher)
    fault=${f[RANDOM % ${#f[@]}]}
    local out=$work/$i.out err=$work/$i.err
    "$busbw" all_reduce_perf --np "$np" -b 8K -e 2M -f 2 -n 100 -c 1 -T $T \
        --export-json "$work/$i.json" >"$out" 2>"$err" &
    local launcher=$!
    if [[ $fault != none ]]; then
        local victim=$((RANDOM % np)) pid
        pid=$(rank_pid "$out" "$victim")
        sleep "0.$((RANDOM % 3))"
        case $fault in
        kill9) kill -9 "$pid" 2>/dev/null ;;
        sigstop) kill -STOP "$pid" 2>/dev/null ;;
        sigterm-rank) kill -TERM "$pid" 2>/dev/null ;;
        sigterm-launcher) kill -TERM "$launcher" 2>/dev/null ;;
        esac
    fi
    local start=$SECONDS rc
    wait_or_kill "$launcher"
    rc=$?
    # A stopped rank that was killed by the launcher's grace kill is gone; one that was not
    # would be a leftover, which is what the check below is for.
    record "local np=$np $fault" "$rc" "$out" "$err" $((SECONDS - start))
}

cluster_up() {
    cluster=$tag-$((RANDOM % 1000))
    bash $sim up "$cluster" 3 >/dev/null 2>&1 || { cluster=""; return 1; }
}

cluster_run() {
    local i=$1 fault k=3 port=$((21000 + RANDOM % 2000))
    local f=(none link-down kill-node)
    fault=${f[RANDOM % ${#f[@]}]}
    [[ -n $cluster ]] || cluster_up || return 0
    local pids=() n
    for ((n = 0; n < k; n++)); do
        env -i PATH="$PATH" MASTER_ADDR=node0 MASTER_PORT=$port WORLD_SIZE=$k RANK=$n \
            bash $sim exec "$cluster" $n "$busbw" all_reduce_perf --launcher env \
            -b 8K -e 2M -f 2 -n 100 -c 1 -T $T --export-json "$work/$i.$n.json" \
            >"$work/$i.$n.out" 2>"$work/$i.$n.err" &
        pids+=($!)
    done
    local start=$SECONDS
    if [[ $fault != none ]]; then
        rank_pid "$work/$i.0.out" 0 >/dev/null
        sleep "0.$((RANDOM % 3))"
        bash $sim "$fault" "$cluster" 2 >/dev/null 2>&1
    fi
    # The survivors (nodes 0 and 1) must each end cleanly; node 2 (cut off, it lives on) ends
    # by its own -T, and only then may nothing be left.
    local rcs=() secs=()
    for n in 0 1; do
        wait_or_kill "${pids[n]}"
        rcs+=($?)
        secs+=($((SECONDS - start)))
    done
    wait_or_kill "${pids[2]}" >/dev/null 2>&1
    for n in 0 1; do
        record "cluster $fault node$n" "${rcs[n]}" "$work/$i.$n.out" "$work/$i.$n.err" "${secs[n]}"
    done
    if [[ $fault != none ]]; then
        bash $sim down "$cluster" >/dev/null 2>&1
        cluster=""
    fi
}

record() { # record WHAT RC OUT ERR SECS
    local what=$1 rc=$2 out=$3 err=$4 secs=$5 v left
    runs=$((runs + 1))
    if ((rc == 124)); then v=bad; else v=$(judge "$rc" "$out" "$err"); fi
    sleep 0.2
    left=$(leftovers)
    if [[ -n $left ]]; then
        v=bad
        echo "soak.sh: leftover processes after '$what': $left" >&2
        kill -9 $left 2>/dev/null
    fi
    case $v in
    full) full=$((full + 1)) ;;
    named) named=$((named + 1)) ;;
    *) bad=$((bad + 1)); echo "---- $what: exit $rc" >&2; tail -5 "$err" >&2 ;;
    esac
    faults["$what"]=$((${faults["$what"]:-0} + 1))
    printf 'soak.sh: run %3d %-28s exit %3d after %2d s: %s\n' "$runs" "$what" "$rc" "$secs" "$v"
}

use_cluster=0
cluster_ok && use_cluster=1
((use_cluster)) || echo "soak.sh: no root or no network namespaces: local runs only" >&2
end=$((SECONDS + minutes * 60))
i=0
while ((SECONDS < end)); do
    i=$((i + 1))
    if ((use_cluster && i % 3 == 0)); then cluster_run "$i"; else local_run "$i"; fi
done
if [[ -n $cluster ]]; then
    bash $sim down "$cluster" >/dev/null 2>&1
    cluster=""
fi
ns_left=$(ip netns list 2>/dev/null | grep -c -- "^$tag" || true)
((ns_left == 0)) || { echo "soak.sh: $ns_left namespace(s) left behind" >&2; bad=$((bad + 1)); }
echo "soak.sh: $runs runs in $minutes min: $full full validated, $named clean named failures, $bad bad; namespaces left: $ns_left"
((bad == 0))
