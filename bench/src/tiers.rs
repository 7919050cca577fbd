//! `busbw tiers` in the binary: its flags, the timed sweep it lends the tier run (the
//! harness, the main table, the export files) and the exit code. What runs where, and the
//! verdict, are the `busbw-tiers` crate's.

use crate::cli::TiersArgs;
use crate::cli_report::ReportArgs;
use crate::exit;
use crate::exports;
use crate::perf;
use anyhow::{Context, Result};
use busbw_collectives::Communicator;
use busbw_job::{JoinOptions, Session};
use busbw_launchers::topology::{node_labels::NodeLabel, Preset, Source, SourceConfig};
use busbw_launchers::{MemoryStore, Store, World};
use busbw_measure::device::DeviceMem;
use busbw_measure::report::{footer, run_header};
use busbw_measure::Plan;
use busbw_measure::Summary;
use busbw_reports::export::ExportSink;
use busbw_reports::{Footer, Measured, Row, RunHeader, Sink, TextTable};
use busbw_tiers::{gate, Collect, Job, Sweep, Topology};
use std::collections::BTreeSet;
use std::io::{StdoutLock, Write};
use std::sync::Arc;

/// `busbw tiers` flags, checked.
struct Options {
    tiers: busbw_tiers::Options,
    /// The report flags: the same exporters as a `*_perf` run, with the tiers in the record.
    report: ReportArgs,
    /// --label-nodes and whether it is a dry run.
    label_nodes: Option<(NodeLabel, bool)>,
    join: JoinOptions,
    verbose: bool,
}

/// `started`: when the gate began (its `--budget` counts from there).
fn options(t: &TiersArgs, started: std::time::Instant) -> Result<Options, String> {
    let mut preset: Preset = t.preset.parse()?;
    if let Preset::Custom(keys) = &mut preset {
        *keys = t.keys.iter().map(|k| k.trim().to_string()).collect();
        preset.resolve(&BTreeSet::new())?;
    } else if !t.keys.is_empty() {
        return Err(format!(
            "--topology-keys needs --topology-preset custom (the preset is {})",
            t.preset
        ));
    }
    let sources = match &t.source {
        Some(s) => Source::parse_list(s)?,
        None if t.file.is_some() => vec![Source::Env, Source::File],
        None => vec![Source::Env],
    };
    if sources.contains(&Source::File) && t.file.is_none() {
        return Err("--topology-source file needs --topology-file PATH".into());
    }
    let mut thresholds = Vec::new();
    for item in &t.min_busbw_tier {
        let (tier, bw) = item
            .rsplit_once('=')
            .ok_or_else(|| format!("--min-busbw-tier '{item}': expected tier=GB/s"))?;
        let bw: f64 = bw
            .trim()
            .parse()
            .ok()
            .filter(|b: &f64| b.is_finite() && *b >= 0.0)
            .ok_or_else(|| {
                format!("--min-busbw-tier '{item}': '{bw}' is not a non-negative number of GB/s")
            })?;
        thresholds.push((tier.trim().to_string(), bw));
    }
    if !(0.0..1.0).contains(&t.slow_fraction) {
        return Err(format!(
            "--slow-fraction {} must be at least 0 and below 1",
            t.slow_fraction
        ));
    }
    if t.pairwise_iters == 0 {
        return Err("--pairwise-iters 0: at least one timed operation per pair is needed".into());
    }
    if t.pairwise_size < 4 {
        return Err("--pairwise-size must be at least 4 bytes".into());
    }
    let label_nodes = match &t.label_nodes {
        Some(kv) => Some((kv.parse::<NodeLabel>()?, t.label_nodes_dry_run)),
        None => None,
    };
    Ok(Options {
        tiers: busbw_tiers::Options {
            preset,
            sources: SourceConfig {
                sources,
                file: t.file.clone(),
                k8s_url: t.k8s_url.clone(),
                imds_url: t.imds_url.clone(),
                service_account_dir: t.service_account_dir.clone(),
                ..SourceConfig::default()
            },
            node_name: t.node_name.clone().filter(|n| !n.trim().is_empty()),
            pairwise_size: t.pairwise_size,
            pairwise_iters: t.pairwise_iters,
            pairwise: !t.no_pairwise,
            adaptive: t.pairwise == "adaptive",
            thresholds,
            slow_fraction: t.slow_fraction,
            allow_stragglers: t.allow_stragglers,
            budget: t.budget.map(|b| (started, b)),
            label_nodes: label_nodes.is_some(),
        },
        label_nodes,
        report: t.perf.report.clone(),
        join: perf::join_options(&t.perf),
        verbose: t.perf.verbose > 0,
    })
}

