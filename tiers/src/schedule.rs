//! Who runs with whom: the groups of a tier, and the round-robin tournament of node pairs.

use busbw_launchers::topology::{Domain, Labels, TierModel};

/// A group of one tier: its domain and its members (global ranks, ascending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub domain: Vec<String>,
    /// Node indices of the members' nodes, ascending.
    pub nodes: Vec<usize>,
    pub ranks: Vec<usize>,
}

/// The groups of model tier `tier` (closest first): nodes of one domain, one rank (the
/// node's first) each; and the nodes whose domain is unknown.
pub fn tier_groups(
    model: &TierModel,
    tier: usize,
    node_labels: &[Labels],
    leaders: &[usize],
) -> (Vec<Group>, Vec<usize>) {
    let mut groups: Vec<Group> = Vec::new();
    let mut unknown = Vec::new();
    for (n, labels) in node_labels.iter().enumerate() {
        match model.domain(labels, tier) {
            Domain::Known(path) => match groups.iter_mut().find(|g| g.domain == path) {
                Some(g) => {
                    g.nodes.push(n);
                    g.ranks.push(leaders[n]);
                }
                None => groups.push(Group {
                    domain: path,
                    nodes: vec![n],
                    ranks: vec![leaders[n]],
                }),
            },
            Domain::Unknown { .. } => unknown.push(n),
        }
    }
    for g in &mut groups {
        g.ranks.sort_unstable();
    }
    (groups, unknown)
}

/// The node tier: the ranks of each node.
pub fn node_groups(rank_nodes: &[usize], names: &[String]) -> Vec<Group> {
    names
        .iter()
        .enumerate()
        .map(|(n, name)| Group {
            domain: vec![name.clone()],
            nodes: vec![n],
            ranks: (0..rank_nodes.len())
                .filter(|&r| rank_nodes[r] == n)
                .collect(),
        })
        .collect()
}

/// The circle method: `n - 1` rounds (n even; one more player sitting out when odd) in
/// which every pair meets exactly once and nobody plays twice in a round.
pub fn round_robin(n: usize) -> Vec<Vec<(usize, usize)>> {
    if n < 2 {
        return Vec::new();
    }
    let m = n + n % 2; // with a bye when odd
    let mut ring: Vec<usize> = (0..m).collect();
    let mut rounds = Vec::with_capacity(m - 1);
    for _ in 0..m - 1 {
        let mut round = Vec::with_capacity(m / 2);
        for i in 0..m / 2 {
            let (a, b) = (ring[i], ring[m - 1 - i]);
            if a < n && b < n {
                round.push((a.min(b), a.max(b)));
            }
        }
        rounds.push(round);
        // Keep ring[0] fixed, rotate the rest by one.
        let last = ring.pop().unwrap_or(0);
        ring.insert(1, last);
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_pair_once_and_nobody_twice_per_round() {
        for n in 2..=9 {
            let rounds = round_robin(n);
            assert_eq!(rounds.len(), if n % 2 == 0 { n - 1 } else { n });
            let mut seen = BTreeSet::new();
            for r in &rounds {
                let mut busy = BTreeSet::new();
                for &(a, b) in r {
                    assert!(a < b && b < n);
                    assert!(busy.insert(a) && busy.insert(b), "n={n}: {r:?}");
                    assert!(seen.insert((a, b)), "n={n}: ({a},{b}) twice");
                }
            }
            assert_eq!(seen.len(), n * (n - 1) / 2);
        }
        assert!(round_robin(1).is_empty());
    }

    #[test]
    fn groups_follow_domain_paths() {
        let model = TierModel::from_keys(&["block", "rack"]).unwrap();
        let l = |b: &str, r: &str| -> Labels {
            [
                ("block".to_string(), b.to_string()),
                ("rack".to_string(), r.to_string()),
            ]
            .into()
        };
        let nodes = [
            l("b1", "r1"),
            l("b2", "r1"),
            l("b1", "r1"),
            l("b1", "no-imds-data"),
        ];
        let leaders = [0, 2, 4, 6];
        let (g, unknown) = tier_groups(&model, 0, &nodes, &leaders);
        assert_eq!(g.len(), 2, "{g:?}");
        assert_eq!(g[0].ranks, [0, 4]);
        assert_eq!(g[1].ranks, [2]);
        assert_eq!(unknown, [3]);
        let (g, unknown) = tier_groups(&model, 1, &nodes, &leaders);
        assert_eq!(g[0].nodes, [0, 2, 3]);
        assert!(unknown.is_empty());
        let ng = node_groups(&[0, 0, 1, 1], &["a".into(), "b".into()]);
        assert_eq!(ng[1].ranks, [2, 3]);
    }
}
