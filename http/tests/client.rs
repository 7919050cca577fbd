//! The client against servers made in the tests: https with a CA made here (the right CA
//! accepted, another refused), redirects not followed (the token stays with the endpoint it
//! was meant for), bounded bodies, timeouts.

// The servers other crates' tests get from feature test-support, compiled in here directly.
#[path = "../src/testing.rs"]
#[allow(dead_code)]
mod testing;

use busbw_http::{get, request, Body, HttpError, MAX_BODY};
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use testing::{pki, serve_http, serve_https};

const T: Duration = Duration::from_secs(20);

/// A scratch file for a CA bundle, removed when dropped.
struct File(PathBuf);
impl File {
    fn new(tag: &str, text: &str) -> File {
        let p = std::env::temp_dir().join(format!("busbw-http-{}-{tag}.pem", std::process::id()));
        std::fs::write(&p, text).unwrap();
        File(p)
    }
}
impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn https_against_the_given_ca_sends_method_headers_and_body() {
    let pki = pki("busbw test CA");
    let ca = File::new("ca", &pki.ca_pem);
    let (port, server) = serve_https(
        &pki,
        b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".to_vec(),
    );
    let url = format!("https://127.0.0.1:{port}/api/v1/nodes/n1");
    let body = Body {
        content_type: "application/merge-patch+json",
        bytes: br#"{"a":"q\"uote"}"#,
    };
    let r = request(
        "PATCH",
        &url,
        &[("Authorization", "Bearer t0k")],
        Some(body),
        Some(&ca.0),
        T,
    )
    .unwrap();
    assert_eq!((r.status, r.body.as_slice()), (201, &b"ok"[..]));
    let (head, body) = server.join().unwrap().unwrap();
    assert_eq!(head[0], "PATCH /api/v1/nodes/n1 HTTP/1.1");
    let has = |h: &str| head.iter().any(|l| l.eq_ignore_ascii_case(h));
    assert!(has("Authorization: Bearer t0k"), "{head:?}");
    assert!(
        has("Content-Type: application/merge-patch+json"),
        "{head:?}"
    );
    assert_eq!(body, br#"{"a":"q\"uote"}"#);
}

#[test]
fn a_server_another_ca_signed_is_refused_before_the_token_is_sent() {
    let ours = pki("the cluster's CA");
    let theirs = pki("somebody else's CA");
    let ca = File::new("ours", &ours.ca_pem);
    let (port, server) = serve_https(&theirs, b"HTTP/1.1 200 OK\r\n\r\n".to_vec());
    let url = format!("https://127.0.0.1:{port}/api/v1/nodes/n1");
    let e = get(&url, &[("Authorization", "Bearer t0k")], Some(&ca.0), T).unwrap_err();
    assert!(matches!(e, HttpError::Transport { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&url) && text.contains("UnknownIssuer"),
        "{text}"
    );
    // The handshake failed, so the server never read a request.
    assert!(server.join().unwrap().is_err());
}

#[test]
fn redirects_are_answers_not_followed() {
    let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
    elsewhere.set_nonblocking(true).unwrap();
    let to = format!("http://{}/steal", elsewhere.local_addr().unwrap());
    let (port, server) = serve_http(
        format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n")
            .into_bytes(),
    );
    let r = get(
        &format!("http://127.0.0.1:{port}/metrics"),
        &[("Authorization", "Bearer t0k")],
        None,
        T,
    )
    .unwrap();
    assert_eq!(r.status, 307);
    server.join().unwrap().unwrap();
    assert!(
        elsewhere.accept().is_err(),
        "the redirect was followed, and the token with it"
    );
}

#[test]
fn bodies_over_the_limit_are_refused() {
    let mut reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
        MAX_BODY + 1
    )
    .into_bytes();
    reply.resize(reply.len() + MAX_BODY + 1, b'x');
    let (port, server) = serve_http(reply);
    let e = get(&format!("http://127.0.0.1:{port}/"), &[], None, T).unwrap_err();
    assert!(matches!(e, HttpError::TooLarge { .. }), "{e:?}");
    // The client stopped reading; the server's write may fail, which is fine.
    let _ = server.join().unwrap();
}

#[test]
fn a_silent_server_times_out() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hold = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let started = Instant::now();
    let e = get(
        &format!("http://127.0.0.1:{port}/"),
        &[],
        None,
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(matches!(e, HttpError::Transport { .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{e}");
    hold.join().unwrap();
}

#[test]
fn bad_urls_and_ca_bundles_are_named() {
    let e = get("ftp://x/", &[], None, T).unwrap_err().to_string();
    assert!(e.contains("only http:// and https://"), "{e}");
    let junk = File::new("junk", "not a certificate\n");
    let e = get("https://127.0.0.1:1/", &[], Some(&junk.0), T).unwrap_err();
    assert!(matches!(e, HttpError::Ca { .. }), "{e:?}");
    assert!(e.to_string().contains(&junk.0.display().to_string()), "{e}");
    let e = get(
        "https://127.0.0.1:1/",
        &[],
        Some(&junk.0.with_extension("missing")),
        T,
    )
    .unwrap_err();
    assert!(matches!(e, HttpError::Ca { .. }), "{e:?}");
}

/// RFC 7617's own example.
#[test]
fn basic_auth_is_rfc_7617s() {
    assert_eq!(
        busbw_http::basic_auth("Aladdin", "open sesame"),
        "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
    );
}
