//! TCP transport.
//!
//! One TCP connection per direction per peer pair, as NCCL's socket transport does with its
//! control socket. Every connection opens with a hello frame (magic, protocol version, job
//! token, sender rank) so that connections from another job, a stale run or a port scanner are
//! refused at accept time instead of corrupting a collective. Every message carries a 16-byte
//! header (magic, tag, length) so that a desynchronised stream or a size disagreement between
//! ranks is reported as such rather than as wrong data.
//!
//! Sockets are non-blocking and progressed by the caller's `test` loop (no helper threads), so
//! a rank's sends and receives advance together and the ring can never deadlock on a full
//! socket buffer.

use crate::auth;
use crate::frame::{self, HEADER_LEN};
use crate::slots::Slots;
use crate::{
    Handle, Identity, Listener, Properties, PtrSupport, RecvComm, Registration, RequestId, Result,
    SendComm, Transport, TransportError,
};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long an accepted connection may take to send its hello.
const HELLO_WAIT: Duration = Duration::from_secs(5);
const HELLO_MAGIC: u64 = 0x6275_7362_775f_7463; // "busbw_tc"
const PROTOCOL_VERSION: u32 = 1;
const HELLO_LEN: usize = 32;
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
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            advertise: None,
            sndbuf: 4 << 20,
            rcvbuf: 4 << 20,
            max_requests: 256,
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

/// Parses `busbw-tcp/1 rank=<r> addr=<ip:port>`. Text, so a store dump is readable.
fn parse_handle(handle: &Handle) -> Result<(u32, SocketAddr)> {
    let text = std::str::from_utf8(&handle.0)
        .map_err(|_| TransportError::BadHandle("not UTF-8 (not a TCP handle?)".into()))?;
    let mut parts = text.split_whitespace();
    if parts.next() != Some(HANDLE_PREFIX) {
        return Err(TransportError::BadHandle(format!(
            "{text:?} is not a {HANDLE_PREFIX} handle"
        )));
    }
    let mut rank = None;
    let mut addr = None;
    for p in parts {
        if let Some(v) = p.strip_prefix("rank=") {
            rank = v.parse::<u32>().ok();
        } else if let Some(v) = p.strip_prefix("addr=") {
            addr = v.parse::<SocketAddr>().ok();
        }
    }
    match (rank, addr) {
        (Some(r), Some(a)) => Ok((r, a)),
        _ => Err(TransportError::BadHandle(format!(
            "{text:?} lacks a valid rank= or addr="
        ))),
    }
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

/// Connects to `addr` (rank `peer`) until `timeout`. A peer's listener exists before its
/// handle is published, but a connect can still be refused transiently (SYN backlog full
/// with many ranks, a route not up yet), so those errors are retried, as NCCL does; `what`
/// describes the attempt in the timeout error.
pub(crate) fn connect_retrying(
    addr: SocketAddr,
    peer: u32,
    timeout: Duration,
    what: impl Fn() -> String,
) -> Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = remaining(deadline).ok_or_else(|| TransportError::Timeout {
            secs: timeout.as_secs_f64(),
            what: what(),
        })?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                        | io::ErrorKind::AddrNotAvailable
                ) =>
            {
                std::thread::sleep(Duration::from_millis(50).min(left));
            }
            Err(e) => return Err(TransportError::PeerIo { peer, error: e }),
        }
    }
}

pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

