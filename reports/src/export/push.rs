//! `--push-gateway URL`: PUT the Prometheus exposition to a Pushgateway, for jobs that end
//! before any scraper could see them (batch benchmarks). http or https (through `busbw-http`:
//! Pushgateways often sit behind an https ingress); the server is verified against
//! `SSL_CERT_FILE` when set, else the Mozilla roots.

use crate::run::RunRecord;
use busbw_http::Body;
use std::io;
use std::time::Duration;

/// Where to push and under which grouping key (`job`, `instance` = rank 0's host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushGateway {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix of the gateway (usually empty).
    pub base: String,
    pub job: String,
    pub timeout: Duration,
}

impl PushGateway {
    /// Parses `http[s]://host[:port][/prefix]`; the port defaults to the Pushgateway's 9091
    /// over http and to 443 over https (an ingress).
    pub fn parse(url: &str, job: &str) -> Result<PushGateway, String> {
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
        let r = busbw_http::request(
            "PUT",
            &url,
            &[],
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
        let p = PushGateway::parse("http://pgw:9091", "nightly").unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.base.as_str()),
            ("pgw", 9091, "")
        );
        let p = PushGateway::parse("http://pgw/prefix/", "j").unwrap();
        assert_eq!((p.port, p.base.as_str()), (9091, "/prefix"));
        assert_eq!(
            p.path("node a/1"),
            "/prefix/metrics/job/j/instance/node%20a%2F1"
        );
        let p = PushGateway::parse("https://pgw.example/", "j").unwrap();
        assert_eq!((p.https, p.port), (true, 443));
        assert_eq!(
            p.url("n1"),
            "https://pgw.example:443/metrics/job/j/instance/n1"
        );
        assert!(PushGateway::parse("pgw:9091", "j")
            .unwrap_err()
            .contains("http://"));
        assert!(PushGateway::parse("http://pgw:x", "j")
            .unwrap_err()
            .contains("port"));
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
        let p = PushGateway::parse(&format!("http://127.0.0.1:{port}"), "nightly").unwrap();
        p.push(&sample::run()).unwrap();
        let (head, body) = h.join().unwrap();
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
        let p = PushGateway::parse(&format!("http://127.0.0.1:{port}"), "nightly").unwrap();
        let e = p.push(&sample::run()).unwrap_err().to_string();
        h.join().unwrap();
        assert!(e.contains("HTTP 400") && e.contains("nope"), "{e}");
        // Nothing listening: a connection error naming the gateway, not a hang.
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = dead.local_addr().unwrap().port();
        drop(dead);
        let p = PushGateway::parse(&format!("http://127.0.0.1:{port}"), "j").unwrap();
        let e = p.push(&sample::run()).unwrap_err().to_string();
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
