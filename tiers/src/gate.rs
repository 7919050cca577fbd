//! `--label-nodes KEY=VALUE`: the gate before training. Which Kubernetes nodes passed and
//! which the verdict names, and the patches that mark them (launchers::topology::node_labels).

use crate::Error;
use busbw_launchers::topology::node_labels::{self, NodeLabel, Patch};
use busbw_launchers::topology::SourceConfig;
use busbw_reports::tiers::TierReport;
use std::collections::{BTreeMap, BTreeSet};

/// Hosts the verdict names: unreachable and suspect nodes, stragglers (unless allowed),
/// both ends of unexplained slow links, the nodes behind a slow uplink (a job placed on them
/// is slowed as if they were slow, until the switch is fixed), and the nodes of every group
/// under its tier's threshold.
pub fn named_hosts(report: &TierReport) -> BTreeSet<String> {
    let v = &report.verdict;
    let mut bad: BTreeSet<String> = v.suspect_nodes.iter().map(|s| s.node.clone()).collect();
    bad.extend(v.unreachable_nodes.iter().map(|u| u.node.clone()));
    for u in &v.slow_uplinks {
        bad.extend(u.nodes.iter().cloned());
    }
    if !v.stragglers_allowed {
        bad.extend(v.stragglers.iter().map(|s| s.node.clone()));
    }
    for l in &v.slow_links {
        bad.insert(l.a.clone());
        bad.insert(l.b.clone());
    }
    for t in report.tiers.iter().filter(|t| t.passed == Some(false)) {
        let Some(th) = t.threshold else { continue };
        for g in &t.group_results {
            if g.busbw.last().is_some_and(|&b| b < 0.9 * th) {
                bad.extend(g.nodes.iter().cloned());
            }
        }
    }
    bad
}

/// The patches: `hosts` pairs each host of the job with its Kubernetes node. A node fails
/// when any of its hosts is named, or every node fails when the run failed for a reason no
/// node is named for (wrong data, the main gate): then nothing was shown to be good.
pub fn plan(
    label: &NodeLabel,
    report: &TierReport,
    run_ok: bool,
    hosts: &[(String, String)],
) -> Vec<Patch> {
    let named = named_hosts(report);
    let blame_all = !run_ok && named.is_empty();
    let mut node_ok: BTreeMap<&str, bool> = BTreeMap::new();
    for (host, node) in hosts {
        let ok = !blame_all && !named.contains(host);
        let e = node_ok.entry(node.as_str()).or_insert(true);
        *e &= ok;
    }
    let passed: Vec<String> = node_ok
        .iter()
        .filter(|(_, &ok)| ok)
        .map(|(n, _)| n.to_string())
        .collect();
    let failed: Vec<String> = node_ok
        .iter()
        .filter(|(_, &ok)| !ok)
        .map(|(n, _)| n.to_string())
        .collect();
    node_labels::patches(label, &passed, &failed)
}

/// Print (dry run) or send the patches; `#` lines for stdout, or the error.
pub fn apply(patches: &[Patch], dry_run: bool, cfg: &SourceConfig) -> Result<Vec<String>, Error> {
    if dry_run {
        return Ok(patches
            .iter()
            .map(|p| format!("# label-nodes (dry run): {p}"))
            .collect());
    }
    node_labels::apply(cfg, patches, &|k| std::env::var(k).ok())
        .map(|lines| {
            lines
                .into_iter()
                .map(|l| format!("# label-nodes: {l}"))
                .collect()
        })
        .map_err(Error::LabelNodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_reports::tiers::{GroupResult, Link, SuspectNode, TierRow, Verdict};

    fn report(verdict: Verdict, tiers: Vec<TierRow>) -> TierReport {
        TierReport {
            preset: "oci".into(),
            collective: "all_reduce_perf".into(),
            nodes: Vec::new(),
            tiers,
            matrix: None,
            verdict,
            data_path: None,
        }
    }

    fn verdict() -> Verdict {
        Verdict {
            passed: false,
            suspect_nodes: Vec::new(),
            slow_links: Vec::new(),
            failed_tiers: Vec::new(),
            unknown_nodes: Vec::new(),
            notes: Vec::new(),
            stragglers: Vec::new(),
            stragglers_allowed: false,
            unreachable_nodes: Vec::new(),
            slow_uplinks: Vec::new(),
        }
    }

    fn set(p: &[Patch]) -> Vec<(String, bool)> {
        p.iter().map(|p| (p.node.clone(), p.set)).collect()
    }

    #[test]
    fn suspects_slow_links_and_groups_under_threshold_are_named() {
        let mut v = verdict();
        v.suspect_nodes.push(SuspectNode {
            node: "h1".into(),
            slow_links: 3,
            links: 3,
            measured: 1.0,
            expected: 2.0,
        });
        v.slow_links.push(Link {
            a: "h2".into(),
            b: "h3".into(),
            tier: "local_block".into(),
            busbw: 1.0,
            expected: 2.0,
            slow: true,
        });
        let group = |nodes: &[&str], bw: f64| GroupResult {
            domain: vec!["d".into()],
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            ranks: nodes.len(),
            busbw: vec![100.0, bw],
        };
        let tier = TierRow {
            tier: "network_block".into(),
            key: "k".into(),
            groups: 2,
            ranks_min: 2,
            ranks_max: 2,
            unknown_nodes: Vec::new(),
            note: None,
            sizes: Vec::new(),
            group_results: vec![group(&["h4", "h5"], 10.0), group(&["h6", "h7"], 50.0)],
            threshold: Some(40.0),
            passed: Some(false),
            halves: Vec::new(),
        };
        let r = report(v, vec![tier]);
        let named: Vec<String> = named_hosts(&r).into_iter().collect();
        assert_eq!(named, ["h1", "h2", "h3", "h4", "h5"]);
        // Two pods on node n7 (h6, h7 pass) and one named host on n1: n1 fails.
        let label: NodeLabel = "ok=yes".parse().unwrap();
        let hosts: Vec<(String, String)> = [("h1", "n1"), ("h6", "n7"), ("h7", "n7"), ("h8", "n1")]
            .iter()
            .map(|(h, n)| (h.to_string(), n.to_string()))
            .collect();
        let p = plan(&label, &r, true, &hosts);
        assert_eq!(set(&p), [("n1".into(), false), ("n7".into(), true)]);
    }

    #[test]
    fn a_failure_that_names_nobody_fails_everybody() {
        let label: NodeLabel = "ok=yes".parse().unwrap();
        let hosts = vec![
            ("h1".to_string(), "n1".to_string()),
            ("h2".into(), "n2".into()),
        ];
        let r = report(verdict(), Vec::new());
        assert_eq!(
            set(&plan(&label, &r, false, &hosts)),
            [("n1".into(), false), ("n2".into(), false)]
        );
        assert_eq!(
            set(&plan(&label, &r, true, &hosts)),
            [("n1".into(), true), ("n2".into(), true)]
        );
    }
}
