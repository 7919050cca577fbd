//! A minimal HTTP/1.1 client over std's TcpStream, for the two label sources that ask a local
//! service (instance metadata; the Kubernetes API through `kubectl proxy` or a test stand-in)
//! and for the node labels `busbw tiers --label-nodes` writes (PATCH).
//! HTTPS goes through `curl` (see [`get`]): a TLS stack in the default build would need a C
//! toolchain or pull a large dependency tree for one request per rank.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A response: status code and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Largest body accepted: node objects and metadata documents are kilobytes.
const MAX_BODY: usize = 16 << 20;

/// GET `url` with extra `headers`. `http://` is spoken directly; `https://` runs `curl` with
/// the request on its standard input (so a bearer token never shows in the process list),
/// verifying the server against `ca_file` when given.
pub fn get(
    url: &str,
    headers: &[(&str, &str)],
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<Response, String> {
    request("GET", url, headers, None, ca_file, timeout)
}

/// A request body and its media type.
pub struct Body<'a> {
    pub content_type: &'a str,
    pub bytes: &'a [u8],
}

/// `method` on `url`, as [`get`] does it, with an optional body.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Body>,
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<Response, String> {
    if let Some(rest) = url.strip_prefix("http://") {
        return request_plain(method, rest, headers, body, timeout)
            .map_err(|e| format!("{method} {url}: {e}"));
    }
    if url.starts_with("https://") {
        return request_curl(method, url, headers, body, ca_file, timeout)
            .map_err(|e| format!("{method} {url}: {e}"));
    }
    Err(format!(
        "{method} {url}: only http:// and https:// URLs are supported"
    ))
}

fn request_plain(
    method: &str,
    rest: &str,
    headers: &[(&str, &str)],
    body: Option<Body>,
    timeout: Duration,
) -> Result<Response, String> {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err("no host in the URL".into());
    }
    let target = if authority
        .rsplit(':')
        .next()
        .is_some_and(|p| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let deadline = Instant::now() + timeout;
    let addrs: Vec<_> = target
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {authority}: {e}"))?
        .collect();
    let mut last = String::from("no address");
    let mut stream = None;
    for a in &addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(a, left) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    let mut s = stream.ok_or_else(|| format!("cannot connect ({last})"))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(left)).map_err(|e| e.to_string())?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/json\r\n\
         User-Agent: busbw\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = &body {
        req.push_str(&format!(
            "Content-Type: {}\r\nContent-Length: {}\r\n",
            b.content_type,
            b.bytes.len()
        ));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    if let Some(b) = &body {
        bytes.extend_from_slice(b.bytes);
    }
    s.write_all(&bytes).map_err(|e| format!("sending: {e}"))?;
    let mut raw = Vec::new();
    s.take(MAX_BODY as u64 + 64 * 1024)
        .read_to_end(&mut raw)
        .map_err(|e| format!("reading the response: {e}"))?;
    parse_response(&raw)
}

/// Status line, headers, then a body framed by Content-Length, chunked encoding, or the end
/// of the connection.
pub(crate) fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the response has no complete header")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x response: {status_line:?}"));
    }
    let status: u16 = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "content-length" {
            length = Some(
                v.parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {v:?}"))?,
            );
        } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        if rest.len() < n {
            return Err(format!("body cut short: {} of {n} bytes", rest.len()));
        }
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    if body.len() > MAX_BODY {
        return Err(format!("body over {MAX_BODY} bytes"));
    }
    Ok(Response { status, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunked body cut short")?;
        let size_s = String::from_utf8_lossy(&rest[..eol]);
        let size_s = size_s.split(';').next().unwrap_or("").trim().to_string();
        let size =
            usize::from_str_radix(&size_s, 16).map_err(|_| format!("bad chunk size {size_s:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 || out.len() + size > MAX_BODY {
            return Err("chunked body cut short or too large".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// curl config syntax: a double-quoted string with `\` and `"` escaped.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn request_curl(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Body>,
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<Response, String> {
    let mut cfg = format!(
        "url = {}\nrequest = {}\nsilent\nshow-error\nmax-time = {}\nwrite-out = \"\\n%{{http_code}}\"\n",
        quoted(url),
        quoted(method),
        timeout.as_secs().max(1)
    );
    for (k, v) in headers {
        cfg.push_str(&format!("header = {}\n", quoted(&format!("{k}: {v}"))));
    }
    if let Some(b) = &body {
        let text = std::str::from_utf8(b.bytes)
            .map_err(|_| "curl is given text bodies only".to_string())?;
        cfg.push_str(&format!(
            "header = {}\ndata-binary = {}\n",
            quoted(&format!("Content-Type: {}", b.content_type)),
            quoted(text)
        ));
    }
    if let Some(ca) = ca_file {
        cfg.push_str(&format!("cacert = {}\n", quoted(&ca.to_string_lossy())));
    }
    let mut child = Command::new("curl")
        .args(["--config", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "https needs curl, which could not be run ({e}); install curl, or run \
                 `kubectl proxy` beside busbw and give its http:// URL"
            )
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(cfg.as_bytes())
            .map_err(|e| format!("talking to curl: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "curl failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut body = out.stdout;
    let nl = body.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    let status = String::from_utf8_lossy(&body[nl..])
        .trim()
        .parse()
        .unwrap_or(0);
    body.truncate(nl);
    Ok(Response { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_chunked_and_close_framed_bodies() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}xx").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"{}"[..]));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, b"abcde");
        let r = parse_response(b"HTTP/1.0 404 Not Found\r\n\r\nnope").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"nope"[..]));
        assert!(parse_response(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
    }

    /// The https path's curl configuration, exercised over plain http (curl speaks both).
    #[test]
    fn curl_sends_method_headers_and_body() {
        use std::io::{BufRead, BufReader};
        if Command::new("curl").arg("--version").output().is_err() {
            eprintln!("skipping curl_sends_method_headers_and_body: curl is not installed");
            return;
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/api/v1/nodes/n1", l.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_string());
            }
            let mut body = vec![0; 15];
            r.read_exact(&mut body).unwrap();
            s.write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
                .unwrap();
            (head, body)
        });
        let body = Body {
            content_type: "application/merge-patch+json",
            bytes: br#"{"a":"q\"uote"}"#,
        };
        let r = request_curl(
            "PATCH",
            &url,
            &[("Authorization", "Bearer t")],
            Some(body),
            None,
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (201, &b"ok"[..]));
        let (head, body) = server.join().unwrap();
        assert_eq!(head[0], "PATCH /api/v1/nodes/n1 HTTP/1.1");
        assert!(
            head.contains(&"Authorization: Bearer t".to_string()),
            "{head:?}"
        );
        assert!(
            head.contains(&"Content-Type: application/merge-patch+json".to_string()),
            "{head:?}"
        );
        assert_eq!(body, br#"{"a":"q\"uote"}"#);
    }

    #[test]
    fn refuses_other_schemes() {
        let e = get("ftp://x/", &[], None, Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("only http"), "{e}");
    }
}
