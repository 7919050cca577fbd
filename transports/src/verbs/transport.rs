//! [`VerbsTransport`]: the trait over RC queue pairs, the protocol of [`super::proto`] and the
//! handshake of [`super::handshake`] on a bootstrap TCP socket.
//!
//! `connect` creates the queue pairs and the FIFO, sends its hello and returns at once (it
//! never waits for the peer to accept); the comm finishes the handshake as it is progressed:
//! it reads the acceptor's reply, moves its queue pairs to RTS and sends one "ready" byte, on
//! which the receiving side starts announcing buffers. Both ends therefore only write to
//! queue pairs that are already ready to receive.

use super::gpudirect::{self, GpuDirect};
use super::handshake::{self, Hello, ListenInfo, PortAddr, Reply};
use super::ib::{Cq, Device, OwnedMr, PathParams, Qp};
use super::proto::{
    self, credit_offset, Completion, Cts, Local, ProtoConfig, RecvProto, RecvWire, SendProto,
    SendWire, CTS_LEN, EAGER_HEADER,
};
use super::{pick_port, PortChoice, VerbsConfig};
use crate::conn::{self, Deadline, HELLO_WAIT};
use crate::{
    Handle, Identity, Listener, MemRegion, Properties, PtrSupport, RecvComm, Registration,
    RequestId, Result, SendComm, Transport, TransportError,
};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const READY: u8 = 0x5a;

/// The RDMA verbs transport of one rank: one device port (this local rank's rail).
pub struct VerbsTransport {
    identity: Identity,
    cfg: VerbsConfig,
    bind: IpAddr,
    advertise: Option<IpAddr>,
    choice: PortChoice,
    dev: Arc<Device>,
    gpudirect: GpuDirect,
}

impl VerbsTransport {
    /// Opens this rank's port. Fails, with what to check, when there is none (no RDMA in the
    /// kernel, no active port, nothing left after `NCCL_IB_HCA`).
    pub fn new(
        identity: Identity,
        cfg: VerbsConfig,
        bind: IpAddr,
        advertise: Option<IpAddr>,
    ) -> Result<Self> {
        let choice = pick_port(&cfg).map_err(TransportError::Unsupported)?;
        let dev = Device::open(&choice.device, choice.port, choice.gid.index)?;
        let gpudirect = GpuDirect::detect(cfg.sysfs.root(), dev.dmabuf_probe());
        Ok(VerbsTransport {
            gpudirect,
            identity,
            cfg,
            bind,
            advertise,
            choice,
            dev: Arc::new(dev),
        })
    }

    /// `mlx5_0:1 GID 3 ::ffff:10.0.0.7 (RoCE v2) (auto)`.
    pub fn describe(&self) -> String {
        self.choice.describe()
    }

    /// Which device-memory registrations this node's verbs stack accepts, and why not.
    pub fn gpudirect(&self) -> &GpuDirect {
        &self.gpudirect
    }

    fn proto_config(&self) -> ProtoConfig {
        ProtoConfig {
            depth: self.cfg.depth,
            qps: 1,
            timeout: self.cfg.stall_timeout,
            // Set from the acceptor's reply: nothing goes eagerly before it agreed.
            eager: 0,
        }
    }

    fn params(&self, remote: &PortAddr) -> PathParams {
        PathParams {
            mtu: handshake::path_mtu(&self.dev.addr, remote),
            traffic_class: self.cfg.traffic_class,
            service_level: self.cfg.service_level,
            ack_timeout: self.cfg.ack_timeout,
            retry_cnt: self.cfg.retry_cnt,
        }
    }

    fn qps(&self, cq: &Cq, n: usize, recv: bool) -> Result<Vec<Qp>> {
        let d = self.cfg.depth as u32 + 8;
        (0..n)
            .map(|_| self.dev.qp(cq, d, if recv { d } else { 1 }))
            .collect()
    }
}

/// Names libibverbs sees, or why it sees none (`busbw doctor`, `--transport verbs` checks).
pub fn library_devices() -> std::result::Result<Vec<String>, String> {
    super::ib::device_names().map_err(|e| {
        let hint = if e.raw_os_error() == Some(libc::ENOSYS) {
            ": the kernel has no RDMA support (no ib_core / RDMA driver)"
        } else {
            ""
        };
        format!("ibv_get_device_list failed: {e}{hint}")
    })
}

