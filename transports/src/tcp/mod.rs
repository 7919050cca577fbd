//! TCP transport.
//!
//! One TCP connection per direction per peer pair, as NCCL's socket transport does with its
//! control socket, or one for both directions where the communicator asks for it
//! ([`Transport::connect_duplex`]: acknowledgements then ride on the other direction's data),
//! plus optionally several data sockets served by helper threads for long
//! messages ([`lanes`], NCCL's `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD`). Every socket
//! opens with a hello frame (magic, protocol version, job id, sender rank, channel, socket
//! index) and a proof of the job token against the listener's challenge (`auth`), so that
//! connections from another job, a stale run or a stranger are refused at accept time instead
//! of corrupting a collective. Every message carries a 16-byte header (magic, tag, length) so
//! that a desynchronised stream or a size disagreement between ranks is reported as such
//! rather than as wrong data.
//!
//! Sockets are non-blocking and progressed by the caller's `test` loop, so a rank's sends and
//! receives advance together and the ring can never deadlock on a full socket buffer; helper
//! threads, when configured, only ever move bytes of messages already posted on both sides.

mod comm;
mod lanes;

use comm::{TcpInbound, TcpSendComm};

use crate::auth;
use crate::conn::{self, Deadline, Dialect, HelloHead, TextHandle, HEAD_LEN, PREFIX_LEN};
use crate::frame::{self, HEADER_LEN};
use crate::framed::{FramedRecv, Inbound, Posted};
use crate::slots::Slots;
use crate::{
    Handle, Identity, Listener, Properties, RecvComm, Registration, RequestId, Result, SendComm,
    Transport, TransportError,
};
use lanes::{Direction, Lanes, MAX_LANES, MAX_THREADS, SPLIT_MIN};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const DIALECT: Dialect = Dialect {
    magic: 0x6275_7362_775f_7463, // "busbw_tc"
    // 2: the hello grew lane fields (index, count, helper threads, connection id).
    // 3: and flags (two-way connections).
    version: 3,
    name: "busbw",
};
const HELLO_LEN: usize = 52;
/// Hello flag: the connection carries both directions.
const FLAG_DUPLEX: u32 = 1;
const MSG_MAGIC: u32 = 0xb05b_b0f1;
const HANDLE_PREFIX: &str = "busbw-tcp/1";

/// Tunables for [`TcpTransport`].
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Address to listen on.
    pub bind: IpAddr,
    /// Address to put into handles when `bind` is a wildcard (0.0.0.0 or ::).
    pub advertise: Option<IpAddr>,
    /// SO_SNDBUF in bytes; 0 leaves the kernel's autotuning alone.
    pub sndbuf: usize,
    /// SO_RCVBUF in bytes; 0 leaves the kernel's autotuning alone.
    pub rcvbuf: usize,
    /// Requests that may be in flight on one comm.
    pub max_requests: usize,
    /// Helper threads per connection that move long messages over extra data sockets
    /// (`NCCL_SOCKET_NTHREADS`); 0 keeps everything on one socket progressed by the rank's own
    /// thread, the right choice when cores are scarce.
    pub threads: usize,
    /// Data sockets per helper thread (`NCCL_NSOCKS_PERTHREAD`).
    pub socks_per_thread: usize,
    /// Congestion control for connections whose peer is on loopback; `None` keeps the
    /// host's. Loopback has no network to congest, and a pacing algorithm (BBR, the default
    /// on many hosts) carries its phase from one transfer to the next: after a few 2 MiB
    /// transfers it paces at its bandwidth estimate, and a 256 KiB AllReduce measured 1.3-1.4x
    /// slower than on fresh connections, so a size measured differently after larger ones
    /// than alone (BENCHMARKS.md). Reno paces nothing and is always allowed to unprivileged
    /// processes. Connections to other hosts keep the host's choice: there it is part of
    /// what is measured.
    pub loopback_congestion: Option<String>,
}

