# shellcheck shell=bash
# sim-lib.sh: helpers shared by the simulated-cluster benchmark scripts (cluster-bw.sh,
# cluster-vs-openmpi.sh); sourced, not run. The caller defines `node I CMD...` (run CMD on
# simulated node I).

# Bytes of a size with busbw's binary suffixes (K, M, G).
bytes() {
    local v=${1^^}
    case $v in
    *K) echo $((${v%K} * 1024)) ;;
    *M) echo $((${v%M} * 1024 * 1024)) ;;
    *G) echo $((${v%G} * 1024 * 1024 * 1024)) ;;
    *) echo "$v" ;;
    esac
}

# The link reference: one TCP stream node0 -> node1 for 5 s; prints the receiver's Mbit/s.
# WORK is a scratch directory; the rest (e.g. chrt -f 1) prefixes the client. Exits the
# script with a message when iperf3 fails.
sim_iperf3() {
    local work=$1 srv v
    shift
    echo "# iperf3 node0 -> node1 (5 s, 1 stream)" >&2
    node 1 iperf3 -s -1 -p 5201 >"$work/iperf3-server" 2>&1 &
    srv=$!
    for _ in $(seq 50); do
        [[ -n $(node 1 ss -Hltn 'sport = :5201' 2>/dev/null) ]] && break
        sleep 0.1
    done
    node 0 "$@" iperf3 -c node1 -p 5201 -t 5 -f m >"$work/iperf3" 2>&1 || {
        cat "$work/iperf3" >&2
        echo "${0##*/}: iperf3 failed" >&2
        exit 1
    }
    wait "$srv" 2>/dev/null || true
    v=$(awk '/receiver/ { for (i = 1; i < NF; i++) if ($(i + 1) == "Mbits/sec") v = $i } END { print v }' "$work/iperf3")
    [[ -n $v ]] || { cat "$work/iperf3" >&2; echo "${0##*/}: no iperf3 figure" >&2; exit 1; }
    echo "$v"
}

# The busbw binary the script runs, in BIN: $BUSBW, else target/release/busbw under ROOT,
# built first when BUILD is 1. Exits the script with a message when there is none.
sim_binary() {
    if [[ -n ${BUSBW:-} ]]; then
        BIN=$BUSBW
    else
        BIN="$ROOT/target/release/busbw"
        if ((BUILD)); then
            echo "# building: cargo build --release -p busbw" >&2
            cargo build --release -p busbw --manifest-path "$ROOT/Cargo.toml" >&2
        fi
    fi
    [[ -x $BIN ]] || { echo "${0##*/}: no busbw binary at $BIN" >&2; exit 2; }
}
