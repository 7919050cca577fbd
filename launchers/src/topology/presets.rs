//! The label conventions in use, as presets of the tier model (see docs/tiers.md for sources).

use std::collections::BTreeSet;
use std::str::FromStr;

use super::hypernodes::HYPERNODE_TIER_PREFIX;
use super::model::{short_name, Level, TierModel};

pub const OCI_ISLAND: &str = "oci.oraclecloud.com/rdma.hpc_island_id";
pub const OCI_NETWORK_BLOCK: &str = "oci.oraclecloud.com/rdma.network_block_id";
pub const OCI_LOCAL_BLOCK: &str = "oci.oraclecloud.com/rdma.local_block_id";
pub const OCI_HOST: &str = "oci.oraclecloud.com/rdma.host_id";
pub const OCI_GPU_MEMORY_FABRIC: &str = "oci.oraclecloud.com/host.gpu_memory_fabric_id";
pub const GKE_BLOCK: &str = "cloud.google.com/gce-topology-block";
pub const GKE_SUBBLOCK: &str = "cloud.google.com/gce-topology-subblock";
pub const GKE_HOST: &str = "cloud.google.com/gce-topology-host";
/// `topology.k8s.aws/network-node-layer-N`: 1 is the top of the network, N grows downwards.
pub const AWS_LAYER_PREFIX: &str = "topology.k8s.aws/network-node-layer-";
/// `fabric.topograph.run/tier-N` (topograph >= 1.0): 0 is the switch closest to the node.
pub const TOPOGRAPH_TIER_PREFIX: &str = "fabric.topograph.run/tier-";
pub const TOPOGRAPH_ACCELERATOR: &str = "accelerator.topograph.run/domain";
/// Topograph <= 0.5, outermost first (`block`/`datacenter` were the v0.1 names).
pub const TOPOGRAPH_V0: &[&str] = &[
    "network.topology.nvidia.com/datacenter",
    "network.topology.nvidia.com/core",
    "network.topology.nvidia.com/spine",
    "network.topology.nvidia.com/block",
    "network.topology.nvidia.com/leaf",
    "network.topology.nvidia.com/accelerator",
];
/// The labels of Volcano's HyperNode examples, outermost first (tier 1 = `tor`).
pub const VOLCANO: &[&str] = &[
    "volcano.sh/hypercluster",
    "volcano.sh/hypernode",
    "volcano.sh/tor",
];

/// `--topology-preset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Preset {
    /// The first of oci, gke, aws, topograph, volcano whose labels the nodes carry.
    Auto,
    Oci,
    Gke,
    Aws,
    Topograph,
    Volcano,
    /// `--topology-keys`, outermost first.
    Custom(Vec<String>),
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Preset::Auto,
            "oci" => Preset::Oci,
            "gke" => Preset::Gke,
            "aws" => Preset::Aws,
            "topograph" => Preset::Topograph,
            "volcano" => Preset::Volcano,
            "custom" => Preset::Custom(Vec::new()),
            _ => {
                return Err(format!(
                    "unknown topology preset '{s}': expected auto, oci, gke, aws, topograph, \
                     volcano or custom (with --topology-keys)"
                ))
            }
        })
    }
}

/// `N` of `<prefix>N` keys among `seen`, with the key.
fn numbered<'a>(seen: &'a BTreeSet<String>, prefix: &str) -> Vec<(u32, &'a str)> {
    let mut v: Vec<(u32, &str)> = seen
        .iter()
        .filter_map(|k| {
            let n = k.strip_prefix(prefix)?;
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((n.parse().ok()?, k.as_str()))
        })
        .collect();
    v.sort();
    v
}

fn levels(pairs: &[(&str, &str)]) -> Vec<Level> {
    pairs
        .iter()
        .map(|(name, key)| Level {
            name: name.to_string(),
            key: key.to_string(),
        })
        .collect()
}

/// The conventions `auto` tries, in this order.
fn conventions() -> [Preset; 5] {
    [
        Preset::Oci,
        Preset::Gke,
        Preset::Aws,
        Preset::Topograph,
        Preset::Volcano,
    ]
}

