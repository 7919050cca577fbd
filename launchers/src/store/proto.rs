//! Wire format of the TCP store.
//!
//! Every connection opens with a challenge-response over the job token (see
//! [`busbw_transports::auth`]), so anything else that happens to connect to the port (an HTTP
//! probe, a port scanner, a client of another busbw build, a rank of another job that was
//! given the same port) is recognised and disconnected instead of being parsed as requests,
//! and nothing that crosses the wire can be replayed to get in:
//!
//! 1. client: 8-byte magic, big-endian u32 version, 16-byte client nonce;
//! 2. server: its magic and version and, when the versions match, a 16-byte server nonce and
//!    the server's proof `HMAC(key, server label, client nonce, server nonce)`: the client
//!    knows it reached its own job's store, not an impostor's;
//! 3. client: its proof `HMAC(key, client label, server nonce, client nonce)`;
//! 4. server: one status byte, [`HELLO_OK`] or [`HELLO_WRONG_TOKEN`].
//!
//! The server allows [`HELLO_TIMEOUT`](super::server) for all of it. Both sides read only the
//! 12-byte magic and version before anything version-specific, which is what lets builds
//! with different versions still tell each other so.
//!
//! After the hello every message is a frame: big-endian u32 body length, then the body. A
//! request body is an opcode byte and its fields; a response body is a status byte and its
//! fields. Byte strings are a u32 length and the bytes. One request is in flight per
//! connection, which is why a blocking client needs nothing but a mutex.

use super::{MAX_KEY_LEN, MAX_VALUE_LEN};
use busbw_transports::auth::{NONCE_LEN, PROOF_LEN};

pub const MAGIC: [u8; 8] = *b"BUSBWKV\0";
/// 2: the client hello carries a job-token digest and the server answers with a status byte.
/// 3: the digest is replaced by a mutual challenge-response.
pub const VERSION: u32 = 3;
/// Magic and version: the part of a hello every version shares.
pub const HELLO_LEN: usize = 12;
/// The client's whole hello in this version: magic, version, client nonce.
pub const CLIENT_HELLO_LEN: usize = HELLO_LEN + NONCE_LEN;
/// What the server sends after its magic and version: its nonce and its proof.
pub const SERVER_CHALLENGE_LEN: usize = NONCE_LEN + PROOF_LEN;

pub const HELLO_OK: u8 = 0;
pub const HELLO_WRONG_TOKEN: u8 = 1;

pub const OP_SET: u8 = 1;
pub const OP_GET: u8 = 2;
pub const OP_WAIT: u8 = 3;
pub const OP_ADD: u8 = 4;

pub const ST_OK: u8 = 0;
pub const ST_NOT_FOUND: u8 = 1;
pub const ST_TIMEOUT: u8 = 2;
pub const ST_BAD_VALUE: u8 = 3;
pub const ST_ERROR: u8 = 4;

/// Largest request body: a SET of the biggest key and value plus headers. A WAIT for many keys
/// must fit too, which bounds the number of keys one call can name.
pub const MAX_REQUEST: usize = MAX_VALUE_LEN + MAX_KEY_LEN + 64;
/// Largest response body a client accepts: a WAIT may return many values at once.
pub const MAX_RESPONSE: usize = 1 << 30;

/// The shared part of a hello: magic and version.
pub fn hello() -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..].copy_from_slice(&VERSION.to_be_bytes());
    h
}

/// What a client sends: the shared part, then its nonce.
pub fn client_hello(nonce: &[u8; NONCE_LEN]) -> [u8; CLIENT_HELLO_LEN] {
    let mut h = [0u8; CLIENT_HELLO_LEN];
    h[..HELLO_LEN].copy_from_slice(&hello());
    h[HELLO_LEN..].copy_from_slice(nonce);
    h
}

/// `None` if the bytes are not a busbw store hello at all, else the peer's version.
pub fn parse_hello(h: &[u8; HELLO_LEN]) -> Option<u32> {
    if h[..8] != MAGIC {
        return None;
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&h[8..]);
    Some(u32::from_be_bytes(v))
}

pub enum Request {
    Set { key: String, value: Vec<u8> },
    Get { key: String },
    Wait { keys: Vec<String>, timeout_ms: u64 },
    Add { key: String, delta: i64 },
}

/// Appends fields to a frame body.
#[derive(Default)]
pub struct Encoder {
    pub buf: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Self {
        // Reserve the frame length up front so the frame goes out in one write.
        Self { buf: vec![0; 4] }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        // Lengths were checked against the caps (all far below u32::MAX) by the caller.
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
        self
    }
    /// The finished frame: length prefix filled in.
    pub fn frame(mut self) -> Vec<u8> {
        let len = (self.buf.len() - 4) as u32;
        self.buf[..4].copy_from_slice(&len.to_be_bytes());
        self.buf
    }
}

/// Reads fields from a frame body; every read is bounds-checked because the body came from
/// the network.
pub struct Decoder<'a> {
    buf: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!(
                "truncated message: wanted {n} more bytes, {} left",
                self.buf.len()
            ));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    pub fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_be_bytes(self.array()?))
    }
    pub fn bytes(&mut self, cap: usize) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        if n > cap {
            return Err(format!("field of {n} bytes exceeds the {cap}-byte limit"));
        }
        self.take(n)
    }
    pub fn key(&mut self) -> Result<String, String> {
        let b = self.bytes(MAX_KEY_LEN)?;
        String::from_utf8(b.to_vec()).map_err(|_| "key is not UTF-8".to_string())
    }
    pub fn finish(&self) -> Result<(), String> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected trailing bytes", self.buf.len()))
        }
    }
}

pub fn decode_request(body: &[u8]) -> Result<Request, String> {
    let mut d = Decoder::new(body);
    let req = match d.u8()? {
        OP_SET => {
            let key = d.key()?;
            let value = d.bytes(MAX_VALUE_LEN)?.to_vec();
            Request::Set { key, value }
        }
        OP_GET => Request::Get { key: d.key()? },
        OP_WAIT => {
            let timeout_ms = d.u64()?;
            let n = d.u32()? as usize;
            // Each key costs at least its 4-byte length, so a count beyond that is a lie.
            if n > body.len() / 4 {
                return Err(format!(
                    "WAIT claims {n} keys in a {}-byte body",
                    body.len()
                ));
            }
            let keys = (0..n).map(|_| d.key()).collect::<Result<Vec<_>, _>>()?;
            Request::Wait { keys, timeout_ms }
        }
        OP_ADD => {
            let key = d.key()?;
            let delta = d.i64()?;
            Request::Add { key, delta }
        }
        op => return Err(format!("unknown opcode {op}")),
    };
    d.finish()?;
    Ok(req)
}
