//! The Kubernetes API as Kubernetes clients reach it: kube-rs (with k8s-openapi's types) over
//! rustls. Where the API server is and who busbw is to it, in this order:
//!
//! 1. `--topology-k8s-url` (a `kubectl proxy`, a test's server), with the service account's
//!    token and CA when the directory has them;
//! 2. `KUBECONFIG` when set: its current context, as kubectl reads it (tokens, client
//!    certificates, exec plugins such as `oci ce cluster generate-token` or `aws eks
//!    get-token`, CA data, proxies, all kube-rs's);
//! 3. in a pod (`KUBERNETES_SERVICE_HOST`/`PORT`): the service account's token (re-read as the
//!    kubelet rotates it), CA bundle and namespace, as client-go's in-cluster config;
//! 4. `~/.kube/config`, for a run outside any cluster.
//!
//! busbw's calls are few and synchronous (a rank's node at start-up, HyperNodes, one patch per
//! node at the end), so each runs to completion on a small runtime of its own, on a thread of
//! its own: the caller may or may not be inside the control plane's tokio runtime.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;

use super::sources::SourceConfig;

/// The RBAC objects a reader needs (k8s/rbac): get nodes, list HyperNodes.
const READER_RBAC: &str = "apply the ClusterRole busbw-node-reader and its ClusterRoleBinding \
     (kubectl apply -k k8s/rbac, or `busbw k8s render --part rbac`), with this identity as a \
     subject";
/// The opt-in RBAC objects of `--label-nodes` (k8s/rbac-labeler): patch nodes.
const LABELER_RBAC: &str = "apply the opt-in ClusterRole busbw-node-labeler and its binding \
     (kubectl apply -k k8s/rbac-labeler, or `busbw k8s render --part labeler-rbac`)";

/// A client of one API server, and who it is there (for messages).
pub(crate) struct KubeApi {
    client: Client,
    rt: tokio::runtime::Runtime,
    server: String,
    /// e.g. "the service account token in /var/run/secrets/...", "kubeconfig ~/.kube/config
    /// (context gpu-cluster)".
    pub identity: String,
    timeout: Duration,
}

/// What the API server said, or why it could not be asked.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// An HTTP status with the API server's message.
    Status { code: u16, message: String },
    /// No answer: connection, TLS, credentials plugin, timeout.
    Transport(String),
}

impl KubeApi {
    /// Finds the API server and the credentials as the module says.
    pub(crate) fn connect(
        cfg: &SourceConfig,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<KubeApi, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the Kubernetes client's runtime: {e}"))?;
        let sa = &cfg.service_account_dir;
        let (config, identity) = if let Some(url) = &cfg.k8s_url {
            let config = explicit(url, sa)?;
            let who = if sa.join("token").exists() {
                format!("the service account token in {}", sa.display())
            } else {
                "no credentials".to_string()
            };
            (config, format!("{who} at --topology-k8s-url {url}"))
        } else if let Some(path) = lookup("KUBECONFIG").filter(|p| !p.is_empty()) {
            kubeconfig(&rt, &path)?
        } else if let (Some(host), Some(port)) = (
            lookup("KUBERNETES_SERVICE_HOST"),
            lookup("KUBERNETES_SERVICE_PORT"),
        ) {
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            let config = in_cluster(&format!("https://{host}:{port}"), sa)?;
            let who = format!(
                "the pod's service account (namespace {}, token in {})",
                config.default_namespace,
                sa.display()
            );
            (config, who)
        } else {
            let home = lookup("HOME").unwrap_or_default();
            let path = Path::new(&home).join(".kube/config");
            if home.is_empty() || !path.exists() {
                return Err(
                    "no Kubernetes API server: not in a pod (KUBERNETES_SERVICE_HOST \
                     is unset) and no kubeconfig (KUBECONFIG, ~/.kube/config); give \
                     --topology-k8s-url"
                        .into(),
                );
            }
            kubeconfig(&rt, &path.display().to_string())?
        };
        let timeout = cfg.timeout;
        let mut config = config;
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        let server = config.cluster_url.to_string();
        let server = server.trim_end_matches('/').to_string();
        let client = rt
            .block_on(async { Client::try_from(config) })
            .map_err(|e| format!("Kubernetes API {server}: {}", chain(&e)))?;
        Ok(KubeApi {
            client,
            rt,
            server,
            identity,
            timeout,
        })
    }

    /// The API server's base URL, for messages.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    /// Runs `fut` to completion on this client's runtime, on a thread of its own, within
    /// twice the timeout (connect plus answer).
    fn run<T: Send>(
        &self,
        fut: impl std::future::Future<Output = Result<T, kube::Error>> + Send,
    ) -> Result<T, ApiError> {
        let limit = 2 * self.timeout;
        let rt = &self.rt;
        std::thread::scope(|s| {
            s.spawn(|| {
                rt.block_on(async { tokio::time::timeout(limit, fut).await })
                    .map_err(|_| {
                        ApiError::Transport(format!("no answer within {}s", limit.as_secs()))
                    })?
                    .map_err(api_error)
            })
            .join()
            .unwrap_or_else(|_| Err(ApiError::Transport("the client thread panicked".into())))
        })
    }

