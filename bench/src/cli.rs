//! Command line. Flags, defaults and meanings follow nccl-tests (`-b -e -i -f -n -w -c -o -d
//! -a -N -T ...`) so that existing runbooks work unchanged; `--np` and `--min-busbw` are ours.

use busbw_collectives::select::Algo;
use busbw_collectives::{DataType, ReduceOp};
use busbw_launchers::Launcher;
use busbw_measure::plan::Engine;
use busbw_measure::sizes::{parse_size, Rotation};
use busbw_transports::multi::TransportKind;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::Path;
use std::sync::OnceLock;

#[derive(Parser, Debug)]
#[command(
    name = "busbw",
    version,
    about = "Collective-communication benchmark and validation suite, nccl-tests compatible",
    long_about = "Measures collective bandwidth (algbw/busbw as nccl-tests computes them) and \
validates every result bit for bit. Run locally with --np N, or under a launcher that sets \
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.",
    after_help = "Examples:\n  busbw all_reduce_perf --np 4 -b 8 -e 128M -f 2\n  \
busbw all_reduce_perf --np 8 -b 1M -e 1G -f 2 -d all -o sum --min-busbw 10\n\n\
Exit codes: 0 ok, 1 internal error, 2 usage error, 3 a peer rank failed, 4 timeout (-T), \
7 wrong data or average busbw under --min-busbw / NCCL_TESTS_MIN_BW, 8 `compare` found a regression, \
143/130 stopped by SIGTERM/SIGINT (reports kept, marked incomplete). See docs/reliability.md."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// One subcommand per nccl-tests binary, named as the binary is.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// AllReduce (ring: reduce-scatter + all-gather).
    #[command(name = "all_reduce_perf", visible_alias = "all_reduce")]
    AllReduce(PerfArgs),
    /// AllGather (ring).
    #[command(name = "all_gather_perf", visible_alias = "all_gather")]
    AllGather(PerfArgs),
    /// Broadcast from -r (pipelined chain).
    #[command(name = "broadcast_perf", visible_alias = "broadcast")]
    Broadcast(PerfArgs),
    /// ReduceScatter (ring).
    #[command(name = "reduce_scatter_perf", visible_alias = "reduce_scatter")]
    ReduceScatter(PerfArgs),
    /// Reduce to -r (pipelined chain).
    #[command(name = "reduce_perf", visible_alias = "reduce")]
    Reduce(PerfArgs),
    /// AlltoAll (grouped send/recv with every peer).
    #[command(name = "alltoall_perf", visible_alias = "alltoall")]
    Alltoall(PerfArgs),
    /// AlltoAll with a size per pair of ranks: a distance-weighted pattern
    /// (NCCL_TESTS_ALLTOALLV_SPREAD) or a matrix file (NCCL_TESTS_ALLTOALLV_MATRIX_FILE).
    #[command(name = "alltoallv_perf", visible_alias = "alltoallv")]
    Alltoallv(PerfArgs),
    /// Scatter from -r.
    #[command(name = "scatter_perf", visible_alias = "scatter")]
    Scatter(PerfArgs),
    /// Gather to -r.
    #[command(name = "gather_perf", visible_alias = "gather")]
    Gather(PerfArgs),
    /// Send to rank+1 while receiving from rank-1.
    #[command(name = "sendrecv_perf", visible_alias = "sendrecv")]
    Sendrecv(PerfArgs),
    /// Recursive-doubling AllGather (power-of-two rank counts).
    #[command(name = "hypercube_perf", visible_alias = "hypercube")]
    Hypercube(PerfArgs),
    /// Bus bandwidth per topology tier, a pairwise link matrix, and a verdict that names
    /// the slow nodes, links and uplinks (docs/tiers.md).
    #[command(name = "tiers")]
    Tiers(Box<TiersArgs>),
    #[command(flatten)]
    Tools(crate::cli_report::ToolCommand),
    /// Kubernetes manifests of the gang job, its RBAC and the nightly (docs/kubernetes.md).
    K8s(crate::k8s::K8sArgs),
    /// RDMA devices, ports, link layers, MTUs and GID tables, the GID and rail busbw would
    /// use, and what to fix. Exits 0 when a port is usable, 1 when none is.
    Doctor(DoctorArgs),
    /// Device reduction kernels' bandwidth against a device-to-device copy on one GPU
    /// (feature `cuda`; used by scripts/gpu-check.sh).
    #[command(name = "gpu-bench", hide = true)]
    GpuBench(GpuBenchArgs),
}

