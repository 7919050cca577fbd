//! Results of `busbw tiers`: bus bandwidth per topology tier, the pairwise link matrix and the
//! verdict that names slow nodes and links, with their text rendering.
//!
//! The text goes after the main table as `#` comment lines, so parsers of the nccl-tests
//! table (which skip comments) keep working on `busbw tiers` output.

use crate::record::{PairwiseRecord, SlowLink, TierRecord, TiersRecord, VerdictRecord};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Everything `busbw tiers` measured and concluded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierReport {
    /// `--topology-preset` after `auto` was resolved.
    pub preset: String,
    /// The collective run per tier (`all_reduce_perf`).
    pub collective: String,
    /// One entry per node (host), in order of its first rank.
    pub nodes: Vec<NodeInfo>,
    /// Closest tier first.
    pub tiers: Vec<TierRow>,
    pub matrix: Option<LinkMatrix>,
    pub verdict: Verdict,
    /// Where the groups' device bytes went (`-g`, `--engine nccl`), as the run header's
    /// `Data path`; `None` for host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub ranks: Vec<usize>,
    /// The labels of the tier model's keys as the node reported them.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// One tier: its groups and their bandwidth per size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierRow {
    /// Short name (`local_block`); `node` for the ranks of one host.
    pub tier: String,
    /// Label key, or `(host)` for the node tier.
    pub key: String,
    pub groups: usize,
    pub ranks_min: usize,
    pub ranks_max: usize,
    /// Nodes whose domain at this tier is unknown (missing or placeholder label).
    pub unknown_nodes: Vec<String>,
    /// Why nothing was measured, when nothing was.
    pub note: Option<String>,
    pub sizes: Vec<TierSize>,
    pub group_results: Vec<GroupResult>,
    /// `--min-busbw-tier` for this tier, GB/s.
    pub threshold: Option<f64>,
    /// Whether the slowest group at the largest size met 0.9 x the threshold.
    pub passed: Option<bool>,
    /// Groups that fell short, cut in halves and measured again, all halves at once, until
    /// the halves deliver or cannot be cut: where in the group the fault lies.
    #[serde(default)]
    pub halves: Vec<Half>,
}

/// One half of a group that fell short (or of a half that did).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Half {
    /// The domain of the tier's group it was cut from.
    pub group: Vec<String>,
    /// 1 for the halves of the group, 2 for theirs, ...
    pub round: usize,
    pub nodes: Vec<String>,
    /// busbw at the tier's largest size, GB/s; `None` when it could not be measured (a
    /// half of one node, or its sweep failed).
    pub busbw: Option<f64>,
    /// Under the tier's expectation, as its group was (a closer tier's group: under its own
    /// tier's).
    pub short: bool,
    /// The tier whose group had exactly these ranks, when its figure was taken from there
    /// rather than measured again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// busbw across the groups of a tier at one size (out-of-place, GB/s).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TierSize {
    pub size: u64,
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

/// One group of a tier: its domain (values outermost first) and busbw per size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupResult {
    pub domain: Vec<String>,
    pub nodes: Vec<String>,
    pub ranks: usize,
    /// Aligned with [`TierRow::sizes`].
    pub busbw: Vec<f64>,
}

/// Pairwise sendrecv between nodes (one rank each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkMatrix {
    pub size: u64,
    pub rounds: usize,
    pub nodes: Vec<String>,
    /// `busbw[a][b]` in GB/s, symmetric, `None` on the diagonal.
    pub busbw: Vec<Vec<Option<f64>>>,
    pub links: Vec<Link>,
    /// Under `--budget`: what the budget bought (rounds, size, pairs of all, spread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
}

