//! Adaptive pairing (issue 39): which node or link is slow, in a number of rounds that grows
//! with the faults, not with the cluster.
//!
//! The round robin measures every pair of nodes: N-1 rounds, each a job-wide step. Health
//! checks that pair nodes at random and re-pair the failures need a constant number of
//! rounds but cannot tell a slow node from a slow link. Here the first round pairs every node
//! across the widest tier (the links a training job's collectives cross), and each later
//! round re-pairs every node of a pair that was slow, and not yet explained, with a node
//! already measured good, all at once. A node slow with two good partners is a slow
//! **node**; a pair slow together whose nodes are each good with a good partner is a slow
//! **link**; a domain of the tree every pair leaving which is slow, and every pair inside
//! good, has a slow **uplink** ([`crate::uplink`]: until a pair inside it is measured, its
//! nodes are tested in one round, some paired inside it and the rest with good nodes
//! outside); what the round limit leaves unexplained is said to be **undecided**.
//!
//! A pair is slow when it measures under `slow_below` × what its tier delivers, the median
//! of that tier's pairs so far (faults are few, so the median is a healthy pair's); a tier
//! without enough pairs yet is judged against the widest tier's median, which is no faster
//! than any closer tier's (a conservative expectation: a closer pair measured under it is
//! slow by any standard).
//!
//! Everything here is a pure function of the measurements it is given, so the same code
//! runs the gate and the simulations at 16,384 nodes (`fabric`).

use crate::uplink::{self, Domain, Obs, Uplinks};
use std::collections::{BTreeMap, BTreeSet};

/// Tunables of the schedule.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// A pair under this fraction of its tier's median is slow.
    pub slow_below: f64,
    /// Rounds in all, the first included; what is unexplained after them is undecided.
    pub max_rounds: usize,
    /// Pairs a tier needs before its own median is its expectation.
    pub min_tier_pairs: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            slow_below: 0.8,
            max_rounds: 6,
            min_tier_pairs: 3,
        }
    }
}

/// What the rounds found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attribution {
    /// Slow nodes, ascending, each with its median ratio to the expectation.
    pub slow_nodes: Vec<(usize, f64)>,
    /// Slow links (a < b), ascending, each with its ratio to the expectation.
    pub slow_links: Vec<((usize, usize), f64)>,
    /// Domains (level, id) with a slow uplink, each with the median ratio of the pairs
    /// that left it.
    pub slow_uplinks: Vec<(Domain, f64)>,
    /// Stragglers, ascending, each with its slowest iteration's ratio to the expectation:
    /// nodes whose pairs spiked with two good partners without all being slow.
    pub stragglers: Vec<(usize, f64)>,
    /// Nodes left unexplained after the round limit (or for want of good partners).
    pub undecided: Vec<usize>,
    /// Rounds run.
    pub rounds: usize,
    /// Pairs measured in all.
    pub pairs: usize,
}

/// One measurement: the pair and its bandwidth.
#[derive(Clone, Debug)]
struct Seen {
    a: usize,
    b: usize,
    bw: f64,
    /// Each iteration's bandwidth, when the measurement has them.
    samples: Vec<f64>,
}

/// The state of an adaptive pairing over `n` nodes.
pub struct Pairing {
    /// `domains[node][level]`: the node's domain at each tier level, closest first (the
    /// widest last); equal ids mean the same domain.
    domains: Vec<Vec<u32>>,
    settings: Settings,
    seen: Vec<Seen>,
    rounds: usize,
    /// Nodes known good: in a pair that was not slow.
    good: BTreeSet<usize>,
    /// Per node, its pairs without a slow figure or a spike: a node in a pair that only
    /// spiked is cleared by two of them, not one (a straggler's pair can miss its spikes).
    clean: BTreeMap<usize, usize>,
    /// Per node, the good partners it was slow with (or spiked with), the ratios, and
    /// whether the pair's figure was slow (not only some iterations).
    slow_with_good: BTreeMap<usize, Vec<(usize, f64, bool)>>,
    /// Pairs measured slow (or spiking) whose cause is still open: the nodes, the figure's
    /// ratio to the expectation, and whether the pair was slow steadily (nearly every
    /// iteration) rather than now and then.
    open: Vec<(usize, usize, f64, bool)>,
    /// Decided.
    slow_nodes: BTreeMap<usize, f64>,
    stragglers: BTreeMap<usize, f64>,
    slow_links: BTreeMap<(usize, usize), f64>,
    slow_uplinks: BTreeMap<Domain, f64>,
    /// The tree's verdict on the pairs so far: named uplinks and candidates to test.
    tree: Uplinks,
    /// Every pair measured, so a node is never paired twice with the same partner.
    met: BTreeSet<(usize, usize)>,
    /// Per tier level: pairs measured and their median (refreshed by each round).
    tier_median: Vec<(usize, f64)>,
    /// How often each good node was lent as a partner: the least lent go first, so no
    /// healthy node collects slow pairs with several slow nodes (which a verdict over the
    /// links, "most of its links slow", would hold against it).
    lent: BTreeMap<usize, usize>,
    /// Nodes in any slow pair: lent last, since one more slow pair (with the slow node it
    /// is lent to) would make most of a good node's few links slow.
    tainted: BTreeSet<usize>,
    /// Nodes given up on (hung or unreachable: [`Pairing::lose`]): never paired again, and
    /// nothing they were in counts for or against anyone.
    lost: BTreeSet<usize>,
}

