//! AllReduce algorithm selection: `--algo ring|tree|auto`, NCCL_ALGO's counterpart.
//!
//! NCCL picks the algorithm per call from a cost model (`src/graph/tuning.cc`, compat spec
//! §5.4): `time = latency + bytes / bandwidth` per (algorithm, protocol), smallest wins. Its
//! constants describe GPUs, NVLink and NICs; ours are measured instead ([`calibrate`]), once,
//! when the communicator starts, because a TCP loopback on a laptop and a 100 Gb/s fabric
//! differ by orders of magnitude in both terms.
//!
//! Ranks must agree on the algorithm of every call (a rank running the ring while its peer runs
//! the tree waits forever), so the measured model is combined across ranks before anyone uses
//! it: every rank holds the very same bits and [`CostModel::choose`] is a pure function of them.

use crate::algorithms::direct::direct_all_reduce;
use crate::algorithms::doubling::all_reduce_values;
use crate::algorithms::doubling::{doubling_all_reduce, doubling_hops};
use crate::algorithms::ring::all_reduce;
use crate::algorithms::tree::{node_tree_depth, tree_all_reduce};
use crate::dtype::{DataType, ParseNameError, ReduceOp};
use crate::engine::data::{bytes_of, Data};
use crate::error::CommError;
use crate::link::Communicator;
use crate::HostBuffer;
use std::fmt;
use std::str::FromStr;
use std::time::Instant;

/// An AllReduce algorithm, or the request to choose one per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algo {
    Ring,
    Tree,
    /// Recursive doubling ([`crate::algorithms::doubling`]), MPI's short-message AllReduce.
    Doubling,
    /// Ranks of one host reading and writing each other's buffers ([`crate::algorithms::direct`]); the
    /// ring where that cannot be.
    Direct,
    Auto,
}

impl Algo {
    pub const ALL: [Algo; 5] = [
        Algo::Ring,
        Algo::Tree,
        Algo::Doubling,
        Algo::Direct,
        Algo::Auto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Tree => "tree",
            Algo::Doubling => "rd",
            Algo::Direct => "direct",
            Algo::Auto => "auto",
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = ParseNameError;
    /// Case-insensitive, so NCCL_ALGO-style spellings (`Ring`, `Tree`) work as they are.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ring" => Ok(Algo::Ring),
            "tree" => Ok(Algo::Tree),
            "rd" | "recursive-doubling" | "recursive_doubling" => Ok(Algo::Doubling),
            "direct" => Ok(Algo::Direct),
            "auto" => Ok(Algo::Auto),
            _ => Err(ParseNameError {
                what: "algorithm",
                value: s.to_string(),
                expected: Algo::ALL.map(Algo::name).join(", "),
            }),
        }
    }
}

/// NCCL's bandwidth cost of the double binary tree relative to `bytes / beta`, used until
/// [`calibrate`] measures the real one.
///
/// Each tree carries half of the data, and a rank that is interior in one tree (a leaf in the
/// other) sends `S/2` up plus `S/2` to each of two children there, and `S/2` up in the other
/// tree: `2·S` out and, symmetrically, `2·S` in, against the ring's `2(n-1)/n · S`. NCCL's
/// tuning.cc gets the same factor 2 (tree algbw = busBw × 0.5) and charges the tree another
/// 0.92 efficiency: `2 / 0.92`. That assumes each rank's own link is the bottleneck; when
/// ranks share a host's cores and memory (a local run) the total bytes copied count instead,
/// and those are the same for both algorithms, so the measured factor comes out near the
/// ring's.
pub const NCCL_TREE_BW_FACTOR: f64 = 2.0 / 0.92;

/// How much faster than the ring another algorithm must be predicted to be chosen.
pub const RING_MARGIN: f64 = 0.1;

/// The algorithms [`calibrate`] times, in [`Measured::secs`]' order.
pub const PROBED: [Algo; 4] = [Algo::Ring, Algo::Tree, Algo::Doubling, Algo::Direct];

