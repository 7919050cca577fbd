//! Every pair of nodes, measured alone on its link: a round robin of sendrecv between node
//! leaders, the disjoint pairs of a round at once, each pair on its own communicator.

use crate::adaptive::{Pairing, Settings};
use crate::analysis::{self, Measured};
use crate::liveness::Lost;
use crate::run::{wait_all, wait_some};
use crate::topology::Topology;
use crate::{budget, schedule, Error, Job, Options};
use busbw_collectives::{
    all_reduce_values, barrier, sendrecv, Communicator, Data, DataType, HostBuffer, ReduceOp,
};
use busbw_job::Factory;
use busbw_reports::tiers::LinkMatrix;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// What the pairing measured, on rank 0: the matrix (links not judged yet), the measured
/// pairs, and the pairs that failed with why (both nodes answered, but no data crossed).
pub(crate) type Links = (LinkMatrix, Vec<Measured>, Vec<((usize, usize), String)>);

/// Sendrecv between node leaders, round after round of disjoint pairs, each round chosen
/// by rank 0's [`Planner`] and published through the store: the round robin (every pair),
/// or with `opts.adaptive` the rounds chosen from the last one's results ([`crate::adaptive`]:
/// the widest tier first, then the nodes of slow pairs with nodes measured good); under
/// `--budget` a probe round first and, after the adaptive rounds, the pairs not yet measured
/// while time remains; then the unexplained slow links again. On rank 0 the matrix (links
/// not judged yet) and the measured pairs.
///
/// With `tolerant` a pair that fails is a result, not the job's end: both its leaders say
/// they are still there, rank 0 gives up on a node that does not (within `-T`, into
/// `lost`: it is never paired again) and the schedule treats a failed pair between two
/// live nodes as one that delivered nothing, so a node nobody can reach is re-paired and
/// named like a slow node ([`crate::conclude`] calls it unreachable).
pub(crate) fn pairwise(
    comm: &Communicator,
    factory: Option<&Factory>,
    job: &Job,
    topo: &Topology,
    opts: &Options,
    lost: &mut Lost,
    tolerant: bool,
) -> Result<Links, Error> {
    let nodes = &topo.nodes;
    let store = &*job.store;
    let rank = comm.rank();
    let timeout = comm.config().timeout;
    let bytes = (opts.pairwise_size as usize / 4) * 4;
    let leader = nodes.leaders[nodes.of_rank[rank]] == rank;
    let mut bufs = None;
    if leader {
        let alloc = |buffer: &'static str| {
            HostBuffer::new(bytes).ok_or(Error::Alloc {
                rank,
                bytes,
                buffer,
            })
        };
        bufs = Some((alloc("send")?, alloc("receive")?));
    }
    let tier = |a, b| topo.link_tier(a, b);
    let mut planner = (rank == 0).then(|| Planner::new(topo, opts, bytes, &tier));
    if let Some(p) = planner.as_mut() {
        for &x in lost.nodes.keys() {
            p.lose(x);
        }
    }
    for ri in 0.. {
        // Rank 0 decides each round from the results so far; everyone reads it.
        let k = format!("tiers/round/{ri}");
        let round: Round = match planner.as_mut() {
            Some(p) => {
                let left = opts
                    .budget
                    .map(|(started, total)| budget::left(started, total));
                let mut next = p.next(left).unwrap_or_default();
                next.lost = lost.nodes.clone();
                store.set(&k, serde_json::to_string(&next)?.as_bytes())?;
                next
            }
            None => {
                // Rank 0 may spend a -T on a failed pair and another on its roll call.
                let v = store.wait(&[&k], timeout * 6)?;
                serde_json::from_slice(&v[0])?
            }
        };
        lost.nodes.extend(round.lost.clone());
        let me = nodes.of_rank[rank];
        if let Some(reason) = lost.nodes.get(&me) {
            return Err(Error::MarkedFailed {
                node: nodes.names[me].clone(),
                reason: reason.clone(),
            });
        }
        if round.pairs.is_empty() {
            break;
        }
        let began = Instant::now();
        let values = measure_round(
            ri,
            &round,
            comm,
            factory,
            job,
            topo,
            (leader, bufs.as_mut()),
            tolerant,
        )?;
        if let Some(p) = planner.as_mut() {
            let parsed: Vec<PairResult> = values
                .iter()
                .map(|v| match v {
                    Some(v) => parse_pair(v),
                    None => PairResult::Failed(format!(
                        "the pair did not report within {} s",
                        (timeout * 4).as_secs()
                    )),
                })
                .collect();
            let gone = absent(store, &job.abort, ri, &round, &parsed, timeout)?;
            for (x, why) in gone {
                lost.nodes.entry(x).or_insert(why);
                p.lose(x);
            }
            p.record(&round, parsed, began.elapsed().as_secs_f64());
        }
    }
    let Some(p) = planner else {
        let n = nodes.names.len();
        let m = LinkMatrix {
            size: bytes as u64,
            rounds: 0,
            nodes: nodes.names.clone(),
            busbw: vec![vec![None; n]; n],
            links: Vec::new(),
            budget: None,
        };
        return Ok((m, Vec::new(), Vec::new()));
    };
    Ok(p.finish(
        opts.budget
            .map(|(started, total)| (started.elapsed(), total)),
    ))
}

