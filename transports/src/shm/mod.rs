//! Shared-memory transport for ranks on the same host.
//!
//! Each connection (one direction, one channel) owns a segment: a control page with the
//! ring's counters followed by a single-producer single-consumer byte ring (4 MiB by default).
//! The connector creates the segment's file and hands it to the listener over a unix-domain
//! socket with `SCM_RIGHTS`, together with a hello frame (magic, protocol version, job token,
//! rank, channel, ring size) so that strangers are refused as on TCP. What the file and the
//! socket are is the [`Platform`]'s business ([`ShmConfig::platform`]): on Linux a sealed memfd
//! and an abstract socket, on every system a POSIX shared-memory object unlinked at once and a
//! socket file. Either way the segment has no name once handed over: it disappears when both
//! ends have unmapped it, so a crashed job leaves nothing behind in `/dev/shm`.
//!
//! The ring carries the same stream as the TCP transport: a 16-byte header (magic, tag, length)
//! per message followed by its payload, copied in by the sender and out by the receiver in
//! chunks so that both sides work at once on a large message. `head` (consumer) and `tail`
//! (producer) are free-running byte counters on their own cache lines, published with Release
//! and read with Acquire; each side caches the other's counter and only rereads it when it
//! runs out of data or space.
//!
//! Single copy (where the platform has cross-memory reads: Linux): a message of at least
//! [`CMA_MIN`] bytes does not go through the ring. The
//! sender writes only its header and the payload's address; the receiver copies the payload
//! straight out of the sender's memory with `process_vm_readv` (Linux cross-memory attach,
//! one copy instead of two) and acknowledges it through a counter in the segment, which
//! completes the send. The acceptor proves at connect time that it may read the peer's memory
//! (same user, no ptrace restriction): it reads a known word at an address the hello names,
//! and only then raises `cma_ok`, so a container without that permission simply keeps using
//! the ring.
//!
//! Liveness: a side that drops its comm raises its `closed` flag in the segment, which the peer
//! sees at once; a side that dies without dropping (killed, crashed) is noticed through the
//! unix socket, which stays open for the connection's lifetime and hangs up when the process
//! goes away.
//!
//! Sleeping: a side with nothing to do spins, then yields (the waiter in `busbw-collectives`
//! decides how long), then sleeps in poll(2) on the unix socket. Before it sleeps it raises its
//! `sleeping` flag in the segment and looks at the counters once more; the other side, after
//! every counter it publishes, checks that flag (one load from a line that is almost never
//! written) and, only when it is up, takes it down and writes one doorbell byte to the socket.
//! A fence on both sides (the flag store before the counter load, the counter store before
//! the flag load) guarantees that either the sleeper sees the new counter or the publisher
//! sees the flag, so no wake-up is lost. This is a futex handshake with the socket as the
//! wait queue: poll(2) can wait on a TCP socket and several shared-memory peers at once,
//! which a bare futex cannot, and the same socket already reports a dead peer.

use crate::conn::{self, poll_fd, Deadline, Dialect, HelloHead, TextHandle};
use crate::frame::{self, HEADER_LEN};
use crate::framed::{FramedRecv, Inbound, Posted};
use crate::platform::{self, CrossMemory, LocalListener, Platform};
use crate::slots::Slots;
use crate::{
    Handle, Identity, Listener, Properties, RecvComm, Registration, RequestId, Result, SendComm,
    Sleep, Transport, TransportError,
};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

const DIALECT: Dialect = Dialect {
    magic: 0x6275_7362_775f_7368, // "busbw_sh"
    version: PROTOCOL_VERSION,
    name: "busbw shm",
};
/// 2: the segment grew the sleeping flags and the socket carries doorbell bytes.
const PROTOCOL_VERSION: u32 = 2;
/// magic, version, rank, job, channel, (pad), ring size, pid, (pad), probe address.
const HELLO_LEN: usize = 56;
const SEGMENT_MAGIC: u64 = 0x6275_7362_775f_7367; // "busbw_sg"
const MSG_MAGIC: u32 = 0xb05b_5e11;
/// A message whose payload stays in the sender's memory; an 8-byte address follows the header.
const MSG_MAGIC_CMA: u32 = 0xb05b_c3a0;
const CMA_DESC: usize = 8;
/// Messages at least this long are copied once, by the receiver, from the sender's memory.
pub const CMA_MIN: usize = 64 << 10;
/// What the acceptor reads from the connector's memory to prove it may (see the module docs).
static CMA_PROBE: u64 = 0x6275_7362_775f_636d; // "busbw_cm"
const HANDLE_PREFIX: &str = "busbw-shm/1";
/// The control page in front of the ring.
const CONTROL_BYTES: usize = 4096;
/// Largest piece copied before the counter is published, so the peer starts on it early.
const CHUNK: usize = 256 << 10;
/// A stalled side looks at the unix socket once per this many stalled progress calls.
const LIVENESS_EVERY: u32 = 64;
const MIN_RING: usize = 4096;
const MAX_RING: usize = 1 << 32;

