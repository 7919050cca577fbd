//! `--push-gateway URL`: PUT the Prometheus exposition to a Pushgateway, for jobs that end
//! before any scraper could see them (batch benchmarks). http or https (through `busbw-http`:
//! Pushgateways often sit behind an https ingress); the server is verified against
//! `SSL_CERT_FILE` when set, else the Mozilla roots. A gateway that asks for basic auth (its
//! own `--web.config.file`, or the ingress) gets the user named in the URL and the password
//! from [`PASSWORD_ENV`], so the secret comes from a Kubernetes Secret, not the command line.

use crate::run::RunRecord;
use busbw_http::Body;
use std::io;
use std::time::Duration;

/// The environment variable holding the basic-auth password of `--push-gateway
/// https://USER@HOST`.
pub const PASSWORD_ENV: &str = "BUSBW_PUSH_GATEWAY_PASSWORD";

/// Where to push and under which grouping key (`job`, `instance` = rank 0's host).
#[derive(Clone, PartialEq, Eq)]
pub struct PushGateway {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix of the gateway (usually empty).
    pub base: String,
    pub job: String,
    pub timeout: Duration,
    /// Basic-auth user and password.
    pub auth: Option<(String, String)>,
}

/// Never prints the password.
impl std::fmt::Debug for PushGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushGateway")
            .field("url", &self.url(""))
            .field("job", &self.job)
            .field("user", &self.auth.as_ref().map(|a| &a.0))
            .finish()
    }
}

