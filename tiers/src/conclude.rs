//! Rank 0's conclusion: the tier table, the judged link matrix and the verdict, and what
//! `--label-nodes` makes of them.

use crate::analysis;
use crate::gate;
use crate::liveness::Lost;
use crate::pairwise::Links;
use crate::topology::{Topology, NODE_NAME_KEY};
use crate::{Error, Job, Options};
use busbw_launchers::topology::node_labels::{NodeLabel, Patch};
use busbw_launchers::Store;
use busbw_reports::tiers::{
    NodeInfo, SlowUplink, TierFailure, TierReport, TierRow, UnreachableNode, Verdict,
};
use std::collections::BTreeSet;
use std::time::Duration;

/// What a tier run concluded, on rank 0.
pub struct Conclusion {
    pub report: TierReport,
    /// Result cells with wrong data in the tier groups (the whole job's are the program's,
    /// in its main table).
    pub wrong: u64,
    /// Each rank's host, in rank order.
    hosts: Vec<String>,
    /// Ranks of the nodes given up on at a roll call: they may never check out of the job.
    pub lost_ranks: usize,
}

impl Conclusion {
    /// Whether the fabric passed: no tier under its threshold, no suspect node, no slow link
    /// left unexplained, no wrong data in the groups.
    pub fn passed(&self) -> bool {
        self.report.verdict.passed
    }

    /// `--label-nodes`: the node patches, once every rank's Kubernetes node name is in (see
    /// [`gate::plan`] for who passes). `run_ok`: the program's own gates passed too.
    pub fn label_patches(
        &self,
        store: &dyn Store,
        label: &NodeLabel,
        run_ok: bool,
        timeout: Duration,
    ) -> Result<Vec<Patch>, Error> {
        let keys: Vec<String> = (0..self.hosts.len())
            .map(|r| format!("{NODE_NAME_KEY}/{r}"))
            .collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let names = store.wait(&keys, timeout).map_err(Error::NodeNames)?;
        let hosts: Vec<(String, String)> = self
            .hosts
            .iter()
            .zip(&names)
            .map(|(h, n)| (h.clone(), String::from_utf8_lossy(n).into_owned()))
            .collect();
        Ok(gate::plan(label, &self.report, run_ok, &hosts))
    }
}

