//! `--push-gateway URL`: PUT the Prometheus exposition to a Pushgateway, for jobs that end
//! before any scraper could see them (batch benchmarks).
//!
//! A plain HTTP/1.1 client over `std::net`: the Pushgateway speaks HTTP, the body is one small
//! text document, and an HTTP stack (with TLS, a runtime) would be most of the binary. For
//! `https://` put a proxy in front, as Pushgateway deployments usually have.

use crate::run::RunRecord;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Where to push and under which grouping key (`job`, `instance` = rank 0's host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushGateway {
    pub host: String,
    pub port: u16,
    /// Path prefix of the gateway (usually empty).
    pub base: String,
    pub job: String,
    pub timeout: Duration,
}

impl PushGateway {
    /// Parses `http://host[:port][/prefix]`; the port defaults to the Pushgateway's 9091.
    pub fn parse(url: &str, job: &str) -> Result<PushGateway, String> {
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if url.starts_with("https://") {
            return Err(format!(
                "--push-gateway {url}: https is not supported; give the gateway's plain http:// address (port 9091 by default) or a proxy in front of it"
            ));
        } else {
            return Err(format!("--push-gateway {url}: expected http://HOST[:PORT]"));
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
            _ => (authority, 9091),
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

    /// Replaces this job's group on the gateway with `run`'s metrics.
    pub fn push(&self, run: &RunRecord) -> io::Result<()> {
        let body = super::prometheus::render(run, &self.job);
        let instance = run.world.hosts.first().map_or("", |h| h.as_str());
        let path = self.path(instance);
        let what = format!("pushing to http://{}:{}{path}", self.host, self.port);
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(ctx)?
            .next()
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{what}: no address"))
            })?;
        let mut s = TcpStream::connect_timeout(&addr, self.timeout).map_err(ctx)?;
        s.set_read_timeout(Some(self.timeout)).map_err(ctx)?;
        s.set_write_timeout(Some(self.timeout)).map_err(ctx)?;
        let req = format!(
            "PUT {path} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: busbw/{}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.host,
            self.port,
            run.versions.busbw,
            body.len()
        );
        s.write_all(req.as_bytes()).map_err(ctx)?;
        s.write_all(body.as_bytes()).map_err(ctx)?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).map_err(ctx)?;
        let text = String::from_utf8_lossy(&resp);
        let status = text
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse::<u16>().ok());
        match status {
            Some(c) if (200..300).contains(&c) => Ok(()),
            Some(c) => {
                let body = text.split("\r\n\r\n").nth(1).unwrap_or("").trim();
                Err(io::Error::other(format!("{what}: HTTP {c}: {body}")))
            }
            None => Err(io::Error::other(format!("{what}: no HTTP response"))),
        }
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
    use std::io::{BufRead, BufReader};
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
        assert!(PushGateway::parse("https://pgw", "j")
            .unwrap_err()
            .contains("https"));
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
