//! One `*_perf` invocation: decide whether this process launches ranks or is one, run the
//! sweep, print the table on rank 0, and turn the outcome into an exit code.

use crate::cli::PerfArgs;
use crate::exit;
use crate::exports::{self, Outputs};
use crate::terminal::Terminal;
use anyhow::{Context, Result};
use busbw_collectives::cuda::select::Slot;
use busbw_collectives::ReduceOp;
use busbw_job::diagnose::{diagnose_hang, is_abort, peer_host, root_cause};
use busbw_job::signals::SignalWatch;
use busbw_job::split::{rank_list, split_groups, SplitGroup};
use busbw_job::{join_rendezvous, JoinOptions, Session};
use busbw_launchers::signal;
use busbw_launchers::{detect_from_env, local, DetectOptions, LocalLaunch, World};
use busbw_measure::device::DeviceMem;
use busbw_measure::plan::Engine;
use busbw_measure::report::{footer, run_header};
use busbw_measure::specs::CollectiveSpec;
use busbw_measure::{harness, Plan};
use busbw_reports::{Sink, TextTable};

/// What a rank does once it has joined the job; returns its exit code. `Sync` because the
/// ranks of one process (`-t`, `-g`) run it on their threads.
pub type RankWork<'a> = &'a (dyn Fn(&mut Session, &Plan, &World) -> Result<i32> + Sync);

pub fn main(spec: &'static CollectiveSpec, args: &PerfArgs) -> i32 {
    main_with(spec, args, &|session, plan, world| {
        let slot =
            busbw_job::threads::slot(world.local_rank, plan.threads as usize, plan.gpus as usize);
        sweep(session, plan, args, slot, world)
    })
}

/// [`main`] with other per-rank work than the sweep (`busbw tiers`): the same launch,
/// rendezvous, error reporting and exit codes.
pub fn main_with(spec: &'static CollectiveSpec, args: &PerfArgs, work: RankWork) -> i32 {
    signal::install();
    let plan = match crate::plan::from_args(spec, args) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("busbw: error: {msg}");
            return exit::USAGE;
        }
    };
    // Once per job: the process a user started (one rank, or the --np launcher's rank 0).
    let rank = std::env::var("RANK").ok();
    if rank.as_deref() == Some("0") || (rank.is_none() && args.np <= 1) {
        for n in &plan.notes {
            eprintln!("busbw: note: {n}");
        }
    }
    if let Err(msg) = crate::verbs::preflight(args, plan.timeout) {
        eprintln!("busbw: error: {msg}");
        return exit::USAGE;
    }
    if args.nproc_per_node == 0 {
        eprintln!("busbw: error: --nproc-per-node 0: each process must start at least one rank");
        return exit::USAGE;
    }
    if let Err(msg) = crate::exports::requested(&args.report) {
        eprintln!("busbw: error: {msg}");
        return exit::USAGE;
    }
    let opts = DetectOptions {
        launcher: args.launcher,
        port: args.port,
        master_addr: args.master_addr.clone(),
        host_pattern: args.host_pattern.clone(),
        world_size: args.world_size,
        ..DetectOptions::default()
    };
    let detection = match detect_from_env(&opts) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("busbw: error: {e}");
            return exit::USAGE;
        }
    };
    let token = args.job_token.as_deref();
    let Some(d) = detection else {
        if args.verbose > 0 {
            eprintln!(
                "busbw: no launcher environment found: running {} local rank(s)",
                args.np * plan.ranks_per_process()
            );
        }
        return match (args.np, args.nproc_per_node) {
            // Several ranks need a store even in one process: the local launcher serves it.
            (1, 1) if plan.ranks_per_process() > 1 => launch_local(1, &plan, token),
            (1, 1) => run_rank(World::single(), &plan, args, work),
            (1, g) | (g, 1) => launch_local(g, &plan, token),
            (np, g) => {
                eprintln!("busbw: error: --np {np} and --nproc-per-node {g}: give one of them");
                exit::USAGE
            }
        };
    };
    if args.verbose > 0 && !d.launched {
        eprintln!(
            "busbw: launcher {}: rank {} of {} (local {} of {}), rendezvous at {}:{}",
            d.source.name(),
            d.world.rank,
            d.world.size,
            d.world.local_rank,
            d.world.local_size,
            d.world.master_addr,
            d.world.master_port
        );
        for n in &d.notes {
            eprintln!("busbw:   {n}");
        }
    }
    if d.launched {
        return run_process(&d.world, &plan, args, work);
    }
    if args.np != 1 {
        eprintln!(
            "busbw: error: --np {} spawns a local job, but the {} launcher already describes one \
             (rank {} of {}); use --nproc-per-node for several ranks per process, or --launcher local",
            args.np,
            d.source.name(),
            d.world.rank,
            d.world.size
        );
        return exit::USAGE;
    }
    if args.nproc_per_node > 1 {
        return launch_pod(&d.world, args.nproc_per_node, &plan, token);
    }
    if plan.ranks_per_process() > 1 && d.world.store_addr().is_none() {
        // A one-process job described without a store address: its ranks still need one.
        return launch_local(1, &plan, token);
    }
    run_process(&d.world, &plan, args, work)
}