impl TcpConfig {
    /// Data sockets per connection beside the control socket.
    pub fn lanes(&self) -> usize {
        if self.threads == 0 {
            0
        } else {
            self.threads * self.socks_per_thread.max(1)
        }
    }

    /// Checks the NCCL limits (threads 0..=16, threads × sockets <= 64) so a typo fails at
    /// start-up with the rule instead of starting hundreds of sockets.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.threads > MAX_THREADS {
            return Err(format!(
                "{} socket threads asked for; at most {MAX_THREADS} (NCCL_SOCKET_NTHREADS' limit)",
                self.threads
            ));
        }
        if self.lanes() > MAX_LANES {
            return Err(format!(
                "{} threads x {} sockets per thread = {} data sockets; at most {MAX_LANES}",
                self.threads,
                self.socks_per_thread,
                self.lanes()
            ));
        }
        Ok(())
    }
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            advertise: None,
            sndbuf: 4 << 20,
            rcvbuf: 4 << 20,
            max_requests: 256,
            threads: 0,
            socks_per_thread: 1,
            loopback_congestion: Some("reno".into()),
        }
    }
}

/// TCP transport for one rank.
#[derive(Debug)]
pub struct TcpTransport {
    identity: Identity,
    config: TcpConfig,
}

impl TcpTransport {
    pub fn new(identity: Identity, config: TcpConfig) -> Self {
        TcpTransport { identity, config }
    }
}

/// Parses `busbw-tcp/1 rank=<r> addr=<ip:port> auth=<challenge>`.
fn parse_handle(handle: &Handle) -> Result<(u32, SocketAddr)> {
    let h = TextHandle::parse(handle, HANDLE_PREFIX, "a TCP")?;
    let addr = h.field("addr=").and_then(|v| v.parse::<SocketAddr>().ok());
    Ok((h.rank, addr.ok_or_else(|| h.lacks("addr="))?))
}