/// Rank 0, after a round with failed pairs: the nodes of those pairs that did not say they
/// are still there within `timeout` (each leader of a failed pair does, at once), with why.
fn absent(
    store: &dyn busbw_launchers::Store,
    abort: &busbw_transports::Abort,
    ri: usize,
    round: &Round,
    results: &[PairResult],
    timeout: Duration,
) -> Result<Vec<(usize, String)>, Error> {
    let mut why: BTreeMap<usize, String> = BTreeMap::new();
    for (&(a, b), r) in round.pairs.iter().zip(results) {
        if let PairResult::Failed(e) = r {
            why.entry(a).or_insert_with(|| e.clone());
            why.entry(b).or_insert_with(|| e.clone());
        }
    }
    if why.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<(String, String)> = why
        .keys()
        .map(|x| (format!("tiers/alive/p{ri}/{x}"), String::new()))
        .collect();
    let answers = wait_some(store, &keys, abort, timeout)?;
    Ok(why
        .into_iter()
        .zip(answers)
        .filter(|(_, a)| a.is_none())
        .map(|((x, e), _)| {
            let reason = format!(
                "did not answer within {} s (-T) after its pair failed in pairwise round {ri} ({e}): hung, killed, or cut off from the job's store",
                timeout.as_secs()
            );
            (x, reason)
        })
        .collect())
}

/// One round as rank 0 publishes it: its pairs, message size and timed iterations; a probe
/// round only measures what a round costs (`--budget`). `lost`: the nodes given up on so
/// far (a rank that finds its own there stops).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct Round {
    pairs: Vec<(usize, usize)>,
    size: usize,
    iters: u32,
    #[serde(default)]
    probe: bool,
    #[serde(default)]
    lost: BTreeMap<usize, String>,
}

/// What one pair reported: its figure and each iteration's busbw, or why it failed.
#[derive(Clone, Debug, PartialEq)]
enum PairResult {
    Measured(f64, Vec<f64>),
    Failed(String),
}

/// Where the pairing stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// `--budget`: one round at a small size, for the cost of a round.
    Probe,
    /// The schedule: the round robin, or the adaptive rounds.
    Main,
    /// `--budget`, adaptive: the round robin's pairs not measured yet, while time remains.
    Coverage,
    /// Unexplained slow links measured again.
    Confirm,
    Done,
}

/// Rank 0's choice of rounds: a pure function of the results and of the time left, so the
/// schedule is tested without a cluster.
struct Planner<'t> {
    phase: Phase,
    names: Vec<String>,
    tier: &'t TierOf<'t>,
    robin: Vec<Vec<(usize, usize)>>,
    robin_at: usize,
    pairing: Option<Pairing>,
    slow_fraction: f64,
    size: usize,
    max_size: usize,
    iters: u32,
    /// What a round costs, from the probe, and whether the size was chosen from it.
    cost: Option<budget::RoundCost>,
    sized: bool,
    best: Best,
    rounds: Vec<Vec<(usize, usize)>>,
    /// Why pairing stopped early, when the budget stopped it.
    cut: Option<String>,
    /// Nodes given up on: never in a round again.
    lost: BTreeSet<usize>,
    /// Pairs that failed between nodes that still answered, and why.
    failures: BTreeMap<(usize, usize), String>,
}

impl<'t> Planner<'t> {
    fn new(topo: &Topology, opts: &Options, max_size: usize, tier: &'t TierOf<'t>) -> Self {
        let pairing = opts
            .adaptive
            .then(|| Pairing::new(domains(topo), Settings::default()));
        Planner::with(
            topo.nodes.names.clone(),
            tier,
            pairing,
            opts.budget.is_some(),
            (max_size, opts.pairwise_iters),
            opts.slow_fraction,
        )
    }

