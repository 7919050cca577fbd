#!/usr/bin/env bash
# gpu-check.sh: the check to run first whenever a GPU machine is at hand (issues 10 and 38;
# docs/cuda.md). One GPU is enough. Takes a prebuilt binary, because a GPU host may have
# CUDA but no Rust toolchain:
#
#   cargo build --release --features cuda          # anywhere; no CUDA toolkit needed
#   bench/scripts/gpu-check.sh target/release/busbw [--quick] [--host]
#   NCCL_TESTS_SRC=$HOME/nccl-tests GPU_CHECK_OUT=/tmp/gpu-check bench/scripts/gpu-check.sh target/release/busbw
#   NCCL_TESTS_SRC=$HOME/nccl-tests GPU_CHECK_WORK=/tmp/gc bench/scripts/gpu-check.sh --build-only
#
# First, NVRTC: busbw opens libnvrtc.so.13/.12 at run time to build its kernels, and a host
# with the driver alone has none; then the nvidia-cuda-nvrtc wheel of the driver's CUDA
# major.minor (never newer: the driver must load the PTX it writes) goes into the work
# folder and on LD_LIBRARY_PATH.
#
# Steps, the most important first, so that a run the time budget cuts short has done them:
# 1. Own engine, two ranks on the one GPU (NCCL_TESTS_DEVICE=0 unless set: every rank on
#    device 0), device buffers (-g 1): every collective, every type, the reductions with
#    every op, validated. Rank 0's "busbw: device buffers:" line is kept per run and tagged
#    [ipc] when it says "GPU to GPU between the ranks of this host (CUDA IPC ...)", [staged]
#    otherwise (it then ends "not GPU to GPU: <why>"); when no two-rank run went through IPC
#    at all, that is a failure.
# 2. `busbw gpu-bench`: the device-to-device copy's bandwidth beside each reduction kernel's.
# 3. NCCL as the engine, one rank (NCCL refuses two ranks of a communicator on one GPU):
#    `--engine nccl -g 1 --np 1`, every collective validated, with libnccl.so.2 from
#    NCCL_LIBRARY, else the nvidia-nccl wheel installed below, else an installed one; the
#    header must name the library (nccl-library=).
# 4. Side by side with nccl-tests, where NCCL_TESTS_SRC names a checkout of NVIDIA/nccl-tests
#    supplied beside the project (this script never fetches it and nothing of it is
#    committed): its all_reduce_perf is built out of tree (below), then it and
#    `busbw all_reduce_perf --engine nccl -g 1 --np 1` run with the same flags
#    (-b 8 -e 128M -f 2 -g 1) on the same libnccl.so.2, alternating (2 rounds, --quick 1):
#    both "Avg bus bandwidth" figures, both largest-size rows and the ratios busbw/nccl-tests.
#    With one rank a collective crosses no bus (busbw = algbw x 2(n-1)/n = 0), so the
#    largest row's algbw and time are the comparable figures.
# 5. Own engine, the rest: every collective across two simulated hosts of 2 ranks each (the
#    halves in UTS namespaces of their own host names, needs root: the job splits by host
#    and rail, GPU to GPU inside each "host" and staged between them, and the device-buffers
#    line must say so; tagged [hosts]), every collective on 4 ranks, AllReduce, Broadcast and
#    AlltoAll on 1, AllReduce on 2 ranks over TCP and on 4 with the tree and with recursive
#    doubling (--quick: six of them). These also fill the time while nccl-tests builds.
#
# The build (step 4), started in the background at once and niced: `pip install --target`
# into the work folder of the CUDA 13 wheels nvidia-cuda-nvcc (nvcc, with nvidia-cuda-runtime,
# -crt and nvidia-nvvm; the -cu12 nvcc wheel has no nvcc), nvidia-cuda-cccl and
# nvidia-nccl-cu13; then nccl-tests' own `make` in src/ with MPI=0, CUDA_HOME, NVCC,
# CUDA_LIB, CUDARTLIB=cudart_static (the wheel has no unversioned libcudart.so), NCCL_HOME
# (headers and libnccl.so from the wheel) and NVCC_GENCODE, into the work folder: only
# all_reduce_perf. The CUDA 13 wheels need a driver for CUDA 13 (580 or newer); with an older
# driver, or with CUDA_HOME naming a toolkit, that toolkit (else /usr/local/cuda, else nvcc on
# PATH) builds it, with nvidia-nccl-cu<its major>. pip honours PIP_INDEX_URL, PIP_FIND_LINKS
# and PIP_NO_INDEX, for a host without the index (the wheels take about 900 MB installed, NCCL
# alone 205 MB). When anything there fails the script says why and goes on: the side by side
# is then "not run", which is no failure of busbw.
#
# Options: --quick (smaller sizes and fewer runs: about 3 minutes on an H200); --host (host
# memory, no -g: checks the script itself without a GPU; skips gpu-bench, NCCL and
# nccl-tests, saying so); --build-only (no binary, no GPU: only build nccl-tests, e.g. on a
# CPU machine into a GPU_CHECK_WORK that the GPU run then reuses; exit 0 when built).
#
# Environment:
#   NCCL_TESTS_DEVICE  first device (default 0: all ranks share GPU 0)
#   NCCL_TESTS_SRC     a checkout of NVIDIA/nccl-tests (optional; step 4 needs it)
#   NCCL_LIBRARY       the libnccl.so.2 for steps 3 and 4 (default: the wheel's)
#   CUDA_HOME          a CUDA toolkit to build nccl-tests with instead of the nvcc wheel
#   GPU_CHECK_GENCODE  nvcc's -gencode flags (default NVCC_GENCODE if set, else
#                      -gencode=arch=compute_90,code=sm_90: H100, H200)
#   GPU_CHECK_WORK     wheels and build (default: a temporary folder, removed at exit); an
#                      up-to-date build there is reused without pip or nvcc
#   GPU_CHECK_OUT      a folder: summary.txt (every line printed here: the per-run lines with
#                      their device-buffers line, the kernel table, the side by side) and
#                      logs/ (each run's full output, the build log), to copy into BENCHMARKS.md
#   GPU_CHECK_BUDGET   seconds for the whole check (default 480, --quick 200): no run's
#                      timeout reaches past it; a run it leaves out or cuts short is "not
#                      run (time budget)", which makes the check incomplete: exit 1
#
# Every run has a `timeout`. Exit 0 when every run passed (exit 0 and "Out of bounds
# values : 0 OK"), 1 on any failure or a run left out for time, 2 on bad usage. Parts whose
# tools are missing (NCCL, nccl-tests) are reported as not run and do not change the exit.
set -uo pipefail