#[derive(Args, Debug, Clone)]
pub struct GpuBenchArgs {
    /// Bytes per operand.
    #[arg(short = 'b', long = "bytes", default_value = "256M", value_parser = parse_size_arg)]
    pub bytes: u64,
    /// Timed iterations per kernel.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u32,
    /// Element types of the reduction kernels, or all.
    #[arg(short = 'd', long = "datatype", default_value = "all", value_parser = parse_dtype)]
    pub dtype: Choice<DataType>,
    /// Reduction op of the kernels.
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = parse_op)]
    pub op: Choice<ReduceOp>,
    /// Device index (default: NCCL_TESTS_DEVICE, else 0).
    #[arg(long = "device", env = "NCCL_TESTS_DEVICE", default_value_t = 0)]
    pub device: usize,
}

#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Devices to consider, NCCL_IB_HCA syntax (mlx5_0:1,mlx5_1, ^ to exclude, = exact).
    #[arg(long = "ib-hca", env = "NCCL_IB_HCA")]
    pub ib_hca: Option<String>,
    /// Show the rail of this local rank first (default: LOCAL_RANK, else 0).
    #[arg(long = "local-rank", env = "LOCAL_RANK", default_value_t = 0)]
    pub local_rank: usize,
    /// Read this directory instead of /sys (tests, or a copy of another host's sysfs).
    #[arg(long = "sysfs-root", default_value = "/sys", hide = true)]
    pub sysfs_root: std::path::PathBuf,
}

impl Command {
    pub fn program(&self) -> &'static str {
        match self {
            Command::AllReduce(_) => "all_reduce_perf",
            Command::AllGather(_) => "all_gather_perf",
            Command::Broadcast(_) => "broadcast_perf",
            Command::ReduceScatter(_) => "reduce_scatter_perf",
            Command::Reduce(_) => "reduce_perf",
            Command::Alltoall(_) => "alltoall_perf",
            Command::Alltoallv(_) => "alltoallv_perf",
            Command::Scatter(_) => "scatter_perf",
            Command::Gather(_) => "gather_perf",
            Command::Sendrecv(_) => "sendrecv_perf",
            Command::Hypercube(_) => "hypercube_perf",
            Command::Tiers(_) => "tiers",
            Command::Tools(_) => "busbw",
            Command::Doctor(_) => "doctor",
            Command::K8s(_) => "k8s",
            Command::GpuBench(_) => "gpu-bench",
        }
    }
    /// The perf flags; `None` for `doctor` and the tools that read saved runs.
    pub fn args(&self) -> Option<&PerfArgs> {
        Some(match self {
            Command::AllReduce(a)
            | Command::AllGather(a)
            | Command::Broadcast(a)
            | Command::ReduceScatter(a)
            | Command::Reduce(a)
            | Command::Alltoall(a)
            | Command::Alltoallv(a)
            | Command::Scatter(a)
            | Command::Gather(a)
            | Command::Sendrecv(a)
            | Command::Hypercube(a) => a,
            Command::Tiers(t) => &t.perf,
            Command::Tools(_) | Command::Doctor(_) | Command::K8s(_) | Command::GpuBench(_) => {
                return None
            }
        })
    }
}

/// `-d` value: one type or all of them.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice<T> {
    One(T),
    All,
}

fn parse_dtype(s: &str) -> Result<Choice<DataType>, String> {
    if s == "all" {
        return Ok(Choice::All);
    }
    s.parse()
        .map(Choice::One)
        .map_err(|e: busbw_collectives::ParseNameError| e.to_string())
}

fn parse_op(s: &str) -> Result<Choice<ReduceOp>, String> {
    if s == "all" {
        return Ok(Choice::All);
    }
    s.parse()
        .map(Choice::One)
        .map_err(|e: busbw_collectives::ParseNameError| e.to_string())
}