/// One measured node pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub a: String,
    pub b: String,
    /// The closest tier the two share; `beyond` past the outermost, `unknown` when a label
    /// that would tell is unknown.
    pub tier: String,
    pub busbw: f64,
    /// Median of the links of the same tier.
    pub expected: f64,
    pub slow: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspectNode {
    pub node: String,
    pub slow_links: usize,
    pub links: usize,
    /// Median busbw of the node's links, GB/s.
    pub measured: f64,
    /// Median of what those links should have given.
    pub expected: f64,
}

/// A node the others waited for now and then: its links' median is healthy, but iterations
/// with it spike (a noisy neighbour on its cores, a flapping link), with several partners.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    pub node: String,
    /// Iterations under the slow fraction of their tier's median, over all of its pairs'.
    pub spikes: usize,
    pub iterations: usize,
    /// Its partners with a spike, and its pairs measured.
    pub partners: usize,
    pub pairs: usize,
    /// The slowest iteration as a fraction of what its tier delivers.
    pub worst: f64,
    /// Which iterations were hit, pair by pair (the tier tells where).
    pub hits: Vec<StragglerHit>,
}

/// The iterations of one pair with a straggler that spiked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StragglerHit {
    pub partner: String,
    pub tier: String,
    /// 0-based iteration indices of the pair's measurement(s), in order.
    pub iterations: Vec<usize>,
    pub of: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierFailure {
    pub tier: String,
    pub measured: f64,
    pub threshold: f64,
}

/// What the run concluded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// No tier under its threshold, no suspect node, no slow link.
    pub passed: bool,
    pub suspect_nodes: Vec<SuspectNode>,
    /// Slow links not explained by a suspect node at either end.
    pub slow_links: Vec<Link>,
    pub failed_tiers: Vec<TierFailure>,
    /// Nodes with at least one unknown tier label.
    pub unknown_nodes: Vec<String>,
    pub notes: Vec<String>,
    /// Nodes whose iterations spike with several partners; they fail the verdict unless
    /// `--allow-stragglers` ([`Verdict::stragglers_allowed`]).
    #[serde(default)]
    pub stragglers: Vec<Straggler>,
    #[serde(default)]
    pub stragglers_allowed: bool,
    /// Nodes the gate gave up on: a rank that stopped answering (hung, killed, cut off from
    /// the job's store) or a node no partner could exchange data with. The rest of the
    /// verdict was reached without them.
    #[serde(default)]
    pub unreachable_nodes: Vec<UnreachableNode>,
    /// Domains of the tree (a block, a network block) every link leaving which is slow and
    /// every link inside good: their uplink, not their nodes.
    #[serde(default)]
    pub slow_uplinks: Vec<SlowUplink>,
}

/// A domain whose uplink is slow: its tier, its label value, its nodes, and the links that
/// left it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowUplink {
    pub tier: String,
    pub domain: String,
    pub nodes: Vec<String>,
    /// Links measured leaving it (every one slow).
    pub links: usize,
    /// Their median busbw and the median of what their tiers deliver, GB/s.
    pub measured: f64,
    pub expected: f64,
}

/// A node marked failed, and why: what it did not answer, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnreachableNode {
    pub node: String,
    pub reason: String,
}

impl Verdict {
    /// Every finding with its kind, as the exporters carry them.
    pub fn findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        let lines = verdict_lines(self);
        let mut lines = lines.into_iter();
        for u in &self.unreachable_nodes {
            out.push(Finding::new(
                FindingKind::UnreachableNode,
                &u.node,
                lines.next(),
            ));
        }
        for u in &self.slow_uplinks {
            let subject = format!("{} {}", u.tier, u.domain);
            out.push(Finding::new(
                FindingKind::SlowUplink,
                &subject,
                lines.next(),
            ));
        }
        for s in &self.suspect_nodes {
            out.push(Finding::new(FindingKind::SlowNode, &s.node, lines.next()));
        }
        for l in &self.slow_links {
            let subject = format!("{} - {}", l.a, l.b);
            out.push(Finding::new(FindingKind::SlowLink, &subject, lines.next()));
        }
        for s in &self.stragglers {
            // An allowed straggler is reported, not held against the fabric.
            let line = lines.next();
            if !self.stragglers_allowed {
                out.push(Finding::new(FindingKind::Straggler, &s.node, line));
            }
        }
        for f in &self.failed_tiers {
            out.push(Finding::new(
                FindingKind::TierUnderThreshold,
                &f.tier,
                lines.next(),
            ));
        }
        for n in &self.notes {
            if n.contains("wrong data") {
                out.push(Finding::new(FindingKind::WrongData, "", Some(n.clone())));
            }
        }
        out
    }
}

