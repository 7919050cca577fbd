//! [`VerbsTransport`]: the trait over RC queue pairs, the protocol of [`super::proto`] and the
//! handshake of [`super::handshake`] on a bootstrap TCP socket.
//!
//! `connect` creates the queue pairs and the FIFO, sends its hello and returns at once (it
//! never waits for the peer to accept); the comm finishes the handshake as it is progressed:
//! it reads the acceptor's reply, moves its queue pairs to RTS and sends one "ready" byte, on
//! which the receiving side starts announcing buffers. Both ends therefore only write to
//! queue pairs that are already ready to receive.
//!
//! The transport and its `connect` are here; `accept` is the listener's side of the handshake,
//! `send` and `recv` are the two comms (each drives its protocol over its queue pairs), and
//! `bootstrap` holds what the TCP socket does before and after the queue pairs are ready.

mod accept;
mod bootstrap;
mod recv;
mod send;

use accept::VerbsListener;
use send::{Boot, VerbsSendComm};

use super::gpudirect::{self, GpuDirect};
use super::handshake::{self, Hello, ListenInfo, PortAddr};
use super::ib::{Cq, Device, PathParams, Qp};
use super::proto::{credit_offset, ProtoConfig, SendProto};
use super::{pick_port, PortChoice, VerbsConfig};
use crate::conn::{self, Deadline, HELLO_WAIT};
use crate::{
    Handle, Identity, Listener, MemRegion, Properties, PtrSupport, Registration, Result, SendComm,
    Transport, TransportError,
};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

#[cfg(test)]
mod tests;
