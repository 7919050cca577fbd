//! Robust statistics over the pairwise links: which links are slow for their tier, which
//! nodes explain them.
//!
//! Median and MAD rather than mean and standard deviation: a bad node drags every one of its
//! links down, and those links must not move the yardstick they are measured against.

use busbw_reports::tiers::{Link, Straggler, StragglerHit, SuspectNode};

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
    /// Each iteration's busbw (every measurement of the pair, in order): what a straggler
    /// shows in, where the pair's figure hides it.
    pub samples: Vec<f64>,
}

/// Judged links, suspect nodes, and the slow links no suspect node explains.
pub struct Judgement {
    pub links: Vec<Link>,
    pub suspects: Vec<SuspectNode>,
    pub unexplained: Vec<Link>,
    /// Per link (as `links`): slow because it leaves a domain with a slow uplink
    /// ([`uplinks`]); empty until that is asked.
    pub behind_uplink: Vec<bool>,
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
        behind_uplink: Vec::new(),
    }
}

/// A domain of the tree with a slow uplink, as the verdict names it.
#[derive(Clone, Debug, PartialEq)]
pub struct UplinkAt {
    /// Level (closest first) and id, as in [`crate::uplink`].
    pub domain: crate::uplink::Domain,
    /// Its nodes (indices).
    pub members: Vec<usize>,
    /// Measured links leaving it, and how many of them are slow (all, by the rule).
    pub links: usize,
    /// Median busbw of the links leaving it, and median of what their tiers deliver.
    pub measured: f64,
    pub expected: f64,
}

/// Slow uplinks among the judged links ([`crate::uplink`]'s rule over `j.links`), taken out
/// of the judgement: a suspect node is judged again without the links leaving a named
/// domain (they are the uplink's), and those links are not listed as slow links.
/// `domains[node][level]` as the adaptive schedule takes them.
pub fn uplinks(domains: &[Vec<u32>], measured: &[Measured], j: &mut Judgement) -> Vec<UplinkAt> {
    use crate::uplink;
    let obs: Vec<uplink::Obs> = measured
        .iter()
        .zip(&j.links)
        .map(|(m, l)| uplink::Obs {
            a: m.a,
            b: m.b,
            slow: l.slow,
        })
        .collect();
    let tree = uplink::judge(domains, &obs);
    if tree.named.is_empty() {
        return Vec::new();
    }
    let explained = |m: &Measured| tree.explains(domains, m.a, m.b).is_some();
    j.behind_uplink = measured.iter().map(explained).collect();
    let out: Vec<UplinkAt> = tree
        .named
        .iter()
        .map(|(d, members)| {
            let leaving: Vec<(&Measured, &Link)> = measured
                .iter()
                .zip(&j.links)
                .filter(|(m, _)| uplink::crosses(domains, *d, m.a, m.b))
                .collect();
            let bw: Vec<f64> = leaving.iter().map(|(_, l)| l.busbw).collect();
            let exp: Vec<f64> = leaving.iter().map(|(_, l)| l.expected).collect();
            UplinkAt {
                domain: *d,
                members: members.clone(),
                links: leaving.len(),
                measured: median(&bw),
                expected: median(&exp),
            }
        })
        .collect();
    // Node names back to indices through the links (a suspect has links).
    let index_of = |name: &str| {
        measured.iter().zip(&j.links).find_map(|(m, l)| {
            if l.a == name {
                Some(m.a)
            } else if l.b == name {
                Some(m.b)
            } else {
                None
            }
        })
    };
    // A suspect is judged again on its links not behind an uplink: more than half of them
    // (at least two) still slow, or it was the uplink's victim (or met one of its nodes and
    // a slow node, and is healthy).
    let victims: Vec<String> = j
        .suspects
        .iter()
        .filter(|s| {
            let Some(x) = index_of(&s.node) else {
                return false;
            };
            let own: Vec<bool> = measured
                .iter()
                .zip(&j.links)
                .filter(|(m, _)| (m.a == x || m.b == x) && !explained(m))
                .map(|(_, l)| l.slow)
                .collect();
            let slow = own.iter().filter(|&&s| s).count();
            !(own.len() >= 2 && 2 * slow > own.len())
        })
        .map(|s| s.node.clone())
        .collect();
    j.suspects.retain(|s| !victims.contains(&s.node));
    let keep: Vec<bool> = measured.iter().map(|m| !explained(m)).collect();
    let unexplained_keys: Vec<(String, String)> = measured
        .iter()
        .zip(&j.links)
        .zip(&keep)
        .filter(|(_, &k)| !k)
        .map(|((_, l), _)| (l.a.clone(), l.b.clone()))
        .collect();
    j.unexplained
        .retain(|l| !unexplained_keys.contains(&(l.a.clone(), l.b.clone())));
    out
}