fn speed_mbps(rate: Option<&str>) -> Option<u64> {
    let r = rate?;
    let gbps: f64 = r.split_whitespace().next()?.parse().ok()?;
    Some((gbps * 1000.0) as u64)
}

fn read_frame(s: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > handshake::MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{n}-byte frame"),
        ));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

impl Transport for VerbsTransport {
    fn properties(&self) -> Properties {
        let rate = self
            .cfg
            .sysfs
            .device(&self.choice.device)
            .ports
            .into_iter()
            .find(|p| p.num == self.choice.port)
            .and_then(|p| p.rate);
        Properties {
            name: "verbs",
            speed_mbps: speed_mbps(rate.as_deref()),
            latency_us: None,
            ptr_support: PtrSupport {
                host: true,
                cuda: self.gpudirect.peermem.is_some(),
                dmabuf: self.gpudirect.dmabuf.is_ok(),
            },
            max_requests: self.cfg.depth,
        }
    }

    fn identity(&self) -> Identity {
        self.identity
    }

    fn listen(&self) -> Result<(Handle, Box<dyn Listener>)> {
        let listener = TcpListener::bind(SocketAddr::new(self.bind, 0))?;
        let local = listener.local_addr()?;
        let ip = if local.ip().is_unspecified() {
            self.advertise.ok_or_else(|| {
                TransportError::Unsupported(format!(
                    "verbs bootstrap listens on {local} but has no address to advertise"
                ))
            })?
        } else {
            local.ip()
        };
        listener.set_nonblocking(true)?;
        let gate = crate::auth::DataGate::new(&self.identity);
        let info = ListenInfo {
            rank: self.identity.rank,
            bootstrap: SocketAddr::new(ip, local.port()),
            device: format!("{}:{}", self.choice.device, self.choice.port),
            port: self.dev.addr,
            qps: self.cfg.qps,
            challenge: *gate.challenge(),
        };
        Ok((
            Handle(info.encode()),
            Box::new(VerbsListener {
                listener,
                gate,
                owner: self.clone_parts(),
            }),
        ))
    }

    fn connect(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
    ) -> Result<Box<dyn SendComm>> {
        let info = ListenInfo::decode(&handle.0).map_err(TransportError::BadHandle)?;
        let peer = info.rank;
        let n = self.cfg.qps.max(info.qps) as usize;
        let cq = self.dev.cq(self.cfg.depth * 2 + 16)?;
        let qps = self.qps(&cq, n, false)?;
        // The FIFO, then the receiver's credit word.
        let fifo = self.dev.buffer(credit_offset(self.cfg.depth) + 8)?;
        let hello = Hello {
            job: self.identity.job,
            rank: self.identity.rank,
            channel,
            port: self.dev.addr,
            qpns: qps.iter().map(Qp::num).collect(),
            fifo_addr: fifo.addr(),
            fifo_rkey: fifo.mr.rkey(),
            fifo_depth: self.cfg.depth as u32,
            eager: self.cfg.eager as u32,
        };
        let addr = info.bootstrap;
        let mut stream = conn::connect_tcp(addr, peer, &Deadline::after(timeout), || {
            format!("connecting to rank {peer}'s verbs bootstrap at {addr}")
        })?;
        let io_err = |error| TransportError::PeerIo { peer, error };
        stream.set_nodelay(true).map_err(io_err)?;
        stream.set_write_timeout(Some(HELLO_WAIT)).map_err(io_err)?;
        // The hello, then the proof of the job token over the listener's challenge and this
        // very hello (a fresh nonce each time: the listener refuses replays).
        let hello = hello.encode();
        let tail = crate::auth::data_tail(&self.identity.data_key(), &info.challenge, &hello);
        stream
            .write_all(&[handshake::frame(&hello), tail.to_vec()].concat())
            .map_err(io_err)?;
        stream.set_nonblocking(true).map_err(io_err)?;
        let mut cfg = self.proto_config();
        cfg.qps = n;
        Ok(Box::new(VerbsSendComm {
            qps,
            cq,
            fifo,
            eager: None,
            eager_offered: self.cfg.eager,
            depth: self.cfg.depth,
            dev: self.dev.clone(),
            peer,
            proto: SendProto::new(peer, cfg),
            boot: Boot::AwaitReply {
                stream,
                got: Vec::new(),
                since: Instant::now(),
            },
            params: self.params(&info.port),
            stall: self.cfg.stall_timeout,
        }))
    }

