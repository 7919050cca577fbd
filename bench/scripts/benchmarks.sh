#!/usr/bin/env bash
# benchmarks.sh: regenerate BENCHMARKS.md's table of where busbw stands, in one run.
#
# Runs each tracked target's own script or command (this script measures nothing itself),
# takes the figure from its output and prints one markdown table: target | goal | current
# figure | peer | CPU model | date | command, then per-size detail tables where a target has
# them. The CPU model (/proc/cpuinfo's model name, lscpu's family and model) and the date
# are this run's. A target whose needs this machine lacks (root for network namespaces,
# OpenMPI's mpirun, iperf3, qemu and perftest for SoftRoCE, valgrind, a nightly toolchain, a
# GPU) prints a skip line naming what is missing and its row reads "not measured (needs X)".
#
#   bench/scripts/benchmarks.sh [--no-build] [--quick] [--no-cargo] [--only NAME[,NAME]]
#                               [--out FILE] [--update BENCHMARKS.md] [--logs DIR] [--list]
#
#   --no-build  use the existing release binary ($BUSBW, else target/release/busbw); without
#               it and without $BUSBW, `cargo build --release -p busbw` runs first
#   --quick     the smallest settings of every target, to check this script (a few minutes
#               for the loopback targets); figures then carry "(quick)" and are not figures
#   --no-cargo  skip the targets that build a bench or example through cargo (kernels,
#               engine, rendezvous, fuzz): on a shared machine where nothing may compile
#   --only      run only these targets (--list names them)
#   --out FILE  write the table block to FILE (temporary file, then mv)
#   --update F  replace the block between `<!-- benchmarks.sh:begin -->` and
#               `<!-- benchmarks.sh:end -->` in F (atomically); rows of targets not run, or
#               left without a figure (a need missing, the run failed), keep their content
#   --logs DIR  keep every target's raw output there (default: a new folder under /tmp)
#
# Time, full run, on the 2-core Emerald Rapids guest BENCHMARKS.md names (estimated from the
# scripts' settings, to be corrected from the per-target wall times this script prints):
# about 20 minutes for the targets without special needs (OpenMPI 2 x ~4, sweep fidelity
# ~4, algorithms ~4, roofline ~1, kernels, engine, rendezvous, peak RSS ~2 together, fuzz ~2, soak 2),
# plus ~3 with root for the simulated cluster, ~18 for the gate's trials, and ~8 for the
# SoftRoCE bed (qemu under TCG),
# plus cargo's build time of anything stale. Run it on a quiet machine: every figure is a
# ratio to a peer measured in the same run, alternating, but two cores leave no slack.
#
# Environment: BUSBW (the busbw binary), BUSBW_VERBS (a `--features verbs` build for the
# SoftRoCE target; default BUSBW when that has verbs), BUSBW_CUDA (a `--features cuda` build
# for the GPU target; default BUSBW).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ALL=(openmpi-shm openmpi-tcp sweep-fidelity algos roofline cluster-iperf3 cluster-openmpi gate peak-rss
    kernels engine rendezvous rdma-perftest fuzz soak gpu)
BUILD=1 QUICK=0 NOCARGO=0 ONLY="" OUT="" UPDATE="" LOGS=""
die() { echo "benchmarks.sh: $*" >&2; exit 2; }
while (($#)); do
    case $1 in
    --no-build) BUILD=0; shift ;;
    --quick) QUICK=1; shift ;;
    --no-cargo) NOCARGO=1; shift ;;
    --only) ONLY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --update) UPDATE=$2; shift 2 ;;
    --logs) LOGS=$2; shift 2 ;;
    --list) printf '%s\n' "${ALL[@]}"; exit 0 ;;
    -h | --help) sed -n '2,39s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
    esac
done
SELECTED=()
if [[ -n $ONLY ]]; then
    IFS=, read -r -a want <<<"$ONLY"
    for w in "${want[@]}"; do
        [[ " ${ALL[*]} " == *" $w "* ]] || die "unknown target '$w' (--list names them)"
    done
    for t in "${ALL[@]}"; do [[ ",$ONLY," == *",$t,"* ]] && SELECTED+=("$t"); done
else
    SELECTED=("${ALL[@]}")
fi
[[ -z $UPDATE || -f $UPDATE ]] || die "--update: no file $UPDATE"
if [[ -n $UPDATE ]]; then
    { grep -q '^<!-- benchmarks.sh:begin -->$' "$UPDATE" && grep -q '^<!-- benchmarks.sh:end -->$' "$UPDATE"; } ||
        die "--update: $UPDATE has no <!-- benchmarks.sh:begin --> ... <!-- benchmarks.sh:end --> block"
fi

if [[ -z ${BUSBW:-} ]]; then
    BUSBW="$ROOT/target/release/busbw"
    if ((BUILD)); then
        echo "# building: cargo build --release -p busbw" >&2
        (cd "$ROOT" && cargo build --release -p busbw --quiet) || die "cargo build failed"
    fi
fi
[[ -x $BUSBW ]] || die "no busbw binary at $BUSBW (build it, or set BUSBW)"
BUSBW=$(realpath "$BUSBW")
export BUSBW