usage() {
    echo "usage: $0 BUSBW_BINARY [--quick] [--host]   or   $0 --build-only  (see the header)" >&2
    exit 2
}
BIN=
QUICK=0
HOST=0
BUILD_ONLY=0
while (($#)); do
    case $1 in
    --quick) QUICK=1 ;;
    --host) HOST=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    -*) usage ;;
    *) [[ -z $BIN ]] || usage; BIN=$1 ;;
    esac
    shift
done
if ((BUILD_ONLY)); then
    [[ -n ${NCCL_TESTS_SRC:-} ]] || { echo "gpu-check: --build-only needs NCCL_TESTS_SRC" >&2; exit 2; }
else
    [[ -n $BIN ]] || usage
    [[ -x $BIN && -f $BIN ]] || { echo "gpu-check: $BIN is not an executable file" >&2; exit 2; }
fi
if [[ -n ${NCCL_TESTS_SRC:-} && ! -f ${NCCL_TESTS_SRC}/src/Makefile ]]; then
    echo "gpu-check: NCCL_TESTS_SRC=$NCCL_TESTS_SRC is not a checkout of nccl-tests (no src/Makefile)" >&2
    exit 2
fi

export NCCL_TESTS_DEVICE=${NCCL_TESTS_DEVICE:-0}
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET:-$((QUICK ? 200 : 480))}
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu-check: GPU_CHECK_BUDGET must be seconds" >&2; exit 2; }
DEADLINE=$((START + BUDGET))
GENCODE=${GPU_CHECK_GENCODE:-${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}}
LOG=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
if [[ -n ${GPU_CHECK_WORK:-} ]]; then
    WORK=$(mkdir -p "$GPU_CHECK_WORK" && cd "$GPU_CHECK_WORK" && pwd) || exit 2
else
    WORK=$LOG/work
    mkdir -p "$WORK"
fi
OUT=
if [[ -n ${GPU_CHECK_OUT:-} ]]; then
    OUT=$(mkdir -p "$GPU_CHECK_OUT" && cd "$GPU_CHECK_OUT" && pwd) || exit 2
    : >"$OUT/summary.txt"
