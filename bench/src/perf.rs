//! One `*_perf` invocation: decide whether this process launches ranks or is one, run the
//! sweep, print the table on rank 0, and turn the outcome into an exit code.

use crate::cli::PerfArgs;
use crate::exit;
use crate::harness;
use crate::plan::Plan;
use crate::session::{join_rendezvous, Session};
use crate::specs::CollectiveSpec;
use anyhow::Result;
use busbw_collectives::algo::Algo;
use busbw_collectives::CommError;
use busbw_launchers::{local, LocalLaunch, StoreError, World};
use busbw_reports::{Footer, RunHeader, Sink, TextTable};

/// The nccl-tests release whose output format and semantics we reproduce.
pub const NCCL_TESTS_COMPAT: &str = "2.19.6";

pub fn main(spec: &'static CollectiveSpec, args: &PerfArgs) -> i32 {
    let plan = match Plan::new(spec, args) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("busbw: error: {msg}");
            return exit::USAGE;
        }
    };
    let world = match World::from_env() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("busbw: error: {e}");
            return exit::USAGE;
        }
    };
    match world {
        Some(w) => {
            if args.np != 1 && args.np != w.size {
                eprintln!(
                    "busbw: error: --np {} but the launcher's environment says WORLD_SIZE={}; \
                     drop --np when running under a launcher",
                    args.np, w.size
                );
                return exit::USAGE;
            }
            run_rank(w, &plan)
        }
        None if args.np == 1 => run_rank(World::single(), &plan),
        None => launch_local(args.np, &plan),
    }
}

fn launch_local(np: usize, plan: &Plan) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("busbw: error: cannot find my own executable to spawn ranks: {e}");
            return exit::INTERNAL;
        }
    };
    let launch = LocalLaunch {
        np,
        exe,
        args: std::env::args_os().skip(1).collect(),
        grace: plan.timeout,
        outcome_codes: vec![exit::WRONG_RESULTS],
    };
    match local::run(&launch) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("busbw: error: {e}");
            exit::INTERNAL
        }
    }
}

/// Exit code for a failure: a peer's death and a timeout are reported differently from our
/// own bugs, so that a nightly job can tell a bad node from a bad build.
pub fn classify(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<CommError>() {
            return match c {
                CommError::Timeout { .. } => exit::TIMEOUT,
                CommError::Aborted { .. } | CommError::Transport { .. } => exit::PEER_FAILURE,
                _ => exit::INTERNAL,
            };
        }
        if let Some(s) = cause.downcast_ref::<StoreError>() {
            return match s {
                StoreError::Timeout { .. } => exit::TIMEOUT,
                _ => exit::PEER_FAILURE,
            };
        }
    }
    exit::INTERNAL
}

/// How long a rank that saw a peer fail waits for the job to name the root cause.
const ROOT_CAUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn is_abort(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<CommError>(),
            Some(CommError::Aborted { .. })
        )
    })
}

fn run_rank(world: World, plan: &Plan) -> i32 {
    let rank = world.rank;
    let host = world.hostname.clone();
    let session = if world.size == 1 && world.master_addr.is_empty() {
        Session::single(world, plan)
    } else {
        join_rendezvous(&world, plan).and_then(|rdv| Session::join(world, rdv, plan))
    };
    let mut session = match session {
        Ok(s) => s,
        Err(e) => {
            eprintln!("busbw: rank {rank} on {host}: error: {e:#}");
            return classify(&e);
        }
    };
    match sweep(&mut session, plan) {
        Ok(code) => code,
        Err(e) => {
            let code = classify(&e);
            let echo = is_abort(&e);
            let mut msg = format!("{e:#}");
            if !echo && code != exit::INTERNAL && session.rdv.is_some() {
                // A dead peer is usually seen first on the data path ("rank 3 closed the
                // connection") although the root cause is elsewhere (rank 3 only left because
                // rank 2 died). Give the control plane a moment to deliver the job's own
                // account, so the message names the culprit, not the messenger.
                let until = std::time::Instant::now() + ROOT_CAUSE_WAIT;
                while !session.abort.is_raised() && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                if let Some(reason) = session.abort.reason() {
                    msg = format!("{msg}\n  root cause reported by the job: {reason}");
                }
            }
            eprintln!("busbw: rank {rank} on {host}: error: {msg}");
            if let Some(r) = &session.rdv {
                if !session.abort.is_raised() {
                    let _ = r.post_abort(&format!("rank {rank} on {host} failed: {e:#}"));
                }
                // Rank 0 serves the store: linger (bounded) so the others hear of the abort
                // before it disappears.
                let _ = r.finish();
            }
            code
        }
    }
}

fn sweep(session: &mut Session, plan: &Plan) -> Result<i32> {
    let rank0 = session.comm.rank() == 0;
    if let Err(msg) = plan.roots(session.comm.size()) {
        if rank0 {
            eprintln!("busbw: error: {msg}");
        }
        session.finish()?;
        return Ok(exit::USAGE);
    }
    let mut table = TextTable::new(std::io::stdout().lock());
    let header = RunHeader {
        program: plan.spec.program.into(),
        version_line: format!(
            "nccl-tests version {NCCL_TESTS_COMPAT} busbw-version={} transport={}",
            env!("CARGO_PKG_VERSION"),
            session.transport_name
        ),
        nthreads: 1,
        ngpus: 1,
        min_bytes: plan.min_bytes,
        max_bytes: plan.max_bytes,
        step: plan.step,
        warmup_iters: plan.warmup_iters,
        iters: plan.iters,
        agg_iters: plan.agg_iters,
        validation: plan.check,
        graph: 0,
        unalign: 0,
        devices: session.devices.clone(),
        extra_columns: if plan.algo == Algo::Auto {
            vec!["algo".into()]
        } else {
            vec![]
        },
    };
    if rank0 {
        table.header(&header)?;
    }
    let n = session.comm.size();
    let summary = match (plan.spec.skip)(n) {
        Some(why) => {
            if rank0 {
                table.note(&why)?;
            }
            harness::Summary::default()
        }
        None => {
            let sink: Option<&mut dyn Sink> = if rank0 { Some(&mut table) } else { None };
            harness::run(&mut session.comm, plan, sink)?
        }
    };
    let footer = Footer {
        program: plan.spec.program.into(),
        out_of_bounds: summary.out_of_bounds,
        avg_busbw: summary.avg_busbw(),
        min_busbw: plan.min_busbw,
        error: None,
    };
    if rank0 {
        table.footer(&footer)?;
    }
    session.finish()?;
    let bw_ok = footer.bandwidth_ok().unwrap_or(true);
    Ok(if summary.out_of_bounds > 0 || !bw_ok {
        exit::WRONG_RESULTS
    } else {
        exit::OK
    })
}