impl Transport for TcpTransport {
    fn properties(&self) -> Properties {
        Properties {
            name: "tcp",
            speed_mbps: None,
            latency_us: None,
            ptr_support: PtrSupport {
                host: true,
                cuda: false,
                dmabuf: false,
            },
            max_requests: self.config.max_requests,
        }
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
        let gate = auth::DataGate::new(self.identity.job);
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
            }),
        ))
    }

    fn connect(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
    ) -> Result<Box<dyn SendComm>> {
        let (peer, addr) = parse_handle(handle)?;
        let deadline = Instant::now() + timeout;
        let stream = connect_retrying(addr, peer, timeout, || {
            format!("connecting to rank {peer} at {addr}")
        })?;
        let io_err = |error| TransportError::PeerIo { peer, error };
        stream.set_nodelay(true).map_err(io_err)?;
        set_buffers(&stream, self.config.sndbuf, self.config.rcvbuf).map_err(io_err)?;
        let mut hello = [0u8; HELLO_LEN];
        hello[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        hello[8..12].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        hello[12..16].copy_from_slice(&self.identity.rank.to_le_bytes());
        hello[16..24].copy_from_slice(&self.identity.job.to_le_bytes());
        hello[24..28].copy_from_slice(&channel.to_le_bytes());
        let tail = auth::tail_for(&handle.0, self.identity.job, &hello)
            .map_err(TransportError::BadHandle)?;
        let mut s = &stream;
        s.set_write_timeout(remaining(deadline).or(Some(Duration::from_millis(1))))
            .map_err(io_err)?;
        s.write_all(&[&hello[..], &tail[..]].concat())
            .map_err(io_err)?;
        stream.set_nonblocking(true).map_err(io_err)?;
        Ok(Box::new(TcpSendComm {
            slots: Slots::new(self.config.max_requests, peer),
            stream,
            peer,
        }))
    }
}

struct TcpListenerComm {
    gate: auth::DataGate,
    listener: TcpListener,
    identity: Identity,
    config: TcpConfig,
}

impl TcpListenerComm {
    /// Reads and checks the hello frame, returning the peer's (rank, channel), or why the
    /// connection is not one of ours.
    fn handshake(&self, stream: &TcpStream) -> io::Result<Result<(u32, u32), String>> {
        // Independent of the accept deadline: a caller polling accept in short slices (the
        // multi-transport) must not refuse a peer whose hello is a few milliseconds late
        // on a loaded host. A stranger that never speaks costs at most this long.
        let wait = HELLO_WAIT;
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(wait))?;
        let mut hello = [0u8; HELLO_LEN];
        let mut s = stream;
        if let Err(e) = s.read_exact(&mut hello) {
            return Ok(Err(format!("no complete hello frame ({e})")));
        }
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&hello[r]);
            u64::from_le_bytes(b)
        };
        if word(0..8) != HELLO_MAGIC {
            return Ok(Err("not a busbw connection (bad magic)".into()));
        }
        if word(8..12) != PROTOCOL_VERSION as u64 {
            return Ok(Err(format!(
                "busbw wire protocol {} where {PROTOCOL_VERSION} is spoken (mixed versions?)",
                word(8..12)
            )));
        }
        if word(16..24) != self.identity.job {
            return Ok(Err(format!(
                "rank {} belongs to another job or has another job token",
                word(12..16)
            )));
        }
        if let Err(why) = self.gate.read_and_check(s, &hello) {
            return Ok(Err(format!("claims to be rank {}: {why}", word(12..16))));
        }
        Ok(Ok((word(12..16) as u32, word(24..28) as u32)))
    }
}

pub(crate) fn poll_readable(fd: i32, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: pfd is a valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(rc > 0)
}

impl Listener for TcpListenerComm {
    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn RecvComm>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = remaining(deadline).ok_or_else(|| TransportError::Timeout {
                secs: timeout.as_secs_f64(),
                what: "waiting for a peer to connect".into(),
            })?;
            if !poll_readable(self.listener.as_raw_fd(), left)? {
                continue;
            }
            let (stream, from) = match self.listener.accept() {
                Ok(pair) => pair,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e.into()),
            };
            let refused = match self.handshake(&stream) {
                Ok(Ok((peer, channel))) => Ok((peer, channel)),
                Ok(Err(why)) => Err(why),
                Err(e) => Err(e.to_string()),
            };
            let (peer, channel) = match refused {
                Ok(who) => who,
                Err(why) => {
                    // A stranger: say so (a misconfigured job should be visible), drop it and
                    // keep waiting for the peer we expect.
                    eprintln!("busbw: refused a data connection from {from}: {why}");
                    continue;
                }
            };
            let io_err = |error| TransportError::PeerIo { peer, error };
            stream.set_nodelay(true).map_err(io_err)?;
            set_buffers(&stream, self.config.sndbuf, self.config.rcvbuf).map_err(io_err)?;
            stream.set_nonblocking(true).map_err(io_err)?;
            return Ok(Box::new(TcpRecvComm {
                slots: Slots::new(self.config.max_requests, peer),
                stream,
                peer,
                channel,
                rx: vec![0; RX_BYTES].into_boxed_slice(),
                rx_pos: 0,
                rx_end: 0,
                incoming: None,
                got: 0,
            }));
        }
    }
}

