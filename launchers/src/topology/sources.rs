//! Where a rank's node labels come from: the environment, a node-labels file, the Kubernetes
//! API, OCI instance metadata. Sources combine in the order given: a key an earlier source set
//! to a real value is kept, and a placeholder or missing key is filled by a later one.
//!
//! Pods cannot read their node's labels through the downward API, hence the choice: a mapping
//! the launcher or a ConfigMap provides (env, file: pods stay unprivileged), the API server
//! (needs RBAC `get nodes`), or the cloud's metadata service (OCI only).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;

use super::hypernodes;
use super::kube_api::KubeApi;
use super::model::{is_placeholder, Labels};
use super::presets::{
    Preset, OCI_GPU_MEMORY_FABRIC, OCI_HOST, OCI_ISLAND, OCI_LOCAL_BLOCK, OCI_NETWORK_BLOCK,
};
use busbw_http as http;

/// `BUSBW_TOPOLOGY=key=value,key=value`.
pub const TOPOLOGY_ENV: &str = "BUSBW_TOPOLOGY";
/// Per-key variables: `BUSBW_TOPOLOGY_` + the key upper-cased with every other character `_`.
pub const TOPOLOGY_ENV_PREFIX: &str = "BUSBW_TOPOLOGY_";
/// OCI's instance metadata service (v2 needs the `Authorization: Bearer Oracle` header).
pub const OCI_IMDS_URL: &str = "http://169.254.169.254/opc/v2";
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// One label source of `--topology-source`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Env,
    File,
    K8s,
    OciImds,
}

impl FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "env" => Source::Env,
            "file" => Source::File,
            "k8s" | "kubernetes" => Source::K8s,
            "oci-imds" | "imds" | "oci" => Source::OciImds,
            _ => {
                return Err(format!(
                    "unknown topology source '{s}': expected env, file, k8s or oci-imds \
                     (comma-separated to combine)"
                ))
            }
        })
    }
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Env => "env",
            Source::File => "file",
            Source::K8s => "k8s",
            Source::OciImds => "oci-imds",
        }
    }

    /// `env,file,...` in order, without repeats.
    pub fn parse_list(s: &str) -> Result<Vec<Source>, String> {
        let mut v = Vec::new();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let src: Source = part.parse()?;
            if !v.contains(&src) {
                v.push(src);
            }
        }
        if v.is_empty() {
            return Err("--topology-source is empty: give env, file, k8s or oci-imds".into());
        }
        Ok(v)
    }
}

/// What the sources need to know.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    pub sources: Vec<Source>,
    /// Node-labels file (`kubectl get nodes -o json`, or a JSON/YAML map host -> labels).
    pub file: Option<PathBuf>,
    /// API server base URL; default `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`.
    pub k8s_url: Option<String>,
    /// Service-account directory holding `token` and `ca.crt`.
    pub service_account_dir: PathBuf,
    /// Instance metadata base URL (`.../opc/v2`).
    pub imds_url: String,
    pub timeout: Duration,
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            sources: vec![Source::Env],
            file: None,
            k8s_url: None,
            service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
            imds_url: OCI_IMDS_URL.into(),
            timeout: Duration::from_secs(10),
        }
    }
}

/// A rank's labels and how they were found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gathered {
    pub labels: Labels,
    /// One line per source: what it gave, or why it gave nothing.
    pub notes: Vec<String>,
}

/// A source that was asked for could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("topology source {source_name}: {msg}")]
pub struct SourceError {
    pub source_name: &'static str,
    pub msg: String,
}

fn err(source_name: &'static str, msg: impl Into<String>) -> SourceError {
    SourceError {
        source_name,
        msg: msg.into(),
    }
}

/// Fill `into` from `from`: real values of earlier sources win, placeholders give way.
pub fn merge(into: &mut Labels, from: Labels) {
    for (k, v) in from {
        match into.get(&k) {
            Some(old) if !is_placeholder(old) => {}
            _ => {
                into.insert(k, v);
            }
        }
    }
}