fn key(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|x, y| x.total_cmp(y));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

impl Pairing {
    /// `domains[node][level]` as above; every node has the same number of levels.
    pub fn new(domains: Vec<Vec<u32>>, settings: Settings) -> Pairing {
        Pairing {
            domains,
            settings,
            seen: Vec::new(),
            rounds: 0,
            good: BTreeSet::new(),
            clean: BTreeMap::new(),
            slow_with_good: BTreeMap::new(),
            open: Vec::new(),
            slow_nodes: BTreeMap::new(),
            stragglers: BTreeMap::new(),
            slow_links: BTreeMap::new(),
            slow_uplinks: BTreeMap::new(),
            tree: Uplinks::default(),
            met: BTreeSet::new(),
            tier_median: Vec::new(),
            lent: BTreeMap::new(),
            tainted: BTreeSet::new(),
            lost: BTreeSet::new(),
        }
    }

    /// Gives up on node `x`: it stopped answering, so its pairs say nothing about its
    /// partners, which are measured again with others if they have no other measurement.
    pub fn lose(&mut self, x: usize) {
        if !self.lost.insert(x) {
            return;
        }
        let with_x = |a: usize, b: usize| a == x || b == x;
        self.seen.retain(|s| !with_x(s.a, s.b));
        self.open.retain(|o| !with_x(o.0, o.1));
        self.slow_with_good.remove(&x);
        for v in self.slow_with_good.values_mut() {
            v.retain(|w| w.0 != x);
        }
        self.good.remove(&x);
        self.slow_nodes.remove(&x);
        self.stragglers.remove(&x);
        self.slow_links.retain(|&(a, b), _| !with_x(a, b));
        self.slow_uplinks.clear();
        self.refresh_medians();
        self.decide();
    }

    fn nodes(&self) -> usize {
        self.domains.len()
    }

    /// The tier of the link between `a` and `b`: the closest level whose domain they
    /// share; the number of levels when they share none.
    pub fn tier(&self, a: usize, b: usize) -> usize {
        uplink::tier(&self.domains, a, b)
    }

    fn widest(&self) -> usize {
        self.domains.first().map_or(0, Vec::len)
    }