/// Maps a socket error to the error a user should see: a reset or broken pipe means the peer
/// went away, which is what to report, not an errno.
fn peer_error(peer: u32, e: io::Error) -> TransportError {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => TransportError::PeerClosed { peer },
        _ => TransportError::PeerIo { peer, error: e },
    }
}

struct SendReq {
    header: [u8; HEADER_LEN],
    ptr: *const u8,
    len: usize,
    sent: usize,
}

// SAFETY: the pointer is only dereferenced by the comm's owner thread while the request is in
// flight; `isend`'s contract keeps the memory valid until then.
unsafe impl Send for SendReq {}

struct TcpSendComm {
    slots: Slots<SendReq>,
    stream: TcpStream,
    peer: u32,
}

impl TcpSendComm {
    fn progress(&mut self) -> Result<()> {
        let fd = self.stream.as_raw_fd();
        while let Some(req) = self.slots.front() {
            let total = HEADER_LEN + req.len;
            while req.sent < total {
                let mut iov = [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2];
                let mut n_iov;
                if req.sent < HEADER_LEN {
                    iov[0] = libc::iovec {
                        iov_base: req.header[req.sent..].as_ptr() as *mut libc::c_void,
                        iov_len: HEADER_LEN - req.sent,
                    };
                    n_iov = 1;
                    if req.len > 0 {
                        iov[1] = libc::iovec {
                            iov_base: req.ptr as *mut libc::c_void,
                            iov_len: req.len,
                        };
                        n_iov = 2;
                    }
                } else {
                    let off = req.sent - HEADER_LEN;
                    iov[0] = libc::iovec {
                        // SAFETY: off < len, inside the caller's buffer.
                        iov_base: unsafe { req.ptr.add(off) } as *mut libc::c_void,
                        iov_len: req.len - off,
                    };
                    n_iov = 1;
                }
                // SAFETY: msghdr points at iovecs that describe valid memory (the header in
                // this request and the caller's buffer, kept alive by isend's contract).
                let n = unsafe {
                    let mut msg: libc::msghdr = std::mem::zeroed();
                    msg.msg_iov = iov.as_mut_ptr();
                    msg.msg_iovlen = n_iov;
                    libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
                };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(()),
                        io::ErrorKind::Interrupted => continue,
                        _ => return Err(peer_error(self.peer, e)),
                    }
                }
                req.sent += n as usize;
            }
            let len = req.len;
            self.slots.complete_front(len);
        }
        Ok(())
    }
}

impl SendComm for TcpSendComm {
    unsafe fn isend(
        &mut self,
        registration: &Registration,
        ptr: *const u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        let header = frame::encode(MSG_MAGIC, tag, len);
        let id = self.slots.post(SendReq {
            header,
            ptr,
            len,
            sent: 0,
        })?;
        // Start writing right away: small messages usually complete here.
        self.progress()?;
        Ok(id)
    }

