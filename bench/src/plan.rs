//! From flags to a checked [`Plan`]. Everything a user can get wrong is caught here, before
//! any rank connects, with a message that says which flag to change.

use crate::cli::{Choice, PerfArgs};
use busbw_collectives::select::Algo;
use busbw_collectives::{DataType, ReduceOp};
use busbw_measure::plan::{Average, Engine, Split, MAX_RANKS_PER_PROCESS, MAX_UNALIGN};
use busbw_measure::specs::{CollectiveSpec, Redop};
use busbw_measure::{sizes, Plan};
use busbw_reports::Step;
use std::time::Duration;

pub fn from_args(spec: &'static CollectiveSpec, a: &PerfArgs) -> Result<Plan, String> {
    if a.min_bytes > a.max_bytes {
        return Err(format!(
            "-b {} is larger than -e {}: the smallest size must not exceed the largest",
            a.min_bytes, a.max_bytes
        ));
    }
    if a.step_factor == 0 {
        return Err("-f 0 is invalid: use 1 for additive steps (-i) or > 1 to multiply".into());
    }
    if a.step_factor <= 1 && a.step_bytes == 0 {
        return Err(
            "-i 0 with -f 1 never advances the size (the sweep would not end): give -i > 0 or -f > 1".into(),
        );
    }
    if a.step_factor > 1 && a.min_bytes == 0 && a.max_bytes > 0 {
        return Err("-b 0 with -f > 1 never grows: start the sweep at -b 1 or more".into());
    }
    if a.iters == 0 {
        return Err("-n 0: at least one timed iteration is needed".into());
    }
    if a.agg_iters == 0 {
        return Err("-m 0: at least one operation per iteration is needed".into());
    }
    if a.nthreads == 0 {
        return Err("-t 0: a process needs at least one thread (rank)".into());
    }
    let gpus = engine_gpus(a)?;
    let per_process = u64::from(a.nthreads) * u64::from(gpus.max(1));
    if per_process > MAX_RANKS_PER_PROCESS as u64 {
        return Err(format!(
            "-t {} with -g {gpus}: {per_process} ranks in one process; busbw runs an OS \
             thread, a communicator and buffers per rank and allows at most \
             {MAX_RANKS_PER_PROCESS} per process: start more processes (--np, \
             --nproc-per-node or your launcher)",
            a.nthreads
        ));
    }
    if gpus >= 1 && !cfg!(feature = "cuda") {
        return Err(busbw_measure::device::NO_CUDA_BUILD.into());
    }
    if gpus >= 1 && a.engine == Engine::Own {
        // Before any rank starts: a host without the driver is a setup problem to name
        // once, not a failure of every rank. (NCCL's ranks still try to join without one,
        // so that the error is NCCL's own: `busbw_job::nccl`.)
        busbw_collectives::cuda::probe().map_err(|e| e.to_string())?;
    }
    if a.np == 0 {
        return Err("--np 0: at least one rank is needed".into());
    }
    if let Some(bw) = a.min_busbw {
        if !bw.is_finite() || bw < 0.0 {
            return Err(format!(
                "--min-busbw / NCCL_TESTS_MIN_BW = {bw} must be a non-negative number of GB/s"
            ));
        }
    }
    let sizes = sizes::sweep(a.min_bytes, a.max_bytes, a.step_bytes, a.step_factor);
    let step = if a.step_factor > 1 {
        Step::Factor(a.step_factor)
    } else {
        Step::Bytes(a.step_bytes)
    };
    let dtypes = match &a.dtype {
        Choice::All => DataType::ALL.to_vec(),
        Choice::One(d) => vec![*d],
    };
    let ops = match (&a.op, spec.redop) {
        (_, Redop::Fixed(_)) => vec![ReduceOp::Sum],
        (Choice::All, _) => ReduceOp::ALL.to_vec(),
        (Choice::One(o), _) => vec![*o],
    };
    if a.root < -1 {
        return Err(format!(
            "-r {}: give a rank number, or -1 for every rank",
            a.root
        ));
    }
    let average = match a.average {
        0 => Average::Rank0,
        2 => Average::Min,
        3 => Average::Max,
        _ => Average::Mean,
    };
    let timeout = Duration::from_secs(if a.timeout == 0 { 300 } else { a.timeout });
    let (per_iter, blocking, notes) = nccl_tests_checks(a, gpus)?;
    let split = Split::from_env(|k| std::env::var(k).ok())?;
    let mut notes = notes;
    // The collective's own settings (alltoallv's pattern or matrix), read once before any
    // rank starts so that a bad one is a usage error here.
    notes.extend((spec.prepare)(a.min_bytes == a.max_bytes)?);
    // The kernels read it themselves and would ignore a misspelling: say so here.
    if let Ok(v) = std::env::var(busbw_collectives::element::SIMD_ENV) {
        if let Err(e) = v.parse::<busbw_collectives::element::Simd>() {
            return Err(format!(
                "{}: {e}; unset it to use the best tier this CPU runs",
                busbw_collectives::element::SIMD_ENV
            ));
        }
    }
    if !(0..=MAX_UNALIGN).contains(&a.unalign) {
        return Err(format!(
            "-u {}: the shift is a count of elements from 0 to {MAX_UNALIGN}",
            a.unalign
        ));
    }
    Ok(Plan {
        spec,
        min_bytes: a.min_bytes,
        max_bytes: a.max_bytes,
        step,
        warmup_sizes: sizes::warmup_sizes(a.min_bytes, a.max_bytes),
        sizes,
        iters: a.iters,
        warmup_iters: a.warmup_iters,
        agg_iters: a.agg_iters,
        check: a.check,
        dtypes,
        ops,
        root: a.root,
        algo: match a.algo {
            _ if !spec.algos || a.engine == Engine::Nccl => Algo::Ring,
            Some(algo) => algo,
            None => Algo::Auto,
        },
        algo_column: spec.algos && a.algo == Some(Algo::Auto) && a.engine == Engine::Own,
        transport: a.transport,
        average,
        cycles: a.run_cycles,
        timeout,
        min_busbw: a.min_busbw,
        corrupt_rank: a.debug_corrupt_rank,
        fail_rank: a.debug_fail_rank,
        threads: a.nthreads,
        gpus,
        engine: a.engine,
        per_iter,
        cputime: a.report_cputime != 0,
        timestamps: a.report_timestamps != 0,
        in_place: true,
        blocking,
        unalign: a.unalign as u32,
        rotation: a.rotate,
        memory_report: a.memory != 0,
        parallel_init: a.parallel_init != 0,
        split,
        notes,
    })
}

