use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::apply_add;
use super::proto::{self, Encoder, Request};
use busbw_transports::auth::{self, Key};

/// How long a fresh connection may take over its whole greeting. Real clients answer at once;
/// the limit stops silent or trickling stray connections from lingering.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take to arrive once its first byte has.
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest WAIT the server honours, so a garbage timeout cannot overflow a deadline.
const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Rank 0's store server.
///
/// It runs a single-threaded tokio runtime on its own OS thread: one task per connected rank
/// makes thousands of mostly idle, mostly blocked connections cheap, and keeping the runtime
/// on a private thread means the rest of the process (above all the data path) never runs
/// inside, or waits on, an async executor.
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl TcpStoreServer {
    /// Listen on `addr` and serve a job without a token.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        Self::bind_with_token(addr, None)
    }

    /// Listen on `addr` and serve only clients that present `token` (see [`crate::token`]).
    pub fn bind_with_token(addr: SocketAddr, token: Option<&str>) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on {addr} for the rendezvous store: {e}"),
            )
        })?;
        Self::from_std_listener_with_token(listener, token)
    }

    /// Serve a job without a token on a socket that is already listening. See
    /// [`Self::from_std_listener_with_token`].
    pub fn from_std_listener(listener: std::net::TcpListener) -> io::Result<Self> {
        Self::from_std_listener_with_token(listener, None)
    }

    /// Serve on a socket that is already listening, typically one inherited from the local
    /// launcher: it bound the port before starting any rank, so clients that connect before
    /// this server runs wait in the kernel's accept queue instead of being refused.
    ///
    /// Clients presenting another token (or none, when `token` is set) are told so and
    /// disconnected, with one line on stderr naming their address, and the server keeps
    /// serving: a stray rank of another job must not take this job down.
    pub fn from_std_listener_with_token(
        listener: std::net::TcpListener,
        token: Option<&str>,
    ) -> io::Result<Self> {
        let key = Key::from_token(token);
        let local_addr = listener.local_addr()?;
        // The standard library listens with a backlog of 128; thousands of ranks connect at
        // once when a job starts, and a dropped SYN costs its rank a one-second retransmit.
        // listen(2) again only raises the queue (the kernel caps it at somaxconn).
        // SAFETY: listen on a descriptor the listener owns; failure leaves the old backlog.
        unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), ACCEPT_BACKLOG) };
        listener.set_nonblocking(true)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let listener = {
            let _guard = rt.enter();
            TcpListener::from_std(listener)?
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let shared = Arc::new(Shared::default());
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name("busbw-store".into())
            .spawn(move || {
                rt.block_on(accept_loop(listener, stop_rx, key, serving));
                // Dropping the runtime drops every connection task and so closes every client
                // socket: clients see the server go away rather than hang.
                drop(rt);
            })?;
        Ok(Self {
            local_addr,
            stop: Some(stop_tx),
            thread: Some(thread),
            shared,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Bytes written to clients so far, greetings included: what the store served, as the
    /// rendezvous scale test reports it.
    pub fn bytes_sent(&self) -> u64 {
        self.shared.sent.load(Ordering::Relaxed)
    }

    /// Stop serving and close every client connection. Idempotent; also done on drop.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Pending connections the store's listener queues (see `from_std_listener_with_token`).
const ACCEPT_BACKLOG: libc::c_int = 8192;

#[derive(Default)]
struct State {
    /// Values are shared, not copied, into WAIT answers: an all-gather blob of a 4096-rank
    /// job is most of a megabyte, sent once to every rank.
    data: HashMap<String, Arc<Vec<u8>>>,
    /// One notifier per key somebody is waiting for, so a SET wakes only the waiters of that
    /// key: with every rank waiting on every other rank's key, waking all waiters on every SET
    /// would cost O(ranks^2) wake-ups per exchange.
    waiters: HashMap<String, Arc<Notify>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Bytes written to clients (see [`TcpStoreServer::bytes_sent`]).
    sent: AtomicU64,
}

impl Shared {
    /// No code panics while holding the lock, and every mutation is a single map operation,
    /// so a poisoned lock still guards consistent data.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sent(&self, bytes: usize) {
        self.sent.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn store(&self, key: String, value: Vec<u8>) {
        let mut s = self.lock();
        if let Some(n) = s.waiters.remove(&key) {
            n.notify_waiters();
        }
        s.data.insert(key, Arc::new(value));
    }
}

async fn accept_loop(
    listener: TcpListener,
    mut stop: oneshot::Receiver<()>,
    key: Key,
    shared: Arc<Shared>,
) {
    let key = Arc::new(key);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((sock, peer)) => {
                    let _ = sock.set_nodelay(true);
                    tokio::spawn(serve_connection(sock, peer, shared.clone(), key.clone()));
                }
                // Typically EMFILE or a connection reset before accept: neither is fatal to
                // the server, but retrying at once would spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
        }
    }
}

async fn serve_connection(
    mut sock: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    key: Arc<Key>,
) {
    // Any error simply ends this connection; the other ranks' connections are unaffected.
    let _ = serve_inner(&mut sock, peer, &shared, &key).await;
}

async fn serve_inner(
    sock: &mut TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    key: &Key,
) -> io::Result<()> {
    let (mut rd, mut wr) = sock.split();
    // One deadline for the whole greeting, so a connection that trickles it byte by byte
    // (slow-loris) is dropped as surely as one that sends nothing; its task is the only thing
    // it holds up.
    match tokio::time::timeout(HELLO_TIMEOUT, greet(&mut rd, &mut wr, peer, key, shared)).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return Ok(()),
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            eprintln!(
                "busbw: dropped a rendezvous connection from {peer}: no complete greeting \
                 within {} s",
                HELLO_TIMEOUT.as_secs()
            );
            return Ok(());
        }
    }
    loop {
        // Between requests a rank may be idle for the whole run; once a frame has begun, all
        // of it must arrive within FRAME_TIMEOUT.
        let mut len = [0u8; 4];
        match rd.read_exact(&mut len[..1]).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let body = match tokio::time::timeout(FRAME_TIMEOUT, read_frame(&mut rd, len)).await {
            Ok(Ok(Some(body))) => body,
            Ok(Ok(None)) => return Ok(()), // framing is lost; nothing sensible to answer
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                eprintln!(
                    "busbw: dropped a rendezvous connection from {peer}: a request did not \
                     arrive whole within {} s",
                    FRAME_TIMEOUT.as_secs()
                );
                return Ok(());
            }
        };
        let response = match proto::decode_request(&body) {
            Ok(req) => match execute(req, shared, &mut rd).await {
                Some(r) => r,
                None => return Ok(()), // client hung up during a WAIT
            },
            Err(msg) => Response::Frame(error_response(&msg)),
        };
        match response {
            Response::Frame(f) => {
                wr.write_all(&f).await?;
                shared.sent(f.len());
            }
            Response::Values(values) => shared.sent(write_values(&mut wr, &values).await?),
        }
    }
}