    fn with(
        names: Vec<String>,
        tier: &'t TierOf<'t>,
        pairing: Option<Pairing>,
        budgeted: bool,
        (max_size, iters): (usize, u32),
        slow_fraction: f64,
    ) -> Self {
        let n = names.len();
        Planner {
            phase: if budgeted { Phase::Probe } else { Phase::Main },
            names,
            tier,
            robin: schedule::round_robin(n),
            robin_at: 0,
            pairing,
            slow_fraction,
            size: max_size,
            max_size,
            iters,
            cost: None,
            sized: false,
            best: BTreeMap::new(),
            rounds: Vec::new(),
            cut: None,
            lost: BTreeSet::new(),
            failures: BTreeMap::new(),
        }
    }

    /// Gives up on node `x` (it stopped answering): it is in no round after this one, and
    /// what was measured with it counts for nothing.
    fn lose(&mut self, x: usize) {
        self.lost.insert(x);
        if let Some(p) = self.pairing.as_mut() {
            p.lose(x);
        }
        self.best.retain(|&(a, b), _| a != x && b != x);
        self.failures.retain(|&(a, b), _| a != x && b != x);
    }

    /// `pairs` without those of lost nodes.
    fn live(&self, pairs: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
        pairs
            .into_iter()
            .filter(|(a, b)| !self.lost.contains(a) && !self.lost.contains(b))
            .collect()
    }

    fn round(&self, pairs: Vec<(usize, usize)>) -> Round {
        Round {
            pairs,
            size: self.size,
            iters: self.iters,
            probe: false,
            lost: BTreeMap::new(),
        }
    }

    /// Whether one more round fits in `left` seconds (`reserve` rounds kept after it).
    fn fits(&self, left: Option<f64>, reserve: f64) -> bool {
        match (left, self.cost) {
            (Some(left), Some(c)) => {
                c.round_s(self.size, self.iters as usize + 1) * (1.0 + reserve) <= left
            }
            _ => true,
        }
    }

    /// The next round, or `None` when pairing is over. `left`: seconds left of the budget.
    fn next(&mut self, left: Option<f64>) -> Option<Round> {
        loop {
            match self.phase {
                Phase::Probe => {
                    self.phase = Phase::Main;
                    let pairs = self.live(self.robin.first().cloned().unwrap_or_default());
                    if pairs.is_empty() {
                        continue;
                    }
                    return Some(Round {
                        pairs,
                        size: budget::PROBE_SIZE.min(self.max_size),
                        iters: 1,
                        probe: true,
                        lost: BTreeMap::new(),
                    });
                }
                Phase::Main => {
                    if let (false, Some(l)) = (self.sized, left) {
                        self.size_rounds(l);
                    }
                    self.sized = true;
                    // The adaptive rounds always run (at the smallest size if need be): they
                    // are few, and without them there is no verdict on the links. The round
                    // robin stops where the budget does.
                    if self.pairing.is_none() && !self.fits(left, 0.0) {
                        self.cut = Some(format!(
                            "the budget ran out after {} rounds of the schedule",
                            self.rounds.len()
                        ));
                        self.phase = Phase::Confirm;
                        continue;
                    }
                    let pairs = match self.pairing.as_mut() {
                        Some(p) => p.next_round(),
                        None => loop {
                            // A round of only lost nodes' pairs is skipped, not the end.
                            self.robin_at += 1;
                            match self.robin.get(self.robin_at - 1).cloned() {
                                Some(r) => match self.live(r) {
                                    r if r.is_empty() => continue,
                                    r => break Some(r),
                                },
                                None => break None,
                            }
                        },
                    };
                    match pairs.filter(|p| !p.is_empty()) {
                        Some(p) => return Some(self.round(p)),
                        None => {
                            self.phase = if self.pairing.is_some() && left.is_some() {
                                Phase::Coverage
                            } else {
                                Phase::Confirm
                            };
                        }
                    }
                }
                Phase::Coverage => {
                    // Room for this round and a confirming one after it.
                    if !self.fits(left, 1.0) {
                        self.phase = Phase::Confirm;
                        continue;
                    }
                    let measured = |&(a, b): &(usize, usize)| {
                        self.best.contains_key(&(a, b))
                            || self.best.contains_key(&(b, a))
                            || self.lost.contains(&a)
                            || self.lost.contains(&b)
                    };
                    let next = self.robin[self.robin_at.min(self.robin.len())..]
                        .iter()
                        .position(|r| r.iter().any(|p| !measured(p)));
                    match next {
                        Some(i) => {
                            let at = self.robin_at + i;
                            self.robin_at = at + 1;
                            let pairs = self.robin[at]
                                .iter()
                                .copied()
                                .filter(|p| !measured(p))
                                .collect();
                            return Some(self.round(pairs));
                        }
                        None => self.phase = Phase::Confirm,
                    }
                }
                Phase::Confirm => {
                    if !self.fits(left, 0.0) {
                        self.phase = Phase::Done;
                        continue;
                    }
                    let pairs = confirm_round(
                        &self.names,
                        self.tier,
                        &self.best,
                        &self.rounds,
                        self.slow_fraction,
                    );
                    let pairs = self.live(pairs);
                    if pairs.is_empty() {
                        self.phase = Phase::Done;
                        continue;
                    }
                    return Some(self.round(pairs));
                }
                Phase::Done => return None,
            }
        }
    }