/// What kind of fault a verdict names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    SlowNode,
    SlowLink,
    /// A domain of the tree whose links out are slow: its uplink.
    SlowUplink,
    Straggler,
    /// Hung, gone, or cut off: marked failed within `-T`.
    UnreachableNode,
    WrongData,
    TierUnderThreshold,
}

impl FindingKind {
    pub fn name(self) -> &'static str {
        match self {
            FindingKind::SlowNode => "slow_node",
            FindingKind::SlowLink => "slow_link",
            FindingKind::SlowUplink => "slow_uplink",
            FindingKind::Straggler => "straggler",
            FindingKind::UnreachableNode => "unreachable_node",
            FindingKind::WrongData => "wrong_data",
            FindingKind::TierUnderThreshold => "tier_under_threshold",
        }
    }
}

/// One finding of a verdict: its kind, what it names (a node, `a - b` for a link, a tier),
/// and the line a person reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub subject: String,
    pub detail: String,
}

impl Finding {
    fn new(kind: FindingKind, subject: &str, detail: Option<String>) -> Finding {
        Finding {
            kind,
            subject: subject.to_string(),
            detail: detail.unwrap_or_default(),
        }
    }
}

impl TierReport {
    /// The run record's summary of the report: per tier the slowest group's figures per size
    /// (what a tier guarantees), the link matrix with its slow links, and the verdict in one
    /// line per finding. `busbw_factor(n)` is the collective's bus factor for `n` ranks, which
    /// turns a group's busbw back into its algbw and time per operation.
    pub fn records(
        &self,
        busbw_factor: &dyn Fn(usize) -> f64,
    ) -> (TiersRecord, Option<PairwiseRecord>, VerdictRecord) {
        let tiers = self
            .tiers
            .iter()
            .map(|t| TierRecord {
                name: t.tier.clone(),
                collective: self.collective.clone(),
                groups: t.groups,
                link_rate_gbps: None,
                rows: t
                    .sizes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        // The slowest group's size decides the bus factor of the minimum.
                        let ranks = t
                            .group_results
                            .iter()
                            .filter(|g| g.busbw.get(i).is_some_and(|b| *b <= s.min))
                            .map(|g| g.ranks)
                            .next()
                            .unwrap_or(t.ranks_min);
                        let f = busbw_factor(ranks);
                        let algbw = if f > 0.0 { s.min / f } else { s.min };
                        let time_us = if algbw > 0.0 {
                            s.size as f64 / (algbw * 1e3)
                        } else {
                            0.0
                        };
                        crate::record::TierRow {
                            size: s.size,
                            time_us,
                            algbw,
                            busbw: s.min,
                        }
                    })
                    .collect(),
                verdict: match (t.passed, t.threshold, t.sizes.last()) {
                    (Some(pass), Some(th), Some(last)) => Some(VerdictRecord {
                        pass,
                        reason: format!(
                            "slowest group {} GB/s at {} B {} 0.9 x --min-busbw-tier {}={th}",
                            gbs(last.min),
                            last.size,
                            if pass { ">=" } else { "<" },
                            t.tier
                        ),
                        findings: Vec::new(),
                    }),
                    _ => None,
                },
            })
            .collect();
        let pairwise = self.matrix.as_ref().map(|m| {
            let index = |name: &str| m.nodes.iter().position(|n| n == name);
            PairwiseRecord {
                nodes: m.nodes.clone(),
                size: m.size,
                busbw: m.busbw.clone(),
                slow: m
                    .links
                    .iter()
                    .filter(|l| l.slow)
                    .filter_map(|l| {
                        Some(SlowLink {
                            a: index(&l.a)?,
                            b: index(&l.b)?,
                            reason: format!(
                                "{} GB/s, expected {} GB/s (tier {})",
                                gbs(l.busbw),
                                gbs(l.expected),
                                l.tier
                            ),
                        })
                    })
                    .collect(),
            }
        });
        let findings = verdict_lines(&self.verdict);
        let verdict = VerdictRecord {
            pass: self.verdict.passed,
            reason: findings.join("; "),
            findings: self.verdict.findings(),
        };
        (TiersRecord { tiers }, pairwise, verdict)
    }

    /// Topology labels by node name, for the run record's world.
    pub fn labels(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.nodes
            .iter()
            .filter(|n| !n.labels.is_empty())
            .map(|n| (n.name.clone(), n.labels.clone()))
            .collect()
    }
}