/// Every probed algorithm timed at a few sizes on this job: what [`CostModel::choose`] goes
/// by when present, instead of the hop formulas of [`CostModel::predict`], which assume that
/// a hop costs the same in every algorithm. It does not: recursive doubling's exchange is one
/// message each way and the ring's step a pipelined chunk, and on shared memory the cache
/// traffic of each differs more than their hop counts do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// Probe sizes, ascending.
    pub bytes: [usize; 4],
    /// Seconds per call (lower quartile of the repetitions), `[algorithm in PROBED order][probe]`; infinite for an
    /// algorithm that cannot run on this job (the direct one across hosts, or where buffers
    /// cannot be mapped).
    pub secs: [[f64; 4]; 4],
}

impl Measured {
    /// Seconds for `bytes` with `PROBED[a]`: linear between the probes, the smallest probe's
    /// time below it (latency-bound), and the last stretch's slope (bandwidth) beyond the
    /// largest.
    pub fn time(&self, a: usize, bytes: usize) -> f64 {
        let (xs, ys) = (&self.bytes, &self.secs[a]);
        if ys.iter().any(|y| !y.is_finite()) {
            return f64::INFINITY;
        }
        let x = bytes as f64;
        if bytes <= xs[0] {
            return ys[0];
        }
        let last = xs.len() - 1;
        let seg = (1..=last).find(|&i| bytes <= xs[i]).unwrap_or(last);
        let (x0, x1) = (xs[seg - 1] as f64, xs[seg] as f64);
        if x1 <= x0 {
            return ys[seg];
        }
        let slope = (ys[seg] - ys[seg - 1]) / (x1 - x0);
        if bytes > xs[last] {
            // Time cannot shrink with size, whatever noise says.
            return ys[last] + slope.max(0.0) * (x - x1);
        }
        ys[seg - 1] + slope * (x - x0)
    }
}

/// A two-parameter (alpha-beta) cost model of one job's links, plus the tree's measured
/// bandwidth factor, and (from [`calibrate`]) every algorithm's measured times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Latency of one hop (a message from a rank to its neighbour and the neighbour acting
    /// on it), in microseconds.
    pub alpha_us: f64,
    /// Bandwidth of one rank's link, GB/s (1e9 bytes per second).
    pub beta_gbps: f64,
    /// The tree's bandwidth term is `tree_bw_factor · bytes / beta` (the ring's is
    /// `2(n-1)/n · bytes / beta`); see [`NCCL_TREE_BW_FACTOR`].
    pub tree_bw_factor: f64,
    /// Measured times per algorithm and size, which the choice follows when present.
    pub measured: Option<Measured>,
}

/// Depth of the trees when every rank is its own node (the local case [`calibrate`]
/// measures).
fn tree_depth(nranks: usize) -> usize {
    node_tree_depth(nranks)
}

impl CostModel {
    /// A model with NCCL's tree bandwidth factor, for links whose numbers are known.
    pub fn new(alpha_us: f64, beta_gbps: f64) -> Self {
        CostModel {
            alpha_us,
            beta_gbps,
            tree_bw_factor: NCCL_TREE_BW_FACTOR,
            measured: None,
        }
    }