    /// A round's results (each pair's figure and iterations, or its failure) and its wall
    /// time. A failed pair between nodes still there counts as one that delivered nothing;
    /// pairs of lost nodes count for nothing.
    fn record(&mut self, round: &Round, results: Vec<PairResult>, wall_s: f64) {
        let mut kept = Vec::new();
        for (&(a, b), r) in round.pairs.iter().zip(results) {
            if self.lost.contains(&a) || self.lost.contains(&b) {
                continue;
            }
            kept.push(match r {
                PairResult::Measured(bw, samples) => ((a, b), bw, samples),
                PairResult::Failed(why) => {
                    self.failures.entry((a, b)).or_insert(why);
                    ((a, b), 0.0, Vec::new())
                }
            });
        }
        if round.probe {
            // The slowest pair decides how long a round lasts (a failed one says nothing
            // about that; a probe with no pair measured leaves the size where it is).
            let slowest = kept
                .iter()
                .map(|r| r.1)
                .filter(|&b| b > 0.0)
                .fold(f64::INFINITY, f64::min);
            if slowest.is_finite() {
                let op_s = round.size as f64 / (slowest * 1e9);
                let cost = budget::RoundCost::from_probe(wall_s, round.size, 2, op_s);
                self.cost = Some(cost);
            }
            return;
        }
        for (pair, bw, samples) in &kept {
            let e = self.best.entry(*pair).or_insert((*bw, Vec::new()));
            e.0 = e.0.max(*bw);
            e.1.extend(samples.iter().copied());
        }
        if self.phase == Phase::Main {
            if let Some(p) = self.pairing.as_mut() {
                p.record_iterations(&kept);
            }
        }
        self.rounds.push(round.pairs.clone());
    }

    /// Chooses the size of the rounds after the probe: every round the budget is expected to
    /// pay for at the largest size that fits (see [`budget::size_for`]).
    fn size_rounds(&mut self, left: f64) {
        let Some(cost) = self.cost else { return };
        let n = self.names.len();
        let wanted = budget::rounds_wanted(n, self.pairing.is_some());
        self.size = budget::size_for(cost, wanted, self.iters as usize + 1, left, self.max_size);
    }

    /// The matrix and the measured pairs; with a budget, what it bought.
    fn finish(self, budget: Option<(std::time::Duration, std::time::Duration)>) -> Links {
        let n = self.names.len();
        let mut m = LinkMatrix {
            size: self.size as u64,
            rounds: self.rounds.len(),
            nodes: self.names.clone(),
            busbw: vec![vec![None; n]; n],
            links: Vec::new(),
            budget: None,
        };
        for (&(a, b), &(bw, _)) in &self.best {
            m.busbw[a][b] = Some(bw);
            m.busbw[b][a] = Some(bw);
        }
        let measured = measured(self.tier, &self.best);
        if let Some((spent, total)) = budget {
            let all = n * n.saturating_sub(1) / 2;
            let pairs = self.best.len();
            let spread = budget::spread(&measured);
            m.budget = Some(format!(
                "budget {:.0} s: {} rounds at {} bytes x {} iterations, {pairs} of {all} pairs measured{}; links within {:.1}% of their tier's median (median absolute deviation); pairing ended at {:.1} s{}",
                total.as_secs_f64(),
                self.rounds.len(),
                self.size,
                self.iters,
                if pairs == all { " (every pair)" } else { "" },
                100.0 * spread,
                spent.as_secs_f64(),
                self.cut
                    .map(|c| format!("; {c}"))
                    .or_else(|| (spent > total).then(|| {
                        "; over the budget: the sweeps left too little, and the adaptive rounds run whatever the budget (--budget larger, or -e smaller)".to_string()
                    }))
                    .unwrap_or_default()
            ));
        }
        // A failed pair measured fine later is no failure.
        let failures = self
            .failures
            .into_iter()
            .filter(|(p, _)| self.best.get(p).is_some_and(|b| b.0 <= 0.0))
            .collect();
        (m, measured, failures)
    }
}