/// This process's ranks: itself (the common case, on the main thread, exactly as without
/// `-t`), or `-t × -g` ranks on threads of their own.
fn run_process(world: &World, plan: &Plan, args: &PerfArgs, work: RankWork) -> i32 {
    let per_process = plan.ranks_per_process();
    if per_process == 1 {
        return run_rank(world.clone(), plan, args, work);
    }
    // A panic is a bug, but in a thread it must still end the job as a failure of this rank
    // (posted to the store) rather than leave its peers waiting for -T.
    let guarded = |s: &mut Session, p: &Plan, w: &World| -> Result<i32> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(s, p, w))).unwrap_or_else(
            |panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                Err(anyhow::anyhow!("internal error (panicked): {what}"))
            },
        )
    };
    match busbw_job::threads::run(world, per_process, &|w| run_rank(w, plan, args, &guarded)) {
        Err(msg) => {
            eprintln!("busbw: error: {msg}");
            exit::USAGE
        }
        Ok(ended) => {
            let codes: Vec<i32> = ended
                .into_iter()
                .map(|(w, code)| {
                    code.unwrap_or_else(|e| {
                        eprintln!("busbw: rank {} on {}: error: {e}", w.rank, w.hostname);
                        exit::INTERNAL
                    })
                })
                .collect();
            exit::combine(&codes)
        }
    }
}

fn own_exe() -> Result<std::path::PathBuf, i32> {
    std::env::current_exe().map_err(|e| {
        eprintln!("busbw: error: cannot find my own executable to spawn ranks: {e}");
        exit::INTERNAL
    })
}

/// What busbw's exit codes mean to the local launcher: 7 is a verdict every rank reaches, 3
/// a rank's echo of another's failure.
fn exit_codes() -> local::ExitCodes {
    local::ExitCodes {
        outcome: vec![exit::WRONG_RESULTS],
        echo: vec![exit::PEER_FAILURE],
    }
}

fn launch_local(np: usize, plan: &Plan, token: Option<&str>) -> i32 {
    let exe = match own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    let launch = LocalLaunch {
        np,
        exe,
        args: crate::cli::argv()[1..].to_vec(),
        grace: plan.timeout,
        codes: exit_codes(),
        ranks_per_process: plan.ranks_per_process(),
    };
    // Without a token of the user's, a fresh random one: the ranks' loopback ports and shared
    // memory sockets are reachable by every local user, who must not be able to join.
    let generated = busbw_transports::auth::hex(&busbw_transports::auth::nonce());
    match local::run_with_token(&launch, Some(token.unwrap_or(&generated))) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("busbw: error: {e}");
            exit::INTERNAL
        }
    }
}

/// `--nproc-per-node G` under a cluster launcher: this pod's G ranks.
fn launch_pod(pod: &World, g: usize, plan: &Plan, token: Option<&str>) -> i32 {
    let exe = match own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    let args: Vec<std::ffi::OsString> = crate::cli::argv()[1..].to_vec();
    match local::run_pod(
        pod,
        g,
        &exe,
        &args,
        plan.timeout,
        &exit_codes(),
        token,
        plan.ranks_per_process(),
    ) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("busbw: error: {e}");
            exit::USAGE
        }
    }
}

