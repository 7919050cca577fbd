//! The gate before training: after `busbw tiers`' verdict, set a label on the nodes that
//! passed and remove it from the nodes the verdict names, through the Kubernetes API (a JSON
//! merge patch on /api/v1/nodes/NAME), so that a training job's `nodeSelector` keeps off bad
//! nodes. Opt-in: it needs a ClusterRole that may patch nodes.

use super::kube_api::{ApiError, KubeApi};
use super::SourceConfig;
use serde_json::{json, Value};

/// Percent-encoding for a path segment (node names are DNS names, but be safe).
fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `KEY=VALUE` of `--label-nodes`, checked against Kubernetes' label syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLabel {
    pub key: String,
    pub value: String,
}

/// Kubernetes' "name" part of keys and values: at most 63 characters of alphanumerics and
/// `-_.`, beginning and ending with an alphanumeric.
fn label_name_ok(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn dns_subdomain_ok(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

impl std::str::FromStr for NodeLabel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (key, value) = s.split_once('=').ok_or_else(|| {
            format!("--label-nodes {s:?}: expected KEY=VALUE, e.g. my_ready=true")
        })?;
        let (prefix, name) = match key.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, key),
        };
        if !label_name_ok(name) || prefix.is_some_and(|p| !dns_subdomain_ok(p)) {
            return Err(format!(
                "--label-nodes {s:?}: {key:?} is not a label key ([prefix/]name: name up to 63 \
                 characters of letters, digits, '-', '_', '.', starting and ending with a letter \
                 or digit; prefix a DNS subdomain)"
            ));
        }
        if !value.is_empty() && !label_name_ok(value) {
            return Err(format!(
                "--label-nodes {s:?}: {value:?} is not a label value (up to 63 characters of \
                 letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
            ));
        }
        Ok(NodeLabel {
            key: key.into(),
            value: value.into(),
        })
    }
}

/// One node's change: set the label (it passed) or remove it (the verdict named it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    pub node: String,
    pub set: bool,
    /// The JSON merge patch (`application/merge-patch+json`).
    pub body: String,
}

impl Patch {
    pub fn path(&self) -> String {
        format!("/api/v1/nodes/{}", path_segment(&self.node))
    }
}

impl std::fmt::Display for Patch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PATCH {} {}", self.path(), self.body)
    }
}

pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// The patches for a verdict: `failed` nodes lose the label (also when listed in `passed`),
/// the others in `passed` get it. Sorted by node name, each node once.
pub fn patches(label: &NodeLabel, passed: &[String], failed: &[String]) -> Vec<Patch> {
    let failed: std::collections::BTreeSet<&String> = failed.iter().collect();
    let mut all: std::collections::BTreeMap<&String, bool> = std::collections::BTreeMap::new();
    for n in passed {
        all.insert(n, true);
    }
    for n in &failed {
        all.insert(n, false);
    }
    all.into_iter()
        .map(|(node, set)| {
            let v = if set {
                Value::String(label.value.clone())
            } else {
                Value::Null
            };
            let body = json!({ "metadata": { "labels": { label.key.clone(): v } } });
            Patch {
                node: node.clone(),
                set,
                body: body.to_string(),
            }
        })
        .collect()
}

/// Send the patches. Every node is tried (a missing node does not stop the others) except
/// after a failure to authenticate or to be authorized, which would repeat for every node.
/// Returns one line per node done; the error lists every node not done and why.
pub fn apply(
    cfg: &SourceConfig,
    patches: &[Patch],
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, String> {
    let api = KubeApi::connect(cfg, lookup)?;
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for p in patches {
        let what = format!("patch nodes/{}", p.node);
        let body: Value = serde_json::from_str(&p.body).map_err(|e| format!("{what}: {e}"))?;
        let verb = if p.set { "labelled" } else { "unlabelled" };
        match api.patch_node(&p.node, &body) {
            Ok(()) => done.push(format!("{verb} node {}", p.node)),
            Err(e) => {
                let stop = matches!(
                    e,
                    ApiError::Status {
                        code: 401 | 403,
                        ..
                    }
                );
                failed.push(api.explain_node(&what, &p.node, &e, true));
                if stop {
                    break;
                }
            }
        }
    }
    if failed.is_empty() {
        Ok(done)
    } else {
        let left = patches.len() - done.len();
        Err(format!(
            "{left} of {} node label patches not applied: {}",
            patches.len(),
            failed.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_syntax() {
        let l: NodeLabel = "busbw.dev/fabric-ok=true".parse().unwrap();
        assert_eq!(
            (l.key.as_str(), l.value.as_str()),
            ("busbw.dev/fabric-ok", "true")
        );
        assert!(
            "my_ready=".parse::<NodeLabel>().is_ok(),
            "empty values are values"
        );
        for bad in [
            "novalue",
            "=x",
            "-a=b",
            "a=b c",
            "UPPER.Prefix/x=1",
            "k=-v",
            &format!("k={}", "x".repeat(64)),
        ] {
            assert!(bad.parse::<NodeLabel>().is_err(), "{bad}");
        }
    }

    #[test]
    fn named_nodes_lose_the_label_even_when_they_passed_too() {
        let l: NodeLabel = "my_ready=true".parse().unwrap();
        let p = patches(
            &l,
            &["b".into(), "a".into(), "c".into()],
            &["c".into(), "d".into()],
        );
        let got: Vec<(String, bool, String)> = p
            .iter()
            .map(|p| (p.node.clone(), p.set, p.body.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "a".into(),
                    true,
                    r#"{"metadata":{"labels":{"my_ready":"true"}}}"#.into()
                ),
                (
                    "b".into(),
                    true,
                    r#"{"metadata":{"labels":{"my_ready":"true"}}}"#.into()
                ),
                (
                    "c".into(),
                    false,
                    r#"{"metadata":{"labels":{"my_ready":null}}}"#.into()
                ),
                (
                    "d".into(),
                    false,
                    r#"{"metadata":{"labels":{"my_ready":null}}}"#.into()
                ),
            ]
        );
        assert_eq!(
            p[2].to_string(),
            r#"PATCH /api/v1/nodes/c {"metadata":{"labels":{"my_ready":null}}}"#
        );
    }
}
