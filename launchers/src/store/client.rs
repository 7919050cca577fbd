use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::proto::{self, Decoder, Encoder};
use super::{Store, StoreError, MAX_KEY_LEN, MAX_VALUE_LEN};
use busbw_transports::auth::{self, Key};

/// Extra time the client allows beyond a WAIT's own timeout before it gives up on the server:
/// the server enforces the timeout itself and answers, so the margin only covers a server that
/// has stopped answering altogether (its host died without closing the socket).
const WAIT_MARGIN: Duration = Duration::from_secs(5);
/// Floor on the time a single non-WAIT request may take.
const MIN_OP_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Longest pause between lookups of a name that does not resolve yet.
const MAX_DNS_BACKOFF: Duration = Duration::from_secs(2);
/// Longest single TCP connect attempt: a dropped SYN must not use up the whole deadline in
/// one attempt when the next one (after a pod became Ready, a route appeared) may succeed.
const MAX_CONNECT_ATTEMPT: Duration = Duration::from_secs(5);
/// Shortest time given to one attempt, so that a nearly spent deadline still gets a real try.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);
/// What the server sends in a successful greeting: its hello, challenge and status.
const GREETING: usize = proto::HELLO_LEN + proto::SERVER_CHALLENGE_LEN + 1;

/// Blocking client of [`super::TcpStoreServer`].
///
/// Plain std sockets: the callers are ordinary threads. The protocol carries one request at a
/// time per connection, so the client keeps a small pool: a thread that finds every connection
/// busy (say, another thread is parked in a long WAIT) opens one more instead of queueing
/// behind it, which would otherwise turn "thread A waits for a key thread B is about to set"
/// into a deadlock until the timeout.
pub struct TcpStoreClient {
    addr: String,
    /// The job token's key, proven in every hello.
    key: Key,
    op_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
    /// Second handles on every open connection, so [`Self::close`] can interrupt requests
    /// other threads are blocked in.
    live: Mutex<HashMap<u64, TcpStream>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    /// Bytes read from the store (see [`TcpStoreClient::bytes_received`]).
    received: AtomicU64,
    /// Set by [`Store::give_up_by`]: no request outlives it.
    cutoff: Mutex<Option<Instant>>,
}

struct Conn {
    id: u64,
    stream: TcpStream,
}

impl TcpStoreClient {
    /// Connect to the store at `addr` (`host:port`) of a job without a token, retrying until
    /// `timeout`. See [`Self::connect_with_token`].
    pub fn connect(addr: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::connect_with_token(addr, timeout, None)
    }

