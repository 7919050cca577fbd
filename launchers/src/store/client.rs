use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::proto::{self, Decoder, Encoder};
use super::{Store, StoreError, MAX_KEY_LEN, MAX_VALUE_LEN};

/// Extra time the client allows beyond a WAIT's own timeout before it gives up on the server:
/// the server enforces the timeout itself and answers, so the margin only covers a server that
/// has stopped answering altogether (its host died without closing the socket).
const WAIT_MARGIN: Duration = Duration::from_secs(5);
/// Floor on the time a single non-WAIT request may take.
const MIN_OP_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Blocking client of [`super::TcpStoreServer`].
///
/// Plain std sockets: the callers are ordinary threads. The protocol carries one request at a
/// time per connection, so the client keeps a small pool: a thread that finds every connection
/// busy (say, another thread is parked in a long WAIT) opens one more instead of queueing
/// behind it, which would otherwise turn "thread A waits for a key thread B is about to set"
/// into a deadlock until the timeout.
pub struct TcpStoreClient {
    addr: String,
    op_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
    /// Second handles on every open connection, so [`Self::close`] can interrupt requests
    /// other threads are blocked in.
    live: Mutex<HashMap<u64, TcpStream>>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

struct Conn {
    id: u64,
    stream: TcpStream,
}

impl TcpStoreClient {
    /// Connect to the store at `addr` (`host:port`), retrying until `timeout`.
    ///
    /// Ranks start in any order and rank 0 may not listen yet, its name may not resolve yet
    /// (Kubernetes DNS for headless services lags pod start), so refusals and resolution
    /// failures are retried with backoff, as NCCL does for its bootstrap socket. Only a peer
    /// that answers with a different protocol fails at once.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Self, StoreError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let op_timeout = timeout.max(MIN_OP_TIMEOUT);
        let mut backoff = Duration::from_millis(10);
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            // Bound the greeting by the deadline too: a listener whose owner has not started
            // serving yet (or never will) accepts the connection but stays silent.
            let attempt = remaining.max(Duration::from_millis(100));
            let last_err = match open(addr, attempt, attempt.min(op_timeout)) {
                Ok(stream) => {
                    let client = Self {
                        addr: addr.to_string(),
                        op_timeout,
                        idle: Mutex::new(Vec::new()),
                        live: Mutex::new(HashMap::new()),
                        next_id: AtomicU64::new(0),
                        closed: AtomicBool::new(false),
                    };
                    let conn = client.register(stream)?;
                    lock(&client.idle).push(conn);
                    return Ok(client);
                }
                Err(HandshakeError::Fatal(e)) => return Err(e),
                Err(HandshakeError::Retry(e)) => e,
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(StoreError::Disconnected(format!(
                    "could not reach the rendezvous store served by rank 0 at {addr} within \
                     {:.1}s: {last_err}",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(backoff.min(remaining));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The `host:port` this client talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Shut every connection down, waking any thread blocked in a request (which then gets
    /// [`StoreError::Disconnected`]); later requests fail the same way. This is how a watcher
    /// is stopped without waiting out its poll.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for s in lock(&self.live).values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        lock(&self.idle).clear();
    }

    fn register(&self, stream: TcpStream) -> Result<Conn, StoreError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.live).insert(id, stream.try_clone()?);
        Ok(Conn { id, stream })
    }

    fn forget(&self, conn: Conn) {
        let _ = conn.stream.shutdown(Shutdown::Both);
        lock(&self.live).remove(&conn.id);
    }

    fn gone(&self, detail: impl std::fmt::Display) -> StoreError {
        StoreError::Disconnected(format!(
            "lost the connection to the rendezvous store served by rank 0 at {}: {detail}",
            self.addr
        ))
    }

    /// An idle connection, or a new one when all are busy. A new one is tried once, without
    /// the start-up retries: the server was up, so failing to reach it now means it is gone.
    fn checkout(&self) -> Result<Conn, StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(self.gone("the client was closed"));
        }
        if let Some(c) = lock(&self.idle).pop() {
            return Ok(c);
        }
        match open(&self.addr, self.op_timeout, self.op_timeout) {
            Ok(stream) => {
                let conn = self.register(stream)?;
                // close() may have run between the check above and registering.
                if self.closed.load(Ordering::Acquire) {
                    self.forget(conn);
                    return Err(self.gone("the client was closed"));
                }
                Ok(conn)
            }
            Err(HandshakeError::Fatal(e)) => Err(e),
            Err(HandshakeError::Retry(e)) => Err(self.gone(e)),
        }
    }