    fn register(&self, region: MemRegion) -> Result<Registration> {
        let path = gpudirect::reg_path(&region, &self.gpudirect)?;
        self.dev.register(region, path)
    }

    fn deregister(&self, registration: Registration) -> Result<()> {
        self.dev.release(&registration);
        Ok(())
    }
}

/// What a listener needs of its transport.
struct Parts {
    identity: Identity,
    cfg: VerbsConfig,
    dev: Arc<Device>,
}

impl VerbsTransport {
    fn clone_parts(&self) -> Parts {
        Parts {
            identity: self.identity,
            cfg: self.cfg.clone(),
            dev: self.dev.clone(),
        }
    }
}

struct VerbsListener {
    listener: TcpListener,
    /// The job-token check every bootstrap connection passes before its hello is believed.
    gate: crate::auth::DataGate,
    owner: Parts,
}

impl VerbsListener {
    /// Reads and checks a hello; `Err(why)` refuses the stranger.
    fn hello(&self, stream: &mut TcpStream) -> std::result::Result<Hello, String> {
        let b = read_frame(stream).map_err(|e| format!("no complete hello ({e})"))?;
        let h = Hello::decode(&b)?;
        conn::same_job(h.rank, h.job, self.owner.identity.job)?;
        self.gate.admit(&mut *stream, &b, h.rank)?;
        if h.fifo_depth as usize != self.owner.cfg.depth {
            return Err(format!(
                "rank {} uses {} messages in flight where {} is used here",
                h.rank, h.fifo_depth, self.owner.cfg.depth
            ));
        }
        Ok(h)
    }

    fn accept_one(&self, mut stream: TcpStream, h: Hello) -> Result<Box<dyn RecvComm>> {
        let o = &self.owner;
        let peer = h.rank;
        let n = h.qpns.len();
        let cq = o.dev.cq(o.cfg.depth * 3 + 16)?;
        let d = o.cfg.depth as u32 + 8;
        let qps: Vec<Qp> = (0..n).map(|_| o.dev.qp(&cq, d, d)).collect::<Result<_>>()?;
        let params = PathParams {
            mtu: handshake::path_mtu(&o.dev.addr, &h.port),
            traffic_class: o.cfg.traffic_class,
            service_level: o.cfg.service_level,
            ack_timeout: o.cfg.ack_timeout,
            retry_cnt: o.cfg.retry_cnt,
        };
        for (q, qpn) in qps.iter().zip(&h.qpns) {
            q.connect(&o.dev, *qpn, &h.port, &params)
                .map_err(|e| TransportError::Rdma {
                    peer,
                    msg: e.to_string(),
                })?;
        }
        // FIFO entries to write, then the credit word.
        let staging = o.dev.buffer(credit_offset(o.cfg.depth) + 8)?;
        let eager = (h.eager as usize).min(o.cfg.eager);
        let ring = if eager > 0 {
            Some(o.dev.buffer(o.cfg.depth * (EAGER_HEADER + eager))?)
        } else {
            None
        };
        let reply = Reply {
            port: o.dev.addr,
            qpns: qps.iter().map(Qp::num).collect(),
            eager: eager as u32,
            eager_addr: ring.as_ref().map_or(0, OwnedMr::addr),
            eager_rkey: ring.as_ref().map_or(0, |r| r.mr.rkey()),
        };
        let cfg = ProtoConfig {
            depth: o.cfg.depth,
            qps: n,
            timeout: o.cfg.stall_timeout,
            eager,
        };
        let mut comm = VerbsRecvComm {
            qps,
            cq,
            staging,
            ring,
            stride: EAGER_HEADER + eager,
            credit_at: credit_offset(o.cfg.depth),
            _dev: o.dev.clone(),
            peer,
            channel: h.channel,
            fifo_addr: h.fifo_addr,
            fifo_rkey: h.fifo_rkey,
            proto: RecvProto::new(peer, cfg),
            boot: None,
            alive: None,
            stall: o.cfg.stall_timeout,
        };
        // Receives are posted before the connector learns our queue pairs: its first eager
        // write may follow the reply at once.
        let mut wire = RecvSide {
            qps: &comm.qps,
            cq: &comm.cq,
            staging: &mut comm.staging,
            ring: comm.ring.as_ref(),
            stride: comm.stride,
            credit_at: comm.credit_at,
            fifo_addr: comm.fifo_addr,
            fifo_rkey: comm.fifo_rkey,
        };
        comm.proto.prime(&mut wire)?;
        let io_err = |error| TransportError::PeerIo { peer, error };
        stream.set_write_timeout(Some(HELLO_WAIT)).map_err(io_err)?;
        stream
            .write_all(&handshake::frame(&reply.encode()))
            .map_err(io_err)?;
        stream.set_nonblocking(true).map_err(io_err)?;
        comm.boot = Some((stream, Instant::now()));
        Ok(Box::new(comm))
    }
}

