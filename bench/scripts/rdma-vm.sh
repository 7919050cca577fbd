#!/usr/bin/env bash
# rdma-vm.sh: a SoftRoCE test bed. Boots one or several qemu guests, each a separate RDMA "node"
# (its own kernel, rdma_rxe device, hostname and address), runs a command in each, collects
# its output and exit code, and always cleans up.
#
#   rdma-vm.sh check                         say what is missing (exit 0 when ready, 1 when not)
#   rdma-vm.sh run [options] -- CMD          boot the guests, run `sh -c CMD` in each, wait
#       --guests K       number of guests (default 1), hostnames vm0..vm<K-1>
#       --out DIR        where each guest's files go (default: a new directory under /tmp)
#       --mem MB         memory per guest (default 1024)
#       --smp N          vCPUs per guest (default 1)
#       --rate RATE      tbf on every guest's eth0 (tc syntax, e.g. 200mbit)
#       --throttle I,..  halve the rate of these guests (a bad NIC or cable)
#       --throttle-link I,J  halve the rate between guests I and J, both ways (a bad cable
#                        or switch port on that path; needs --rate)
#       --labels         write OCI rdma.* node labels of a topology to DIR/labels.json
#       --blocks L,N     local blocks of L guests, network blocks of N guests (for --labels)
#       --timeout SECS   the whole run (default 600); guests still up then are killed
#       --accel A        tcg or kvm (default: $BUSBW_VM_ACCEL, else tcg)
#
# In every guest CMD runs as root in the host's root file system (shared read-only over
# virtio-9p), so it runs the binaries built on the host, at their host paths (the host's /tmp
# too, read-only and cached: a host file changed after a guest read it may look stale there).
# Writable there: $TMPDIR (/run/tmp), /run, /var/tmp, /dev/shm (tmpfs of the guest) and
# $VM_OUT, which is DIR/vm<i> on the host.
# Environment of CMD: VM_INDEX (i), VM_COUNT (K), VM_ADDR (10.77.0.<i+1>), VM_OUT, VM_DIR (DIR,
# shared by all guests), VM_RDMA_DEV (rxe0). /etc/hosts maps vm<j> to 10.77.0.<j+1>.
# Results: DIR/vm<i>/{stdout,stderr,rc,console.log} and DIR/l2.txt (frames the virtual network
# dropped: taps' tx_dropped, or the multicast sockets' RcvbufErrors); the script prints one
# line per guest and exits 0 when every CMD exited 0, 1 when one did not, 2 on a usage error,
# 3 when the test bed itself failed (a guest did not boot, timed out, rxe did not come up, or its
# emulated NIC stopped transmitting).
#
# The guests' L2 network is a bridge with one tap per guest inside a network namespace created
# for the run (qemu's multicast socket netdev on that namespace's loopback where /dev/net/tun
# is missing), so no frame reaches this machine's own interfaces. The bridge delivers a frame
# to its guest only, through a queue of 10000 frames; the multicast hub delivered every frame
# to every guest through a 208 KiB socket buffer, which overflowed when a guest was
# descheduled (0.5 % of frames with six guests on two cores), and RDMA saw the losses. Needs root,
# qemu-system-x86, a kernel image with rdma_rxe (Debian's linux-image-amd64), busybox-static,
# rdma-core, iproute2. The script installs nothing; `check` names what is missing.
set -euo pipefail