[[ -n $LOGS ]] || LOGS=$(mktemp -d /tmp/benchmarks.XXXXXX)
mkdir -p "$LOGS" || die "cannot create $LOGS"

CPU_NAME=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
CPU_FAM=$(lscpu 2>/dev/null | sed -n 's/^CPU family: *//p')
CPU_MOD=$(lscpu 2>/dev/null | sed -n 's/^Model: *//p')
CPU="$CPU_NAME (family ${CPU_FAM:-?} model ${CPU_MOD:-?}), $(nproc) cores"
DATE=$(date -u +%Y-%m-%d)
VERSION=$("$BUSBW" --version 2>/dev/null | head -1)
QTAG=""
((QUICK)) && QTAG=" (quick)"

# Per target: GOAL and PEER (fixed), and from the run FIG, CMD and DETAIL (markdown after
# the table). SKIPPED marks a row with no figure (a need missing, or the run failed): with
# --update it leaves the file's row as it was.
declare -A GOAL PEER FIG CMD DETAIL SKIPPED
GOAL[openmpi-shm]="busbw/OpenMPI busbw >= 1.0 at every size and >= 1.3 from 256 KiB, 2 and 4 ranks (issue 20)"
PEER[openmpi-shm]="OpenMPI \`MPI_Allreduce\` (vader), alternating"
GOAL[openmpi-tcp]=">= 1.0 at every size on 2 ranks (issue 20); 4 ranks reported"
PEER[openmpi-tcp]="OpenMPI \`MPI_Allreduce\` (btl tcp, lo), alternating"
GOAL[sweep-fidelity]="a size measures the same alone as inside a sweep: sweep/alone within 1 +- 0.15 (issue 20, point 0)"
PEER[sweep-fidelity]="the same size alone, same binary, alternating"
GOAL[algos]="auto within 1.10 of the fastest pinned algorithm at every size (issue 20, point 2)"
PEER[algos]="ring, tree, rd (and direct on shm) pinned, same binary, rotating order"
GOAL[roofline]="shm n=2: busbw >= 0.45 of one core's copy bandwidth and out of place within 1.1x of in place from 16 MiB; at most 1.25x the bare exchange up to 4 KiB (issue 40)"
PEER[roofline]="memcpy (one core; two at once), the bare two-process shared-memory exchange, the direct AllReduce's memory pattern without its protocol (reduce_pattern.c), same run, alternating"
GOAL[cluster-iperf3]="busbw >= 0.98 of iperf3's goodput on the same 1 Gbit/s links"
PEER[cluster-iperf3]="iperf3, one TCP stream, same run"
GOAL[cluster-openmpi]="8 B faster than OpenMPI; 32 MiB >= 0.98 of iperf3"
PEER[cluster-openmpi]="OpenMPI \`MPI_Allreduce\` across the namespaces, alternating; iperf3"
GOAL[gate]="the gate on 8 simulated nodes names exactly the fault in >= 9 of 10 trials per fault case, passes 10 of 10 healthy runs, median time to the verdict <= 30 s (issue 39)"
PEER[gate]="the injected fault (throttled node, link, flapping node; a hung node at -T 10, its own case) and the healthy cluster, same run"
GOAL[peak-rss]="peak RSS per rank <= 3 x largest buffer + 64 MiB"
PEER[peak-rss]="the bound itself"
GOAL[kernels]="bfloat16 and half sum >= 0.7 of memcpy at the best tier, 64 MiB and 256 KiB (issue 20, point 4)"
PEER[kernels]="memcpy on the same core, alternating"
GOAL[engine]="instructions per 8-byte call do not grow between builds (issue 19)"
PEER[engine]="the previous build (run the script on both)"
GOAL[rendezvous]="bytes a rank other than 0 is served independent of N (issue 20, point 5)"
PEER[rendezvous]="the same bootstrap at 1/4 the ranks"
GOAL[rdma-perftest]="1 MiB one way >= 0.9 of ib_write_bw; 8 B <= 1.5 x ib_write_lat (issue 17)"
PEER[rdma-perftest]="perftest on the same SoftRoCE link, alternating"
GOAL[fuzz]="no crash, hang or accepted forgery in the network- and user-facing parsers"
PEER[fuzz]="-"
GOAL[soak]="every run ends validated or in a clean failure naming the rank; nothing left behind"
PEER[soak]="-"
GOAL[gpu]="every collective validated on device buffers (issues 10, 38); kernels vs device copy; \`--engine nccl\` beside nccl-tests"
PEER[gpu]="device-to-device copy; nccl-tests"