impl Listener for VerbsListener {
    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn RecvComm>> {
        let (stream, h) = conn::accept(
            &self.listener,
            &Deadline::after(timeout),
            ("verbs bootstrap connection", ""),
            |s| self.hello(s),
        )?;
        self.accept_one(stream, h)
    }
}

/// The connector's side of the bootstrap exchange.
enum Boot {
    AwaitReply {
        stream: TcpStream,
        got: Vec<u8>,
        since: Instant,
    },
    Ready {
        alive: Liveness,
    },
}

/// The sender's half of the eager path: where small messages are copied, and where they go.
struct EagerOut {
    staging: OwnedMr,
    /// Bytes per slot, header included (the same on both ends).
    stride: usize,
    remote_addr: u64,
    remote_rkey: u32,
}

struct VerbsSendComm {
    // Field order is drop order: queue pairs before their CQ, then the FIFO, then the device.
    qps: Vec<Qp>,
    cq: Cq,
    fifo: OwnedMr,
    /// Once the reply agreed to an eager threshold: the staging slots and the peer's ring.
    eager: Option<EagerOut>,
    /// The threshold this side offered in its hello, and the FIFO depth.
    eager_offered: usize,
    depth: usize,
    dev: Arc<Device>,
    peer: u32,
    proto: SendProto,
    boot: Boot,
    params: PathParams,
    stall: Duration,
}

/// Reads what is there without blocking; `Ok(false)` on end of stream.
fn read_some(stream: &mut TcpStream, into: &mut Vec<u8>, peer: u32) -> Result<bool> {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(false),
            Ok(n) => into.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(TransportError::PeerIo { peer, error }),
        }
    }
}

impl VerbsSendComm {
    fn finish_boot(&mut self) -> Result<bool> {
        let Boot::AwaitReply { stream, got, since } = &mut self.boot else {
            return Ok(true);
        };
        let peer = self.peer;
        let open = read_some(stream, got, peer)?;
        let whole = got.len() >= 4
            && got.len() >= 4 + u32::from_le_bytes([got[0], got[1], got[2], got[3]]) as usize;
        if !whole {
            if !open {
                return Err(TransportError::Handshake(format!(
                    "rank {peer} closed the verbs bootstrap before replying (see its log)"
                )));
            }
            if since.elapsed() > self.stall {
                return Err(TransportError::Timeout {
                    secs: self.stall.as_secs_f64(),
                    what: format!("waiting for rank {peer} to accept the verbs connection"),
                });
            }
            return Ok(false);
        }
        let reply = Reply::decode(&got[4..]).map_err(TransportError::Handshake)?;
        if reply.qpns.len() != self.qps.len() {
            return Err(TransportError::Handshake(format!(
                "rank {peer} answered with {} queue pairs for {}",
                reply.qpns.len(),
                self.qps.len()
            )));
        }
        if reply.eager as usize > self.eager_offered {
            return Err(TransportError::Handshake(format!(
                "rank {peer} set an eager threshold of {} bytes, above the {} offered",
                reply.eager, self.eager_offered
            )));
        }
        if reply.eager > 0 {
            let stride = EAGER_HEADER + reply.eager as usize;
            self.eager = Some(EagerOut {
                staging: self.dev.buffer(self.depth * stride)?,
                stride,
                remote_addr: reply.eager_addr,
                remote_rkey: reply.eager_rkey,
            });
            self.proto.set_eager(reply.eager as usize);
        }
        self.params.mtu = handshake::path_mtu(&self.dev.addr, &reply.port);
        for (q, qpn) in self.qps.iter().zip(&reply.qpns) {
            q.connect(&self.dev, *qpn, &reply.port, &self.params)
                .map_err(|e| TransportError::Rdma {
                    peer,
                    msg: e.to_string(),
                })?;
        }
        let mut s = stream
            .try_clone()
            .map_err(|error| TransportError::PeerIo { peer, error })?;
        s.set_nonblocking(false)
            .map_err(|error| TransportError::PeerIo { peer, error })?;
        s.set_write_timeout(Some(HELLO_WAIT))
            .map_err(|error| TransportError::PeerIo { peer, error })?;
        s.write_all(&[READY])
            .map_err(|error| TransportError::PeerIo { peer, error })?;
        // The same socket then watches the peer (its peeks never block, whatever the mode).
        self.boot = Boot::Ready {
            alive: Liveness::new(s),
        };
        Ok(true)
    }

