//! One `*_perf` invocation: decide whether this process launches ranks or is one, run the
//! sweep, print the table on rank 0, and turn the outcome into an exit code.

use crate::cli::PerfArgs;
use crate::exit;
use crate::exports::{self, Outputs};
use crate::gpu::DeviceMem;
use crate::harness;
use crate::plan::{Plan, Split};
use crate::session::{join_rendezvous, JoinOptions, Session};
use crate::specs::CollectiveSpec;
use crate::terminal::Terminal;
use crate::threads;
use anyhow::{Context, Result};
use busbw_collectives::cuda::select::Slot;
use busbw_collectives::{CommError, ReduceOp};
use busbw_launchers::signal;
use busbw_launchers::{detect_from_env, local, DetectOptions, LocalLaunch, StoreError, World};
use busbw_reports::{Footer, RunHeader, Sink, TextTable};
use busbw_transports::Abort;
use std::sync::{Arc, Mutex};

/// The nccl-tests release whose output format and semantics we reproduce.
pub const NCCL_TESTS_COMPAT: &str = "2.19.6";

/// What a rank does once it has joined the job; returns its exit code. `Sync` because the
/// ranks of one process (`-t`, `-g`) run it on their threads.
pub type Work<'a> = &'a (dyn Fn(&mut Session, &Plan, &World) -> Result<i32> + Sync);

pub fn main(spec: &'static CollectiveSpec, args: &PerfArgs) -> i32 {
    main_with(spec, args, &|session, plan, world| {
        let slot = threads::slot(world.local_rank, plan.threads as usize, plan.gpus as usize);
        sweep(session, plan, args, slot, world)
    })
}