    /// Connect to the store at `addr` (`host:port`, IPv6 literals bracketed), presenting
    /// `token`, retrying until `timeout`.
    ///
    /// Ranks start in any order: rank 0 may not listen yet, and its name may not resolve yet
    /// (Kubernetes publishes a pod's name only once it is Ready). So resolution failures,
    /// refusals and unanswered attempts are all retried with backoff, as NCCL does for its
    /// bootstrap socket, and resolution itself is bounded by the deadline because a resolver
    /// can block far longer than a rank should wait. When the deadline passes the error says
    /// which of those kept happening ([`StoreError::Unresolved`], [`StoreError::Refused`],
    /// [`StoreError::Unreachable`]), since each points at a different fix. A peer that answers
    /// with another protocol, or refuses the token, fails at once: waiting cannot change that.
    pub fn connect_with_token(
        addr: &str,
        timeout: Duration,
        token: Option<&str>,
    ) -> Result<Self, StoreError> {
        let (host, port) = split_host_port(addr)?;
        let key = Key::from_token(token);
        let start = Instant::now();
        let deadline = start + timeout;
        let op_timeout = timeout.max(MIN_OP_TIMEOUT);
        let mut resolver = Resolver::new(host.clone(), port);
        let mut backoff = Duration::from_millis(10);
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            // Bound the greeting by the deadline too: a listener whose owner has not started
            // serving yet (or never will) accepts the connection but stays silent.
            let attempt = remaining.max(MIN_ATTEMPT);
            let failure = match resolver.resolve(attempt) {
                Err(detail) => Failure::Unresolved(detail),
                Ok(addrs) => match connect_any(&addrs, attempt) {
                    Err(f) => f,
                    Ok(stream) => match handshake(&stream, addr, &key, attempt.min(op_timeout)) {
                        Ok(()) => {
                            let client = Self {
                                addr: addr.to_string(),
                                key,
                                op_timeout,
                                idle: Mutex::new(Vec::new()),
                                live: Mutex::new(HashMap::new()),
                                next_id: AtomicU64::new(0),
                                closed: AtomicBool::new(false),
                                received: AtomicU64::new(0),
                                cutoff: Mutex::new(None),
                            };
                            let conn = client.register(stream)?;
                            lock(&client.idle).push(conn);
                            return Ok(client);
                        }
                        Err(HandshakeError::Fatal(e)) => return Err(e),
                        Err(HandshakeError::Retry(e)) => Failure::Handshake(e),
                    },
                },
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(failure.into_error(addr, &host, timeout.as_secs_f64()));
            }
            // Name lookups go to the cluster's DNS, which every waiting rank of a large job
            // queries at once: back off further there, and spread all retries out so that
            // ranks started together do not retry in lockstep.
            let cap = match failure {
                Failure::Unresolved(_) => MAX_DNS_BACKOFF,
                _ => MAX_BACKOFF,
            };
            std::thread::sleep(jitter(backoff).min(remaining));
            backoff = (backoff * 2).min(cap);
        }
    }

    /// Bytes this client has read from the store, greetings included: what the store served
    /// this rank, as the rendezvous scale test reports it.
    pub fn bytes_received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
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

    /// Takes a greeted connection into the pool.
    fn register(&self, stream: TcpStream) -> Result<Conn, StoreError> {
        self.received.fetch_add(GREETING as u64, Ordering::Relaxed);
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

    /// `limit`, shortened to what is left before the cutoff; an error once it has passed.
    fn capped(&self, limit: Duration) -> Result<Duration, StoreError> {
        match *lock(&self.cutoff) {
            None => Ok(limit),
            Some(cutoff) => match cutoff.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Ok(limit.min(left)),
                _ => Err(self.given_up()),
            },
        }
    }

    fn given_up(&self) -> StoreError {
        self.gone("no answer in the time this rank allows the store once the job has failed")
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
        match open(&self.addr, &self.key, self.capped(self.op_timeout)?) {
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
        let write_timeout = self.capped(self.op_timeout)?;
        let read_timeout = self.capped(read_timeout)?;
        let mut conn = self.checkout()?;
        match exchange(&mut conn.stream, frame, write_timeout, read_timeout) {
            Ok(body) => {
                self.received
                    .fetch_add(4 + body.len() as u64, Ordering::Relaxed);
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
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        if lock(&self.cutoff).is_some() =>
                    {
                        self.given_up()
                    }
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

/// `d` scaled by a random factor in [0.75, 1.25).
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded randomly per process and per instance: enough to decorrelate
    // ranks without a random-number dependency.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let frac = (r >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(0.75 + 0.5 * frac)
}

/// Connect and greet once, without the start-up retries: used once the server was up.
fn open(addr: &str, key: &Key, op_timeout: Duration) -> Result<TcpStream, HandshakeError> {
    let (host, port) = split_host_port(addr).map_err(HandshakeError::Fatal)?;
    let addrs = Resolver::new(host, port)
        .resolve(op_timeout)
        .map_err(HandshakeError::Retry)?;
    let stream = connect_any(&addrs, op_timeout).map_err(|f| HandshakeError::Retry(f.detail()))?;
    handshake(&stream, addr, key, op_timeout)?;
    Ok(stream)
}

/// `host:port` or `[v6]:port` into its parts; the host keeps no brackets.
fn split_host_port(addr: &str) -> Result<(String, u16), StoreError> {
    let bad = |why: &str| {
        StoreError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("store address {addr:?} {why}"),
        ))
    };
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| bad("has no port (expected host:port)"))?;
    let host = match host.strip_prefix('[') {
        Some(h) => h
            .strip_suffix(']')
            .ok_or_else(|| bad("has an unbalanced '['"))?,
        None if host.contains(':') => {
            return Err(bad("is an IPv6 address without brackets ([addr]:port)"))
        }
        None => host,
    };
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| bad("has an invalid port"))?;
    Ok((host.to_string(), port))
}

/// Name resolution bounded by a deadline.
///
/// getaddrinfo cannot be cancelled and may block for the resolver's own timeouts (tens of
/// seconds with an unreachable name server), so it runs on a helper thread. A lookup that
/// outlives one attempt is waited on again by the next attempt instead of starting another,
/// so a hung resolver never accumulates threads.
struct Resolver {
    host: String,
    port: u16,
    pending: Option<mpsc::Receiver<io::Result<Vec<SocketAddr>>>>,
}

impl Resolver {
    fn new(host: String, port: u16) -> Self {
        Self {
            host,
            port,
            pending: None,
        }
    }

    fn resolve(&mut self, limit: Duration) -> Result<Vec<SocketAddr>, String> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.port)]);
        }
        let rx = match self.pending.take() {
            Some(rx) => rx,
            None => {
                let (tx, rx) = mpsc::channel();
                let target = (self.host.clone(), self.port);
                std::thread::Builder::new()
                    .name("busbw-resolve".into())
                    .spawn(move || {
                        let _ = tx.send(target.to_socket_addrs().map(Iterator::collect));
                    })
                    .map_err(|e| format!("cannot start a resolver thread: {e}"))?;
                rx
            }
        };
        match rx.recv_timeout(limit) {
            Ok(Ok(addrs)) if addrs.is_empty() => Err("it resolved to no addresses".into()),
            Ok(Ok(addrs)) => Ok(addrs),
            Ok(Err(e)) => Err(e.to_string()),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.pending = Some(rx);
                Err(format!(
                    "the resolver did not answer within {:.1} s",
                    limit.as_secs_f64()
                ))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err("the resolver thread died".into()),
        }
    }
}