/// `--algo` / `NCCL_ALGO`. Besides `ring`, `tree`, `rd`, `direct` and `auto`, NCCL's list
/// syntax is understood as far as it concerns ring and tree: `Ring,Tree` (a choice: auto),
/// `^Tree` (all but tree: ring), `^Ring` (tree), so an environment set up for NCCL means the
/// same here.
fn parse_algo(s: &str) -> Result<Algo, String> {
    let t = s.trim().to_ascii_lowercase();
    let (negate, list) = match t.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, t.as_str()),
    };
    let names: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .collect();
    let has = |a: &str| names.contains(&a);
    let known = names
        .iter()
        .all(|n| matches!(*n, "ring" | "tree" | "rd" | "direct" | "auto" | "default"));
    let algo = match (negate, has("ring"), has("tree")) {
        _ if !known || names.is_empty() => None,
        (false, _, _) if has("auto") || has("default") || names.len() > 1 => Some(Algo::Auto),
        (false, true, false) => Some(Algo::Ring),
        (false, false, true) => Some(Algo::Tree),
        (false, false, false) if has("direct") => Some(Algo::Direct),
        (false, false, false) => Some(Algo::Doubling),
        (true, true, false) => Some(Algo::Tree),
        (true, false, true) => Some(Algo::Ring),
        _ => None,
    };
    algo.ok_or_else(|| {
        format!("unknown algorithm '{s}'; expected ring, tree, rd, direct or auto (or NCCL_ALGO lists such as Ring,Tree or ^Tree)")
    })
}

fn parse_engine(s: &str) -> Result<Engine, String> {
    match s {
        "own" | "busbw" => Ok(Engine::Own),
        "nccl" => Ok(Engine::Nccl),
        _ => Err(format!("unknown engine '{s}'; expected own or nccl")),
    }
}

/// `--transport`: clap lists the possible values in its usage error and `--help`.
fn transport_kind() -> impl TypedValueParser<Value = TransportKind> {
    PossibleValuesParser::new(TransportKind::NAMES).try_map(|s| s.parse::<TransportKind>())
}

fn parse_launcher(s: &str) -> Result<Launcher, String> {
    s.parse::<Launcher>().map_err(|e| e.to_string())
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// A duration: seconds, or a number with `s`, `m` or `h` (`30s`, `2m`, `1.5h`).
pub fn parse_duration_arg(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("'{s}': the unit is s, m or h (e.g. 30s, 2m)")),
    };
    let v: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("'{s}' is not a positive duration (e.g. 30s, 2m)"))?;
    Ok(std::time::Duration::from_secs_f64(v * scale))
}

/// nccl-tests' program names as busbw's own: invoked through a link named `all_reduce_perf`
/// (or an MPI build's `all_reduce_perf_mpi`), busbw runs `busbw all_reduce_perf`, so scripts
/// and manifests that call nccl-tests' binaries run busbw unchanged.
pub fn multicall(mut argv: Vec<OsString>) -> Vec<OsString> {
    let called = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .map(|n| n.strip_suffix("_mpi").unwrap_or(n).to_string());
    if let Some(program) = called {
        if program.ends_with("_perf") && busbw_measure::specs::find(&program).is_some() {
            argv.insert(1, program.into());
        }
    }
    argv
}

/// This process's arguments as busbw reads them ([`multicall`] applied): what ranks spawned
/// from it are given.
pub fn argv() -> &'static [OsString] {
    static ARGV: OnceLock<Vec<OsString>> = OnceLock::new();
    ARGV.get_or_init(|| multicall(std::env::args_os().collect()))
}