fn run_rank(world: World, plan: &Plan, args: &PerfArgs, work: RankWork) -> i32 {
    if let Some(spec) = &args.socket_ifname {
        // Checked before joining, so that a typo is a usage error on the host that has it
        // rather than a peer failure everywhere else.
        if let Err(msg) = busbw_transports::iface::select(spec) {
            eprintln!(
                "busbw: rank {} on {}: error: --socket-ifname / NCCL_SOCKET_IFNAME: {msg}",
                world.rank, world.hostname
            );
            return exit::USAGE;
        }
    }
    if let Err(msg) =
        busbw_job::transport::check_socket_threads(args.socket_nthreads, args.nsocks_perthread)
    {
        eprintln!(
            "busbw: rank {} on {}: error: --socket-nthreads / --nsocks-perthread: {msg}",
            world.rank, world.hostname
        );
        return exit::USAGE;
    }
    let rank = world.rank;
    let host = world.hostname.clone();
    let me = world.clone();
    let _watch = SignalWatch::start(rank, host.clone());
    let session = if world.size == 1 && world.master_addr.is_empty() {
        Session::single(world, plan)
    } else {
        let opts = join_options(args);
        join_rendezvous(&world, plan, &opts).and_then(|rdv| Session::join(world, rdv, plan, &opts))
    };
    let mut session = match session {
        Ok(s) => s,
        Err(e) => {
            let e = anyhow::Error::new(e);
            eprintln!("busbw: rank {rank} on {host}: error: {e:#}");
            return signal::received().map_or_else(|| exit::classify(&e), signal::exit_code);
        }
    };
    _watch.arm(session.abort.clone());
    match work(&mut session, plan, &me) {
        Ok(code) => code,
        Err(e) => {
            if let Some(r) = &session.rdv {
                r.hurry(busbw_job::LEAVING);
            }
            let signalled = signal::received();
            let code = signalled.map_or_else(|| exit::classify(&e), signal::exit_code);
            let echo = is_abort(e.as_ref());
            let mut msg = format!("{e:#}");
            let mut diagnosed = false;
            if code == exit::TIMEOUT {
                if let Some(who) = diagnose_hang(&session, e.as_ref()) {
                    diagnosed = true;
                    msg = format!("{msg}\n  {who}");
                    if let Some(r) = &session.rdv {
                        let _ = r.post_abort(&format!("rank {rank} on {host} timed out: {who}"));
                    }
                }
            }
            // A rank's own failure (a bug, a setup problem such as a host without a GPU) has
            // no other account to wait for.
            if !echo && !diagnosed && code != exit::INTERNAL && code != exit::USAGE {
                if let Some(reason) =
                    root_cause(&session, e.as_ref(), exit::classify(&e) == exit::INTERNAL)
                {
                    msg = format!("{msg}\n  root cause reported by the job: {reason}");
                }
            }
            // The failed peer's host: an operator looks for a node, not a rank number.
            let peer_host = peer_host(&session, e.as_ref());
            if let Some(p) = &peer_host {
                msg = format!("{msg}\n  {p}");
            }
            eprintln!("busbw: rank {rank} on {host}: error: {msg}");
            if let Some(r) = &session.rdv {
                if signalled.is_some() {
                    // Our own abort: tell the others at once, in our words.
                    if let Some(reason) = session.abort.reason() {
                        let _ = r.post_abort(&reason);
                    }
                } else if !session.abort.is_raised() {
                    let peer = peer_host.map(|p| format!(" ({p})")).unwrap_or_default();
                    let _ = r.post_abort(&format!("rank {rank} on {host} failed: {e:#}{peer}"));
                }
                // Rank 0 serves the store: linger (bounded) so the others hear of the abort
                // before it disappears.
                let _ = r.finish();
            }
            code
        }
    }
}

