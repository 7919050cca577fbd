//! Faults of the tier tree itself: a block whose uplink is slow.
//!
//! In a switched fabric there is no cable between two given nodes. A node's own link to its
//! switch is the node (a slow node); above it, the links are the tree's: a local block's
//! uplinks to its network block, a network block's to the island. When one of those is
//! slow, every pair that leaves the block is slow and every pair inside it is not, so pair
//! by pair the block's nodes look like slow nodes. They are told apart by where their pairs
//! go: a domain whose every pair leaving it is slow, with at least two of its nodes slow
//! with partners known good that far out, and whose pairs inside are good, has a slow
//! **uplink**. Until a pair inside has been measured it is a candidate, which the adaptive
//! schedule tests (pairs inside the domain and pairs leaving it, in one round).
//!
//! The rule is one pure function over the pairs measured and whether each was slow, so the
//! schedule ([`crate::adaptive`]) and the verdict ([`crate::analysis::uplinks`]) judge alike.

use std::collections::{BTreeMap, BTreeSet};

/// A domain of the tree: its level (closest first) and its id at that level.
pub type Domain = (usize, u32);

/// One measured pair as the rule sees it.
#[derive(Clone, Copy, Debug)]
pub struct Obs {
    pub a: usize,
    pub b: usize,
    /// Slow for its tier (steadily, in the schedule; a judged slow link, in the verdict).
    pub slow: bool,
}

/// What the pairs say about the tree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Uplinks {
    /// Domains whose uplink is slow, widest first, each with its members.
    pub named: Vec<(Domain, Vec<usize>)>,
    /// Domains every measured pair leaving which is slow but not yet shown to be good inside
    /// (or not yet slow with partners known good): to be tested.
    pub candidates: Vec<Domain>,
}

impl Uplinks {
    /// Whether pair `a`-`b` leaves a named domain (its slowness is that uplink's).
    pub fn explains(&self, domains: &[Vec<u32>], a: usize, b: usize) -> Option<Domain> {
        self.named
            .iter()
            .map(|(d, _)| *d)
            .find(|&d| crosses(domains, d, a, b))
    }

    /// The candidate `x` belongs to, if any.
    pub fn candidate_of(&self, domains: &[Vec<u32>], x: usize) -> Option<Domain> {
        self.candidates
            .iter()
            .copied()
            .find(|&d| inside(domains, d, x))
    }
}

/// The closest level whose domain `a` and `b` share; the number of levels when none.
pub fn tier(domains: &[Vec<u32>], a: usize, b: usize) -> usize {
    let (da, db) = (&domains[a], &domains[b]);
    (0..da.len()).find(|&l| da[l] == db[l]).unwrap_or(da.len())
}

/// Whether pair `a`-`b` leaves domain `d`: one end inside, the other out.
pub fn crosses(domains: &[Vec<u32>], (l, id): Domain, a: usize, b: usize) -> bool {
    inside(domains, (l, id), a) != inside(domains, (l, id), b)
}

/// Whether node `x` lies in domain `d`.
pub fn inside(domains: &[Vec<u32>], (l, id): Domain, x: usize) -> bool {
    domains[x].get(l) == Some(&id)
}

#[derive(Default)]
struct Tally {
    /// Members with a slow pair leaving the domain.
    slow_out: BTreeSet<usize>,
    /// Members slow out with a partner good at least as far out as that pair.
    slow_out_vs_good: BTreeSet<usize>,
    good_out: bool,
    good_in: usize,
    slow_in: usize,
}

/// The rule over `obs`. `domains[node][level]`, closest level first; ids at a level equal
/// for one domain (an id no other node has is a node alone at that level, never a
/// candidate). Only domains with nodes outside them are judged.
pub fn judge(domains: &[Vec<u32>], obs: &[Obs]) -> Uplinks {
    // How far out each node has a good pair: the widest tier of its good pairs.
    let mut good_reach: BTreeMap<usize, usize> = BTreeMap::new();
    for o in obs.iter().filter(|o| !o.slow) {
        let t = tier(domains, o.a, o.b);
        for x in [o.a, o.b] {
            let r = good_reach.entry(x).or_insert(0);
            *r = (*r).max(t + 1);
        }
    }
    let good_at = |x: usize, t: usize| good_reach.get(&x).is_some_and(|&r| r > t);
    let mut tally: BTreeMap<Domain, Tally> = BTreeMap::new();
    for o in obs {
        let t = tier(domains, o.a, o.b);
        // The pair leaves each end's domains below its tier and stays inside those at it
        // and above.
        for (x, y) in [(o.a, o.b), (o.b, o.a)] {
            for (l, &id) in domains[x].iter().enumerate().take(t) {
                let e = tally.entry((l, id)).or_default();
                if o.slow {
                    e.slow_out.insert(x);
                    if good_at(y, t) {
                        e.slow_out_vs_good.insert(x);
                    }
                } else {
                    e.good_out = true;
                }
            }
        }
        for (l, &id) in domains[o.a].iter().enumerate().skip(t) {
            let e = tally.entry((l, id)).or_default();
            if o.slow {
                e.slow_in += 1;
            } else {
                e.good_in += 1;
            }
        }
    }
    let mut named = Vec::new();
    let mut candidates = Vec::new();
    // Widest first, so a named domain's sub-domains are passed over.
    let mut keys: Vec<&Domain> = tally.keys().collect();
    keys.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &d in keys {
        let t = &tally[&d];
        if t.good_out || t.slow_out.len() < 2 || t.slow_in > 0 {
            continue;
        }
        let under_named = named
            .iter()
            .any(|(w, _): &(Domain, Vec<usize>)| w.0 > d.0 && d_inside(domains, d, *w));
        if under_named {
            continue;
        }
        if t.good_in > 0 && t.slow_out_vs_good.len() >= 2 {
            let members: Vec<usize> = (0..domains.len())
                .filter(|&x| inside(domains, d, x))
                .collect();
            named.push((d, members));
        } else {
            candidates.push(d);
        }
    }
    Uplinks { named, candidates }
}

