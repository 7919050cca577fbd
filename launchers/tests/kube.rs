//! The Kubernetes API through kube-rs, against loopback API servers made here: in a pod (the
//! service account's token, CA and namespace; https with a CA made in the test; a token that
//! rotates), from a kubeconfig (a bearer token, an exec credential plugin as OKE's and EKS's
//! kubeconfigs have), the wrong CA refused before any request, redirects not followed, and
//! what 401, 403 and 404 say.

use busbw_http::testing::{header, json_reply, pki, serve_many, Pki, Seen};
use busbw_launchers::topology::node_labels::{apply, patches, NodeLabel};
use busbw_launchers::topology::{gather, Preset, Source, SourceConfig};
use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::Duration;

const NODE: &str = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"gpu-a","labels":{"rack":"r7","oci.oraclecloud.com/rdma.local_block_id":"lb1"}}}"#;

/// A scratch directory, removed when dropped.
struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("busbw-kube-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A mounted service account: token, the cluster's CA, namespace.
fn service_account(tag: &str, token: &str, ca: &Pki) -> Dir {
    let d = Dir::new(tag);
    // As the kubelet writes it: no newline (kube-rs sends the file's bytes as they are).
    d.write("token", token);
    d.write("ca.crt", &ca.ca_pem);
    d.write("namespace", "gates");
    d
}

fn env(vars: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    move |k| m.get(k).cloned()
}

fn in_pod(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
        ("KUBERNETES_SERVICE_PORT", port.to_string()),
    ]
}

fn k8s(sa: &Path) -> SourceConfig {
    SourceConfig {
        sources: vec![Source::K8s],
        service_account_dir: sa.to_path_buf(),
        timeout: Duration::from_secs(20),
        ..SourceConfig::default()
    }
}

/// An API server answering every GET of a node with `NODE`, and `status`/`body` otherwise.
fn api_server(
    pki: Option<&Pki>,
    status: u16,
    body: &'static str,
) -> (u16, Receiver<std::io::Result<Seen>>) {
    serve_many(pki, move |(head, _)| {
        if status == 200 && head[0].starts_with("GET /api/v1/nodes/") {
            json_reply(200, NODE)
        } else {
            json_reply(status, body)
        }
    })
}

fn requests(rx: &Receiver<std::io::Result<Seen>>) -> Vec<Seen> {
    rx.try_iter()
        .map(|r| r.expect("a request over TLS"))
        .collect()
}

#[test]
fn in_a_pod_the_service_account_token_ca_and_a_rotated_token() {
    let pki = pki("cluster CA");
    let (port, rx) = api_server(Some(&pki), 200, "");
    let sa = service_account("pod", "tok-1", &pki);
    let lookup = env(&in_pod(port));
    let g = gather(&k8s(&sa.0), &Preset::Oci, "gpu-a", &lookup).unwrap();
    assert_eq!(g.labels["rack"], "r7");
    assert_eq!(g.labels["oci.oraclecloud.com/rdma.local_block_id"], "lb1");
    assert!(
        g.notes[0].contains(&format!("https://127.0.0.1:{port}"))
            && g.notes[0].contains("service account"),
        "{:?}",
        g.notes
    );
    // The kubelet rotates the token: the next call sends the new one.
    sa.write("token", "tok-2");
    gather(&k8s(&sa.0), &Preset::Oci, "gpu-a", &lookup).unwrap();
    let seen = requests(&rx);
    assert_eq!(seen.len(), 2, "{seen:?}");
    for ((head, _), token) in seen.iter().zip(["tok-1", "tok-2"]) {
        assert!(head[0].starts_with("GET /api/v1/nodes/gpu-a "), "{head:?}");
        assert_eq!(
            header(head, "authorization"),
            Some(&*format!("Bearer {token}")),
            "{head:?}"
        );
    }
}

#[test]
fn a_server_the_clusters_ca_did_not_sign_is_refused_before_the_token_is_sent() {
    let ours = pki("the cluster's CA");
    let theirs = pki("somebody else's CA");
    let (port, rx) = api_server(Some(&theirs), 200, "");
    let sa = service_account("wrong-ca", "secret-token", &ours);
    let e = gather(&k8s(&sa.0), &Preset::Oci, "gpu-a", &env(&in_pod(port))).unwrap_err();
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(
        msg.contains("get nodes/gpu-a") && msg.to_lowercase().contains("certificate"),
        "{msg}"
    );
    // The handshake failed: the server never read a request, so never saw the token. (The
    // server learns of the failure after the client does: wait for its record.)
    let first = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the server recorded the failed handshake");
    let seen: Vec<_> = std::iter::once(first).chain(rx.try_iter()).collect();
    assert!(seen.iter().all(|r| r.is_err()), "{seen:?}");
}