fn set_buffers(stream: &TcpStream, sndbuf: usize, rcvbuf: usize) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    for (opt, val) in [(libc::SO_SNDBUF, sndbuf), (libc::SO_RCVBUF, rcvbuf)] {
        if val == 0 {
            continue;
        }
        let v: libc::c_int = val.min(i32::MAX as usize) as libc::c_int;
        // SAFETY: fd is a valid socket owned by `stream`; the option value is a c_int.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sets the congestion control of a connection to a peer on loopback
/// ([`TcpConfig::loopback_congestion`]); returns the algorithm set, if any. Best effort: a
/// kernel without it, or a policy that refuses it, leaves the host's, which only costs the
/// fidelity the setting buys.
fn loopback_congestion(stream: &TcpStream, name: Option<&str>) -> Option<String> {
    let name = name?;
    let peer = stream.peer_addr().ok()?.ip();
    let local = match peer {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    };
    if !local {
        return None;
    }
    crate::platform::set_tcp_congestion(stream.as_raw_fd(), name).then(|| name.to_string())
}

impl Transport for TcpTransport {
    fn properties(&self) -> Properties {
        Properties::host_only("tcp", self.config.max_requests)
    }

    fn identity(&self) -> Identity {
        self.identity
    }

    fn listen(&self) -> Result<(Handle, Box<dyn Listener>)> {
        let listener = TcpListener::bind(SocketAddr::new(self.config.bind, 0))?;
        let local = listener.local_addr()?;
        let ip = if local.ip().is_unspecified() {
            self.config.advertise.ok_or_else(|| {
                TransportError::Unsupported(format!(
                    "listening on wildcard {local} but no address to advertise to peers"
                ))
            })?
        } else {
            local.ip()
        };
        let addr = SocketAddr::new(ip, local.port());
        listener.set_nonblocking(true)?;
        let gate = auth::DataGate::new(&self.identity);
        let handle =
            Handle(format!("{HANDLE_PREFIX} rank={} addr={addr}", self.identity.rank).into_bytes());
        let handle = Handle([handle.0, gate.handle_field().into_bytes()].concat());
        Ok((
            handle,
            Box::new(TcpListenerComm {
                gate,
                listener,
                identity: self.identity,
                config: self.config.clone(),
                pending: HashMap::new(),
            }),
        ))
    }

    fn connect(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
    ) -> Result<Box<dyn SendComm>> {
        let (peer, stream, lanes) = self.open(handle, channel, timeout, 0)?;
        Ok(Box::new(TcpSendComm::new(
            stream,
            peer,
            lanes,
            self.config.max_requests,
        )))
    }

    /// Without helper lanes: they move one direction's long messages, and a second direction
    /// would need its own.
    fn duplex(&self, handle: &Handle) -> bool {
        self.config.lanes() == 0 && parse_handle(handle).is_ok()
    }

    fn connect_duplex(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
    ) -> Result<(Box<dyn SendComm>, Box<dyn RecvComm>)> {
        if self.config.lanes() > 0 {
            return Err(TransportError::Unsupported(
                "two-way connections carry no helper lanes".into(),
            ));
        }
        let (peer, stream, _) = self.open(handle, channel, timeout, FLAG_DUPLEX)?;
        let reading = stream
            .try_clone()
            .map_err(|error| TransportError::PeerIo { peer, error })?;
        let send = TcpSendComm::new(stream, peer, None, self.config.max_requests);
        let recv = FramedRecv::new(
            TcpInbound::new(reading, peer, None, None),
            peer,
            channel,
            self.config.max_requests,
        );
        Ok((Box::new(send), Box::new(recv)))
    }
}

impl TcpTransport {
    /// Connects to `handle` on `channel`: the control socket (non-blocking) and, when
    /// configured and not two-way, the lanes.
    fn open(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
        flags: u32,
    ) -> Result<(u32, TcpStream, Option<Lanes>)> {
        let (peer, addr) = parse_handle(handle)?;
        let deadline = Deadline::after(timeout);
        self.config
            .validate()
            .map_err(TransportError::Unsupported)?;
        let lanes = if flags & FLAG_DUPLEX != 0 {
            0
        } else {
            self.config.lanes()
        };
        let hello = Hello {
            head: HelloHead {
                rank: self.identity.rank,
                job: self.identity.job,
                channel,
            },
            index: 0,
            lanes: lanes as u32,
            threads: self.config.threads as u32,
            conn: if lanes > 0 { connection_id() } else { 0 },
            flags,
        };
        let open = |index: u32| -> Result<TcpStream> {
            let stream = conn::connect_tcp(addr, peer, &deadline, || {
                format!("connecting to rank {peer} at {addr}")
            })?;
            let io_err = |error| TransportError::PeerIo { peer, error };
            stream.set_nodelay(true).map_err(io_err)?;
            set_buffers(&stream, self.config.sndbuf, self.config.rcvbuf).map_err(io_err)?;
            loopback_congestion(&stream, self.config.loopback_congestion.as_deref());
            let mut s = &stream;
            s.set_write_timeout(deadline.left().or(Some(Duration::from_millis(1))))
                .map_err(io_err)?;
            // Every socket of the connection proves the job token against the listener's
            // challenge, with a fresh nonce each (the listener refuses replays).
            let bytes = Hello { index, ..hello }.encode();
            let tail = auth::tail_for(&handle.0, &self.identity, &bytes)
                .map_err(TransportError::BadHandle)?;
            s.write_all(&[&bytes[..], &tail[..]].concat())
                .map_err(io_err)?;
            Ok(stream)
        };
        let stream = open(0)?;
        stream
            .set_nonblocking(true)
            .map_err(|error| TransportError::PeerIo { peer, error })?;
        let lanes = if lanes > 0 {
            let streams = (1..=lanes as u32).map(open).collect::<Result<Vec<_>>>()?;
            Some(Lanes::start(
                streams,
                self.config.threads,
                Direction::Send,
                self.config.max_requests,
                peer,
            )?)
        } else {
            None
        };
        Ok((peer, stream, lanes))
    }
}

/// The first frame of every socket of a connection: the common head, then the lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hello {
    head: HelloHead,
    /// 0 for the control socket, 1..=lanes for the data sockets.
    index: u32,
    lanes: u32,
    threads: u32,
    /// Ties a connection's sockets together at the acceptor (random per connect; 0 without
    /// lanes).
    conn: u64,
    /// [`FLAG_DUPLEX`].
    flags: u32,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        DIALECT.encode(&self.head, &mut b);
        b[28..32].copy_from_slice(&self.index.to_le_bytes());
        b[32..36].copy_from_slice(&self.lanes.to_le_bytes());
        b[36..40].copy_from_slice(&self.threads.to_le_bytes());
        b[40..48].copy_from_slice(&self.conn.to_le_bytes());
        b[48..52].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    /// Decodes a hello for a listener of job `job`, or says why it is not one of ours.
    fn decode(b: &[u8; HELLO_LEN], job: u64) -> std::result::Result<Hello, String> {
        let h = Hello {
            head: DIALECT.decode(b, job)?,
            index: conn::u32_at(b, HEAD_LEN),
            lanes: conn::u32_at(b, 32),
            threads: conn::u32_at(b, 36),
            conn: conn::u64_at(b, 40),
            flags: conn::u32_at(b, 48),
        };
        if h.lanes as usize > MAX_LANES || h.index > h.lanes || h.threads as usize > MAX_THREADS {
            return Err(format!(
                "rank {} asked for socket {} of {} with {} threads (at most {MAX_LANES} sockets, \
                 {MAX_THREADS} threads)",
                h.head.rank, h.index, h.lanes, h.threads
            ));
        }
        if h.flags & !FLAG_DUPLEX != 0 || (h.flags & FLAG_DUPLEX != 0 && h.lanes != 0) {
            return Err(format!(
                "rank {} sent unknown hello flags {:#x} (or a two-way connection with lanes)",
                h.head.rank, h.flags
            ));
        }
        Ok(h)
    }
}