/// The tier of the link between two nodes.
type TierOf<'a> = dyn Fn(usize, usize) -> String + 'a;

/// Per pair: its best figure and every iteration's busbw.
type Best = BTreeMap<(usize, usize), (f64, Vec<f64>)>;

/// A pair's published value: its figure, then each iteration's busbw; or `failed ` and
/// why.
fn parse_pair(v: &[u8]) -> PairResult {
    let text = String::from_utf8_lossy(v);
    if let Some(why) = text.strip_prefix("failed ") {
        return PairResult::Failed(why.to_string());
    }
    let mut f = text.split_whitespace().map(|x| x.parse().unwrap_or(0.0));
    PairResult::Measured(f.next().unwrap_or(0.0), f.collect())
}

/// The measured pairs as the analysis takes them, each at its best measurement.
fn measured(tier: &TierOf, best: &Best) -> Vec<Measured> {
    best.iter()
        .map(|(&(a, b), (busbw, samples))| {
            let (a, b) = (a.min(b), a.max(b));
            Measured {
                a,
                b,
                tier: tier(a, b),
                busbw: *busbw,
                samples: samples.clone(),
            }
        })
        .collect()
}

/// After the schedule's rounds, a second measurement of each slow link that no slow node
/// explains and that was measured once, the pairs of a round disjoint: a verdict names a
/// link only when it was slow twice, so a pair that met a passing burst of load (another
/// job's traffic, a busy core) is not blamed. A slow link stays slow; an empty round ends
/// the pairing.
fn confirm_round(
    names: &[String],
    tier: &TierOf,
    best: &Best,
    rounds: &[Vec<(usize, usize)>],
    slow_fraction: f64,
) -> Vec<(usize, usize)> {
    let j = analysis::judge(names, &measured(tier, best), slow_fraction);
    let index = |n: &str| names.iter().position(|x| x == n);
    let times = |a: usize, b: usize| {
        rounds
            .iter()
            .flatten()
            .filter(|&&(x, y)| (x, y) == (a, b) || (y, x) == (a, b))
            .count()
    };
    let mut busy = vec![false; names.len()];
    let mut round = Vec::new();
    for l in &j.unexplained {
        let (Some(a), Some(b)) = (index(&l.a), index(&l.b)) else {
            continue;
        };
        let pair = best
            .keys()
            .copied()
            .find(|&(x, y)| (x, y) == (a, b) || (y, x) == (a, b))
            .unwrap_or((a, b));
        if times(a, b) == 1 && !busy[a] && !busy[b] {
            busy[a] = true;
            busy[b] = true;
            round.push(pair);
        }
    }
    round
}

/// One round: the leaders of each pair run sendrecv on their own communicator, rank 0 of the
/// pair publishes its busbw; every rank waits for every pair (the next round must not share
/// the wire with this one) and gets the values in `round`'s order. With `tolerant` a leader
/// whose pair fails publishes `failed` and why in its place, and says it is still there;
/// a pair that never reports is `None`.
#[allow(clippy::too_many_arguments)]
fn measure_round(
    ri: usize,
    round: &Round,
    comm: &Communicator,
    factory: Option<&Factory>,
    job: &Job,
    topo: &Topology,
    (leader, bufs): (bool, Option<&mut (HostBuffer, HostBuffer)>),
    tolerant: bool,
) -> Result<Vec<Option<Vec<u8>>>, Error> {
    let nodes = &topo.nodes;
    let store = &*job.store;
    let timeout = comm.config().timeout;
    let my_node = nodes.of_rank[comm.rank()];
    // Per round: a pair measured again must not be read from its first measurement.
    let key = |a: usize, b: usize| format!("tiers/pair/{ri}/{a}-{b}");
    let pair = round
        .pairs
        .iter()
        .find(|(a, b)| *a == my_node || *b == my_node);
    if let (true, Some(&(a, b)), Some(f), Some(bufs)) = (leader, pair, factory, bufs) {
        match measure_pair(ri, round, (a, b), f, topo, bufs) {
            Ok(Some(v)) => store.set(&key(a, b), v.as_bytes())?,
            Ok(None) => {}
            Err(e) if tolerant => {
                let why = busbw_measure::chain(&e);
                store.set(&key(a, b), format!("failed {why}").as_bytes())?;
                store.set(&format!("tiers/alive/p{ri}/{my_node}"), b"ok")?;
            }
            Err(e) => return Err(e),
        }
    }
    let keys: Vec<(String, String)> = round
        .pairs
        .iter()
        .map(|&(a, b)| {
            let who = format!("pair {} - {} (round {ri})", nodes.names[a], nodes.names[b]);
            (key(a, b), who)
        })
        .collect();
    if tolerant {
        wait_some(store, &keys, &job.abort, timeout * 4)
    } else {
        Ok(wait_all(store, &keys, &job.abort, timeout * 4)?
            .into_iter()
            .map(Some)
            .collect())
    }
}