    /// Send one request frame and return the response body. `keys` only label a timeout.
    fn call(
        &self,
        frame: &[u8],
        read_timeout: Duration,
        keys: &[&str],
    ) -> Result<Vec<u8>, StoreError> {
        let mut conn = self.checkout()?;
        match exchange(&mut conn.stream, frame, self.op_timeout, read_timeout) {
            Ok(body) => {
                if !self.closed.load(Ordering::Acquire) {
                    lock(&self.idle).push(conn);
                } else {
                    self.forget(conn);
                }
                Ok(body)
            }
            Err(e) => {
                // A failed exchange leaves the stream mid-frame (or a late answer pending), so
                // it is never reused.
                self.forget(conn);
                Err(match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => StoreError::Timeout {
                        secs: read_timeout.as_secs_f64(),
                        missing: keys.iter().map(|k| k.to_string()).collect(),
                    },
                    io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::NotConnected => self.gone(e),
                    io::ErrorKind::InvalidData => StoreError::Protocol(e.to_string()),
                    _ => StoreError::Io(e),
                })
            }
        }
    }
}

impl Drop for TcpStoreClient {
    fn drop(&mut self) {
        for s in lock(&self.live).values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Connect and greet once.
fn open(
    addr: &str,
    connect_timeout: Duration,
    op_timeout: Duration,
) -> Result<TcpStream, HandshakeError> {
    let stream = connect_once(addr, connect_timeout).map_err(HandshakeError::Retry)?;
    handshake(&stream, addr, op_timeout)?;
    Ok(stream)
}

fn exchange(
    stream: &mut TcpStream,
    frame: &[u8],
    write_timeout: Duration,
    read_timeout: Duration,
) -> io::Result<Vec<u8>> {
    stream.set_write_timeout(Some(write_timeout))?;
    stream.write_all(frame)?;
    stream.set_read_timeout(Some(read_timeout.max(Duration::from_millis(1))))?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > proto::MAX_RESPONSE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("response length {len} is out of range"),
        ));
    }
    let mut body = Vec::new();
    stream.take(len as u64).read_to_end(&mut body)?;
    if body.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(body)
}

fn connect_once(addr: &str, timeout: Duration) -> Result<TcpStream, String> {
    let addrs = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?;
    let mut last = format!("{addr} resolved to no addresses");
    for sa in addrs {
        match TcpStream::connect_timeout(&sa, timeout.min(Duration::from_secs(5))) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = format!("connecting to {sa}: {e}"),
        }
    }
    Err(last)
}

enum HandshakeError {
    Retry(String),
    Fatal(StoreError),
}

fn handshake(stream: &TcpStream, addr: &str, timeout: Duration) -> Result<(), HandshakeError> {
    let retry = |e: io::Error| HandshakeError::Retry(format!("handshake with {addr}: {e}"));
    let mut s = stream;
    s.set_write_timeout(Some(timeout)).map_err(retry)?;
    s.set_read_timeout(Some(timeout)).map_err(retry)?;
    s.write_all(&proto::hello()).map_err(retry)?;
    let mut answer = [0u8; proto::HELLO_LEN];
    s.read_exact(&mut answer).map_err(retry)?;
    match proto::parse_hello(&answer) {
        None => Err(HandshakeError::Fatal(StoreError::Protocol(format!(
            "{addr} is not a busbw rendezvous store (wrong greeting): is MASTER_PORT right?"
        )))),
        Some(v) if v != proto::VERSION => {
            Err(HandshakeError::Fatal(StoreError::Protocol(format!(
                "the store at {addr} speaks protocol version {v}, this build speaks {}: \
                 are all ranks running the same busbw build?",
                proto::VERSION
            ))))
        }
        Some(_) => Ok(()),
    }
}