    /// Predicted seconds for an AllReduce of `bytes` over `nranks` ranks.
    ///
    /// - Ring (compat spec §5.2): `2(n-1)` sequential steps, each one hop of latency, and
    ///   every rank sends `2(n-1)/n · bytes` (reduce-scatter then all-gather):
    ///   `2(n-1)·α + 2(n-1)/n · bytes/β`. Pipelining by segments overlaps the steps, so the
    ///   bandwidth term is the link's, not the sum over steps.
    /// - Double binary tree (§5.3/5.4): reduce up then broadcast down, `2·depth` hops, and
    ///   `tree_bw_factor · bytes/β`. NCCL's tree latency is likewise per tree level
    ///   (`2·(ppn-1 + log2 nNodes)` hops); here every rank is its own node.
    /// - Recursive doubling: `hops` exchanges of the whole buffer, each a hop and a full
    ///   transfer: `hops·α + hops · bytes/β`.
    /// - Auto: the smallest.
    pub fn predict(&self, algo: Algo, bytes: usize, nranks: usize) -> f64 {
        if nranks <= 1 {
            return 0.0;
        }
        let alpha = self.alpha_us.max(0.0) * 1e-6;
        let beta = self.beta_gbps.max(1e-9) * 1e9;
        let n = nranks as f64;
        let b = bytes as f64;
        match algo {
            Algo::Ring => 2.0 * (n - 1.0) * alpha + 2.0 * (n - 1.0) / n * b / beta,
            Algo::Tree => {
                2.0 * tree_depth(nranks) as f64 * alpha + self.tree_bw_factor.max(0.0) * b / beta
            }
            Algo::Doubling => {
                let hops = doubling_hops(nranks) as f64;
                hops * alpha + hops * b / beta
            }
            // Whether it can run at all depends on the job's memory, which only a
            // measurement finds out: never predicted faster.
            Algo::Direct => f64::INFINITY,
            Algo::Auto => self.predict(self.choose(bytes, nranks), bytes, nranks),
        }
    }

    /// The algorithm predicted to be fastest; never [`Algo::Auto`]. The ring, the algorithm
    /// every collective supports and the one nccl-tests figures are compared with, is
    /// replaced only by an algorithm predicted at least [`RING_MARGIN`] faster: the
    /// bandwidth terms come from a few runs on a possibly busy machine, and where two
    /// predictions are that close the measured difference is noise (on two local ranks the
    /// tree and the ring move the same bytes).
    ///
    /// With [`CostModel::measured`], the times compared are the measured ones (interpolated
    /// between the probe sizes), so the choice is this machine's, per size and for this
    /// job's rank count.
    pub fn choose(&self, bytes: usize, nranks: usize) -> Algo {
        if nranks <= 1 {
            return Algo::Ring;
        }
        let time = |a: Algo| match (&self.measured, PROBED.iter().position(|&p| p == a)) {
            (Some(m), Some(i)) => m.time(i, bytes),
            _ => self.predict(a, bytes, nranks),
        };
        let ring = time(Algo::Ring);
        let mut best = (Algo::Ring, ring);
        for a in [Algo::Tree, Algo::Doubling, Algo::Direct] {
            let t = time(a);
            if t < ring * (1.0 - RING_MARGIN) && t < best.1 {
                best = (a, t);
            }
        }
        best.0
    }

