//! The sequence of a tier run: the whole job (the main table), then per tier, closest
//! first, the collective in every group of the tier at once (one rank per node above the
//! node tier), each group on its own sub-communicator; then the pairwise round robin, and on
//! rank 0 the conclusion.
//!
//! The whole job's sweep is the program's (it is the main table, shown as any run is); the
//! groups' sweeps run here on `busbw-measure`'s harness, and what is run where, and when, is
//! decided here, so every program gets the same schedule.

use crate::analysis;
use crate::conclude::{conclude, Conclusion};
use crate::halve;
use crate::liveness::{roll_call, Lost};
use crate::pairwise::pairwise;
use crate::schedule::{self, Group};
use crate::topology::Topology;
use crate::Error;
use busbw_collectives::Communicator;
use busbw_job::Factory;
use busbw_launchers::topology::{Preset, SourceConfig};
use busbw_launchers::Store;
use busbw_measure::device::DeviceMem;
use busbw_measure::plan::Engine;
use busbw_measure::{Plan, Summary};
use busbw_reports::tiers::{GroupResult, Half, TierRow, TierSize};
use busbw_reports::{Footer, Measured, Row, RunHeader, Sink};
use busbw_transports::Abort;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a tier run asks of the program: flags, checked.
#[derive(Clone, Debug)]
pub struct Options {
    pub preset: Preset,
    pub sources: SourceConfig,
    /// The Kubernetes node name when it is not the host name.
    pub node_name: Option<String>,
    pub pairwise_size: u64,
    pub pairwise_iters: u32,
    pub pairwise: bool,
    /// `--pairwise adaptive`: the pairs chosen round by round from the results (issue 39)
    /// rather than the full round robin.
    pub adaptive: bool,
    /// (tier name or key, GB/s)
    pub thresholds: Vec<(String, f64)>,
    pub slow_fraction: f64,
    /// `--allow-stragglers`: stragglers are reported but do not fail the verdict.
    pub allow_stragglers: bool,
    /// `--budget`: the whole gate should end within it, counted from `started`; the
    /// pairwise rounds are sized and counted to fit what is left (`crate::budget`).
    pub budget: Option<(std::time::Instant, std::time::Duration)>,
    /// `--label-nodes` is on: each rank publishes its Kubernetes node name for rank 0.
    pub label_nodes: bool,
}

/// The job a tier run happens in, beside its communicator.
pub struct Job {
    /// The job's rendezvous store: groups publish their results and handles there.
    pub store: Arc<dyn Store>,
    /// The job-wide stop flag: a failing group raises it and every wait here ends.
    pub abort: Abort,
    pub hostname: String,
    /// `-T`: every wait on the store.
    pub timeout: Duration,
    /// The collective's program name (`all_reduce_perf`), for the report.
    pub collective: String,
}

/// What one sweep measured: per size, the out-of-place bus bandwidth; and the result cells
/// with wrong data.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sweep {
    pub sizes: Vec<u64>,
    pub busbw: Vec<f64>,
    pub wrong: u64,
    /// The sweep stopped with this error (the rows before it are kept): the gate goes on
    /// and its roll call finds out whom to give up on ([`crate::liveness`]).
    #[serde(default)]
    pub failed: Option<String>,
}

impl Sweep {
    pub fn from_rows(rows: &[Row], wrong: u64) -> Sweep {
        Sweep {
            sizes: rows.iter().map(|r| r.size).collect(),
            busbw: rows.iter().map(|r| r.out_of_place.busbw).collect(),
            wrong,
            failed: None,
        }
    }
}

/// A sink that keeps the rows a sweep hands it, passing each on to `inner` when there is
/// one (rank 0's table and exports, for the whole job's sweep).
pub struct Collect<'a> {
    pub inner: Option<&'a mut dyn Sink>,
    pub rows: Vec<Row>,
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