fn check_key(key: &str) -> Result<(), StoreError> {
    if key.len() > MAX_KEY_LEN {
        return Err(StoreError::Protocol(format!(
            "key of {} bytes exceeds the {MAX_KEY_LEN}-byte limit",
            key.len()
        )));
    }
    Ok(())
}

fn protocol(msg: String) -> StoreError {
    StoreError::Protocol(msg)
}

/// Turn a non-OK, non-expected status into an error.
fn unexpected(status: u8, d: &mut Decoder<'_>) -> StoreError {
    match status {
        proto::ST_ERROR => match d.bytes(proto::MAX_RESPONSE) {
            Ok(m) => StoreError::Protocol(format!(
                "server refused the request: {}",
                String::from_utf8_lossy(m)
            )),
            Err(e) => StoreError::Protocol(e),
        },
        s => StoreError::Protocol(format!("unexpected response status {s}")),
    }
}

impl Store for TcpStoreClient {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(StoreError::Protocol(format!(
                "value of {} bytes for key {key:?} exceeds the {MAX_VALUE_LEN}-byte limit",
                value.len()
            )));
        }
        let mut e = Encoder::new();
        e.u8(proto::OP_SET).bytes(key.as_bytes()).bytes(value);
        let body = self.call(&e.frame(), self.op_timeout, &[key])?;
        let mut d = Decoder::new(&body);
        match d.u8().map_err(protocol)? {
            proto::ST_OK => Ok(()),
            s => Err(unexpected(s, &mut d)),
        }
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        let mut e = Encoder::new();
        e.u8(proto::OP_GET).bytes(key.as_bytes());
        let body = self.call(&e.frame(), self.op_timeout, &[key])?;
        let mut d = Decoder::new(&body);
        match d.u8().map_err(protocol)? {
            proto::ST_OK => Ok(Some(d.bytes(MAX_VALUE_LEN).map_err(protocol)?.to_vec())),
            proto::ST_NOT_FOUND => Ok(None),
            s => Err(unexpected(s, &mut d)),
        }
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        for k in keys {
            check_key(k)?;
        }
        let mut e = Encoder::new();
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        e.u8(proto::OP_WAIT).u64(ms).u32(keys.len() as u32);
        for k in keys {
            e.bytes(k.as_bytes());
        }
        let frame = e.frame();
        if frame.len() - 4 > proto::MAX_REQUEST {
            return Err(StoreError::Protocol(format!(
                "WAIT for {} keys is too large for one request",
                keys.len()
            )));
        }
        let body = self.call(&frame, timeout.saturating_add(WAIT_MARGIN), keys)?;
        let mut d = Decoder::new(&body);
        match d.u8().map_err(protocol)? {
            proto::ST_OK => {
                let n = d.u32().map_err(protocol)? as usize;
                if n != keys.len() {
                    return Err(StoreError::Protocol(format!(
                        "asked for {} keys, got {n} values",
                        keys.len()
                    )));
                }
                (0..n)
                    .map(|_| d.bytes(MAX_VALUE_LEN).map(<[u8]>::to_vec))
                    .collect::<Result<_, _>>()
                    .map_err(protocol)
            }
            proto::ST_TIMEOUT => {
                let n = d.u32().map_err(protocol)? as usize;
                let missing = (0..n.min(keys.len()))
                    .map(|_| d.key())
                    .collect::<Result<_, _>>()
                    .map_err(protocol)?;
                Err(StoreError::Timeout {
                    secs: timeout.as_secs_f64(),
                    missing,
                })
            }
            s => Err(unexpected(s, &mut d)),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        check_key(key)?;
        let mut e = Encoder::new();
        e.u8(proto::OP_ADD).bytes(key.as_bytes()).i64(delta);
        let body = self.call(&e.frame(), self.op_timeout, &[key])?;
        let mut d = Decoder::new(&body);
        match d.u8().map_err(protocol)? {
            proto::ST_OK => d.i64().map_err(protocol),
            proto::ST_BAD_VALUE => {
                let key = d.key().map_err(protocol)?;
                let value = d.bytes(proto::MAX_RESPONSE).map_err(protocol)?;
                Err(StoreError::BadValue {
                    key,
                    value: String::from_utf8_lossy(value).into_owned(),
                })
            }
            s => Err(unexpected(s, &mut d)),
        }
    }
}