    fn test(&mut self, request: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        self.slots.take(request)
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn readiness_fd(&self) -> Option<i32> {
        Some(self.stream.as_raw_fd())
    }
}

struct RecvReq {
    ptr: *mut u8,
    len: usize,
    tag: u32,
}

// SAFETY: as for SendReq.
unsafe impl Send for RecvReq {}

/// Receive buffer per connection. Small messages arrive whole with their header in one
/// recv(2) (the sender already writes header and payload with one sendmsg), so a short
/// message costs one system call on each side instead of two on the receiver's.
const RX_BYTES: usize = 64 << 10;
/// Receives posted for at most this many bytes read ahead into the buffer; larger ones read
/// just the header there and the payload straight into the caller's memory, so bulk data is
/// copied once.
const INLINE_MAX: usize = 16 << 10;

struct TcpRecvComm {
    slots: Slots<RecvReq>,
    stream: TcpStream,
    peer: u32,
    channel: u32,
    /// Bytes read from the socket but not consumed yet: `rx[rx_pos..rx_end]`.
    rx: Box<[u8]>,
    rx_pos: usize,
    rx_end: usize,
    /// Length of the message whose payload is being read, once its header is in.
    incoming: Option<usize>,
    got: usize,
}

impl TcpRecvComm {
    fn read_some(&mut self, buf: *mut u8, len: usize) -> Result<Option<usize>> {
        loop {
            // SAFETY: buf..buf+len is writable memory (our header or the caller's buffer).
            let n = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    buf as *mut libc::c_void,
                    len,
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(peer_error(self.peer, e)),
                }
            }
            if n == 0 {
                return Err(TransportError::PeerClosed { peer: self.peer });
            }
            return Ok(Some(n as usize));
        }
    }

    /// Reads more into the receive buffer (after moving what is left to its start), at most
    /// `limit` bytes. False when the socket had nothing.
    fn fill(&mut self, limit: usize) -> Result<bool> {
        if self.rx_pos == self.rx_end {
            self.rx_pos = 0;
            self.rx_end = 0;
        } else if self.rx_pos > 0 {
            self.rx.copy_within(self.rx_pos..self.rx_end, 0);
            self.rx_end -= self.rx_pos;
            self.rx_pos = 0;
        }
        let room = (self.rx.len() - self.rx_end).min(limit);
        let dst = self.rx[self.rx_end..].as_mut_ptr();
        match self.read_some(dst, room)? {
            Some(n) => {
                self.rx_end += n;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn progress(&mut self) -> Result<()> {
        while let Some(req) = self.slots.front() {
            let (ptr, posted, tag) = (req.ptr, req.len, req.tag);
            if self.incoming.is_none() {
                while self.rx_end - self.rx_pos < HEADER_LEN {
                    // A short message usually comes whole, often with the next ones: read
                    // ahead. Before a long one, take only its header into the buffer.
                    let limit = if posted <= INLINE_MAX {
                        usize::MAX
                    } else {
                        HEADER_LEN - (self.rx_end - self.rx_pos)
                    };
                    if !self.fill(limit)? {
                        return Ok(());
                    }
                }
                let mut h = [0u8; HEADER_LEN];
                h.copy_from_slice(&self.rx[self.rx_pos..self.rx_pos + HEADER_LEN]);
                self.rx_pos += HEADER_LEN;
                let len = frame::check(&h, MSG_MAGIC, "tcp", self.peer, tag, posted)?;
                self.incoming = Some(len);
                self.got = 0;
            }
            let want = self.incoming.unwrap_or(0);
            while self.got < want {
                let buffered = self.rx_end - self.rx_pos;
                if buffered > 0 {
                    let k = buffered.min(want - self.got);
                    // SAFETY: got + k <= want <= posted len, inside the caller's buffer
                    // (irecv's contract); the source is initialised buffer bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.rx[self.rx_pos..].as_ptr(),
                            ptr.add(self.got),
                            k,
                        )
                    };
                    self.rx_pos += k;
                    self.got += k;
                    continue;
                }
                let left = want - self.got;
                if left <= INLINE_MAX {
                    if !self.fill(usize::MAX)? {
                        return Ok(());
                    }
                    continue;
                }
                // SAFETY: got < want <= posted len, inside the caller's buffer.
                let dst = unsafe { ptr.add(self.got) };
                match self.read_some(dst, left)? {
                    Some(n) => self.got += n,
                    None => return Ok(()),
                }
            }
            self.slots.complete_front(want);
            self.incoming = None;
        }
        Ok(())
    }
}

impl RecvComm for TcpRecvComm {
    unsafe fn irecv(
        &mut self,
        registration: &Registration,
        ptr: *mut u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        self.slots.post(RecvReq { ptr, len, tag })
    }

    fn test(&mut self, request: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        self.slots.take(request)
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn channel(&self) -> u32 {
        self.channel
    }

    fn readiness_fd(&self) -> Option<i32> {
        Some(self.stream.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
