//! `busbw tiers`: does each tier of the fabric deliver, and which node or link does not?
//!
//! Every rank publishes its node's labels at rendezvous; all ranks derive the same tier
//! model and groups from them. Then: the collective over the whole job (the main table);
//! per tier, closest first, the collective in every group of the tier at once (one rank per
//! node above the node tier), each group on its own sub-communicator; a round-robin of node
//! pairs running sendrecv, disjoint pairs at once; and on rank 0 the tier table, the link
//! matrix and a verdict from robust statistics over the links.

mod analysis;
mod gate;
mod schedule;

use crate::cli::TiersArgs;
use crate::cli_report::ReportArgs;
use crate::exit;
use crate::exports;
use crate::harness;
use crate::perf;
use crate::plan::Plan;
use crate::session::{JoinOptions, Session};
use anyhow::{Context, Result};
use busbw_collectives::ReduceOp;
use busbw_collectives::{all_reduce_values, barrier, sendrecv, Data, DataType, HostBuffer};
use busbw_launchers::topology::{
    exchange_labels, gather, node_labels::NodeLabel, publish_labels, Labels, Meet, NodeLabels,
    Preset, Source, SourceConfig, TierModel,
};
use busbw_launchers::{MemoryStore, Store, World};
use busbw_reports::export::ExportSink;
use busbw_reports::tiers::{
    GroupResult, LinkMatrix, NodeInfo, TierFailure, TierReport, TierRow, TierSize, Verdict,
};
use busbw_reports::{Footer, Measured, Row, RunHeader, Sink, TextTable};
use schedule::Group;
use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

/// `busbw tiers` flags, checked.
struct Options {
    preset: Preset,
    sources: SourceConfig,
    node_name: Option<String>,
    pairwise_size: u64,
    pairwise_iters: u32,
    pairwise: bool,
    /// (tier name or key, GB/s)
    thresholds: Vec<(String, f64)>,
    slow_fraction: f64,
    /// The report flags: the same exporters as a `*_perf` run, with the tiers in the record.
    report: ReportArgs,
    /// --label-nodes and whether it is a dry run.
    label_nodes: Option<(NodeLabel, bool)>,
    join: JoinOptions,
    verbose: bool,
}

fn options(t: &TiersArgs) -> Result<Options, String> {
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
        preset,
        sources: SourceConfig {
            sources,
            file: t.file.clone(),
            k8s_url: t.k8s_url.clone(),
            imds_url: t.imds_url.clone(),
            service_account_dir: t.service_account_dir.clone(),
            ..SourceConfig::default()
        },
        label_nodes,
        node_name: t.node_name.clone().filter(|n| !n.trim().is_empty()),
        pairwise_size: t.pairwise_size,
        pairwise_iters: t.pairwise_iters,
        pairwise: !t.no_pairwise,
        thresholds,
        slow_fraction: t.slow_fraction,
        report: t.perf.report.clone(),
        join: JoinOptions {
            token: t.perf.job_token.clone(),
            socket_ifname: t.perf.socket_ifname.clone(),
            ib_hca: t.perf.ib_hca.clone(),
            socket_nthreads: t.perf.socket_nthreads,
            nsocks_perthread: t.perf.nsocks_perthread,
        },
        verbose: t.perf.verbose > 0,
    })
}

pub fn main(t: &TiersArgs) -> i32 {
    let Some(spec) = crate::specs::find(&t.collective) else {
        eprintln!(
            "busbw: error: --collective {}: no such collective (all_reduce_perf, all_gather_perf, ...)",
            t.collective
        );
        return exit::USAGE;
    };
    let opts = match options(t) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("busbw: error: {msg}");
            return exit::USAGE;
        }
    };
    if t.perf.ngpus.unwrap_or(0) > 0 {
        eprintln!(
            "busbw: error: tiers runs on host memory (it measures the network between tiers); drop -g"
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
    perf::main_with(spec, &t.perf, &|session, plan, world| {
        run(session, plan, world, &opts)
    })
}

/// Rows as the harness produces them, optionally passed on to another sink.
struct Collect<'a> {
    inner: Option<&'a mut dyn Sink>,
    rows: Vec<Row>,
}