/// This leader's pair: sendrecv between the two leaders, each iteration lapped; on the
/// pair's first rank, the value to publish (the figure, then each iteration's busbw).
fn measure_pair(
    ri: usize,
    round: &Round,
    (a, b): (usize, usize),
    f: &Factory,
    topo: &Topology,
    (send, recv): &mut (HostBuffer, HostBuffer),
) -> Result<Option<String>, Error> {
    let nodes = &topo.nodes;
    let bytes = (round.size / 4) * 4;
    let count = bytes / 4;
    let ranks = [nodes.leaders[a], nodes.leaders[b]];
    let mut c = f
        // Named per round: a pair measured again (after the probe, to confirm) must not
        // find the handles its earlier communicator published under the same name.
        .build(&format!("pair/{ri}/{a}-{b}"), &ranks, &[a, b])
        .map_err(|source| Error::Group {
            what: format!("pairing {} with {}", nodes.names[a], nodes.names[b]),
            source: Box::new(source),
        })?;
    let ctx = |source| Error::Pairwise {
        what: format!(
            "sendrecv between {} and {} (round {ri})",
            nodes.names[a], nodes.names[b]
        ),
        source,
    };
    let op = |c: &mut Communicator, s: &HostBuffer, r: &mut HostBuffer| {
        sendrecv(
            c,
            Data::out_of_place(&s.as_slice()[..bytes], &mut r.as_mut_slice()[..bytes]),
            count,
            DataType::Float32,
        )
    };
    op(&mut c, send, recv).map_err(ctx)?;
    barrier(&mut c).map_err(ctx)?;
    // Each iteration lapped (a straggler shows in a few of them), then the whole loop.
    let iters = round.iters.max(1) as usize;
    let mut secs = vec![0.0f64; iters + 1];
    let start = Instant::now();
    let mut lap = start;
    for t in secs.iter_mut().take(iters) {
        op(&mut c, send, recv).map_err(ctx)?;
        let now = Instant::now();
        *t = (now - lap).as_secs_f64();
        lap = now;
    }
    secs[iters] = start.elapsed().as_secs_f64() / iters as f64;
    all_reduce_values(&mut c, &mut secs, ReduceOp::Max).map_err(ctx)?;
    if c.rank() != 0 {
        return Ok(None);
    }
    let gbs = |s: f64| if s > 0.0 { bytes as f64 / s / 1e9 } else { 0.0 };
    // The pair's figure first, then each iteration's.
    let mut v = gbs(secs[iters]).to_string();
    for &t in &secs[..iters] {
        v.push(' ');
        v.push_str(&gbs(t).to_string());
    }
    Ok(Some(v))
}