PROG=${0##*/}
die() { echo "$PROG: $*" >&2; exit 2; }
fail() { echo "$PROG: $*" >&2; exit 3; }
usage() { sed -n '2,30s/^# \{0,1\}//p' "$0" >&2; exit 2; }

NET=10.77.0

# The newest installed kernel whose modules include rdma_rxe and 9p: prints "VERSION".
find_kernel() {
    local v best=""
    for img in /boot/vmlinuz-*; do
        [[ -e $img ]] || continue
        v=${img#/boot/vmlinuz-}
        [[ -f /lib/modules/$v/modules.dep ]] || continue
        grep -q '/rdma_rxe\.ko' "/lib/modules/$v/modules.dep" || continue
        grep -q '/9pnet_virtio\.ko' "/lib/modules/$v/modules.dep" || continue
        best=$v
    done
    [[ -n $best ]] && echo "$best"
}

# What is missing, one item a line (nothing when ready).
missing() {
    [[ $(id -u) == 0 ]] || echo "root (network namespaces, guests' 9p shares): run as root"
    command -v qemu-system-x86_64 >/dev/null || echo "qemu-system-x86_64 (apt-get install qemu-system-x86)"
    # grep reads the whole list: with -q it would stop at the match, busybox (one write per
    # name) could die of SIGPIPE, and pipefail would call a present busybox missing.
    [[ -x /bin/busybox ]] && /bin/busybox --list 2>/dev/null | grep -x insmod >/dev/null ||
        echo "a static busybox for the initramfs (apt-get install busybox-static)"
    find_kernel >/dev/null || echo "a kernel image with rdma_rxe and 9p modules in /boot (apt-get install linux-image-amd64)"
    command -v rdma >/dev/null || echo "the rdma tool (apt-get install iproute2)"
    command -v ip >/dev/null || echo "ip (apt-get install iproute2)"
    command -v tc >/dev/null || echo "tc (apt-get install iproute2)"
    command -v cpio >/dev/null || echo "cpio (apt-get install cpio)"
    ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 ||
        ls /usr/lib*/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 ||
        echo "the rxe user-space provider (apt-get install rdma-core ibverbs-providers)"
    return 0
}

cmd_check() {
    local m
    m=$(missing)
    if [[ -n $m ]]; then
        echo "$PROG: the SoftRoCE test bed cannot run here; missing:" >&2
        sed 's/^/  - /' <<<"$m" >&2
        return 1
    fi
    echo "$PROG: ready (kernel $(find_kernel), accel ${BUSBW_VM_ACCEL:-tcg})"
}

# Module files (paths under /lib/modules/$1) needed to load module $2, dependencies first.
module_chain() {
    local ver=$1 name=$2 dep line
    line=$(grep -E "(^|/)${name}\.ko(\.[a-z]+)?:" "/lib/modules/$ver/modules.dep" | head -1) || true
    [[ -n $line ]] || return 0 # built in
    for dep in $(awk -F': ' '{print $2}' <<<"$line" | tr ' ' '\n' | tac); do
        echo "$dep"
    done
    echo "${line%%:*}"
}

# An initramfs that mounts the host's root read-only and chroots into it. $1 kernel, $2 file.
build_initramfs() {
    local ver=$1 out=$2 root m f base
    root=$(mktemp -d "$WORK/initramfs.XXXX")
    mkdir -p "$root"/{bin,dev,proc,sys,host,mods}
    cp /bin/busybox "$root/bin/busybox"
    for a in sh mount umount insmod mkdir cat sleep poweroff chroot echo; do
        ln -s busybox "$root/bin/$a"
    done
    : >"$root/mods/order"
    for m in virtio_pci 9pnet_virtio 9p; do
        for f in $(module_chain "$ver" "$m"); do
            base=${f##*/}
            base=${base%%.ko*}
            grep -qx "$base" "$root/mods/order" && continue
            case $f in
            *.ko) cp "/lib/modules/$ver/$f" "$root/mods/$base.ko" ;;
            *.ko.xz) xz -dc "/lib/modules/$ver/$f" >"$root/mods/$base.ko" ;;
            *.ko.zst) zstd -qdc "/lib/modules/$ver/$f" >"$root/mods/$base.ko" ;;
            *.ko.gz) gzip -dc "/lib/modules/$ver/$f" >"$root/mods/$base.ko" ;;
            *) fail "cannot read module $f" ;;
            esac
            echo "$base" >>"$root/mods/order"
        done
    done
    cat >"$root/init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m.ko 2>/dev/null; done