pub fn main(t: &TiersArgs) -> i32 {
    let started = std::time::Instant::now();
    let Some(spec) = busbw_measure::specs::find(&t.collective) else {
        eprintln!(
            "busbw: error: --collective {}: no such collective (all_reduce_perf, all_gather_perf, ...)",
            t.collective
        );
        return exit::USAGE;
    };
    let opts = match options(t, started) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("busbw: error: {msg}");
            return exit::USAGE;
        }
    };
    if t.perf.ngpus.unwrap_or(0) > 1 {
        eprintln!(
            "busbw: error: tiers runs one rank per process: -g 1 at most (each process a GPU); \
             start a process per GPU with --np or --nproc-per-node"
        );
        return exit::USAGE;
    }
    if t.perf.nthreads > 1 {
        eprintln!(
            "busbw: error: tiers runs one rank per process (its groups are hosts and the tiers \
             above them); drop -t and start a process per rank with --np or --nproc-per-node"
        );
        return exit::USAGE;
    }
    // Tiers compare groups and links with one algorithm, the ring unless --algo names
    // another: auto would time every algorithm again before each group's and pair's run,
    // longer than many of those runs take.
    let mut perf_args = t.perf.clone();
    perf_args
        .algo
        .get_or_insert(busbw_collectives::select::Algo::Ring);
    perf::main_with(spec, &perf_args, &|session, plan, world| {
        run(session, plan, world, &opts)
    })
}

/// Rank 0's sink for the whole-job sweep: the text table and the export files. The exports'
/// footer waits until the tiers are in, so the record is finished (and pushed) once, whole.
struct WorldSink<'a> {
    table: &'a mut dyn Sink,
    exports: Option<&'a mut ExportSink>,
}

impl Sink for WorldSink<'_> {
    fn header(&mut self, h: &RunHeader) -> std::io::Result<()> {
        self.table.header(h)?;
        self.exports.as_mut().map_or(Ok(()), |e| e.header(h))
    }
    fn row(&mut self, r: &Row) -> std::io::Result<()> {
        self.table.row(r)?;
        self.exports.as_mut().map_or(Ok(()), |e| e.row(r))
    }
    fn measured(&mut self, m: &Measured) -> std::io::Result<()> {
        self.table.measured(m)?;
        self.exports.as_mut().map_or(Ok(()), |e| e.measured(m))
    }
    fn comment(&mut self, line: &str) -> std::io::Result<()> {
        self.table.comment(line)
    }
    fn footer(&mut self, f: &Footer) -> std::io::Result<()> {
        self.table.footer(f)
    }
}

/// Rank 0's table and export files, and the whole job's summary, kept for the end.
struct MainTable<'a> {
    plan: &'a Plan,
    rank0: bool,
    header: RunHeader,
    table: TextTable<StdoutLock<'static>>,
    exports: Option<ExportSink>,
    /// The whole job's sweep, for the footer and the exit code.
    summary: Summary,
    /// Where the whole job's sweep stopped, when the gate went on without it.
    failed: Option<String>,
}

impl MainTable<'_> {
    /// The sweep over the whole job, shown as any run is; on every rank, what it measured
    /// (rank 0's rows are the ones that count). Under busbw's own engine a failure is kept
    /// in the sweep and the gate goes on: its roll call finds whom to give up on
    /// (`busbw_tiers::run`). Under NCCL it ends the job.
    fn whole_job(&mut self, comm: &mut Communicator, dev: Option<&mut DeviceMem>) -> Result<Sweep> {
        let tolerant = self.plan.engine != busbw_measure::plan::Engine::Nccl && comm.size() > 1;
        let rank0 = self.rank0;
        let mut out = WorldSink {
            table: &mut self.table,
            exports: self.exports.as_mut(),
        };
        if rank0 {
            out.header(&self.header)?;
        }
        let mut sink = Collect {
            inner: if rank0 { Some(&mut out) } else { None },
            rows: Vec::new(),
        };
        let ran = match (self.plan.spec.skip)(comm.size()) {
            Some(why) => {
                if rank0 {
                    eprintln!("busbw: {why}");
                }
                Ok(Summary::default())
            }
            None => busbw_measure::run_with(comm, self.plan, Some(&mut sink), dev),
        };
        let summary = match ran {
            Ok(s) => s,
            Err(e) if tolerant => {
                let why = busbw_measure::chain(&e);
                let mut f = footer(self.plan, &Summary::default());
                f.error = Some(format!("{why} (the gate goes on: see the verdict)"));
                if rank0 {
                    sink.footer(&f)?;
                }
                self.failed = Some(why.clone());
                return Ok(Sweep {
                    failed: Some(why),
                    ..Sweep::from_rows(&sink.rows, 0)
                });
            }
            Err(e) => {
                let e = anyhow::Error::new(e);
                fail(&mut self.exports, &format!("{e:#}"));
                return Err(e);
            }
        };
        sink.footer(&footer(self.plan, &summary))?;
        let sweep = Sweep::from_rows(&sink.rows, summary.out_of_bounds);
        self.summary = summary;
        Ok(sweep)
    }
}

