//! Network topology: the tier model, the label conventions (presets), where a rank's labels
//! come from (sources), and their exchange at rendezvous.

pub mod hypernodes;
mod kube_api;
pub mod model;
pub mod node_labels;
pub mod presets;
pub mod sources;

pub use model::{is_placeholder, short_name, Domain, Labels, Level, Meet, TierModel};
pub use presets::Preset;
pub use sources::{gather, Gathered, Source, SourceConfig, SourceError};

use std::time::Duration;

use crate::rendezvous::never_registered;
use crate::store::{Store, StoreError};

/// Store key prefix under which every rank publishes its labels (`topology/<rank>`).
pub const LABELS_KEY: &str = "topology";

/// What a rank publishes: its host and its node's labels.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeLabels {
    pub host: String,
    pub labels: Labels,
}

/// Publish this rank's labels without waiting for the others: what a rank whose sources
/// failed still does, so the others get past the exchange and hear of its failure through
/// the job's abort instead of timing out on its missing labels.
pub fn publish_labels(store: &dyn Store, rank: usize, mine: &NodeLabels) -> Result<(), StoreError> {
    let json = serde_json::to_vec(mine)
        .map_err(|e| StoreError::Protocol(format!("encoding labels: {e}")))?;
    store.set(&format!("{LABELS_KEY}/{rank}"), &json)
}

/// Publish this rank's labels, then wait for every rank's: every rank gets the same list, in
/// rank order, so all of them derive the same groups.
pub fn exchange_labels(
    store: &dyn Store,
    rank: usize,
    size: usize,
    mine: &NodeLabels,
    timeout: Duration,
) -> Result<Vec<NodeLabels>, StoreError> {
    publish_labels(store, rank, mine)?;
    let keys: Vec<String> = (0..size).map(|r| format!("{LABELS_KEY}/{r}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values = store.wait(&refs, timeout).map_err(|e| match e {
        StoreError::Timeout { secs, missing } => {
            let who = never_registered(&missing, LABELS_KEY).unwrap_or_default();
            StoreError::Timeout {
                secs,
                missing: vec![format!(
                    "{} ({who} its topology labels)",
                    missing.join(", ")
                )],
            }
        }
        e => e,
    })?;
    values
        .iter()
        .enumerate()
        .map(|(r, v)| {
            serde_json::from_slice(v).map_err(|e| {
                StoreError::Protocol(format!("rank {r} published malformed labels: {e}"))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use std::sync::Arc;

    #[test]
    fn every_rank_sees_every_ranks_labels() {
        let store = Arc::new(MemoryStore::new());
        let threads: Vec<_> = (0..3)
            .map(|r| {
                let s = store.clone();
                std::thread::spawn(move || {
                    let mut labels = Labels::new();
                    labels.insert("rack".into(), format!("r{}", r / 2));
                    let host = format!("h{r}");
                    let mine = NodeLabels { host, labels };
                    exchange_labels(&*s, r, 3, &mine, Duration::from_secs(5)).unwrap()
                })
            })
            .collect();
        for t in threads {
            let all = t.join().unwrap();
            let racks: Vec<&str> = all.iter().map(|n| n.labels["rack"].as_str()).collect();
            assert_eq!(racks, ["r0", "r0", "r1"]);
            assert_eq!(all[2].host, "h2");
        }
        // A rank that never publishes is named.
        let lone = MemoryStore::new();
        let mine = NodeLabels {
            host: "h0".into(),
            labels: Labels::new(),
        };
        let e = exchange_labels(&lone, 0, 2, &mine, Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("rank 1 never registered"), "{e}");
    }
}