    /// Largest message size for which something other than the ring is chosen (0 if
    /// never): from the next byte on, the ring runs. For reports.
    pub fn crossover_bytes(&self, nranks: usize) -> usize {
        let (mut lo, mut hi) = (0usize, 1usize << 40);
        if self.choose(1, nranks) == Algo::Ring {
            return 0;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.choose(mid, nranks) != Algo::Ring {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// Repetitions of the calibration runs: well under a second for eight local ranks. The
/// small probes cost microseconds and are the noisiest (one preemption is many times their
/// length), so they repeat most; the largest probe is bandwidth-bound, large enough for both
/// trees at the default segment size, and repeats least, being the longest. Five, not three:
/// with three, one burst of load from elsewhere across two of them picked recursive doubling
/// at 2 MiB over TCP (twice the ring's time) for a whole run.
const LARGE_BYTES: usize = 2 << 20;
/// Bytes the probes rotate over: the harness's default rotation window.
const WINDOW: usize = 8 << 20;
fn reps_for(bytes: usize) -> usize {
    match bytes {
        b if b <= 16 << 10 => 25,
        b if b < LARGE_BYTES => 9,
        _ => 5,
    }
}

/// Seconds one probe size may take, every algorithm together, before its repetitions are cut
/// down (never below [`MIN_REPS`]). Local ranks stay far inside it; on a slow or large job
/// (1 Gbit/s TCP, hundreds of ranks whose ring pays 2(n-1) hops, emulated RDMA) the fixed
/// counts cost seconds per probe and the job's start-up would be mostly calibration.
const PROBE_BUDGET_SECS: f64 = 0.25;
const MIN_REPS: usize = 3;

/// Repetitions of a probe whose first timed round took `round_secs` (every algorithm, the
/// slowest rank's times): all ranks pass the same maximum, so all repeat alike.
fn reps_within_budget(bytes: usize, round_secs: f64) -> usize {
    let most = reps_for(bytes);
    if round_secs.is_nan() || round_secs <= 0.0 || round_secs.is_infinite() {
        return most;
    }
    // The round already taken counts as one.
    let fit = (PROBE_BUDGET_SECS / round_secs).floor() as usize;
    fit.clamp(MIN_REPS, most)
}

/// Seconds of one AllReduce of `bytes` (float sum, out of place, at offset `at` of both
/// buffers) with `algo`; infinite when another algorithm ran in its place.
fn time_one(
    comm: &mut Communicator,
    bufs: &mut (HostBuffer, HostBuffer),
    algo: Algo,
    bytes: usize,
    at: usize,
) -> Result<f64, CommError> {
    let (send, recv) = bufs;
    let t0 = Instant::now();
    let ran = all_reduce_with(
        comm,
        Data::out_of_place(
            &send.as_slice()[at..at + bytes],
            &mut recv.as_mut_slice()[at..at + bytes],
        ),
        bytes / 4,
        DataType::Float32,
        ReduceOp::Sum,
        algo,
        None,
    )?;
    let t = t0.elapsed().as_secs_f64();
    Ok(if ran == algo { t } else { f64::INFINITY })
}

/// The lower quartile: load from elsewhere only ever adds time, so the faster runs say more
/// about what an algorithm costs than the middle one does, while one lucky run among many
/// still cannot decide alone (with the five large probes it is the second fastest).
fn low_quartile(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 4).copied().unwrap_or(0.0)
}

/// Measure the job's [`CostModel`]: every algorithm of [`PROBED`] at four sizes, from one
/// that gives every ring chunk at least one element (so no step is skipped; the hop latency)
/// to [`LARGE_BYTES`] (the bandwidth), the algorithms in a rotating order so that load from
/// elsewhere hits all alike, each timed run after an untimed one of the same algorithm on
/// the same slot (as the timed loop finds its buffers), lower quartiles throughout: one
/// preempted repetition must not move the model. Each probe repeats as often as [`PROBE_BUDGET_SECS`] allows. The alpha-beta
/// terms are fitted to the ring's and the tree's times, for reports.
///
/// A collective: every rank calls it at the same point, and every rank returns the identical
/// model (built from the element-wise maximum of all ranks' measurements), so all choose the
/// same algorithm for every call.
pub fn calibrate(comm: &mut Communicator) -> Result<CostModel, CommError> {
    let n = comm.size();
    // Zeroed input: sums stay 0, no denormals or infinities slow the float adds. Shared, as
    // the harness's buffers are, so that the direct AllReduce is timed as it will run. Out of
    // place, as the table's first columns, and each repetition in the next `bytes`-sized slot
    // of WINDOW-byte buffers, as the timed loop rotates over its window: data from memory, not
    // from a core's cache. Probing one slot in place over and over timed a case the harness
    // never runs, and the choices it made measured differently alone and inside a sweep (TCP,
    // two ranks, 2 MiB: 1.37x inside; 0.98x with these probes; BENCHMARKS.md).
    let shared = || {
        HostBuffer::shared(WINDOW).ok_or(CommError::OutOfMemory {
            rank: comm.rank(),
            bytes: WINDOW,
            what: "calibration buffer",
        })
    };
    let mut buf = (shared()?, shared()?);
    let small = (4 * n.max(256)).min(LARGE_BYTES);
    let probes = [
        small,
        (16 << 10).max(small),
        (256 << 10).max(small),
        LARGE_BYTES,
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); PROBED.len() * probes.len()];
    for (p, &bytes) in probes.iter().enumerate() {
        let mut reps = reps_for(bytes);
        // Round 0 is untimed: it opens connections and grows buffers. After round 1 the ranks
        // agree on how many more rounds fit the budget.
        let mut rep = 0;
        while rep <= reps {
            for k in 0..PROBED.len() {
                let a = (k + rep) % PROBED.len();
                if PROBED[a] == Algo::Direct && !crate::algorithms::direct::applicable(comm) {
                    if rep > 0 {
                        samples[a * probes.len() + p].push(f64::INFINITY);
                    }
                    continue;
                }
                let slots = (WINDOW / bytes).max(1);
                let at = (rep * PROBED.len() + k) % slots * bytes;
                // Once untimed on the same slot first: the timed loop runs one algorithm call
                // after call, so its lines sit where that algorithm left them, where after
                // another algorithm they sit modified in the other rank's cache (the direct
                // AllReduce at 2 MiB took 3.5x its loop's time after the ring, and auto
                // chose the ring, a third of its speed, at 128 MiB in half of the runs).
                time_one(comm, &mut buf, PROBED[a], bytes, at)?;
                let t = time_one(comm, &mut buf, PROBED[a], bytes, at)?;
                if rep > 0 {
                    samples[a * probes.len() + p].push(t);
                }
            }
            if rep == 1 {
                let mut round = [(0..PROBED.len())
                    .map(|a| samples[a * probes.len() + p][0])
                    .filter(|t| t.is_finite())
                    .sum::<f64>()];
                all_reduce_values(comm, &mut round, ReduceOp::Max)?;
                // Each timed call came with its untimed twin.
                reps = reps_within_budget(bytes, 2.0 * round[0]);
            }
            rep += 1;
        }
    }
    let mut v: Vec<f64> = samples.into_iter().map(low_quartile).collect();
    all_reduce_values(comm, &mut v, ReduceOp::Max)?;
    let mut secs = [[0.0; 4]; 4];
    for (a, row) in secs.iter_mut().enumerate() {
        row.copy_from_slice(&v[a * probes.len()..(a + 1) * probes.len()]);
    }
    let last = probes.len() - 1;
    let model = model_from(n, secs[0][0], secs[0][last], secs[1][last]);
    Ok(CostModel {
        measured: Some(Measured {
            bytes: probes,
            secs,
        }),
        ..model
    })
}

/// Fit the model to a small and a large ring time and a large tree time (seconds) under the
/// formulas of [`CostModel::predict`].
fn model_from(n: usize, small: f64, ring: f64, tree: f64) -> CostModel {
    if n <= 1 {
        return CostModel::new(0.0, f64::INFINITY);
    }
    let steps = 2.0 * (n as f64 - 1.0);
    let alpha = small / steps;
    // The large runs pay the same latency; what remains is the bandwidth term. Floor it at a
    // tenth of the measurement so noise cannot produce an absurd bandwidth.
    let transfer = |t: f64, hops: f64| (t - hops * alpha).max(t * 0.1).max(1e-9);
    let beta = steps / n as f64 * LARGE_BYTES as f64 / transfer(ring, steps);
    let depth = 2.0 * tree_depth(n) as f64;
    let factor = transfer(tree, depth) * beta / LARGE_BYTES as f64;
    CostModel {
        alpha_us: alpha * 1e6,
        beta_gbps: beta / 1e9,
        tree_bw_factor: factor.clamp(0.25, 16.0),
        measured: None,
    }
}

/// AllReduce with an explicit algorithm, or the model's choice for [`Algo::Auto`] (which then
/// requires a model). Returns the algorithm that ran.
pub fn all_reduce_with(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    algo: Algo,
    model: Option<&CostModel>,
) -> Result<Algo, CommError> {
    let chosen = match (algo, model) {
        (Algo::Auto, Some(m)) => m.choose(bytes_of(count, dtype)?, comm.size()),
        (Algo::Auto, None) => {
            return Err(CommError::Invalid(format!(
                "rank {}: all_reduce: algorithm 'auto' needs a cost model (calibrate the communicator first)",
                comm.rank()
            )))
        }
        (a, _) => a,
    };
    match chosen {
        Algo::Tree => tree_all_reduce(comm, data, count, dtype, op)?,
        Algo::Doubling => doubling_all_reduce(comm, data, count, dtype, op)?,
        Algo::Direct => {
            if !direct_all_reduce(comm, data, count, dtype, op)? {
                return Ok(Algo::Ring);
            }
        }
        Algo::Ring | Algo::Auto => all_reduce(comm, data, count, dtype, op)?,
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fast probes keep every repetition; slow ones (a large or emulated job) are cut to what
    /// fits the budget, never below three, so that one slowed run still cannot decide.
    #[test]
    fn slow_probes_repeat_less() {
        assert_eq!(reps_within_budget(1024, 20e-6), reps_for(1024));
        assert_eq!(reps_within_budget(LARGE_BYTES, 0.01), reps_for(LARGE_BYTES));
        assert_eq!(reps_within_budget(1024, 0.025), 10);
        assert_eq!(reps_within_budget(1024, 0.2), MIN_REPS);
        assert_eq!(reps_within_budget(LARGE_BYTES, 3.0), MIN_REPS);
        assert_eq!(reps_within_budget(1024, f64::NAN), reps_for(1024));
    }

    /// Slowed runs (load from elsewhere) do not move the estimate; one lucky run alone does
    /// not decide it either once there are enough repetitions.
    #[test]
    fn calibration_takes_the_lower_quartile() {
        let large = vec![2100.0, 600.0, 1900.0, 650.0, 2000.0];
        assert_eq!(large.len(), reps_for(LARGE_BYTES));
        assert_eq!(low_quartile(large), 650.0);
        let mut small: Vec<f64> = (0..reps_for(1024)).map(|i| 10.0 + i as f64).collect();
        small[7] = 1.0;
        assert_eq!(low_quartile(small), 15.0);
        assert_eq!(low_quartile(vec![f64::INFINITY; 5]), f64::INFINITY);
    }

    #[test]
    fn names_parse_case_insensitively() {
        for a in Algo::ALL {
            assert_eq!(a.name().parse::<Algo>().unwrap(), a);
            assert_eq!(a.to_string().to_uppercase().parse::<Algo>().unwrap(), a);
        }
        assert_eq!("Ring".parse::<Algo>().unwrap(), Algo::Ring);
        assert_eq!("Tree".parse::<Algo>().unwrap(), Algo::Tree);
        let e = "collnet".parse::<Algo>().unwrap_err().to_string();
        assert!(
            e.contains("collnet") && e.contains("ring, tree, rd, direct, auto"),
            "{e}"
        );
    }

    #[test]
    fn model_prefers_tree_small_and_ring_large() {
        let m = CostModel::new(20.0, 2.0);
        assert!(m.predict(Algo::Tree, 8, 8) < m.predict(Algo::Ring, 8, 8));
        assert_eq!(
            m.choose(8, 8),
            Algo::Doubling,
            "fewest hops wins the shortest messages"
        );
        assert_eq!(m.choose(256 << 20, 8), Algo::Ring);
        assert_eq!(
            m.choose(1 << 20, 1),
            Algo::Ring,
            "one rank: nothing to gain"
        );
        // Recursive doubling, then the tree, then the ring.
        let x = m.crossover_bytes(8);
        assert!(x > 0 && m.choose(x, 8) == Algo::Tree && m.choose(x + 1, 8) == Algo::Ring);
        // The tree (6 hops, 2/0.92 per byte) stops being RING_MARGIN faster than the ring
        // (14 hops, 1.75 per byte) where 6α + f·x/β = (1 - margin)(14α + 1.75·x/β).
        let keep = 1.0 - RING_MARGIN;
        let want = (keep * 14.0 - 6.0) * 20e-6 * 2e9 / (NCCL_TREE_BW_FACTOR - keep * 1.75);
        assert!((x as f64 - want).abs() < 2.0, "{x} vs {want}");
        for a in [Algo::Ring, Algo::Tree] {
            assert!(m.predict(a, 1 << 20, 8) < m.predict(a, 2 << 20, 8));
        }
        assert_eq!(m.predict(Algo::Auto, 8, 8), m.predict(Algo::Doubling, 8, 8));
        // Recursive doubling on 8 ranks: 3 hops, each moving the whole buffer.
        assert!((m.predict(Algo::Doubling, 0, 8) - 3.0 * 20e-6).abs() < 1e-12);
        let b = 1e6;
        let want = 3.0 * 20e-6 + 3.0 * b / 2e9;
        assert!((m.predict(Algo::Doubling, b as usize, 8) - want).abs() < 1e-12);
    }

    #[test]
    fn model_fit_recovers_its_parameters() {
        let truth = CostModel {
            alpha_us: 15.0,
            beta_gbps: 3.0,
            tree_bw_factor: 1.9,
            measured: None,
        };
        let small = truth.predict(Algo::Ring, 0, 8);
        let ring = truth.predict(Algo::Ring, LARGE_BYTES, 8);
        let tree = truth.predict(Algo::Tree, LARGE_BYTES, 8);
        let m = model_from(8, small, ring, tree);
        assert!((m.alpha_us - 15.0).abs() < 1e-9, "{m:?}");
        assert!((m.beta_gbps - 3.0).abs() < 1e-9, "{m:?}");
        assert!((m.tree_bw_factor - 1.9).abs() < 1e-9, "{m:?}");
        // A tree as fast as the ring per byte wins until its latency advantage is less than
        // the margin; a tree clearly faster per byte wins at every size.
        let same = CostModel {
            tree_bw_factor: 1.75,
            ..truth
        };
        let keep = 1.0 - RING_MARGIN;
        let want = (keep * 14.0 - 6.0) * 15e-6 * 3e9 / (1.75 - keep * 1.75);
        let x = same.crossover_bytes(8) as f64;
        assert!((x - want).abs() < 2.0, "{x} vs {want}");
        let fast = CostModel {
            tree_bw_factor: 1.5,
            ..truth
        };
        assert_eq!(fast.crossover_bytes(8), (1usize << 40) - 1);
    }

    #[test]
    fn measured_times_decide_where_present() {
        // Hop formulas say recursive doubling at 8 B; the measurements say the ring is faster
        // up to 16 KiB, then the tree, then the ring again from some size beyond 256 KiB.
        let ms = |v: [f64; 4]| v.map(|x| x * 1e-6);
        let m = CostModel {
            measured: Some(Measured {
                bytes: [1024, 16 << 10, 256 << 10, 2 << 20],
                secs: [
                    ms([1.0, 4.0, 60.0, 400.0]),
                    ms([3.0, 5.0, 40.0, 440.0]),
                    ms([2.0, 8.0, 90.0, 900.0]),
                    [f64::INFINITY; 4],
                ],
            }),
            ..CostModel::new(20.0, 2.0)
        };
        assert_eq!(CostModel::new(20.0, 2.0).choose(8, 2), Algo::Doubling);
        assert_eq!(m.choose(8, 2), Algo::Ring);
        assert_eq!(
            m.choose(16 << 10, 2),
            Algo::Ring,
            "the tree is not 10 % faster"
        );
        assert_eq!(m.choose(256 << 10, 2), Algo::Tree);
        assert_eq!(m.choose(64 << 20, 2), Algo::Ring);
        assert_eq!(m.choose(1 << 20, 1), Algo::Ring, "one rank");
        let t = m.measured.unwrap();
        // Linear between probes, flat below, the last slope beyond.
        assert!((t.time(0, 8) - 1e-6).abs() < 1e-15);
        assert!((t.time(0, (16 << 10) + (240 << 10) / 2) - 32e-6).abs() < 1e-12);
        let slope = 340e-6 / ((2 << 20) - (256 << 10)) as f64;
        let far = t.time(0, 4 << 20);
        assert!((far - (400e-6 + slope * (2 << 20) as f64)).abs() < 1e-12);
        // A noisy last stretch that falls does not predict faster large calls.
        let mut noisy = t;
        noisy.secs[2][3] = 80e-6;
        assert_eq!(noisy.time(2, 64 << 20), 80e-6);
    }
}