    fn progress(&mut self) -> Result<()> {
        if !self.finish_boot()? {
            return Ok(());
        }
        let mut wire = SendSide {
            qps: &self.qps,
            cq: &self.cq,
            fifo: self.fifo.mem.as_ptr(),
            credit_at: credit_offset(self.depth),
            eager: self.eager.as_mut(),
        };
        self.proto.progress(&mut wire, Instant::now())
    }
}

struct SendSide<'a> {
    qps: &'a [Qp],
    cq: &'a Cq,
    fifo: *const u8,
    credit_at: usize,
    eager: Option<&'a mut EagerOut>,
}

impl SendWire for SendSide<'_> {
    fn read_cts(&self, slot: usize) -> Cts {
        let mut b = [0u8; CTS_LEN];
        // SAFETY: slot < depth, inside the FIFO; the NIC writes it concurrently, hence
        // volatile reads: the marker (last in the entry, placed last by the write) first, then
        // an acquire fence, then the rest.
        unsafe {
            let base = self.fifo.add(slot * CTS_LEN);
            for (i, x) in b.iter_mut().enumerate().skip(28) {
                *x = std::ptr::read_volatile(base.add(i));
            }
            fence(Ordering::Acquire);
            for (i, x) in b.iter_mut().enumerate().take(28) {
                *x = std::ptr::read_volatile(base.add(i));
            }
        }
        Cts::decode(&b)
    }
    fn post_write_imm(
        &mut self,
        qp: usize,
        local: Local,
        remote: u64,
        rkey: u32,
        imm: u32,
        wr_id: u64,
    ) -> Result<()> {
        self.qps[qp].write(local, remote, rkey, Some(imm), wr_id)
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        self.cq.poll(out)
    }
    fn read_credit(&self) -> u64 {
        // SAFETY: the credit word lies behind the FIFO, inside its buffer, 8-byte aligned
        // (the buffer is a boxed slice of depth * 32 + 8 bytes); the peer's NIC writes it
        // whole, and a stale value only delays an eager message.
        unsafe { std::ptr::read_volatile(self.fifo.add(self.credit_at) as *const u64) }
    }
    fn post_eager(
        &mut self,
        qp: usize,
        slot: usize,
        src: Local,
        tag: u32,
        imm: u32,
        wr_id: u64,
    ) -> Result<()> {
        let Some(e) = self.eager.as_deref_mut() else {
            return Err(TransportError::Unsupported(
                "an eager write on a connection without an eager ring".into(),
            ));
        };
        // Only the header is staged (the protocol reuses a slot only after its write
        // completed); the payload is gathered from the caller's registered buffer.
        let off = slot * e.stride;
        let header = Local {
            addr: e.staging.addr() + off as u64,
            len: EAGER_HEADER as u32,
            lkey: e.staging.mr.lkey(),
        };
        let h = &mut e.staging.mem[off..off + EAGER_HEADER];
        h[..4].copy_from_slice(&src.len.to_le_bytes());
        h[4..8].copy_from_slice(&tag.to_le_bytes());
        let remote = e.remote_addr + off as u64;
        self.qps[qp].write_gather(&[header, src], remote, e.remote_rkey, Some(imm), wr_id)
    }
}