opts=trans=virtio,version=9p2000.L,msize=262144
# Cached: every exec re-read the 60 MB test binary from the host without it (0.8-1.1 s for
# `busbw --version`, 0.3 s cached). The run folder below stays uncached: both sides write it.
mount -t 9p -o $opts,ro,cache=loose hostroot /host || { echo "rdma-vm: cannot mount the host root"; poweroff -f; }
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/shm /host/dev/pts
mount -t tmpfs -o mode=1777 shm /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs -o mode=755 run /host/run
mkdir -p /host/run/vm
mount -t 9p -o $opts bed /host/run/vm || { echo "rdma-vm: cannot mount the run directory"; poweroff -f; }
exec chroot /host /bin/bash /run/vm/boot.sh
EOF
    chmod +x "$root/init"
    (cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$out"
    rm -rf "$root"
}

# The script each guest runs once its root is the host's (written into the shared DIR).
write_boot_script() {
    cat >"$1/boot.sh" <<'EOF'
#!/bin/bash
# Runs in the guest, as PID 1, in the host's root file system.
set -u
i=$(sed -n 's/.*busbw_vm=\([0-9]*\).*/\1/p' /proc/cmdline)
source /run/vm/config
out=/run/vm/vm$i
mkdir -p "$out"
say() { echo "rdma-vm[vm$i]: $*" >&2; echo "$*" >>"$out/bed.log"; }
finish() { sync; busybox poweroff -f; sleep 5; }
echo "vm$i" >/proc/sys/kernel/hostname
mount --bind /run/vm/hosts /etc/hosts
mount -t tmpfs -o mode=1777 vartmp /var/tmp 2>/dev/null || true
ip link set lo up
modprobe virtio_net napi_tx=0 2>/dev/null
modprobe crc32_generic
modprobe rdma_rxe || { say "modprobe rdma_rxe failed"; echo bed >"$out/rc"; finish; }
for m in sch_tbf sch_htb cls_u32 veth dummy; do modprobe "$m" 2>/dev/null; done
n=0
until ip link show eth0 >/dev/null 2>&1; do
    ((n++ < 50)) || { say "no eth0"; echo bed >"$out/rc"; finish; }
    sleep 0.1
done
ip link set eth0 mtu "$MTU"
ip addr add "$NET.$((i + 1))/24" dev eth0
ip link set eth0 up
if [[ -n $RATE ]]; then
    kbit=$RATE_KBIT
    for t in ${THROTTLE//,/ }; do [[ $t == "$i" ]] && kbit=$((kbit / 2)); done
    ip link set eth0 txqueuelen 1000
    # RoCE runs on lossless Ethernet: PFC pauses a sender, it does not drop its packets. A
    # queue of a second at the rate holds every QP's window (rxe keeps at most 64 packets of
    # a QP in flight), so the shaping paces RDMA traffic instead of tail-dropping bursts. A
    # 50 ms queue dropped them, and a dropped last packet costs the requester its whole ack
    # timeout (4.3 s at NCCL_IB_TIMEOUT=20) inside a measurement.
    if [[ -n $THROTTLE_LINK && ,$THROTTLE_LINK, == *,$i,* ]]; then
        # One end of the throttled link: traffic to the other end through its own tbf at half
        # the rate, the rest through the guest's (a prio qdisc sorts them; htb instead
        # delivered about 0.7 of its rate in these guests, where tbf keeps to it).
        IFS=, read -r la lb <<<"$THROTTLE_LINK"
        peer=$((la == i ? lb : la))
        tc qdisc replace dev eth0 root handle 1: prio bands 2 priomap 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
        tc qdisc add dev eth0 parent 1:1 tbf rate "${kbit}kbit" burst "$BURST" latency 1s
        tc qdisc add dev eth0 parent 1:2 tbf rate "$((kbit / 2))kbit" burst "$BURST" latency 1s
        tc filter add dev eth0 parent 1: protocol ip u32 match ip dst "$NET.$((peer + 1))/32" flowid 1:2
    else
        tc qdisc replace dev eth0 root tbf rate "${kbit}kbit" burst "$BURST" latency 1s
    fi
fi
rdma link add rxe0 type rxe netdev eth0 || { say "rdma link add failed"; echo bed >"$out/rc"; finish; }
n=0
until grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null; do
    ((n++ < 100)) || { say "rxe0 did not become ACTIVE"; echo bed >"$out/rc"; finish; }
    sleep 0.1
done
# Wait until every guest answers on the network (they boot at slightly different times).
for ((j = 0; j < COUNT; j++)); do
    n=0
    until ((j == i)) || busybox ping -c1 -W1 "$NET.$((j + 1))" >/dev/null 2>&1; do
        ((n++ < 120)) || { say "vm$j does not answer ping"; echo bed >"$out/rc"; finish; }
    done
done
ulimit -l unlimited
export VM_INDEX=$i VM_COUNT=$COUNT VM_ADDR=$NET.$((i + 1)) VM_OUT=$out VM_DIR=/run/vm VM_RDMA_DEV=rxe0
# The host's /tmp stays visible (a checkout or a test's files may live there), so scratch
# space is elsewhere.
mkdir -p /run/tmp
export TMPDIR=/run/tmp HOME=/run/tmp PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd /run/tmp
say "ready"
bash -c "$(cat /run/vm/cmd)" >"$out/stdout" 2>"$out/stderr" </dev/null
echo $? >"$out/rc"
finish
EOF
}

RUNNING_NS=""
WORK=""
KEEP_OUT=""
cleanup() {
    local pids
    if [[ -n $RUNNING_NS ]]; then
        pids=$(ip netns pids "$RUNNING_NS" 2>/dev/null || true)
        # shellcheck disable=SC2086
        [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
        local n=0
        while [[ -n $(ip netns pids "$RUNNING_NS" 2>/dev/null || true) ]] && ((n++ < 50)); do sleep 0.1; done
        ip netns del "$RUNNING_NS" 2>/dev/null || true
    fi
    [[ -z $WORK ]] || rm -rf "$WORK"
}

rate_kbit() {
    local r=${1,,} n unit
    [[ $r =~ ^([0-9]+)([kmg]?)(bit|bps)$ ]] || die "rate '$1': use e.g. 1gbit, 200mbit"
    n=${BASH_REMATCH[1]}
    unit=${BASH_REMATCH[2]}
    case $unit in "") n=$((n / 1000)) ;; m) n=$((n * 1000)) ;; g) n=$((n * 1000000)) ;; esac
    [[ ${BASH_REMATCH[3]} == bps ]] && n=$((n * 8))
    echo "$n"
}

