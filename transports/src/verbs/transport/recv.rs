//! The receive comm: [`RecvProto`] over its queue pairs, FIFO staging and eager ring, once the
//! connector's ready byte has come.

use super::bootstrap::{read_some, Liveness, READY};
use crate::verbs::ib::{Cq, Device, OwnedMr, Qp};
use crate::verbs::proto::{
    self, Completion, Cts, Local, RecvProto, RecvWire, CTS_LEN, EAGER_HEADER,
};
use crate::{RecvComm, Registration, RequestId, Result, TransportError};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct VerbsRecvComm {
    pub(super) qps: Vec<Qp>,
    pub(super) cq: Cq,
    pub(super) staging: OwnedMr,
    /// The eager ring (`depth` slots of `stride` bytes) when the connection has one.
    pub(super) ring: Option<OwnedMr>,
    pub(super) stride: usize,
    /// Where the credit word sits, in the staging buffer and behind the sender's FIFO.
    pub(super) credit_at: usize,
    /// Keeps the device open until the queue pairs, CQ and staging above are gone.
    pub(super) _dev: Arc<Device>,
    pub(super) peer: u32,
    pub(super) channel: u32,
    pub(super) fifo_addr: u64,
    pub(super) fifo_rkey: u32,
    pub(super) proto: RecvProto,
    /// The bootstrap socket until the connector's "ready" byte arrives.
    pub(super) boot: Option<(TcpStream, Instant)>,
    /// Then the same socket, watching the peer.
    pub(super) alive: Option<Liveness>,
    pub(super) stall: Duration,
}

pub(super) struct RecvSide<'a> {
    pub(super) qps: &'a [Qp],
    pub(super) cq: &'a Cq,
    pub(super) staging: &'a mut OwnedMr,
    pub(super) ring: Option<&'a OwnedMr>,
    pub(super) stride: usize,
    pub(super) credit_at: usize,
    pub(super) fifo_addr: u64,
    pub(super) fifo_rkey: u32,
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