/// The plan's sweep in one group, shown nowhere; `what` names the group for errors. With
/// `tolerant` a failure comes back in the sweep (the rows before it kept) rather than as
/// the error.
fn group_sweep(
    comm: &mut Communicator,
    plan: &Plan,
    what: &str,
    dev: Option<&mut DeviceMem>,
    tolerant: bool,
) -> Result<Sweep, Error> {
    let mut rows = Collect {
        inner: None,
        rows: Vec::new(),
    };
    let ran = match (plan.spec.skip)(comm.size()) {
        Some(_) => Ok(Summary::default()),
        None => busbw_measure::run_with(comm, plan, Some(&mut rows), dev).map_err(|source| {
            Error::Sweep {
                what: what.to_string(),
                source,
            }
        }),
    };
    match ran {
        Ok(summary) => Ok(Sweep::from_rows(&rows.rows, summary.out_of_bounds)),
        Err(e) if tolerant => Ok(Sweep {
            failed: Some(busbw_measure::chain(&e)),
            ..Sweep::from_rows(&rows.rows, 0)
        }),
        Err(e) => Err(e),
    }
}

/// How long one group's sweep may take before the others give up on it: a group makes
/// progress at least every `-T` per size or fails and says so.
fn group_budget(plan: &Plan) -> Duration {
    plan.timeout * (plan.sizes.len() as u32 * plan.dtypes.len() as u32 + 2)
}