/// What a straggler's pairs must show beyond one partner: a share of its pairs with spikes.
const STRAGGLER_PAIR_SHARE: f64 = 0.4;
/// A node with at least this share of its iterations under the slow fraction is steadily
/// slow (a slow node, the judgement's), not a straggler.
const STEADY_SHARE: f64 = 0.9;
/// Spiky pairs beyond this share of all pairs are the fabric's or the machine's noise, not
/// one node's: nobody is named.
const NOISE_PAIR_SHARE: f64 = 0.34;

/// Nodes the others waited for now and then: iterations under `slow_fraction` of their
/// tier's median (spikes) in pairs with at least two partners and in at least 40% of the
/// node's pairs, while under 90% of its iterations are slow (a node slow in nearly all of
/// them is a slow node, which `judge` names). A partner that spiked only with it is cleared
/// by its other pairs, and a passing burst of load touches a pair or two, not most of a
/// node's. A pair with a suspect node of `j` says nothing about the other end: it is slow
/// because of the suspect (a node with a slow link and a slow node among its partners is
/// no straggler), nor does a pair leaving a domain with a slow uplink. When spikes are everywhere (more than a third of the pairs), they are
/// noise and nobody is named; the returned note says so.
pub fn stragglers(
    nodes: &[String],
    measured: &[Measured],
    j: &Judgement,
    slow_fraction: f64,
) -> (Vec<Straggler>, Option<String>) {
    let links = &j.links;
    let suspect = |n: usize| j.suspects.iter().any(|s| s.node == nodes[n]);
    let behind_uplink = |i: usize| j.behind_uplink.get(i).copied().unwrap_or(false);
    // Per pair: its spiking iterations.
    // A pair leaving a slow uplink is that uplink's, like a pair with a suspect node.
    let pairs: Vec<(&Measured, &Link, Vec<usize>)> = measured
        .iter()
        .zip(links)
        .enumerate()
        .filter(|(i, _)| !behind_uplink(*i))
        .map(|(_, (m, l))| {
            let below = l.expected * (1.0 - slow_fraction);
            let hit = (0..m.samples.len())
                .filter(|&i| m.samples[i] < below)
                .collect();
            (m, l, hit)
        })
        .collect();
    let mut out = Vec::new();
    for (x, name) in nodes.iter().enumerate() {
        let mine: Vec<&(&Measured, &Link, Vec<usize>)> = pairs
            .iter()
            .filter(|h| h.0.a == x || h.0.b == x)
            .filter(|h| !suspect(if h.0.a == x { h.0.b } else { h.0.a }))
            .collect();
        let hit: Vec<_> = mine.iter().filter(|h| !h.2.is_empty()).collect();
        if hit.len() < 2 || (hit.len() as f64) < STRAGGLER_PAIR_SHARE * mine.len() as f64 {
            continue;
        }
        let iterations: usize = mine.iter().map(|h| h.0.samples.len()).sum();
        let spikes: usize = mine.iter().map(|h| h.2.len()).sum();
        if spikes as f64 >= STEADY_SHARE * iterations as f64 {
            continue;
        }
        let worst = hit
            .iter()
            .flat_map(|h| {
                h.2.iter()
                    .map(|&i| h.0.samples[i] / h.1.expected.max(f64::MIN_POSITIVE))
            })
            .fold(f64::INFINITY, f64::min);
        out.push(Straggler {
            node: name.clone(),
            spikes,
            iterations,
            partners: hit.len(),
            pairs: mine.len(),
            worst,
            hits: hit
                .iter()
                .map(|h| StragglerHit {
                    partner: nodes[if h.0.a == x { h.0.b } else { h.0.a }].clone(),
                    tier: h.0.tier.clone(),
                    iterations: h.2.clone(),
                    of: h.0.samples.len(),
                })
                .collect(),
        });
    }
    // Spiky pairs no straggler explains, beyond a third of all: noise.
    let named = |n: usize| out.iter().any(|s| s.node == nodes[n]);
    let stray = pairs
        .iter()
        .filter(|h| !h.2.is_empty() && !h.1.slow && !named(h.0.a) && !named(h.0.b))
        .count();
    let healthy = pairs.iter().filter(|h| !h.1.slow).count();
    let spiky = pairs.iter().filter(|h| !h.2.is_empty()).count();
    // Too many stragglers to be faults (more than a third of the nodes), or too many spikes
    // that none explains: noise.
    let many = out.len() > 2 && out.len() as f64 > NOISE_PAIR_SHARE * nodes.len() as f64;
    if many || (stray > 2 && stray as f64 > NOISE_PAIR_SHARE * healthy as f64) {
        return (
            Vec::new(),
            Some(format!(
                "iterations spiked in {spiky} of {} pairs, with {} of {} nodes: noise across the fabric or the hosts, no straggler named",
                pairs.len(),
                out.len(),
                nodes.len()
            )),
        );
    }
    (out, None)
}

