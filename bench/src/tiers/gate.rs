//! `--label-nodes KEY=VALUE`: the gate before training. Which Kubernetes nodes passed and
//! which the verdict names, and the patches that mark them (launchers::topology::node_labels).

use busbw_launchers::topology::node_labels::{self, NodeLabel, Patch};
use busbw_launchers::topology::SourceConfig;
use busbw_reports::tiers::TierReport;
use std::collections::{BTreeMap, BTreeSet};

/// Hosts the verdict names: suspect nodes, both ends of unexplained slow links, and the
/// nodes of every group under its tier's threshold.
pub fn named_hosts(report: &TierReport) -> BTreeSet<String> {
    let v = &report.verdict;
    let mut bad: BTreeSet<String> = v.suspect_nodes.iter().map(|s| s.node.clone()).collect();
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
pub fn apply(patches: &[Patch], dry_run: bool, cfg: &SourceConfig) -> Result<Vec<String>, String> {
    if dry_run {
        return Ok(patches
            .iter()
            .map(|p| format!("# label-nodes (dry run): {p}"))
            .collect());
    }
    node_labels::apply(cfg, patches, &|k| std::env::var(k).ok()).map(|lines| {
        lines
            .into_iter()
            .map(|l| format!("# label-nodes: {l}"))
            .collect()
    })
}