impl Sink for Collect<'_> {
    fn header(&mut self, h: &RunHeader) -> std::io::Result<()> {
        self.inner.as_mut().map_or(Ok(()), |s| s.header(h))
    }
    fn row(&mut self, r: &Row) -> std::io::Result<()> {
        self.rows.push(r.clone());
        self.inner.as_mut().map_or(Ok(()), |s| s.row(r))
    }
    fn measured(&mut self, m: &Measured) -> std::io::Result<()> {
        self.rows.push(m.row.clone());
        self.inner.as_mut().map_or(Ok(()), |s| s.measured(m))
    }
    fn comment(&mut self, line: &str) -> std::io::Result<()> {
        self.inner.as_mut().map_or(Ok(()), |s| s.comment(line))
    }
    fn footer(&mut self, f: &Footer) -> std::io::Result<()> {
        self.inner.as_mut().map_or(Ok(()), |s| s.footer(f))
    }
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

/// The nodes of the job: node index per rank, name, first rank, labels.
struct Nodes {
    of_rank: Vec<usize>,
    names: Vec<String>,
    leaders: Vec<usize>,
    labels: Vec<Labels>,
}

fn nodes(of_rank: &[usize], published: &[NodeLabels]) -> Nodes {
    let count = of_rank.iter().copied().max().map_or(0, |m| m + 1);
    let mut leaders = vec![usize::MAX; count];
    for (r, &n) in of_rank.iter().enumerate() {
        leaders[n] = leaders[n].min(r);
    }
    Nodes {
        of_rank: of_rank.to_vec(),
        names: leaders.iter().map(|&r| published[r].host.clone()).collect(),
        labels: leaders
            .iter()
            .map(|&r| published[r].labels.clone())
            .collect(),
        leaders,
    }
}

/// Store key prefix of each rank's Kubernetes node name (for --label-nodes).
const NODE_NAME_KEY: &str = "tiers/k8s-node";

/// What one group measured, as its first member publishes it.
#[derive(serde::Serialize, serde::Deserialize)]
struct GroupRun {
    sizes: Vec<u64>,
    busbw: Vec<f64>,
    wrong: u64,
}

