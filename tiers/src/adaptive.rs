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
//! **link**; what the round limit leaves unexplained is said to be **undecided**.
//!
//! A pair is slow when it measures under `slow_below` × what its tier delivers, the median
//! of that tier's pairs so far (faults are few, so the median is a healthy pair's); a tier
//! without enough pairs yet is judged against the widest tier's median, which is no faster
//! than any closer tier's (a conservative expectation: a closer pair measured under it is
//! slow by any standard).
//!
//! Everything here is a pure function of the measurements it is given, so the same code
//! runs the gate and the simulations at 16,384 nodes (`fabric`).

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
    /// Nodes left unexplained after the round limit (or for want of good partners).
    pub undecided: Vec<usize>,
    /// Rounds run.
    pub rounds: usize,
    /// Pairs measured in all.
    pub pairs: usize,
}

/// One measurement: the pair and its bandwidth.
#[derive(Clone, Copy, Debug)]
struct Seen {
    a: usize,
    b: usize,
    bw: f64,
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
    /// Per node, the good partners it was slow with, and the ratios.
    slow_with_good: BTreeMap<usize, Vec<(usize, f64)>>,
    /// Pairs measured slow whose cause is still open.
    open: Vec<(usize, usize, f64)>,
    /// Decided.
    slow_nodes: BTreeMap<usize, f64>,
    slow_links: BTreeMap<(usize, usize), f64>,
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
            slow_with_good: BTreeMap::new(),
            open: Vec::new(),
            slow_nodes: BTreeMap::new(),
            slow_links: BTreeMap::new(),
            met: BTreeSet::new(),
            tier_median: Vec::new(),
            lent: BTreeMap::new(),
            tainted: BTreeSet::new(),
        }
    }

    fn nodes(&self) -> usize {
        self.domains.len()
    }

    /// The tier of the link between `a` and `b`: the closest level whose domain they
    /// share; the number of levels when they share none.
    pub fn tier(&self, a: usize, b: usize) -> usize {
        let (da, db) = (&self.domains[a], &self.domains[b]);
        (0..da.len()).find(|&l| da[l] == db[l]).unwrap_or(da.len())
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
        let mut order: Vec<usize> = (0..self.nodes()).collect();
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
        for &(a, b, _) in &self.open {
            for x in [a, b] {
                if !self.slow_nodes.contains_key(&x) && !self.good.contains(&x) {
                    s.insert(x);
                }
            }
        }
        let measured: BTreeSet<usize> = self.seen.iter().flat_map(|p| [p.a, p.b]).collect();
        for x in 0..self.nodes() {
            if !measured.contains(&x) {
                s.insert(x);
            }
        }
        s.into_iter().collect()
    }

    /// Every suspect with a good node it has not met, each good node used once, preferring
    /// one never in a slow pair, then the least lent, then a partner across the widest tier (where the expectation is best
    /// known).
    fn repair(&mut self) -> Vec<(usize, usize)> {
        let mut free: Vec<usize> = self.good.iter().copied().collect();
        let mut pairs = Vec::new();
        for x in self.suspects() {
            let pick = free
                .iter()
                .enumerate()
                .filter(|(_, &g)| g != x && !self.met.contains(&key(x, g)))
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
        for &((a, b), bw) in results {
            self.met.insert(key(a, b));
            self.seen.push(Seen { a, b, bw });
        }
        self.refresh_medians();
        // Judge the round's pairs against what is known now (this round included: the
        // first round sets the expectation).
        for &((a, b), bw) in results {
            let ratio = bw / self.expected(a, b).max(f64::MIN_POSITIVE);
            let slow = ratio < self.settings.slow_below;
            if !slow {
                self.good.insert(a);
                self.good.insert(b);
                continue;
            }
            // Slow with a partner known good (before this pair): evidence against the other.
            let (ga, gb) = (self.good.contains(&a), self.good.contains(&b));
            if gb && !ga {
                self.slow_with_good.entry(a).or_default().push((b, ratio));
            }
            if ga && !gb {
                self.slow_with_good.entry(b).or_default().push((a, ratio));
            }
            self.tainted.insert(a);
            self.tainted.insert(b);
            self.open.push((a, b, ratio));
        }
        self.decide();
    }

    /// Whatever the evidence now settles.
    fn decide(&mut self) {
        for (&x, with) in &self.slow_with_good {
            if with.len() >= 2 && !self.slow_nodes.contains_key(&x) {
                let mut r: Vec<f64> = with.iter().map(|w| w.1).collect();
                self.slow_nodes.insert(x, median(&mut r));
            }
        }
        let mut still = Vec::new();
        for &(a, b, ratio) in &self.open {
            if self.slow_nodes.contains_key(&a) || self.slow_nodes.contains_key(&b) {
                continue; // explained by a slow node
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
            if good_elsewhere(a, b) && good_elsewhere(b, a) {
                self.slow_links.insert(key(a, b), ratio);
                continue;
            }
            still.push((a, b, ratio));
        }
        self.open = still;
    }

    /// Every pair measured so far with its bandwidth, in the order measured.
    pub fn measured(&self) -> Vec<((usize, usize), f64)> {
        self.seen.iter().map(|s| ((s.a, s.b), s.bw)).collect()
    }

    /// What the rounds so far found.
    pub fn attribution(&self) -> Attribution {
        let mut undecided: BTreeSet<usize> = BTreeSet::new();
        for &(a, b, _) in &self.open {
            for x in [a, b] {
                if !self.slow_nodes.contains_key(&x) {
                    undecided.insert(x);
                }
            }
        }
        Attribution {
            slow_nodes: self.slow_nodes.iter().map(|(&n, &r)| (n, r)).collect(),
            slow_links: self.slow_links.iter().map(|(&l, &r)| (l, r)).collect(),
            undecided: undecided.into_iter().collect(),
            rounds: self.rounds,
            pairs: self.seen.len(),
        }
    }
}

/// Runs the rounds to the end with `measure` (one round's pairs in, their bandwidths out).
pub fn run(
    domains: Vec<Vec<u32>>,
    settings: Settings,
    mut measure: impl FnMut(&[(usize, usize)]) -> Vec<f64>,
) -> Pairing {
    let mut p = Pairing::new(domains, settings);
    while let Some(pairs) = p.next_round() {
        let bw = measure(&pairs);
        let results: Vec<((usize, usize), f64)> = pairs.iter().copied().zip(bw).collect();
        p.record(&results);
    }
    p
}