/// The report and whether the fabric passed, from the tiers, the measured links and the
/// nodes given up on. A suspect node every one of whose measured pairs failed outright is
/// unreachable rather than slow.
pub(crate) fn conclude(
    job: &Job,
    topo: &Topology,
    tiers: Vec<TierRow>,
    links: Option<Links>,
    wrong: u64,
    lost: Lost,
    opts: &Options,
) -> Conclusion {
    let (nodes, model) = (&topo.nodes, &topo.model);
    let mut verdict = Verdict {
        passed: true,
        suspect_nodes: Vec::new(),
        slow_links: Vec::new(),
        failed_tiers: Vec::new(),
        unknown_nodes: Vec::new(),
        notes: Vec::new(),
        stragglers: Vec::new(),
        stragglers_allowed: opts.allow_stragglers,
        unreachable_nodes: lost
            .nodes
            .iter()
            .map(|(&n, why)| UnreachableNode {
                node: nodes.names[n].clone(),
                reason: why.clone(),
            })
            .collect(),
        slow_uplinks: Vec::new(),
    };
    for t in &tiers {
        let mut seen: Vec<&Vec<String>> = Vec::new();
        for h in &t.halves {
            if seen.contains(&&h.group) {
                continue;
            }
            seen.push(&h.group);
            let own = t
                .group_results
                .iter()
                .find(|g| g.domain == h.group)
                .and_then(|g| g.busbw.last());
            if let (Some(what), Some(own), Some(last)) = (
                crate::halve::conclusion(&t.halves, &h.group),
                own,
                t.sizes.last(),
            ) {
                let against = match (t.group_results.len(), t.threshold) {
                    (n, _) if n >= 2 => format!(
                        "the tier's median {} GB/s",
                        busbw_reports::tiers::gbs(last.median)
                    ),
                    (_, Some(th)) => format!("--min-busbw-tier {}={th}", t.tier),
                    _ => "its expectation".into(),
                };
                verdict.notes.push(format!(
                    "tier {} group {} fell short ({} GB/s, {against}): {what}",
                    t.tier,
                    h.group.join("/"),
                    busbw_reports::tiers::gbs(*own),
                ));
            }
        }
        if let (Some(false), Some(th), Some(last)) = (t.passed, t.threshold, t.sizes.last()) {
            verdict.failed_tiers.push(TierFailure {
                tier: t.tier.clone(),
                measured: last.min,
                threshold: th,
            });
        }
        if t.threshold.is_some() && t.sizes.is_empty() {
            verdict.notes.push(format!(
                "tier {} has a threshold but nothing was measured there",
                t.tier
            ));
        }
    }
    let matrix = links.map(|(mut m, measured, failed)| {
        let mut j = analysis::judge(&nodes.names, &measured, opts.slow_fraction);
        let up = analysis::uplinks(&crate::pairwise::domains(topo), &measured, &mut j);
        verdict.slow_uplinks = up.iter().map(|u| slow_uplink(topo, u)).collect();
        let (stragglers, note) =
            analysis::stragglers(&nodes.names, &measured, &j, opts.slow_fraction);
        analysis::without_stragglers(&mut j, &stragglers);
        verdict.stragglers = stragglers;
        verdict.notes.extend(note);
        m.links = j.links;
        let index = |name: &str| nodes.names.iter().position(|n| n == name);
        let failed_with = |x: usize| -> Vec<&String> {
            failed
                .iter()
                .filter(|((a, b), _)| *a == x || *b == x)
                .map(|(_, why)| why)
                .collect()
        };
        for s in j.suspects {
            let x = index(&s.node);
            let pairs = measured
                .iter()
                .filter(|l| Some(l.a) == x || Some(l.b) == x)
                .count();
            let whys = x.map(failed_with).unwrap_or_default();
            if pairs > 0 && whys.len() == pairs {
                verdict.unreachable_nodes.push(UnreachableNode {
                    node: s.node.clone(),
                    reason: format!(
                        "answers, but no partner could exchange data with it ({pairs} of {pairs} pairs failed): {}",
                        whys[0]
                    ),
                });
            } else {
                verdict.suspect_nodes.push(s);
            }
        }
        for l in &j.unexplained {
            if let (Some(a), Some(b)) = (index(&l.a), index(&l.b)) {
                if let Some((_, why)) = failed
                    .iter()
                    .find(|(p, _)| *p == (a, b) || *p == (b, a))
                {
                    verdict
                        .notes
                        .push(format!("link {} - {} carried no data: {why}", l.a, l.b));
                }
            }
        }
        verdict.slow_links = j.unexplained;
        m
    });
    verdict.notes.extend(lost.failures.iter().cloned());
    let mut seen_unknown = BTreeSet::new();
    for t in &tiers {
        for n in &t.unknown_nodes {
            if seen_unknown.insert(n.clone()) {
                verdict.unknown_nodes.push(n.clone());
            }
        }
    }
    if model.is_empty() {
        verdict.notes.push(
            "no topology labels found: only the node tier and the link matrix (see docs/tiers.md for the sources)"
                .into(),
        );
    }
    if wrong > 0 {
        verdict.notes.push(format!(
            "{wrong} result cells with wrong data in tier groups"
        ));
    }
    verdict.passed = verdict.failed_tiers.is_empty()
        && verdict.unreachable_nodes.is_empty()
        && verdict.slow_uplinks.is_empty()
        && lost.failures.is_empty()
        && verdict.suspect_nodes.is_empty()
        && verdict.slow_links.is_empty()
        && (verdict.stragglers.is_empty() || opts.allow_stragglers)
        && wrong == 0;
    let keys: BTreeSet<&str> = model
        .outermost_first()
        .iter()
        .map(|l| l.key.as_str())
        .collect();
    let report = TierReport {
        preset: topo.preset.name().into(),
        collective: job.collective.clone(),
        nodes: (0..nodes.names.len())
            .map(|n| NodeInfo {
                name: nodes.names[n].clone(),
                ranks: (0..nodes.of_rank.len())
                    .filter(|&r| nodes.of_rank[r] == n)
                    .collect(),
                labels: nodes.labels[n]
                    .iter()
                    .filter(|(k, _)| keys.contains(k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .collect(),
        tiers,
        matrix,
        verdict,
        data_path: None,
    };
    let lost_ranks = nodes.of_rank.iter().filter(|&&n| lost.contains(n)).count();
    Conclusion {
        report,
        wrong,
        lost_ranks,
        hosts: nodes
            .of_rank
            .iter()
            .map(|&n| nodes.names[n].clone())
            .collect(),
    }
}

/// The verdict's form of a slow uplink: the tier by name, the domain by its label value.
fn slow_uplink(topo: &Topology, u: &analysis::UplinkAt) -> SlowUplink {
    let (model, nodes) = (&topo.model, &topo.nodes);
    let (level, _) = u.domain;
    let tier = model
        .closest_first()
        .get(level)
        .map_or_else(|| format!("level {level}"), |l| l.name.clone());
    let domain = u
        .members
        .first()
        .and_then(|&x| match model.domain(&nodes.labels[x], level) {
            busbw_launchers::topology::Domain::Known(path) => Some(path.join("/")),
            busbw_launchers::topology::Domain::Unknown { .. } => None,
        })
        .unwrap_or_default();
    SlowUplink {
        tier,
        domain,
        nodes: u.members.iter().map(|&x| nodes.names[x].clone()).collect(),
        links: u.links,
        measured: u.measured,
        expected: u.expected,
    }
}
