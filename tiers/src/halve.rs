//! Where in a group that fell short the fault lies: the group cut in halves along its own
//! tree (whole sub-domains on each side where it has them), all halves of a tier measured at
//! once, and the short halves cut again, until the halves deliver or are single nodes.
//!
//! A group of a tier falls short when its busbw at the largest size is under
//! `1 - --slow-fraction` of the tier's median over its groups (with two groups or more), or
//! under 0.9 x the tier's `--min-busbw-tier`. A half is judged against the same figures: a
//! ring's busbw is the slowest link's bandwidth whatever the ring's length, so a half of a
//! tier's group that keeps a bad node or a bad uplink is short too, and one without is not.
//! Two halves that both deliver put the fault between them (the links or uplinks that join
//! them), which the pairwise rounds then name. Everything here but the sweeps is a pure
//! function of the labels and the figures, computed alike on every rank from the groups'
//! published results, so no rank waits for a decision.

use crate::schedule::Group;
use busbw_launchers::topology::{Domain, Labels, TierModel};
use busbw_reports::tiers::Half;

/// What a tier's groups are judged against: the median over its groups at the largest size
/// (when there are two or more) and its threshold.
#[derive(Clone, Copy, Debug)]
pub struct Expectation {
    pub median: Option<f64>,
    pub threshold: Option<f64>,
    pub slow_fraction: f64,
}

impl Expectation {
    /// `last`: each measured group's busbw at the largest size.
    pub fn new(last: &[f64], threshold: Option<f64>, slow_fraction: f64) -> Expectation {
        Expectation {
            median: (last.len() >= 2).then(|| crate::analysis::median(last)),
            threshold,
            slow_fraction,
        }
    }

    pub fn short(&self, busbw: f64) -> bool {
        self.median
            .is_some_and(|m| busbw < (1.0 - self.slow_fraction) * m)
            || self.threshold.is_some_and(|t| busbw < 0.9 * t)
    }
}

/// `group`'s two halves, or `None` for a single node. Its nodes sorted by their place in the
/// tree (closest level last), the cut is at the boundary of the widest level below
/// `level` (the group's own, closest first) that has one inside the group, nearest the
/// middle; without any (nodes with unknown labels), at the middle. `leaders[n]` is node
/// `n`'s rank in the groups.
pub fn split(
    group: &Group,
    level: usize,
    model: &TierModel,
    labels: &[Labels],
    leaders: &[usize],
) -> Option<(Group, Group)> {
    if group.nodes.len() < 2 {
        return None;
    }
    let path = |n: usize, l: usize| match model.domain(&labels[n], l) {
        Domain::Known(p) => p,
        Domain::Unknown { .. } => Vec::new(),
    };
    let mut nodes = group.nodes.clone();
    nodes.sort_by(|&a, &b| {
        let (pa, pb) = (path(a, 0), path(b, 0));
        pa.cmp(&pb).then(a.cmp(&b))
    });
    let len = nodes.len();
    let mut cut = len / 2;
    for l in (0..level.min(model.len())).rev() {
        let bounds: Vec<usize> = (1..len)
            .filter(|&i| path(nodes[i - 1], l) != path(nodes[i], l))
            .collect();
        if let Some(&b) = bounds
            .iter()
            .min_by_key(|&&b| (b as i64 - (len / 2) as i64).abs())
        {
            cut = b;
            break;
        }
    }
    let half = |ns: &[usize]| {
        let mut ns = ns.to_vec();
        ns.sort_unstable();
        let mut ranks: Vec<usize> = ns.iter().map(|&n| leaders[n]).collect();
        ranks.sort_unstable();
        Group {
            domain: group.domain.clone(),
            nodes: ns,
            ranks,
        }
    };
    Some((half(&nodes[..cut]), half(&nodes[cut..])))
}