/// Run the tiers on `comm`, the whole job's communicator, after the program swept the whole
/// job with `plan` (`world`: what that measured, or where it failed; it is the main table,
/// which the program shows). Under busbw's own engine a failure in any phase is kept and
/// the roll call after it ([`crate::liveness`]) gives up on the nodes that stopped
/// answering; the phases after run without them, and a rank whose node was given up on
/// gets [`Error::MarkedFailed`]. Under `--engine nccl` a failure ends the job, as NCCL's
/// communicator does not survive one. `factory` builds the groups' communicators (`None` for a one-rank job, which has
/// no groups to run). `dev`: the rank's device buffers under `-g` (the groups' sweeps run
/// on them; under `--engine nccl` on NCCL's split of the job). The conclusion comes back on
/// rank 0 only; the others get `None`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    world: Sweep,
    comm: &mut Communicator,
    plan: &Plan,
    factory: Option<&Factory>,
    job: &Job,
    topo: &Topology,
    opts: &Options,
    mut dev: Option<&mut DeviceMem>,
) -> Result<Option<Conclusion>, Error> {
    // The groups' sweeps measure out of place only: that is the column the tier table and
    // the verdict read, and in place would double the gate's longest phase.
    let group_plan = Plan {
        in_place: false,
        ..plan.clone()
    };
    let plan = &group_plan;
    let tolerant = plan.engine != Engine::Nccl;
    let mut lost = Lost::default();
    let names = &topo.nodes.names;
    let of_rank = &topo.nodes.of_rank[..];
    if tolerant && comm.size() > 1 {
        roll_call(
            job,
            ("world", "the whole job's sweep"),
            comm.rank(),
            (of_rank, names),
            world.failed.as_deref(),
            &mut lost,
        )?;
    }
    let mut tiers: Vec<TierRow> = Vec::new();
    // The rank sets already measured, and the tier that measured them.
    let mut measured: Vec<(Vec<Vec<usize>>, usize)> = Vec::new();
    // Every group measured so far, for the halving: its ranks, what it was, its busbw at
    // the largest size.
    let mut known: Vec<Known> = Vec::new();
    let mut wrong = 0u64;
    let (rank, size) = (comm.rank(), comm.size());
    let nodes = &topo.nodes;
    for (ti, (tier, key)) in topo.tiers.iter().enumerate() {
        let (mut groups, unknown) = if ti == 0 {
            (
                schedule::node_groups(&nodes.of_rank, &nodes.names),
                Vec::new(),
            )
        } else {
            schedule::tier_groups(&topo.model, ti - 1, &nodes.labels, &nodes.leaders)
        };
        // The nodes given up on are left out of every group.
        for g in &mut groups {
            g.ranks.retain(|&r| !lost.contains(of_rank[r]));
            g.nodes.retain(|&n| !lost.contains(n));
        }
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
            halves: Vec::new(),
        };
        let runs: Vec<Sweep> = if runnable.is_empty() {
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
        } else if sets.len() == 1
            && sets[0].len() == size
            && !world.sizes.is_empty()
            && world.failed.is_none()
        {
            // The whole job: that is the main table, whose wrong cells the program counts.
            row.note = Some("the whole job: the main table".into());
            vec![Sweep {
                wrong: 0,
                ..world.clone()
            }]
        } else {
            measured.push((sets.clone(), ti));
            let (runs, mine) = run_groups(
                plan,
                rank,
                factory,
                job,
                (&format!("t{ti}"), ti, &groups, &runnable),
                nodes,
                dev.as_deref_mut(),
                tolerant,
            )?;
            if tolerant {
                roll_call(
                    job,
                    (&format!("t{ti}"), &format!("tier {tier}'s groups")),
                    rank,
                    (of_rank, names),
                    mine.as_deref(),
                    &mut lost,
                )?;
            }
            runs
        };
        if !runs.is_empty() && rank == 0 {
            wrong += summarize(&mut row, &groups, &runnable, &runs, &nodes.names);
        }
        if ti > 0 && !runs.is_empty() {
            let figures: Vec<f64> = runs.iter().filter_map(last_busbw).collect();
            let expect = halve::Expectation::new(&figures, row.threshold, opts.slow_fraction);
            for (&g, r) in runnable.iter().zip(&runs) {
                if let Some(b) = last_busbw(r) {
                    known.push((groups[g].ranks.clone(), tier.clone(), b, expect.short(b)));
                }
            }
            row.halves = halve_short(
                plan,
                rank,
                factory,
                job,
                (ti, tier),
                (&groups, &runnable, &runs),
                topo,
                &expect,
                &mut known,
                &lost,
                dev.as_deref_mut(),
                tolerant,
            )?;
        }
        if let (Some(th), Some(last)) = (row.threshold, row.sizes.last()) {
            row.passed = Some(last.min >= 0.9 * th);
        }
        tiers.push(row);
    }
    let links = if opts.pairwise && nodes.names.len() > 1 {
        Some(pairwise(
            comm, factory, job, topo, opts, &mut lost, tolerant,
        )?)
    } else {
        None
    };
    Ok((rank == 0).then(|| conclude(job, topo, tiers, links, wrong, lost, opts)))
}

/// A group measured: its ranks, what it was (a tier, or a tier's half), its busbw at the
/// largest size, and whether it fell short by its own tier's expectation (a closer tier's
/// group is judged against its own tier: its links are faster than the wider tier's, so a
/// slow node in it can still deliver what the wider tier expects).
type Known = (Vec<usize>, String, f64, bool);

/// A sweep's busbw at its largest size, when it finished.
fn last_busbw(r: &Sweep) -> Option<f64> {
    r.failed
        .is_none()
        .then(|| r.busbw.last().copied())
        .flatten()
}

