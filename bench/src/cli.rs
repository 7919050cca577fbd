//! Command line. Flags, defaults and meanings follow nccl-tests (`-b -e -i -f -n -w -c -o -d
//! -a -N -T ...`) so that existing runbooks work unchanged; `--np` and `--min-busbw` are ours.

use crate::sizes::parse_size;
use busbw_collectives::{DataType, ReduceOp};
use clap::{Args, Parser, Subcommand};

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
7 wrong data or average busbw under --min-busbw / NCCL_TESTS_MIN_BW."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// AllReduce bandwidth and correctness sweep (ring: reduce-scatter + all-gather).
    #[command(name = "all_reduce_perf", visible_alias = "all_reduce")]
    AllReducePerf(PerfArgs),
}

impl Command {
    pub fn program(&self) -> &'static str {
        match self {
            Command::AllReducePerf(_) => "all_reduce_perf",
        }
    }
    pub fn args(&self) -> &PerfArgs {
        match self {
            Command::AllReducePerf(a) => a,
        }
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

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
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
    /// Reduction: sum, prod, max, min, avg, or all.
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = parse_op)]
    pub op: Choice<ReduceOp>,
    /// Data type: int8 uint8 int32 uint32 int64 uint64 float double, or all.
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_dtype)]
    pub dtype: Choice<DataType>,
    /// How per-rank times are combined: 0 rank 0's own, 1 mean, 2 min, 3 max.
    #[arg(short = 'a', long = "average", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: u8,
    /// Repeat the whole sweep N times (0: until interrupted).
    #[arg(short = 'N', long = "run_cycles", default_value_t = 1)]
    pub run_cycles: u32,
    /// Seconds any wait may go without progress before the rank fails naming the peer it
    /// waited for. 0 selects the default: busbw never waits forever.
    #[arg(short = 'T', long = "timeout", default_value_t = 300)]
    pub timeout: u64,
    /// Threads per process (nccl-tests compatibility; only 1 is supported).
    #[arg(short = 't', long = "nthreads", default_value_t = 1)]
    pub nthreads: u32,
    /// GPUs per thread (nccl-tests compatibility; only 1 is supported).
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    pub ngpus: u32,
    /// Root rank for rooted collectives (ignored by all_reduce, which prints -1).
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: i64,
    /// Spawn this many local ranks on 127.0.0.1 (1: run in this process).
    #[arg(long = "np", default_value_t = 1)]
    pub np: usize,
    /// Fail (exit 7) when the average bus bandwidth is below 0.9 × this many GB/s.
    #[arg(long = "min-busbw", env = "NCCL_TESTS_MIN_BW")]
    pub min_busbw: Option<f64>,
    /// Test hook: corrupt one result element on this rank after each validation run.
    #[arg(long = "debug-corrupt-rank", hide = true)]
    pub debug_corrupt_rank: Option<usize>,
}