/// What the halving of one group found, for the verdict's note: the short halves of the
/// last round that measured any, or the gap between two halves that both deliver.
pub fn conclusion(halves: &[Half], group: &[String]) -> Option<String> {
    let mine: Vec<&Half> = halves.iter().filter(|h| h.group == group).collect();
    let last = mine.iter().map(|h| h.round).max()?;
    let at = |r: usize| -> Vec<&Half> { mine.iter().copied().filter(|h| h.round == r).collect() };
    let names = |hs: &[&Half]| -> String {
        hs.iter()
            .map(|h| h.nodes.join(", "))
            .collect::<Vec<_>>()
            .join(" and ")
    };
    let now = at(last);
    let short: Vec<&Half> = now.iter().copied().filter(|h| h.short).collect();
    if !short.is_empty() {
        return Some(format!("narrowed to {}", names(&short)));
    }
    let alone: Vec<&Half> = now.iter().copied().filter(|h| h.busbw.is_none()).collect();
    if alone.len() == now.len() {
        // Single nodes: the halves before them are as far as the groups go.
        let before: Vec<&Half> = at(last - 1).into_iter().filter(|h| h.short).collect();
        return Some(if before.is_empty() {
            "its halves are single nodes, not measured alone (the pairwise rounds tell them apart)"
                .into()
        } else {
            format!(
                "narrowed to {} (single nodes are not measured alone)",
                names(&before)
            )
        });
    }
    if !alone.is_empty() {
        return Some(format!(
            "narrowed to {} (not measured alone; the other half delivers)",
            names(&alone)
        ));
    }
    Some(format!(
        "each half delivers ({}): the fault lies between them, in the links or uplinks that join them",
        now.iter()
            .map(|h| h.nodes.join(", "))
            .collect::<Vec<_>>()
            .join(" | ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_launchers::topology::presets::{OCI_ISLAND, OCI_LOCAL_BLOCK, OCI_NETWORK_BLOCK};

    fn oci(nodes: usize, lb: usize, nb: usize) -> (TierModel, Vec<Labels>) {
        let labels: Vec<Labels> = (0..nodes)
            .map(|i| {
                [
                    (OCI_ISLAND, "island0".to_string()),
                    (OCI_NETWORK_BLOCK, format!("nb{}", i / nb)),
                    (OCI_LOCAL_BLOCK, format!("lb{}", (i % nb) / lb)),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect()
            })
            .collect();
        let model =
            TierModel::from_keys(&[OCI_ISLAND, OCI_NETWORK_BLOCK, OCI_LOCAL_BLOCK]).unwrap();
        (model, labels)
    }

    #[test]
    fn a_group_is_cut_between_its_sub_domains_nearest_the_middle() {
        // One network block of 4 local blocks of 2.
        let (model, labels) = oci(8, 2, 8);
        let leaders: Vec<usize> = (0..8).collect();
        let g = Group {
            domain: vec!["island0".into(), "nb0".into()],
            nodes: (0..8).collect(),
            ranks: (0..8).collect(),
        };
        let (a, b) = split(&g, 1, &model, &labels, &leaders).unwrap();
        assert_eq!(
            (a.nodes.as_slice(), b.nodes.as_slice()),
            (&[0, 1, 2, 3][..], &[4, 5, 6, 7][..])
        );
        // A half of three local blocks' worth is cut at a block boundary, not mid-block.
        let g = Group {
            nodes: vec![0, 1, 2, 3, 4, 5],
            ranks: vec![0, 1, 2, 3, 4, 5],
            ..g
        };
        let (a, b) = split(&g, 1, &model, &labels, &leaders).unwrap();
        assert!(
            a.nodes.len() % 2 == 0 && b.nodes.len() % 2 == 0,
            "{a:?} {b:?}"
        );
        // A local block is cut between its nodes; one node is not cut.
        let g = Group {
            domain: vec![],
            nodes: vec![6, 7],
            ranks: vec![6, 7],
        };
        let (a, b) = split(&g, 0, &model, &labels, &leaders).unwrap();
        assert_eq!((a.ranks, b.ranks), (vec![6], vec![7]));
        let one = Group {
            domain: vec![],
            nodes: vec![6],
            ranks: vec![6],
        };
        assert!(split(&one, 0, &model, &labels, &leaders).is_none());
    }

    #[test]
    fn short_is_under_the_fraction_of_the_median_or_the_threshold() {
        let e = Expectation::new(&[10.0, 10.2, 2.0], None, 0.25);
        assert!(e.short(2.0) && !e.short(9.0));
        // One group: no median to compare with; only a threshold says short.
        let e = Expectation::new(&[2.0], None, 0.25);
        assert!(!e.short(2.0));
        let e = Expectation::new(&[2.0], Some(5.0), 0.25);
        assert!(e.short(2.0) && !e.short(4.6));
    }

    #[test]
    fn the_conclusion_names_the_short_halves_or_the_gap_between() {
        let h = |round, nodes: &[&str], busbw: Option<f64>, short| Half {
            group: vec!["nb1".into()],
            round,
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            busbw,
            short,
            from: None,
        };
        let g = vec!["nb1".to_string()];
        let v = [
            h(1, &["n4", "n5"], Some(1.0), false),
            h(1, &["n6", "n7"], Some(0.2), true),
        ];
        assert_eq!(conclusion(&v, &g).unwrap(), "narrowed to n6, n7");
        let v = [
            h(1, &["n4", "n5"], Some(1.0), false),
            h(1, &["n6", "n7"], Some(1.0), false),
        ];
        assert!(conclusion(&v, &g)
            .unwrap()
            .starts_with("each half delivers (n4, n5 | n6, n7)"));
        let v = [
            h(1, &["n4", "n5"], Some(1.0), false),
            h(1, &["n6", "n7"], Some(0.2), true),
            h(2, &["n6"], None, false),
            h(2, &["n7"], None, false),
        ];
        assert_eq!(
            conclusion(&v, &g).unwrap(),
            "narrowed to n6, n7 (single nodes are not measured alone)"
        );
        let v = [h(1, &["n6"], None, false), h(1, &["n7"], None, false)];
        assert!(conclusion(&v, &g)
            .unwrap()
            .starts_with("its halves are single nodes"));
        let v = [
            h(1, &["n5"], None, false),
            h(1, &["n6", "n7"], Some(1.0), false),
        ];
        assert!(conclusion(&v, &g)
            .unwrap()
            .starts_with("narrowed to n5 (not measured alone"));
        assert!(conclusion(&v, &["nb0".to_string()]).is_none());
    }
}