/// The judgement with the stragglers taken out: a straggler's slow pairs are its spikes,
/// not a slow node or a slow link.
pub fn without_stragglers(j: &mut Judgement, stragglers: &[Straggler]) {
    let s = |n: &str| stragglers.iter().any(|x| x.node == n);
    j.suspects.retain(|x| !s(&x.node));
    j.unexplained.retain(|l| !s(&l.a) && !s(&l.b));
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
                    samples: Vec::new(),
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
                    samples: Vec::new(),
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

    /// Pairs of 8 nodes, 6 iterations each at 10 GB/s, but those `spike` says.
    fn sampled(spike: impl Fn(usize, usize, usize) -> bool) -> Vec<Measured> {
        full(8, |_, _| 10.0)
            .into_iter()
            .map(|mut m| {
                m.samples = (0..6)
                    .map(|i| if spike(m.a, m.b, i) { 3.0 } else { 10.0 })
                    .collect();
                m
            })
            .collect()
    }

    fn straggling(m: &[Measured]) -> (Vec<String>, Option<String>) {
        let tiers = m
            .iter()
            .map(|x| Measured {
                tier: "block".into(),
                ..x.clone()
            })
            .collect::<Vec<_>>();
        let j = judge(&names(8), &tiers, 0.25);
        let (s, note) = stragglers(&names(8), &tiers, &j, 0.25);
        (s.into_iter().map(|s| s.node).collect(), note)
    }

    #[test]
    fn a_node_whose_iterations_spike_with_most_partners_is_a_straggler() {
        // Node 6 spikes in iteration 2 of 5 of its 7 pairs: each pair's figure is healthy.
        let m = sampled(|a, b, i| (a == 6 || b == 6) && i == 2 && a.max(b) + a.min(b) != 7 + 6);
        let (named, note) = straggling(&m);
        assert_eq!(named, ["n6"]);
        assert!(note.is_none());
        // The same spikes in 2 of its 7 pairs only: not enough to blame it.
        let m = sampled(|a, b, i| (a == 6 || b == 6) && i == 2 && a.min(b) < 2);
        assert!(straggling(&m).0.is_empty());
        // One spike in one pair (a burst of load): nobody.
        let m = sampled(|a, b, i| (a, b) == (1, 2) && i == 4);
        assert_eq!(straggling(&m), (vec![], None));
        // Spikes in most pairs: noise, said so, nobody named.
        let m = sampled(|a, b, i| (a + b + i) % 3 == 0);
        let (named, note) = straggling(&m);
        assert!(named.is_empty(), "{named:?}");
        assert!(note.is_some_and(|n| n.contains("noise")));
    }

    #[test]
    fn a_flapping_node_is_a_straggler_and_a_steadily_slow_one_a_slow_node() {
        let tiered = |m: Vec<Measured>| -> Vec<Measured> {
            m.into_iter()
                .map(|x| Measured {
                    tier: "block".into(),
                    ..x
                })
                .collect()
        };
        // Node 6 throttled for a while: slow all through its pairs with 0, 1 and 2 (their
        // figures slow too), one spike with 3 and 4, clean with 5 and 7.
        let m = tiered(
            sampled(|a, b, i| {
                let other = if a == 6 { b } else { a };
                (a == 6 || b == 6) && (other < 3 || (other < 5 && i == 0))
            })
            .into_iter()
            .map(|mut x| {
                let o = if x.a == 6 { x.b } else { x.a };
                if (x.a == 6 || x.b == 6) && o < 3 {
                    x.busbw = 3.0;
                }
                x
            })
            .collect(),
        );
        let mut j = judge(&names(8), &m, 0.25);
        let (s, _) = stragglers(&names(8), &m, &j, 0.25);
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].node.as_str(), s[0].partners, s[0].pairs),
            ("n6", 5, 7)
        );
        assert_eq!((s[0].spikes, s[0].iterations), (3 * 6 + 2, 42));
        // Its three slow pairs are its spikes, not three slow links.
        assert_eq!(j.unexplained.len(), 3);
        without_stragglers(&mut j, &s);
        assert!(j.unexplained.is_empty() && j.suspects.is_empty());
        // Slow in every iteration with everyone: a slow node, not a straggler.
        let m = tiered(
            sampled(|a, b, _| a == 6 || b == 6)
                .into_iter()
                .map(|mut x| {
                    if x.a == 6 || x.b == 6 {
                        x.busbw = 3.0;
                    }
                    x
                })
                .collect(),
        );
        let j = judge(&names(8), &m, 0.25);
        assert!(stragglers(&names(8), &m, &j, 0.25).0.is_empty());
        let s: Vec<&str> = j.suspects.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(s, ["n6"]);
        // Six nodes, a slow node (5) and a slow link (1 - 3) at once: nodes 1 and 3 each
        // have two slow partners of five, one of them the slow node, which explains that
        // pair; no straggler, the link named (seen over verbs in the SoftRoCE bed).
        let slow = |a: usize, b: usize| a == 5 || b == 5 || (a, b) == (1, 3);
        let m = tiered(
            sampled(|a, b, _| slow(a, b))
                .into_iter()
                .filter(|x| x.a < 6 && x.b < 6)
                .map(|mut x| {
                    if slow(x.a, x.b) {
                        x.busbw = 3.0;
                    }
                    x
                })
                .collect(),
        );
        let j = judge(&names(6), &m, 0.25);
        let (s, note) = stragglers(&names(6), &m, &j, 0.25);
        assert!(s.is_empty() && note.is_none(), "{s:?} {note:?}");
        let suspects: Vec<&str> = j.suspects.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(suspects, ["n5"]);
        let links: Vec<(&str, &str)> = j
            .unexplained
            .iter()
            .map(|l| (l.a.as_str(), l.b.as_str()))
            .collect();
        assert_eq!(links, [("n1", "n3")]);
    }
}
