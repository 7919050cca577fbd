//! The HTTP client busbw uses for the services around a job: the cloud's instance metadata
//! and a Prometheus Pushgateway (the Kubernetes API goes through kube-rs, in launchers). ureq
//! over rustls, so `https://` works in any image, with no curl and no system TLS library, and
//! a bearer token or password never shows in a process list.
//!
//! A request either gets a response (any status: the caller knows what a 403 or a 404 means
//! for its service) or an [`HttpError`] that names the method and URL. Redirects are never
//! followed: every caller talks to one configured endpoint, and following a redirect would
//! carry its bearer token wherever the server pointed. Bodies are bounded ([`MAX_BODY`]).

#[cfg(feature = "test-support")]
pub mod testing;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Largest response body accepted: node objects and metadata documents are kilobytes, a
/// Pushgateway answers with a line.
pub const MAX_BODY: usize = 16 << 20;

/// A response: status code and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// A request body and its media type.
pub struct Body<'a> {
    pub content_type: &'a str,
    pub bytes: &'a [u8],
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{method} {url}: only http:// and https:// URLs are supported")]
    Scheme { method: String, url: String },
    #[error("{method} {url}: CA bundle {}: {reason}", path.display())]
    Ca {
        method: String,
        url: String,
        path: PathBuf,
        reason: String,
    },
    #[error("{method} {url}: {reason}")]
    Transport {
        method: String,
        url: String,
        reason: String,
    },
    #[error("{method} {url}: the response body is over {MAX_BODY} bytes")]
    TooLarge { method: String, url: String },
}

/// `method` on `url` with extra `headers` and an optional body, giving up after `timeout`
/// (connect, send and receive together). An `https://` server is verified against `ca_file`
/// when given, else against `SSL_CERT_FILE` when set, else against the Mozilla roots built
/// in.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Body>,
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<Response, HttpError> {
    let transport = |reason: String| HttpError::Transport {
        method: method.into(),
        url: url.into(),
        reason,
    };
    let https = url.starts_with("https://");
    if !https && !url.starts_with("http://") {
        return Err(HttpError::Scheme {
            method: method.into(),
            url: url.into(),
        });
    }
    let mut agent = ureq::AgentBuilder::new()
        .timeout(timeout)
        .redirects(0)
        .user_agent(concat!("busbw/", env!("CARGO_PKG_VERSION")));
    let env_ca = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    if let Some(ca) = ca_file.or(env_ca.as_deref()).filter(|_| https) {
        let config = client_config(ca).map_err(|reason| HttpError::Ca {
            method: method.into(),
            url: url.into(),
            path: ca.to_path_buf(),
            reason,
        })?;
        agent = agent.tls_config(Arc::new(config));
    }
    let mut req = agent
        .build()
        .request(method, url)
        .set("Accept", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let sent = match body {
        Some(b) => req.set("Content-Type", b.content_type).send_bytes(b.bytes),
        None => req.call(),
    };
    let resp = match sent {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(ureq::Error::Transport(t)) => return Err(transport(describe(&t))),
    };
    let status = resp.status();
    let mut body = Vec::new();
    resp.into_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| transport(format!("reading the response: {e}")))?;
    if body.len() > MAX_BODY {
        return Err(HttpError::TooLarge {
            method: method.into(),
            url: url.into(),
        });
    }
    Ok(Response { status, body })
}

/// What went wrong, without the URL (the error names it once already).
fn describe(t: &ureq::Transport) -> String {
    use ureq::ErrorKind as K;
    let what = match t.kind() {
        K::Dns => "cannot resolve the host".to_string(),
        K::ConnectionFailed => "cannot connect".to_string(),
        K::Io => "the connection failed".to_string(),
        K::BadStatus | K::BadHeader => "not an HTTP/1.x response".to_string(),
        k => k.to_string(),
    };
    let mut out = what;
    if let Some(m) = t.message() {
        out.push_str(&format!(": {m}"));
    }
    if let Some(e) = std::error::Error::source(t) {
        out.push_str(&format!(" ({e})"));
    }
    out
}

/// The `Authorization` header value of HTTP basic auth (RFC 7617, UTF-8).
pub fn basic_auth(user: &str, password: &str) -> String {
    use base64::Engine;
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// GET `url`, as [`request`] does it.
pub fn get(
    url: &str,
    headers: &[(&str, &str)],
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<Response, HttpError> {
    request("GET", url, headers, None, ca_file, timeout)
}

/// The certificates of the PEM bundle at `path` (DER), for a trust store: a reason when it
/// cannot be read or holds none. The Kubernetes client reads the cluster's CA with it too.
pub fn pem_certificates(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    Ok(certificates(path)?
        .into_iter()
        .map(|c| c.as_ref().to_vec())
        .collect())
}

fn certificates(path: &Path) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate bundle ({e})"))?;
    if certs.is_empty() {
        return Err("no certificates in it".into());
    }
    Ok(certs)
}

/// A client configuration that trusts the certificates of the PEM bundle at `path` and
/// nothing else (a cluster's API server is signed by the cluster's own CA).
fn client_config(path: &Path) -> Result<rustls::ClientConfig, String> {
    let certs = certificates(path)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| format!("a certificate in it was refused ({e})"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
