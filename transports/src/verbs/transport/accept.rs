//! The listener's side of the handshake: check a connector's hello, make the queue pairs,
//! FIFO staging and eager ring, move to RTS, prime the receives and reply.

use super::bootstrap::read_frame;
use super::recv::{RecvSide, VerbsRecvComm};
use super::Parts;
use crate::conn::{self, Deadline, HELLO_WAIT};
use crate::verbs::handshake::{self, Hello, Reply};
use crate::verbs::ib::{OwnedMr, PathParams, Qp};
use crate::verbs::proto::{credit_offset, ProtoConfig, RecvProto, EAGER_HEADER};
use crate::{Listener, RecvComm, Result, TransportError};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

pub(super) struct VerbsListener {
    pub(super) listener: TcpListener,
    /// The job-token check every bootstrap connection passes before its hello is believed.
    pub(super) gate: crate::auth::DataGate,
    pub(super) owner: Parts,
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