/// The per-key variable for `key`.
pub fn env_var_for(key: &str) -> String {
    let mut s = String::from(TOPOLOGY_ENV_PREFIX);
    s.extend(key.chars().map(|c| {
        if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        }
    }));
    s
}

/// `key=value,key=value` (blanks around items ignored; a value may be empty: unknown).
pub fn parse_pairs(s: &str) -> Result<Labels, String> {
    let mut out = Labels::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}' is not key=value"))?;
        if k.trim().is_empty() {
            return Err(format!("'{item}' has an empty key"));
        }
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// Labels from `BUSBW_TOPOLOGY` and from the per-key variables of `preset`'s keys.
pub fn from_env(
    preset: &Preset,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Labels, SourceError> {
    let mut out = Labels::new();
    if let Some(v) = lookup(TOPOLOGY_ENV) {
        out = parse_pairs(&v).map_err(|e| err("env", format!("{TOPOLOGY_ENV}: {e}")))?;
    }
    for key in preset.candidate_keys() {
        if let Some(v) = lookup(&env_var_for(&key)) {
            out.entry(key).or_insert_with(|| v.trim().to_string());
        }
    }
    Ok(out)
}

fn string_map(v: &Value) -> Option<Labels> {
    let o = v.as_object()?;
    o.iter()
        .map(|(k, v)| {
            let s = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::Null => String::new(),
                _ => return None,
            };
            Some((k.clone(), s))
        })
        .collect()
}

fn node_labels(node: &Value) -> Option<(String, Labels)> {
    let meta = node.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_string();
    let labels = meta.get("labels").and_then(string_map).unwrap_or_default();
    Some((name, labels))
}

/// Every host's labels in a node-labels document: the JSON of `kubectl get nodes -o json` (a
/// List), one Node, a JSON map host -> labels, or the same map in simple YAML.
pub fn parse_node_labels(text: &str) -> Result<Vec<(String, Labels)>, String> {
    let t = text.trim_start();
    if !(t.starts_with('{') || t.starts_with('[')) {
        return parse_yaml_map(text);
    }
    let v: Value = serde_json::from_str(t).map_err(|e| format!("not valid JSON: {e}"))?;
    if let Some(items) = v.get("items").and_then(Value::as_array) {
        return Ok(items.iter().filter_map(node_labels).collect());
    }
    if v.get("kind").and_then(Value::as_str) == Some("Node") {
        return node_labels(&v)
            .map(|n| vec![n])
            .ok_or_else(|| "a Node without metadata.name".into());
    }
    if let Some(items) = v.as_array() {
        return Ok(items.iter().filter_map(node_labels).collect());
    }
    let o = v
        .as_object()
        .ok_or("expected a node List, a Node, or a map host -> labels")?;
    o.iter()
        .map(|(host, labels)| {
            let labels = labels.get("labels").unwrap_or(labels);
            string_map(labels)
                .map(|l| (host.clone(), l))
                .ok_or_else(|| format!("host {host}: labels must be a map of strings"))
        })
        .collect()
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    if s.len() >= 2
        && ((s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\'')))
    {
        return s[1..s.len() - 1].to_string();
    }
    s.to_string()
}