/// Reads the greeting and checks the client's proof; `false` ends the connection.
async fn greet(
    rd: &mut ReadHalf<'_>,
    wr: &mut WriteHalf<'_>,
    peer: SocketAddr,
    key: &Key,
    shared: &Shared,
) -> io::Result<bool> {
    let mut hello = [0u8; proto::HELLO_LEN];
    rd.read_exact(&mut hello).await?;
    let Some(version) = proto::parse_hello(&hello) else {
        return Ok(false); // not a busbw store client
    };
    if version != proto::VERSION {
        // Answer with our version so the client can report both; the rest of its hello is in
        // a format we do not know, so nothing more is read.
        wr.write_all(&proto::hello()).await?;
        shared.sent(proto::HELLO_LEN);
        return Ok(false);
    }
    let mut client_nonce = [0u8; auth::NONCE_LEN];
    rd.read_exact(&mut client_nonce).await?;
    let server_nonce = auth::nonce();
    let mut challenge = proto::hello().to_vec();
    challenge.extend_from_slice(&server_nonce);
    challenge
        .extend_from_slice(&key.proof(auth::label::STORE_SERVER, &[&client_nonce, &server_nonce]));
    wr.write_all(&challenge).await?;
    shared.sent(challenge.len());
    let mut proof = [0u8; auth::PROOF_LEN];
    rd.read_exact(&mut proof).await?;
    if !key.verify(
        auth::label::STORE_CLIENT,
        &[&server_nonce, &client_nonce],
        &proof,
    ) {
        eprintln!("busbw: refused a rendezvous connection from {peer}: wrong job token");
        wr.write_all(&[proto::HELLO_WRONG_TOKEN]).await?;
        shared.sent(1);
        return Ok(false);
    }
    wr.write_all(&[proto::HELLO_OK]).await?;
    shared.sent(1);
    Ok(true)
}

/// The rest of a frame whose first length byte is in `len[0]`: `None` when the length is out
/// of range or the peer hung up mid-frame.
async fn read_frame(rd: &mut ReadHalf<'_>, mut len: [u8; 4]) -> io::Result<Option<Vec<u8>>> {
    rd.read_exact(&mut len[1..]).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > proto::MAX_REQUEST {
        return Ok(None);
    }
    // Grow the buffer as bytes arrive rather than trusting the length with an allocation.
    let mut body = Vec::new();
    rd.take(len as u64).read_to_end(&mut body).await?;
    Ok((body.len() == len).then_some(body))
}

/// What a request is answered with: a finished frame, or a WAIT's values, which are written
/// from the store's own copies.
enum Response {
    Frame(Vec<u8>),
    Values(Vec<Arc<Vec<u8>>>),
}

/// Values at least this long are written straight from the store; shorter ones are gathered
/// into one buffer first, so a WAIT for thousands of small keys is still a few writes.
const DIRECT_VALUE: usize = 16 << 10;

