//! A synthetic fabric for the schedule's simulations (issue 39, point 4): nodes in nested
//! domains (tiers), a bandwidth per tier, noise, slow nodes, slow uplinks of the tree (a
//! block's links to the tier above), slow paths between two given nodes, and stragglers,
//! all from a seed.
//! It answers what a round of pairs would measure, so [`crate::adaptive`] can be run at
//! 16,384 nodes in milliseconds and scored: rounds, bytes moved, precision and recall per
//! fault kind.

use crate::adaptive::{self, Attribution, Settings};
use crate::analysis::{judge, stragglers, uplinks, without_stragglers, Measured};
use crate::uplink::{self, Domain};

/// `busbw tiers`' default `--slow-fraction`.
const GATE_SLOW_FRACTION: f64 = 0.25;
use std::collections::BTreeSet;

/// SplitMix64: small, seedable, and the same everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// The fabric's shape and faults.
#[derive(Clone, Debug)]
pub struct Fabric {
    /// `domains[node][level]`, closest level first.
    pub domains: Vec<Vec<u32>>,
    /// Bandwidth of a link by its tier (index = level; the last entry for nodes sharing no
    /// domain), GB/s.
    pub tier_bw: Vec<f64>,
    /// Slow nodes and the fraction of their bandwidth they keep.
    pub slow_nodes: Vec<(usize, f64)>,
    /// Slow paths between two given nodes (a < b: one ECMP path, say) and the fraction
    /// they keep.
    pub slow_links: Vec<((usize, usize), f64)>,
    /// Domains (level, id) whose uplink keeps only a fraction: every pair leaving them.
    pub slow_uplinks: Vec<(Domain, f64)>,
    /// Stragglers: the chance that any one of their iterations is slowed, and the fraction
    /// such an iteration keeps.
    pub stragglers: Vec<(usize, f64, f64)>,
    /// Timed iterations per pair (`--pairwise-iters`).
    pub iters: usize,
    /// Relative noise of a measurement (uniform in ±noise).
    pub noise: f64,
}

impl Fabric {
    /// `n` nodes in OCI-like nesting: local blocks of `per[0]` nodes, network blocks of
    /// `per[1]` local blocks, ...; `tier_bw[l]` for a link in level `l` (closest first) and
    /// one more for none shared.
    pub fn nested(n: usize, per: &[usize], tier_bw: Vec<f64>, noise: f64) -> Fabric {
        let domains = (0..n)
            .map(|node| {
                let mut size = 1;
                per.iter()
                    .map(|&p| {
                        size *= p.max(1);
                        (node / size) as u32
                    })
                    .collect()
            })
            .collect();
        Fabric {
            domains,
            tier_bw,
            slow_nodes: Vec::new(),
            slow_links: Vec::new(),
            slow_uplinks: Vec::new(),
            stragglers: Vec::new(),
            iters: 5,
            noise,
        }
    }

    /// `k` distinct slow nodes and `m` slow links between other nodes, each keeping
    /// `keep` of its bandwidth.
    pub fn with_faults(mut self, k: usize, m: usize, keep: f64, rng: &mut Rng) -> Fabric {
        let n = self.domains.len();
        let mut taken = BTreeSet::new();
        while self.slow_nodes.len() < k.min(n) {
            let x = rng.below(n);
            if taken.insert(x) {
                self.slow_nodes.push((x, keep));
            }
        }
        let mut tries = 0;
        while self.slow_links.len() < m && tries < 1000 {
            tries += 1;
            let (a, b) = (rng.below(n), rng.below(n));
            if a == b || taken.contains(&a) || taken.contains(&b) {
                continue;
            }
            taken.insert(a);
            taken.insert(b);
            self.slow_links.push(((a.min(b), a.max(b)), keep));
        }
        self
    }