/// Each node's domain at every tier of the model, closest first, as the adaptive schedule
/// takes them: equal ids for one domain; a node whose label is unknown shares nobody's.
pub(crate) fn domains(topo: &Topology) -> Vec<Vec<u32>> {
    let (model, nodes) = (&topo.model, &topo.nodes);
    let levels = model.len();
    let mut ids: Vec<std::collections::HashMap<Vec<String>, u32>> =
        vec![Default::default(); levels];
    let mut fresh = 0u32;
    (0..nodes.names.len())
        .map(|n| {
            (0..levels)
                .map(|l| match model.domain(&nodes.labels[n], l) {
                    busbw_launchers::topology::Domain::Known(path) => {
                        let next = ids[l].len() as u32;
                        *ids[l].entry(path).or_insert(next)
                    }
                    busbw_launchers::topology::Domain::Unknown { .. } => {
                        fresh += 1;
                        u32::MAX - fresh
                    }
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Rounds = Vec<Vec<(usize, usize)>>;

    /// Every pair of 6 nodes in one tier at 10 GB/s but those in `slow`, measured in the
    /// round robin's rounds, plus the `again` rounds.
    fn fabric(
        slow: &[((usize, usize), f64)],
        again: &[Vec<(usize, usize)>],
    ) -> (Vec<String>, Best, Rounds) {
        let names: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
        let mut rounds = schedule::round_robin(6);
        rounds.extend(again.iter().cloned());
        let mut best = BTreeMap::new();
        for &(a, b) in rounds.iter().flatten() {
            let bw = slow
                .iter()
                .find(|(p, _)| *p == (a, b) || *p == (b, a))
                .map_or(10.0, |&(_, bw)| bw);
            best.insert((a, b), (bw, vec![bw; 3]));
        }
        (names, best, rounds)
    }

    #[test]
    fn a_slow_link_is_measured_again_once_and_a_slow_nodes_links_are_not() {
        let tier = |_, _| "block".to_string();
        // Two slow links sharing node 1: one is measured again (the other waits for the
        // next round: a round's pairs are disjoint).
        let slow = [((1, 2), 3.0), ((0, 1), 3.0)];
        let (names, best, rounds) = fabric(&slow, &[]);
        let r = confirm_round(&names, &tier, &best, &rounds, 0.25);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0] == (0, 1) || r[0] == (1, 2), "{r:?}");
        // Node 4 slow with everyone and a slow link between 0 and 2: only the link.
        let mut slow4 = vec![((0, 2), 3.0)];
        slow4.extend(
            (0..6)
                .filter(|&i| i != 4)
                .map(|i| ((i.min(4), i.max(4)), 5.0)),
        );
        let (names, best, rounds) = fabric(&slow4, &[]);
        let r = confirm_round(&names, &tier, &best, &rounds, 0.25);
        assert_eq!(r, [(0, 2)]);
        // Both measured twice: nothing is left to confirm.
        let (names, best, rounds) = fabric(&slow, &[vec![(0, 1)], vec![(1, 2)]]);
        assert!(confirm_round(&names, &tier, &best, &rounds, 0.25).is_empty());
        // A link that measured fast the second time is not slow any more.
        let mut best2 = best.clone();
        best2.insert((0, 1), (10.0, vec![10.0; 3]));
        let j = analysis::judge(&names, &measured(&tier, &best2), 0.25);
        let named: Vec<(&str, &str)> = j
            .unexplained
            .iter()
            .map(|l| (l.a.as_str(), l.b.as_str()))
            .collect();
        assert_eq!(named, [("n1", "n2")]);
    }

    /// Runs a planner to the end over 8 nodes whose pairs deliver `bw` (1.0 healthy), each
    /// round costing 0.05 s fixed plus 1 s per GB per op, with `budget` seconds (or none):
    /// the rounds it published.
    fn plan(
        adaptive: bool,
        budget: Option<f64>,
        bw: impl Fn(usize, usize) -> f64,
    ) -> (Vec<Round>, Planner<'static>) {
        static TIER: fn(usize, usize) -> String = |_, _| "block".to_string();
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let pairing = adaptive.then(|| Pairing::new(vec![vec![0]; 8], Settings::default()));
        let mut p = Planner::with(names, &TIER, pairing, budget.is_some(), (64 << 20, 3), 0.25);
        let mut left = budget;
        let mut out = Vec::new();
        while let Some(r) = p.next(left) {
            let slowest = r.pairs.iter().map(|&(a, b)| bw(a, b)).fold(1.0, f64::min);
            let ops = r.iters as usize + 1;
            let wall = 0.05 + ops as f64 * r.size as f64 / 1e9 / slowest;
            let results = r
                .pairs
                .iter()
                .map(|&(a, b)| PairResult::Measured(bw(a, b), vec![bw(a, b); r.iters as usize]))
                .collect();
            p.record(&r, results, wall);
            if let Some(l) = left.as_mut() {
                *l -= wall;
            }
            out.push(r);
            assert!(out.len() < 64, "the planner does not end");
        }
        (out, p)
    }

    #[test]
    fn the_round_robin_then_a_confirmation_of_its_slow_link() {
        let slow = |a: usize, b: usize| {
            if (a.min(b), a.max(b)) == (2, 5) {
                0.3
            } else {
                1.0
            }
        };
        let (rounds, p) = plan(false, None, slow);
        assert_eq!(rounds.len(), 8, "7 of the round robin and 1 confirming");
        assert!(rounds.iter().all(|r| r.size == 64 << 20 && !r.probe));
        let last = &rounds[7].pairs;
        assert!(last == &[(2, 5)] || last == &[(5, 2)], "{last:?}");
        assert_eq!(p.best.len(), 28);
    }

    #[test]
    fn a_budget_probes_sizes_the_rounds_and_measures_every_pair_it_can_afford() {
        let slow = |a: usize, b: usize| {
            if (a.min(b), a.max(b)) == (2, 5) {
                0.3
            } else {
                1.0
            }
        };
        // 8 s: the probe, then rounds sized so the adaptive and the round robin's rounds fit.
        let (rounds, p) = plan(true, Some(8.0), slow);
        assert!(rounds[0].probe && rounds[0].size == budget::PROBE_SIZE);
        let size = rounds[1].size;
        assert!(rounds[1..].iter().all(|r| r.size == size && !r.probe));
        // 7.94 s left for 10 rounds of 4 ops: 32 MiB (64 would take 9.4 s).
        assert_eq!(size, 32 << 20);
        // Every pair measured, the slow link twice (confirmed), and named.
        assert_eq!(p.best.len(), 28, "{rounds:?}");
        let times = rounds[1..]
            .iter()
            .flat_map(|r| &r.pairs)
            .filter(|&&(a, b)| (a.min(b), a.max(b)) == (2, 5))
            .count();
        assert_eq!(times, 2);
        let (m, measured, _) = p.finish(Some((
            std::time::Duration::from_secs(7),
            std::time::Duration::from_secs(8),
        )));
        let j = analysis::judge(&m.nodes, &measured, 0.25);
        assert_eq!(j.unexplained.len(), 1);
        assert!(m.budget.is_some_and(|b| b.contains("28 of 28 pairs")));
        // A fifth of a second: the probe and what fits (each round costs 0.05 s here).
        let (rounds, p) = plan(true, Some(0.2), slow);
        assert!(rounds.len() < 9 && p.best.len() < 28, "{rounds:?}");
        // Without a budget the adaptive pairing alone: a few rounds, no round robin.
        let (rounds, p) = plan(true, None, |_, _| 1.0);
        assert_eq!(rounds.len(), 1);
        assert_eq!(p.best.len(), 4);
    }

    /// A node no partner can exchange data with (node 3: every pair with it fails, both
    /// ends answering) is re-paired like a slow node and its pairs come back as failures;
    /// a node given up on mid-pairing (node 5) is in no round after, and its pairs count
    /// for nothing.
    #[test]
    fn failed_pairs_count_as_nothing_delivered_and_a_lost_node_is_never_paired_again() {
        static TIER: fn(usize, usize) -> String = |_, _| "block".to_string();
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let pairing = Some(Pairing::new(vec![vec![0]; 8], Settings::default()));
        let mut p = Planner::with(names.clone(), &TIER, pairing, false, (1 << 20, 3), 0.25);
        let mut rounds = Vec::new();
        while let Some(r) = p.next(None) {
            let results = r
                .pairs
                .iter()
                .map(|&(a, b)| {
                    if a == 3 || b == 3 {
                        PairResult::Failed(format!("no route to n3 from n{}", a + b - 3))
                    } else {
                        PairResult::Measured(1.0, vec![1.0; 3])
                    }
                })
                .collect();
            if rounds.is_empty() {
                // Node 5 stops answering after the first round.
                p.lose(5);
            }
            p.record(&r, results, 0.1);
            rounds.push(r.pairs);
            assert!(rounds.len() < 16, "the planner does not end");
        }
        assert!(
            rounds[1..].iter().flatten().all(|&(a, b)| a != 5 && b != 5),
            "{rounds:?}"
        );
        let (m, measured, failed) = p.finish(None);
        assert!(measured.iter().all(|l| l.a != 5 && l.b != 5));
        let with3: Vec<&((usize, usize), String)> = failed.iter().collect();
        assert!(with3.len() >= 2, "{rounds:?}");
        assert!(with3
            .iter()
            .all(|((a, b), why)| (*a == 3 || *b == 3) && why.starts_with("no route")));
        let j = analysis::judge(&m.nodes, &measured, 0.25);
        let suspects: Vec<&str> = j.suspects.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(suspects, ["n3"], "{rounds:?}");
        assert!(j.unexplained.is_empty(), "{rounds:?}");
    }
}