pub(crate) fn join_options(args: &PerfArgs) -> JoinOptions {
    JoinOptions {
        token: args.job_token.clone(),
        socket_ifname: args.socket_ifname.clone(),
        ib_hca: args.ib_hca.clone(),
        socket_nthreads: args.socket_nthreads,
        nsocks_perthread: args.nsocks_perthread,
    }
}

/// One line per distinct objection: as it was said when every rank said it, else prefixed
/// with the ranks that said it.
fn usage_lines(objections: &[(usize, String)], size: usize) -> Vec<String> {
    let mut by_text: Vec<(&str, Vec<usize>)> = Vec::new();
    for (rank, text) in objections {
        match by_text.iter_mut().find(|(t, _)| t == text) {
            Some((_, ranks)) => ranks.push(*rank),
            None => by_text.push((text, vec![*rank])),
        }
    }
    by_text
        .into_iter()
        .map(|(text, ranks)| {
            if ranks.len() == size {
                text.to_string()
            } else {
                let who = match ranks.as_slice() {
                    [r] => format!("rank {r}"),
                    _ => format!("ranks {}", busbw_launchers::rendezvous::fold_ranges(&ranks)),
                };
                format!("{who}: {text}")
            }
        })
        .collect()
}

/// `-g`: this rank's device, on the engine the plan names, and the header's `Data path`
/// line (rank 0 also prints it). `None` for host memory. A job of several hosts on busbw's
/// own engine first gets its node and rail communicators (`busbw_job::hosts`), so that a
/// host's device bytes go GPU to GPU; under `NCCL_TESTS_SPLIT` the groups' communicators,
/// which carry the data, get theirs where they are built (`SplitGroup::communicator`).
pub(crate) fn open_device(
    session: &mut Session,
    (world, opts): (&World, &JoinOptions),
    plan: &Plan,
    slot: Slot,
    split: Option<&SplitGroup>,
) -> Result<(Option<DeviceMem>, Option<String>)> {
    match (plan.gpus, plan.engine) {
        (0, _) => Ok((None, None)),
        (_, Engine::Nccl) => {
            let (d, path) = nccl_device(session, plan, slot, split)?;
            Ok((Some(d), Some(path)))
        }
        _ => {
            let rank = session.comm.rank();
            let mut d = DeviceMem::open(slot)
                .with_context(|| format!("rank {rank} opening its CUDA device"))?;
            session.publish_gpu(&d.line(), plan.timeout)?;
            let unsplit = match split {
                None => busbw_job::hosts::give_hierarchy(session, world, opts, plan)
                    .with_context(|| format!("rank {rank} splitting the job by host and rail"))?,
                Some(_) => None,
            };
            let mut path = format!(
                "{} ({})",
                d.choose_path(&mut session.comm)?,
                session.transport_name
            );
            if let Some(why) = unsplit {
                path += &format!("; not split by host: {why}");
            }
            if session.comm.rank() == 0 {
                eprintln!("busbw: device buffers: {path}");
            }
            Ok((Some(d), Some(format!("own engine, device buffers {path}"))))
        }
    }
}

/// `--engine nccl`: this rank's device (when the host has CUDA), then NCCL's communicator
/// joined through the store (rank 0's unique id), split into the job's groups under
/// `NCCL_TESTS_SPLIT`. Returns the device and the data path line of the header.
fn nccl_device(
    session: &mut Session,
    plan: &Plan,
    slot: Slot,
    split: Option<&SplitGroup>,
) -> Result<(DeviceMem, String)> {
    let rank = session.comm.rank();
    let nccl = busbw_collectives::nccl::Nccl::global()?;
    let version = nccl.version()?;
    if rank == 0 {
        eprintln!(
            "busbw: engine: NCCL {version} from {}; rank 0's unique id goes to every rank \
             through busbw's store",
            nccl.path()
        );
    }
    // Without a driver the join is still tried: NCCL then says why in its own words.
    let (dev, cuda) = match busbw_collectives::cuda::probe() {
        Ok(_) => {
            let d = DeviceMem::open(slot)
                .with_context(|| format!("rank {rank} opening its CUDA device"))?;
            d.bind()
                .with_context(|| format!("rank {rank} making its CUDA device current"))?;
            (Some(d), None)
        }
        Err(e) => (None, Some(e.to_string())),
    };
    let joined =
        busbw_job::nccl::join(session, plan.timeout, cuda).map_err(busbw_job::Error::from)?;
    let Some(mut d) = dev else {
        anyhow::bail!("rank {rank}: NCCL joined without a CUDA device on this host");
    };
    d.use_nccl(joined.comm, plan.timeout);
    if let Some(g) = split {
        let key = g.members().iter().position(|&m| m == rank).unwrap_or(0);
        d.split_nccl(Some(g.color()), key, g.members().len())
            .with_context(|| format!("rank {rank}"))?;
    }
    session.publish_gpu(&d.line(), plan.timeout)?;
    let path = format!(
        "NCCL {version} ({}), device buffers; NCCL chooses its own transports and algorithms \
         (unique id {})",
        nccl.path(),
        joined.digest
    );
    if rank == 0 {
        eprintln!("busbw: device buffers: {path}");
    }
    Ok((d, path))
}

