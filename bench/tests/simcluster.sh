#!/usr/bin/env bash
# simcluster.sh: a simulated cluster of K "nodes" on one Linux host, built from network
# namespaces, for testing and benchmarking busbw's cluster launch without a cluster.
#
#   simcluster.sh up <name> K [--rate RATE] [--mtu N]   build cluster <name> with nodes node0..node<K-1>
#         [--blocks L,N [--tier-rates R0,R1,R2] [--throttle I,...]]   a topology (see below)
#   simcluster.sh exec <name> <i> <cmd...>    run cmd on node i (its network, hostname node<i>)
#   simcluster.sh kill-node <name> <i>        node i fails: its link goes dark, its processes die
#   simcluster.sh link-down <name> <i>        node i's link goes down; its processes live on
#   simcluster.sh link-up <name> <i>          and comes back
#   simcluster.sh partition <name> <i> <j>    nodes i and j stop reaching each other (both
#                                             keep every other path: a bad route or ACL)
#   simcluster.sh throttle <name> <i> <RATE|off>   node i's egress (every tier) at RATE from
#                                             now on, or back to its tier rates (--tier-rates)
#   simcluster.sh throttle-link <name> <i> <j> <RATE|off>   the link between nodes i and j at
#                                             RATE both ways (a bad cable or switch port on
#                                             that path), or back (--tier-rates)
#   simcluster.sh throttle-uplink <name> <i> <RATE|off>   the uplink of node i's local block
#                                             at RATE: every node of the block to nodes
#                                             outside it and back, each way per node (a bad
#                                             switch uplink; --tier-rates)
#   simcluster.sh flap <name> <i> <RATE> <ON> <OFF>   node i throttled to RATE for ON seconds,
#                                             then OFF seconds free, again and again until
#                                             killed (a straggler; --tier-rates)
#   simcluster.sh down <name>                 remove everything of <name> (idempotent)
#   simcluster.sh addr <name> <i>             print node i's address
#   simcluster.sh list                        clusters that exist now
#
# Layout of cluster <name> (names are unique per cluster, so clusters can coexist):
#   namespace <name>-sw   the switch: bridge br0 with one port p<i> per node
#   namespace <name>-n<i> node i: lo, and eth0 (a veth whose peer is p<i>) with address
#                         10.A.B.(i+1)/24, the /24 derived from <name>
#   /etc/netns/<name>-n<i>/hosts        node<j> and node<j>.<name> -> 10.A.B.(j+1), for every j
#   /etc/netns/<name>-n<i>/resolv.conf  no name server outside the node (only loopback)
#   /etc/netns/<name>-n<i>/hostname     node<i>
#   With --rate, a full-duplex link of that rate: tbf on eth0 (the node's egress, inside
#   its namespace) and on p<i> (the switch's egress towards the node).
#   With --blocks L,N, a two-level fabric: consecutive nodes form local blocks of L nodes and
#   network blocks of N nodes (one HPC island), described in OCI's node labels in
#   /run/simcluster/<name>.labels.json (a map host -> labels; local block ids repeat under
#   each network block, as real ids may). --tier-rates shapes every node's egress per
#   destination (htb, one class per tier, u32 filters on the destination address): R0 to
#   its local block, R1 to the rest of its network block, R2 to other network blocks.
#   --throttle halves all rates of the nodes listed (a node with a bad NIC or cable).
# Nothing is created in the root network namespace. Needs root, iproute2 and util-linux.
set -euo pipefail