skip() { # target, need (or, with a third argument, the whole reason)
    FIG[$1]="not measured (${3:-needs $2})"
    SKIPPED[$1]=1
    echo "# skip $1: ${3:-needs $2}" >&2
}
missing_cmds() { # prints the commands of "$@" not on PATH
    local c out=()
    for c in "$@"; do command -v "$c" >/dev/null 2>&1 || out+=("$c"); done
    echo "${out[*]}"
}
# root with network namespaces, tc and iperf3: the simulated cluster's needs
cluster_needs() {
    local m
    [[ $EUID -eq 0 ]] || { echo "root (network namespaces)"; return; }
    ip netns list >/dev/null 2>&1 || { echo "network namespaces (ip netns)"; return; }
    m=$(missing_cmds tc iperf3)
    [[ -z $m ]] || echo "$m"
}
fail() { # target, rc
    FIG[$1]="failed (exit $2; log: $LOGS/$1.log)"
    SKIPPED[$1]=1
    echo "# $1 failed (exit $2), see $LOGS/$1.log" >&2
}
q() { ((QUICK)) && echo "$2" || echo "$1"; }     # q FULL QUICK: this run's setting

# Human size label of a byte count, as vs-openmpi.sh prints them.
human() { awk -v b="$1" 'BEGIN { if (b >= 1048576 && b % 1048576 == 0) print b / 1048576 " MiB";
    else if (b >= 1024 && b % 1024 == 0) print b / 1024 " KiB"; else print b " B" }'; }