/// One line per finding of the verdict, without the comment prefix.
fn verdict_lines(v: &Verdict) -> Vec<String> {
    let mut out = Vec::new();
    for u in &v.unreachable_nodes {
        out.push(format!("unreachable node {}: {}", u.node, u.reason));
    }
    for u in &v.slow_uplinks {
        out.push(format!(
            "slow uplink of {} {} ({} nodes: {}): {} of {} links leaving it slow, median {} GB/s, expected {} GB/s; links inside it are not",
            u.tier,
            u.domain,
            u.nodes.len(),
            u.nodes.join(", "),
            u.links,
            u.links,
            gbs(u.measured),
            gbs(u.expected)
        ));
    }
    for s in &v.suspect_nodes {
        out.push(format!(
            "suspect node {}: {} of {} links slow, median {} GB/s, expected {} GB/s",
            s.node,
            s.slow_links,
            s.links,
            gbs(s.measured),
            gbs(s.expected)
        ));
    }
    for l in &v.slow_links {
        out.push(format!(
            "slow link {} - {} (tier {}): {} GB/s, expected {} GB/s",
            l.a,
            l.b,
            l.tier,
            gbs(l.busbw),
            gbs(l.expected)
        ));
    }
    for s in &v.stragglers {
        let hits: Vec<String> = s
            .hits
            .iter()
            .map(|h| {
                let its: Vec<String> = h.iterations.iter().map(|i| i.to_string()).collect();
                format!(
                    "with {} ({}) iterations {} of {}",
                    h.partner,
                    h.tier,
                    its.join(","),
                    h.of
                )
            })
            .collect();
        out.push(format!(
            "straggler node {}: {} of {} iterations spiked ({:.0}%), with {} of {} partners, slowest at {:.2} of expected{}: {}",
            s.node,
            s.spikes,
            s.iterations,
            100.0 * s.spikes as f64 / s.iterations.max(1) as f64,
            s.partners,
            s.pairs,
            s.worst,
            if v.stragglers_allowed { " (allowed)" } else { "" },
            hits.join("; ")
        ));
    }
    for f in &v.failed_tiers {
        out.push(format!(
            "tier {} below its threshold: {} GB/s, --min-busbw-tier {}={} (10% slack)",
            f.tier,
            gbs(f.measured),
            f.tier,
            f.threshold
        ));
    }
    if !v.unknown_nodes.is_empty() {
        out.push(format!(
            "topology unknown (missing or placeholder labels) on: {}",
            v.unknown_nodes.join(", ")
        ));
    }
    out.extend(v.notes.iter().cloned());
    if v.passed
        && v.suspect_nodes.is_empty()
        && v.slow_links.is_empty()
        && v.unreachable_nodes.is_empty()
        && v.slow_uplinks.is_empty()
    {
        out.push(if v.stragglers.is_empty() {
            "no suspect node, no slow link, no straggler".into()
        } else {
            "no suspect node, no slow link".into()
        });
    }
    out
}

