//! The tier model: which node labels describe the fabric, in which order, and what a node's
//! domain at each tier is.
//!
//! Conventions disagree on numbering (Volcano and topograph count up from the closest switch,
//! AWS counts down from the top, Kueue lists levels outermost first), so the model is always
//! built from keys listed outermost first and then read closest first. A domain is the *path*
//! of values from the outermost level down: Kueue allows `rack-1` under two blocks, and those
//! are two racks. Placeholder values (the OCI labeler writes `no-imds-data` when instance
//! metadata has no topology) make a domain unknown rather than one big fake domain.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A node's labels, key -> value.
pub type Labels = BTreeMap<String, String>;

/// Values that mean "no data" rather than a domain name.
pub const PLACEHOLDERS: &[&str] = &["", "no-imds-data", "unknown", "none", "null", "n/a", "-"];

/// Whether `value` is a placeholder (compared case-insensitively, surrounding blanks ignored).
pub fn is_placeholder(value: &str) -> bool {
    let v = value.trim();
    PLACEHOLDERS.iter().any(|p| p.eq_ignore_ascii_case(v))
}

/// One level of the model: the label key and the short name reports use for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Level {
    pub name: String,
    pub key: String,
}

/// A node's domain at one tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Domain {
    /// Values from the outermost level down to this one.
    Known(Vec<String>),
    /// A label on the path is missing or a placeholder; `value` is what was found.
    Unknown { key: String, value: Option<String> },
}

/// Where two nodes meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meet {
    /// They share the domain of this tier (closest first) and no closer one.
    Tier(usize),
    /// They are in different domains of the outermost tier.
    Beyond,
    /// A label they would be told apart by is unknown on one of them.
    Unknown,
}

/// Ordered label keys. Index 0 of [`TierModel::closest_first`] is the closest tier.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TierModel {
    outer_first: Vec<Level>,
}

/// The short name of a key: what follows the last '/' (`oci.oraclecloud.com/rdma.local_block_id`
/// -> `rdma.local_block_id`), without an `rdma.` prefix or `_id` suffix.
pub fn short_name(key: &str) -> String {
    let tail = key.rsplit('/').next().unwrap_or(key);
    let tail = tail.strip_prefix("rdma.").unwrap_or(tail);
    let tail = tail.strip_suffix("_id").unwrap_or(tail);
    let tail = tail.strip_prefix("gce-topology-").unwrap_or(tail);
    if tail.is_empty() {
        key.to_string()
    } else {
        tail.to_string()
    }
}

impl TierModel {
    /// A model from levels listed outermost first. Keys must be distinct and non-empty.
    pub fn new(outer_first: Vec<Level>) -> Result<Self, String> {
        for (i, l) in outer_first.iter().enumerate() {
            if l.key.trim().is_empty() {
                return Err("an empty label key cannot name a topology level".into());
            }
            if outer_first[..i].iter().any(|m| m.key == l.key) {
                return Err(format!("label key {} is listed twice", l.key));
            }
        }
        Ok(Self { outer_first })
    }

    /// A model from keys listed outermost first, named by [`short_name`].
    pub fn from_keys<S: AsRef<str>>(keys: &[S]) -> Result<Self, String> {
        Self::new(
            keys.iter()
                .map(|k| Level {
                    name: short_name(k.as_ref()),
                    key: k.as_ref().to_string(),
                })
                .collect(),
        )
    }

    pub fn outermost_first(&self) -> &[Level] {
        &self.outer_first
    }

    /// The levels closest first: what reports and tier numbers use.
    pub fn closest_first(&self) -> Vec<Level> {
        self.outer_first.iter().rev().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.outer_first.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outer_first.is_empty()
    }

