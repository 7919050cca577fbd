//! The table's header and footer of a run, from its plan and what the job knows of its
//! ranks: one definition for `*_perf` runs and `busbw tiers`.

use crate::harness::Summary;
use crate::plan::Plan;
use busbw_reports::{DeviceInfo, Footer, RunHeader};

/// The nccl-tests release whose output format and semantics we reproduce.
pub const NCCL_TESTS_COMPAT: &str = "2.19.6";

/// The header of a run on a communicator whose ranks `devices` describes (rank 0's copy),
/// joined through `transport` (`--transport` as given, or `inproc`).
pub fn run_header(plan: &Plan, devices: Vec<DeviceInfo>, transport: &str) -> RunHeader {
    RunHeader {
        program: plan.spec.program.into(),
        version_line: format!(
            "nccl-tests version {NCCL_TESTS_COMPAT} busbw-version={} transport={transport}",
            env!("CARGO_PKG_VERSION"),
        ),
        nthreads: plan.threads,
        ngpus: plan.gpus.max(1),
        min_bytes: plan.min_bytes,
        max_bytes: plan.max_bytes,
        step: plan.step,
        warmup_iters: plan.warmup_iters,
        iters: plan.iters,
        agg_iters: plan.agg_iters,
        validation: plan.check,
        graph: 0,
        unalign: plan.unalign,
        per_iter: plan.per_iter,
        cputime: plan.cputime,
        timestamps: plan.timestamps,
        blocking: plan.blocking,
        parallel_init: plan.parallel_init,
        devices,
        extra_columns: if plan.algo_column {
            vec!["algo".into()]
        } else {
            vec![]
        },
    }
}

/// The footer of a finished sweep.
pub fn footer(plan: &Plan, summary: &Summary) -> Footer {
    Footer {
        program: plan.spec.program.into(),
        out_of_bounds: summary.out_of_bounds,
        avg_busbw: summary.avg_busbw(),
        min_busbw: plan.min_busbw,
        error: None,
        memory: summary.memory.clone(),
    }
}
