//! The send comm: it finishes the connector's half of the handshake as it is progressed, then
//! drives [`SendProto`] over its queue pairs, FIFO and eager staging.

use super::bootstrap::{read_some, Liveness, READY};
use crate::conn::HELLO_WAIT;
use crate::verbs::handshake::{self, Reply};
use crate::verbs::ib::{Cq, Device, OwnedMr, PathParams, Qp};
use crate::verbs::proto::{
    self, credit_offset, Completion, Cts, Local, SendProto, SendWire, CTS_LEN, EAGER_HEADER,
};
use crate::{Registration, RequestId, Result, SendComm, TransportError};
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The connector's side of the bootstrap exchange.
pub(super) enum Boot {
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
pub(super) struct EagerOut {
    staging: OwnedMr,
    /// Bytes per slot, header included (the same on both ends).
    stride: usize,
    remote_addr: u64,
    remote_rkey: u32,
}

pub(super) struct VerbsSendComm {
    // Field order is drop order: queue pairs before their CQ, then the FIFO, then the device.
    pub(super) qps: Vec<Qp>,
    pub(super) cq: Cq,
    pub(super) fifo: OwnedMr,
    /// Once the reply agreed to an eager threshold: the staging slots and the peer's ring.
    pub(super) eager: Option<EagerOut>,
    /// The threshold this side offered in its hello, and the FIFO depth.
    pub(super) eager_offered: usize,
    pub(super) depth: usize,
    pub(super) dev: Arc<Device>,
    pub(super) peer: u32,
    pub(super) proto: SendProto,
    pub(super) boot: Boot,
    pub(super) params: PathParams,
    pub(super) stall: Duration,
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