PROG=${0##*/}
die() { echo "$PROG: $*" >&2; exit 1; }
usage() { sed -n '2,29s/^# \{0,1\}//p' "$0" >&2; exit 2; }

check_name() {
    [[ $1 =~ ^[a-z0-9][a-z0-9-]{0,39}$ ]] ||
        die "cluster name '$1' must be 1-40 characters of [a-z0-9-], starting alnum"
}
check_index() { [[ $1 =~ ^[0-9]+$ ]] || die "node index '$1' is not a number"; }

sw_ns() { echo "$1-sw"; }
node_ns() { echo "$1-n$2"; }

# The /24 of a cluster: 10.A.B.0 from a checksum of its name (A in 200..249).
subnet() {
    local h
    h=$(printf '%s' "$1" | cksum | cut -d' ' -f1)
    echo "10.$((200 + h % 50)).$(((h / 50) % 256))"
}

# The namespaces of cluster $1 that exist now (switch last).
cluster_namespaces() {
    local name=$1 ns all
    all=$(ip netns list 2>/dev/null | cut -d' ' -f1) || true
    for ns in $all; do
        if [[ $ns =~ ^${name}-n[0-9]+$ ]]; then echo "$ns"; fi
    done
    for ns in $all; do
        if [[ $ns == "$(sw_ns "$name")" ]]; then echo "$ns"; fi
    done
}

# Kill every process whose network namespace is $1 (SIGKILL: a node failure, or cleanup).
kill_ns_procs() {
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [[ -n $pids ]] || return 0
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    local n=0
    while [[ -n $(ip netns pids "$1" 2>/dev/null || true) ]] && ((n < 50)); do
        sleep 0.1
        n=$((n + 1))
    done
}

cmd_down() {
    local name=$1 ns
    check_name "$name"
    for ns in $(cluster_namespaces "$name"); do
        kill_ns_procs "$ns"
        ip netns del "$ns" 2>/dev/null || true
    done
    # /etc/netns entries of nodes (and of namespaces already gone).
    local d
    for d in /etc/netns/"$name"-n*; do
        if [[ -d $d && ${d##*/} =~ ^${name}-n[0-9]+$ ]]; then rm -rf -- "$d"; fi
    done
    rm -f "/run/simcluster/$name.env" "/run/simcluster/$name.labels.json"
    # /etc/netns and /run/simcluster stay (empty): removing them would race with an `up` of
    # another cluster running at the same time.
    return 0
}

# tbf for RATE on device $2 in namespace $1. The bucket holds ~4 ms of traffic (at least
# 64 KiB so a full GSO packet fits), the queue ~20 ms.
shape() {
    local ns=$1 dev=$2 rate=$3
    ip -n "$ns" link set "$dev" txqueuelen 1000
    tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$BURST" latency 20ms
}

# RATE (tc syntax) in bits/s, for sizing the bucket.
rate_bits() {
    local r=${1,,} n unit
    [[ $r =~ ^([0-9]+)([kmgt]?)(bit|bps)$ ]] || die "rate '$1': use e.g. 1gbit, 500mbit"
    n=${BASH_REMATCH[1]}
    unit=${BASH_REMATCH[2]}
    case $unit in k) n=$((n * 1000)) ;; m) n=$((n * 1000000)) ;; g) n=$((n * 1000000000)) ;;
        t) n=$((n * 1000000000000)) ;; esac
    [[ ${BASH_REMATCH[3]} == bps ]] && n=$((n * 8))
    echo "$n"
}

# Burst for an htb class of RATE: ~4 ms of traffic, at least 64 KiB (one GSO packet).
htb_burst() {
    local b
    b=$(($(rate_bits "$1") / 8 / 250))
    ((b >= 65536)) || b=65536
    echo "$b"
}