fn run(session: &mut Session, plan: &Plan, world: &World, opts: &Options) -> Result<i32> {
    let rank = session.comm.rank();
    let rank0 = rank == 0;
    let store: Arc<dyn Store> = match &session.rdv {
        Some(r) => r.store.clone(),
        None => Arc::new(MemoryStore::new()),
    };
    let job = Job {
        store: store.clone(),
        abort: session.abort.clone(),
        hostname: world.hostname.clone(),
        timeout: plan.timeout,
        collective: plan.spec.program.into(),
    };
    let mut note = |n: &str| {
        if opts.verbose {
            eprintln!("busbw: rank {rank} on {}: topology {n}", world.hostname);
        }
    };
    let topo = match Topology::discover(&job, &session.comm, &opts.tiers, &mut note) {
        Ok(t) => t,
        Err(e @ busbw_tiers::Error::NoSuchTier { .. }) => {
            if rank0 {
                eprintln!("busbw: error: --min-busbw-tier {e}");
            }
            session.finish()?;
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e.into()),
    };

    // -g 1: the rank's device (its line goes into the header, so before it); the groups
    // sweep on it too, GPU to GPU inside a host where the devices allow it, or on NCCL's
    // split of the job under --engine nccl.
    let slot = busbw_job::threads::slot(world.local_rank, 1, plan.gpus as usize);
    let (mut dev, data_path) =
        crate::perf::open_device(session, (world, &opts.join), plan, slot, None)?;
    let mut table = TextTable::new(std::io::stdout().lock());
    let mut exports = None;
    if rank0 {
        exports = exports::for_run(&opts.report, plan, session, &mut table)?;
    }
    let mut header = run_header(plan, session.devices.clone(), &session.transport_name);
    header.data_path = data_path.clone();
    let mut bench = MainTable {
        plan,
        rank0,
        header,
        table,
        exports,
        summary: Summary::default(),
        failed: None,
    };
    let factory = if session.comm.size() > 1 {
        Some(busbw_job::transport::group_factory(
            world,
            store.clone(),
            &opts.join,
            plan.transport,
            plan.timeout,
            session.abort.clone(),
            plan.gpus > 0,
        )?)
    } else {
        None
    };
    let world_sweep = bench.whole_job(&mut session.comm, dev.as_mut())?;
    let concluded = match busbw_tiers::run(
        world_sweep,
        &mut session.comm,
        plan,
        factory.as_ref(),
        &job,
        &topo,
        &opts.tiers,
        dev.as_mut(),
    ) {
        Ok(c) => c.map(|mut c| {
            c.report.data_path = data_path;
            c
        }),
        Err(e @ busbw_tiers::Error::MarkedFailed { .. }) => {
            // Not this rank's error to report for the job: rank 0's verdict names the node.
            eprintln!("busbw: rank {rank} on {}: {e}", world.hostname);
            session.finish()?;
            return Ok(exit::WRONG_RESULTS);
        }
        Err(e) => return Err(e.into()),
    };

    // The job's exit code, decided on rank 0.
    let code = match concluded {
        Some(c) => {
            if let Some(r) = &session.rdv {
                r.excuse(c.lost_ranks);
            }
            let code = finish_rank0(&mut bench, &c, &*store, opts)?;
            store.set("tiers/exit", code.to_string().as_bytes())?;
            code
        }
        None => {
            let v = store.wait(&["tiers/exit"], plan.timeout)?;
            String::from_utf8_lossy(&v[0])
                .trim()
                .parse()
                .unwrap_or(exit::INTERNAL)
        }
    };
    session.finish()?;
    Ok(code)
}

/// Rank 0, once the tiers are concluded: the tier report after the main table, the export
/// files finished with it, `--label-nodes`, and the job's exit code.
fn finish_rank0(
    bench: &mut MainTable,
    c: &busbw_tiers::Conclusion,
    store: &dyn Store,
    opts: &Options,
) -> Result<i32> {
    let mut footer = footer(bench.plan, &bench.summary);
    footer.error = bench.failed.clone();
    bench.table.tiers(&c.report)?;
    if let Some(e) = &mut bench.exports {
        e.set_tier_report(&c.report, &bench.plan.spec.busbw_factor)
            .and_then(|()| e.footer(&footer))
            .context("writing the export files")?;
    }
    let bw_ok = footer.bandwidth_ok().unwrap_or(true);
    let run_ok =
        bench.summary.out_of_bounds == 0 && bw_ok && c.wrong == 0 && bench.failed.is_none();
    let mut code = if c.passed() && run_ok {
        exit::OK
    } else {
        exit::WRONG_RESULTS
    };
    if let Some((label, dry_run)) = &opts.label_nodes {
        let patches = c.label_patches(store, label, run_ok, bench.plan.timeout)?;
        match gate::apply(&patches, *dry_run, &opts.tiers.sources) {
            Ok(lines) => {
                let mut out = std::io::stdout().lock();
                for l in lines {
                    writeln!(out, "{l}")?;
                }
                out.flush()?;
            }
            Err(e) => {
                eprintln!("busbw: error: --label-nodes: {e}");
                code = exit::INTERNAL;
            }
        }
    }
    Ok(code)
}

/// The run failed: the export files keep what was measured, marked with the error.
fn fail(exports: &mut Option<ExportSink>, error: &str) {
    if let Some(e) = exports {
        if let Err(io) = e.fail(error) {
            eprintln!("busbw: error: {io}");
        }
    }
}