impl SendComm for VerbsSendComm {
    unsafe fn isend(
        &mut self,
        registration: &Registration,
        ptr: *const u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        if len > proto::MAX_MESSAGE {
            return Err(TransportError::Unsupported(format!(
                "a {len}-byte message exceeds the verbs limit of {} bytes per message",
                proto::MAX_MESSAGE
            )));
        }
        let local = Local {
            addr: ptr as u64,
            len: len as u32,
            lkey: (registration.key >> 32) as u32,
        };
        let id = self.proto.post(local, tag, Instant::now())?;
        self.progress()?;
        Ok(id)
    }

    fn test(&mut self, request: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        let done = self.proto.take(request)?;
        let gone = match &mut self.boot {
            Boot::Ready { alive } if done.is_none() => alive.gone(),
            _ => false,
        };
        if gone {
            // Whatever the peer did before it went completed before its socket closed.
            self.progress()?;
            return match self.proto.take(request)? {
                Some(n) => Ok(Some(n)),
                None => Err(Liveness::error(self.peer)),
            };
        }
        Ok(done)
    }

    fn peer(&self) -> u32 {
        self.peer
    }
}

/// The bootstrap socket, kept open for the connection's life as a watch on the peer: when its
/// process dies (or its host closes the socket), the kernel closes the socket at once, while
/// a message the peer was to send simply never comes (no completion at all on our side for a
/// receive, and a retry timeout of up to a minute for a send). Checked only while a request
/// is outstanding, at most every 50 ms.
struct Liveness {
    stream: TcpStream,
    last: Instant,
}

impl Liveness {
    const EVERY: Duration = Duration::from_millis(50);

    fn new(stream: TcpStream) -> Liveness {
        // A peer whose link went down sends no FIN: TCP keepalive probes an idle socket (5 s
        // idle, then 6 probes 2 s apart) and fails it with ETIMEDOUT, so a receiver that has
        // nothing in flight toward the peer (hence no RETRY_EXC to come) still learns it within
        // about 17 s. Not sooner: a host that stops answering for a few seconds is not dead (a
        // loaded hypervisor deschedules a guest for 5 s and more; 3 probes 1 s apart once
        // declared a live peer gone in a test bed of emulated guests).
        let fd = stream.as_raw_fd();
        for (level, name, value) in [
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 5),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 2),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 6),
        ] {
            let v: libc::c_int = value;
            // SAFETY: setsockopt on a socket we own with an int option; a failure only leaves
            // the watch to the FIN of a dead process.
            unsafe {
                libc::setsockopt(
                    fd,
                    level,
                    name,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        Liveness {
            stream,
            last: Instant::now(),
        }
    }

    /// Whether the peer's end of the socket is closed (end of stream or reset).
    fn gone(&mut self) -> bool {
        if self.last.elapsed() < Self::EVERY {
            return false;
        }
        self.last = Instant::now();
        let mut b = [0u8; 1];
        // SAFETY: a one-byte peek into a local buffer on a socket we own.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => true,
            n if n > 0 => false,
            _ => matches!(
                io::Error::last_os_error().raw_os_error(),
                Some(libc::ECONNRESET)
                    | Some(libc::EPIPE)
                    | Some(libc::ENOTCONN)
                    | Some(libc::ETIMEDOUT)
                    | Some(libc::EHOSTUNREACH)
            ),
        }
    }

    fn error(peer: u32) -> TransportError {
        TransportError::Rdma {
            peer,
            msg: "its process ended, its host closed the connection or its link went down (the \
                  verbs bootstrap socket closed or stopped answering keepalives) while a message \
                  to or from it was outstanding"
                .into(),
        }
    }
}

struct VerbsRecvComm {
    qps: Vec<Qp>,
    cq: Cq,
    staging: OwnedMr,
    /// The eager ring (`depth` slots of `stride` bytes) when the connection has one.
    ring: Option<OwnedMr>,
    stride: usize,
    /// Where the credit word sits, in the staging buffer and behind the sender's FIFO.
    credit_at: usize,
    /// Keeps the device open until the queue pairs, CQ and staging above are gone.
    _dev: Arc<Device>,
    peer: u32,
    channel: u32,
    fifo_addr: u64,
    fifo_rkey: u32,
    proto: RecvProto,
    /// The bootstrap socket until the connector's "ready" byte arrives.
    boot: Option<(TcpStream, Instant)>,
    /// Then the same socket, watching the peer.
    alive: Option<Liveness>,
    stall: Duration,
}