fi
PREP_PID=
cleanup() {
    # A build still running (interrupted): its timeout passes the signal to make and nvcc.
    if [[ -n $PREP_PID ]]; then
        [[ -f $LOG/prep-child.pid ]] && kill "$(cat "$LOG/prep-child.pid")" 2>/dev/null
        kill "$PREP_PID" 2>/dev/null
        wait "$PREP_PID" 2>/dev/null
    fi
    if [[ -n $OUT ]]; then
        mkdir -p "$OUT/logs"
        cp "$LOG"/*.txt "$LOG"/*.log "$OUT/logs/" 2>/dev/null
    fi
    rm -rf "$LOG"
}
trap cleanup EXIT

# say LINE...: print, and keep in the summary.
say() {
    printf '%s\n' "$@"
    [[ -z $OUT ]] || printf '%s\n' "$@" >>"$OUT/summary.txt"
}
left() { echo $((DEADLINE - SECONDS)); }
# Seconds kept for steps 2-4 (kernel table, NCCL engine, side by side) while they are to come.
STEPS234=$((QUICK ? 90 : 150))

# ---- The driver's CUDA version (nvidia-smi's header), the GPU -----------------------------
DRIVER_CUDA=
GPU_NAME=
if ((!HOST)) && command -v nvidia-smi >/dev/null; then
    DRIVER_CUDA=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -1)
    GPU_NAME=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
        sed -n "$((NCCL_TESTS_DEVICE + 1))p")
fi
DRIVER_MAJOR=${DRIVER_CUDA%%.*}

# ---- nccl-tests and NCCL: resolved in the background (prep) -------------------------------
# nvcc_major NVCC: the CUDA major version of that nvcc, or nothing.
nvcc_major() { "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p' | head -1; }

# prep_time CAP: seconds the build may still take: the budget less what steps 2-4 keep,
# at most CAP (--build-only: CAP).
prep_time() {
    local t=$((DEADLINE - SECONDS - STEPS234))
    ((BUILD_ONLY || t > $1)) && t=$1
    echo "$t"
}

# prep_run SECONDS CMD...: CMD under timeout, its pid kept for cleanup.
prep_run() {
    local t=$1
    shift
    ((t >= 20)) || { echo "no time left in the budget for: $*"; return 124; }
    timeout "$t" "$@" &
    echo $! >"$LOG/prep-child.pid"
    wait $!
}

# pip_target DIR PACKAGE...: install wheels into DIR (pip --target), fast to fail offline.
pip_target() {
    local dir=$1
    shift
    python3 -m pip --version >/dev/null 2>&1 || { echo "no pip (python3 -m pip)"; return 1; }
    echo "+ pip install --target $dir $*"
    prep_run "$(prep_time 400)" python3 -m pip install --disable-pip-version-check \
        --no-warn-script-location --retries 0 --timeout 20 -q --target "$dir" "$@"
}

# installed_nccl: a libnccl.so.2 already on this host (a Python environment's nvidia-nccl
# wheel, e.g. PyTorch's, else the loader's), or nothing.
installed_nccl() {
    local p
    p=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0] + "/lib/libnccl.so.2")' 2>/dev/null)
    [[ -n $p && -f $p ]] && { echo "$p"; return; }
    ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}'
}

# prep: writes $LOG/prep.env (NCCL_LIB, NCCL_FROM, NT_BIN, NT_WHY); its log is
# $LOG/nccl-tests-build.log. Never fatal.
prep() {
    local cuda_home='' nvcc='' major='' why='' nccl_lib='' nccl_from='' nt_bin='' pkgs=()
    local py=$WORK/py build=$WORK/nccl-tests-build
    {
        # The toolkit: CUDA_HOME, else the nvcc wheel (CUDA 13, when the driver has it), else
        # /usr/local/cuda or nvcc on PATH.
        if [[ -n ${NCCL_TESTS_SRC:-} ]]; then
            if [[ -n ${CUDA_HOME:-} ]]; then
                [[ -x $CUDA_HOME/bin/nvcc ]] && cuda_home=$CUDA_HOME || why="CUDA_HOME=$CUDA_HOME has no bin/nvcc"
            elif [[ -z $DRIVER_MAJOR || $DRIVER_MAJOR -ge 13 ]]; then
                cuda_home=$py/nvidia/cu13
                [[ -x $cuda_home/bin/nvcc ]] || pkgs+=("nvidia-cuda-nvcc==13.*" "nvidia-cuda-runtime==13.*" "nvidia-cuda-cccl==13.*")
            elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
                cuda_home=/usr/local/cuda
            elif nvcc=$(command -v nvcc); then
                cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
            else
                why="the driver supports CUDA $DRIVER_CUDA, the nvcc wheel is CUDA 13 (driver 580 or newer), and there is no other toolkit (set CUDA_HOME)"
            fi
        fi
        if [[ -n $cuda_home && ${#pkgs[@]} -eq 0 ]]; then
            major=$(nvcc_major "$cuda_home/bin/nvcc")
        elif ((${#pkgs[@]})); then
            major=13
        fi
        # NCCL: NCCL_LIBRARY, else the wheel of the toolkit's (or the driver's) CUDA major.
        if [[ -n ${NCCL_LIBRARY:-} ]]; then
            nccl_lib=$NCCL_LIBRARY nccl_from="NCCL_LIBRARY"
        else
            local m=${major:-${DRIVER_MAJOR:-12}}
            ((m >= 13)) && m=13 || m=12
            if [[ -f $py/nvidia/nccl/lib/libnccl.so.2 ]]; then
                nccl_lib=$py/nvidia/nccl/lib/libnccl.so.2 nccl_from="nvidia-nccl-cu$m wheel (installed earlier in $py)"
            else
                pkgs+=("nvidia-nccl-cu$m")
            fi
        fi
        # An up-to-date build in the work folder needs neither pip nor nvcc.
        if [[ -n ${NCCL_TESTS_SRC:-} && -x $build/all_reduce_perf ]] &&
            [[ -z $(find "$NCCL_TESTS_SRC/src" "$NCCL_TESTS_SRC/verifiable" -newer "$build/all_reduce_perf" -type f 2>/dev/null | head -1) ]]; then
            nt_bin=$build/all_reduce_perf cuda_home="(built earlier: not rebuilt)"
            echo "nccl-tests: $nt_bin is newer than every source file: not rebuilt"
            pkgs=("${pkgs[@]/nvidia-cuda-*/}")
        fi
        local want=()
        for p in "${pkgs[@]}"; do [[ -n $p ]] && want+=("$p"); done
        if ((${#want[@]})); then
            if pip_target "$py" "${want[@]}"; then
                chmod -f +x "$py"/nvidia/cu*/bin/* "$py"/nvidia/cu*/nvvm/bin/* 2>/dev/null
            else
                echo "pip failed (offline? PIP_FIND_LINKS or PIP_INDEX_URL name a wheel source)"
                [[ ${want[*]} == *nvidia-cuda-nvcc* ]] && why=${why:-"pip could not install the nvcc wheel (see the build log)"}
            fi
        fi
        if [[ -z $nccl_lib ]]; then
            if [[ -f $py/nvidia/nccl/lib/libnccl.so.2 ]]; then
                nccl_lib=$py/nvidia/nccl/lib/libnccl.so.2 nccl_from="the ${want[*]: -1} wheel"
            else
                nccl_lib=$(installed_nccl)
                nccl_from="installed on this host"
            fi
        fi
        [[ -n $nccl_lib && -f $nccl_lib ]] || { nccl_lib='' nccl_from=''; }
        # The build: nccl-tests' own make, out of tree, all_reduce_perf only.
        if [[ -n ${NCCL_TESTS_SRC:-} && -z $nt_bin && -z $why ]]; then
            if [[ ! -x $cuda_home/bin/nvcc ]]; then
                why="no nvcc in $cuda_home"
            elif [[ -z $nccl_lib ]]; then
                why="no libnccl.so.2 to build against"
            elif [[ ! -f $(dirname "$nccl_lib")/../include/nccl.h ]]; then
                why="no nccl.h beside $nccl_lib (../include)"
            else
                local home=$WORK/nccl-home cuda_lib=$cuda_home/lib64 rt=cudart
                mkdir -p "$home/lib"
                ln -sfn "$(cd "$(dirname "$nccl_lib")/../include" && pwd)" "$home/include"
                ln -sf "$nccl_lib" "$home/lib/libnccl.so"
                [[ -d $cuda_lib ]] || cuda_lib=$cuda_home/lib
                [[ -f $cuda_lib/libcudart_static.a ]] && rt=cudart_static
                local t rc
                t=$(prep_time 420)
                ((BUILD_ONLY)) && t=3600
                echo "+ make -C $NCCL_TESTS_SRC/src MPI=0 CUDA_HOME=$cuda_home NCCL_HOME=$home NVCC_GENCODE=$GENCODE BUILDDIR=$build (timeout ${t}s)"
                prep_run "$t" nice make -C "$NCCL_TESTS_SRC/src" -j "$(nproc)" MPI=0 \
                    CUDA_HOME="$cuda_home" NVCC="$cuda_home/bin/nvcc" CUDA_LIB="$cuda_lib" \
                    CUDARTLIB="$rt" NCCL_HOME="$home" NVCC_GENCODE="$GENCODE" \
                    BUILDDIR="$build" "$build/all_reduce_perf"
                rc=$?
                if ((rc == 0)); then
                    nt_bin=$build/all_reduce_perf
                elif ((rc == 124)); then
                    why="the build did not finish within the time budget (build beforehand: --build-only with GPU_CHECK_WORK)"
                else
                    why="make failed (exit $rc; see the build log)"
                fi
            fi
        fi
    } >"$LOG/nccl-tests-build.log" 2>&1
    [[ -n ${NCCL_TESTS_SRC:-} ]] || why="NCCL_TESTS_SRC is not set"
    {
        printf 'NCCL_LIB=%q\nNCCL_FROM=%q\nNT_BIN=%q\nNT_WHY=%q\nNT_CUDA=%q\n' \
            "$nccl_lib" "$nccl_from" "$nt_bin" "$why" "$cuda_home"
    } >"$LOG/prep.env"
}

NCCL_LIB='' NCCL_FROM='' NT_BIN='' NT_WHY='' NT_CUDA=''
prep_wait() {
    [[ -n $PREP_PID ]] || return 0
    wait "$PREP_PID"
    PREP_PID=
    # shellcheck disable=SC1091
    source "$LOG/prep.env"
}
prep_running() { [[ -n $PREP_PID ]] && kill -0 "$PREP_PID" 2>/dev/null; }

if ((BUILD_ONLY)); then
    DRIVER_MAJOR=${DRIVER_MAJOR:-13}
    prep &
    PREP_PID=$!
    prep_wait
    cat "$LOG/nccl-tests-build.log"
    if [[ -n $NT_BIN ]]; then
        say "gpu-check: nccl-tests built: $NT_BIN (NCCL $NCCL_LIB, from $NCCL_FROM; CUDA $NT_CUDA)"
        exit 0
    fi
    say "gpu-check: nccl-tests not built: $NT_WHY"
    exit 1
fi

# ---- The runs -----------------------------------------------------------------------------
MAX=8M
KBYTES=256M
CAP=120
ROUNDS=2
((QUICK)) && { MAX=256K; KBYTES=32M; CAP=60; ROUNDS=1; }
GPU=(-g 1)
((HOST)) && GPU=()
REDUCING=(all_reduce_perf reduce_scatter_perf reduce_perf)
OTHERS=(all_gather_perf broadcast_perf alltoall_perf alltoallv_perf scatter_perf gather_perf sendrecv_perf hypercube_perf)
failed=0
runs=0
notrun=0
ipc_runs=0
multi_runs=0
RESERVE=0 # seconds a run leaves to steps 2-4 (STEPS234 while they are still to come)
declare -A SEEN_PATH=()

say "# gpu-check.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)$( ((QUICK)) && echo ' --quick')$( ((HOST)) && echo ' --host')"
say "# binary: $BIN ($("$BIN" --version 2>/dev/null | head -1))"
if ((HOST)); then
    say "# --host: host memory (no -g); no kernel table, no NCCL engine, no nccl-tests"
else
    say "# GPU ${NCCL_TESTS_DEVICE}: ${GPU_NAME:-unknown (no nvidia-smi)}; driver's CUDA ${DRIVER_CUDA:-unknown}"
fi
say "# budget ${BUDGET} s; NCCL_TESTS_DEVICE=$NCCL_TESTS_DEVICE; nccl-tests: ${NCCL_TESTS_SRC:-NCCL_TESTS_SRC not set}"

# NVRTC, which busbw opens at run time (libnvrtc.so.13, .12) to build its kernels: a host
# with the driver alone has none. Then the nvidia-cuda-nvrtc wheel of the driver's CUDA
# major.minor (not newer: the driver must load the PTX it writes) goes into the work folder
# and on LD_LIBRARY_PATH. find_nvrtc: the first one the loader would find, or nothing.
find_nvrtc() {
    local d f dirs
    IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in "${dirs[@]}"; do
        for f in "$d"/libnvrtc.so.1[123]; do [[ -e $f ]] && { echo "$f"; return; }; done
    done
    ldconfig -p 2>/dev/null | awk '/libnvrtc\.so\.1[123] / {print $NF; exit}'
}
if ((!HOST)); then
    NVRTC=$(find_nvrtc)
    if [[ -z $NVRTC ]]; then
        if [[ -z $DRIVER_CUDA ]]; then
            pkg=nvidia-cuda-nvrtc-cu12
        elif ((DRIVER_MAJOR >= 13)); then
            pkg="nvidia-cuda-nvrtc==$DRIVER_CUDA.*"
        else
            pkg="nvidia-cuda-nvrtc-cu12==$DRIVER_CUDA.*"
        fi
        for try in 1 2; do # installed by an earlier run in GPU_CHECK_WORK, else now
            for f in "$WORK"/nvrtc/nvidia/*/lib/libnvrtc.so.1[23]; do
                [[ -e $f ]] || continue
                NVRTC="$f (the nvidia-cuda-nvrtc wheel, on LD_LIBRARY_PATH)"
                LD_LIBRARY_PATH="$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                export LD_LIBRARY_PATH
                break 2
            done
            ((try == 1)) && pip_target "$WORK/nvrtc" "$pkg" >"$LOG/nvrtc.log" 2>&1
        done
    fi
    say "# NVRTC: ${NVRTC:-none found, and pip could not install $pkg (see logs/nvrtc.log): the -g runs will fail}"
fi
((HOST)) || { prep & PREP_PID=$!; }

# check ENGINE NAME NP [flags...]: one validated run (ENGINE own or nccl); a line with its
# verdict, the device-buffers path tag and the seconds it took.
check() {
    local engine=$1 name=$2 np=$3
    shift 3
    local out="$LOG/run-$((runs + 1))-$engine-$name-np$np.txt" t rc=0 tag='' pathline
    t=$(($(left) - RESERVE))
    ((t > CAP)) && t=$CAP
    if ((t < 10)); then
        notrun=$((notrun + 1))
        say "$(printf 'SKIP  %-4s np=%d %-20s %s: not run, time budget spent' "$engine" "$np" "$name" "$*")"
        return
    fi
    runs=$((runs + 1))
    local s=$SECONDS
    if [[ $engine == nccl ]]; then
        NCCL_LIBRARY=$NCCL_LIB timeout "$t" "$BIN" "$name" --engine nccl -g 1 --np "$np" \
            -n 5 -w 1 -c 1 -T 60 "$@" >"$out" 2>&1
        rc=$?
    elif [[ $engine == hosts ]]; then
        # Two hosts of np/2 ranks on this machine: each half in a UTS namespace of its own
        # (its own host name), started as torchrun would; rank 0's output is the run's.
        local r pids=() port=$((29600 + runs % 300)) one
        for ((r = 0; r < np; r++)); do
            unshare --uts sh -c 'hostname "$1" && shift && exec "$@"' sh "gpu-check-host$((r * 2 / np))" \
                env RANK=$r WORLD_SIZE="$np" LOCAL_RANK=$((r % (np / 2))) LOCAL_WORLD_SIZE=$((np / 2)) \
                MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                timeout "$t" "$BIN" "$name" "${GPU[@]}" -n 5 -w 1 -c 1 -T 60 "$@" >"$out.$r" 2>&1 &
            pids+=($!)
        done
        rc=0
        for r in "${!pids[@]}"; do
            wait "${pids[$r]}"
            one=$?
            ((rc == 0)) && rc=$one
        done
        cp "$out.0" "$out"
    else
        timeout "$t" "$BIN" "$name" --np "$np" "${GPU[@]}" -n 5 -w 1 -c 1 -T 60 "$@" >"$out" 2>&1
        rc=$?
    fi
    local oob bad=''
    oob=$(grep -m1 '^# Out of bounds values' "$out" || echo "(no footer)")
    pathline=$(grep -m1 '^busbw: device buffers:' "$out")
    if [[ $engine == nccl ]]; then
        local v
        v=$(grep -m1 -o 'nccl-library=[0-9]*' "$out")
        tag="[${v:-no nccl-library= in the header}]"
        [[ -n $v ]] || bad="the header names no nccl-library="
    elif ((HOST)); then
        tag='[host]'
    elif [[ -z $pathline ]]; then
        tag='[no device-buffers line]'
    elif [[ $engine == hosts ]]; then
        # Split by host and rail, GPU to GPU inside both hosts: anything else is a failure.
        if [[ $pathline == *"GPU to GPU between the ranks of each of the 2 hosts"* ]]; then
            tag='[hosts]'
        else
            tag='[not split]'
            bad="the device-buffers line does not say GPU to GPU inside each of the 2 hosts"
        fi
    elif [[ $pathline == *"GPU to GPU between"* && $pathline != *"not GPU to GPU"* ]]; then
        tag='[ipc]'
    else
        tag='[staged]'
    fi
    if [[ $engine == own && $np -ge 2 && -n $pathline ]]; then
        multi_runs=$((multi_runs + 1))
        [[ $tag == '[ipc]' ]] && ipc_runs=$((ipc_runs + 1))
    fi
    if [[ $rc -eq 0 && $oob == *": 0 OK"* && -z $bad ]]; then
        say "$(printf 'ok    %-4s np=%d %-20s %s %s %d s' "$engine" "$np" "$name" "$*" "$tag" $((SECONDS - s)))"
    elif ((rc == 124 && t < CAP)); then
        # Stopped by the budget, not by its own cap: not run to the end, rather than failed.
        notrun=$((notrun + 1))
        say "$(printf 'CUT   %-4s np=%d %-20s %s %s: stopped after %d s, the end of the time budget' "$engine" "$np" "$name" "$*" "$tag" "$t")"
    else
        failed=$((failed + 1))
        ((rc == 124)) && bad="timed out after ${t}s${bad:+; $bad}"
        say "$(printf 'FAIL  %-4s np=%d %-20s %s %s: exit %d, %s%s' "$engine" "$np" "$name" "$*" "$tag" "$rc" "$oob" "${bad:+; $bad}")"
        say "$(tail -n 5 "$out" | sed 's/^/      /')"
    fi
    # The path line: in full the first time it reads so, and in the summary for every run.
    if [[ -n $pathline ]]; then
        if [[ -z ${SEEN_PATH[$pathline]:-} ]]; then
            SEEN_PATH[$pathline]=1
            say "      $pathline"
        elif [[ -n $OUT ]]; then
            printf '      %s\n' "$pathline" >>"$OUT/summary.txt"
        fi
    fi
}

# Step 5's runs, as lines of words (ENGINE NAME NP flags...); taken in order by extra_runs.
EXTRA=()
# Across hosts first (GPU to GPU inside each of two simulated hosts, the rest staged), where
# this machine lets the script give processes host names of their own.
if unshare --uts true 2>/dev/null; then
    if ((QUICK)); then
        EXTRA+=("hosts all_reduce_perf 4 -b 8 -e $MAX -f 32 -d all -o all")
        EXTRA+=("hosts alltoall_perf 4 -b 8 -e $MAX -f 32 -d all")
    else
        for c in "${REDUCING[@]}"; do EXTRA+=("hosts $c 4 -b 8 -e $MAX -f 32 -d all -o all"); done
        for c in "${OTHERS[@]}"; do EXTRA+=("hosts $c 4 -b 8 -e $MAX -f 32 -d all"); done
    fi
else
    HOSTS_WHY="unshare --uts fails here (not root?): no simulated hosts"
fi
if ((QUICK)); then
    EXTRA+=("own all_reduce_perf 1 -b 8 -e $MAX -f 32 -d all -o all")
    EXTRA+=("own all_reduce_perf 4 -b 8 -e $MAX -f 32 -d all -o all")
    EXTRA+=("own alltoall_perf 4 -b 8 -e $MAX -f 32 -d all")
    EXTRA+=("own all_reduce_perf 4 -b 8 -e $MAX -f 32 -d float -o all --algo tree")
else
    for c in "${REDUCING[@]}"; do EXTRA+=("own $c 4 -b 8 -e $MAX -f 32 -d all -o all"); done
    for c in "${OTHERS[@]}"; do EXTRA+=("own $c 4 -b 8 -e $MAX -f 32 -d all"); done
    EXTRA+=("own all_reduce_perf 1 -b 8 -e $MAX -f 32 -d all -o all")
    EXTRA+=("own broadcast_perf 1 -b 8 -e $MAX -f 32 -d all")
    EXTRA+=("own alltoall_perf 1 -b 8 -e $MAX -f 32 -d all")
    EXTRA+=("own all_reduce_perf 2 -b 8 -e $MAX -f 32 -d all --transport tcp")
    # The tree drives the device like the ring; recursive doubling is staged around the call.
    # Over TCP the device data is staged through pinned host memory: the staged engines.
    EXTRA+=("own all_reduce_perf 4 -b 8 -e $MAX -f 32 -d all -o all --algo tree --transport tcp")
    EXTRA+=("own all_reduce_perf 4 -b 8 -e $MAX -f 32 -d all -o all --algo rd --transport tcp")
fi
NEXT_EXTRA=0
# extra_runs [while-prep]: step 5's next runs: all of them, or only while the build runs.
extra_runs() {
    while ((NEXT_EXTRA < ${#EXTRA[@]})); do
        [[ ${1:-} == while-prep ]] && ! prep_running && return
        local words
        read -r -a words <<<"${EXTRA[$NEXT_EXTRA]}"
        NEXT_EXTRA=$((NEXT_EXTRA + 1))
        check "${words[@]}"
    done
}

say "#" "# 1. own engine, 2 ranks on one GPU$( ((HOST)) && echo ' (here: host memory)'), every collective, validated"
for c in "${REDUCING[@]}"; do check own "$c" 2 -b 8 -e "$MAX" -f 32 -d all -o all; done
for c in "${OTHERS[@]}"; do check own "$c" 2 -b 8 -e "$MAX" -f 32 -d all; done
if ((!HOST)); then
    if ((multi_runs > 0 && ipc_runs == 0)); then
        failed=$((failed + 1))
        say "FAIL  no two-rank run went GPU to GPU through IPC (the device-buffers lines above say how they went)"
    fi
    # While nccl-tests builds, step 5 goes on; steps 2-4 keep their time.
    if prep_running; then
        say "#" "# 5. (while nccl-tests builds) own engine, the rest"
        RESERVE=$STEPS234
        extra_runs while-prep
        RESERVE=0
    fi
    prep_wait
fi

say "#" "# 2. kernel table: busbw gpu-bench -b $KBYTES -n 20 (device-to-device copy beside the reductions)"
if ((HOST)); then
    say "# --host: no kernel table"
else
    t=$(left)
    ((t > CAP)) && t=$CAP
    if ((t < 10)); then
        notrun=$((notrun + 1))
        say "SKIP  gpu-bench: not run, time budget spent"
    else
        timeout "$t" "$BIN" gpu-bench -b "$KBYTES" -n 20 >"$LOG/gpu-bench.txt" 2>&1
        rc=$?
        say "$(sed 's/^/  /' "$LOG/gpu-bench.txt")"
        if ((rc != 0)); then
            failed=$((failed + 1))
            say "FAIL  gpu-bench: exit $rc"
        fi
    fi
fi

say "#" "# 3. NCCL as the engine, 1 rank, every collective, validated"
if ((HOST)); then
    say "# --host: NCCL not run (it needs a GPU)"
elif [[ -z $NCCL_LIB ]]; then
    say "# not run: no libnccl.so.2 (set NCCL_LIBRARY, or let pip install nvidia-nccl-cu12/13; see the build log)"
else
    say "# libnccl.so.2: $NCCL_LIB ($NCCL_FROM)"
    [[ -n $NT_BIN ]] && RESERVE=$((ROUNDS * 30)) # the side by side's time
    for c in "${REDUCING[@]}"; do check nccl "$c" 1 -b 8 -e "$MAX" -f 32 -d all -o all; done
    for c in "${OTHERS[@]}"; do check nccl "$c" 1 -b 8 -e "$MAX" -f 32 -d all; done
    RESERVE=0
fi

# figs FILE: "AVG|SIZE|OOP_TIME|OOP_ALGBW|IP_TIME|IP_ALGBW|ROW" of a table (its largest row).
figs() {
    local avg row
    avg=$(sed -n 's/^# Avg bus bandwidth *: *\([0-9.eE+-]*\).*/\1/p' "$1" | head -1)
    row=$(awk '!/^#/ && $1 ~ /^[0-9]+$/ && NF >= 12 {r = $0} END {print r}' "$1")
    # shellcheck disable=SC2086
    set -- $row
    printf '%s|%s|%s|%s|%s|%s|%s\n' "${avg:-?}" "${1:-?}" "${6:-?}" "${7:-?}" "${10:-?}" "${11:-?}" "$row"
}
# ratio A B: A/B to 3 decimals, or n/a.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 == a && b + 0 == b && b != 0) printf "%.3f", a / b; else printf "n/a" }'; }

say "#" "# 4. side by side: nccl-tests all_reduce_perf and busbw --engine nccl, -b 8 -e 128M -f 2 -g 1, same libnccl.so.2"
SIDE="not run"
if ((HOST)); then
    say "# --host: nccl-tests not run"
    SIDE="not run (--host)"
elif [[ -z $NT_BIN ]]; then
    say "# not run: ${NT_WHY:-no nccl-tests build}$([[ -s $LOG/nccl-tests-build.log ]] && echo '; build log:')"
    [[ -s $LOG/nccl-tests-build.log ]] && say "$(tail -n 8 "$LOG/nccl-tests-build.log" | sed 's/^/      /')"
    SIDE="not run (${NT_WHY:-no build})"
elif [[ -z $NCCL_LIB ]]; then
    say "# not run: no libnccl.so.2"
else
    say "# nccl-tests: $NT_BIN (CUDA: $NT_CUDA); libnccl.so.2 for both: $NCCL_LIB ($NCCL_FROM)"
    FLAGS=(-b 8 -e 128M -f 2 -g 1)
    SIDE="done"
    for ((r = 1; r <= ROUNDS; r++)); do
        order="nt bb"
        ((r % 2 == 0)) && order="bb nt"
        for who in $order; do
            t=$(left)
            ((t > CAP)) && t=$CAP
            f="$LOG/side-$r-$who.txt"
            if ((t < 10)); then
                say "SKIP  round $r $who: not run, time budget spent"
                notrun=$((notrun + 1))
                SIDE="incomplete"
                continue
            fi
            if [[ $who == nt ]]; then
                LD_LIBRARY_PATH="$(dirname "$NCCL_LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                    timeout "$t" "$NT_BIN" "${FLAGS[@]}" >"$f" 2>&1
            else
                NCCL_LIBRARY=$NCCL_LIB timeout "$t" "$BIN" all_reduce_perf --engine nccl --np 1 "${FLAGS[@]}" >"$f" 2>&1
            fi
            rc=$?
            oob=$(grep -m1 '^# Out of bounds values' "$f" || echo "(no footer)")
            if [[ $rc -eq 0 && $oob == *": 0 OK"* ]]; then
                touch "$f.ok"
            elif ((rc == 124 && t < CAP)); then
                say "CUT   round $r $who: stopped after $t s, the end of the time budget"
                notrun=$((notrun + 1))
                SIDE="incomplete"
            else
                if [[ $who == bb ]]; then
                    failed=$((failed + 1))
                    SIDE="incomplete"
                    say "FAIL  round $r busbw --engine nccl: exit $rc, $oob"
                else
                    say "NOTE  round $r nccl-tests: exit $rc, $oob (not a failure of busbw)"
                    SIDE="incomplete: nccl-tests failed (NOTE above)"
                fi
                say "$(tail -n 5 "$f" | sed 's/^/      /')"
            fi
        done
        [[ -f $LOG/side-$r-nt.txt.ok && -f $LOG/side-$r-bb.txt.ok ]] || continue
        IFS='|' read -r nt_avg nt_size nt_ot nt_oa nt_it nt_ia nt_row < <(figs "$LOG/side-$r-nt.txt")
        IFS='|' read -r bb_avg bb_size bb_ot bb_oa bb_it bb_ia bb_row < <(figs "$LOG/side-$r-bb.txt")
        say "round $r  nccl-tests ($(grep -m1 -o 'nccl-library=[0-9]*' "$LOG/side-$r-nt.txt"))  Avg bus bandwidth $nt_avg"
        say "           largest row: $nt_row"
        say "round $r  busbw      ($(grep -m1 -o 'nccl-library=[0-9]*' "$LOG/side-$r-bb.txt"))  Avg bus bandwidth $bb_avg"
        say "           largest row: $bb_row"
        avg_note=$(ratio "$bb_avg" "$nt_avg")
        [[ $avg_note == n/a ]] && avg_note="n/a (one rank: busbw is 0 for both)"
        [[ $nt_size == "$bb_size" ]] || say "NOTE  the largest rows differ in size ($nt_size, $bb_size)"
        say "round $r  busbw / nccl-tests: Avg bus bandwidth $avg_note; at $bb_size B algbw out-of-place $(ratio "$bb_oa" "$nt_oa"), in-place $(ratio "$bb_ia" "$nt_ia"); time out-of-place $(ratio "$bb_ot" "$nt_ot"), in-place $(ratio "$bb_it" "$nt_it")"
    done
fi

if ((NEXT_EXTRA < ${#EXTRA[@]})); then
    say "#" "# 5. own engine, the rest"
    extra_runs
fi

say "#"
ipc=''
((HOST)) || ipc="; IPC in $ipc_runs of $multi_runs multi-rank runs with a device-buffers line"
[[ -n ${HOSTS_WHY:-} ]] && say "# across hosts not run: $HOSTS_WHY"
say "# $runs collective runs, $failed failed, $notrun not run (time budget)$ipc; nccl-tests side by side: $SIDE; $((SECONDS - START)) s"
[[ -n $OUT ]] && echo "# summary: $OUT/summary.txt; each run's output: $OUT/logs/"
((failed == 0 && notrun == 0))