/// Random enough to keep two connections of one peer and channel apart at the acceptor
/// (a reconnect after a failed attempt, say); not a secret.
fn connection_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

struct TcpListenerComm {
    gate: auth::DataGate,
    listener: TcpListener,
    identity: Identity,
    config: TcpConfig,
    /// Connections whose sockets have not all arrived, by (rank, channel, connection id):
    /// the sockets by index, and when the first one came (stale entries are dropped).
    pending: HashMap<ConnKey, (Vec<Option<TcpStream>>, Instant)>,
}

/// (rank, channel, connection id) of a connection with lanes.
type ConnKey = (u32, u32, u64);

impl TcpListenerComm {
    /// Reads and checks the hello frame and its proof, returning the hello, or why the
    /// connection is not one of ours.
    fn handshake(&self, mut s: &TcpStream) -> std::result::Result<Hello, String> {
        let mut hello = [0u8; HELLO_LEN];
        let incomplete = |e: io::Error| format!("no complete hello frame ({e})");
        s.read_exact(&mut hello[..PREFIX_LEN]).map_err(incomplete)?;
        DIALECT.check_prefix(&hello)?;
        s.read_exact(&mut hello[PREFIX_LEN..]).map_err(incomplete)?;
        let h = Hello::decode(&hello, self.identity.job)?;
        self.gate.admit(s, &hello, h.head.rank)?;
        Ok(h)
    }

