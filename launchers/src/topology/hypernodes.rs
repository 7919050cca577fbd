//! Volcano HyperNodes as tier labels. HyperNodes are objects, not node labels: a tier-1
//! HyperNode lists Nodes (by name, name pattern or label selector), a tier-2 one lists tier-1
//! HyperNodes, and so on. From `kubectl get hypernodes -o json` this computes, for one node,
//! the HyperNode that holds it at each tier, as `topology.volcano.sh/tier-N = <name>` labels
//! that the `volcano` preset reads (tier 1 closest, as Volcano numbers them).

use regex::Regex;
use serde_json::Value;

use super::model::Labels;

/// Label key prefix of the computed labels.
pub const HYPERNODE_TIER_PREFIX: &str = "topology.volcano.sh/tier-";

struct HyperNode {
    name: String,
    tier: i64,
    members: Vec<Value>,
}

/// Whether `doc` is a list of HyperNodes (so the file source hands it here).
pub fn is_hypernode_list(doc: &Value) -> bool {
    doc.get("items")
        .and_then(Value::as_array)
        .is_some_and(|items| {
            !items.is_empty()
                && items
                    .iter()
                    .all(|i| i.get("kind").and_then(Value::as_str) == Some("HyperNode"))
        })
}

fn parse(doc: &Value) -> Result<Vec<HyperNode>, String> {
    let items = doc
        .get("items")
        .and_then(Value::as_array)
        .ok_or("a HyperNode list has no items")?;
    items
        .iter()
        .map(|h| {
            let name = h
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .ok_or("a HyperNode without metadata.name")?
                .to_string();
            let tier = h
                .pointer("/spec/tier")
                .and_then(Value::as_i64)
                .ok_or_else(|| format!("HyperNode {name} has no spec.tier"))?;
            let members = h
                .pointer("/spec/members")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            Ok(HyperNode {
                name,
                tier,
                members,
            })
        })
        .collect()
}