fn sweep(
    session: &mut Session,
    plan: &Plan,
    args: &PerfArgs,
    slot: Slot,
    world: &World,
) -> Result<i32> {
    let rank0 = session.comm.rank() == 0;
    let split = plan.split.map(|s| {
        let groups = split_groups(s, session.comm.size(), plan.ranks_per_process());
        let rank = session.comm.rank();
        let index = groups
            .iter()
            .position(|(_, m)| m.contains(&rank))
            .unwrap_or_default();
        SplitGroup { index, groups }
    });
    // Roots, sizes and skips are the group's when the job is split.
    let n = split
        .as_ref()
        .map_or(session.comm.size(), |g| g.members().len());
    let ranks_ok = (plan.spec.ranks_ok)(n);
    // Each rank judges its own group; all learn every verdict, so none leaves while another
    // still waits for it (which would turn a usage error into a peer failure).
    let mine = ranks_ok.and_then(|()| plan.roots(n).map(|_| ())).err();
    let objections = session.objections(mine.as_deref(), plan.timeout)?;
    if !objections.is_empty() {
        if rank0 {
            for line in usage_lines(&objections, session.comm.size()) {
                eprintln!("busbw: error: {line}");
            }
        }
        session.finish()?;
        return Ok(exit::USAGE);
    }
    let roots = plan.roots(n).map_or(1, |r| r.len());
    let rows = (plan.dtypes.len() * plan.ops.len() * roots * plan.sizes.len()) as u64;
    let total = (plan.cycles > 0).then(|| rows * u64::from(plan.cycles));
    let term = Terminal::new(&args.report, total, plan.spec.program, rank0);
    // Only rank 0 prints; the others must not hold stdout's lock, which ranks on threads of
    // rank 0's process would otherwise keep from it for the whole sweep.
    let out: Box<dyn std::io::Write> = if rank0 {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::io::sink())
    };
    let mut table = Outputs {
        table: TextTable::new(out),
        term,
        exports: None,
    };
    if rank0 {
        table.exports = exports::for_run(&args.report, plan, session, &mut table.table)?;
    }
    // -g: open this rank's device before the header, which names every rank's GPU.
    let opts = join_options(args);
    let (mut dev, data_path) = open_device(session, (world, &opts), plan, slot, split.as_ref())?;
    if let (Some(g), Some(s)) = (&split, plan.split) {
        for d in &mut session.devices {
            d.group = s.color(d.rank / plan.ranks_per_process().max(1));
        }
        if rank0 {
            let sizes: Vec<String> = g.groups.iter().map(|(_, m)| m.len().to_string()).collect();
            eprintln!(
                "busbw: split {s}: {} groups of {} ranks run at once; the table is group {}'s",
                g.groups.len(),
                sizes.join("/"),
                g.color()
            );
        }
    }
    let mut header = run_header(plan, session.devices.clone(), &session.transport_name);
    header.data_path = data_path;
    if rank0 {
        table.header(&header)?;
    }
    // A group's own communicator; under NCCL it carries the harness's barriers and times,
    // and the data goes on NCCL's split of the job (nccl_device).
    let mut group_comm = match &split {
        Some(g) => Some(g.communicator(session, world, &opts, plan)?),
        None => None,
    };
    // The debugging faults name world ranks; the group's harness numbers its own.
    let in_group = |r: Option<usize>| {
        let g = split.as_ref()?;
        g.members().iter().position(|&m| Some(m) == r)
    };
    let group_plan = split.as_ref().map(|_| Plan {
        corrupt_rank: in_group(plan.corrupt_rank),
        fail_rank: in_group(plan.fail_rank),
        ..plan.clone()
    });
    let plan = group_plan.as_ref().unwrap_or(plan);
    let summary = match (plan.spec.skip)(n) {
        Some(why) => {
            if rank0 {
                table.note(&why)?;
            }
            harness::Summary::default()
        }
        None => {
            let sink: Option<&mut dyn Sink> = if rank0 { Some(&mut table) } else { None };
            let comm = group_comm.as_mut().unwrap_or(&mut session.comm);
            match harness::run_with(comm, plan, sink, dev.as_mut()) {
                Ok(s) => s,
                Err(e) => {
                    let e = anyhow::Error::new(e);
                    if rank0 {
                        let why = match root_cause(
                            session,
                            e.as_ref(),
                            exit::classify(&e) == exit::INTERNAL,
                        ) {
                            Some(cause) => {
                                format!("{e:#}; root cause reported by the job: {cause}")
                            }
                            None => format!("{e:#}"),
                        };
                        table.fail(&why);
                    }
                    return Err(e);
                }
            }
        }
    };
    drop(group_comm);
    let mut out_of_bounds = summary.out_of_bounds;
    if let Some(g) = &split {
        out_of_bounds = split_summary(session, g, &summary, rank0.then_some(&mut table))?;
    }
    let footer = footer(plan, &summary);
    if rank0 {
        table.footer(&footer)?;
    }
    session.finish()?;
    let bw_ok = footer.bandwidth_ok().unwrap_or(true);
    Ok(if out_of_bounds > 0 || !bw_ok {
        exit::WRONG_RESULTS
    } else {
        exit::OK
    })
}