/// The usage error of `--engine nccl` in a build without CUDA.
pub const NO_NCCL_BUILD: &str = "--engine nccl runs NCCL on CUDA device buffers, which this \
build lacks: rebuild with `cargo build --release --features cuda` (no CUDA toolkit or NCCL \
needed to build; libnccl.so.2 is opened at run time), or drop --engine nccl to run busbw's own \
engine";

/// `-g` as the engine needs it: NCCL runs on device buffers, one GPU per rank unless `-g`
/// says more; its library is opened here, so that a missing one is a usage error before any
/// rank starts.
fn engine_gpus(a: &PerfArgs) -> Result<u32, String> {
    match a.engine {
        Engine::Own => Ok(a.ngpus.unwrap_or(0)),
        Engine::Nccl => {
            if !cfg!(feature = "cuda") {
                return Err(NO_NCCL_BUILD.into());
            }
            if a.ngpus == Some(0) {
                return Err(
                    "--engine nccl with -g 0: NCCL runs on CUDA device buffers; drop \
                            -g 0 (nccl uses -g 1 unless told more)"
                        .into(),
                );
            }
            busbw_collectives::nccl::Nccl::global().map_err(|e| e.to_string())?;
            Ok(a.ngpus.unwrap_or(1))
        }
    }
}

/// nccl-tests' cross-checks of `-I`, `-K`, `-z`, `-G`, `-D`/`-R` (the same outcomes: an
/// error for `-D` without `-R 2`, a flag turned off with a message for the others), and a note
/// for each flag that only means something to NCCL on GPUs. Returns `-I`'s setting
/// (`Some(K)`) and `-z`'s.
fn nccl_tests_checks(a: &PerfArgs, gpus: u32) -> Result<(Option<u32>, u8, Vec<String>), String> {
    let mut notes = Vec::new();
    // nccl-tests takes any number and acts on 1, 2 and 3 (other values wait without a
    // header line saying so); busbw refuses what it would not explain.
    let mut blocking = match a.blocking {
        0..=3 => a.blocking as u8,
        z => {
            return Err(format!(
                "-z {z}: blocking mode is 0 (off), 1 (wait and barrier after each operation), \
                 2 (wait only) or 3 (barrier after each iteration, not timed)"
            ))
        }
    };
    if blocking == 3 && a.cudagraph >= 1 {
        notes.push(
            "blocking mode (-z 3) is incompatible with CUDA graph mode (-G). Disabling.".into(),
        );
        blocking = 0;
    }
    if a.device_implementation > 0 && a.local_register != 2 {
        return Err(
            "device implementation (-D > 0) requires enabling symmetric memory registration (-R 2)"
                .into(),
        );
    }
    let mut per_iter = a.per_iter_timing;
    if per_iter != 0 && per_iter != 1 {
        notes.push("per-iteration timing (-I) only supports 0=off or 1=on. Disabling.".into());
        per_iter = 0;
    }
    if per_iter != 0 && a.cudagraph >= 1 {
        notes.push(
            "per-iteration timing (-I) is incompatible with CUDA graph mode (-G). Disabling."
                .into(),
        );
        per_iter = 0;
    }
    let mut skip = a.per_iter_skip;
    if skip < 0 || skip >= i64::from(a.iters) {
        notes.push(format!(
            "per-iteration skip (-K) must be between 0 and {}. Disabling.",
            i64::from(a.iters) - 1
        ));
        skip = 0;
    }
    if skip != 0 && per_iter == 0 {
        notes.push(
            "per-iteration skip (-K) requires per-iteration timing (-I 1). Disabling.".into(),
        );
        skip = 0;
    }
    // Flags for NCCL's GPU machinery: busbw's engine has no stream, graph, NCCL registration,
    // CTA or device kernel to apply them to.
    let gpu_only = [
        ("-y/--stream_null", a.stream_null != 0),
        ("-G/--cudagraph", a.cudagraph != 0),
        ("-R/--local_register", a.local_register != 0),
        ("-x/--cta_policy", a.cta_policy.is_some()),
        ("-D/--device_implementation", a.device_implementation != 0),
        ("-V/--device_cta_count", a.device_cta_count != 16),
    ];
    for (flag, given) in gpu_only {
        if given {
            let on = if gpus > 0 {
                "busbw's CUDA buffers (it runs no NCCL kernels)"
            } else {
                "host buffers"
            };
            notes.push(format!("{flag} does not apply to {on}; ignored"));
        }
    }
    Ok(((per_iter == 1).then_some(skip as u32), blocking, notes))
}