/// Tunables for [`ShmTransport`].
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Ring size in bytes per connection (a power of two, at least 4 KiB). The connector's
    /// value is used.
    pub ring_bytes: usize,
    /// Requests that may be in flight on one comm.
    pub max_requests: usize,
    /// Copy large messages once, from the sender's memory, where the kernel allows it.
    pub single_copy: bool,
    /// The operating-system calls behind segments and sockets (`BUSBW_PLATFORM` by
    /// default); single copy exists only where it has cross-memory reads.
    pub platform: Platform,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            ring_bytes: 4 << 20,
            max_requests: 256,
            single_copy: true,
            platform: Platform::active(),
        }
    }
}

/// Shared-memory transport for one rank. Only peers on the same host (and in the same network
/// namespace, which scopes abstract unix sockets; in the same file system, for socket files)
/// can connect.
#[derive(Debug)]
pub struct ShmTransport {
    identity: Identity,
    config: ShmConfig,
}

impl ShmTransport {
    /// Panics if `config.ring_bytes` is not a power of two in 4 KiB ..= 4 GiB.
    pub fn new(identity: Identity, config: ShmConfig) -> Self {
        assert!(
            valid_ring(config.ring_bytes),
            "shm ring size {} is not a power of two in {MIN_RING}..={MAX_RING}",
            config.ring_bytes
        );
        ShmTransport { identity, config }
    }
}

fn valid_ring(n: usize) -> bool {
    n.is_power_of_two() && (MIN_RING..=MAX_RING).contains(&n)
}

/// Parses `busbw-shm/1 rank=<r> pid=<pid> sock=<@abstract name or /path> auth=<challenge>`.
fn parse_handle(handle: &Handle) -> Result<(u32, String)> {
    let h = TextHandle::parse(handle, HANDLE_PREFIX, "an shm")?;
    let sock = h
        .field("sock=")
        .filter(|s| (s.len() > 1 && s.starts_with('@') || s.starts_with('/')) && s.len() < 100);
    Ok((h.rank, sock.ok_or_else(|| h.lacks("sock="))?.to_string()))
}

mod comm;
mod segment;

use comm::{ShmInbound, ShmSendComm};
use segment::{arm, create_segment, drain_doorbells, hung_up, wake_if_sleeping, Segment};

/// Sends the hello frame with the segment's descriptor attached.
fn send_hello(
    sock: RawFd,
    hello: &[u8; HELLO_LEN],
    fd: RawFd,
    deadline: &Deadline,
) -> io::Result<()> {
    loop {
        let mut iov = libc::iovec {
            iov_base: hello.as_ptr() as *mut libc::c_void,
            iov_len: HELLO_LEN,
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: the control buffer is 64 aligned bytes, enough for one descriptor's cmsg;
        // the msghdr points at live locals for the duration of sendmsg.
        let n = unsafe {
            let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
            libc::sendmsg(sock, &msg, platform::SEND_FLAGS)
        };
        if n == HELLO_LEN as isize {
            return Ok(());
        }
        if n >= 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short write of the hello frame",
            ));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => {
                let left = deadline.left().ok_or(io::ErrorKind::TimedOut)?;
                poll_fd(sock, libc::POLLOUT, left.min(Duration::from_millis(50)))?;
            }
            _ => return Err(e),
        }
    }
}