/// [`main`] with other per-rank work than the sweep (`busbw tiers`): the same launch,
/// rendezvous, error reporting and exit codes.
pub fn main_with(spec: &'static CollectiveSpec, args: &PerfArgs, work: Work) -> i32 {
    signal::install();
    let plan = match Plan::new(spec, args) {
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
fn run_process(world: &World, plan: &Plan, args: &PerfArgs, work: Work) -> i32 {
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
    threads::run(world, per_process, &|w| run_rank(w, plan, args, &guarded))
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

/// Exit code for a failure: a peer's death and a timeout are reported differently from our
/// own bugs, so that a nightly job can tell a bad node from a bad build.
pub fn classify(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<CommError>() {
            return match c {
                CommError::Timeout { .. } => exit::TIMEOUT,
                CommError::Aborted { .. } | CommError::Transport { .. } => exit::PEER_FAILURE,
                // What the lookup failed on (a peer that never registered, one no transport
                // reaches) decides.
                CommError::Lookup { .. } => continue,
                _ => exit::INTERNAL,
            };
        }
        if cause
            .downcast_ref::<crate::session::FlagsDiffer>()
            .is_some()
        {
            return exit::USAGE; // the fix is the command line
        }
        if cause
            .downcast_ref::<busbw_launchers::topology::SourceError>()
            .is_some()
        {
            return exit::USAGE; // a topology source as configured cannot be read
        }
        if let Some(s) = cause.downcast_ref::<StoreError>() {
            return match s {
                StoreError::Timeout { .. } => exit::TIMEOUT,
                // The fix is a setting (another --port, the right --job-token).
                StoreError::PortInUse { .. } | StoreError::WrongToken { .. } => exit::USAGE,
                _ => exit::PEER_FAILURE,
            };
        }
    }
    exit::INTERNAL
}

/// How long timed-out ranks wait for each other's reports before naming the silent ones.
const DIAGNOSE_WINDOW: std::time::Duration = std::time::Duration::from_millis(1500);

/// "peer rank P is on HOST" for an error about peer P, if the error names one.
fn peer_host(session: &Session, e: &anyhow::Error) -> Option<String> {
    let peer = e
        .chain()
        .find_map(|c| c.downcast_ref::<CommError>())
        .and_then(CommError::peer)?;
    let host = session.host_of(peer)?;
    Some(format!("peer rank {peer} is on {host}"))
}

/// After a timeout, find the ranks that actually stopped. Every rank that timed out reports
/// the peer it waited for; a rank that is waited on but reports nothing itself is dead or hung
/// (a node that vanished, a SIGSTOPped process): that is the culprit, however long the chain of
/// ranks stuck behind it. Without this, each rank would only name its own neighbour.
fn diagnose_hang(session: &Session, e: &anyhow::Error) -> Option<String> {
    let store = &session.rdv.as_ref()?.store;
    let rank = session.comm.rank();
    let peer = e
        .chain()
        .find_map(|c| c.downcast_ref::<CommError>())
        .and_then(CommError::peer)?;
    store
        .set(&format!("stuck/{rank}"), peer.to_string().as_bytes())
        .ok()?;
    std::thread::sleep(DIAGNOSE_WINDOW);
    let n = session.comm.size();
    let mut reported = vec![false; n];
    let mut waited_on: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (r, rep) in reported.iter_mut().enumerate() {
        if let Ok(Some(v)) = store.get(&format!("stuck/{r}")) {
            *rep = true;
            if let Some(p) = std::str::from_utf8(&v)
                .ok()
                .and_then(|t| t.parse::<usize>().ok())
            {
                if p < n {
                    waited_on[p].push(r);
                }
            }
        }
    }
    let silent: Vec<String> = (0..n)
        .filter(|&p| !reported[p] && !waited_on[p].is_empty())
        .map(|p| {
            let host = session.host_of(p).unwrap_or_else(|| "?".into());
            let by: Vec<String> = waited_on[p].iter().map(|r| r.to_string()).collect();
            format!("rank {p} on {host} (waited on by rank {})", by.join(", "))
        })
        .collect();
    if silent.is_empty() {
        return None;
    }
    Some(format!(
        "stopped responding: {} (it reported nothing while its peers timed out)",
        silent.join("; ")
    ))
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

/// A dead peer is usually seen first on the data path ("rank 3 closed the connection")
/// although the root cause is elsewhere (rank 3 only left because rank 2 died). Give the
/// control plane a moment to deliver the job's own account, so the message (and rank 0's
/// report) names the culprit, not the messenger. `None` for an abort (it is the account), for
/// this rank's own failure, or in a one-rank job.
fn root_cause(session: &Session, e: &anyhow::Error) -> Option<String> {
    // Our own failures (a full disk, a bug) have no other account to wait for.
    if is_abort(e) || session.rdv.is_none() || classify(e) == exit::INTERNAL {
        return None;
    }
    let until = std::time::Instant::now() + ROOT_CAUSE_WAIT;
    while !session.abort.is_raised() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    session.abort.reason()
}

fn run_rank(world: World, plan: &Plan, args: &PerfArgs, work: Work) -> i32 {
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
        crate::session::check_socket_threads(args.socket_nthreads, args.nsocks_perthread)
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
            eprintln!("busbw: rank {rank} on {host}: error: {e:#}");
            return signal::received().map_or_else(|| classify(&e), signal::exit_code);
        }
    };
    _watch.arm(session.abort.clone());
    match work(&mut session, plan, &me) {
        Ok(code) => code,
        Err(e) => {
            if let Some(r) = &session.rdv {
                r.hurry(crate::session::LEAVING);
            }
            let signalled = signal::received();
            let code = signalled.map_or_else(|| classify(&e), signal::exit_code);
            let echo = is_abort(&e);
            let mut msg = format!("{e:#}");
            let mut diagnosed = false;
            if code == exit::TIMEOUT {
                if let Some(who) = diagnose_hang(&session, &e) {
                    diagnosed = true;
                    msg = format!("{msg}\n  {who}");
                    if let Some(r) = &session.rdv {
                        let _ = r.post_abort(&format!("rank {rank} on {host} timed out: {who}"));
                    }
                }
            }
            if !echo && !diagnosed && code != exit::INTERNAL {
                if let Some(reason) = root_cause(&session, &e) {
                    msg = format!("{msg}\n  root cause reported by the job: {reason}");
                }
            }
            // The failed peer's host: an operator looks for a node, not a rank number.
            let peer_host = peer_host(&session, &e);
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

/// Turns a caught SIGTERM/SIGINT into this job's abort naming this rank, its host and the
/// signal; the data path notices the abort at its next wait, the sweep writes its reports
/// marked incomplete and the error path broadcasts the abort. A signal before the job is
/// joined (nothing measured, nothing to write) ends the process at once.
struct SignalWatch {
    armed: Arc<Mutex<Option<Abort>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl SignalWatch {
    const POLL: std::time::Duration = std::time::Duration::from_millis(20);

    fn start(rank: usize, host: String) -> SignalWatch {
        let armed: Arc<Mutex<Option<Abort>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, st) = (armed.clone(), stop.clone());
        let _ = std::thread::Builder::new()
            .name("busbw-signals".into())
            .spawn(move || {
                while !st.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(sig) = signal::received() {
                        let what = format!(
                            "rank {rank} on {host} received {} (pod eviction, job cancel or \
                             Ctrl-C): results so far are kept, marked incomplete",
                            signal::name(sig)
                        );
                        match a.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                            Some(abort) => abort.raise(what),
                            None => {
                                eprintln!(
                                    "busbw: rank {rank} on {host}: {} before the job was \
                                     joined: nothing measured, stopping",
                                    signal::name(sig)
                                );
                                std::process::exit(signal::exit_code(sig));
                            }
                        }
                        return;
                    }
                    std::thread::sleep(Self::POLL);
                }
            });
        SignalWatch { armed, stop }
    }

    fn arm(&self, abort: Abort) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some(abort);
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
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

/// `NCCL_TESTS_SPLIT`: the groups of a job of `n` ranks, as (color, members) in order of
/// color; each rank's process is its rank divided by the ranks per process, as nccl-tests
/// colors MPI processes.
pub fn split_groups(split: Split, n: usize, per_process: usize) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for r in 0..n {
        let c = split.color(r / per_process.max(1));
        match groups.iter_mut().find(|(color, _)| *color == c) {
            Some((_, members)) => members.push(r),
            None => groups.push((c, vec![r])),
        }
    }
    groups.sort_by_key(|(c, _)| *c);
    groups
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

/// This rank's split group: its index among the groups, its color and its members.
struct SplitGroup {
    index: usize,
    groups: Vec<(usize, Vec<usize>)>,
}

impl SplitGroup {
    fn color(&self) -> usize {
        self.groups[self.index].0
    }

    fn members(&self) -> &[usize] {
        &self.groups[self.index].1
    }
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
    let ranks_ok = if std::ptr::eq(plan.spec, &crate::specs::alltoallv::ALLTOALLV) {
        crate::specs::alltoallv::config().and_then(|c| c.check_ranks(n))
    } else {
        Ok(())
    };
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
    let mut dev = match plan.gpus {
        0 => None,
        _ => {
            let mut d = DeviceMem::open(slot)
                .with_context(|| format!("rank {} opening its CUDA device", session.comm.rank()))?;
            session.publish_gpu(&d.line(), plan.timeout)?;
            let path = d.choose_path(&session.comm);
            if rank0 {
                eprintln!("busbw: device buffers: {path} ({})", session.transport_name);
            }
            Some(d)
        }
    };
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
    let header = run_header(session, plan);
    if rank0 {
        table.header(&header)?;
    }
    let mut group_comm = match &split {
        Some(g) => {
            let store = match &session.rdv {
                Some(r) => r.store.clone(),
                None => Arc::new(busbw_launchers::MemoryStore::new()),
            };
            let factory = crate::session::group_factory(
                world,
                store,
                &join_options(args),
                plan.transport,
                plan.timeout,
                session.abort.clone(),
                plan.gpus > 0,
            )?;
            let nodes: Vec<usize> = g
                .members()
                .iter()
                .map(|&r| session.comm.nodes().get(r).copied().unwrap_or(r))
                .collect();
            let c = factory
                .build(&format!("split/{}", g.color()), g.members(), &nodes)
                .with_context(|| {
                    format!("building the communicator of split group {}", g.color())
                })?;
            Some(c)
        }
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
                    if rank0 {
                        let why = match root_cause(session, &e) {
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

/// `0-3,8,10-11`.
fn rank_list(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", ranks[i], ranks[j])
        } else {
            ranks[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The table header of a run on `session`'s communicator.
pub fn run_header(session: &Session, plan: &Plan) -> RunHeader {
    RunHeader {
        program: plan.spec.program.into(),
        version_line: format!(
            "nccl-tests version {NCCL_TESTS_COMPAT} busbw-version={} transport={}",
            env!("CARGO_PKG_VERSION"),
            session.transport_name
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
        devices: session.devices.clone(),
        extra_columns: if plan.algo_column {
            vec!["algo".into()]
        } else {
            vec![]
        },
    }
}

/// The table footer of a finished sweep.
pub fn footer(plan: &Plan, summary: &harness::Summary) -> Footer {
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

    #[test]
    fn split_groups_color_processes_not_ranks() {
        // 4 processes × 2 ranks (-t 2), MOD2: processes 0 and 2 together.
        let g = split_groups(Split::Mod(2), 8, 2);
        assert_eq!(g, [(0, vec![0, 1, 4, 5]), (1, vec![2, 3, 6, 7])]);
        // Colors need not be dense; groups come in color order.
        let g = split_groups(Split::Or(4), 6, 1);
        assert_eq!(
            g,
            [(4, vec![0, 4]), (5, vec![1, 5]), (6, vec![2]), (7, vec![3])]
        );
        assert_eq!(rank_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(rank_list(&[5]), "5");
    }
}
