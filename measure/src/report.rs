//! The table's header and footer of a run, from its plan and what the job knows of its
//! ranks: one definition for `*_perf` runs and `busbw tiers`.

use crate::harness::Summary;
use crate::plan::{Engine, Plan};
use busbw_reports::{DeviceInfo, Footer, RunHeader};

/// The nccl-tests release whose output format and semantics we reproduce.
pub const NCCL_TESTS_COMPAT: &str = "2.19.6";

/// The header of a run on a communicator whose ranks `devices` describes (rank 0's copy),
/// joined through `transport` (`--transport` as given, or `inproc`).
pub fn run_header(plan: &Plan, devices: Vec<DeviceInfo>, transport: &str) -> RunHeader {
    RunHeader {
        program: plan.spec.program.into(),
        version_line: format!(
            "nccl-tests version {NCCL_TESTS_COMPAT} busbw-version={} transport={transport}{}",
            env!("CARGO_PKG_VERSION"),
            engine_words(plan),
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
        data_path: None,
        extra_columns: if plan.algo_column {
            vec!["algo".into()]
        } else {
            vec![]
        },
    }
}

/// What the version line adds for `--engine nccl`: NCCL's version code, as nccl-tests
/// prints `nccl-library=`; nothing for busbw's own engine.
fn engine_words(plan: &Plan) -> String {
    match plan.engine {
        Engine::Own => String::new(),
        Engine::Nccl => match busbw_collectives::nccl::Nccl::global().and_then(|n| n.version()) {
            Ok(v) => format!(" engine=nccl nccl-library={}", v.code()),
            Err(_) => " engine=nccl".into(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_collectives::nccl::{Nccl, LIBRARY_ENV};

    #[test]
    fn the_version_line_names_nccls_library_for_the_nccl_engine() {
        let own = Plan::defaults(crate::specs::find("all_reduce").expect("all_reduce"));
        let line = run_header(&own, Vec::new(), "shm").version_line;
        assert!(
            line.ends_with("transport=shm"),
            "busbw's engine adds nothing: {line}"
        );
        let wheel = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/nccl/nvidia/nccl/lib/libnccl.so.2"
        );
        let lib = match std::env::var(LIBRARY_ENV) {
            Ok(p) => p,
            Err(_) if std::path::Path::new(wheel).exists() => {
                // The process's library is opened once, from this variable.
                std::env::set_var(LIBRARY_ENV, wheel);
                wheel.to_string()
            }
            Err(_) => {
                eprintln!("skip: no NCCL library ({LIBRARY_ENV} unset, no target/nccl; .ci/run unpacks the nvidia-nccl-cu12 wheel)");
                return;
            }
        };
        let code = Nccl::open_path(&lib)
            .and_then(|n| n.version())
            .expect("NCCL loads")
            .code();
        let nccl = Plan {
            engine: Engine::Nccl,
            ..own
        };
        let line = run_header(&nccl, Vec::new(), "shm").version_line;
        assert!(
            line.ends_with(&format!("transport=shm engine=nccl nccl-library={code}")),
            "{line}"
        );
    }
}