    /// `u` slow uplinks, each of a domain at a random level whose nodes have no other
    /// fault (all of them together at most an eighth of the nodes), each keeping `keep`.
    pub fn with_uplinks(mut self, u: usize, keep: f64, rng: &mut Rng) -> Fabric {
        let n = self.domains.len();
        let levels = self.domains.first().map_or(0, Vec::len);
        let mut taken: BTreeSet<usize> = self.slow_nodes.iter().map(|x| x.0).collect();
        for &((a, b), _) in &self.slow_links {
            taken.insert(a);
            taken.insert(b);
        }
        let members = |(l, id): Domain| -> Vec<usize> {
            (0..n).filter(|&x| self.domains[x][l] == id).collect()
        };
        let mut tries = 0;
        while self.slow_uplinks.len() < u && tries < 1000 && levels > 0 {
            tries += 1;
            let x = rng.below(n);
            let l = rng.below(levels);
            let d = (l, self.domains[x][l]);
            let m = members(d);
            // All the uplinks' nodes together at most an eighth of the fabric: most pairs
            // of a round stay healthy, so their median is the tiers' expectation.
            let behind: usize = self
                .slow_uplinks
                .iter()
                .map(|&((l, id), _)| self.domains.iter().filter(|dx| dx[l] == id).count())
                .sum();
            if m.len() < 2 || 8 * (behind + m.len()) > n || m.iter().any(|y| taken.contains(y)) {
                continue;
            }
            taken.extend(m);
            self.slow_uplinks.push((d, keep));
        }
        self
    }

    /// `s` stragglers among the nodes without a fault, each iteration of theirs slowed with
    /// chance `p` to `keep` of the bandwidth.
    pub fn with_stragglers(mut self, s: usize, p: f64, keep: f64, rng: &mut Rng) -> Fabric {
        let n = self.domains.len();
        let mut taken: BTreeSet<usize> = self.slow_nodes.iter().map(|x| x.0).collect();
        for &((a, b), _) in &self.slow_links {
            taken.insert(a);
            taken.insert(b);
        }
        for &((l, id), _) in &self.slow_uplinks {
            taken.extend((0..n).filter(|&x| self.domains[x][l] == id));
        }
        let mut tries = 0;
        while self.stragglers.len() < s && tries < 1000 {
            tries += 1;
            let x = rng.below(n);
            if taken.insert(x) {
                self.stragglers.push((x, p, keep));
            }
        }
        self
    }

    fn tier(&self, a: usize, b: usize) -> usize {
        uplink::tier(&self.domains, a, b)
    }

    /// What sendrecv between `a` and `b` measures.
    pub fn measure(&self, a: usize, b: usize, rng: &mut Rng) -> f64 {
        let t = self.tier(a, b).min(self.tier_bw.len() - 1);
        let mut bw = self.tier_bw[t];
        for &(x, keep) in &self.slow_nodes {
            if x == a || x == b {
                bw = bw.min(self.tier_bw[t] * keep);
            }
        }
        for &((x, y), keep) in &self.slow_links {
            if (x, y) == (a.min(b), a.max(b)) {
                bw = bw.min(self.tier_bw[t] * keep);
            }
        }
        for &(d, keep) in &self.slow_uplinks {
            if uplink::crosses(&self.domains, d, a, b) {
                bw = bw.min(self.tier_bw[t] * keep);
            }
        }
        bw * (1.0 + self.noise * (2.0 * rng.unit() - 1.0))
    }

    /// What sendrecv between `a` and `b` measures iteration by iteration, and the pair's
    /// figure (bytes over the whole loop's time: the harmonic mean).
    pub fn measure_iterations(&self, a: usize, b: usize, rng: &mut Rng) -> (f64, Vec<f64>) {
        let spikes: Vec<(f64, f64)> = self
            .stragglers
            .iter()
            .filter(|s| s.0 == a || s.0 == b)
            .map(|s| (s.1, s.2))
            .collect();
        let samples: Vec<f64> = (0..self.iters.max(1))
            .map(|_| {
                let mut bw = self.measure(a, b, rng);
                for &(p, keep) in &spikes {
                    if rng.unit() < p {
                        bw *= keep;
                    }
                }
                bw
            })
            .collect();
        let time: f64 = samples.iter().map(|b| 1.0 / b).sum();
        (samples.len() as f64 / time, samples)
    }

