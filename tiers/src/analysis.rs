//! Robust statistics over the pairwise links: which links are slow for their tier, which
//! nodes explain them.
//!
//! Median and MAD rather than mean and standard deviation: a bad node drags every one of its
//! links down, and those links must not move the yardstick they are measured against.

use busbw_reports::tiers::{Link, SuspectNode};

/// Median of `v` (NaN-free); 0 for an empty slice.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Median absolute deviation from `med`.
pub fn mad(v: &[f64], med: f64) -> f64 {
    let d: Vec<f64> = v.iter().map(|x| (x - med).abs()).collect();
    median(&d)
}

/// One measured pair before judgement: node indices, tier name, busbw.
#[derive(Clone, Debug)]
pub struct Measured {
    pub a: usize,
    pub b: usize,
    pub tier: String,
    pub busbw: f64,
}

/// Judged links, suspect nodes, and the slow links no suspect node explains.
pub struct Judgement {
    pub links: Vec<Link>,
    pub suspects: Vec<SuspectNode>,
    pub unexplained: Vec<Link>,
}

/// MADs below the median (scaled to a standard deviation) that count as far below.
const MADS: f64 = 3.0;
/// MAD -> standard deviation for normally distributed noise.
const MAD_SIGMA: f64 = 1.4826;

/// A link is slow when it is both more than `slow_fraction` below its tier's median and
/// more than 3 scaled MADs below it: the first keeps a tier of near-identical links (MAD 0)
/// from flagging noise, the second keeps a noisy tier from flagging its own spread. A node
/// is suspect when more than half of its links (at least two) are slow; its slow links are
/// then put down to it rather than listed one by one.
pub fn judge(nodes: &[String], measured: &[Measured], slow_fraction: f64) -> Judgement {
    let mut tiers: Vec<&str> = Vec::new();
    for m in measured {
        if !tiers.contains(&m.tier.as_str()) {
            tiers.push(&m.tier);
        }
    }
    // Each tier's expectation (median) and spread (MAD) from its links, twice: a bad node
    // holds many of a small cluster's links (a third of them in a 6-node network block), and
    // its slow links inflate the MAD until none of them is far enough below it. So nodes
    // most of whose links are below the fraction are set aside, and the tiers measured again
    // from the other links where at least two remain.
    let stats = |skip: &dyn Fn(&Measured) -> bool| {
        let mut expected = std::collections::HashMap::new();
        for t in &tiers {
            let all: Vec<f64> = measured
                .iter()
                .filter(|m| m.tier == *t)
                .map(|m| m.busbw)
                .collect();
            let kept: Vec<f64> = measured
                .iter()
                .filter(|m| m.tier == *t && !skip(m))
                .map(|m| m.busbw)
                .collect();
            let bw = if kept.len() >= 2 { kept } else { all };
            let med = median(&bw);
            expected.insert(t.to_string(), (med, mad(&bw, med)));
        }
        expected
    };
    let first = stats(&|_| false);
    let low = |m: &Measured| m.busbw < first[&m.tier].0 * (1.0 - slow_fraction);
    let candidates: Vec<usize> = (0..nodes.len())
        .filter(|&i| {
            let mine: Vec<&Measured> = measured.iter().filter(|m| m.a == i || m.b == i).collect();
            let n_low = mine.iter().filter(|m| low(m)).count();
            mine.len() >= 2 && 2 * n_low > mine.len()
        })
        .collect();
    let expected = stats(&|m: &Measured| candidates.contains(&m.a) || candidates.contains(&m.b));
    let links: Vec<Link> = measured
        .iter()
        .map(|m| {
            let (med, mad) = expected[&m.tier];
            let slow =
                m.busbw < med * (1.0 - slow_fraction) && m.busbw < med - MADS * MAD_SIGMA * mad;
            Link {
                a: nodes[m.a].clone(),
                b: nodes[m.b].clone(),
                tier: m.tier.clone(),
                busbw: m.busbw,
                expected: med,
                slow,
            }
        })
        .collect();
    let mut suspects = Vec::new();
    for (i, name) in nodes.iter().enumerate() {
        let mine: Vec<(&Measured, &Link)> = measured
            .iter()
            .zip(&links)
            .filter(|(m, _)| m.a == i || m.b == i)
            .collect();
        let slow = mine.iter().filter(|(_, l)| l.slow).count();
        if mine.len() >= 2 && 2 * slow > mine.len() {
            let bw: Vec<f64> = mine.iter().map(|(_, l)| l.busbw).collect();
            let exp: Vec<f64> = mine.iter().map(|(_, l)| l.expected).collect();
            suspects.push(SuspectNode {
                node: name.clone(),
                slow_links: slow,
                links: mine.len(),
                measured: median(&bw),
                expected: median(&exp),
            });
        }
    }
    let suspect = |n: &str| suspects.iter().any(|s| s.node == n);
    let unexplained = links
        .iter()
        .filter(|l| l.slow && !suspect(&l.a) && !suspect(&l.b))
        .cloned()
        .collect();
    Judgement {
        links,
        suspects,
        unexplained,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i}")).collect()
    }

    /// Every pair of `n` nodes; nodes < n/2 share tier "near", the rest "far".
    fn full(n: usize, bw: impl Fn(usize, usize) -> f64) -> Vec<Measured> {
        let mut v = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                let tier = if (a < n / 2) == (b < n / 2) {
                    "near"
                } else {
                    "far"
                };
                v.push(Measured {
                    a,
                    b,
                    tier: tier.into(),
                    busbw: bw(a, b),
                });
            }
        }
        v
    }

    /// A half-rate node among six with noisy links (the SoftRoCE guests under CI load): it
    /// holds a third of the network block's links, whose MAD they inflate past them; the
    /// second pass, without the candidate node's links, still names it, and nobody else.
    #[test]
    fn a_slow_node_holding_a_third_of_a_tier_is_still_named() {
        let m = [
            [0.0, 1.714, 1.830, 1.695, 1.690, 0.9501],
            [0.0, 0.0, 1.852, 1.686, 1.865, 0.9426],
            [0.0, 0.0, 0.0, 1.739, 1.611, 0.9488],
            [0.0, 0.0, 0.0, 0.0, 1.607, 0.9253],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.9510],
        ];
        let bw = |a: usize, b: usize| m[a][b];
        let mut v = Vec::new();
        for a in 0..6 {
            for b in a + 1..6 {
                let tier = if a / 2 == b / 2 {
                    "local_block"
                } else {
                    "network_block"
                };
                v.push(Measured {
                    a,
                    b,
                    tier: tier.into(),
                    busbw: bw(a, b),
                });
            }
        }
        let j = judge(&names(6), &v, 0.25);
        let s: Vec<&str> = j.suspects.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(s, ["n5"]);
        assert_eq!(j.suspects[0].slow_links, 5);
        assert!(j.unexplained.is_empty());
    }

    #[test]
    fn median_and_mad() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(mad(&[1.0, 2.0, 3.0, 100.0], 2.5), 1.0);
    }

    #[test]
    fn a_slow_node_is_named_and_its_peers_are_not() {
        let base = |a: usize, b: usize| if (a < 4) == (b < 4) { 10.0 } else { 5.0 };
        // Node 5 at half rate, small noise elsewhere.
        let m = full(8, |a, b| {
            let noise = 1.0 + 0.01 * ((a * 7 + b * 3) % 5) as f64;
            let v = base(a, b) * noise;
            if a == 5 || b == 5 {
                v / 2.0
            } else {
                v
            }
        });
        let j = judge(&names(8), &m, 0.25);
        let s: Vec<&str> = j.suspects.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(s, ["n5"]);
        assert_eq!(j.suspects[0].slow_links, 7);
        assert!((j.suspects[0].measured / j.suspects[0].expected - 0.5).abs() < 0.05);
        assert!(j.unexplained.is_empty(), "{:?}", j.unexplained);
        assert_eq!(j.links.iter().filter(|l| l.slow).count(), 7);
    }

    #[test]
    fn a_slow_link_between_good_nodes_is_named_alone() {
        let m = full(6, |a, b| if (a, b) == (1, 2) { 3.0 } else { 10.0 });
        let j = judge(&names(6), &m, 0.25);
        assert!(j.suspects.is_empty());
        assert_eq!(j.unexplained.len(), 1);
        assert_eq!(
            (j.unexplained[0].a.as_str(), j.unexplained[0].b.as_str()),
            ("n1", "n2")
        );
        assert_eq!(j.unexplained[0].expected, 10.0);
    }

    #[test]
    fn noise_and_tier_differences_flag_nothing() {
        // Far links are slower by design: judged against their own tier.
        let m = full(8, |a, b| {
            let base = if (a < 4) == (b < 4) { 10.0 } else { 2.5 };
            base * (1.0 + 0.08 * (((a * 13 + b * 5) % 7) as f64 / 7.0 - 0.5))
        });
        let j = judge(&names(8), &m, 0.25);
        assert!(j.suspects.is_empty() && j.unexplained.is_empty());
        // Two nodes: one link, nobody to compare with, nothing named.
        let j = judge(&names(2), &full(2, |_, _| 1.0), 0.25);
        assert!(j.suspects.is_empty() && j.unexplained.is_empty());
    }
}