/// `host:` lines at the margin, indented `key: value` lines below them; `#` comments.
fn parse_yaml_map(text: &str) -> Result<Vec<(String, Labels)>, String> {
    let mut out: Vec<(String, Labels)> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') || body == "---" {
            continue;
        }
        // A colon outside quotes separates key and value (keys hold '/' and '.', never ':').
        let split = if body.starts_with('"') || body.starts_with('\'') {
            let q = body.as_bytes()[0] as char;
            body[1..]
                .find(q)
                .map(|i| i + 2)
                .and_then(|i| body[i..].find(':').map(|j| i + j))
        } else {
            body.find(':')
        };
        let Some(colon) = split else {
            return Err(format!(
                "line {}: expected 'key: value', got {body:?}",
                n + 1
            ));
        };
        let (k, v) = (unquote(&body[..colon]), unquote(&body[colon + 1..]));
        let indented = line.len() != body.len();
        if !indented {
            if !v.is_empty() {
                return Err(format!(
                    "line {}: a host line is 'host:' with its labels indented below it",
                    n + 1
                ));
            }
            out.push((k, Labels::new()));
        } else {
            let Some((_, labels)) = out.last_mut() else {
                return Err(format!("line {}: a label before any host line", n + 1));
            };
            labels.insert(k, v);
        }
    }
    if out.is_empty() {
        return Err("no hosts in the file".into());
    }
    Ok(out)
}

/// The entry for `node` (its Kubernetes node name or host name); a short host name matches
/// a fully qualified entry and the other way round.
pub fn find_host<'a>(entries: &'a [(String, Labels)], node: &str) -> Option<&'a Labels> {
    let short = |s: &str| s.split('.').next().unwrap_or(s).to_string();
    entries
        .iter()
        .find(|(h, _)| h == node)
        .or_else(|| entries.iter().find(|(h, _)| short(h) == short(node)))
        .map(|(_, l)| l)
}

/// `so_far`: the labels earlier sources gave, for HyperNode label selectors.
fn from_file(path: &Path, node: &str, so_far: &Labels) -> Result<(Labels, String), SourceError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err("file", format!("cannot read {}: {e}", path.display())))?;
    if let Ok(doc) = serde_json::from_str::<Value>(&text) {
        if hypernodes::is_hypernode_list(&doc) {
            let (l, notes) = hypernodes::node_tiers(&doc, node, so_far)
                .map_err(|e| err("file", format!("{}: {e}", path.display())))?;
            let mut note = format!(
                "{node} is in {} HyperNode tiers of {}",
                l.len(),
                path.display()
            );
            for n in notes {
                note.push_str("; ");
                note.push_str(&n);
            }
            return Ok((l, note));
        }
    }
    let entries =
        parse_node_labels(&text).map_err(|e| err("file", format!("{}: {e}", path.display())))?;
    Ok(match find_host(&entries, node) {
        Some(l) => (
            l.clone(),
            format!("{} labels for {node} from {}", l.len(), path.display()),
        ),
        None => (
            Labels::new(),
            format!(
                "{node} is not in {} ({} hosts): its labels are unknown",
                path.display(),
                entries.len()
            ),
        ),
    })
}

/// This node's labels from the API server (RBAC: get nodes).
fn from_k8s(api: &KubeApi, node: &str) -> Result<(Labels, String), SourceError> {
    let what = format!("get nodes/{node}");
    let v = match api.node(node) {
        Ok(v) => v,
        Err(e) => return Err(err("k8s", api.explain_node(&what, node, &e, false))),
    };
    let (_, labels) = node_labels(&v)
        .ok_or_else(|| err("k8s", format!("{what}: the answer is not a Node object")))?;
    let note = format!(
        "{} labels of node {node} from {} as {}",
        labels.len(),
        api.server(),
        api.identity
    );
    Ok((labels, note))
}

/// The HyperNodes holding `node`, from the API server (RBAC: list `hypernodes` in
/// `topology.volcano.sh`). No HyperNode API (Volcano without network topology) is a note.
fn hypernodes_from_k8s(
    api: &KubeApi,
    node: &str,
    node_labels: &Labels,
) -> Result<(Labels, String), SourceError> {
    let what = "list hypernodes.topology.volcano.sh";
    let doc = match api.hypernodes() {
        Ok(Some(doc)) => doc,
        Ok(None) => {
            return Ok((
                Labels::new(),
                format!(
                    "no HyperNode API (topology.volcano.sh/v1alpha1) at {}",
                    api.server()
                ),
            ))
        }
        Err(e) => return Err(err("k8s", api.explain(what, &e, false))),
    };
    let (l, notes) = hypernodes::node_tiers(&doc, node, node_labels).map_err(|e| err("k8s", e))?;
    let mut note = format!("{node} is in {} HyperNode tiers", l.len());
    for n in notes {
        note.push_str("; ");
        note.push_str(&n);
    }
    Ok((l, note))
}