impl Preset {
    pub fn name(&self) -> &'static str {
        match self {
            Preset::Auto => "auto",
            Preset::Oci => "oci",
            Preset::Gke => "gke",
            Preset::Aws => "aws",
            Preset::Topograph => "topograph",
            Preset::Volcano => "volcano",
            Preset::Custom(_) => "custom",
        }
    }

    /// Every key this preset can use whatever labels are present: what the per-key environment
    /// variables are looked up for. The numbered families are listed up to 16 levels.
    pub fn candidate_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        let mut add = |k: &str| keys.push(k.to_string());
        match self {
            Preset::Oci => [OCI_ISLAND, OCI_NETWORK_BLOCK, OCI_LOCAL_BLOCK, OCI_HOST]
                .iter()
                .for_each(|k| add(k)),
            Preset::Gke => [GKE_BLOCK, GKE_SUBBLOCK, GKE_HOST]
                .iter()
                .for_each(|k| add(k)),
            Preset::Aws => (1..=16).for_each(|n| add(&format!("{AWS_LAYER_PREFIX}{n}"))),
            Preset::Topograph => {
                (0..16).for_each(|n| add(&format!("{TOPOGRAPH_TIER_PREFIX}{n}")));
                add(TOPOGRAPH_ACCELERATOR);
                TOPOGRAPH_V0.iter().for_each(|k| add(k));
            }
            Preset::Volcano => {
                (1..=16).for_each(|n| add(&format!("{HYPERNODE_TIER_PREFIX}{n}")));
                VOLCANO.iter().for_each(|k| add(k));
            }
            Preset::Custom(k) => k.iter().for_each(|k| add(k)),
            Preset::Auto => {
                for p in conventions() {
                    keys.extend(p.candidate_keys());
                }
            }
        }
        keys
    }

    /// The model for nodes whose labels have the keys in `seen` (the union over all nodes).
    /// Fixed presets ignore `seen`; the numbered families (AWS, topograph) take the levels
    /// that exist, since their depth varies by instance type and fabric.
    pub fn resolve(&self, seen: &BTreeSet<String>) -> Result<TierModel, String> {
        match self {
            Preset::Oci => TierModel::new(levels(&[
                ("hpc_island", OCI_ISLAND),
                ("network_block", OCI_NETWORK_BLOCK),
                ("local_block", OCI_LOCAL_BLOCK),
                ("host", OCI_HOST),
            ])),
            Preset::Gke => TierModel::new(levels(&[
                ("block", GKE_BLOCK),
                ("subblock", GKE_SUBBLOCK),
                ("host", GKE_HOST),
            ])),
            // Layer 1 is the top: ascending N is outermost first.
            Preset::Aws => TierModel::new(
                numbered(seen, AWS_LAYER_PREFIX)
                    .into_iter()
                    .map(|(n, k)| Level {
                        name: format!("layer-{n}"),
                        key: k.to_string(),
                    })
                    .collect(),
            ),
            Preset::Topograph => {
                // tier-0 is the closest switch: descending N is outermost first.
                let mut v: Vec<Level> = numbered(seen, TOPOGRAPH_TIER_PREFIX)
                    .into_iter()
                    .rev()
                    .map(|(n, k)| Level {
                        name: format!("tier-{n}"),
                        key: k.to_string(),
                    })
                    .collect();
                if v.is_empty() {
                    v = TOPOGRAPH_V0
                        .iter()
                        .filter(|k| seen.contains(**k) && !k.ends_with("/accelerator"))
                        .map(|k| Level {
                            name: short_name(k),
                            key: k.to_string(),
                        })
                        .collect();
                }
                // The NVLink domain sits below the closest switch.
                for k in [
                    TOPOGRAPH_ACCELERATOR,
                    "network.topology.nvidia.com/accelerator",
                ] {
                    if seen.contains(k) {
                        v.push(Level {
                            name: "nvlink".into(),
                            key: k.into(),
                        });
                        break;
                    }
                }
                TierModel::new(v)
            }
            // HyperNode tiers (1 = closest): descending N is outermost first; without
            // HyperNodes, the labels of Volcano's examples.
            Preset::Volcano => {
                let v: Vec<Level> = numbered(seen, HYPERNODE_TIER_PREFIX)
                    .into_iter()
                    .rev()
                    .map(|(n, k)| Level {
                        name: format!("hypernode-tier-{n}"),
                        key: k.to_string(),
                    })
                    .collect();
                if v.is_empty() {
                    TierModel::from_keys(VOLCANO)
                } else {
                    TierModel::new(v)
                }
            }
            Preset::Custom(keys) if keys.is_empty() => Err(
                "--topology-preset custom needs --topology-keys k1,k2,... (outermost first)".into(),
            ),
            Preset::Custom(keys) => TierModel::from_keys(keys),
            Preset::Auto => {
                for p in conventions() {
                    let m = p.resolve(seen)?;
                    if m.outermost_first().iter().any(|l| seen.contains(&l.key)) {
                        return Ok(m);
                    }
                }
                Ok(TierModel::default())
            }
        }
    }

    /// The preset `auto` settles on for `seen` (itself for the others).
    pub fn detect(&self, seen: &BTreeSet<String>) -> Preset {
        if *self != Preset::Auto {
            return self.clone();
        }
        for p in conventions() {
            if p.candidate_keys().iter().any(|k| seen.contains(k)) {
                return p;
            }
        }
        Preset::Auto
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::model::{Domain, Labels, Meet};

    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn keys_closest_first(m: &TierModel) -> Vec<String> {
        m.closest_first().into_iter().map(|l| l.key).collect()
    }

    #[test]
    fn oci_keys_closest_first() {
        let m = Preset::Oci.resolve(&BTreeSet::new()).unwrap();
        assert_eq!(
            keys_closest_first(&m),
            [OCI_HOST, OCI_LOCAL_BLOCK, OCI_NETWORK_BLOCK, OCI_ISLAND]
        );
        let names: Vec<String> = m.closest_first().into_iter().map(|l| l.name).collect();
        assert_eq!(
            names,
            ["host", "local_block", "network_block", "hpc_island"]
        );
        // The labeler's placeholder.
        let a = labels(&[
            (OCI_ISLAND, "isl"),
            (OCI_NETWORK_BLOCK, "no-imds-data"),
            (OCI_LOCAL_BLOCK, "lb"),
        ]);
        assert!(matches!(m.domain(&a, 1), Domain::Unknown { .. }));
        assert_eq!(m.domain(&a, 3), Domain::Known(vec!["isl".into()]));
    }

    #[test]
    fn gke_keys_closest_first() {
        let m = Preset::Gke.resolve(&BTreeSet::new()).unwrap();
        assert_eq!(keys_closest_first(&m), [GKE_HOST, GKE_SUBBLOCK, GKE_BLOCK]);
    }

    #[test]
    fn aws_numbering_runs_top_down() {
        let seen = set(&[
            "topology.k8s.aws/network-node-layer-3",
            "topology.k8s.aws/network-node-layer-1",
            "topology.k8s.aws/network-node-layer-2",
            "topology.k8s.aws/zone-id",
            "topology.k8s.aws/network-node-layer-x",
        ]);
        let m = Preset::Aws.resolve(&seen).unwrap();
        // Layer 3 (bottom) is the closest tier, layer 1 (top) the outermost.
        assert_eq!(
            keys_closest_first(&m),
            [
                "topology.k8s.aws/network-node-layer-3",
                "topology.k8s.aws/network-node-layer-2",
                "topology.k8s.aws/network-node-layer-1"
            ]
        );
        // The same layer-3 switch name under two layer-2 parents: different domains.
        let l = |a: &str, b: &str, c: &str| {
            labels(&[
                ("topology.k8s.aws/network-node-layer-1", a),
                ("topology.k8s.aws/network-node-layer-2", b),
                ("topology.k8s.aws/network-node-layer-3", c),
            ])
        };
        let x = l("nn-top", "nn-mid-a", "nn-leaf-1");
        let y = l("nn-top", "nn-mid-b", "nn-leaf-1");
        assert_ne!(m.domain(&x, 0), m.domain(&y, 0));
        assert_eq!(m.meet(&x, &y), Meet::Tier(2));
        assert_eq!(
            m.meet(&x, &l("nn-top", "nn-mid-a", "nn-leaf-9")),
            Meet::Tier(1)
        );
        // A 4-layer instance type: layer 4 becomes the closest.
        let mut seen4 = seen.clone();
        seen4.insert("topology.k8s.aws/network-node-layer-4".into());
        let m4 = Preset::Aws.resolve(&seen4).unwrap();
        assert_eq!(m4.closest_first()[0].name, "layer-4");
    }

    #[test]
    fn topograph_counts_up_from_the_node() {
        let seen = set(&[
            "fabric.topograph.run/tier-0",
            "fabric.topograph.run/tier-2",
            "fabric.topograph.run/tier-1",
            TOPOGRAPH_ACCELERATOR,
        ]);
        let m = Preset::Topograph.resolve(&seen).unwrap();
        let names: Vec<String> = m.closest_first().into_iter().map(|l| l.name).collect();
        assert_eq!(names, ["nvlink", "tier-0", "tier-1", "tier-2"]);
        // The older names when the new ones are absent.
        let old = set(&[
            "network.topology.nvidia.com/leaf",
            "network.topology.nvidia.com/spine",
            "network.topology.nvidia.com/core",
        ]);
        let m = Preset::Topograph.resolve(&old).unwrap();
        assert_eq!(
            keys_closest_first(&m),
            [
                "network.topology.nvidia.com/leaf",
                "network.topology.nvidia.com/spine",
                "network.topology.nvidia.com/core"
            ]
        );
    }

    #[test]
    fn volcano_and_custom() {
        let m = Preset::Volcano.resolve(&BTreeSet::new()).unwrap();
        assert_eq!(m.closest_first()[0].key, "volcano.sh/tor");
        assert_eq!(m.len(), 3);
        // HyperNode tiers count up from the nodes.
        let seen = set(&["topology.volcano.sh/tier-2", "topology.volcano.sh/tier-1"]);
        let m = Preset::Volcano.resolve(&seen).unwrap();
        assert_eq!(
            keys_closest_first(&m),
            ["topology.volcano.sh/tier-1", "topology.volcano.sh/tier-2"]
        );
        assert_eq!(m.closest_first()[1].name, "hypernode-tier-2");
        let c = Preset::Custom(vec!["dc".into(), "example.com/rack".into()]);
        let m = c.resolve(&BTreeSet::new()).unwrap();
        assert_eq!(keys_closest_first(&m), ["example.com/rack", "dc"]);
        assert!(Preset::Custom(vec![])
            .resolve(&BTreeSet::new())
            .unwrap_err()
            .contains("--topology-keys"));
        assert!("bogus".parse::<Preset>().unwrap_err().contains("bogus"));
        assert_eq!("GKE".parse::<Preset>(), Ok(Preset::Gke));
    }

    #[test]
    fn auto_picks_the_convention_present() {
        let seen = set(&[GKE_BLOCK, GKE_SUBBLOCK, "kubernetes.io/hostname"]);
        assert_eq!(Preset::Auto.detect(&seen), Preset::Gke);
        let m = Preset::Auto.resolve(&seen).unwrap();
        assert_eq!(m.outermost_first()[0].key, GKE_BLOCK);
        let seen = set(&["topology.k8s.aws/network-node-layer-1"]);
        assert_eq!(Preset::Auto.detect(&seen), Preset::Aws);
        assert!(Preset::Auto.resolve(&set(&["x"])).unwrap().is_empty());
        assert!(Preset::Auto
            .candidate_keys()
            .contains(&OCI_LOCAL_BLOCK.to_string()));
    }
}