    /// The node object as JSON.
    pub(crate) fn node(&self, name: &str) -> Result<Value, ApiError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let node = self.run(async move { api.get(name).await })?;
        serde_json::to_value(node).map_err(|e| ApiError::Transport(e.to_string()))
    }

    /// Volcano's HyperNodes as a list document (`items`), or None where the cluster has no
    /// HyperNode API (Volcano without network topology).
    pub(crate) fn hypernodes(&self) -> Result<Option<Value>, ApiError> {
        let gvk = GroupVersionKind::gvk("topology.volcano.sh", "v1alpha1", "HyperNode");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "hypernodes");
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
        match self.run(async move { api.list(&ListParams::default()).await }) {
            Ok(list) => serde_json::to_value(list)
                .map(Some)
                .map_err(|e| ApiError::Transport(e.to_string())),
            Err(ApiError::Status { code: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A JSON merge patch of a node (labels). The answer's body is not read: once the server
    /// said 2xx the patch is applied, whatever the object it sends back looks like.
    pub(crate) fn patch_node(&self, name: &str, patch: &Value) -> Result<(), ApiError> {
        let req = kube::core::Request::new("/api/v1/nodes")
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .map_err(|e| ApiError::Transport(chain(&e)))?;
        let client = self.client.clone();
        self.run(async move { client.request_text(req).await })
            .map(|_| ())
    }

    /// What to do about a status: 401 and 403 name the credentials and the RBAC objects
    /// (`labeler`: the patch's, else the reader's); other statuses pass the server's message.
    pub(crate) fn explain(&self, what: &str, e: &ApiError, labeler: bool) -> String {
        let server = &self.server;
        match e {
            ApiError::Transport(t) => format!("{what} at {server}: {t}"),
            ApiError::Status { code: 401, message } => format!(
                "{what}: HTTP 401 from {server}: not authenticated: {} was refused (an expired \
                 or foreign token, or the wrong cluster) ({message})",
                self.identity
            ),
            ApiError::Status { code: 403, message } => format!(
                "{what}: HTTP 403 from {server}: {} may not do this; {} ({message})",
                self.identity,
                if labeler { LABELER_RBAC } else { READER_RBAC }
            ),
            ApiError::Status { code, message } => {
                format!("{what}: HTTP {code} from {server}: {message}")
            }
        }
    }
}

impl KubeApi {
    /// [`KubeApi::explain`] for a call on node `node`, whose 404 means the pod named the
    /// wrong node.
    pub(crate) fn explain_node(
        &self,
        what: &str,
        node: &str,
        e: &ApiError,
        labeler: bool,
    ) -> String {
        match e {
            ApiError::Status { code: 404, .. } => format!(
                "{what}: HTTP 404 from {}: no node named {node:?} (is NODE_NAME set from \
                 spec.nodeName?)",
                self.server
            ),
            e => self.explain(what, e, labeler),
        }
    }
}

fn api_error(e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(s) => ApiError::Status {
            code: s.code,
            message: if s.message.is_empty() {
                s.reason.clone()
            } else {
                s.message.clone()
            },
        },
        e => ApiError::Transport(chain(&e)),
    }
}

/// An error and its causes, "a: b: c" (kube's own text stops at the outermost).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cause = c.source();
    }
    s
}

fn uri(url: &str) -> Result<http::Uri, String> {
    url.parse::<http::Uri>()
        .map_err(|e| format!("Kubernetes API URL {url:?}: {e}"))
}

/// The PEM certificates of `path` as DER, for the client's trust store.
fn pem_certs(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    busbw_http::pem_certificates(path).map_err(|e| format!("CA bundle {}: {e}", path.display()))
}

/// `--topology-k8s-url`: the service account's token and CA where the directory has them.
fn explicit(url: &str, sa: &Path) -> Result<Config, String> {
    let mut config = Config::new(uri(url.trim_end_matches('/'))?);
    let token = sa.join("token");
    if token.exists() {
        config.auth_info.token_file = Some(token.display().to_string());
    }
    let ca = sa.join("ca.crt");
    if ca.exists() {
        config.root_cert = Some(pem_certs(&ca)?);
        config.root_cert_file = Some(ca);
    }
    Ok(config)
}

/// client-go's in-cluster configuration, from `sa` rather than the fixed path so that a pod
/// with its token projected elsewhere (and the tests) can say where.
fn in_cluster(url: &str, sa: &Path) -> Result<Config, String> {
    let token = sa.join("token");
    if !token.exists() {
        return Err(format!(
            "in a pod but no service-account token at {}: the pod needs \
             automountServiceAccountToken (busbw's manifests run as service account busbw)",
            token.display()
        ));
    }
    let mut config = Config::new(uri(url)?);
    config.auth_info.token_file = Some(token.display().to_string());
    let ca = sa.join("ca.crt");
    config.root_cert = Some(pem_certs(&ca)?);
    config.root_cert_file = Some(PathBuf::from(&ca));
    if let Ok(ns) = std::fs::read_to_string(sa.join("namespace")) {
        config.default_namespace = ns.trim().to_string();
    }
    Ok(config)
}

/// The current context of the kubeconfig at `paths` (a `:`-separated list merged as kubectl
/// merges it: the first file to set a value wins).
fn kubeconfig(rt: &tokio::runtime::Runtime, paths: &str) -> Result<(Config, String), String> {
    let mut merged: Option<Kubeconfig> = None;
    for p in paths.split(':').filter(|p| !p.is_empty()) {
        let kc = Kubeconfig::read_from(p).map_err(|e| format!("kubeconfig {p}: {}", chain(&e)))?;
        merged = Some(match merged {
            None => kc,
            Some(m) => m
                .merge(kc)
                .map_err(|e| format!("kubeconfig {paths}: {}", chain(&e)))?,
        });
    }
    let kc = merged.ok_or_else(|| format!("KUBECONFIG {paths:?} names no file"))?;
    let context = kc.current_context.clone().unwrap_or_default();
    let config = rt
        .block_on(Config::from_custom_kubeconfig(
            kc,
            &KubeConfigOptions::default(),
        ))
        .map_err(|e| format!("kubeconfig {paths} (context {context:?}): {}", chain(&e)))?;
    Ok((config, format!("kubeconfig {paths} (context {context:?})")))
}