/// What the OCI labeler does with an OCID: keep its last 11 characters.
fn oci_short(v: &str) -> String {
    let v = v.trim();
    if v.starts_with("ocid1.") && v.len() > 11 {
        v[v.len() - 11..].to_string()
    } else {
        v.to_string()
    }
}

/// `rdmaTopologyData` as the labels the OCI labeler would put on the node. Metadata without
/// topology data gives the labeler's placeholder, so the report says "unknown", not "absent".
pub fn oci_labels(doc: Option<&Value>) -> Labels {
    let fields = [
        ("customerHPCIslandId", OCI_ISLAND),
        ("customerNetworkBlock", OCI_NETWORK_BLOCK),
        ("customerLocalBlock", OCI_LOCAL_BLOCK),
        ("customerHostId", OCI_HOST),
        ("customerGpuMemoryFabric", OCI_GPU_MEMORY_FABRIC),
    ];
    let mut out = Labels::new();
    for (field, key) in fields {
        let v = doc
            .and_then(|d| d.get(field))
            .and_then(Value::as_str)
            .map(oci_short)
            .filter(|v| !v.is_empty());
        match v {
            Some(v) => {
                out.insert(key.to_string(), v);
            }
            None if key != OCI_GPU_MEMORY_FABRIC => {
                out.insert(key.to_string(), "no-imds-data".into());
            }
            None => {}
        }
    }
    out
}

fn from_imds(cfg: &SourceConfig) -> Result<(Labels, String), SourceError> {
    let url = format!(
        "{}/host/rdmaTopologyData",
        cfg.imds_url.trim_end_matches('/')
    );
    let r = http::get(
        &url,
        &[("Authorization", "Bearer Oracle")],
        None,
        cfg.timeout,
    )
    .map_err(|e| err("oci-imds", e.to_string()))?;
    match r.status {
        200 => {
            let v: Value = serde_json::from_slice(&r.body)
                .map_err(|e| err("oci-imds", format!("GET {url}: not JSON: {e}")))?;
            Ok((oci_labels(Some(&v)), format!("rdmaTopologyData from {url}")))
        }
        404 => Ok((
            oci_labels(None),
            format!("{url}: no rdmaTopologyData (HTTP 404): topology unknown"),
        )),
        s => Err(err(
            "oci-imds",
            format!(
                "GET {url}: HTTP {s}: {}",
                String::from_utf8_lossy(&r.body).trim()
            ),
        )),
    }
}