/// Whether domain `d` lies inside the wider domain `w` (any node of `d` is in `w`).
fn d_inside(domains: &[Vec<u32>], (l, id): Domain, w: Domain) -> bool {
    domains
        .iter()
        .find(|dx| dx.get(l) == Some(&id))
        .is_some_and(|dx| dx.get(w.0) == Some(&w.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16 nodes: blocks of 2 (level 0) in two groups of 8 (level 1).
    fn domains() -> Vec<Vec<u32>> {
        (0..16u32).map(|x| vec![x / 2, x / 8]).collect()
    }

    fn obs(pairs: &[(usize, usize, bool)]) -> Vec<Obs> {
        pairs
            .iter()
            .map(|&(a, b, slow)| Obs { a, b, slow })
            .collect()
    }

    #[test]
    fn a_block_slow_out_and_good_in_has_a_slow_uplink() {
        let d = domains();
        // Block {2,3}: both slow with nodes outside that are good elsewhere, good together.
        let o = obs(&[
            (2, 10, true),
            (3, 12, true),
            (10, 4, false),
            (12, 5, false),
            (2, 3, false),
            (0, 8, false),
        ]);
        let u = judge(&d, &o);
        assert_eq!(u.named, vec![((0, 1), vec![2, 3])], "{u:?}");
        assert!(u.explains(&d, 2, 10).is_some() && u.explains(&d, 2, 3).is_none());
    }

    #[test]
    fn without_a_pair_inside_it_is_a_candidate_and_one_good_pair_out_clears_it() {
        let d = domains();
        let o = obs(&[
            (2, 10, true),
            (3, 12, true),
            (10, 11, false),
            (12, 4, false),
        ]);
        let u = judge(&d, &o);
        assert!(u.named.is_empty(), "{u:?}");
        assert_eq!(u.candidate_of(&d, 3), Some((0, 1)), "{u:?}");
        let mut o = o;
        o.push(Obs {
            a: 3,
            b: 14,
            slow: false,
        });
        let u = judge(&d, &o);
        assert!(
            u.named.is_empty() && u.candidate_of(&d, 3).is_none(),
            "{u:?}"
        );
    }

    #[test]
    fn two_slow_nodes_that_make_up_a_block_are_not_an_uplink() {
        let d = domains();
        let o = obs(&[
            (2, 10, true),
            (3, 12, true),
            (10, 11, false),
            (12, 4, false),
            (2, 3, true),
        ]);
        let u = judge(&d, &o);
        assert!(u.named.is_empty() && u.candidates.is_empty(), "{u:?}");
    }

    #[test]
    fn partners_good_only_inside_their_own_block_are_no_evidence() {
        let d = domains();
        // Blocks {2,3} and {10,11} met only each other, then themselves: either uplink.
        let o = obs(&[(2, 10, true), (3, 11, true), (2, 3, false), (10, 11, false)]);
        let u = judge(&d, &o);
        assert!(u.named.is_empty(), "{u:?}");
        assert!(
            u.candidates.contains(&(0, 1)) && u.candidates.contains(&(0, 5)),
            "{u:?}"
        );
    }

    #[test]
    fn a_wide_domain_is_named_and_not_its_blocks() {
        let d = domains();
        // Group 0 (nodes 0-7) slow to group 1 (8-15); inside it, across its blocks, good.
        let mut p = vec![
            (0, 8, true),
            (2, 10, true),
            (4, 12, true),
            (6, 14, true),
            (0, 2, false),
            (4, 6, false),
        ];
        // Group 1's nodes good with each other across blocks: that is not evidence about
        // group 1's uplink (its only pairs out are with group 0).
        p.extend([(8, 10, false), (12, 14, false)]);
        let u = judge(&d, &obs(&p));
        // Two groups, each other's only outside: neither is named, both are candidates.
        assert!(u.named.is_empty(), "{u:?}");
        assert!(u.candidates.contains(&(1, 0)) && u.candidates.contains(&(1, 1)));
    }
}