    /// Files an accepted socket under its connection; returns the connection's sockets
    /// (control first) once all have arrived.
    fn gather(&mut self, hello: Hello, stream: TcpStream) -> Option<Vec<TcpStream>> {
        if hello.lanes == 0 {
            return Some(vec![stream]);
        }
        // A connector that died half-way leaves a partial entry; forget it after a while so
        // a long-lived listener does not accumulate them.
        self.pending
            .retain(|_, (_, since)| since.elapsed() < Duration::from_secs(600));
        let key = (hello.head.rank, hello.head.channel, hello.conn);
        let entry = self
            .pending
            .entry(key)
            .or_insert_with(|| ((0..=hello.lanes).map(|_| None).collect(), Instant::now()));
        let slot = entry.0.get_mut(hello.index as usize)?;
        *slot = Some(stream);
        if entry.0.iter().all(Option::is_some) {
            let (socks, _) = self.pending.remove(&key)?;
            return socks.into_iter().collect();
        }
        None
    }
}

impl Listener for TcpListenerComm {
    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn RecvComm>> {
        let deadline = Deadline::after(timeout);
        loop {
            let (stream, hello) =
                conn::accept(&self.listener, &deadline, ("data connection", ""), |s| {
                    self.handshake(s)
                })?;
            let (peer, channel) = (hello.head.rank, hello.head.channel);
            let io_err = |error| TransportError::PeerIo { peer, error };
            stream.set_nodelay(true).map_err(io_err)?;
            set_buffers(&stream, self.config.sndbuf, self.config.rcvbuf).map_err(io_err)?;
            loopback_congestion(&stream, self.config.loopback_congestion.as_deref());
            let Some(mut socks) = self.gather(hello, stream) else {
                continue;
            };
            let stream = socks.remove(0);
            stream.set_nonblocking(true).map_err(io_err)?;
            let lanes = if socks.is_empty() {
                None
            } else {
                Some(Lanes::start(
                    socks,
                    hello.threads as usize,
                    Direction::Recv,
                    self.config.max_requests,
                    peer,
                )?)
            };
            let reverse = if hello.flags & FLAG_DUPLEX != 0 {
                Some(TcpSendComm::new(
                    stream.try_clone().map_err(io_err)?,
                    peer,
                    None,
                    self.config.max_requests,
                ))
            } else {
                None
            };
            let inbound = TcpInbound::new(stream, peer, lanes, reverse);
            return Ok(Box::new(FramedRecv::new(
                inbound,
                peer,
                channel,
                self.config.max_requests,
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The algorithm a socket runs, as the kernel reports it.
    fn congestion(stream: &TcpStream) -> String {
        let mut buf = [0u8; 16];
        let mut len = buf.len() as libc::socklen_t;
        // SAFETY: fd valid; buf and len describe a writable buffer.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                buf.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        let end = buf[..len as usize]
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(len as usize);
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    #[test]
    fn loopback_connections_run_the_configured_congestion_control() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let host = congestion(&client);
        // Both ends: congestion control runs on the sending side, and both sides send.
        for s in [&client, &server] {
            assert_eq!(loopback_congestion(s, None), None);
            assert_eq!(congestion(s), host, "None keeps the host's");
            assert_eq!(
                loopback_congestion(s, Some("reno")).as_deref(),
                Some("reno")
            );
            assert_eq!(congestion(s), "reno");
            // An algorithm the kernel does not have leaves the socket as it was.
            assert_eq!(loopback_congestion(s, Some("no-such-cc")), None);
            assert_eq!(congestion(s), "reno");
        }
        assert_eq!(
            TcpConfig::default().loopback_congestion.as_deref(),
            Some("reno")
        );
    }

    #[test]
    fn handle_round_trip_and_rejects() {
        let h = Handle(b"busbw-tcp/1 rank=3 addr=127.0.0.1:4242".to_vec());
        let (r, a) = parse_handle(&h).unwrap();
        assert_eq!(r, 3);
        assert_eq!(a, "127.0.0.1:4242".parse().unwrap());
        assert!(parse_handle(&Handle(b"garbage".to_vec())).is_err());
        assert!(parse_handle(&Handle(b"busbw-tcp/1 rank=x addr=1".to_vec())).is_err());
        assert!(parse_handle(&Handle(vec![0xff, 0xfe])).is_err());
    }
}