# ---- OpenMPI on loopback: vs-openmpi.sh, per transport ------------------------------------
openmpi() { # target transport
    local t=$1 tr=$2 m sizes pairs nps
    sizes=$(q "8 64 512 4K 32K 256K 2M 16M 64M 256M" "8 2M")
    pairs=$(q 3 1)
    nps=$(q "2 4" 2)
    CMD[$t]="bench/scripts/vs-openmpi.sh --pairs $pairs --np \"$nps\" --transports $tr --sizes \"$sizes\""
    m=$(missing_cmds mpicc mpirun cc)
    [[ -z $m ]] || { skip "$t" "OpenMPI: $m (apt-get install -y openmpi-bin libopenmpi-dev)"; return; }
    bash "$HERE/vs-openmpi.sh" --no-build --pairs "$pairs" --np "$nps" --transports "$tr" \
        --sizes "$sizes" >"$LOGS/$t.log" 2>&1
    local rc=$?
    # rows: np tr size-label iters | us GB/s | us GB/s | ratio spread | ip: us us ratio spread
    # -> np, label, bytes, ratio, spread, busbw us, ompi us, in-place ratio
    awk -F'|' 'NF >= 5 && $1 ~ /^[0-9]+ +(shm|tcp) / {
        split($1, a, " "); split($2, b, " "); split($3, o, " "); split($4, r, " "); split($5, i, " ")
        f = a[4] == "MiB" ? 1048576 : (a[4] == "KiB" ? 1024 : 1)
        printf "%s\t%s %s\t%d\t%s\t%s\t%s\t%s\t%s\n", a[1], a[3], a[4], a[3] * f, r[1], r[2], b[1], o[1], i[3]
    }' "$LOGS/$t.log" >"$LOGS/$t.rows"
    [[ -s $LOGS/$t.rows ]] || { fail "$t" "$rc"; return; }
    local ver
    ver=$(sed -n 's/^# openmpi: mpirun (Open MPI) \([0-9.]*\).*/\1/p' "$LOGS/$t.log")
    [[ -n $ver ]] && PEER[$t]=${PEER[$t]/OpenMPI/OpenMPI $ver}
    # per rank count: worst ratio, worst from 256 KiB, the 8 B times, the worst in place; and
    # the verdict (out of place, issue 20's goal)
    FIG[$t]=$(awk -F'\t' -v tr="$tr" '
        { n = $1; if (!(n in seen)) { seen[n] = 1; order[++k] = n }
          if ($4 != "NA") {
              if (!(n in lo) || $4 + 0 < lo[n]) { lo[n] = $4 + 0; los[n] = $4; lat[n] = $2 }
              if ($3 >= 262144 && (!(n in big) || $4 + 0 < big[n])) { big[n] = $4 + 0; bigs[n] = $4; bigat[n] = $2 }
          } else na[n]++
          if ($8 != "NA" && (!(n in ilo) || $8 + 0 < ilo[n])) { ilo[n] = $8 + 0; ilos[n] = $8; ilat[n] = $2 }
          if ($3 == 8) small[n] = sprintf(", 8 B %s vs %s us", $6, $7) }
        END {
            for (i = 1; i <= k; i++) {
                n = order[i]
                s = s (i > 1 ? "; " : "") "n=" n ": worst " (n in lo ? los[n] " at " lat[n] : "NA")
                if (n in big) s = s ", from 256 KiB worst " bigs[n] " at " bigat[n]
                if (n in ilo) s = s ", in place worst " ilos[n] " at " ilat[n]
                s = s small[n] (na[n] ? ", " na[n] " sizes failed" : "")
                if (tr == "shm" || n == 2) {
                    ok = (n in lo) && !na[n] && lo[n] >= 1.0 && (tr != "shm" || !(n in big) || big[n] >= 1.3)
                    s = s (ok ? " (met)" : " (**missed**)")
                }
            }
            print s
        }' "$LOGS/$t.rows")
    DETAIL[$t]=$(awk -F'\t' -v t="$t" '
        { n = $1; if (!(n in seen)) { seen[n] = 1; ns[++k] = n }
          if (!($3 in sz)) { sz[$3] = $2; sizes[++m] = $3 }
          cell[n, $3] = $4 ($5 != "NA" ? " (" $5 ")" : "") ", in place " $8 }
        END {
            printf "%s: busbw/OpenMPI busbw per size, median of the pairs (spread), out of place then in place\n\n| size |", t
            for (i = 1; i <= k; i++) printf " n=%s |", ns[i]
            printf "\n|---:|"; for (i = 1; i <= k; i++) printf "---|"; printf "\n"
            for (j = 1; j <= m; j++) {
                printf "| %s |", sz[sizes[j]]
                for (i = 1; i <= k; i++) printf " %s |", cell[ns[i], sizes[j]]
                printf "\n"
            }
        }' "$LOGS/$t.rows")
}
t_openmpi_shm() { openmpi openmpi-shm shm; }
t_openmpi_tcp() { openmpi openmpi-tcp tcp; }

# ---- Point 0: sweep-fidelity.sh -----------------------------------------------------------
t_sweep_fidelity() {
    local t=sweep-fidelity rounds sizes
    rounds=$(q 15 1)
    sizes=$(q "8 4K 256K 2M" "8 256K")
    CMD[$t]="bench/scripts/sweep-fidelity.sh --rounds $rounds"
    ((QUICK)) && CMD[$t]+=" --sizes \"$sizes\""
    bash "$HERE/sweep-fidelity.sh" --no-build --rounds "$rounds" --sizes "$sizes" >"$LOGS/$t.log" 2>&1
    local rc=$?
    # rows: tr bytes | alone sweep | ratio lo..hi [MISS]
    FIG[$t]=$(awk -F'|' '
        function lab(b) { return b >= 1048576 ? b / 1048576 " MiB" : (b >= 1024 ? b / 1024 " KiB" : b " B") }
        $1 ~ /^(shm|tcp) +[0-9]+ *$/ && NF >= 3 {
            split($1, a, " "); split($3, r, " "); d = r[1] - 1; if (d < 0) d = -d
            k++; if (r[3] == "MISS") miss++
            if (k == 1 || d > worst) { worst = d; at = a[1] " " lab(a[2]) " " r[1] }
            list = list (k > 1 ? ", " : "") a[1] " " lab(a[2]) " " r[1]
        } END { if (k) printf "%d of %d inside +-0.15; furthest %s (%s)", k - miss, k, at, list }' "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- Point 2: algos.py, three configurations ----------------------------------------------
t_algos() {
    local t=algos reps cfg np tr worst="" total=0 inside=0 rc=0
    reps=$(q 3 1)
    CMD[$t]="bench/scripts/algos.py --reps $reps --np N --transport T [--algos ring,tree,rd,direct,auto on shm]  (N,T: 2,shm 2,tcp 4,shm)"
    : >"$LOGS/$t.log"
    for cfg in "2 shm" "2 tcp" "4 shm"; do
        read -r np tr <<<"$cfg"
        ((QUICK)) && [[ $cfg != "2 shm" ]] && continue
        local algos=ring,tree,rd,auto
        [[ $tr == shm ]] && algos=ring,tree,rd,direct,auto
        (cd "$ROOT" && python3 "$HERE/algos.py" --reps "$reps" --np "$np" --transport "$tr" \
            --algos "$algos" --bin "$BUSBW") >>"$LOGS/$t.log.$np$tr" 2>&1 || rc=$?
        cat "$LOGS/$t.log.$np$tr" >>"$LOGS/$t.log"
        # | size | ring | tree | rd | [direct |] auto | best | auto/best | auto chose |
        read -r n i w < <(awk -F'|' '
        function lab(b) { return b >= 1048576 ? b / 1048576 " MiB" : (b >= 1024 ? b / 1024 " KiB" : b " B") }
        $2 ~ /^ *[0-9]+ *$/ && NF >= 9 {
            k++; r = $(NF - 2) + 0; if (r <= 1.10) ok++
            ch = $(NF - 1); gsub(/ /, "", ch)
            if (k == 1 || r > wr) { wr = r; at = lab($2 + 0) " " r " (chose " ch ")" }
        } END { print k + 0, ok + 0, (k ? at : "-") }' "$LOGS/$t.log.$np$tr")
        total=$((total + n)) inside=$((inside + i))
        if ((n)); then worst+="${worst:+; }$tr n=$np worst $w"; else worst+="${worst:+; }$tr n=$np failed"; fi
        rm -f "$LOGS/$t.log.$np$tr"
    done
    ((total)) || { fail "$t" "$rc"; return; }
    FIG[$t]="$inside of $total points within 1.10; $worst"
}

# ---- The roofline: roofline.sh (issue 40) -------------------------------------------------
t_roofline() {
    local t=roofline rounds
    rounds=$(q 3 1)
    CMD[$t]="bench/scripts/roofline.sh --rounds $rounds"
    bash "$HERE/roofline.sh" --no-build --rounds "$rounds" >"$LOGS/$t.log" 2>&1
    local rc=$?
    # | size | oop | ip | bound | oop/bound | ip/bound | busbw oop/copy1 | oop/ip | pattern oop |
    #   pattern ip | pattern oop/ip | oop/pattern | ip/pattern | floor | oop/floor |
    FIG[$t]=$(awk -F'|' '
        function lab(b) { return b >= 1048576 ? b / 1048576 " MiB" : (b >= 1024 ? b / 1024 " KiB" : b " B") }
        /^copy, one core/ { copy = $0; sub(/^copy, one core: /, "", copy); sub(/;.*/, "", copy) }
        $2 ~ /^ *[0-9]+ *$/ && NF >= 16 {
            s = $2 + 0; c = $8 + 0; g = $9 + 0; m = $12 + 0; f = $16 + 0
            if (s >= 16777216) {
                big = big (big ? ", " : "") lab(s) " " c " of copy, oop/ip " g " (pattern " m ")"
                if (c < 0.45 || g > 1.1) miss = 1
            } else if (s <= 4096) {
                small = small (small ? ", " : "") lab(s) " " f
                if (f > 1.25) miss = 1
            }
        } END { if (big != "") printf "from 16 MiB: %s; x bare exchange: %s (copy %s)%s",
            big, small, copy, miss ? " (**missed**)" : " (met)" }' "$LOGS/$t.log")
    DETAIL[$t]=$(sed -n '/^CPU:/,$p' "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- Simulated cluster: cluster-bw.sh, cluster-vs-openmpi.sh ------------------------------
t_cluster_iperf3() {
    local t=cluster-iperf3 need args
    args=(--max 32M)
    ((QUICK)) && args=(--min 32M --max 32M --iters 1)
    CMD[$t]="sudo bench/scripts/cluster-bw.sh ${args[*]}"
    need=$(cluster_needs)
    [[ -z $need ]] || { skip "$t" "$need"; return; }
    bash "$HERE/cluster-bw.sh" --no-build "${args[@]}" >"$LOGS/$t.log" 2>&1
    local rc=$?
    FIG[$t]=$(awk -F: '/iperf3 goodput, 1 TCP stream/ { split($2, a, " "); ip = a[1] }
        /busbw \/ iperf3 goodput/ { gsub(/ /, "", $2); r = $2 }
        END { if (r != "") { split(r, x, ","); printf "%s / %s of iperf3 (%s Mbit/s), 32 MiB, MTU 1500, 4 nodes%s",
              x[1], x[2], ip, (x[1] >= 0.98 && x[2] >= 0.98) ? " (met)" : " (**missed**)" } }' "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}
t_cluster_openmpi() {
    local t=cluster-openmpi need pairs sizes
    pairs=$(q 3 1)
    sizes=$(q "8 1M 32M" "8")
    CMD[$t]="sudo bench/scripts/cluster-vs-openmpi.sh --pairs $pairs --sizes \"$sizes\""
    need=$(cluster_needs)
    [[ -z $need ]] && need=$(missing_cmds mpicc mpirun)
    [[ -z $need ]] || { skip "$t" "$need"; return; }
    bash "$HERE/cluster-vs-openmpi.sh" --no-build --pairs "$pairs" --sizes "$sizes" >"$LOGS/$t.log" 2>&1
    local rc=$?
    # "  bytes busbw_us ompi_us busbw_GBs ompi_GBs ratio lo..hi /iperf3"
    FIG[$t]=$(awk '!/^#/ && NF >= 8 && $1 ~ /^[0-9]+$/ {
        s = $1 >= 1048576 ? $1 / 1048576 " MiB" : $1 " B"
        out = out (out ? "; " : "") s " " $6 "x OpenMPI" ($1 >= 1048576 ? ", " $8 " of iperf3" : "")
    } END { print out }' "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- Peak RSS: GNU time around one sweep to 256 MiB over TCP -------------------------------
t_peak_rss() {
    local t=peak-rss e eb kb bound
    e=$(q 256M 16M)
    eb=$(($(numfmt --from=iec "$e")))
    CMD[$t]="/usr/bin/time -v busbw all_reduce_perf --np 2 --transport tcp -b 1M -e $e -f 4 -n 1 -w 1 -c 1"
    [[ -x /usr/bin/time ]] || { skip "$t" "GNU time at /usr/bin/time (apt-get install -y time)"; return; }
    /usr/bin/time -v "$BUSBW" all_reduce_perf --np 2 --transport tcp -b 1M -e "$e" -f 4 -n 1 -w 1 -c 1 \
        >"$LOGS/$t.log" 2>&1
    local rc=$?
    kb=$(sed -n 's/^\s*Maximum resident set size (kbytes): *//p' "$LOGS/$t.log")
    [[ $rc -eq 0 && -n $kb ]] || { fail "$t" "$rc"; return; }
    bound=$((3 * eb / 1024 + 65536))
    FIG[$t]=$(printf "%'d KB at -e %s over TCP, bound %'d KB%s" "$kb" "$e" "$bound" \
        "$( ((kb <= bound)) && echo " (met)" || echo " (**missed**)")")
}

# ---- Point 4: reduction kernels (cargo bench) ---------------------------------------------
t_kernels() {
    local t=kernels
    CMD[$t]="cargo bench -p busbw-collectives --bench reduce -- bfloat16 half"
    ((NOCARGO)) && { skip "$t" "" "left out: --no-cargo"; return; }
    (cd "$ROOT" && cargo bench -q -p busbw-collectives --bench reduce -- bfloat16 half) \
        >"$LOGS/$t.log" 2>&1
    local rc=$?
    # "bfloat16 sum  64 MiB avx512fp16, 1 thread | memcpy ... | in place .. (1.21x memcpy) | out of place .. (0.95x memcpy)"
    FIG[$t]=$(awk '/best tier here:/ { best = $NF }
        / sum / && / 1 thread / {
            tier = $5; sub(/,$/, "", tier); if (tier != best) next
            s = $0; v = ""
            while (match(s, /\([0-9.]+x memcpy\)/)) { v = v (v ? " / " : "") substr(s, RSTART + 1, RLENGTH - 10); s = substr(s, RSTART + RLENGTH) }
            split(v, x, " / "); for (i in x) if (!seen++ || x[i] + 0 < lo) lo = x[i] + 0
            out = out (out ? "; " : "") $1 " " $3 " " $4 " " v
        } END { if (out) printf "at %s, in place / out of place: %s; lowest %s%s", best, out, lo, (lo >= 0.7 ? " (met)" : " (**missed**)") }' \
        "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- Engine instructions per call (callgrind) ---------------------------------------------
t_engine() {
    local t=engine m cases
    cases=$(q "" "rd")
    CMD[$t]="bench/scripts/engine-instructions.sh${cases:+ $cases}"
    ((NOCARGO)) && { skip "$t" "" "left out: --no-cargo"; return; }
    m=$(missing_cmds valgrind)
    [[ -z $m ]] || { skip "$t" "valgrind (apt-get install -y valgrind)"; return; }
    # shellcheck disable=SC2086 # the case list splits on purpose
    (cd "$ROOT" && bash "$HERE/engine-instructions.sh" $cases) >"$LOGS/$t.log" 2>&1
    local rc=$?
    FIG[$t]=$(awk '!/^#/ && NF == 2 && $2 ~ /^[0-9]+$/ { out = out (out ? ", " : "") $1 " " $2 }
        END { if (out) print out " instructions per call" }' "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- Point 5: rendezvous at scale (cargo example) -----------------------------------------
t_rendezvous() {
    local t=rendezvous n small big rc=0 fig=""
    big=$(q 4096 1024)
    small=$((big / 4))
    CMD[$t]="cargo run --release -p busbw-launchers --example rendezvous_scale -- $big"
    ((NOCARGO)) && { skip "$t" "" "left out: --no-cargo"; return; }
    : >"$LOGS/$t.log"
    for n in "$small" "$big"; do
        (cd "$ROOT" && cargo run -q --release -p busbw-launchers --example rendezvous_scale -- "$n") \
            >>"$LOGS/$t.log" 2>&1 || rc=$?
    done
    fig=$(awk '/^rendezvous_scale: [0-9]+ ranks/ { n = $2 }
        $1 == "ready" { ready[n] = $2 } $1 == "gathered" { gath[n] = $2 }
        $1 == "served" { all[n] = $2; for (i = 1; i <= NF; i++) if ($(i) == "mean,") mean[n] = $(i - 2); order[++k] = n }
        END { if (k == 2) { a = order[1]; b = order[2]
            printf "%d ranks: ready %s s, rank 0 gathered %s s, %s MB served, %s B mean per other rank (%d ranks: %s B)",
                b, ready[b], gath[b], all[b], mean[b], a, mean[a] } }' "$LOGS/$t.log")
    [[ -n $fig ]] || { fail "$t" "$rc"; return; }
    FIG[$t]=$fig
}

# ---- RDMA: rdma-vs-perftest.sh on the SoftRoCE bed ----------------------------------------
t_rdma_perftest() {
    local t=rdma-perftest bin=${BUSBW_VERBS:-$BUSBW} rounds
    rounds=$(q 3 1)
    CMD[$t]="sudo bench/scripts/rdma-vs-perftest.sh target/release/busbw $rounds  (a --features verbs build)"
    [[ $EUID -eq 0 ]] || { skip "$t" "root, qemu and perftest (SoftRoCE bed)"; return; }
    bash "$HERE/rdma-vm.sh" check >"$LOGS/$t.check" 2>&1 ||
        { skip "$t" "the SoftRoCE bed: $(sed -n 's/^ *- //p' "$LOGS/$t.check" | sed 's/ (.*//' | paste -sd, | sed 's/,/, /g')"; return; }
    [[ -z $(missing_cmds ib_write_bw ib_write_lat) ]] || { skip "$t" "perftest (apt-get install -y perftest)"; return; }
    # shellcheck disable=SC2016 # the backticks are doctor's words
    "$bin" doctor 2>&1 | grep -q 'built without the `verbs` feature' &&
        { skip "$t" "a verbs build in BUSBW_VERBS (cargo build --release -p busbw --features verbs)"; return; }
    bash "$HERE/rdma-vs-perftest.sh" "$bin" "$rounds" >"$LOGS/$t.log" 2>&1
    local rc=$?
    FIG[$t]=$(awk '/^busbw broadcast 1 MiB/ { for (i = 1; i <= NF; i++) if ($i == "ib_write_bw") one = $(i + 1) }
        /^busbw sendrecv 8 B time/ { for (i = 1; i <= NF; i++) if ($i == "ib_write_lat") lat = $(i + 1); sub(/,$/, "", lat) }
        END { if (one != "") printf "1 MiB one way %s of ib_write_bw%s; 8 B %s x ib_write_lat%s", one,
              (one >= 0.9 ? " (met)" : " (**missed**)"), lat, (lat <= 1.5 ? " (met)" : " (**missed**)") }' "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- Fuzz: fuzz.sh (nightly libFuzzer) ----------------------------------------------------
t_fuzz() {
    local t=fuzz secs targets
    secs=$(q 30 5)
    targets=$(q "" "store_request")
    CMD[$t]="bench/scripts/fuzz.sh $secs${targets:+ $targets}"
    ((NOCARGO)) && { skip "$t" "" "left out: --no-cargo"; return; }
    rustup run nightly rustc --version >/dev/null 2>&1 ||
        { skip "$t" "a nightly toolchain (rustup toolchain install nightly)"; return; }
    # shellcheck disable=SC2086
    bash "$HERE/fuzz.sh" "$secs" $targets >"$LOGS/$t.log" 2>&1
    local rc=$?
    FIG[$t]=$(awk '/^fuzz.sh: [a-z_]+: / { sub(/:$/, "", $2); n++; bad += ($8 != "0,"); crashes += $9
        out = out (out ? ", " : "") $2 " " $5 }
        END { if (n) printf "%d crashing inputs, %d of %d targets failed; executions in %s s each: %s",
              crashes, bad, n, secs, out }' secs="$secs" "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- The gate: gate-trials.sh -------------------------------------------------------------
t_gate() {
    local t=gate trials need
    trials=$(q 10 3)
    CMD[$t]="sudo bench/scripts/gate-trials.sh --trials $trials"
    need=$(cluster_needs)
    [[ -z $need ]] || { skip "$t" "$need"; return; }
    bash "$HERE/gate-trials.sh" --no-build --trials "$trials" >"$LOGS/$t.log" 2>&1
    local rc=$?
    # "# node      exact 10 of 10   median  24.4 s   slowest  25.1 s", one line per case.
    FIG[$t]=$(awk '/^# [a-z]+ +exact +[0-9]+ of +[0-9]+ +median/ {
            c = $2; e = $4; n = $6; m = $8
            ok = (c == "healthy") ? (e == n) : (e >= 0.9 * n)
            # The 30 s target is for the fault cases; a hung node costs a few -T more.
            ok = ok && (c == "hung" || m <= 30)
            if (!ok) bad = 1
            out = out (out ? "; " : "") sprintf("%s %d/%d exact, median %.1f s", c, e, n, m)
        } END { if (out) printf "%s%s", out, bad ? " (**missed**)" : " (met)" }' "$LOGS/$t.log")
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- Soak: soak.sh ------------------------------------------------------------------------
t_soak() {
    local t=soak minutes
    minutes=$(q 2 1)
    CMD[$t]="sudo bench/scripts/soak.sh $minutes target/release/busbw"
    bash "$HERE/soak.sh" "$minutes" "$BUSBW" >"$LOGS/$t.log" 2>&1
    local rc=$?
    FIG[$t]=$(sed -n 's/^soak.sh: \([0-9]* runs in .*\)/\1/p' "$LOGS/$t.log" | tail -1)
    grep -q 'local runs only' "$LOGS/$t.log" && FIG[$t]+=" (local runs only: no root)"
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- GPU: gpu-check.sh --------------------------------------------------------------------
t_gpu() {
    local t=gpu bin=${BUSBW_CUDA:-$BUSBW}
    CMD[$t]="bench/scripts/gpu-check.sh target/release/busbw$(q "" " --quick")  (a --features cuda build)"
    nvidia-smi -L >/dev/null 2>&1 || { skip "$t" "a CUDA GPU and driver"; return; }
    # shellcheck disable=SC2046
    bash "$HERE/gpu-check.sh" "$bin" $(q "" "--quick") >"$LOGS/$t.log" 2>&1
    local rc=$?
    FIG[$t]=$(sed -n 's/^# \([0-9]* collective runs, [0-9]* failed\).*/\1/p' "$LOGS/$t.log")
    ((rc == 0)) || FIG[$t]+="${FIG[$t]:+; }exit $rc (kernel table in the log)"
    [[ -n ${FIG[$t]} ]] || fail "$t" "$rc"
}

# ---- Run ----------------------------------------------------------------------------------
START=$SECONDS
echo "# benchmarks.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)  $CPU  $VERSION$QTAG" >&2
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg); logs in $LOGS" >&2
for t in "${SELECTED[@]}"; do
    s=$SECONDS
    echo "# == $t" >&2
    "t_${t//-/_}"
    echo "# $t: ${FIG[$t]:-?} ($((SECONDS - s)) s)" >&2
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg); wall $((SECONDS - START)) s" >&2

# A table cell: no newlines, pipes escaped.
cell() { printf '%s' "$1" | tr '\n' ' ' | sed 's/|/\\|/g'; }
row() { # target
    local t=$1 c=${CMD[$1]:-} f=${FIG[$1]:-not measured} cpu=$CPU date=$DATE
    if [[ -n ${SKIPPED[$t]:-} ]]; then cpu=- date=-; else f+=$QTAG; fi
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$(cell "${GOAL[$t]}")" "$(cell "$f")" \
        "$(cell "${PEER[$t]}")" "$(cell "$cpu")" "$date" "${c:+\`$(cell "$c")\`}"
}
BLOCK=$(mktemp)
trap 'rm -f "$BLOCK" "$BLOCK.rows" "$BLOCK.details"' EXIT
for t in "${SELECTED[@]}"; do
    if [[ -n ${SKIPPED[$t]:-} ]]; then printf 'skip\t' >>"$BLOCK.rows"; else printf 'run\t' >>"$BLOCK.rows"; fi
    row "$t" >>"$BLOCK.rows"
    if [[ -n ${DETAIL[$t]:-} ]]; then
        { echo "<!-- detail: $t -->"; echo; echo "${DETAIL[$t]}"; echo; } >>"$BLOCK.details"
    fi
done
: >>"$BLOCK.details"

# The block: header, table in ALL's order, details. With --update, rows and details of the
# targets this run did not measure come from the file's current block.
python3 - "$BLOCK.rows" "$BLOCK.details" "${UPDATE:-}" "$BUSBW ($VERSION)" "${ALL[@]}" >"$BLOCK" <<'EOF'
import re, sys
rows_f, details_f, update, binary, *order = sys.argv[1:]
new, skipped = {}, set()
for line in open(rows_f):
    kind, row = line.rstrip("\n").split("\t", 1)
    name = row.split("|")[1].strip()
    new[name] = row
    if kind == "skip":
        skipped.add(name)
def split_details(text):
    out = {}
    for part in re.split(r"(?m)^<!-- detail: ", text)[1:]:
        name, _, body = part.partition(" -->\n")
        out[name.strip()] = "<!-- detail: " + name.strip() + " -->\n" + body.strip("\n") + "\n"
    return out
details = split_details(open(details_f).read())
old_rows, old_details = {}, {}
if update:
    text = open(update).read()
    m = re.search(r"(?ms)^<!-- benchmarks.sh:begin -->\n(.*?)^<!-- benchmarks.sh:end -->", text)
    if m:
        for line in m.group(1).splitlines():
            cells = line.split("|")
            if line.startswith("| ") and len(cells) > 2 and cells[1].strip() in order:
                old_rows[cells[1].strip()] = line
        old_details = split_details(m.group(1))
rows = []
for name in order:
    if name in new and not (name in skipped and name in old_rows):
        rows.append(new[name])
    elif name in old_rows:
        rows.append(old_rows[name])
    if name in new and name not in skipped:
        d = details.get(name)
    else:
        d = old_details.get(name)
    if d:
        details[name] = d
    else:
        details.pop(name, None)
print("<!-- benchmarks.sh:begin -->")
print("<!-- generated by bench/scripts/benchmarks.sh; edit the script, not this block -->\n")
print("| target | goal | current figure | peer | CPU model | date | command |")
print("|---|---|---|---|---|---|---|")
print("\n".join(rows))
print()
for name in order:
    if name in details:
        print(details[name])
print("<!-- benchmarks.sh:end -->")
EOF
[[ -s $BLOCK ]] || die "could not assemble the table"

cat "$BLOCK"
if [[ -n $OUT ]]; then
    { tmp=$(mktemp "$(dirname "$OUT")/.benchmarks.XXXXXX") && cp "$BLOCK" "$tmp" && chmod 644 "$tmp" && mv "$tmp" "$OUT"; } ||
        die "cannot write $OUT"
    echo "# wrote $OUT" >&2
fi
if [[ -n $UPDATE ]]; then
    tmp=$(mktemp "$(dirname "$UPDATE")/.benchmarks.XXXXXX") || die "cannot write next to $UPDATE"
    python3 - "$UPDATE" "$BLOCK" >"$tmp" <<'EOF' || { rm -f "$tmp"; die "cannot update $UPDATE"; }
import re, sys
text, block = open(sys.argv[1]).read(), open(sys.argv[2]).read()
new, n = re.subn(r"(?ms)^<!-- benchmarks.sh:begin -->\n.*?^<!-- benchmarks.sh:end -->\n?",
                 lambda _: block if block.endswith("\n") else block + "\n", text, count=1)
if n != 1:
    sys.exit("no block")
sys.stdout.write(new)
EOF
    chmod --reference="$UPDATE" "$tmp" 2>/dev/null
    mv "$tmp" "$UPDATE" || die "cannot replace $UPDATE"
    echo "# updated the block in $UPDATE" >&2
fi