/// `matchLabels` and `matchExpressions` of a Kubernetes LabelSelector against `labels`.
fn label_selector_matches(sel: &Value, labels: &Labels) -> Result<bool, String> {
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            if labels.get(k).map(String::as_str) != v.as_str() {
                return Ok(false);
            }
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let have = labels.get(key).map(String::as_str);
        let ok = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => have.is_some_and(|v| values.contains(&v)),
            "NotIn" => !have.is_some_and(|v| values.contains(&v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            op => {
                return Err(format!(
                    "label selector operator {op:?} is not one of In, NotIn, Exists, DoesNotExist"
                ))
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether member `m` of type `kind` selects `name` (with `labels`, for Node members).
fn member_selects(m: &Value, kind: &str, name: &str, labels: &Labels) -> Result<bool, String> {
    if m.get("type").and_then(Value::as_str) != Some(kind) {
        return Ok(false);
    }
    let Some(sel) = m.get("selector") else {
        return Ok(false);
    };
    if let Some(n) = sel.pointer("/exactMatch/name").and_then(Value::as_str) {
        return Ok(n == name);
    }
    if let Some(p) = sel.pointer("/regexMatch/pattern").and_then(Value::as_str) {
        let re = Regex::new(p).map_err(|e| format!("regexMatch pattern {p:?}: {e}"))?;
        return Ok(re.is_match(name));
    }
    if let Some(l) = sel.get("labelMatch") {
        return if kind == "Node" {
            label_selector_matches(l, labels)
        } else {
            Ok(false)
        };
    }
    Ok(false)
}

/// The HyperNode holding `node` at each tier, as labels; notes for what was odd.
pub fn node_tiers(
    doc: &Value,
    node: &str,
    labels: &Labels,
) -> Result<(Labels, Vec<String>), String> {
    let hns = parse(doc)?;
    let mut out = Labels::new();
    let mut notes = Vec::new();
    let mut add = |tier: i64, name: &str, out: &mut Labels| {
        let key = format!("{HYPERNODE_TIER_PREFIX}{tier}");
        match out.get(&key) {
            Some(old) if old != name => notes.push(format!(
                "{node} is in two tier-{tier} HyperNodes ({old}, {name}); using {old}"
            )),
            Some(_) => {}
            None => {
                out.insert(key, name.to_string());
            }
        }
    };
    let mut frontier: Vec<String> = Vec::new();
    for h in &hns {
        for m in &h.members {
            if member_selects(m, "Node", node, labels)? {
                add(h.tier, &h.name, &mut out);
                frontier.push(h.name.clone());
                break;
            }
        }
    }
    // Up the tree: HyperNodes whose members select a HyperNode already found.
    let mut seen: Vec<String> = frontier.clone();
    while let Some(child) = frontier.pop() {
        for h in &hns {
            if seen.contains(&h.name) {
                continue;
            }
            for m in &h.members {
                if member_selects(m, "HyperNode", &child, labels)? {
                    add(h.tier, &h.name, &mut out);
                    seen.push(h.name.clone());
                    frontier.push(h.name.clone());
                    break;
                }
            }
        }
    }
    Ok((out, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"kind": "HyperNode", "metadata": {"name": "leaf-a"}, "spec": {"tier": 1, "members": [
                {"type": "Node", "selector": {"regexMatch": {"pattern": "^gpu-a-[0-9]+$"}}}]}},
            {"kind": "HyperNode", "metadata": {"name": "leaf-b"}, "spec": {"tier": 1, "members": [
                {"type": "Node", "selector": {"exactMatch": {"name": "gpu-b-0"}}},
                {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "b"},
                    "matchExpressions": [{"key": "bad", "operator": "DoesNotExist"}]}}}]}},
            {"kind": "HyperNode", "metadata": {"name": "spine-0"}, "spec": {"tier": 2, "members": [
                {"type": "HyperNode", "selector": {"exactMatch": {"name": "leaf-a"}}},
                {"type": "HyperNode", "selector": {"regexMatch": {"pattern": "^leaf-b$"}}}]}},
            {"kind": "HyperNode", "metadata": {"name": "core"}, "spec": {"tier": 3, "members": [
                {"type": "HyperNode", "selector": {"exactMatch": {"name": "spine-0"}}}]}}
        ]})
    }

    #[test]
    fn a_node_gets_its_hypernode_at_every_tier() {
        let d = doc();
        assert!(is_hypernode_list(&d));
        let (l, notes) = node_tiers(&d, "gpu-a-12", &Labels::new()).unwrap();
        assert_eq!(l["topology.volcano.sh/tier-1"], "leaf-a");
        assert_eq!(l["topology.volcano.sh/tier-2"], "spine-0");
        assert_eq!(l["topology.volcano.sh/tier-3"], "core");
        assert!(notes.is_empty());
        // By label selector.
        let labels: Labels = [("rack".to_string(), "b".to_string())].into();
        let (l, _) = node_tiers(&d, "gpu-x", &labels).unwrap();
        assert_eq!(l["topology.volcano.sh/tier-1"], "leaf-b");
        assert_eq!(l["topology.volcano.sh/tier-3"], "core");
        let mut bad = labels.clone();
        bad.insert("bad".into(), "1".into());
        assert!(node_tiers(&d, "gpu-x", &bad).unwrap().0.is_empty());
        // In no HyperNode: no labels, hence unknown.
        assert!(node_tiers(&d, "cpu-0", &Labels::new())
            .unwrap()
            .0
            .is_empty());
        let broken = serde_json::json!({"items": [{"kind": "HyperNode", "metadata": {"name": "x"},
            "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"regexMatch": {"pattern": "("}}}]}}]});
        assert!(node_tiers(&broken, "n", &Labels::new())
            .unwrap_err()
            .contains("pattern"));
        assert!(!is_hypernode_list(
            &serde_json::json!({"items": [{"kind": "Node"}]})
        ));
    }
}