struct RecvSide<'a> {
    qps: &'a [Qp],
    cq: &'a Cq,
    staging: &'a mut OwnedMr,
    ring: Option<&'a OwnedMr>,
    stride: usize,
    credit_at: usize,
    fifo_addr: u64,
    fifo_rkey: u32,
}

impl RecvWire for RecvSide<'_> {
    fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()> {
        self.qps[qp].post_empty_recv(wr_id)
    }
    fn post_cts(&mut self, qp: usize, slot: usize, cts: &Cts, wr_id: u64) -> Result<()> {
        let off = slot * CTS_LEN;
        self.staging.mem[off..off + CTS_LEN].copy_from_slice(&cts.encode());
        let local = Local {
            addr: self.staging.addr() + off as u64,
            len: CTS_LEN as u32,
            lkey: self.staging.mr.lkey(),
        };
        self.qps[qp].write(
            local,
            self.fifo_addr + off as u64,
            self.fifo_rkey,
            None,
            wr_id,
        )
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        self.cq.poll(out)
    }
    fn post_credit(&mut self, released: u64, wr_id: u64) -> Result<()> {
        let off = self.credit_at;
        self.staging.mem[off..off + 8].copy_from_slice(&released.to_le_bytes());
        let local = Local {
            addr: self.staging.addr() + off as u64,
            len: 8,
            lkey: self.staging.mr.lkey(),
        };
        self.qps[0].write(
            local,
            self.fifo_addr + off as u64,
            self.fifo_rkey,
            None,
            wr_id,
        )
    }
    fn eager_header(&self, slot: usize) -> (u32, u32) {
        let Some(r) = self.ring else {
            return (u32::MAX, 0);
        };
        let b = &r.mem[slot * self.stride..];
        let w = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        (w(0), w(4))
    }
    fn eager_copy(&mut self, slot: usize, dst: u64, len: u32) {
        let Some(r) = self.ring else {
            return;
        };
        let at = slot * self.stride + EAGER_HEADER;
        let src = &r.mem[at..at + len as usize];
        // SAFETY: dst is the receive's registered host buffer of at least len bytes (the
        // protocol checked len against the receive's size before copying).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
    }
}

impl VerbsRecvComm {
    fn progress(&mut self) -> Result<()> {
        if let Some((stream, since)) = &mut self.boot {
            let mut got = Vec::new();
            let open = read_some(stream, &mut got, self.peer)?;
            match got.first() {
                Some(&READY) => {
                    if let Some((stream, _)) = self.boot.take() {
                        self.alive = Some(Liveness::new(stream));
                    }
                }
                Some(b) => {
                    return Err(TransportError::Handshake(format!(
                        "rank {} sent {b:#x} instead of its ready byte",
                        self.peer
                    )))
                }
                None if !open => return Err(TransportError::PeerClosed { peer: self.peer }),
                None if since.elapsed() > self.stall => {
                    return Err(TransportError::Timeout {
                        secs: self.stall.as_secs_f64(),
                        what: format!(
                            "waiting for rank {} to finish the verbs handshake",
                            self.peer
                        ),
                    })
                }
                None => return Ok(()),
            }
        }
        let mut wire = RecvSide {
            qps: &self.qps,
            cq: &self.cq,
            staging: &mut self.staging,
            ring: self.ring.as_ref(),
            stride: self.stride,
            credit_at: self.credit_at,
            fifo_addr: self.fifo_addr,
            fifo_rkey: self.fifo_rkey,
        };
        self.proto.progress(&mut wire, Instant::now())
    }
}

impl RecvComm for VerbsRecvComm {
    unsafe fn irecv(
        &mut self,
        registration: &Registration,
        ptr: *mut u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        let len = len.min(proto::MAX_MESSAGE) as u32;
        let id = self.proto.post(
            ptr as u64,
            len,
            registration.key as u32,
            tag,
            registration.region.kind() == crate::MemoryKind::Host,
            Instant::now(),
        )?;
        self.progress()?;
        Ok(id)
    }