/// GB/s with 4 significant digits, small values included (a shaped test link is 0.0125).
pub fn gbs(v: f64) -> String {
    if !v.is_finite() {
        return "nan".into();
    }
    let digits = if v >= 100.0 {
        1
    } else if v >= 1.0 {
        2
    } else if v > 0.0 {
        (3 - v.log10().floor() as i32).clamp(2, 8) as usize
    } else {
        2
    };
    format!("{v:.digits$}")
}

/// The tier table, the link matrix (up to 32 nodes; JSON has it always) and the verdict,
/// one string per line, each starting with `#`.
pub fn tier_lines(r: &TierReport) -> Vec<String> {
    let mut out = vec![
        "#".to_string(),
        format!(
            "# Topology tiers (preset {}, closest first): {} busbw in GB/s across the groups of each tier, out-of-place",
            r.preset, r.collective
        ),
    ];
    if let Some(p) = &r.data_path {
        out.push(format!("#   data path: {p}"));
    }
    out.extend([format!(
        "# {:<16} {:>6} {:>11} {:>7} {:>12} {:>10} {:>10} {:>10}",
        "tier", "groups", "ranks/group", "unknown", "size", "min", "median", "max"
    )]);
    for t in &r.tiers {
        let ranks = if t.ranks_min == t.ranks_max {
            t.ranks_min.to_string()
        } else {
            format!("{}-{}", t.ranks_min, t.ranks_max)
        };
        let lead = format!(
            "# {:<16} {:>6} {:>11} {:>7}",
            t.tier,
            t.groups,
            ranks,
            t.unknown_nodes.len()
        );
        if t.sizes.is_empty() {
            out.push(format!(
                "{lead} {:>12} {}",
                "-",
                t.note.as_deref().unwrap_or("not measured")
            ));
        }
        for (i, s) in t.sizes.iter().enumerate() {
            let lead = if i == 0 {
                lead.clone()
            } else {
                format!("# {:<16} {:>6} {:>11} {:>7}", "", "", "", "")
            };
            out.push(format!(
                "{lead} {:>12} {:>10} {:>10} {:>10}",
                s.size,
                gbs(s.min),
                gbs(s.median),
                gbs(s.max)
            ));
        }
        if let (Some(note), false) = (&t.note, t.sizes.is_empty()) {
            out.push(format!("#   {}: {note}", t.tier));
        }
        let mut cut: Vec<(&Vec<String>, usize)> = Vec::new();
        for h in &t.halves {
            if !cut.contains(&(&h.group, h.round)) {
                cut.push((&h.group, h.round));
            }
        }
        for (group, round) in cut {
            let halves: Vec<String> = t
                .halves
                .iter()
                .filter(|h| &h.group == group && h.round == round)
                .map(|h| {
                    format!(
                        "{} {}{}{}",
                        h.nodes.join(","),
                        h.busbw.map_or_else(|| "-".to_string(), gbs),
                        if h.short { " short" } else { "" },
                        h.from
                            .as_ref()
                            .map_or_else(String::new, |f| format!(" (as {f})"))
                    )
                })
                .collect();
            out.push(format!(
                "#   {} {} short, halves (round {round}): {}",
                t.tier,
                group.join("/"),
                halves.join("; ")
            ));
        }
        if !t.unknown_nodes.is_empty() {
            out.push(format!(
                "#   {}: label {} unknown on {}",
                t.tier,
                t.key,
                t.unknown_nodes.join(", ")
            ));
        }
    }
    if let Some(m) = &r.matrix {
        out.push("#".into());
        out.push(format!(
            "# Pairwise sendrecv busbw in GB/s at {} bytes, {} rounds of disjoint pairs",
            m.size, m.rounds
        ));
        if let Some(b) = &m.budget {
            out.push(format!("#   {b}"));
        }
        if m.nodes.len() <= 32 {
            let w = m
                .busbw
                .iter()
                .flatten()
                .flatten()
                .map(|v| gbs(*v).len())
                .max()
                .unwrap_or(4)
                .max(4);
            let mut head = format!("# {:>4}", "");
            for j in 0..m.nodes.len() {
                head.push_str(&format!(" {j:>w$}"));
            }
            out.push(head);
            for (i, row) in m.busbw.iter().enumerate() {
                let mut line = format!("# {i:>4}");
                for v in row {
                    let cell = v.map(gbs).unwrap_or_else(|| "-".into());
                    line.push_str(&format!(" {cell:>w$}"));
                }
                line.push_str(&format!("  {}", m.nodes[i]));
                out.push(line);
            }
        } else {
            out.push(format!(
                "#   {} nodes: matrix left out of the text (see --export-json)",
                m.nodes.len()
            ));
        }
        let mut tiers: Vec<&str> = Vec::new();
        for l in &m.links {
            if !tiers.contains(&l.tier.as_str()) {
                tiers.push(&l.tier);
            }
        }
        for t in tiers {
            let bw: Vec<f64> = m
                .links
                .iter()
                .filter(|l| l.tier == t)
                .map(|l| l.busbw)
                .collect();
            let exp = m
                .links
                .iter()
                .find(|l| l.tier == t)
                .map(|l| l.expected)
                .unwrap_or(0.0);
            let lo = bw.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = bw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.push(format!(
                "#   links within {t}: {} pairs, median {}, min {}, max {}",
                bw.len(),
                gbs(exp),
                gbs(lo),
                gbs(hi)
            ));
        }
    }
    out.push("#".into());
    let v = &r.verdict;
    out.push(format!(
        "# Verdict: {}",
        if v.passed { "PASS" } else { "FAIL" }
    ));
    out.extend(verdict_lines(v).into_iter().map(|l| format!("#   {l}")));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> TierReport {
        let link = |a: &str, b: &str, bw: f64, slow: bool| Link {
            a: a.into(),
            b: b.into(),
            tier: "local_block".into(),
            busbw: bw,
            expected: 0.025,
            slow,
        };
        TierReport {
            data_path: None,
            preset: "oci".into(),
            collective: "all_reduce_perf".into(),
            nodes: vec![NodeInfo {
                name: "node0".into(),
                ranks: vec![0],
                labels: [("k".to_string(), "v".to_string())].into(),
            }],
            tiers: vec![
                TierRow {
                    tier: "node".into(),
                    key: "(host)".into(),
                    groups: 3,
                    ranks_min: 1,
                    ranks_max: 1,
                    unknown_nodes: vec![],
                    note: Some("one rank per group: nothing to measure".into()),
                    sizes: vec![],
                    group_results: vec![],
                    threshold: None,
                    passed: None,
                    halves: Vec::new(),
                },
                TierRow {
                    tier: "local_block".into(),
                    key: "oci.oraclecloud.com/rdma.local_block_id".into(),
                    groups: 1,
                    ranks_min: 2,
                    ranks_max: 3,
                    unknown_nodes: vec!["node2".into()],
                    note: None,
                    sizes: vec![TierSize {
                        size: 1048576,
                        min: 0.0241,
                        median: 0.0245,
                        max: 0.025,
                    }],
                    group_results: vec![GroupResult {
                        domain: vec!["isl".into(), "lb1".into()],
                        nodes: vec!["node0".into(), "node1".into()],
                        ranks: 2,
                        busbw: vec![0.0241],
                    }],
                    threshold: Some(0.02),
                    passed: Some(true),
                    halves: Vec::new(),
                },
            ],
            matrix: Some(LinkMatrix {
                size: 1048576,
                rounds: 3,
                nodes: vec!["node0".into(), "node1".into(), "node2".into()],
                busbw: vec![
                    vec![None, Some(0.0125), Some(0.025)],
                    vec![Some(0.0125), None, Some(0.0124)],
                    vec![Some(0.025), Some(0.0124), None],
                ],
                links: vec![
                    link("node0", "node1", 0.0125, true),
                    link("node0", "node2", 0.025, false),
                ],
                budget: None,
            }),
            verdict: Verdict {
                passed: false,
                suspect_nodes: vec![SuspectNode {
                    node: "node1".into(),
                    slow_links: 2,
                    links: 2,
                    measured: 0.0124,
                    expected: 0.025,
                }],
                slow_links: vec![],
                failed_tiers: vec![TierFailure {
                    tier: "local_block".into(),
                    measured: 0.01,
                    threshold: 0.02,
                }],
                unknown_nodes: vec!["node2".into()],
                notes: vec![],
                stragglers: vec![],
                stragglers_allowed: false,
                unreachable_nodes: vec![],
                slow_uplinks: vec![],
            },
        }
    }

    #[test]
    fn records_summarise_the_report_for_the_exporters() {
        let factor = |n: usize| 2.0 * (n as f64 - 1.0) / n as f64;
        let r = sample();
        let (tiers, pairwise, verdict) = r.records(&factor);
        let names: Vec<&str> = tiers.tiers.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["node", "local_block"]);
        assert!(tiers.tiers[0].rows.is_empty() && tiers.tiers[0].verdict.is_none());
        let lb = &tiers.tiers[1];
        assert_eq!((lb.groups, lb.collective.as_str()), (1, "all_reduce_perf"));
        let row = lb.rows[0];
        // The slowest group has 2 ranks: factor 1, so algbw = busbw; time from the size.
        assert_eq!((row.size, row.busbw, row.algbw), (1048576, 0.0241, 0.0241));
        assert!((row.time_us - 1048576.0 / (0.0241 * 1e3)).abs() < 1e-6);
        let v = lb.verdict.as_ref().unwrap();
        assert!(
            v.pass && v.reason.contains("--min-busbw-tier local_block=0.02"),
            "{}",
            v.reason
        );
        let p = pairwise.unwrap();
        assert_eq!(p.nodes, ["node0", "node1", "node2"]);
        assert_eq!(p.slow.len(), 1);
        assert_eq!((p.slow[0].a, p.slow[0].b), (0, 1));
        assert!(
            p.slow[0].reason.contains("expected 0.02500 GB/s"),
            "{}",
            p.slow[0].reason
        );
        assert!(!verdict.pass);
        assert!(
            verdict
                .reason
                .starts_with("suspect node node1: 2 of 2 links slow"),
            "{}",
            verdict.reason
        );
        assert!(verdict
            .reason
            .contains("tier local_block below its threshold"));
        assert_eq!(r.labels()["node0"]["k"], "v");
    }

    #[test]
    fn the_text_sink_writes_the_tier_lines() {
        use crate::Sink;
        let mut t = crate::TextTable::new(Vec::new());
        t.tiers(&sample()).unwrap();
        let mut want = tier_lines(&sample()).join("\n");
        want.push('\n');
        assert_eq!(String::from_utf8(t.into_inner()).unwrap(), want);
    }

    #[test]
    fn an_unreachable_node_is_the_first_finding_and_fails_the_verdict_line() {
        let mut r = sample();
        r.verdict.unreachable_nodes.push(UnreachableNode {
            node: "node2".into(),
            reason: "rank 2 did not answer within 5 s (-T) after the whole job's sweep".into(),
        });
        let f = r.verdict.findings();
        assert_eq!(f[0].kind, FindingKind::UnreachableNode);
        assert_eq!(
            (f[0].kind.name(), f[0].subject.as_str()),
            ("unreachable_node", "node2")
        );
        assert_eq!(
            f[0].detail,
            "unreachable node node2: rank 2 did not answer within 5 s (-T) after the whole job's sweep"
        );
        // The slow node's finding keeps its own line.
        assert_eq!(f[1].kind, FindingKind::SlowNode);
        assert!(
            f[1].detail.starts_with("suspect node node1"),
            "{}",
            f[1].detail
        );
        // A report written before the field existed still reads.
        let mut v = serde_json::to_value(&r).unwrap();
        v["verdict"]
            .as_object_mut()
            .unwrap()
            .remove("unreachable_nodes");
        let back: TierReport = serde_json::from_value(v).unwrap();
        assert!(back.verdict.unreachable_nodes.is_empty());
    }

    #[test]
    fn a_slow_uplink_is_a_finding_of_its_own_before_the_nodes() {
        let mut r = sample();
        r.verdict.slow_uplinks.push(SlowUplink {
            tier: "local_block".into(),
            domain: "lb-3".into(),
            nodes: vec!["node6".into(), "node7".into()],
            links: 12,
            measured: 0.0375,
            expected: 0.125,
        });
        let f = r.verdict.findings();
        assert_eq!(
            (f[0].kind.name(), f[0].subject.as_str()),
            ("slow_uplink", "local_block lb-3")
        );
        assert_eq!(
            f[0].detail,
            "slow uplink of local_block lb-3 (2 nodes: node6, node7): 12 of 12 links leaving it slow, median 0.03750 GB/s, expected 0.1250 GB/s; links inside it are not"
        );
        assert_eq!(f[1].kind, FindingKind::SlowNode);
        let mut v = serde_json::to_value(&r).unwrap();
        v["verdict"].as_object_mut().unwrap().remove("slow_uplinks");
        let back: TierReport = serde_json::from_value(v).unwrap();
        assert!(back.verdict.slow_uplinks.is_empty());
    }

    #[test]
    fn report_round_trips_through_json() {
        let r = sample();
        let json = serde_json::to_string(&r).unwrap();
        let back: TierReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        assert!(json.contains("\"suspect_nodes\""));
    }

    #[test]
    fn device_groups_say_where_their_bytes_went() {
        let plain = tier_lines(&sample());
        assert!(!plain.iter().any(|l| l.contains("data path")), "{plain:#?}");
        let mut r = sample();
        r.data_path = Some("own engine, device buffers GPU to GPU (shm)".into());
        let lines = tier_lines(&r);
        assert_eq!(
            lines[2],
            "#   data path: own engine, device buffers GPU to GPU (shm)"
        );
        assert!(lines[3].starts_with("# tier "), "{lines:#?}");
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""data_path":"own engine"#), "{json}");
        let back: TierReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn text_lists_tiers_matrix_and_verdict() {
        let lines = tier_lines(&sample());
        assert!(lines.iter().all(|l| l.starts_with('#')), "{lines:#?}");
        let text = lines.join("\n");
        let node = lines.iter().position(|l| l.starts_with("# node ")).unwrap();
        let lb = lines
            .iter()
            .position(|l| l.starts_with("# local_block "))
            .unwrap();
        assert!(node < lb, "{text}");
        assert!(lines[node].contains("nothing to measure"), "{text}");
        assert!(
            lines[lb].contains("1048576") && lines[lb].contains("0.0245"),
            "{text}"
        );
        assert!(lines[lb].contains(" 2-3 "), "{text}");
        assert!(text.contains("unknown on node2"), "{text}");
        assert!(text.contains("# Verdict: FAIL"), "{text}");
        assert!(
            text.contains(
                "suspect node node1: 2 of 2 links slow, median 0.01240 GB/s, expected 0.02500 GB/s"
            ),
            "{text}"
        );
        assert!(
            text.contains("tier local_block below its threshold"),
            "{text}"
        );
        let m = lines.iter().find(|l| l.ends_with("  node1")).unwrap();
        assert!(m.contains("0.01250") && m.contains(" - "), "{m}");
        assert_eq!(gbs(41.234), "41.23");
        assert_eq!(gbs(0.0125), "0.01250");
    }
}