impl PushGateway {
    /// Parses `http[s]://[user@]host[:port][/prefix]`; the port defaults to the
    /// Pushgateway's 9091 over http and to 443 over https (an ingress). `password` (the value
    /// of [`PASSWORD_ENV`]) goes with the user; a user with no password, or a password with no
    /// user, is an error rather than a push the gateway would refuse at the end of the run.
    pub fn parse(url: &str, job: &str, password: Option<&str>) -> Result<PushGateway, String> {
        let (https, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(format!(
                "--push-gateway {url}: expected http://HOST[:PORT] or https://HOST[:PORT]"
            ));
        };
        let (authority, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (user, authority) = match authority.rsplit_once('@') {
            Some((u, _)) if u.contains(':') => {
                return Err(format!(
                    "--push-gateway: put only the user in the URL (https://USER@HOST) and the \
                     password in {PASSWORD_ENV}: a password on the command line shows in every \
                     process list"
                ))
            }
            Some((u, a)) if !u.is_empty() => (Some(u), a),
            Some(_) => return Err(format!("--push-gateway {url}: empty user before '@'")),
            None => (None, authority),
        };
        let password = password.filter(|p| !p.is_empty());
        let auth = match (user, password) {
            (Some(u), Some(p)) => Some((u.to_string(), p.to_string())),
            (None, None) => None,
            (Some(u), None) => {
                return Err(format!(
                    "--push-gateway names user {u:?} but {PASSWORD_ENV} is not set: set it to \
                     the gateway's password (in Kubernetes, from a Secret)"
                ))
            }
            (None, Some(_)) => {
                return Err(format!(
                    "{PASSWORD_ENV} is set but --push-gateway {url} names no user: give \
                     http[s]://USER@HOST[:PORT]"
                ))
            }
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (
                h.trim_start_matches('[').trim_end_matches(']'),
                p.parse::<u16>()
                    .map_err(|_| format!("--push-gateway {url}: port {p:?} is not a number"))?,
            ),
            _ => (authority, if https { 443 } else { 9091 }),
        };
        if host.is_empty() {
            return Err(format!("--push-gateway {url}: no host"));
        }
        if job.is_empty() {
            return Err(
                "--prometheus-job must not be empty (it is the Pushgateway grouping key)".into(),
            );
        }
        Ok(PushGateway {
            https,
            host: host.into(),
            port,
            base: base.into(),
            job: job.into(),
            timeout: Duration::from_secs(10),
            auth,
        })
    }

    /// The request path: `/metrics/job/<job>/instance/<host>`.
    pub fn path(&self, instance: &str) -> String {
        format!(
            "{}/metrics/job/{}/instance/{}",
            self.base,
            segment(&self.job),
            segment(if instance.is_empty() {
                "unknown"
            } else {
                instance
            })
        )
    }

    /// The whole URL of `instance`'s group.
    pub fn url(&self, instance: &str) -> String {
        let scheme = if self.https { "https" } else { "http" };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("{scheme}://{host}:{}{}", self.port, self.path(instance))
    }

    /// Replaces this job's group on the gateway with `run`'s metrics.
    pub fn push(&self, run: &RunRecord) -> io::Result<()> {
        let body = super::prometheus::render(run, &self.job);
        let instance = run.world.hosts.first().map_or("", |h| h.as_str());
        let url = self.url(instance);
        let auth = self
            .auth
            .as_ref()
            .map(|(u, p)| busbw_http::basic_auth(u, p));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let r = busbw_http::request(
            "PUT",
            &url,
            &headers,
            Some(Body {
                content_type: "text/plain; version=0.0.4",
                bytes: body.as_bytes(),
            }),
            None,
            self.timeout,
        )
        .map_err(|e| io::Error::other(format!("pushing the metrics: {e}")))?;
        if (200..300).contains(&r.status) {
            return Ok(());
        }
        if r.status == 401 {
            let said = match &self.auth {
                Some((u, _)) => {
                    format!("user {u:?} and the password in {PASSWORD_ENV} were refused")
                }
                None => format!(
                    "it asks for credentials: give the user in the URL (https://USER@HOST) and \
                     the password in {PASSWORD_ENV}"
                ),
            };
            return Err(io::Error::other(format!(
                "pushing to {url}: HTTP 401: {said}"
            )));
        }
        Err(io::Error::other(format!(
            "pushing to {url}: HTTP {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body).trim()
        )))
    }
}

/// Percent-encodes a path segment (RFC 3986 unreserved characters pass).
fn segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    #[test]
    fn parses_urls() {
        let p = PushGateway::parse("http://pgw:9091", "nightly", None).unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.base.as_str()),
            ("pgw", 9091, "")
        );
        let p = PushGateway::parse("http://pgw/prefix/", "j", None).unwrap();
        assert_eq!((p.port, p.base.as_str()), (9091, "/prefix"));
        assert_eq!(
            p.path("node a/1"),
            "/prefix/metrics/job/j/instance/node%20a%2F1"
        );
        let p = PushGateway::parse("https://pgw.example/", "j", None).unwrap();
        assert_eq!((p.https, p.port), (true, 443));
        assert_eq!(
            p.url("n1"),
            "https://pgw.example:443/metrics/job/j/instance/n1"
        );
        assert!(PushGateway::parse("pgw:9091", "j", None)
            .unwrap_err()
            .contains("http://"));
        assert!(PushGateway::parse("http://pgw:x", "j", None)
            .unwrap_err()
            .contains("port"));
    }

    #[test]
    fn basic_auth_user_in_the_url_password_from_the_environment() {
        let p = PushGateway::parse("https://nightly@pgw.example:8443/x", "j", Some("pw")).unwrap();
        assert_eq!(p.auth, Some(("nightly".into(), "pw".into())));
        assert_eq!(
            (p.host.as_str(), p.port, p.base.as_str()),
            ("pgw.example", 8443, "/x")
        );
        // Neither the URL shown in messages nor Debug carries the password.
        assert_eq!(
            p.url("n"),
            "https://pgw.example:8443/x/metrics/job/j/instance/n"
        );
        assert!(!format!("{p:?}").contains("pw"), "{p:?}");
        let e = PushGateway::parse("https://u:pw@pgw", "j", None).unwrap_err();
        assert!(e.contains(PASSWORD_ENV) && !e.contains("pw@"), "{e}");
        let e = PushGateway::parse("https://u@pgw", "j", None).unwrap_err();
        assert!(e.contains(PASSWORD_ENV) && e.contains("\"u\""), "{e}");
        let e = PushGateway::parse("https://pgw", "j", Some("pw")).unwrap_err();
        assert!(e.contains("names no user"), "{e}");
        // An empty variable counts as unset.
        assert_eq!(
            PushGateway::parse("https://pgw", "j", Some(""))
                .unwrap()
                .auth,
            None
        );
    }

    /// A one-request HTTP server on loopback that answers `status` and returns the request.
    fn serve_once(status: &'static str) -> (u16, std::thread::JoinHandle<(String, String)>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut head = String::new();
            let mut len = 0;
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            let mut s = s;
            write!(s, "HTTP/1.1 {status}\r\nContent-Length: 7\r\n\r\nnope :(").unwrap();
            (head, String::from_utf8(body).unwrap())
        });
        (port, h)
    }

    #[test]
    fn pushes_the_exposition() {
        let (port, h) = serve_once("200 OK");
        let p = PushGateway::parse(&format!("http://127.0.0.1:{port}"), "nightly", None).unwrap();
        p.push(&sample::run()).unwrap();
        let (head, body) = h.join().unwrap();
        assert!(!head.contains("Authorization"), "{head}");
        assert!(
            head.starts_with("PUT /metrics/job/nightly/instance/node-a HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert_eq!(
            body,
            super::super::prometheus::render(&sample::run(), "nightly")
        );
    }

    #[test]
    fn gateway_errors_are_reported() {
        let (port, h) = serve_once("400 Bad Request");
        let p = PushGateway::parse(&format!("http://127.0.0.1:{port}"), "nightly", None).unwrap();
        let e = p.push(&sample::run()).unwrap_err().to_string();
        h.join().unwrap();
        assert!(e.contains("HTTP 400") && e.contains("nope"), "{e}");
        // Nothing listening: a connection error naming the gateway, not a hang.
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = dead.local_addr().unwrap().port();
        drop(dead);
        let p = PushGateway::parse(&format!("http://127.0.0.1:{port}"), "j", None).unwrap();
        let e = p.push(&sample::run()).unwrap_err().to_string();
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