    /// The domain of a node with `labels` at tier `tier` (closest first).
    pub fn domain(&self, labels: &Labels, tier: usize) -> Domain {
        let Some(outer) = self.outer_first.len().checked_sub(tier + 1) else {
            return Domain::Unknown {
                key: format!("tier {tier}"),
                value: None,
            };
        };
        let mut path = Vec::with_capacity(outer + 1);
        for l in &self.outer_first[..=outer] {
            match labels.get(&l.key) {
                Some(v) if !is_placeholder(v) => path.push(v.trim().to_string()),
                other => {
                    return Domain::Unknown {
                        key: l.key.clone(),
                        value: other.cloned(),
                    }
                }
            }
        }
        Domain::Known(path)
    }

    /// The closest tier whose domain two nodes share.
    pub fn meet(&self, a: &Labels, b: &Labels) -> Meet {
        for t in 0..self.len() {
            match (self.domain(a, t), self.domain(b, t)) {
                (Domain::Known(x), Domain::Known(y)) if x == y => return Meet::Tier(t),
                (Domain::Known(_), Domain::Known(_)) => {}
                // A closer tier might still be shared once the label is known; and an unknown
                // outer value means even "different" cannot be told.
                _ => return Meet::Unknown,
            }
        }
        Meet::Beyond
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn model() -> TierModel {
        TierModel::from_keys(&["block", "rack"]).unwrap()
    }

    #[test]
    fn closest_first_reverses_outermost_first() {
        let m = TierModel::from_keys(&["a/island", "a/block", "a/rack"]).unwrap();
        let names: Vec<String> = m.closest_first().into_iter().map(|l| l.name).collect();
        assert_eq!(names, ["rack", "block", "island"]);
        assert!(TierModel::from_keys(&["x", "x"])
            .unwrap_err()
            .contains("twice"));
        assert!(TierModel::from_keys(&["x", " "]).is_err());
    }

    #[test]
    fn a_domain_is_the_path_of_values() {
        let m = model();
        // rack-1 under two blocks: two racks.
        let a = labels(&[("block", "b1"), ("rack", "rack-1")]);
        let b = labels(&[("block", "b2"), ("rack", "rack-1")]);
        assert_ne!(m.domain(&a, 0), m.domain(&b, 0));
        assert_eq!(
            m.domain(&a, 0),
            Domain::Known(vec!["b1".into(), "rack-1".into()])
        );
        assert_eq!(m.domain(&a, 1), Domain::Known(vec!["b1".into()]));
        assert_eq!(m.meet(&a, &b), Meet::Beyond);
        let c = labels(&[("block", "b1"), ("rack", "rack-2")]);
        assert_eq!(m.meet(&a, &c), Meet::Tier(1));
        assert_eq!(m.meet(&a, &a.clone()), Meet::Tier(0));
    }

    #[test]
    fn placeholders_and_missing_labels_are_unknown() {
        let m = model();
        for v in ["no-imds-data", "", "  ", "UNKNOWN", "null"] {
            assert!(is_placeholder(v), "{v:?}");
            let a = labels(&[("block", "b1"), ("rack", v)]);
            assert_eq!(
                m.domain(&a, 0),
                Domain::Unknown {
                    key: "rack".into(),
                    value: Some(v.into())
                }
            );
            // The block is still known.
            assert_eq!(m.domain(&a, 1), Domain::Known(vec!["b1".into()]));
        }
        assert!(!is_placeholder("rack-1"));
        // An unknown outer level makes the inner path unknown too.
        let a = labels(&[("rack", "r1")]);
        assert_eq!(
            m.domain(&a, 0),
            Domain::Unknown {
                key: "block".into(),
                value: None
            }
        );
        let b = labels(&[("block", "b1"), ("rack", "r1")]);
        assert_eq!(m.meet(&a, &b), Meet::Unknown);
    }

    #[test]
    fn short_names() {
        assert_eq!(
            short_name("oci.oraclecloud.com/rdma.local_block_id"),
            "local_block"
        );
        assert_eq!(
            short_name("cloud.google.com/gce-topology-subblock"),
            "subblock"
        );
        assert_eq!(
            short_name("topology.k8s.aws/network-node-layer-2"),
            "network-node-layer-2"
        );
        assert_eq!(short_name("rack"), "rack");
    }
}