#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// Smallest message size in bytes (K, M, G suffixes: binary multiples).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size_arg)]
    pub min_bytes: u64,
    /// Largest message size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size_arg)]
    pub max_bytes: u64,
    /// Additive size step, used when -f is 1.
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = parse_size_arg)]
    pub step_bytes: u64,
    /// Multiplicative size step; > 1 overrides -i.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    pub step_factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u32,
    /// Warmup iterations per warmup size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup_iters: u32,
    /// Operations aggregated per timed iteration.
    #[arg(short = 'm', long = "agg_iters", default_value_t = 1)]
    pub agg_iters: u32,
    /// Validation iterations per size and placement (0 disables checking: #wrong shows N/A).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// Reduction: sum, prod, max, min, avg, mulsum (premultiplied sum), or all.
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = parse_op)]
    pub op: Choice<ReduceOp>,
    /// Data type: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2, or all.
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_dtype)]
    pub dtype: Choice<DataType>,
    /// How per-rank times are combined: 0 rank 0's own, 1 mean, 2 min, 3 max.
    #[arg(short = 'a', long = "average", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: u8,
    /// Repeat the whole sweep N times (0: until interrupted).
    #[arg(short = 'N', long = "run_cycles", default_value_t = 1)]
    pub run_cycles: u32,
    /// 1: per-iteration columns i_min i_max i_p99 i_cv% after each placement (host clock,
    /// slowest rank per iteration); other values turn it off, as in nccl-tests.
    #[arg(
        short = 'I',
        long = "per_iter_timing",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub per_iter_timing: i64,
    /// Leading iterations the -I summary leaves out (0 <= K < -n; needs -I 1). The JSON
    /// reports keep every iteration.
    #[arg(
        short = 'K',
        long = "per_iter_skip",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub per_iter_skip: i64,
    /// 1: label the time column `cputime`: nccl-tests' host time until the operations were
    /// enqueued, which on busbw's host engine is when they completed.
    #[arg(
        short = 'C',
        long = "report_cputime",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub report_cputime: i64,
    /// 1: end each row with the time it was printed (UTC).
    #[arg(
        short = 'S',
        long = "report_timestamps",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub report_timestamps: i64,
    /// Wait after each operation: 0 no (busbw's operations complete before they return, so
    /// 0 and 2 time the same), 1 wait and barrier after each (barrier timed), 2 wait only,
    /// 3 barrier after each iteration, not timed.
    #[arg(
        short = 'z',
        long = "blocking",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub blocking: i64,
    /// Shift the send and receive buffers by this many elements, so that no operation
    /// starts aligned.
    #[arg(
        short = 'u',
        long = "unalign",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub unalign: i64,
    /// Window the timed loop rotates its buffers over, so sizes below it run from memory
    /// rather than from a core's cache, the same alone as inside any sweep; `max` is
    /// nccl-tests' rule (the sweep's largest size), 0 never moves them.
    #[arg(long = "rotate", default_value_t = Rotation::DEFAULT, value_parser = Rotation::parse)]
    pub rotate: Rotation,
    /// 1: a memory usage line in the footer (host memory per process; device memory with -g).
    #[arg(
        short = 'M',
        long = "memory",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub memory: i64,
    /// 1: say that the ranks of a process initialise concurrently (busbw's always do: each
    /// is its own thread that joins the job and allocates its own buffers).
    #[arg(
        short = 'p',
        long = "parallel_init",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub parallel_init: i64,
    /// nccl-tests' legacy NULL CUDA stream (GPU only: noted and ignored on host buffers).
    #[arg(
        short = 'y',
        long = "stream_null",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub stream_null: i64,
    /// nccl-tests' CUDA graph launches (GPU only: noted and ignored on host buffers).
    #[arg(
        short = 'G',
        long = "cudagraph",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub cudagraph: i64,
    /// nccl-tests' NCCL buffer registration 0/1/2 (GPU only: noted and ignored on host
    /// buffers; busbw's transports register buffers themselves).
    #[arg(
        short = 'R',
        long = "local_register",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub local_register: i64,
    /// nccl-tests' NCCL CTA policy (GPU only: noted and ignored on host buffers).
    #[arg(short = 'x', long = "cta_policy", allow_negative_numbers = true)]
    pub cta_policy: Option<i64>,
    /// nccl-tests' device-API kernels; needs -R 2 (GPU only: noted and ignored on host
    /// buffers).
    #[arg(
        short = 'D',
        long = "device_implementation",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub device_implementation: i64,
    /// CTAs for -D kernels (GPU only: noted and ignored on host buffers).
    #[arg(
        short = 'V',
        long = "device_cta_count",
        default_value_t = 16,
        allow_negative_numbers = true
    )]
    pub device_cta_count: i64,
    /// Seconds any wait may go without progress before the rank fails naming the peer it
    /// waited for. 0 selects the default: busbw never waits forever.
    #[arg(short = 'T', long = "timeout", default_value_t = 300)]
    pub timeout: u64,
    /// Threads per process, each a rank of the job (nccl-tests' -t): ranks = processes ×
    /// threads × GPUs per thread.
    #[arg(short = 't', long = "nthreads", default_value_t = 1)]
    pub nthreads: u32,
    /// GPUs per thread, one rank each, with buffers on CUDA devices (build feature `cuda`;
    /// devices chosen as nccl-tests does: NCCL_TESTS_DEVICE, else local rank × threads × GPUs;
    /// see docs/cuda.md). Not given or 0: host memory.
    #[arg(short = 'g', long = "ngpus", visible_alias = "gpus")]
    pub ngpus: Option<u32>,
    /// Who runs the collectives: own (busbw's engine, the default) or nccl (NCCL's library,
    /// opened at run time from NCCL_LIBRARY, else libnccl.so.2, on CUDA device buffers: the
    /// row nccl-tests would print, under busbw's launcher, validation and reports). nccl needs
    /// the `cuda` build and implies -g 1; see docs/cuda.md.
    #[arg(long = "engine", env = "BUSBW_ENGINE", default_value = "own", value_parser = parse_engine)]
    pub engine: Engine,
    /// Root rank of broadcast, reduce, scatter and gather; -1 loops over every rank.
    #[arg(
        short = 'r',
        long = "root",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub root: i64,
    /// AllReduce algorithm: ring, tree (double binary tree), rd (recursive doubling, MPI's
    /// short-message algorithm), or auto (per size, from every algorithm timed on this job at
    /// start; adds an `algo` column to the table). Not given: auto's choice without the
    /// column, as NCCL chooses when NCCL_ALGO is unset.
    #[arg(long = "algo", env = "NCCL_ALGO", value_parser = parse_algo)]
    pub algo: Option<Algo>,
    /// How this process finds its job: auto (detect from the environment; see README "Run on
    /// a cluster"), local, env (torchrun variables), volcano, mpi, slurm or k8s.
    #[arg(long = "launcher", env = "BUSBW_LAUNCHER", default_value = "auto", value_parser = parse_launcher)]
    pub launcher: Launcher,
    /// Ranks this process (pod) starts, torchrun style: a job of P pods has P × G ranks.
    #[arg(
        long = "nproc-per-node",
        env = "BUSBW_NPROC_PER_NODE",
        default_value_t = 1
    )]
    pub nproc_per_node: usize,
    /// Rendezvous store port when the environment gives none (MASTER_PORT wins) [default: 29500].
    #[arg(long = "port", env = "BUSBW_PORT")]
    pub port: Option<u16>,
    /// Rank 0's host, for launchers that do not say (mpirun) or to override them.
    #[arg(long = "master-addr")]
    pub master_addr: Option<String>,
    /// Indexed Job / JobSet: host name of pod `{index}`, e.g. 'myjob-{index}.myjob'.
    #[arg(long = "host-pattern", env = "BUSBW_HOST_PATTERN")]
    pub host_pattern: Option<String>,
    /// Indexed Job / JobSet: number of pods.
    #[arg(long = "world-size", env = "BUSBW_WORLD_SIZE")]
    pub world_size: Option<usize>,
    /// Shared secret that every store and data connection must present.
    #[arg(long = "job-token", env = "BUSBW_JOB_TOKEN", hide_env_values = true)]
    pub job_token: Option<String>,
    /// Interfaces for data connections, NCCL_SOCKET_IFNAME syntax (eth0, ^docker,lo, =ens5).
    #[arg(long = "socket-ifname", env = "NCCL_SOCKET_IFNAME")]
    pub socket_ifname: Option<String>,
    /// Helper threads per TCP connection that carry long messages over extra sockets, as
    /// NCCL_SOCKET_NTHREADS (1-16). 0: one socket per connection, moved by the rank itself,
    /// best when cores are scarce.
    #[arg(
        long = "socket-nthreads",
        env = "NCCL_SOCKET_NTHREADS",
        default_value_t = 0
    )]
    pub socket_nthreads: usize,
    /// Sockets per helper thread, as NCCL_NSOCKS_PERTHREAD (threads x sockets <= 64).
    #[arg(
        long = "nsocks-perthread",
        env = "NCCL_NSOCKS_PERTHREAD",
        default_value_t = 1
    )]
    pub nsocks_perthread: usize,
    /// Say what the launcher detection found (stderr).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Data transport: auto (shared memory to ranks on the same host, RDMA verbs to the others
    /// when both have a usable RoCE/IB port and busbw is built with `verbs`, else TCP), tcp,
    /// shm (same-host jobs only) or verbs (RDMA for every peer).
    #[arg(long = "transport", env = "BUSBW_TRANSPORT", default_value = "auto", value_parser = transport_kind())]
    pub transport: TransportKind,
    /// RDMA devices and ports, NCCL_IB_HCA syntax (mlx5_0:1,mlx5_1, ^ to exclude, = exact);
    /// each local rank takes its own. NCCL_IB_GID_INDEX, NCCL_IB_ADDR_FAMILY,
    /// NCCL_IB_ADDR_RANGE, NCCL_IB_TC, NCCL_IB_SL, NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT and
    /// NCCL_IB_QPS_PER_CONNECTION are read as NCCL reads them (docs/rdma.md).
    #[arg(long = "ib-hca", env = "NCCL_IB_HCA")]
    pub ib_hca: Option<String>,
    /// Spawn this many local ranks on 127.0.0.1 (1: run in this process).
    #[arg(long = "np", default_value_t = 1)]
    pub np: usize,
    /// Fail (exit 7) when the average bus bandwidth is below 0.9 × this many GB/s.
    #[arg(long = "min-busbw", env = "NCCL_TESTS_MIN_BW")]
    pub min_busbw: Option<f64>,
    /// Test hook: corrupt one result element on this rank after each validation run.
    #[arg(long = "debug-corrupt-rank", hide = true)]
    pub debug_corrupt_rank: Option<usize>,
    /// Test hook: this rank fails with an error at its first measured size.
    #[arg(long = "debug-fail-rank", hide = true)]
    pub debug_fail_rank: Option<usize>,
    #[command(flatten)]
    pub report: crate::cli_report::ReportArgs,
}