    fn test(&mut self, request: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        let done = self.proto.take(request)?;
        if done.is_none() && self.alive.as_mut().is_some_and(Liveness::gone) {
            // The peer's last write completed here before its socket closed: look once more.
            self.progress()?;
            return match self.proto.take(request)? {
                Some(n) => Ok(Some(n)),
                None => Err(Liveness::error(self.peer)),
            };
        }
        Ok(done)
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn channel(&self) -> u32 {
        self.channel
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_rate_becomes_a_speed() {
        assert_eq!(speed_mbps(Some("400 Gb/sec (4X NDR)")), Some(400_000));
        assert_eq!(speed_mbps(Some("25 Gb/sec (1X EDR)")), Some(25_000));
        assert_eq!(speed_mbps(None), None);
    }

    /// On a host with an active RDMA port (a RoCE NIC or SoftRoCE: `rdma link add rxe0 type
    /// rxe netdev eth0`), two comms in this process move bytes through the NIC.
    #[test]
    fn loopback_through_the_nic_when_there_is_one() {
        let cfg = VerbsConfig {
            stall_timeout: Duration::from_secs(10),
            ..VerbsConfig::default()
        };
        if let Err(why) = library_devices().and_then(|_| pick_port(&cfg)) {
            // Straight to stderr: the harness captures eprintln!, and a skip must show.
            let _ = writeln!(
                io::stderr(),
                "skipping loopback_through_the_nic_when_there_is_one: no usable RDMA port ({why})"
            );
            return;
        }
        let id = |rank| Identity::new(42, rank);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let a = VerbsTransport::new(id(0), cfg.clone(), ip, None).unwrap();
        let b = VerbsTransport::new(id(1), cfg, ip, None).unwrap();
        let (h, mut l) = a.listen().unwrap();
        let mut s = b.connect(&h, 0, Duration::from_secs(10)).unwrap();
        let mut r = l.accept(Duration::from_secs(10)).unwrap();
        let src: Vec<u8> = (0..1 << 20).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; 1 << 20];
        let sreg = b
            .register(unsafe {
                MemRegion::new(src.as_ptr() as *mut u8, src.len(), crate::MemoryKind::Host)
            })
            .unwrap();
        let rreg = a
            .register(unsafe {
                MemRegion::new(dst.as_mut_ptr(), dst.len(), crate::MemoryKind::Host)
            })
            .unwrap();
        let rid = unsafe { r.irecv(&rreg, dst.as_mut_ptr(), dst.len(), 3) }.unwrap();
        let sid = unsafe { s.isend(&sreg, src.as_ptr(), src.len(), 3) }.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut sd, mut rd) = (None, None);
        while sd.is_none() || rd.is_none() {
            assert!(Instant::now() < deadline, "loopback transfer timed out");
            if sd.is_none() {
                sd = s.test(sid).unwrap();
            }
            if rd.is_none() {
                rd = r.test(rid).unwrap();
            }
        }
        assert_eq!((sd, rd), (Some(src.len()), Some(src.len())));
        assert!(dst == src, "bytes arrived intact");
    }

    /// On a host with an active RDMA port: the advertised pointer support matches the
    /// GPUDirect check, and device memory that is not a live CUDA allocation is never
    /// registered: it is refused, or its registration fails, with the error that says to stage.
    #[test]
    fn device_memory_on_a_nic_is_registered_or_refused_with_a_reason() {
        let cfg = VerbsConfig::default();
        if let Err(why) = library_devices().and_then(|_| pick_port(&cfg)) {
            let _ = writeln!(
                io::stderr(),
                "SKIP device_memory_on_a_nic_is_registered_or_refused_with_a_reason because there is no usable RDMA port ({why})"
            );
            return;
        }
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let t = VerbsTransport::new(Identity::new(1, 0), cfg, ip, None).unwrap();
        let p = t.properties().ptr_support;
        let gd = t.gpudirect().clone();
        assert_eq!(
            (p.cuda, p.dmabuf),
            (gd.peermem.is_some(), gd.dmabuf.is_ok())
        );
        // SAFETY: a page-aligned address no allocation holds; the NIC must not accept it.
        let bogus = unsafe {
            MemRegion::new(
                0x7f00_dead_0000 as *mut u8,
                1 << 16,
                crate::MemoryKind::Cuda { device: 0 },
            )
        };
        match t.register(bogus) {
            Err(TransportError::DeviceMemory { missing, .. }) => {
                let _ = writeln!(io::stderr(), "device memory refused: {missing}");
            }
            other => panic!("a bogus device range was not refused: {other:?}"),
        }
    }
}