/// Why one connection attempt failed, kept so that the final error names the cause that
/// persisted rather than a generic "could not connect".
enum Failure {
    Unresolved(String),
    Refused,
    Unreachable(String),
    Handshake(String),
}

impl Failure {
    fn detail(&self) -> String {
        match self {
            Failure::Unresolved(d) => format!("cannot resolve: {d}"),
            Failure::Refused => "connection refused".into(),
            Failure::Unreachable(d) | Failure::Handshake(d) => d.clone(),
        }
    }

    fn into_error(self, addr: &str, host: &str, secs: f64) -> StoreError {
        let addr = addr.to_string();
        match self {
            Failure::Unresolved(detail) => StoreError::Unresolved {
                host: host.to_string(),
                secs,
                detail,
            },
            Failure::Refused => StoreError::Refused { addr, secs },
            Failure::Unreachable(detail) => StoreError::Unreachable { addr, secs, detail },
            Failure::Handshake(detail) => StoreError::Disconnected(format!(
                "could not reach the rendezvous store served by rank 0 at {addr} within \
                 {secs:.1}s: {detail}"
            )),
        }
    }
}

/// Try every resolved address in turn. When all fail, a refusal wins over other causes: it
/// proves the host is up and points at the port, the more useful thing to report.
fn connect_any(addrs: &[SocketAddr], limit: Duration) -> Result<TcpStream, Failure> {
    let per_attempt = limit.clamp(MIN_ATTEMPT, MAX_CONNECT_ATTEMPT);
    let mut failure = Failure::Unreachable("it resolved to no addresses".into());
    for sa in addrs {
        match TcpStream::connect_timeout(sa, per_attempt) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => failure = Failure::Refused,
            Err(e) => {
                if !matches!(failure, Failure::Refused) {
                    failure = Failure::Unreachable(match e.kind() {
                        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
                            "connecting to {sa}: no answer within {:.1} s",
                            per_attempt.as_secs_f64()
                        ),
                        _ => format!("connecting to {sa}: {e}"),
                    });
                }
            }
        }
    }
    Err(failure)
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

enum HandshakeError {
    Retry(String),
    Fatal(StoreError),
}

fn handshake(
    stream: &TcpStream,
    addr: &str,
    key: &Key,
    timeout: Duration,
) -> Result<(), HandshakeError> {
    let retry = |e: io::Error| HandshakeError::Retry(format!("handshake with {addr}: {e}"));
    let mut s = stream;
    s.set_write_timeout(Some(timeout)).map_err(retry)?;
    s.set_read_timeout(Some(timeout)).map_err(retry)?;
    let client_nonce = auth::nonce();
    s.write_all(&proto::client_hello(&client_nonce))
        .map_err(retry)?;
    let mut answer = [0u8; proto::HELLO_LEN];
    s.read_exact(&mut answer).map_err(retry)?;
    match proto::parse_hello(&answer) {
        None => {
            return Err(HandshakeError::Fatal(StoreError::Protocol(format!(
                "{addr} is not a busbw rendezvous store (wrong greeting): is MASTER_PORT right?"
            ))))
        }
        Some(v) if v != proto::VERSION => {
            return Err(HandshakeError::Fatal(StoreError::Protocol(format!(
                "the store at {addr} speaks protocol version {v}, this build speaks {}: \
                 are all ranks running the same busbw build?",
                proto::VERSION
            ))))
        }
        Some(_) => {}
    }
    let mut challenge = [0u8; proto::SERVER_CHALLENGE_LEN];
    s.read_exact(&mut challenge).map_err(retry)?;
    let (server_nonce, server_proof) = challenge.split_at(auth::NONCE_LEN);
    // The server proves the token first: a rank never talks to a store of another job (or
    // an impostor on the port) as if it were its own.
    if !key.verify(
        auth::label::STORE_SERVER,
        &[&client_nonce, server_nonce],
        server_proof,
    ) {
        // Tell the server so in its terms (a proof that cannot verify), so that a real store
        // of another job logs the refusal; nothing about our key goes out.
        let _ = s.write_all(&[0u8; auth::PROOF_LEN]);
        return Err(HandshakeError::Fatal(StoreError::WrongToken {
            addr: addr.to_string(),
        }));
    }
    let proof = key.proof(auth::label::STORE_CLIENT, &[server_nonce, &client_nonce]);
    s.write_all(&proof).map_err(retry)?;
    let mut status = [0u8; 1];
    s.read_exact(&mut status).map_err(retry)?;
    match status[0] {
        proto::HELLO_OK => Ok(()),
        proto::HELLO_WRONG_TOKEN => Err(HandshakeError::Fatal(StoreError::WrongToken {
            addr: addr.to_string(),
        })),
        other => Err(HandshakeError::Fatal(StoreError::Protocol(format!(
            "the store at {addr} answered the greeting with unknown status {other}"
        )))),
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
    fn give_up_by(&self, deadline: Instant) {
        let mut cutoff = lock(&self.cutoff);
        *cutoff = Some(cutoff.map_or(deadline, |c| c.min(deadline)));
    }

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