#[test]
fn a_pod_without_a_token_or_outside_any_cluster_is_told_what_to_do() {
    let pki = pki("cluster CA");
    let sa = Dir::new("no-token");
    sa.write("ca.crt", &pki.ca_pem);
    let e = gather(&k8s(&sa.0), &Preset::Oci, "gpu-a", &env(&in_pod(1))).unwrap_err();
    assert!(
        e.to_string().contains("automountServiceAccountToken"),
        "{e}"
    );
    let nowhere = Dir::new("home");
    let e = gather(
        &k8s(&sa.0),
        &Preset::Oci,
        "gpu-a",
        &env(&[("HOME", nowhere.0.display().to_string())]),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("KUBERNETES_SERVICE_HOST") && msg.contains("kubeconfig"),
        "{msg}"
    );
}

fn kubeconfig(dir: &Dir, server: &str, ca: &Path, user: &str) -> PathBuf {
    dir.write(
        "config",
        &format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: gpu\n\
             clusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
             contexts:\n- name: gpu\n  context:\n    cluster: c\n    user: u\n\
             users:\n- name: u\n  user:\n{user}",
            ca.display()
        ),
    )
}

#[test]
fn outside_a_pod_the_kubeconfigs_current_context_with_a_token_or_an_exec_plugin() {
    let pki = pki("cluster CA");
    let (port, rx) = api_server(Some(&pki), 200, "");
    let dir = Dir::new("kubeconfig");
    let ca = dir.write("ca.pem", &pki.ca_pem);
    let server = format!("https://127.0.0.1:{port}");
    let sa = Dir::new("unused-sa");

    let path = kubeconfig(&dir, &server, &ca, "    token: kc-token\n");
    let lookup = env(&[("KUBECONFIG", path.display().to_string())]);
    let g = gather(&k8s(&sa.0), &Preset::Oci, "gpu-a", &lookup).unwrap();
    assert_eq!(g.labels["rack"], "r7");
    assert!(g.notes[0].contains("context \"gpu\""), "{:?}", g.notes);

    // An exec credential plugin, as `oci ce cluster generate-token` and `aws eks get-token`
    // are wired into the kubeconfigs their CLIs write.
    let plugin = dir.write(
        "plugin.sh",
        "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\
         \"kind\":\"ExecCredential\",\"status\":{\"token\":\"exec-token\"}}'\n",
    );
    let exec = format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: /bin/sh\n      args: [\"{}\"]\n      interactiveMode: Never\n",
        plugin.display()
    );
    let path = kubeconfig(&dir, &server, &ca, &exec);
    let lookup = env(&[("KUBECONFIG", path.display().to_string())]);
    gather(&k8s(&sa.0), &Preset::Oci, "gpu-a", &lookup).unwrap();

    let seen = requests(&rx);
    let tokens: Vec<Option<&str>> = seen
        .iter()
        .map(|(h, _)| header(h, "authorization"))
        .collect();
    assert_eq!(
        tokens,
        [Some("Bearer kc-token"), Some("Bearer exec-token")],
        "{seen:?}"
    );
}

#[test]
fn redirects_are_not_followed() {
    let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
    elsewhere.set_nonblocking(true).unwrap();
    let to = format!("http://{}/steal", elsewhere.local_addr().unwrap());
    let (port, rx) = serve_many(None, move |_| {
        format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .into_bytes()
    });
    let sa = Dir::new("redirect");
    sa.write("token", "t0k");
    let cfg = SourceConfig {
        k8s_url: Some(format!("http://127.0.0.1:{port}")),
        ..k8s(&sa.0)
    };
    // kube-rs reads the 307 as a failed call (its body is no Status): an error, not a hop.
    let e = gather(&cfg, &Preset::Oci, "gpu-a", &env(&[])).unwrap_err();
    assert!(e.to_string().contains("get nodes/gpu-a"), "{e}");
    assert!(!requests(&rx).is_empty());
    assert!(
        elsewhere.accept().is_err(),
        "the redirect was followed, and the token with it"
    );
}

fn status(code: u16, reason: &str, message: &str) -> &'static str {
    Box::leak(
        format!(
            r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"{message}","reason":"{reason}","code":{code}}}"#
        )
        .into_boxed_str(),
    )
}