/// After a split run: every group's figures to rank 0, which prints one line per group
/// (nccl-tests prints only its own group's table; the others' results would be lost), and
/// the job's total of wrong cells, which fails the job whichever group had them.
fn split_summary(
    session: &mut Session,
    g: &SplitGroup,
    summary: &harness::Summary,
    table: Option<&mut Outputs<impl std::io::Write>>,
) -> Result<u64> {
    let k = g.groups.len();
    let mut v = vec![0.0f64; 2 * k];
    // The group's rank 0 (its lowest world rank) speaks for it.
    if g.members().first() == Some(&session.comm.rank()) {
        v[2 * g.index] = summary.avg_busbw();
        v[2 * g.index + 1] = summary.out_of_bounds as f64;
    }
    busbw_collectives::all_reduce_values(&mut session.comm, &mut v, ReduceOp::Sum)
        .context("gathering the split groups' results")?;
    if let Some(t) = table {
        for (i, (color, members)) in g.groups.iter().enumerate() {
            t.note(&format!(
                "# Group {color:>2} ({} ranks: {}): Avg bus bandwidth {}, out of bounds values {}",
                members.len(),
                rank_list(members),
                busbw_reports::fmt::c_g(v[2 * i]),
                v[2 * i + 1]
            ))?;
        }
    }
    Ok((0..k).map(|i| v[2 * i + 1] as u64).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_lines_name_the_ranks_only_when_not_all_said_it() {
        let all: Vec<(usize, String)> = (0..3).map(|r| (r, "too small".into())).collect();
        assert_eq!(usage_lines(&all, 3), ["too small"]);
        let some = [
            (4, "4 ranks, matrix 3".to_string()),
            (5, "4 ranks, matrix 3".to_string()),
            (6, "4 ranks, matrix 3".to_string()),
            (9, "root 5".to_string()),
        ];
        assert_eq!(
            usage_lines(&some, 10),
            ["ranks 4-6: 4 ranks, matrix 3", "rank 9: root 5"]
        );
    }
}