/// The halving of tier `ti`'s groups that fell short ([`crate::halve`]), run alike on every
/// rank from the groups' published results: each round cuts the short groups (then the short
/// halves) in two and measures, all at once and at the largest size only, the halves that
/// no earlier group measured already (a half that is a closer tier's group takes that
/// group's figure). Ends when no half is short or none can be cut.
#[allow(clippy::too_many_arguments)]
fn halve_short(
    plan: &Plan,
    rank: usize,
    factory: Option<&Factory>,
    job: &Job,
    (ti, tier): (usize, &str),
    (groups, runnable, runs): (&[Group], &[usize], &[Sweep]),
    topo: &Topology,
    expect: &halve::Expectation,
    known: &mut Vec<Known>,
    lost: &Lost,
    mut dev: Option<&mut DeviceMem>,
    tolerant: bool,
) -> Result<Vec<Half>, Error> {
    let Some(&largest) = plan.sizes.last() else {
        return Ok(Vec::new());
    };
    let half_plan = Plan {
        sizes: vec![largest],
        ..plan.clone()
    };
    let nodes = &topo.nodes;
    let mut work: Vec<Group> = runnable
        .iter()
        .zip(runs)
        .filter(|(_, r)| last_busbw(r).is_some_and(|b| expect.short(b)))
        .map(|(&g, _)| groups[g].clone())
        .collect();
    let mut out = Vec::new();
    let mut round = 0;
    while !work.is_empty() {
        round += 1;
        let mut cut: Vec<Group> = Vec::new();
        for g in &work {
            let mut g = g.clone();
            g.nodes.retain(|&n| !lost.contains(n));
            g.ranks = g.nodes.iter().map(|&n| nodes.leaders[n]).collect();
            g.ranks.sort_unstable();
            if let Some((a, b)) =
                halve::split(&g, ti - 1, &topo.model, &nodes.labels, &nodes.leaders)
            {
                cut.extend([a, b]);
            }
        }
        let is_known = |h: &Group| known.iter().find(|k| k.0 == h.ranks);
        let to_run: Vec<usize> = (0..cut.len())
            .filter(|&i| cut[i].ranks.len() > 1 && is_known(&cut[i]).is_none())
            .collect();
        let measured = if to_run.is_empty() {
            Vec::new()
        } else {
            run_groups(
                &half_plan,
                rank,
                factory,
                job,
                (&format!("t{ti}h{round}"), ti, &cut, &to_run),
                nodes,
                dev.as_deref_mut(),
                tolerant,
            )?
            .0
        };
        let mut next = Vec::new();
        for (i, h) in cut.iter().enumerate() {
            let (busbw, from, short) = match known.iter().find(|k| k.0 == h.ranks) {
                Some(k) => (Some(k.2), Some(k.1.clone()), k.3),
                None => {
                    let b = to_run
                        .iter()
                        .position(|&x| x == i)
                        .and_then(|p| measured.get(p))
                        .and_then(last_busbw);
                    (b, None, b.is_some_and(|b| expect.short(b)))
                }
            };
            if let (Some(b), None) = (busbw, &from) {
                known.push((h.ranks.clone(), format!("a half of {tier}"), b, short));
            }
            out.push(Half {
                group: h.domain.clone(),
                round,
                nodes: h.nodes.iter().map(|&n| nodes.names[n].clone()).collect(),
                busbw,
                short,
                from,
            });
            if short {
                next.push(h.clone());
            }
        }
        work = next;
    }
    Ok(out)
}