    /// Every tier's pair count and median over what was measured so far.
    fn refresh_medians(&mut self) {
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); self.widest() + 1];
        for s in &self.seen {
            per[self.tier(s.a, s.b)].push(s.bw);
        }
        let mut all: Vec<f64> = self.seen.iter().map(|s| s.bw).collect();
        let everyone = median(&mut all);
        self.tier_median = per
            .into_iter()
            .map(|mut v| {
                (
                    v.len(),
                    if v.is_empty() {
                        everyone
                    } else {
                        median(&mut v)
                    },
                )
            })
            .collect();
    }

    /// What pair `a`-`b` should deliver: its tier's median, or the widest tier's (all
    /// pairs' when no widest-tier pair was measured: every node in one domain).
    fn expected(&self, a: usize, b: usize) -> f64 {
        let (count, m) = self
            .tier_median
            .get(self.tier(a, b))
            .copied()
            .unwrap_or((0, 0.0));
        if count >= self.settings.min_tier_pairs {
            return m;
        }
        self.tier_median.get(self.widest()).map_or(0.0, |w| w.1)
    }

    /// The first round: every node paired across the widest tier where it can be (the
    /// nodes sorted by their domains, paired with the node half the list away), disjoint;
    /// an odd node out waits for a good partner.
    fn first_round(&self) -> Vec<(usize, usize)> {
        let mut order: Vec<usize> = (0..self.nodes())
            .filter(|x| !self.lost.contains(x))
            .collect();
        order.sort_by(|&a, &b| {
            self.domains[a]
                .iter()
                .rev()
                .cmp(self.domains[b].iter().rev())
                .then(a.cmp(&b))
        });
        let half = order.len() / 2;
        (0..half).map(|i| key(order[i], order[i + half])).collect()
    }

    /// The next round's pairs, or `None` when everything is explained or the rounds are
    /// spent.
    pub fn next_round(&mut self) -> Option<Vec<(usize, usize)>> {
        if self.rounds >= self.settings.max_rounds {
            return None;
        }
        // An odd node out of the first round is paired with a good node in the second.
        let pairs = if self.rounds == 0 {
            self.first_round()
        } else {
            self.repair()
        };
        if pairs.is_empty() {
            return None;
        }
        self.rounds += 1;
        Some(pairs)
    }

    /// Nodes still to explain: in an open slow pair, not decided, not cleared; and, in the
    /// second round, the odd node out.
    fn suspects(&self) -> Vec<usize> {
        let mut s: BTreeSet<usize> = BTreeSet::new();
        for &(a, b, _, steady) in &self.open {
            let spiked_only = !steady;
            for x in [a, b] {
                let decided = self.slow_nodes.contains_key(&x) || self.stragglers.contains_key(&x);
                let other = if x == a { b } else { a };
                let cleared = if spiked_only {
                    self.clean_pairs(x) >= 2
                } else {
                    // Good inside a candidate domain says nothing of its uplink.
                    self.good.contains(&x) && self.pending(x, other).is_none()
                };
                if !decided && !cleared && !self.lost.contains(&x) {
                    s.insert(x);
                }
            }
        }
        let measured: BTreeSet<usize> = self.seen.iter().flat_map(|p| [p.a, p.b]).collect();
        for x in 0..self.nodes() {
            if !measured.contains(&x) && !self.lost.contains(&x) {
                s.insert(x);
            }
        }
        s.into_iter().collect()
    }

    /// Every suspect with a good node it has not met, each good node used once, preferring
    /// one never in a slow pair, then the least lent, then a partner across the widest tier (where the expectation is best
    /// known).
    fn repair(&mut self) -> Vec<(usize, usize)> {
        let mut pairs = Vec::new();
        let mut suspects = self.suspects();
        // Candidate domains not yet measured inside: some of their suspects paired inside,
        // across the domain's widest tier; the rest go out with good partners below.
        let mut busy: BTreeSet<usize> = BTreeSet::new();
        for d in self.untested_candidates() {
            let mut inside: Vec<usize> = suspects
                .iter()
                .copied()
                .filter(|&x| uplink::inside(&self.domains, d, x))
                .collect();
            inside.sort_by(|&a, &b| {
                self.domains[a]
                    .iter()
                    .rev()
                    .cmp(self.domains[b].iter().rev())
                    .then(a.cmp(&b))
            });
            let chosen: Vec<usize> = if inside.len() < 4 {
                inside.into_iter().take(2).collect()
            } else {
                inside.into_iter().step_by(2).collect()
            };
            let half = chosen.len() / 2;
            for i in 0..half {
                let (a, b) = (chosen[i], chosen[i + half]);
                if !self.met.contains(&key(a, b)) {
                    pairs.push(key(a, b));
                    busy.insert(a);
                    busy.insert(b);
                }
            }
        }
        suspects.retain(|x| !busy.contains(x));
        let mut free: Vec<usize> = self
            .good
            .iter()
            .copied()
            .filter(|g| !busy.contains(g) && self.tree.candidate_of(&self.domains, *g).is_none())
            .collect();
        for x in suspects {
            let out_of = self.tree.candidate_of(&self.domains, x);
            let pick = free
                .iter()
                .enumerate()
                .filter(|(_, &g)| g != x && !self.met.contains(&key(x, g)))
                .filter(|(_, &g)| out_of.is_none_or(|d| uplink::crosses(&self.domains, d, x, g)))
                .min_by_key(|(_, &g)| {
                    (
                        self.tainted.contains(&g),
                        self.lent.get(&g).copied().unwrap_or(0),
                        std::cmp::Reverse(self.tier(x, g)),
                    )
                })
                .map(|(i, _)| i);
            if let Some(i) = pick {
                let g = free.swap_remove(i);
                *self.lent.entry(g).or_insert(0) += 1;
                pairs.push(key(x, g));
            }
        }
        pairs
    }

    /// One round's measurements (bytes per second, or any unit used throughout).
    pub fn record(&mut self, results: &[((usize, usize), f64)]) {
        let with: Vec<((usize, usize), f64, Vec<f64>)> =
            results.iter().map(|&(p, bw)| (p, bw, Vec::new())).collect();
        self.record_iterations(&with);
    }

    /// One round's measurements with each pair's iterations: a pair whose figure is healthy
    /// but some of whose iterations fell under the threshold (a spike) is open like a slow
    /// one, so its nodes meet other partners and a straggler shows with two of them.
    pub fn record_iterations(&mut self, results: &[((usize, usize), f64, Vec<f64>)]) {
        for ((a, b), bw, samples) in results {
            self.met.insert(key(*a, *b));
            self.seen.push(Seen {
                a: *a,
                b: *b,
                bw: *bw,
                samples: samples.clone(),
            });
        }
        self.refresh_medians();
        // Judge the round's pairs against what is known now (this round included: the
        // first round sets the expectation).
        for &((a, b), bw, ref samples) in results {
            let expected = self.expected(a, b).max(f64::MIN_POSITIVE);
            let ratio = bw / expected;
            let slow = ratio < self.settings.slow_below;
            let worst = samples.iter().fold(ratio, |r, &s| r.min(s / expected));
            let below = samples
                .iter()
                .filter(|&&s| s / expected < self.settings.slow_below)
                .count();
            // Steadily slow: nearly every iteration (or the figure, without iterations);
            // now and then: some iterations, the figure slow or not.
            let steady =
                slow && (samples.is_empty() || below == 0 || below * 10 >= samples.len() * 9);
            if !slow && worst >= self.settings.slow_below {
                self.good.insert(a);
                self.good.insert(b);
                *self.clean.entry(a).or_insert(0) += 1;
                *self.clean.entry(b).or_insert(0) += 1;
                continue;
            }
            // Slow with a partner known good (before this pair): evidence against the other.
            let (ga, gb) = (self.good.contains(&a), self.good.contains(&b));
            if gb && !ga {
                self.slow_with_good
                    .entry(a)
                    .or_default()
                    .push((b, worst, steady));
            }
            if ga && !gb {
                self.slow_with_good
                    .entry(b)
                    .or_default()
                    .push((a, worst, steady));
            }
            self.tainted.insert(a);
            self.tainted.insert(b);
            self.open.push((a, b, ratio, steady));
        }
        self.decide();
    }

    /// The candidate domain `x`'s pair with `other` leaves, if any: such a pair waits for
    /// the domain's test.
    fn pending(&self, x: usize, other: usize) -> Option<Domain> {
        self.tree
            .candidate_of(&self.domains, x)
            .filter(|&d| uplink::crosses(&self.domains, d, x, other))
    }

    /// Maximal candidate domains without a good pair inside yet.
    fn untested_candidates(&self) -> Vec<Domain> {
        let c = &self.tree.candidates;
        let inside = |x: usize, d: Domain| uplink::inside(&self.domains, d, x);
        c.iter()
            .copied()
            .filter(|&d| {
                // Not inside a wider candidate.
                !c.iter().any(|&w| {
                    w.0 > d.0
                        && (0..self.nodes())
                            .find(|&x| inside(x, d))
                            .is_some_and(|x| inside(x, w))
                })
            })
            .filter(|&d| {
                !self.seen.iter().any(|s| {
                    inside(s.a, d)
                        && inside(s.b, d)
                        && s.bw >= self.settings.slow_below * self.expected(s.a, s.b)
                })
            })
            .collect()
    }

    /// The tree's rule over every pair so far (slow: the figure under the threshold).
    fn judge_tree(&mut self) {
        let obs: Vec<Obs> = self
            .seen
            .iter()
            .map(|s| Obs {
                a: s.a,
                b: s.b,
                slow: s.bw < self.settings.slow_below * self.expected(s.a, s.b),
            })
            .collect();
        self.tree = uplink::judge(&self.domains, &obs);
        for (d, _) in &self.tree.named {
            let mut r: Vec<f64> = self
                .seen
                .iter()
                .filter(|s| uplink::crosses(&self.domains, *d, s.a, s.b))
                .map(|s| s.bw / self.expected(s.a, s.b).max(f64::MIN_POSITIVE))
                .collect();
            self.slow_uplinks.insert(*d, median(&mut r));
        }
        let (tree, domains) = (&self.tree, &self.domains);
        self.open
            .retain(|&(a, b, _, _)| tree.explains(domains, a, b).is_none());
        for (&x, with) in self.slow_with_good.iter_mut() {
            with.retain(|w| tree.explains(domains, x, w.0).is_none());
        }
    }

    /// Whatever the evidence now settles.
    fn decide(&mut self) {
        self.judge_tree();
        for (&x, with) in &self.slow_with_good {
            let decided = self.slow_nodes.contains_key(&x) || self.stragglers.contains_key(&x);
            // A node of a candidate domain waits for the domain's test.
            let waits = with.iter().any(|w| self.pending(x, w.0).is_some());
            if with.len() >= 2 && !decided && !waits {
                let mut r: Vec<f64> = with.iter().map(|w| w.1).collect();
                // Slow with every good partner: a slow node; spikes with some: a straggler.
                if with.iter().all(|w| w.2) {
                    self.slow_nodes.insert(x, median(&mut r));
                } else {
                    let worst = r.iter().fold(f64::INFINITY, |a, &b| a.min(b));
                    self.stragglers.insert(x, worst);
                }
            }
        }
        let mut still = Vec::new();
        for &(a, b, ratio, steady) in &self.open {
            let explained =
                |x| self.slow_nodes.contains_key(&x) || self.stragglers.contains_key(&x);
            if explained(a) || explained(b) {
                continue; // explained by a slow node or a straggler
            }
            if self.pending(a, b).is_some() || self.pending(b, a).is_some() {
                still.push((a, b, ratio, steady));
                continue;
            }
            // Both ends good with others: the link between them.
            let good_elsewhere = |x: usize, other: usize| {
                self.good.contains(&x)
                    && self.seen.iter().any(|s| {
                        (s.a == x || s.b == x)
                            && key(s.a, s.b) != key(x, other)
                            && s.bw >= self.settings.slow_below * self.expected(s.a, s.b)
                    })
            };
            if !steady {
                // A pair slow now and then, each node clean twice elsewhere: a burst of
                // load, not a fault.
                if self.clean_pairs(a) >= 2 && self.clean_pairs(b) >= 2 {
                    continue;
                }
            } else if good_elsewhere(a, b) && good_elsewhere(b, a) {
                self.slow_links.insert(key(a, b), ratio);
                continue;
            }
            still.push((a, b, ratio, steady));
        }
        self.open = still;
    }

    fn clean_pairs(&self, x: usize) -> usize {
        self.clean.get(&x).copied().unwrap_or(0)
    }

    /// Every pair measured so far with its bandwidth, in the order measured.
    pub fn measured(&self) -> Vec<((usize, usize), f64)> {
        self.seen.iter().map(|s| ((s.a, s.b), s.bw)).collect()
    }

    /// Every pair measured so far with its bandwidth and iterations.
    pub fn measured_iterations(&self) -> Vec<((usize, usize), f64, Vec<f64>)> {
        self.seen
            .iter()
            .map(|s| ((s.a, s.b), s.bw, s.samples.clone()))
            .collect()
    }

    /// What the rounds so far found.
    pub fn attribution(&self) -> Attribution {
        let mut undecided: BTreeSet<usize> = BTreeSet::new();
        for &(a, b, _, _) in &self.open {
            for x in [a, b] {
                if !self.slow_nodes.contains_key(&x) && !self.stragglers.contains_key(&x) {
                    undecided.insert(x);
                }
            }
        }
        Attribution {
            slow_nodes: self.slow_nodes.iter().map(|(&n, &r)| (n, r)).collect(),
            stragglers: self.stragglers.iter().map(|(&n, &r)| (n, r)).collect(),
            slow_links: self.slow_links.iter().map(|(&l, &r)| (l, r)).collect(),
            slow_uplinks: self.slow_uplinks.iter().map(|(&d, &r)| (d, r)).collect(),
            undecided: undecided.into_iter().collect(),
            rounds: self.rounds,
            pairs: self.seen.len(),
        }
    }
}

/// Runs the rounds to the end with `measure` (one round's pairs in, each pair's bandwidth
/// and iterations out).
pub fn run(
    domains: Vec<Vec<u32>>,
    settings: Settings,
    mut measure: impl FnMut(&[(usize, usize)]) -> Vec<(f64, Vec<f64>)>,
) -> Pairing {
    let mut p = Pairing::new(domains, settings);
    while let Some(pairs) = p.next_round() {
        let got = measure(&pairs);
        let results: Vec<((usize, usize), f64, Vec<f64>)> = pairs
            .iter()
            .copied()
            .zip(got)
            .map(|(p, (bw, s))| (p, bw, s))
            .collect();
        p.record_iterations(&results);
    }
    p
}
