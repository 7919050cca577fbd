//! The job's topology as every rank sees it: each rank publishes its node's labels, and all
//! derive the same nodes, tier model and tier list from what was published, so that they
//! all form the same groups without talking again.

use crate::{Error, Job, Options};
use busbw_collectives::Communicator;
use busbw_launchers::topology::{
    exchange_labels, gather, publish_labels, Labels, Meet, NodeLabels, Preset, TierModel,
};
use std::collections::BTreeSet;

/// Store key prefix of each rank's Kubernetes node name (for --label-nodes).
pub(crate) const NODE_NAME_KEY: &str = "tiers/k8s-node";

/// The nodes of the job: node index per rank, name, first rank, labels.
pub(crate) struct Nodes {
    pub of_rank: Vec<usize>,
    pub names: Vec<String>,
    pub leaders: Vec<usize>,
    pub labels: Vec<Labels>,
}

impl Nodes {
    /// `of_rank`: the communicator's node index per rank; `published`: every rank's labels.
    pub fn new(of_rank: &[usize], published: &[NodeLabels]) -> Nodes {
        let count = of_rank.iter().copied().max().map_or(0, |m| m + 1);
        let mut leaders = vec![usize::MAX; count];
        for (r, &n) in of_rank.iter().enumerate() {
            leaders[n] = leaders[n].min(r);
        }
        Nodes {
            of_rank: of_rank.to_vec(),
            names: leaders.iter().map(|&r| published[r].host.clone()).collect(),
            labels: leaders
                .iter()
                .map(|&r| published[r].labels.clone())
                .collect(),
            leaders,
        }
    }
}

/// What a tier run measures: the nodes, the preset that applies, its model and the tiers,
/// closest first, the node tier included.
pub struct Topology {
    pub(crate) nodes: Nodes,
    pub(crate) preset: Preset,
    pub(crate) model: TierModel,
    /// (name, label key) per tier, the node tier ("node", "(host)") first.
    pub(crate) tiers: Vec<(String, String)>,
}

impl Topology {
    /// Read this rank's labels, exchange everyone's, and derive the tiers. `note` hears how
    /// the labels were found (the program decides whether to show it). Fails with
    /// [`Error::NoSuchTier`] when a threshold names a tier that is not there; every rank
    /// fails alike, since all derive the same tiers.
    pub fn discover(
        job: &Job,
        comm: &Communicator,
        opts: &Options,
        note: &mut dyn FnMut(&str),
    ) -> Result<Topology, Error> {
        let (rank, size) = (comm.rank(), comm.size());
        let store = &*job.store;
        let node_name = opts
            .node_name
            .clone()
            .unwrap_or_else(|| job.hostname.clone());
        let got = match gather(&opts.sources, &opts.preset, &node_name, &|k| {
            std::env::var(k).ok()
        }) {
            Ok(g) => g,
            Err(source) => {
                // The others wait for our labels: an empty set lets them fail on their own
                // errors, not on a timeout waiting for ours.
                let none = NodeLabels {
                    host: job.hostname.clone(),
                    labels: Labels::new(),
                };
                let _ = publish_labels(store, rank, &none);
                return Err(Error::Labels {
                    node: node_name,
                    source,
                });
            }
        };
        for n in &got.notes {
            note(n);
        }
        let mine = NodeLabels {
            host: job.hostname.clone(),
            labels: got.labels,
        };
        if opts.label_nodes {
            store.set(&format!("{NODE_NAME_KEY}/{rank}"), node_name.as_bytes())?;
        }
        let published =
            exchange_labels(store, rank, size, &mine, job.timeout).map_err(Error::Exchange)?;
        let nodes = Nodes::new(comm.nodes(), &published);
        let seen: BTreeSet<String> = nodes
            .labels
            .iter()
            .flat_map(|l| l.keys().cloned())
            .collect();
        let preset = opts.preset.detect(&seen);
        let model = opts.preset.resolve(&seen).map_err(Error::Model)?;
        let tiers: Vec<(String, String)> =
            std::iter::once(("node".to_string(), "(host)".to_string()))
                .chain(model.closest_first().into_iter().map(|l| (l.name, l.key)))
                .collect();
        for (t, _) in &opts.thresholds {
            if !tiers.iter().any(|(n, k)| n == t || k == t) {
                return Err(Error::NoSuchTier {
                    tier: t.clone(),
                    tiers: tiers.iter().map(|(n, _)| n.clone()).collect(),
                });
            }
        }
        Ok(Topology {
            nodes,
            preset,
            model,
            tiers,
        })
    }

    /// The tier two nodes meet at, by name.
    pub(crate) fn link_tier(&self, a: usize, b: usize) -> String {
        let model = &self.model;
        match model.meet(&self.nodes.labels[a], &self.nodes.labels[b]) {
            Meet::Tier(t) => model.closest_first()[t].name.clone(),
            Meet::Beyond => "beyond".into(),
            Meet::Unknown => "unknown".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_named_and_labelled_after_its_first_rank() {
        let published: Vec<NodeLabels> = ["a", "b", "a-again", "b-again"]
            .iter()
            .map(|h| NodeLabels {
                host: h.to_string(),
                labels: [("rack".to_string(), h.to_string())].into(),
            })
            .collect();
        let n = Nodes::new(&[1, 0, 1, 0], &published);
        assert_eq!(n.leaders, [1, 0]);
        assert_eq!(n.names, ["b", "a"]);
        assert_eq!(n.labels[1]["rack"], "a");
    }
}