    /// The adaptive schedule over this fabric: what it attributed itself, and the gate's
    /// verdict (`analysis::judge` over the pairs it measured, as `busbw tiers --pairwise
    /// adaptive` reports it) in the same form.
    pub fn run(&self, settings: Settings, rng: &mut Rng) -> (Attribution, Attribution) {
        let p = adaptive::run(self.domains.clone(), settings, |pairs| {
            pairs
                .iter()
                .map(|&(a, b)| self.measure_iterations(a, b, rng))
                .collect()
        });
        let own = p.attribution();
        let names: Vec<String> = (0..self.domains.len()).map(|i| i.to_string()).collect();
        let measured: Vec<Measured> = p
            .measured_iterations()
            .into_iter()
            .map(|((a, b), bw, samples)| Measured {
                a,
                b,
                tier: self.tier(a, b).to_string(),
                busbw: bw,
                samples,
            })
            .collect();
        let mut j = judge(&names, &measured, GATE_SLOW_FRACTION);
        let up = uplinks(&self.domains, &measured, &mut j);
        let (strag, _) = stragglers(&names, &measured, &j, GATE_SLOW_FRACTION);
        without_stragglers(&mut j, &strag);
        let node = |s: &str| s.parse::<usize>().unwrap_or(usize::MAX);
        let ratio = |m: f64, e: f64| m / e.max(f64::MIN_POSITIVE);
        let gate = Attribution {
            slow_nodes: j
                .suspects
                .iter()
                .map(|s| (node(&s.node), ratio(s.measured, s.expected)))
                .collect(),
            slow_links: j
                .unexplained
                .iter()
                .map(|l| {
                    let (a, b) = (node(&l.a), node(&l.b));
                    ((a.min(b), a.max(b)), ratio(l.busbw, l.expected))
                })
                .collect(),
            slow_uplinks: up
                .iter()
                .map(|u| (u.domain, ratio(u.measured, u.expected)))
                .collect(),
            stragglers: strag.iter().map(|s| (node(&s.node), s.worst)).collect(),
            undecided: own.undecided.clone(),
            rounds: own.rounds,
            pairs: own.pairs,
        };
        (own, gate)
    }

    /// How `found` scores against the faults: (true, false, missed) for nodes and links.
    pub fn score(&self, found: &Attribution) -> Score {
        let truth_n: BTreeSet<usize> = self.slow_nodes.iter().map(|x| x.0).collect();
        let truth_l: BTreeSet<(usize, usize)> = self.slow_links.iter().map(|x| x.0).collect();
        let got_n: BTreeSet<usize> = found.slow_nodes.iter().map(|x| x.0).collect();
        let got_l: BTreeSet<(usize, usize)> = found.slow_links.iter().map(|x| x.0).collect();
        let truth_s: BTreeSet<usize> = self.stragglers.iter().map(|x| x.0).collect();
        let got_s: BTreeSet<usize> = found.stragglers.iter().map(|x| x.0).collect();
        let truth_u: BTreeSet<Domain> = self.slow_uplinks.iter().map(|x| x.0).collect();
        let got_u: BTreeSet<Domain> = found.slow_uplinks.iter().map(|x| x.0).collect();
        Score {
            uplinks: Counts {
                hit: got_u.intersection(&truth_u).count(),
                false_alarm: got_u.difference(&truth_u).count(),
                missed: truth_u.difference(&got_u).count(),
            },
            stragglers: Counts {
                hit: got_s.intersection(&truth_s).count(),
                false_alarm: got_s.difference(&truth_s).count(),
                missed: truth_s.difference(&got_s).count(),
            },
            nodes: Counts {
                hit: got_n.intersection(&truth_n).count(),
                false_alarm: got_n.difference(&truth_n).count(),
                missed: truth_n.difference(&got_n).count(),
            },
            links: Counts {
                hit: got_l.intersection(&truth_l).count(),
                false_alarm: got_l.difference(&truth_l).count(),
                missed: truth_l.difference(&got_l).count(),
            },
        }
    }
}