#[test]
fn what_401_403_and_404_say_to_a_reader() {
    let sa = Dir::new("statuses");
    sa.write("token", "t0k");
    let run = |code: u16, body: &'static str| {
        let (port, _rx) = api_server(None, code, body);
        let cfg = SourceConfig {
            k8s_url: Some(format!("http://127.0.0.1:{port}")),
            ..k8s(&sa.0)
        };
        let e = gather(&cfg, &Preset::Oci, "gpu-a", &env(&[]))
            .unwrap_err()
            .to_string();
        eprintln!("{code}: {e}");
        e
    };
    let e = run(401, status(401, "Unauthorized", "Unauthorized"));
    assert!(
        e.contains("HTTP 401") && e.contains("not authenticated") && e.contains("token"),
        "{e}"
    );
    let forbidden = r#"nodes \"gpu-a\" is forbidden: User \"system:serviceaccount:gates:busbw\" cannot get resource \"nodes\""#;
    let e = run(403, status(403, "Forbidden", forbidden));
    assert!(
        e.contains("HTTP 403")
            && e.contains("busbw-node-reader")
            && e.contains("k8s/rbac")
            && e.contains("system:serviceaccount:gates:busbw"),
        "{e}"
    );
    let e = run(404, status(404, "NotFound", r#"nodes \"gpu-a\" not found"#));
    assert!(
        e.contains("no node named \"gpu-a\"") && e.contains("NODE_NAME"),
        "{e}"
    );
}

#[test]
fn hypernodes_through_the_api_and_a_cluster_without_them() {
    const HYPERNODES: &str = r#"{"apiVersion":"topology.volcano.sh/v1alpha1","kind":"HyperNodeList","metadata":{},"items":[
      {"apiVersion":"topology.volcano.sh/v1alpha1","kind":"HyperNode","metadata":{"name":"leaf-a"},"spec":{"tier":1,"members":[
        {"type":"Node","selector":{"labelMatch":{"matchLabels":{"rack":"r7"}}}}]}},
      {"apiVersion":"topology.volcano.sh/v1alpha1","kind":"HyperNode","metadata":{"name":"spine"},"spec":{"tier":2,"members":[
        {"type":"HyperNode","selector":{"exactMatch":{"name":"leaf-a"}}}]}}]}"#;
    let sa = Dir::new("hypernodes");
    sa.write("token", "t0k");
    for (hypernodes, tiers) in [(Some(HYPERNODES), 2), (None, 0)] {
        let (port, rx) = serve_many(None, move |(head, _)| {
            if head[0].contains("/hypernodes") {
                match hypernodes {
                    Some(h) => json_reply(200, h),
                    None => json_reply(
                        404,
                        status(
                            404,
                            "NotFound",
                            "the server could not find the requested resource",
                        ),
                    ),
                }
            } else {
                json_reply(200, NODE)
            }
        });
        let cfg = SourceConfig {
            k8s_url: Some(format!("http://127.0.0.1:{port}")),
            ..k8s(&sa.0)
        };
        let g = gather(&cfg, &Preset::Volcano, "gpu-a", &env(&[])).unwrap();
        let seen = requests(&rx);
        assert!(
            seen.iter().any(|(h, _)| h[0].starts_with("GET /apis/topology.volcano.sh/v1alpha1/hypernodes")),
            "{seen:?}"
        );
        if tiers == 2 {
            assert_eq!(g.labels["topology.volcano.sh/tier-1"], "leaf-a", "{g:?}");
            assert_eq!(g.labels["topology.volcano.sh/tier-2"], "spine", "{g:?}");
        } else {
            assert!(g.notes[0].contains("no HyperNode API"), "{g:?}");
            assert_eq!(g.labels["rack"], "r7");
        }
    }
}

#[test]
fn node_patches_and_what_a_labeler_is_told() {
    let sa = Dir::new("patch");
    sa.write("token", "t0k");
    let label: NodeLabel = "busbw.dev/fabric-ok=true".parse().unwrap();
    let p = patches(&label, &["gpu-a".into(), "gpu-b".into()], &["gpu-c".into()]);
    // The API server answers a patch with the whole object; busbw does not need it.
    let (port, rx) = serve_many(None, |_| json_reply(200, "{}"));
    let cfg = SourceConfig {
        k8s_url: Some(format!("http://127.0.0.1:{port}")),
        ..k8s(&sa.0)
    };
    let done = apply(&cfg, &p, &env(&[])).unwrap();
    assert_eq!(
        done,
        [
            "labelled node gpu-a",
            "labelled node gpu-b",
            "unlabelled node gpu-c"
        ]
    );
    let seen = requests(&rx);
    assert_eq!(seen.len(), 3);
    let (head, body) = &seen[2];
    assert!(head[0].starts_with("PATCH /api/v1/nodes/gpu-c"), "{head:?}");
    assert_eq!(
        header(head, "content-type"),
        Some("application/merge-patch+json")
    );
    assert_eq!(header(head, "authorization"), Some("Bearer t0k"));
    assert_eq!(
        body,
        br#"{"metadata":{"labels":{"busbw.dev/fabric-ok":null}}}"#
    );

    // 403 names the labeler's RBAC and stops (every node would get the same answer).
    let (port, rx) = serve_many(None, |_| {
        json_reply(403, status(403, "Forbidden", "cannot patch resource nodes"))
    });
    let cfg = SourceConfig {
        k8s_url: Some(format!("http://127.0.0.1:{port}")),
        ..k8s(&sa.0)
    };
    let e = apply(&cfg, &p, &env(&[])).unwrap_err();
    assert!(
        e.contains("3 of 3") && e.contains("busbw-node-labeler") && e.contains("k8s/rbac-labeler"),
        "{e}"
    );
    assert_eq!(requests(&rx).len(), 1);
}