labels_json() {
    local k=$1 lb=$2 nb=$3 i sep=""
    printf '{\n'
    for ((i = 0; i < k; i++)); do
        printf '%s  "vm%d": {"oci.oraclecloud.com/rdma.hpc_island_id": "island0", ' "$sep" "$i"
        printf '"oci.oraclecloud.com/rdma.network_block_id": "nb%d", ' $((i / nb))
        printf '"oci.oraclecloud.com/rdma.local_block_id": "lb%d", ' $(((i % nb) / lb))
        printf '"oci.oraclecloud.com/rdma.host_id": "host%d"}' "$i"
        sep=$',\n'
    done
    printf '\n}\n'
}

cmd_run() {
    local k=1 out="" mem=1024 smp=1 rate="" throttle="" throttle_link="" labels=0 blocks="1,1" timeout=600
    local accel=${BUSBW_VM_ACCEL:-tcg}
    while (($#)); do
        case $1 in
        --guests) k=${2:?}; shift 2 ;;
        --out) out=${2:?}; shift 2 ;;
        --mem) mem=${2:?}; shift 2 ;;
        --smp) smp=${2:?}; shift 2 ;;
        --rate) rate=${2:?}; shift 2 ;;
        --throttle) throttle=${2:?}; shift 2 ;;
        --throttle-link) throttle_link=${2:?}; shift 2 ;;
        --labels) labels=1; shift ;;
        --blocks) blocks=${2:?}; shift 2 ;;
        --timeout) timeout=${2:?}; shift 2 ;;
        --accel) accel=${2:?}; shift 2 ;;
        --) shift; break ;;
        *) die "run: unknown option '$1' (see '$PROG' for usage)" ;;
        esac
    done
    (($#)) || die "run: no command after --"
    [[ $k =~ ^[1-9][0-9]?$ ]] || die "--guests '$k' must be 1..99"
    [[ $mem =~ ^[0-9]+$ && $smp =~ ^[1-9]$ && $timeout =~ ^[0-9]+$ ]] || die "--mem, --smp and --timeout take numbers"
    [[ $accel == tcg || $accel == kvm ]] || die "--accel must be tcg or kvm"
    [[ $blocks =~ ^([0-9]+),([0-9]+)$ ]] || die "--blocks must be L,N"
    local lb=${BASH_REMATCH[1]} nb=${BASH_REMATCH[2]}
    if [[ -n $throttle_link ]]; then
        [[ $throttle_link =~ ^([0-9]+),([0-9]+)$ ]] && ((BASH_REMATCH[1] != BASH_REMATCH[2])) &&
            ((BASH_REMATCH[1] < k && BASH_REMATCH[2] < k)) ||
            die "--throttle-link must be I,J: two different guests below --guests"
        [[ -n $rate ]] || die "--throttle-link needs --rate (it halves that rate)"
    fi
    local m
    m=$(missing)
    [[ -z $m ]] || { cmd_check || true; exit 3; }
    local ver
    ver=$(find_kernel)
    if [[ -z $out ]]; then out=$(mktemp -d /tmp/rdma-vm.XXXXXX); fi
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    WORK=$(mktemp -d /tmp/rdma-vm-work.XXXXXX)
    RUNNING_NS="rdmavm-$$"
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    build_initramfs "$ver" "$WORK/initrd.gz"
    write_boot_script "$out"
    printf '%s' "$*" >"$out/cmd"
    local kbit="" burst=""
    if [[ -n $rate ]]; then
        kbit=$(rate_kbit "$rate")
        burst=$((kbit * 1000 / 8 / 250))
        ((burst >= 65536)) || burst=65536
    fi
    cat >"$out/config" <<EOF
NET=$NET
COUNT=$k
MTU=1500
RATE=$rate
RATE_KBIT=$kbit
BURST=$burst
THROTTLE=$throttle
THROTTLE_LINK=$throttle_link
EOF
    {
        echo "127.0.0.1 localhost"
        for ((i = 0; i < k; i++)); do echo "$NET.$((i + 1)) vm$i"; done
    } >"$out/hosts"
    ((labels == 0)) || labels_json "$k" "$lb" "$nb" >"$out/labels.json"
    for ((i = 0; i < k; i++)); do
        rm -rf "$out/vm$i"
        mkdir -p "$out/vm$i"
    done

    ip netns add "$RUNNING_NS"
    ip -n "$RUNNING_NS" link set lo multicast on
    ip -n "$RUNNING_NS" link set lo up
    ip -n "$RUNNING_NS" route add 224.0.0.0/4 dev lo
    local port=$((20000 + $$ % 20000)) taps=0
    if [[ -c /dev/net/tun ]] && ip -n "$RUNNING_NS" link add br0 type bridge 2>/dev/null; then
        taps=1
        for ((i = 0; i < k; i++)); do
            ip -n "$RUNNING_NS" tuntap add dev "tap$i" mode tap &&
                ip -n "$RUNNING_NS" link set "tap$i" txqueuelen 10000 master br0 up || taps=0
        done
        ip -n "$RUNNING_NS" link set br0 up || taps=0
        ((taps)) || echo "$PROG: no taps on a bridge here; the guests share a multicast socket" >&2
    fi
    local -a pids=()
    local kernel=/boot/vmlinuz-$ver
    netdev() {
        if ((taps)); then
            echo "tap,id=n0,ifname=tap$1,script=no,downscript=no"
        else
            echo "socket,id=n0,mcast=230.0.0.1:$port,localaddr=127.0.0.1"
        fi
    }
    for ((i = 0; i < k; i++)); do
        ip netns exec "$RUNNING_NS" timeout -s KILL "$timeout" \
            qemu-system-x86_64 -accel "$accel" -cpu max -m "$mem" -smp "$smp" \
            -display none -monitor none -no-reboot \
            -serial "file:$out/vm$i/console.log" \
            -kernel "$kernel" -initrd "$WORK/initrd.gz" \
            -append "console=ttyS0 quiet panic=-1 busbw_vm=$i" \
            -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
            -virtfs "local,path=$out,mount_tag=bed,security_model=none,multidevs=remap" \
            -netdev "$(netdev "$i")" \
            -device "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:$(printf %02x "$i")" \
            >"$out/vm$i/qemu.log" 2>&1 &
        pids+=($!)
    done
    local bed_failed=0 cmd_failed=0 rc
    for ((i = 0; i < k; i++)); do
        wait "${pids[$i]}" || true
    done
    # Frames the virtual L2 network itself dropped (a guest too slow to drain its queue):
    # losses the guests' RDMA traffic saw that no shaping explains.
    if ((taps)); then
        for ((i = 0; i < k; i++)); do
            echo "tap$i tx_dropped $(ip netns exec "$RUNNING_NS" cat "/sys/class/net/tap$i/statistics/tx_dropped" 2>/dev/null)"
        done >"$out/l2.txt"
    else
        ip netns exec "$RUNNING_NS" awk '/^Udp:/ { if (h) { for (f = 2; f <= NF; f++) print "udp " n[f] " " $f } else { h = 1; for (f = 2; f <= NF; f++) n[f] = $f } }' /proc/net/snmp >"$out/l2.txt" 2>/dev/null || true
    fi
    for ((i = 0; i < k; i++)); do
        rc=$(cat "$out/vm$i/rc" 2>/dev/null || true)
        case $rc in
        "")
            echo "vm$i: no result (timed out after ${timeout}s or the guest died; see $out/vm$i/console.log)"
            bed_failed=1
            ;;
        bed)
            echo "vm$i: the test bed failed: $(tail -1 "$out/vm$i/bed.log" 2>/dev/null)"
            bed_failed=1
            ;;
        0) echo "vm$i: exit 0" ;;
        *)
            echo "vm$i: exit $rc"
            cmd_failed=1
            ;;
        esac
        # The emulated NIC itself can stop: qemu 7.2's virtio-net under TCG once stopped taking
        # a guest's frames for good (CI, 3 guests on 2 cores), the guest's kernel reporting
        # "NETDEV WATCHDOG ... transmit queue 0 timed out" every 5 s until its peers gave up
        # on it. Whatever the command then said, the bed failed, not the command.
        if grep -q 'NETDEV WATCHDOG' "$out/vm$i/console.log" 2>/dev/null; then
            echo "vm$i: the test bed failed: the guest's emulated NIC stopped transmitting (virtio-net TX timeout in $out/vm$i/console.log)"
            bed_failed=1
        fi
    done
    echo "output in $out"
    ((bed_failed == 0)) || exit 3
    ((cmd_failed == 0)) || exit 1
}

(($#)) || usage
case $1 in
check) cmd_check ;;
run) shift; cmd_run "$@" ;;
-h | --help | help) usage ;;
*) die "unknown command '$1' (check, run)" ;;
esac