/// Reads the hello frame and the descriptor that comes with it.
fn recv_hello(stream: &UnixStream) -> io::Result<([u8; HELLO_LEN], Option<OwnedFd>)> {
    let mut hello = [0u8; HELLO_LEN];
    let mut iov = libc::iovec {
        iov_base: hello.as_mut_ptr() as *mut libc::c_void,
        iov_len: HELLO_LEN,
    };
    let mut cbuf = [0u64; 8];
    let mut fd = None;
    let n = loop {
        // SAFETY: the msghdr points at live locals; received descriptors are taken into
        // OwnedFds right away so none leaks.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
            let n = libc::recvmsg(stream.as_raw_fd(), &mut msg, platform::RECV_FD_FLAGS);
            if n >= 0 {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        let data = libc::CMSG_DATA(c) as *const RawFd;
                        let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                        for i in 0..bytes / std::mem::size_of::<RawFd>() {
                            let got = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                            if fd.is_none() {
                                fd = Some(got);
                            }
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            n
        };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if let Some(fd) = &fd {
        platform::received_descriptor(fd)?;
    }
    if n < HELLO_LEN {
        let mut s = stream;
        s.read_exact(&mut hello[n..])?;
    }
    Ok((hello, fd))
}

static NEXT_LISTENER: AtomicU64 = AtomicU64::new(0);

impl Transport for ShmTransport {
    fn properties(&self) -> Properties {
        Properties::host_only("shm", self.config.max_requests)
    }

    fn identity(&self) -> Identity {
        self.identity
    }

    fn listen(&self) -> Result<(Handle, Box<dyn Listener>)> {
        let pid = std::process::id();
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let name = format!(
            "busbw-shm.{pid}.{}.{nonce:x}",
            NEXT_LISTENER.fetch_add(1, Ordering::Relaxed)
        );
        let listener = self.config.platform.local_listener(&name)?;
        let gate = crate::auth::DataGate::new(&self.identity);
        let handle = Handle(
            format!(
                "{HANDLE_PREFIX} rank={} pid={pid} sock={}{}",
                self.identity.rank,
                listener.addr(),
                gate.handle_field()
            )
            .into_bytes(),
        );
        Ok((
            handle,
            Box::new(ShmListener {
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
        let (peer, name) = parse_handle(handle)?;
        let deadline = Deadline::after(timeout);
        let io_err = |error| TransportError::PeerIo { peer, error };
        // The listener exists before its handle is published, but its backlog may be full
        // while the peer is busy connecting itself: retry to the deadline.
        let sock = loop {
            if let Some(s) = platform::connect_local(&name).map_err(io_err)? {
                break s;
            }
            let left = deadline.left_or(|| {
                format!(
                    "connecting to rank {peer} over shared memory at {name} \
                     (is it on this host and in this network namespace?)"
                )
            })?;
            std::thread::sleep(Duration::from_millis(10).min(left));
        };
        let ring_bytes = self.config.ring_bytes;
        let platform = self.config.platform;
        let (memfd, seg) = create_segment(platform, ring_bytes).map_err(io_err)?;
        let mut hello = [0u8; HELLO_LEN];
        let head = HelloHead {
            rank: self.identity.rank,
            job: self.identity.job,
            channel,
        };
        DIALECT.encode(&head, &mut hello);
        hello[32..40].copy_from_slice(&(ring_bytes as u64).to_le_bytes());
        hello[40..44].copy_from_slice(&std::process::id().to_le_bytes());
        // Only a platform that could read the peer's memory asks to have its own read.
        let probe = if self.config.single_copy && platform.cross_memory().is_some() {
            &CMA_PROBE as *const u64 as u64
        } else {
            0
        };
        hello[48..56].copy_from_slice(&probe.to_le_bytes());
        let tail = crate::auth::tail_for(&handle.0, &self.identity, &hello)
            .map_err(TransportError::BadHandle)?;
        send_hello(sock.as_raw_fd(), &hello, memfd.as_raw_fd(), &deadline).map_err(io_err)?;
        // A fresh socket's buffer takes these 48 bytes whole, in one send.
        // SAFETY: send from a live buffer of the given length on a socket we own.
        let sent = unsafe {
            libc::send(
                sock.as_raw_fd(),
                tail.as_ptr().cast(),
                tail.len(),
                platform::SEND_FLAGS,
            )
        };
        if sent != tail.len() as isize {
            return Err(io_err(io::Error::last_os_error()));
        }
        // The peer holds its own reference now (or will never map it); ours can go.
        drop(memfd);
        Ok(Box::new(ShmSendComm {
            slots: Slots::new(self.config.max_requests, peer),
            seg,
            sock,
            peer,
            tail: 0,
            head_cache: 0,
            stalls: 0,
            hangup: false,
            cma_posted: 0,
            cma_acked: 0,
        }))
    }
}

struct ShmListener {
    gate: crate::auth::DataGate,
    listener: LocalListener,
    identity: Identity,
    config: ShmConfig,
}

impl ShmListener {
    /// Reads and checks the hello, maps the segment, and returns (rank, channel, segment), or
    /// why the connection is not one of ours.
    fn handshake(
        &self,
        stream: &UnixStream,
    ) -> std::result::Result<(u32, u32, Segment, i32, Option<CrossMemory>), String> {
        let (hello, fd) =
            recv_hello(stream).map_err(|e| format!("no complete hello frame ({e})"))?;
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&hello[r]);
            u64::from_le_bytes(b)
        };
        let HelloHead { rank, channel, .. } = DIALECT.decode(&hello, self.identity.job)?;
        // Before the segment is mapped or the claimed pid's memory probed.
        self.gate.admit(stream, &hello, rank)?;
        let ring_bytes = word(32..40) as usize;
        if !valid_ring(ring_bytes) {
            return Err(format!(
                "rank {rank} asked for a ring of {ring_bytes} bytes"
            ));
        }
        let fd = fd.ok_or_else(|| format!("rank {rank} sent no shared-memory segment"))?;
        // The segment must be as large as announced and (where the platform can seal)
        // unable to shrink under us.
        let platform = self.config.platform;
        platform
            .check_received(fd.as_fd(), CONTROL_BYTES + ring_bytes)
            .map_err(|e| format!("rank {rank} sent {e}, for a {ring_bytes}-byte ring"))?;
        let seg = Segment::map(platform, &fd, ring_bytes).map_err(|e| format!("mmap: {e}"))?;
        let ctl = seg.ctl();
        if ctl.magic != SEGMENT_MAGIC || ctl.ring_bytes != ring_bytes as u64 {
            return Err(format!("rank {rank} sent an uninitialised segment"));
        }
        let pid = word(40..44) as i32;
        let probe = word(48..56);
        let cross = platform.cross_memory().filter(|c| {
            probe != 0 && self.config.single_copy && c.read_u64(pid, probe) == Some(CMA_PROBE)
        });
        if cross.is_some() {
            ctl.cma_ok.store(1, Ordering::Release);
        }
        Ok((rank, channel, seg, pid, cross))
    }
}

impl Listener for ShmListener {
    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn RecvComm>> {
        let deadline = Deadline::after(timeout);
        let (stream, (peer, channel, seg, peer_pid, cross)) = conn::accept(
            self.listener.listener(),
            &deadline,
            ("shared-memory connection", " over shared memory"),
            |s| self.handshake(s),
        )?;
        stream.set_nonblocking(true)?;
        let inbound = ShmInbound {
            seg,
            sock: stream.into(),
            peer,
            head: 0,
            tail_cache: 0,
            head_published: 0,
            incoming: None,
            got: 0,
            stalls: 0,
            hangup: false,
            peer_pid,
            cross,
            remote: None,
            cma_done: 0,
        };
        Ok(Box::new(FramedRecv::new(
            inbound,
            peer,
            channel,
            self.config.max_requests,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trip_and_rejects() {
        let h = Handle(b"busbw-shm/1 rank=3 pid=12 sock=@busbw-shm.12.0.ff".to_vec());
        let (r, s) = parse_handle(&h).unwrap();
        assert_eq!((r, s.as_str()), (3, "@busbw-shm.12.0.ff"));
        assert!(parse_handle(&Handle(b"garbage".to_vec())).is_err());
        assert!(parse_handle(&Handle(b"busbw-shm/1 rank=x sock=@a".to_vec())).is_err());
        let file = parse_handle(&Handle(b"busbw-shm/1 rank=1 sock=/tmp/a".to_vec())).unwrap();
        assert_eq!(file.1, "/tmp/a", "a socket file (the portable platform's)");
        assert!(parse_handle(&Handle(b"busbw-shm/1 rank=1 sock=tmp/a".to_vec())).is_err());
        assert!(parse_handle(&Handle(b"busbw-shm/1 rank=1 sock=@".to_vec())).is_err());
        assert!(parse_handle(&Handle(b"busbw-tcp/1 rank=1 addr=127.0.0.1:1".to_vec())).is_err());
        assert!(parse_handle(&Handle(vec![0xff, 0xfe])).is_err());
    }

    #[test]
    fn ring_wraps_around() {
        for &p in Platform::ALL {
            ring_wraps_around_on(p);
        }
    }

    fn ring_wraps_around_on(platform: Platform) {
        let (_fd, seg) = create_segment(platform, MIN_RING).unwrap();
        let src: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut dst = vec![0u8; 1000];
        let pos = (MIN_RING - 300) as u64 + 7 * MIN_RING as u64;
        unsafe {
            seg.write(pos, src.as_ptr(), src.len());
            seg.read(pos, dst.as_mut_ptr(), dst.len());
        }
        assert_eq!(src, dst);
    }
}