/// A WAIT's OK frame (status, count, then each value with its length) without copying the
/// large values; the frame's length.
async fn write_values<W: AsyncWriteExt + Unpin>(
    wr: &mut W,
    values: &[Arc<Vec<u8>>],
) -> io::Result<usize> {
    let body: usize = 1 + 4 + values.iter().map(|v| 4 + v.len()).sum::<usize>();
    // Most answers are a few small values: no more buffer than the frame needs.
    let mut buf = Vec::with_capacity((4 + body).min(64 << 10));
    buf.extend_from_slice(&(body as u32).to_be_bytes());
    buf.push(proto::ST_OK);
    buf.extend_from_slice(&(values.len() as u32).to_be_bytes());
    for v in values {
        buf.extend_from_slice(&(v.len() as u32).to_be_bytes());
        if v.len() >= DIRECT_VALUE {
            wr.write_all(&buf).await?;
            buf.clear();
            wr.write_all(v).await?;
        } else {
            buf.extend_from_slice(v);
            if buf.len() >= 64 << 10 {
                wr.write_all(&buf).await?;
                buf.clear();
            }
        }
    }
    wr.write_all(&buf).await?;
    Ok(4 + body)
}

fn error_response(msg: &str) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u8(proto::ST_ERROR).bytes(msg.as_bytes());
    e.frame()
}

/// `None` means the connection should be closed.
async fn execute(req: Request, shared: &Shared, rd: &mut ReadHalf<'_>) -> Option<Response> {
    let mut e = Encoder::new();
    match req {
        Request::Set { key, value } => {
            shared.store(key, value);
            e.u8(proto::ST_OK);
        }
        Request::Get { key } => match shared.lock().data.get(&key) {
            Some(v) => {
                e.u8(proto::ST_OK).bytes(v);
            }
            None => {
                e.u8(proto::ST_NOT_FOUND);
            }
        },
        Request::Add { key, delta } => {
            let mut s = shared.lock();
            match apply_add(&key, s.data.get(&key).map(|v| v.as_slice()), delta) {
                Ok(new) => {
                    if let Some(n) = s.waiters.remove(&key) {
                        n.notify_waiters();
                    }
                    s.data.insert(key, Arc::new(new.to_string().into_bytes()));
                    e.u8(proto::ST_OK).i64(new);
                }
                Err(super::StoreError::BadValue { key, value }) => {
                    e.u8(proto::ST_BAD_VALUE)
                        .bytes(key.as_bytes())
                        .bytes(value.as_bytes());
                }
                Err(other) => return Some(Response::Frame(error_response(&other.to_string()))),
            }
        }
        Request::Wait { keys, timeout_ms } => {
            let timeout = Duration::from_millis(timeout_ms).min(MAX_WAIT);
            let deadline = Instant::now() + timeout;
            let mut probe = [0u8; 1];
            // While waiting, also watch the socket: a client that disconnects (or, against
            // the protocol, sends another request) ends the wait instead of leaving a task
            // parked until the deadline.
            let outcome = tokio::select! {
                r = wait_keys(shared, &keys, deadline) => r,
                _ = rd.read(&mut probe) => return None,
            };
            match outcome {
                Ok(values) => {
                    let total: usize = values.iter().map(|v| v.len() + 4).sum();
                    if total + 8 > proto::MAX_RESPONSE {
                        return Some(Response::Frame(error_response(&format!(
                            "WAIT result of {total} bytes exceeds the response limit"
                        ))));
                    }
                    return Some(Response::Values(values));
                }
                Err(missing) => {
                    e.u8(proto::ST_TIMEOUT).u32(missing.len() as u32);
                    for k in &missing {
                        e.bytes(k.as_bytes());
                    }
                }
            }
        }
    }
    Some(Response::Frame(e.frame()))
}

/// Wait for every key without polling: park on the notifier of the first missing key, and
/// after each wake-up resume from there, so each key is checked O(1) times per arrival.
async fn wait_keys(
    shared: &Shared,
    keys: &[String],
    deadline: Instant,
) -> Result<Vec<Arc<Vec<u8>>>, Vec<String>> {
    let mut first_missing = 0;
    loop {
        let notify = {
            let mut s = shared.lock();
            match keys[first_missing..]
                .iter()
                .position(|k| !s.data.contains_key(k))
            {
                None => {
                    return Ok(keys
                        .iter()
                        .map(|k| s.data.get(k).cloned().unwrap_or_default())
                        .collect())
                }
                Some(i) => {
                    first_missing += i;
                    s.waiters
                        .entry(keys[first_missing].clone())
                        .or_insert_with(|| Arc::new(Notify::new()))
                        .clone()
                }
            }
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // The key may have been stored between releasing the lock and registering above.
        if shared.lock().data.contains_key(&keys[first_missing]) {
            continue;
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(deadline) => {
                let mut s = shared.lock();
                // Drop the notifier if nobody else waits on it, so repeated timed-out waits
                // (the abort watcher's polling) do not accumulate entries.
                let key = &keys[first_missing];
                if s.waiters.get(key).is_some_and(|n| Arc::ptr_eq(n, &notify) && Arc::strong_count(n) <= 2) {
                    s.waiters.remove(key);
                }
                let missing = keys
                    .iter()
                    .filter(|k| !s.data.contains_key(*k))
                    .cloned()
                    .collect::<Vec<_>>();
                if missing.is_empty() {
                    continue; // arrived at the last moment
                }
                return Err(missing);
            }
        }
    }
}