/// Rank 0: the groups' results into the tier's row (per size: min, median and max over the
/// groups); returns the wrong cells they had.
fn summarize(
    row: &mut TierRow,
    groups: &[Group],
    runnable: &[usize],
    runs: &[Sweep],
    names: &[String],
) -> u64 {
    let mut wrong = 0;
    for (&g, r) in runnable.iter().zip(runs) {
        wrong += r.wrong;
        if r.failed.is_some() {
            // The roll call names the failure; a part of a sweep is no figure for the tier.
            continue;
        }
        row.group_results.push(GroupResult {
            domain: groups[g].domain.clone(),
            nodes: groups[g].nodes.iter().map(|&n| names[n].clone()).collect(),
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
    wrong
}

/// Run the collective in every runnable group of tier `ti` at once (`tag` names their
/// communicators and store keys: `t<ti>` for the tier's groups, `t<ti>h<round>` for a
/// round of halves); on every rank, every group's result (in `runnable` order: every rank
/// waited for them all, and the halving decides from them alike everywhere) and its own
/// group's failure when `tolerant` kept it (a group that never reported counts as failed).
#[allow(clippy::too_many_arguments)]
fn run_groups(
    plan: &Plan,
    rank: usize,
    factory: Option<&Factory>,
    job: &Job,
    (tag, ti, groups, runnable): (&str, usize, &[Group], &[usize]),
    nodes: &crate::topology::Nodes,
    mut dev: Option<&mut DeviceMem>,
    tolerant: bool,
) -> Result<(Vec<Sweep>, Option<String>), Error> {
    let key = |g: usize| format!("tiers/{tag}/g{g}");
    let mine = runnable.iter().find(|&&g| groups[g].ranks.contains(&rank));
    if plan.engine == Engine::Nccl {
        // NCCL's groups: every rank of the job splits its communicator, those in no group
        // of this tier too (NCCL_SPLIT_NOCOLOR).
        if let Some(d) = dev.as_deref_mut() {
            let (color, key, size) = match mine {
                Some(&g) => {
                    let members = &groups[g].ranks;
                    let at = members.iter().position(|&r| r == rank).unwrap_or(0);
                    (Some(g), at, members.len())
                }
                None => (None, 0, 0),
            };
            d.split_nccl(color, key, size)
                .map_err(|source| Error::Sweep {
                    what: format!("tier {ti}: NCCL's communicator of this rank's group"),
                    source,
                })?;
        }
    }
    let mut failed = None;
    if let (Some(f), Some(&g)) = (factory, mine) {
        let grp = &groups[g];
        let member_nodes: Vec<usize> = grp.ranks.iter().map(|&r| nodes.of_rank[r]).collect();
        let built = f
            .build(&format!("{tag}/g{g}"), &grp.ranks, &member_nodes)
            .map_err(|source| Error::Group {
                what: format!("building the communicator of tier {ti} group {g}"),
                source: Box::new(source),
            });
        // Device data of a group across hosts: GPU to GPU inside each host, as the whole
        // job's (busbw_job::hosts).
        let split = dev.is_some() && plan.engine == Engine::Own;
        let built = built.and_then(|mut comm| {
            if split {
                busbw_job::hosts::split(&mut comm, f, &format!("{tag}/g{g}"), &grp.ranks).map_err(
                    |source| Error::Group {
                        what: format!(
                            "splitting tier {ti} group {g} by host and rail for its device data"
                        ),
                        source: Box::new(source),
                    },
                )?;
            }
            Ok(comm)
        });
        let (run, first) = match built {
            Ok(mut comm) => {
                let what = format!("tier {ti} group {g} (ranks {:?})", grp.ranks);
                let run = group_sweep(&mut comm, plan, &what, dev, tolerant)?;
                (run, comm.rank() == 0)
            }
            Err(e) if tolerant => {
                let run = Sweep {
                    failed: Some(busbw_measure::chain(&e)),
                    ..Sweep::default()
                };
                (run, false)
            }
            Err(e) => return Err(e),
        };
        // A failure is published by whoever met it (the group's first rank may be the one
        // that hung); a result by the group's first rank.
        failed = run.failed.clone();
        if first || failed.is_some() {
            job.store
                .set(&key(g), &serde_json::to_vec(&run).map_err(Error::from)?)
                .map_err(Error::from)?;
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
    let budget = group_budget(plan);
    let values = if tolerant {
        wait_some(&*job.store, &keys, &job.abort, budget)?
    } else {
        wait_all(&*job.store, &keys, &job.abort, budget)?
            .into_iter()
            .map(Some)
            .collect()
    };
    let runs = values
        .iter()
        .zip(&keys)
        .map(|(v, (_, who))| match v {
            Some(v) => serde_json::from_slice(v).map_err(Error::from),
            None => Ok(Sweep {
                failed: Some(format!(
                    "{who} did not finish within {} s",
                    budget.as_secs()
                )),
                ..Sweep::default()
            }),
        })
        .collect::<Result<Vec<Sweep>, Error>>()?;
    Ok((runs, failed))
}

/// [`wait_all`] that keeps going past `budget`: what never came is `None`.
pub(crate) fn wait_some(
    store: &dyn Store,
    keys: &[(String, String)],
    abort: &Abort,
    budget: Duration,
) -> Result<Vec<Option<Vec<u8>>>, Error> {
    match wait_all(store, keys, abort, budget) {
        Ok(v) => Ok(v.into_iter().map(Some).collect()),
        Err(Error::Unfinished { .. }) => keys
            .iter()
            .map(|(k, _)| store.get(k).map_err(Error::from))
            .collect(),
        Err(e) => Err(e),
    }
}

/// Wait for `keys` (key, what it stands for) to appear, polling so that an abort posted by a
/// failing group ends the wait at once. Past `budget` the error names what never finished.
pub(crate) fn wait_all(
    store: &dyn Store,
    keys: &[(String, String)],
    abort: &Abort,
    budget: Duration,
) -> Result<Vec<Vec<u8>>, Error> {
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
            return Err(Error::Aborted(reason));
        }
        if Instant::now() > deadline {
            return Err(Error::Unfinished {
                missing: keys
                    .iter()
                    .zip(&values)
                    .filter(|(_, v)| v.is_none())
                    .map(|((_, who), _)| who.clone())
                    .collect(),
                secs: budget.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_launchers::MemoryStore;

    #[test]
    fn a_wait_names_what_never_finished_and_ends_on_an_abort() {
        let store = MemoryStore::new();
        store.set("a", b"1").unwrap();
        let keys = [
            ("a".to_string(), "group a".to_string()),
            ("b".to_string(), "group b".to_string()),
        ];
        let abort = Abort::new();
        let e = wait_all(&store, &keys, &abort, Duration::ZERO).unwrap_err();
        assert_eq!(e.to_string(), "group b did not finish within 0 s");
        abort.raise("rank 3 failed");
        let e = wait_all(&store, &keys, &abort, Duration::from_secs(60)).unwrap_err();
        assert_eq!(e.to_string(), "the job was aborted: rank 3 failed");
        store.set("b", b"2").unwrap();
        assert_eq!(
            wait_all(&store, &keys, &abort, Duration::ZERO).unwrap(),
            [b"1".to_vec(), b"2".to_vec()]
        );
    }

    #[test]
    fn groups_summarize_per_size() {
        let group = |d: &str, nodes: Vec<usize>| Group {
            domain: vec![d.into()],
            ranks: nodes.clone(),
            nodes,
        };
        let groups = [
            group("a", vec![0, 1]),
            group("b", vec![2]),
            group("c", vec![3, 4]),
        ];
        let runs = [
            Sweep {
                sizes: vec![8, 16],
                busbw: vec![1.0, 4.0],
                wrong: 1,
                failed: None,
            },
            Sweep {
                sizes: vec![8, 16],
                busbw: vec![3.0, 2.0],
                wrong: 2,
                failed: None,
            },
        ];
        let names: Vec<String> = (0..5).map(|i| format!("n{i}")).collect();
        let mut row = TierRow {
            tier: "rack".into(),
            key: "k".into(),
            groups: 3,
            ranks_min: 1,
            ranks_max: 2,
            unknown_nodes: Vec::new(),
            note: None,
            sizes: Vec::new(),
            group_results: Vec::new(),
            threshold: None,
            passed: None,
            halves: Vec::new(),
        };
        assert_eq!(summarize(&mut row, &groups, &[0, 2], &runs, &names), 3);
        assert_eq!(row.group_results[1].nodes, ["n3", "n4"]);
        let s: Vec<(u64, f64, f64, f64)> = row
            .sizes
            .iter()
            .map(|s| (s.size, s.min, s.median, s.max))
            .collect();
        assert_eq!(s, [(8, 1.0, 2.0, 3.0), (16, 2.0, 3.0, 4.0)]);
    }
}