/// Right, wrong and missed attributions of one fault kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub hit: usize,
    pub false_alarm: usize,
    pub missed: usize,
}

impl Counts {
    pub fn add(&mut self, o: Counts) {
        self.hit += o.hit;
        self.false_alarm += o.false_alarm;
        self.missed += o.missed;
    }
    /// 1 when nothing was named.
    pub fn precision(&self) -> f64 {
        match self.hit + self.false_alarm {
            0 => 1.0,
            d => self.hit as f64 / d as f64,
        }
    }
    /// 1 when there was nothing to find.
    pub fn recall(&self) -> f64 {
        match self.hit + self.missed {
            0 => 1.0,
            d => self.hit as f64 / d as f64,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Score {
    pub nodes: Counts,
    pub links: Counts,
    pub uplinks: Counts,
    pub stragglers: Counts,
}

/// The faults of one row: slow nodes, slow uplinks, slow paths between two given nodes,
/// stragglers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mix {
    pub nodes: usize,
    pub uplinks: usize,
    pub paths: usize,
    pub stragglers: usize,
}

impl Mix {
    /// Nodes touched at most (an uplink counted as a local block of 8, the least it takes).
    pub fn nodes_touched(&self) -> usize {
        self.nodes + 8 * self.uplinks + 2 * self.paths + self.stragglers
    }
}

/// One row of the simulation table: `trials` fabrics of `n` nodes with the faults of `mix`.
#[derive(Clone, Debug)]
pub struct Row {
    pub n: usize,
    pub mix: Mix,
    pub trials: usize,
    pub rounds_max: usize,
    pub rounds_median: f64,
    /// Pairs measured per trial, median; times the message size is the bytes moved.
    pub pairs_median: f64,
    /// Round robin's pairs for the same fabric, n(n-1)/2, in n-1 rounds.
    pub full_pairs: usize,
    pub nodes: Counts,
    pub uplinks: Counts,
    pub links: Counts,
    pub stragglers: Counts,
    pub undecided: usize,
}

/// A straggler's chance that an iteration is slowed (half of the time, as the trials'
/// flapping node).
pub const STRAGGLER_SPIKE_CHANCE: f64 = 0.5;

/// OCI-like nesting (8 nodes a local block, 8 blocks a network block, 16 network blocks
/// an island): 200, 100, 50 and 25 Gbit/s-like tiers; 3 % noise; faults keep 30 %;
/// stragglers slowed to 30 % in half of their iterations; 5 iterations a pair.
pub fn table_row(n: usize, mix: Mix, trials: usize, seed: u64) -> Row {
    let mut rounds = Vec::new();
    let mut pairs = Vec::new();
    let mut score = Score::default();
    let mut undecided = 0;
    for t in 0..trials {
        let mut rng = Rng::new(seed ^ (t as u64).wrapping_mul(0x9e37_79b9));
        let f = Fabric::nested(n, &[8, 8, 16], vec![25.0, 12.5, 6.25, 3.125], 0.03)
            .with_faults(mix.nodes, mix.paths, 0.3, &mut rng)
            .with_uplinks(mix.uplinks, 0.3, &mut rng)
            .with_stragglers(mix.stragglers, STRAGGLER_SPIKE_CHANCE, 0.3, &mut rng);
        let (_, a) = f.run(Settings::default(), &mut rng);
        let sc = f.score(&a);
        score.nodes.add(sc.nodes);
        score.links.add(sc.links);
        score.uplinks.add(sc.uplinks);
        score.stragglers.add(sc.stragglers);
        undecided += a.undecided.len();
        rounds.push(a.rounds as f64);
        pairs.push(a.pairs as f64);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    Row {
        n,
        mix,
        trials,
        rounds_max: rounds.iter().fold(0.0f64, |a, &b| a.max(b)) as usize,
        rounds_median: med(&mut rounds),
        pairs_median: med(&mut pairs),
        full_pairs: n * (n - 1) / 2,
        nodes: score.nodes,
        uplinks: score.uplinks,
        links: score.links,
        stragglers: score.stragglers,
        undecided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(nodes: usize, uplinks: usize, paths: usize, stragglers: usize) -> Mix {
        Mix {
            nodes,
            uplinks,
            paths,
            stragglers,
        }
    }

    #[test]
    fn a_slow_node_and_a_slow_link_are_told_apart() {
        let mut rng = Rng::new(7);
        let mut f = Fabric::nested(8, &[2, 2], vec![25.0, 12.5, 6.25], 0.03);
        f.slow_nodes.push((5, 0.3));
        let (_, a) = f.run(Settings::default(), &mut rng);
        assert_eq!(
            a.slow_nodes.iter().map(|x| x.0).collect::<Vec<_>>(),
            [5],
            "{a:?}"
        );
        assert!(a.slow_links.is_empty() && a.undecided.is_empty(), "{a:?}");
        assert!(a.rounds <= 3, "{a:?}");
        let mut f = Fabric::nested(8, &[2, 2], vec![25.0, 12.5, 6.25], 0.03);
        // A link the first round measures (the widest tier pairs node i with i + 4).
        f.slow_links.push(((1, 5), 0.3));
        let (_, a) = f.run(Settings::default(), &mut rng);
        assert_eq!(
            a.slow_links.iter().map(|x| x.0).collect::<Vec<_>>(),
            [(1, 5)],
            "{a:?}"
        );
        assert!(a.slow_nodes.is_empty() && a.undecided.is_empty(), "{a:?}");
        assert!(a.rounds <= 2, "{a:?}");
    }

    #[test]
    fn a_healthy_fabric_is_one_round_and_nobody_is_named() {
        let mut rng = Rng::new(3);
        let f = Fabric::nested(1000, &[8, 8, 16], vec![25.0, 12.5, 6.25, 3.125], 0.03);
        let (_, a) = f.run(Settings::default(), &mut rng);
        assert_eq!(a.rounds, 1, "{a:?}");
        assert_eq!(a.pairs, 500);
        assert!(a.slow_nodes.is_empty() && a.slow_links.is_empty() && a.undecided.is_empty());
    }

    #[test]
    fn an_odd_node_out_is_measured_too() {
        let mut rng = Rng::new(11);
        let mut f = Fabric::nested(9, &[3], vec![25.0, 12.5], 0.02);
        // Whichever node sits out the first round, a slow one is still found.
        f.slow_nodes.push((8, 0.3));
        let (_, a) = f.run(Settings::default(), &mut rng);
        assert_eq!(
            a.slow_nodes.iter().map(|x| x.0).collect::<Vec<_>>(),
            [8],
            "{a:?}"
        );
    }

    /// Issue 39's goal for the simulation, for slow nodes: at 16,384 nodes with 4 of them,
    /// at most 6 rounds, precision and recall at least 0.95. Slow links between two given
    /// nodes are found only when a round measures that pair (see docs/tiers.md): none is
    /// named wrongly.
    #[test]
    fn at_16384_nodes_four_slow_nodes_take_a_few_rounds_and_are_named() {
        let r = table_row(16384, mix(4, 0, 0, 0), 3, 0xb05b);
        assert!(r.rounds_max <= 6, "{r:?}");
        assert!(
            r.nodes.precision() >= 0.95 && r.nodes.recall() >= 0.95,
            "{r:?}"
        );
        assert!(
            r.pairs_median < 8300.0,
            "about n/2 pairs and a few re-pairs: {r:?}"
        );
        let r = table_row(16384, mix(2, 0, 2, 0), 3, 0xb05c);
        assert!(r.rounds_max <= 6, "{r:?}");
        assert!(
            r.nodes.precision() >= 0.95 && r.nodes.recall() >= 0.95,
            "{r:?}"
        );
        assert_eq!(r.links.false_alarm, 0, "{r:?}");
    }

    /// Issue 39's goal for faults of the tree: at 16,384 nodes, slow uplinks (a local
    /// block's, a network block's or an island's) are named as uplinks, their nodes not as
    /// slow nodes, in at most 6 rounds, alone and beside slow nodes.
    #[test]
    fn at_16384_nodes_slow_uplinks_are_named_as_uplinks() {
        for (m, seed) in [(mix(0, 4, 0, 0), 0x0b1), (mix(2, 2, 0, 0), 0x0b2)] {
            let r = table_row(16384, m, 3, seed);
            assert!(r.rounds_max <= 6, "{r:?}");
            assert!(
                r.uplinks.precision() >= 0.95 && r.uplinks.recall() >= 0.95,
                "{r:?}"
            );
            assert!(
                r.nodes.precision() >= 0.95 && r.nodes.recall() >= 0.95,
                "{r:?}"
            );
            assert_eq!(r.links.false_alarm, 0, "{r:?}");
        }
    }

    /// A healthy node that met a slow node in one round and an uplink's node in another has
    /// most of its few links slow; the verdict judges it again without the uplink's links
    /// and clears it (before that rule, 3 of these 20 trials named such a node).
    #[test]
    fn a_node_that_met_a_slow_node_and_an_uplink_is_not_named() {
        let r = table_row(512, mix(2, 2, 0, 0), 20, 0x5eed ^ 512);
        assert_eq!(r.nodes.false_alarm, 0, "{r:?}");
        assert_eq!(
            r.nodes.missed + r.uplinks.missed + r.uplinks.false_alarm,
            0,
            "{r:?}"
        );
    }

    /// A block of two whose uplink is slow, on 8 nodes: the schedule pairs the two inside
    /// the block (good), then each with a good node outside (slow): the uplink, not two
    /// slow nodes, and not the partners of the first round.
    #[test]
    fn a_small_block_with_a_slow_uplink_is_tested_inside_and_out() {
        let mut rng = Rng::new(5);
        let mut f = Fabric::nested(8, &[2, 2], vec![25.0, 12.5, 6.25], 0.03);
        f.slow_uplinks.push(((0, 1), 0.3));
        let (own, gate) = f.run(Settings::default(), &mut rng);
        for a in [&own, &gate] {
            assert_eq!(
                a.slow_uplinks.iter().map(|x| x.0).collect::<Vec<_>>(),
                [(0, 1)],
                "{a:?}"
            );
            assert!(a.slow_nodes.is_empty() && a.slow_links.is_empty(), "{a:?}");
        }
        assert!(own.rounds <= 4 && own.undecided.is_empty(), "{own:?}");
    }

    /// Stragglers at scale: slowed in half of their iterations, so their pairs' figures
    /// may look healthy; the schedule re-pairs the nodes of pairs that spiked, and the
    /// gate's verdict names the stragglers, not slow nodes or links.
    #[test]
    fn at_16384_nodes_stragglers_are_named_as_stragglers() {
        let r = table_row(16384, mix(0, 0, 0, 4), 3, 0x5714);
        assert!(r.rounds_max <= 6, "{r:?}");
        assert!(
            r.stragglers.precision() >= 0.95 && r.stragglers.recall() >= 0.95,
            "{r:?}"
        );
        assert_eq!(r.nodes.false_alarm + r.links.false_alarm, 0, "{r:?}");
        let r = table_row(64, mix(1, 0, 0, 1), 10, 0x5715);
        assert!(
            r.stragglers.recall() >= 0.9 && r.nodes.recall() >= 0.9,
            "{r:?}"
        );
        assert_eq!(r.nodes.false_alarm + r.stragglers.false_alarm, 0, "{r:?}");
    }
}