/// This rank's labels from every configured source, in order. `node` is the Kubernetes node
/// name (NODE_NAME) or host name the file and the API server know this node by.
pub fn gather(
    cfg: &SourceConfig,
    preset: &Preset,
    node: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Gathered, SourceError> {
    let mut g = Gathered::default();
    for &src in &cfg.sources {
        let (labels, note) = match src {
            Source::Env => {
                let l = from_env(preset, lookup)?;
                let n = format!("{} labels from the environment", l.len());
                (l, n)
            }
            Source::File => {
                let path = cfg.file.as_deref().ok_or_else(|| {
                    err("file", "--topology-source file needs --topology-file PATH")
                })?;
                from_file(path, node, &g.labels)?
            }
            Source::K8s => {
                let api = KubeApi::connect(cfg, lookup).map_err(|e| err("k8s", e))?;
                let (mut l, mut n) = from_k8s(&api, node)?;
                if *preset == Preset::Volcano {
                    let (h, hn) = hypernodes_from_k8s(&api, node, &l)?;
                    merge(&mut l, h);
                    n = format!("{n}; {hn}");
                }
                (l, n)
            }
            Source::OciImds => from_imds(cfg)?,
        };
        g.notes.push(format!("{}: {note}", src.name()));
        merge(&mut g.labels, labels);
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    /// A one-request HTTP server on 127.0.0.1 answering `status` and `body`; the request's
    /// lines come back through the channel.
    fn serve(status: u16, body: &str, chunked: bool) -> (String, mpsc::Receiver<Vec<String>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        let body = body.to_string();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut lines = Vec::new();
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                lines.push(line.trim_end().to_string());
            }
            tx.send(lines).unwrap();
            let mut s = s;
            let resp = if chunked {
                let (a, b) = body.split_at(body.len() / 2);
                format!(
                    "HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                    a.len(),
                    b.len()
                )
            } else {
                format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
            };
            s.write_all(resp.as_bytes()).unwrap();
        });
        (format!("http://{addr}"), rx)
    }

    #[test]
    fn sources_parse_and_combine() {
        assert_eq!(
            Source::parse_list("env, file,k8s,oci-imds,env").unwrap(),
            [Source::Env, Source::File, Source::K8s, Source::OciImds]
        );
        assert!(Source::parse_list("env,dns").unwrap_err().contains("dns"));
        assert!(Source::parse_list(" , ").is_err());
        let mut a = parse_pairs("a=1, b=no-imds-data").unwrap();
        merge(&mut a, parse_pairs("a=2,b=real,c=3").unwrap());
        assert_eq!(a, parse_pairs("a=1,b=real,c=3").unwrap());
    }

    #[test]
    fn env_pairs_and_per_key_variables() {
        let lookup = env(&[
            (
                TOPOLOGY_ENV,
                "oci.oraclecloud.com/rdma.local_block_id=lb1 , x=y,",
            ),
            (
                "BUSBW_TOPOLOGY_OCI_ORACLECLOUD_COM_RDMA_NETWORK_BLOCK_ID",
                "nb1",
            ),
            // BUSBW_TOPOLOGY wins over a per-key variable for the same key.
            (
                "BUSBW_TOPOLOGY_OCI_ORACLECLOUD_COM_RDMA_LOCAL_BLOCK_ID",
                "other",
            ),
        ]);
        let l = from_env(&Preset::Oci, &lookup).unwrap();
        assert_eq!(l[OCI_LOCAL_BLOCK], "lb1");
        assert_eq!(l[OCI_NETWORK_BLOCK], "nb1");
        assert_eq!(l["x"], "y");
        assert_eq!(
            env_var_for("topology.k8s.aws/network-node-layer-2"),
            "BUSBW_TOPOLOGY_TOPOLOGY_K8S_AWS_NETWORK_NODE_LAYER_2"
        );
        let aws = env(&[(
            "BUSBW_TOPOLOGY_TOPOLOGY_K8S_AWS_NETWORK_NODE_LAYER_2",
            "nn-2",
        )]);
        let l = from_env(&Preset::Aws, &aws).unwrap();
        assert_eq!(l["topology.k8s.aws/network-node-layer-2"], "nn-2");
        let bad = env(&[(TOPOLOGY_ENV, "novalue")]);
        let e = from_env(&Preset::Oci, &bad).unwrap_err();
        assert!(e.to_string().contains("BUSBW_TOPOLOGY") && e.to_string().contains("novalue"));
        // Nothing set: no labels, not an error.
        assert!(from_env(&Preset::Auto, &env(&[])).unwrap().is_empty());
    }

    const KUBECTL: &str = r#"{"apiVersion":"v1","kind":"List","items":[
      {"kind":"Node","metadata":{"name":"gpu-a.example","labels":{
        "kubernetes.io/hostname":"gpu-a","oci.oraclecloud.com/rdma.local_block_id":"lb1",
        "oci.oraclecloud.com/rdma.network_block_id":"no-imds-data","n":3}}},
      {"kind":"Node","metadata":{"name":"gpu-b","labels":{}}}]}"#;

    #[test]
    fn node_labels_files_in_every_format() {
        let e = parse_node_labels(KUBECTL).unwrap();
        assert_eq!(e.len(), 2);
        let a = find_host(&e, "gpu-a").unwrap();
        assert_eq!(a[OCI_LOCAL_BLOCK], "lb1");
        assert_eq!(a["n"], "3");
        assert!(find_host(&e, "gpu-b.example").unwrap().is_empty());
        assert!(find_host(&e, "gpu-c").is_none());

        let one = r#"{"kind":"Node","metadata":{"name":"n1","labels":{"k":"v"}}}"#;
        assert_eq!(parse_node_labels(one).unwrap()[0].1["k"], "v");

        let map = r#"{"node0": {"rack": "r1"}, "node1": {"labels": {"rack": "r2"}}}"#;
        let e = parse_node_labels(map).unwrap();
        assert_eq!(find_host(&e, "node1").unwrap()["rack"], "r2");

        let yaml = "# from a ConfigMap\nnode0:\n  rack: r1\n  \"example.com/block\": 'b:1'\nnode1:\n  rack: \"\"\n";
        let e = parse_node_labels(yaml).unwrap();
        assert_eq!(find_host(&e, "node0").unwrap()["example.com/block"], "b:1");
        assert_eq!(find_host(&e, "node1").unwrap()["rack"], "");
        assert!(parse_node_labels("  rack: r1\n")
            .unwrap_err()
            .contains("before any host"));
        assert!(parse_node_labels("node0: x\n")
            .unwrap_err()
            .contains("host line"));
        assert!(parse_node_labels("{not json").unwrap_err().contains("JSON"));
        assert!(parse_node_labels(r#"{"h": {"k": {"deep": 1}}}"#).is_err());
    }

    #[test]
    fn file_source_reads_this_node() {
        let dir = std::env::temp_dir().join(format!("busbw-topo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nodes.json");
        std::fs::write(&path, KUBECTL).unwrap();
        let cfg = SourceConfig {
            sources: vec![Source::File, Source::Env],
            file: Some(path.clone()),
            ..SourceConfig::default()
        };
        // The file's placeholder gives way to the environment's real value.
        let lookup = env(&[(
            TOPOLOGY_ENV,
            "oci.oraclecloud.com/rdma.network_block_id=nb7",
        )]);
        let g = gather(&cfg, &Preset::Oci, "gpu-a", &lookup).unwrap();
        assert_eq!(g.labels[OCI_LOCAL_BLOCK], "lb1");
        assert_eq!(g.labels[OCI_NETWORK_BLOCK], "nb7");
        assert!(g.notes[0].starts_with("file: "), "{:?}", g.notes);
        let g = gather(&cfg, &Preset::Oci, "gpu-z", &env(&[])).unwrap();
        assert!(g.labels.is_empty());
        assert!(g.notes[0].contains("not in"), "{:?}", g.notes);
        let missing = SourceConfig {
            file: Some(dir.join("absent.json")),
            ..cfg.clone()
        };
        let e = gather(&missing, &Preset::Oci, "gpu-a", &env(&[])).unwrap_err();
        assert!(e.to_string().contains("absent.json"), "{e}");
        let none = SourceConfig { file: None, ..cfg };
        let e = gather(&none, &Preset::Oci, "gpu-a", &env(&[])).unwrap_err();
        assert!(e.to_string().contains("--topology-file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    const HYPERNODES: &str = r#"{"kind":"List","items":[
      {"kind":"HyperNode","metadata":{"name":"leaf-a"},"spec":{"tier":1,"members":[
        {"type":"Node","selector":{"labelMatch":{"matchLabels":{"rack":"a"}}}}]}},
      {"kind":"HyperNode","metadata":{"name":"spine"},"spec":{"tier":2,"members":[
        {"type":"HyperNode","selector":{"exactMatch":{"name":"leaf-a"}}}]}}]}"#;

    #[test]
    fn hypernodes_from_a_file_and_from_the_api_server() {
        // File: label selectors see the labels of the sources before it.
        let path = std::env::temp_dir().join(format!("busbw-hn-{}.json", std::process::id()));
        std::fs::write(&path, HYPERNODES).unwrap();
        let cfg = SourceConfig {
            sources: vec![Source::Env, Source::File],
            file: Some(path.clone()),
            ..SourceConfig::default()
        };
        let g = gather(
            &cfg,
            &Preset::Volcano,
            "gpu-a",
            &env(&[(TOPOLOGY_ENV, "rack=a")]),
        )
        .unwrap();
        assert_eq!(g.labels["topology.volcano.sh/tier-1"], "leaf-a");
        assert_eq!(g.labels["topology.volcano.sh/tier-2"], "spine");
        assert!(g.notes[1].contains("2 HyperNode tiers"), "{:?}", g.notes);
        let _ = std::fs::remove_file(&path);
        // Through the API server: tests/kube.rs.
    }

    #[test]
    fn oci_metadata_source() {
        let doc = r#"{"customerHPCIslandId":"ocid1.hpcisland.oc1.iad.anuwcljrabcdefghijk",
            "customerNetworkBlock":"ocid1.networkblock.oc1.iad.anuwcljrnb00000001",
            "customerLocalBlock":"ocid1.localblock.oc1.iad.anuwcljrlb00000001",
            "customerHostId":"ocid1.host.oc1.iad.anuwcljrho00000001"}"#;
        let (url, rx) = serve(200, doc, false);
        let cfg = SourceConfig {
            sources: vec![Source::OciImds],
            imds_url: format!("{url}/opc/v2"),
            ..SourceConfig::default()
        };
        let g = gather(&cfg, &Preset::Oci, "n", &env(&[])).unwrap();
        assert_eq!(g.labels[OCI_ISLAND], "abcdefghijk");
        assert_eq!(g.labels[OCI_LOCAL_BLOCK], "rlb00000001");
        assert!(!g.labels.contains_key(OCI_GPU_MEMORY_FABRIC));
        let req = rx.recv().unwrap();
        assert_eq!(req[0], "GET /opc/v2/host/rdmaTopologyData HTTP/1.1");
        assert!(
            req.iter().any(|l| l == "Authorization: Bearer Oracle"),
            "{req:?}"
        );

        // No topology data for this tenancy: the labeler's placeholder, which is unknown.
        let (url, _rx) = serve(404, "not found", false);
        let cfg = SourceConfig {
            imds_url: format!("{url}/opc/v2"),
            ..cfg
        };
        let g = gather(&cfg, &Preset::Oci, "n", &env(&[])).unwrap();
        assert_eq!(g.labels[OCI_LOCAL_BLOCK], "no-imds-data");
        assert!(is_placeholder(&g.labels[OCI_ISLAND]));
        // Nothing listening.
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = dead.local_addr().unwrap().port();
        drop(dead);
        let cfg = SourceConfig {
            imds_url: format!("http://127.0.0.1:{port}/opc/v2"),
            timeout: Duration::from_secs(2),
            ..cfg
        };
        let e = gather(&cfg, &Preset::Oci, "n", &env(&[])).unwrap_err();
        assert!(
            e.to_string().contains("oci-imds") && e.to_string().contains("connect"),
            "{e}"
        );
        // Partial data: the missing field is a placeholder.
        let l = oci_labels(Some(&serde_json::json!({"customerLocalBlock": "lb-x"})));
        assert_eq!(l[OCI_LOCAL_BLOCK], "lb-x");
        assert_eq!(l[OCI_NETWORK_BLOCK], "no-imds-data");
    }
}
