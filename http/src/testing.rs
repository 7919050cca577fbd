//! Servers for tests (feature `test-support`; busbw-http's own tests include this file): a CA
//! made on the spot and loopback servers, plain or https with that CA's certificate, that
//! record what they were sent. Not for production: no limits, no timeouts.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A CA and a server certificate it signed for 127.0.0.1 and localhost.
pub struct Pki {
    pub ca_pem: String,
    pub server_der: CertificateDer<'static>,
    pub server_key: PrivateKeyDer<'static>,
}

/// A fresh CA named `name` and its server certificate.
pub fn pki(name: &str) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, name);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        server_der: leaf.der().clone(),
        server_key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}

/// What a server saw: the request head's lines and the body.
pub type Seen = (Vec<String>, Vec<u8>);

/// The value of header `name` (any case) in a request head.
pub fn header<'a>(head: &'a [String], name: &str) -> Option<&'a str> {
    head.iter().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// Reads one request (head and a `Content-Length` body) from `r`.
fn read_request(r: &mut impl BufRead) -> std::io::Result<Seen> {
    let mut head = Vec::new();
    let mut len = 0;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        head.push(line.trim_end().to_string());
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok((head, body))
}

/// Reads one request from `s`, hands it to `seen` (before answering: a client that has its
/// answer finds the request already recorded), and answers what `reply` makes of it.
fn exchange_with(
    s: &mut (impl Read + Write),
    reply: impl FnOnce(&Seen) -> Vec<u8>,
    seen: impl FnOnce(&Seen),
) -> std::io::Result<Seen> {
    let request = read_request(&mut BufReader::new(&mut *s))?;
    seen(&request);
    s.write_all(&reply(&request))?;
    s.flush()?;
    Ok(request)
}

/// Reads one request from `s`; `reply` makes the whole answer from it.
pub fn exchange(
    s: &mut (impl Read + Write),
    reply: impl FnOnce(&Seen) -> Vec<u8>,
) -> std::io::Result<Seen> {
    exchange_with(s, reply, |_| {})
}

/// A one-request plain http server answering `reply`.
pub fn serve_http(reply: Vec<u8>) -> (u16, JoinHandle<std::io::Result<Seen>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept()?;
        exchange(&mut s, |_| reply)
    });
    (port, h)
}

fn server_config(pki: &Pki) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![pki.server_der.clone()], pki.server_key.clone_key())
            .unwrap(),
    )
}

/// A one-request https server with `pki`'s certificate answering `reply`.
pub fn serve_https(pki: &Pki, reply: Vec<u8>) -> (u16, JoinHandle<std::io::Result<Seen>>) {
    let config = server_config(pki);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept()?;
        let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, s);
        exchange(&mut tls, |_| reply)
    });
    (port, h)
}

/// A server for as many requests as come, one per connection (`https` with `pki`'s
/// certificate when given), answering each with `respond(request)`; every request (or TLS
/// failure, as an `Err`) comes back through the channel, before its answer is sent.
pub fn serve_many(
    pki: Option<&Pki>,
    respond: impl Fn(&Seen) -> Vec<u8> + Send + 'static,
) -> (u16, mpsc::Receiver<std::io::Result<Seen>>) {
    let config = pki.map(server_config);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut recorded = false;
            let record = |r: &Seen| {
                recorded = true;
                let _ = tx.send(Ok(r.clone()));
            };
            let done = match &config {
                Some(c) => rustls::ServerConnection::new(c.clone())
                    .map_err(std::io::Error::other)
                    .and_then(|conn| {
                        exchange_with(&mut rustls::StreamOwned::new(conn, s), &respond, record)
                    }),
                None => exchange_with(&mut s, &respond, record),
            };
            // A failure before a request was read (a refused handshake) is recorded too.
            if let (Err(e), false) = (done, recorded) {
                if tx.send(Err(e)).is_err() {
                    return;
                }
            }
        }
    });
    (port, rx)
}

/// An HTTP/1.1 answer with a JSON body that closes the connection.
pub fn json_reply(status: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