fn run(session: &mut Session, plan: &Plan, world: &World, opts: &Options) -> Result<i32> {
    let rank = session.comm.rank();
    let size = session.comm.size();
    let rank0 = rank == 0;
    let store: Arc<dyn Store> = match &session.rdv {
        Some(r) => r.store.clone(),
        None => Arc::new(MemoryStore::new()),
    };

    // Labels, published at rendezvous.
    let node_name = opts
        .node_name
        .clone()
        .unwrap_or_else(|| world.hostname.clone());
    let got = match gather(&opts.sources, &opts.preset, &node_name, &|k| {
        std::env::var(k).ok()
    }) {
        Ok(g) => g,
        Err(e) => {
            let none = NodeLabels {
                host: world.hostname.clone(),
                labels: Labels::new(),
            };
            let _ = publish_labels(&*store, rank, &none);
            return Err(anyhow::Error::new(e)
                .context(format!("reading the topology labels of {node_name}")));
        }
    };
    if opts.verbose {
        for n in &got.notes {
            eprintln!("busbw: rank {rank} on {}: topology {n}", world.hostname);
        }
    }
    let mine = NodeLabels {
        host: world.hostname.clone(),
        labels: got.labels,
    };
    if opts.label_nodes.is_some() {
        store.set(&format!("{NODE_NAME_KEY}/{rank}"), node_name.as_bytes())?;
    }
    let published = exchange_labels(&*store, rank, size, &mine, plan.timeout)
        .context("exchanging topology labels")?;
    let nodes = nodes(session.comm.nodes(), &published);
    let seen: BTreeSet<String> = nodes
        .labels
        .iter()
        .flat_map(|l| l.keys().cloned())
        .collect();
    let preset = opts.preset.detect(&seen);
    let model = opts.preset.resolve(&seen).map_err(anyhow::Error::msg)?;
    let tier_names: Vec<(String, String)> =
        std::iter::once(("node".to_string(), "(host)".to_string()))
            .chain(model.closest_first().into_iter().map(|l| (l.name, l.key)))
            .collect();
    for (t, _) in &opts.thresholds {
        if !tier_names.iter().any(|(n, k)| n == t || k == t) {
            if rank0 {
                let names: Vec<&str> = tier_names.iter().map(|(n, _)| n.as_str()).collect();
                eprintln!(
                    "busbw: error: --min-busbw-tier {t}: no such tier; the tiers are {}",
                    names.join(", ")
                );
            }
            session.finish()?;
            return Ok(exit::USAGE);
        }
    }

    // The main table: the whole job.
    let mut table = TextTable::new(std::io::stdout().lock());
    let mut exports = None;
    if rank0 {
        exports = exports::for_run(&opts.report, plan, session, &mut table)?;
    }
    let header = perf::run_header(session, plan);
    let mut out = WorldSink {
        table: &mut table,
        exports: exports.as_mut(),
    };
    if rank0 {
        out.header(&header)?;
    }
    let mut sink = Collect {
        inner: if rank0 { Some(&mut out) } else { None },
        rows: Vec::new(),
    };
    let summary = match (plan.spec.skip)(size) {
        Some(why) => {
            if rank0 {
                eprintln!("busbw: {why}");
            }
            harness::Summary::default()
        }
        None => match harness::run(&mut session.comm, plan, Some(&mut sink)) {
            Ok(s) => s,
            Err(e) => {
                fail(&mut exports, &format!("{e:#}"));
                return Err(e);
            }
        },
    };
    let footer = perf::footer(plan, &summary);
    sink.footer(&footer)?;
    let world_rows = sink.rows;

    let factory = if size > 1 {
        Some(crate::subcomm::Factory::new(
            world,
            store.clone(),
            &opts.join,
            plan.transport,
            plan.timeout,
            session.abort.clone(),
            // Tier groups run on host memory (tiers refuses -g).
            false,
        )?)
    } else {
        None
    };

    // Tiers, closest first.
    let mut tiers: Vec<TierRow> = Vec::new();
    let mut measured: Vec<(Vec<Vec<usize>>, usize)> = Vec::new();
    let mut wrong_total = 0u64;
    for (ti, (tier, key)) in tier_names.iter().enumerate() {
        let (groups, unknown) = if ti == 0 {
            (
                schedule::node_groups(&nodes.of_rank, &nodes.names),
                Vec::new(),
            )
        } else {
            schedule::tier_groups(&model, ti - 1, &nodes.labels, &nodes.leaders)
        };
        let runnable: Vec<usize> = (0..groups.len())
            .filter(|&g| groups[g].ranks.len() > 1)
            .collect();
        let sets: Vec<Vec<usize>> = runnable.iter().map(|&g| groups[g].ranks.clone()).collect();
        let mut row = TierRow {
            tier: tier.clone(),
            key: key.clone(),
            groups: groups.len(),
            ranks_min: groups.iter().map(|g| g.ranks.len()).min().unwrap_or(0),
            ranks_max: groups.iter().map(|g| g.ranks.len()).max().unwrap_or(0),
            unknown_nodes: unknown.iter().map(|&n| nodes.names[n].clone()).collect(),
            note: None,
            sizes: Vec::new(),
            group_results: Vec::new(),
            threshold: opts
                .thresholds
                .iter()
                .find(|(t, _)| t == tier || t == key)
                .map(|(_, b)| *b),
            passed: None,
        };
        let runs: Vec<Option<GroupRun>> = if runnable.is_empty() {
            row.note = Some(if groups.is_empty() {
                "no node has this label".into()
            } else {
                "one rank per group: nothing to measure".into()
            });
            Vec::new()
        } else if let Some((_, earlier)) = measured.iter().find(|(s, _)| *s == sets) {
            row.note = Some(format!("same groups as {}", tiers[*earlier].tier));
            row.sizes = tiers[*earlier].sizes.clone();
            row.group_results = tiers[*earlier].group_results.clone();
            Vec::new()
        } else if sets.len() == 1 && sets[0].len() == size && !world_rows.is_empty() {
            // The whole job: that is the main table.
            row.note = Some("the whole job: the main table".into());
            vec![Some(GroupRun {
                sizes: world_rows.iter().map(|r| r.size).collect(),
                busbw: world_rows.iter().map(|r| r.out_of_place.busbw).collect(),
                wrong: 0,
            })]
        } else {
            measured.push((sets.clone(), ti));
            run_groups(
                session,
                plan,
                &store,
                factory.as_ref(),
                ti,
                &groups,
                &runnable,
                &nodes,
            )?
        };
        if !runs.is_empty() && rank0 {
            for (&g, r) in runnable.iter().zip(&runs) {
                let Some(r) = r else { continue };
                wrong_total += r.wrong;
                row.group_results.push(GroupResult {
                    domain: groups[g].domain.clone(),
                    nodes: groups[g]
                        .nodes
                        .iter()
                        .map(|&n| nodes.names[n].clone())
                        .collect(),
                    ranks: groups[g].ranks.len(),
                    busbw: r.busbw.clone(),
                });
                if row.sizes.is_empty() {
                    row.sizes = r
                        .sizes
                        .iter()
                        .map(|&s| TierSize {
                            size: s,
                            min: 0.0,
                            median: 0.0,
                            max: 0.0,
                        })
                        .collect();
                }
            }
            for (i, s) in row.sizes.iter_mut().enumerate() {
                let v: Vec<f64> = row
                    .group_results
                    .iter()
                    .filter_map(|g| g.busbw.get(i).copied())
                    .collect();
                s.min = v.iter().copied().fold(f64::INFINITY, f64::min);
                s.max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                s.median = analysis::median(&v);
            }
        }
        if let (Some(th), Some(last)) = (row.threshold, row.sizes.last()) {
            row.passed = Some(last.min >= 0.9 * th);
        }
        tiers.push(row);
    }

    // Pairwise links.
    let links = if opts.pairwise && nodes.names.len() > 1 {
        Some(pairwise(
            session,
            &store,
            factory.as_ref(),
            &nodes,
            &model,
            opts,
        )?)
    } else {
        None
    };

    // Verdict, report and the job's exit code, decided on rank 0.
    let code = if rank0 {
        let (report, passed) = conclude(
            &preset,
            plan,
            &nodes,
            &model,
            tiers,
            links,
            wrong_total,
            opts,
        );
        table.tiers(&report)?;
        if let Some(e) = &mut exports {
            e.set_tier_report(&report, &plan.spec.busbw_factor)
                .and_then(|()| e.footer(&footer))
                .context("writing the export files")?;
        }
        let bw_ok = footer.bandwidth_ok().unwrap_or(true);
        let run_ok = summary.out_of_bounds == 0 && bw_ok && wrong_total == 0;
        let mut code = if passed && run_ok {
            exit::OK
        } else {
            exit::WRONG_RESULTS
        };
        if let Some((label, dry_run)) = &opts.label_nodes {
            let keys: Vec<String> = (0..size).map(|r| format!("{NODE_NAME_KEY}/{r}")).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let names = store
                .wait(&keys, plan.timeout)
                .context("collecting every rank's node name for --label-nodes")?;
            let hosts: Vec<(String, String)> = (0..size)
                .map(|r| {
                    (
                        nodes.names[nodes.of_rank[r]].clone(),
                        String::from_utf8_lossy(&names[r]).into_owned(),
                    )
                })
                .collect();
            let patches = gate::plan(label, &report, run_ok, &hosts);
            match gate::apply(&patches, *dry_run, &opts.sources) {
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
        store.set("tiers/exit", code.to_string().as_bytes())?;
        code
    } else {
        let v = store.wait(&["tiers/exit"], plan.timeout)?;
        String::from_utf8_lossy(&v[0])
            .trim()
            .parse()
            .unwrap_or(exit::INTERNAL)
    };
    session.finish()?;
    Ok(code)
}

/// Run the collective in every runnable group of tier `ti` at once; on rank 0, every
/// group's result (in `runnable` order).
#[allow(clippy::too_many_arguments)]
fn run_groups(
    session: &mut Session,
    plan: &Plan,
    store: &Arc<dyn Store>,
    factory: Option<&crate::subcomm::Factory>,
    ti: usize,
    groups: &[Group],
    runnable: &[usize],
    nodes: &Nodes,
) -> Result<Vec<Option<GroupRun>>> {
    let rank = session.comm.rank();
    let key = |g: usize| format!("tiers/t{ti}/g{g}");
    if let (Some(f), Some(&g)) = (
        factory,
        runnable.iter().find(|&&g| groups[g].ranks.contains(&rank)),
    ) {
        let grp = &groups[g];
        let member_nodes: Vec<usize> = grp.ranks.iter().map(|&r| nodes.of_rank[r]).collect();
        let name = format!("t{ti}/g{g}");
        let mut comm = f
            .build(&name, &grp.ranks, &member_nodes)
            .with_context(|| format!("building the communicator of tier {ti} group {g}"))?;
        let mut rows = Collect {
            inner: None,
            rows: Vec::new(),
        };
        let summary = match (plan.spec.skip)(grp.ranks.len()) {
            Some(_) => harness::Summary::default(),
            None => harness::run(&mut comm, plan, Some(&mut rows))
                .with_context(|| format!("tier {ti} group {g} (ranks {:?})", grp.ranks))?,
        };
        if comm.rank() == 0 {
            let run = GroupRun {
                sizes: rows.rows.iter().map(|r| r.size).collect(),
                busbw: rows.rows.iter().map(|r| r.out_of_place.busbw).collect(),
                wrong: summary.out_of_bounds,
            };
            store.set(&key(g), &serde_json::to_vec(&run)?)?;
        }
    }
    // Every rank waits for every group: the next tier must not share the wire with this one.
    let keys: Vec<(String, String)> = runnable
        .iter()
        .map(|&g| {
            let who = format!(
                "tier {ti} group {} (ranks {:?})",
                groups[g].domain.join("/"),
                groups[g].ranks
            );
            (key(g), who)
        })
        .collect();
    let budget = plan.timeout * (plan.sizes.len() as u32 * plan.dtypes.len() as u32 + 2);
    let values = wait_all(&**store, &keys, &session.abort, budget)?;
    if rank != 0 {
        return Ok(Vec::new());
    }
    values
        .iter()
        .map(|v| Ok(Some(serde_json::from_slice(v)?)))
        .collect()
}

/// Wait for `keys` (key, what it stands for) to appear, polling so that an abort posted by a
/// failing group ends the wait at once. A group makes progress at least every `-T` per size
/// or fails and says so, hence the budget; past it the error names what never finished.
fn wait_all(
    store: &dyn Store,
    keys: &[(String, String)],
    abort: &busbw_transports::Abort,
    budget: std::time::Duration,
) -> Result<Vec<Vec<u8>>> {
    let deadline = Instant::now() + budget;
    let mut values: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
    loop {
        for (i, (k, _)) in keys.iter().enumerate() {
            if values[i].is_none() {
                values[i] = store.get(k)?;
            }
        }
        if values.iter().all(Option::is_some) {
            return Ok(values.into_iter().flatten().collect());
        }
        if let Some(reason) = abort.reason() {
            anyhow::bail!("the job was aborted: {reason}");
        }
        if Instant::now() > deadline {
            let missing: Vec<&str> = keys
                .iter()
                .zip(&values)
                .filter(|(_, v)| v.is_none())
                .map(|((_, who), _)| who.as_str())
                .collect();
            anyhow::bail!(
                "{} did not finish within {} s",
                missing.join(", "),
                budget.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The tier two nodes meet at, by name.
fn link_tier(model: &TierModel, a: &Labels, b: &Labels) -> String {
    match model.meet(a, b) {
        Meet::Tier(t) => model.closest_first()[t].name.clone(),
        Meet::Beyond => "beyond".into(),
        Meet::Unknown => "unknown".into(),
    }
}

/// Round-robin sendrecv between node leaders; on rank 0 the matrix (links not judged yet)
/// and the measured pairs.
fn pairwise(
    session: &mut Session,
    store: &Arc<dyn Store>,
    factory: Option<&crate::subcomm::Factory>,
    nodes: &Nodes,
    model: &TierModel,
    opts: &Options,
) -> Result<(LinkMatrix, Vec<analysis::Measured>)> {
    let rank = session.comm.rank();
    let timeout = session.comm.config().timeout;
    let rounds = schedule::round_robin(nodes.names.len());
    let bytes = (opts.pairwise_size as usize / 4) * 4;
    let count = bytes / 4;
    let my_node = nodes.of_rank[rank];
    let leader = nodes.leaders[my_node] == rank;
    let mut bufs = None;
    if leader {
        let alloc = |what: &str| {
            HostBuffer::new(bytes).with_context(|| {
                format!("rank {rank}: cannot allocate {bytes} bytes for the pairwise {what} buffer; lower --pairwise-size")
            })
        };
        bufs = Some((alloc("send")?, alloc("receive")?));
    }
    let key = |a: usize, b: usize| format!("tiers/pair/{a}-{b}");
    for (ri, round) in rounds.iter().enumerate() {
        let pair = round.iter().find(|(a, b)| *a == my_node || *b == my_node);
        if let (true, Some(&(a, b)), Some(f), Some((send, recv))) =
            (leader, pair, factory, bufs.as_mut())
        {
            let ranks = [nodes.leaders[a], nodes.leaders[b]];
            let mut c = f
                .build(&format!("pair/{a}-{b}"), &ranks, &[a, b])
                .with_context(|| format!("pairing {} with {}", nodes.names[a], nodes.names[b]))?;
            let ctx = || {
                format!(
                    "sendrecv between {} and {} (round {ri})",
                    nodes.names[a], nodes.names[b]
                )
            };
            let op =
                |c: &mut busbw_collectives::Communicator, s: &HostBuffer, r: &mut HostBuffer| {
                    sendrecv(
                        c,
                        Data::out_of_place(s.as_slice(), r.as_mut_slice()),
                        count,
                        DataType::Float32,
                    )
                };
            op(&mut c, send, recv).with_context(ctx)?;
            barrier(&mut c).with_context(ctx)?;
            let start = Instant::now();
            for _ in 0..opts.pairwise_iters {
                op(&mut c, send, recv).with_context(ctx)?;
            }
            let mut secs = [start.elapsed().as_secs_f64() / opts.pairwise_iters as f64];
            all_reduce_values(&mut c, &mut secs, ReduceOp::Max).with_context(ctx)?;
            if c.rank() == 0 {
                let bw = if secs[0] > 0.0 {
                    bytes as f64 / secs[0] / 1e9
                } else {
                    0.0
                };
                store.set(&key(a, b), bw.to_string().as_bytes())?;
            }
        }
        let keys: Vec<(String, String)> = round
            .iter()
            .map(|&(a, b)| {
                let who = format!("pair {} - {} (round {ri})", nodes.names[a], nodes.names[b]);
                (key(a, b), who)
            })
            .collect();
        wait_all(&**store, &keys, &session.abort, timeout * 4)?;
    }
    let n = nodes.names.len();
    let mut m = LinkMatrix {
        size: bytes as u64,
        rounds: rounds.len(),
        nodes: nodes.names.clone(),
        busbw: vec![vec![None; n]; n],
        links: Vec::new(),
    };
    if rank != 0 {
        return Ok((m, Vec::new()));
    }
    let pairs: Vec<(usize, usize)> = rounds.iter().flatten().copied().collect();
    let keys: Vec<String> = pairs.iter().map(|&(a, b)| key(a, b)).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values = store.wait(&refs, timeout)?;
    let mut measured = Vec::new();
    for (&(a, b), v) in pairs.iter().zip(&values) {
        let bw: f64 = String::from_utf8_lossy(v).trim().parse().unwrap_or(0.0);
        m.busbw[a][b] = Some(bw);
        m.busbw[b][a] = Some(bw);
        measured.push(analysis::Measured {
            a,
            b,
            tier: link_tier(model, &nodes.labels[a], &nodes.labels[b]),
            busbw: bw,
        });
    }
    measured.sort_by_key(|x| (x.a, x.b));
    Ok((m, measured))
}

/// Rank 0: the report and whether the fabric passed.
#[allow(clippy::too_many_arguments)]
fn conclude(
    preset: &Preset,
    plan: &Plan,
    nodes: &Nodes,
    model: &TierModel,
    tiers: Vec<TierRow>,
    links: Option<(LinkMatrix, Vec<analysis::Measured>)>,
    wrong: u64,
    opts: &Options,
) -> (TierReport, bool) {
    let mut verdict = Verdict {
        passed: true,
        suspect_nodes: Vec::new(),
        slow_links: Vec::new(),
        failed_tiers: Vec::new(),
        unknown_nodes: Vec::new(),
        notes: Vec::new(),
    };
    for t in &tiers {
        if let (Some(false), Some(th), Some(last)) = (t.passed, t.threshold, t.sizes.last()) {
            verdict.failed_tiers.push(TierFailure {
                tier: t.tier.clone(),
                measured: last.min,
                threshold: th,
            });
        }
        if t.threshold.is_some() && t.sizes.is_empty() {
            verdict.notes.push(format!(
                "tier {} has a threshold but nothing was measured there",
                t.tier
            ));
        }
    }
    let matrix = links.map(|(mut m, measured)| {
        let j = analysis::judge(&nodes.names, &measured, opts.slow_fraction);
        m.links = j.links;
        verdict.suspect_nodes = j.suspects;
        verdict.slow_links = j.unexplained;
        m
    });
    let mut seen_unknown = BTreeSet::new();
    for t in &tiers {
        for n in &t.unknown_nodes {
            if seen_unknown.insert(n.clone()) {
                verdict.unknown_nodes.push(n.clone());
            }
        }
    }
    if model.is_empty() {
        verdict.notes.push(
            "no topology labels found: only the node tier and the link matrix (see docs/tiers.md for the sources)"
                .into(),
        );
    }
    if wrong > 0 {
        verdict.notes.push(format!(
            "{wrong} result cells with wrong data in tier groups"
        ));
    }
    verdict.passed = verdict.failed_tiers.is_empty()
        && verdict.suspect_nodes.is_empty()
        && verdict.slow_links.is_empty()
        && wrong == 0;
    let keys: BTreeSet<&str> = model
        .outermost_first()
        .iter()
        .map(|l| l.key.as_str())
        .collect();
    let report = TierReport {
        preset: preset.name().into(),
        collective: plan.spec.program.into(),
        nodes: (0..nodes.names.len())
            .map(|n| NodeInfo {
                name: nodes.names[n].clone(),
                ranks: (0..nodes.of_rank.len())
                    .filter(|&r| nodes.of_rank[r] == n)
                    .collect(),
                labels: nodes.labels[n]
                    .iter()
                    .filter(|(k, _)| keys.contains(k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .collect(),
        tiers,
        matrix,
        verdict,
    };
    let passed = report.verdict.passed;
    (report, passed)
}

/// The run failed: the export files keep what was measured, marked with the error.
fn fail(exports: &mut Option<ExportSink>, error: &str) {
    if let Some(e) = exports {
        if let Err(io) = e.fail(error) {
            eprintln!("busbw: error: {io}");
        }
    }
}