/// `busbw tiers`: the usual size and iteration flags plus where the topology comes from and
/// what counts as a pass.
#[derive(Args, Debug, Clone)]
#[command(
    after_help = "Examples:\n  BUSBW_TOPOLOGY=oci.oraclecloud.com/rdma.local_block_id=lb1 busbw tiers -b 1M -e 64M -f 4\n  \
busbw tiers --topology-source file --topology-file nodes.json --min-busbw-tier local_block=40\n\n\
Exit codes as for *_perf; 7 also when a tier is under --min-busbw-tier or a node or link is named slow."
)]
pub struct TiersArgs {
    #[command(flatten)]
    pub perf: PerfArgs,
    /// Collective run in every group of every tier.
    #[arg(long = "collective", default_value = "all_reduce_perf")]
    pub collective: String,
    /// Label convention: auto, oci, gke, aws, topograph, volcano, or custom (--topology-keys).
    #[arg(long = "topology-preset", default_value = "auto")]
    pub preset: String,
    /// Label keys for --topology-preset custom, outermost first (k1,k2,...).
    #[arg(long = "topology-keys", value_delimiter = ',')]
    pub keys: Vec<String>,
    /// Where labels come from, in order, combined: env, file, k8s, oci-imds.
    /// [default: env, plus file when --topology-file is given]
    #[arg(long = "topology-source")]
    pub source: Option<String>,
    /// Node-labels file: `kubectl get nodes -o json`, or a JSON/YAML map host -> labels.
    #[arg(long = "topology-file")]
    pub file: Option<std::path::PathBuf>,
    /// Kubernetes API base URL [default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT].
    #[arg(long = "topology-k8s-url")]
    pub k8s_url: Option<String>,
    /// OCI instance metadata base URL.
    #[arg(
        long = "topology-imds-url",
        default_value = "http://169.254.169.254/opc/v2"
    )]
    pub imds_url: String,
    /// This node's name in the labels file and the API (the downward API's spec.nodeName)
    /// [default: the host name].
    #[arg(long = "node-name", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Message size of the pairwise sendrecv.
    #[arg(long = "pairwise-size", default_value = "64M", value_parser = parse_size_arg)]
    pub pairwise_size: u64,
    /// Timed sendrecv operations per pair.
    #[arg(long = "pairwise-iters", default_value_t = 5)]
    pub pairwise_iters: u32,
    /// Skip the pairwise link matrix.
    #[arg(long = "no-pairwise")]
    pub no_pairwise: bool,
    /// Which pairs of nodes are measured: full (the round robin, every pair, N-1 rounds) or
    /// adaptive (one round across the widest tier, then the nodes of slow pairs re-paired
    /// with nodes measured good until each slow pair is explained: rounds grow with the
    /// faults, not with N; see docs/tiers.md).
    #[arg(long = "pairwise", default_value = "adaptive", value_parser = ["full", "adaptive"])]
    pub pairwise: String,
    /// End the gate within this time (30s, 2m): the pairwise rounds are sized from the
    /// measured cost of a probe round to fit what the sweeps left, and, after the adaptive
    /// rounds, pairs not yet measured are measured while time remains (on a small cluster
    /// the whole matrix). The report says what the budget bought.
    #[arg(long = "budget", value_parser = parse_duration_arg)]
    pub budget: Option<std::time::Duration>,
    /// Report stragglers (nodes whose iterations spike with several partners) without
    /// failing the verdict for them.
    #[arg(long = "allow-stragglers")]
    pub allow_stragglers: bool,
    /// Fail (exit 7) when a tier's slowest group is under 0.9 x this many GB/s at the largest
    /// size: tier=GB/s, repeatable or comma-separated; tier is its name or label key.
    #[arg(long = "min-busbw-tier", value_delimiter = ',')]
    pub min_busbw_tier: Vec<String>,
    /// A link is slow when more than this fraction (and 3 MADs) below its tier's median.
    #[arg(long = "slow-fraction", default_value_t = 0.25)]
    pub slow_fraction: f64,
    /// The gate before training: after the verdict, rank 0 sets label KEY=VALUE on the
    /// Kubernetes nodes that passed and removes KEY from the nodes the verdict names (JSON
    /// merge patch through the API server; RBAC: patch nodes). Each pod's node is NODE_NAME.
    #[arg(long = "label-nodes", value_name = "KEY=VALUE")]
    pub label_nodes: Option<String>,
    /// Print the node patches of --label-nodes instead of sending them.
    #[arg(long = "label-nodes-dry-run", requires = "label_nodes")]
    pub label_nodes_dry_run: bool,
    /// Service-account directory (token, ca.crt) for the API server.
    #[arg(
        long = "k8s-service-account-dir",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount",
        hide = true
    )]
    pub service_account_dir: std::path::PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algo_accepts_nccl_spellings() {
        assert_eq!(parse_algo("ring"), Ok(Algo::Ring));
        assert_eq!(parse_algo("Tree"), Ok(Algo::Tree));
        assert_eq!(parse_algo("AUTO"), Ok(Algo::Auto));
        assert_eq!(parse_algo("rd"), Ok(Algo::Doubling));
        assert_eq!(parse_algo("Direct"), Ok(Algo::Direct));
        assert_eq!(parse_algo("ring,rd"), Ok(Algo::Auto));
        assert_eq!(parse_algo("Ring,Tree"), Ok(Algo::Auto));
        assert_eq!(parse_algo("^Tree"), Ok(Algo::Ring));
        assert_eq!(parse_algo("^ring"), Ok(Algo::Tree));
        assert!(parse_algo("collnet").unwrap_err().contains("collnet"));
        assert!(parse_algo("^ring,tree").is_err());
        assert!(parse_algo("").is_err());
    }
}