# Rate $1 halved when node $2 is throttled, in kbit (tc syntax).
node_rate() {
    local kbit=$(($(rate_bits "$1") / 1000)) t
    for t in ${THROTTLE//,/ }; do
        if [[ $t == "$2" ]]; then kbit=$((kbit / 2)); fi
    done
    echo "${kbit}kbit"
}

# Per-destination egress shaping of node $2 (namespace $1) for the tiers of --blocks.
shape_tiers() {
    local ns=$1 i=$2 j class r c
    local -a rates
    IFS=, read -r -a rates <<<"$TIER_RATES"
    ip -n "$ns" link set eth0 txqueuelen 1000
    tc -n "$ns" qdisc replace dev eth0 root handle 1: htb default 30
    tc -n "$ns" class add dev eth0 parent 1: classid 1:1 htb rate 100gbit quantum 65536
    for c in 0 1 2; do
        r=$(node_rate "${rates[$c]}" "$i")
        tc -n "$ns" class add dev eth0 parent 1:1 classid "1:$((c + 1))0" htb rate "$r" \
            ceil "$r" burst "$(htb_burst "$r")" cburst "$(htb_burst "$r")" prio 1 quantum 65536
    done
    # Pure ACKs (IP packets under 128 bytes) first, in a class of their own: behind a full
    # queue of data they would throttle the opposite direction, and a bidirectional test
    # would measure the queue instead of the link (this kernel has no fq_codel or sfq).
    tc -n "$ns" class add dev eth0 parent 1:1 classid 1:5 htb rate 10mbit ceil 1gbit prio 0 quantum 65536
    tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 1 u32 \
        match ip protocol 6 0xff match u16 0x0000 0xff80 at 2 flowid 1:5
    for ((j = 0; j < K; j++)); do
        ((j != i)) || continue
        if ((j / LB == i / LB)); then class=10; elif ((j / NB == i / NB)); then class=20; else class=30; fi
        # Priority 3: priority 2 is for a throttled link's own class (throttle-link).
        tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 3 u32 \
            match ip dst "$NET.$((j + 1))/32" flowid "1:$class"
    done
}

# OCI's labels for --blocks: a map host -> labels.
labels_json() {
    local i sep=""
    printf '{\n'
    for ((i = 0; i < K; i++)); do
        printf '%s  "node%d": {"oci.oraclecloud.com/rdma.hpc_island_id": "island0", ' "$sep" "$i"
        printf '"oci.oraclecloud.com/rdma.network_block_id": "nb%d", ' $((i / NB))
        printf '"oci.oraclecloud.com/rdma.local_block_id": "lb%d", ' $(((i % NB) / LB))
        printf '"oci.oraclecloud.com/rdma.host_id": "host%d"}' "$i"
        sep=$',\n'
    done
    printf '\n}\n'
}

cmd_up() {
    local name=$1 k=$2
    shift 2
    local rate="" mtu=1500 blocks=""
    TIER_RATES="" THROTTLE=""
    while (($#)); do
        case $1 in
        --rate) rate=${2:?--rate needs a value}; shift 2 ;;
        --rate=*) rate=${1#--rate=}; shift ;;
        --mtu) mtu=${2:?--mtu needs a value}; shift 2 ;;
        --mtu=*) mtu=${1#--mtu=}; shift ;;
        --blocks) blocks=${2:?--blocks needs L,N}; shift 2 ;;
        --tier-rates) TIER_RATES=${2:?--tier-rates needs R0,R1,R2}; shift 2 ;;
        --throttle) THROTTLE=${2:?--throttle needs node indices}; shift 2 ;;
        *) die "up: unknown option '$1'" ;;
        esac
    done
    K=$k
    if [[ -n $blocks ]]; then
        [[ $blocks =~ ^([0-9]+),([0-9]+)$ ]] || die "up: --blocks must be L,N (nodes per local block, per network block)"
        LB=${BASH_REMATCH[1]} NB=${BASH_REMATCH[2]}
        ((LB >= 1 && NB >= LB && NB % LB == 0)) || die "up: --blocks $blocks: N must be a multiple of L"
        [[ -z $rate ]] || die "up: --rate and --blocks exclude each other (use --tier-rates)"
    fi
    if [[ -n $TIER_RATES ]]; then
        [[ -n $blocks ]] || die "up: --tier-rates needs --blocks"
        local -a tr
        IFS=, read -r -a tr <<<"$TIER_RATES"
        ((${#tr[@]} == 3)) || die "up: --tier-rates needs three rates R0,R1,R2"
        for r in "${tr[@]}"; do rate_bits "$r" >/dev/null; done
    fi
    [[ -z $THROTTLE || $THROTTLE =~ ^[0-9]+(,[0-9]+)*$ ]] || die "up: --throttle takes node indices, e.g. 5 or 2,5"
    [[ -z $THROTTLE || -n $TIER_RATES ]] || die "up: --throttle needs --tier-rates"

    check_name "$name"
    [[ $k =~ ^[0-9]+$ ]] && ((k >= 1 && k <= 200)) || die "up: K must be 1..200, got '$k'"
    [[ $mtu =~ ^[0-9]+$ ]] && ((mtu >= 1280 && mtu <= 65535)) || die "up: --mtu must be 1280..65535, got '$mtu'"
    [[ $EUID -eq 0 ]] || die "needs root (network namespaces)"
    command -v unshare >/dev/null || die "needs unshare (util-linux)"
    if [[ -n $rate ]]; then
        local bits
        bits=$(rate_bits "$rate")
        BURST=$((bits / 8 / 250))
        ((BURST >= 65536)) || BURST=65536
    fi
    [[ -z $(cluster_namespaces "$name") ]] || die "cluster '$name' exists; run: $PROG down $name"

    # Whatever fails from here on, leave nothing behind.
    # shellcheck disable=SC2064 # $name is checked: [a-z0-9-] only
    trap "rc=\$?; if ((rc != 0)); then echo \"$PROG: up $name failed, cleaning up\" >&2; cmd_down $name; fi" EXIT
    trap 'exit 130' INT TERM

    local net sw i ns
    net=$(subnet "$name")
    NET=$net
    sw=$(sw_ns "$name")
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 mtu "$mtu" up

    local hosts
    hosts=$(
        printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
        for ((i = 0; i < k; i++)); do
            printf '%s.%d\tnode%d.%s node%d\n' "$net" $((i + 1)) "$i" "$name" "$i"
        done
    )
    for ((i = 0; i < k; i++)); do
        ns=$(node_ns "$name" "$i")
        mkdir -p "/etc/netns/$ns"
        printf '%s\n' "$hosts" >"/etc/netns/$ns/hosts"
        printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
        echo "node$i" >"/etc/netns/$ns/hostname"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" link add eth0 mtu "$mtu" type veth peer name "p$i" mtu "$mtu" netns "$sw"
        ip -n "$ns" addr add "$net.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$sw" link set "p$i" master br0
        ip -n "$sw" link set "p$i" up
        if [[ -n $rate ]]; then
            shape "$ns" eth0 "$rate"
            shape "$sw" "p$i" "$rate"
        fi
        if [[ -n $TIER_RATES ]]; then shape_tiers "$ns" "$i"; fi
    done
    mkdir -p /run/simcluster
    printf 'K=%d\nSUBNET=%s.0/24\nRATE=%s\n' "$k" "$net" "$rate" >"/run/simcluster/$name.env"
    if [[ -n $blocks ]]; then
        labels_json >"/run/simcluster/$name.labels.json"
        printf 'BLOCKS=%s\nTIER_RATES=%s\nTHROTTLE=%s\nLABELS=%s\n' "$blocks" "$TIER_RATES" \
            "$THROTTLE" "/run/simcluster/$name.labels.json" >>"/run/simcluster/$name.env"
    fi
    trap - EXIT INT TERM
    echo "cluster $name: $k nodes node0..node$((k - 1)) on $net.0/24${rate:+, links shaped to $rate}${blocks:+, blocks $blocks}${TIER_RATES:+, tier rates $TIER_RATES}${THROTTLE:+, throttled: $THROTTLE}"
}

# The settings `up` saved for cluster $1 (K, SUBNET, BLOCKS, TIER_RATES, ...).
load_env() {
    local f=/run/simcluster/$1.env
    [[ -r $f ]] || die "no cluster '$1' (no $f)"
    # shellcheck disable=SC1090 # written by cmd_up
    source "$f"
    [[ -n ${TIER_RATES:-} ]] || die "cluster '$1' has no --tier-rates: nothing to throttle"
    NET=${SUBNET%.0/24}
}

# Sets node $2's three tier classes to rate $3, or back to the tier rates ("off").
set_node_rate() {
    local name=$1 i=$2 rate=$3 c r ns
    local -a rates
    IFS=, read -r -a rates <<<"$TIER_RATES"
    ns=$(node_ns "$name" "$i")
    for c in 0 1 2; do
        r=$rate
        [[ $r != off ]] || r=${rates[$c]}
        tc -n "$ns" class change dev eth0 parent 1:1 classid "1:$((c + 1))0" htb rate "$r" \
            ceil "$r" burst "$(htb_burst "$r")" cburst "$(htb_burst "$r")" prio 1 quantum 65536
    done
}

cmd_throttle() {
    local name=$1 i=$2 rate=$3
    check_name "$name"
    check_index "$i"
    node_exists "$name" "$i"
    load_env "$name"
    [[ $rate == off ]] || rate_bits "$rate" >/dev/null
    set_node_rate "$name" "$i" "$rate"
}

# Node $2's egress towards node $3 in a class of its own at rate $4, or back ("off").
link_side() {
    local name=$1 i=$2 j=$3 rate=$4 ns
    ns=$(node_ns "$name" "$i")
    tc -n "$ns" filter del dev eth0 parent 1: prio 2 2>/dev/null || true
    tc -n "$ns" class del dev eth0 classid "1:$((100 + j))" 2>/dev/null || true
    [[ $rate != off ]] || return 0
    tc -n "$ns" class add dev eth0 parent 1:1 classid "1:$((100 + j))" htb rate "$rate" \
        ceil "$rate" burst "$(htb_burst "$rate")" cburst "$(htb_burst "$rate")" prio 1 quantum 65536
    tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 2 u32 \
        match ip dst "$NET.$((j + 1))/32" flowid "1:$((100 + j))"
}

cmd_throttle_link() {
    local name=$1 i=$2 j=$3 rate=$4
    check_name "$name"
    check_index "$i"
    check_index "$j"
    ((i != j)) || die "throttle-link: a link joins two different nodes"
    node_exists "$name" "$i"
    node_exists "$name" "$j"
    load_env "$name"
    [[ $rate == off ]] || rate_bits "$rate" >/dev/null
    link_side "$name" "$i" "$j" "$rate"
    link_side "$name" "$j" "$i" "$rate"
}

# The uplink of node $2's local block at rate $3, or back ("off"): each member's egress to
# the rest of its network block and beyond (its tier classes 2 and 3), and the switch's
# egress towards each member from nodes outside the block (an htb on its port p<x>, pure
# ACKs first as on the nodes).
cmd_throttle_uplink() {
    local name=$1 i=$2 rate=$3 x j c r ns sw
    check_name "$name"
    check_index "$i"
    node_exists "$name" "$i"
    load_env "$name"
    [[ $rate == off ]] || rate_bits "$rate" >/dev/null
    [[ -z ${RATE:-} ]] || die "throttle-uplink: cluster '$name' shapes its switch ports (--rate)"
    local LB=${BLOCKS%%,*}
    local -a rates
    IFS=, read -r -a rates <<<"$TIER_RATES"
    sw=$(sw_ns "$name")
    for ((x = i / LB * LB; x < (i / LB + 1) * LB && x < K; x++)); do
        ns=$(node_ns "$name" "$x")
        for c in 1 2; do
            r=$rate
            [[ $r != off ]] || r=${rates[$c]}
            tc -n "$ns" class change dev eth0 parent 1:1 classid "1:$((c + 1))0" htb rate "$r" \
                ceil "$r" burst "$(htb_burst "$r")" cburst "$(htb_burst "$r")" prio 1 quantum 65536
        done
        tc -n "$sw" qdisc del dev "p$x" root 2>/dev/null || true
        [[ $rate != off ]] || continue
        tc -n "$sw" qdisc add dev "p$x" root handle 1: htb default 10
        tc -n "$sw" class add dev "p$x" parent 1: classid 1:1 htb rate 100gbit quantum 65536
        tc -n "$sw" class add dev "p$x" parent 1:1 classid 1:10 htb rate 100gbit prio 1 quantum 65536
        tc -n "$sw" class add dev "p$x" parent 1:1 classid 1:5 htb rate 10mbit ceil 1gbit prio 0 quantum 65536
        tc -n "$sw" class add dev "p$x" parent 1:1 classid 1:20 htb rate "$rate" \
            ceil "$rate" burst "$(htb_burst "$rate")" cburst "$(htb_burst "$rate")" prio 1 quantum 65536
        tc -n "$sw" filter add dev "p$x" parent 1: protocol ip prio 1 u32 \
            match ip protocol 6 0xff match u16 0x0000 0xff80 at 2 flowid 1:5
        for ((j = 0; j < K; j++)); do
            ((j / LB != i / LB)) || continue
            tc -n "$sw" filter add dev "p$x" parent 1: protocol ip prio 3 u32 \
                match ip src "$NET.$((j + 1))/32" flowid 1:20
        done
    done
}

cmd_flap() {
    local name=$1 i=$2 rate=$3 on=$4 off=$5
    check_name "$name"
    check_index "$i"
    node_exists "$name" "$i"
    load_env "$name"
    rate_bits "$rate" >/dev/null
    [[ $on =~ ^[0-9]+(\.[0-9]+)?$ && $off =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "flap: ON and OFF are seconds"
    trap 'set_node_rate "$name" "$i" off; exit 0' INT TERM
    while :; do
        set_node_rate "$name" "$i" "$rate"
        sleep "$on"
        set_node_rate "$name" "$i" off
        sleep "$off"
    done
}

node_exists() {
    [[ -e /run/netns/$(node_ns "$1" "$2") ]] || die "no node $2 in cluster '$1'"
}

cmd_exec() {
    local name=$1 i=$2
    shift 2
    check_name "$name"
    check_index "$i"
    (($#)) || die "exec: no command"
    node_exists "$name" "$i"
    # ip netns exec: the node's network and its /etc/netns files (hosts, resolv.conf);
    # unshare --uts: its own hostname. Both exec, so the command keeps this process's pid.
    exec ip netns exec "$(node_ns "$name" "$i")" \
        unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$i" "$@"
}

cmd_kill_node() {
    local name=$1 i=$2 ns
    check_name "$name"
    check_index "$i"
    ns=$(node_ns "$name" "$i")
    # The link goes dark first, so the dying processes can send no FIN or RST: the others
    # see a silent peer, as when a machine loses power.
    ip -n "$(sw_ns "$name")" link del "p$i" 2>/dev/null || true
    ip -n "$ns" link del eth0 2>/dev/null || true
    kill_ns_procs "$ns"
    ip netns del "$ns" 2>/dev/null || true
    rm -rf -- "/etc/netns/$ns"
}

# A cable pulled or a switch port shut: both ends lose carrier, nothing is delivered either
# way, and the node's processes keep running (they see their peers go silent too).
cmd_link() {
    local name=$1 i=$2 state=$3
    check_name "$name"
    check_index "$i"
    node_exists "$name" "$i"
    ip -n "$(sw_ns "$name")" link set "p$i" "$state"
}

# Each side's neighbour entry for the other points at a MAC nobody has: their frames go
# nowhere, silently, as behind a broken route (no drop action in tc here, and no firewall).
cmd_partition() {
    local name=$1 i=$2 j=$3
    check_name "$name"
    check_index "$i"
    check_index "$j"
    node_exists "$name" "$i"
    node_exists "$name" "$j"
    ip -n "$(node_ns "$name" "$i")" neigh replace "$(cmd_addr "$name" "$j")" \
        lladdr 02:00:00:00:ff:fe dev eth0 nud permanent
    ip -n "$(node_ns "$name" "$j")" neigh replace "$(cmd_addr "$name" "$i")" \
        lladdr 02:00:00:00:ff:fe dev eth0 nud permanent
}

cmd_addr() {
    check_name "$1"
    check_index "$2"
    echo "$(subnet "$1").$(($2 + 1))"
}

cmd_list() {
    local ns
    for ns in $(ip netns list 2>/dev/null | cut -d' ' -f1); do
        if [[ $ns == *-sw ]]; then echo "${ns%-sw}"; fi
    done
}

(($#)) || usage
cmd=$1
shift
case $cmd in
up) (($# >= 2)) || usage; cmd_up "$@" ;;
down) (($# == 1)) || usage; cmd_down "$1" ;;
exec) (($# >= 3)) || usage; cmd_exec "$@" ;;
kill-node) (($# == 2)) || usage; cmd_kill_node "$1" "$2" ;;
link-down) (($# == 2)) || usage; cmd_link "$1" "$2" down ;;
link-up) (($# == 2)) || usage; cmd_link "$1" "$2" up ;;
partition) (($# == 3)) || usage; cmd_partition "$1" "$2" "$3" ;;
throttle) (($# == 3)) || usage; cmd_throttle "$@" ;;
throttle-link) (($# == 4)) || usage; cmd_throttle_link "$@" ;;
throttle-uplink) (($# == 3)) || usage; cmd_throttle_uplink "$@" ;;
flap) (($# == 5)) || usage; cmd_flap "$@" ;;
addr) (($# == 2)) || usage; cmd_addr "$1" "$2" ;;
list) cmd_list ;;
-h | --help | help) usage ;;
*) usage ;;
esac
