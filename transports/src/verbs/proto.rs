//! The receiver-driven RDMA WRITE-with-immediate protocol, as state machines that issue
//! abstract work requests and consume completions, so that everything except the verbs calls
//! themselves is tested here with a fake completion source.
//!
//! The receiver owns the flow: each `irecv` posts a zero-length receive work request (to catch
//! the immediate) and then RDMA-writes a ready-to-receive entry ([`Cts`]: buffer address, rkey,
//! size, tag) into slot `seq % depth` of the sender's FIFO, a small registered array in the
//! sender's memory. The sender polls its FIFO for the entry of its next message, checks size
//! and tag, and writes the payload straight into the receiver's buffer with
//! `RDMA_WRITE_WITH_IMM`, the immediate carrying the message's sequence number. The receiver's
//! request completes when that immediate arrives (its byte count is the message size); the
//! sender's when its write is acknowledged. No payload is copied and no receive buffer is
//! staged, as in NCCL's IB transport.
//!
//! Up to `depth` messages are in flight per connection (the FIFO's slots are the receiver's
//! credits); messages round-robin over the connection's queue pairs.

use super::wc;
use crate::{RequestId, Result, TransportError};
use std::time::{Duration, Instant};

/// Bytes of one FIFO entry on the wire.
pub const CTS_LEN: usize = 32;
/// Largest message one work request carries (RoCE NICs allow 1-2 GiB).
pub const MAX_MESSAGE: usize = 1 << 30;
/// `wr_id` bit marking the receiver's FIFO writes (its other work requests carry sequence
/// numbers).
pub const CTS_WR: u64 = 1 << 63;

/// A ready-to-receive entry. `marker` is written last (the entry is one RDMA write, placed in
/// address order) and equals the message's sequence number plus one, so a stale entry from
/// the previous round of the FIFO never looks current.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cts {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
    pub tag: u32,
    pub marker: u32,
}

impl Cts {
    pub fn encode(&self) -> [u8; CTS_LEN] {
        let mut b = [0u8; CTS_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[28..32].copy_from_slice(&self.marker.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; CTS_LEN]) -> Cts {
        let w = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[0..8]);
        Cts {
            addr: u64::from_le_bytes(a),
            rkey: w(8),
            len: w(12),
            tag: w(16),
            marker: w(28),
        }
    }
}

/// The marker of message `seq`.
pub fn marker(seq: u64) -> u32 {
    (seq as u32).wrapping_add(1)
}

/// What a completion was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// One of our RDMA writes (payload, or a FIFO entry) was acknowledged.
    Write,
    /// A peer's WRITE_WITH_IMM landed: `imm` and the bytes written.
    RecvImm { imm: u32, bytes: u32 },
}

/// A work completion, reduced to what the protocol needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// `ibv_wc_status`; 0 is success (`op` is then meaningful).
    pub status: u32,
    pub vendor_err: u32,
    pub op: Op,
}

/// Local memory of a write: address, length, lkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// The verbs operations a sender needs (a queue pair set, its FIFO and its CQ).
pub trait SendWire {
    /// The current contents of FIFO slot `slot`.
    fn read_cts(&self, slot: usize) -> Cts;
    /// `RDMA_WRITE_WITH_IMM` of `local` to `remote_addr`/`rkey` on queue pair `qp`, signaled.
    fn post_write_imm(
        &mut self,
        qp: usize,
        local: Local,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
        wr_id: u64,
    ) -> Result<()>;
    /// Completions ready now, into `out`; returns how many.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize>;
}

/// The verbs operations a receiver needs.
pub trait RecvWire {
    /// A zero-length receive on queue pair `qp` (it catches one immediate).
    fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()>;
    /// RDMA-writes `cts` into the sender's FIFO slot `slot` (signaled, `wr_id`).
    fn post_cts(&mut self, qp: usize, slot: usize, cts: &Cts, wr_id: u64) -> Result<()>;
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize>;
}

/// Settings shared by both ends.
#[derive(Clone, Copy, Debug)]
pub struct ProtoConfig {
    /// FIFO slots = messages in flight; a power of two.
    pub depth: usize,
    pub qps: usize,
    /// How long a posted message may go without its next step before the comm fails.
    pub timeout: Duration,
}

/// One request slot of a connection's ring (indexed by sequence number modulo the depth).
#[derive(Clone, Copy, Debug)]
enum Slot<T> {
    Free,
    Active(T),
    Done(usize),
}

/// The request ring both ends keep: ids are slot indices, recycled once reported.
struct Ring<T> {
    slots: Vec<Slot<T>>,
    peer: u32,
}

impl<T: Copy> Ring<T> {
    fn new(depth: usize, peer: u32) -> Self {
        assert!(
            depth.is_power_of_two(),
            "verbs: depth must be a power of two"
        );
        Ring {
            slots: vec![Slot::Free; depth],
            peer,
        }
    }

    fn index(&self, seq: u64) -> usize {
        (seq as usize) & (self.slots.len() - 1)
    }

    fn get(&self, i: usize) -> Slot<T> {
        self.slots[i]
    }

    fn set(&mut self, i: usize, s: Slot<T>) {
        self.slots[i] = s;
    }

    /// Takes the slot of message `seq` for `t`, unless its previous occupant is unreported.
    fn claim(&mut self, seq: u64, t: T) -> Result<RequestId> {
        let i = self.index(seq);
        if !matches!(self.slots[i], Slot::Free) {
            return Err(TransportError::TooManyRequests {
                peer: self.peer,
                max: self.slots.len(),
            });
        }
        self.slots[i] = Slot::Active(t);
        Ok(RequestId(i as u32))
    }

    /// `Some(bytes)` once `id` is complete; the id is free again afterwards.
    fn take(&mut self, id: RequestId) -> Result<Option<usize>> {
        let r = self
            .slots
            .get_mut(id.0 as usize)
            .ok_or(TransportError::UnknownRequest(id.0))?;
        match *r {
            Slot::Free => Err(TransportError::UnknownRequest(id.0)),
            Slot::Done(n) => {
                *r = Slot::Free;
                Ok(Some(n))
            }
            Slot::Active(_) => Ok(None),
        }
    }

    /// Fails when an active request has waited longer than `timeout` for its next step;
    /// `describe` gives its start and what it waits for.
    fn check_stall(
        &self,
        now: Instant,
        timeout: Duration,
        describe: impl Fn(&T) -> (Instant, String),
    ) -> Result<()> {
        for s in &self.slots {
            if let Slot::Active(t) = s {
                let (since, what) = describe(t);
                if now.duration_since(since) > timeout {
                    return Err(TransportError::Timeout {
                        secs: timeout.as_secs_f64(),
                        what,
                    });
                }
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum SendReq {
    /// Waiting for the receiver's FIFO entry.
    Waiting {
        seq: u64,
        local: Local,
        tag: u32,
        since: Instant,
    },
    /// Write posted, waiting for its completion.
    Writing { seq: u64, len: u32, since: Instant },
}

/// Failure state kept so that every later call reports the first error, not the flushes that
/// follow it.
#[derive(Debug, Default)]
struct Sticky(Option<String>);

impl Sticky {
    fn check(&self, peer: u32) -> Result<()> {
        match &self.0 {
            Some(msg) => Err(TransportError::Rdma {
                peer,
                msg: msg.clone(),
            }),
            None => Ok(()),
        }
    }
    fn fail(&mut self, peer: u32, msg: String) -> TransportError {
        if self.0.is_none() {
            self.0 = Some(msg);
        }
        TransportError::Rdma {
            peer,
            msg: self.0.clone().unwrap_or_default(),
        }
    }
}

fn completion_error(
    sticky: &mut Sticky,
    peer: u32,
    c: &Completion,
    first: bool,
    what: &str,
) -> TransportError {
    sticky.fail(
        peer,
        format!(
            "{what} failed: {}",
            wc::explain(c.status, c.vendor_err, first)
        ),
    )
}

/// Feeds every completion `poll` has ready to `each`, 32 at a time; `Ok(true)` when any came.
fn drain(
    mut poll: impl FnMut(&mut [Completion]) -> Result<usize>,
    mut each: impl FnMut(Completion) -> Result<()>,
) -> Result<bool> {
    let mut wcs = [NO_COMPLETION; 32];
    let mut any = false;
    loop {
        let n = poll(&mut wcs)?;
        for c in &wcs[..n] {
            each(*c)?;
        }
        any |= n > 0;
        if n < wcs.len() {
            return Ok(any);
        }
    }
}

const NO_COMPLETION: Completion = Completion {
    wr_id: 0,
    status: 0,
    vendor_err: 0,
    op: Op::Write,
};

/// The sending end of one connection.
pub struct SendProto {
    peer: u32,
    cfg: ProtoConfig,
    reqs: Ring<SendReq>,
    /// Sequence number of the next `post`.
    next_post: u64,
    /// Sequence number of the next message to write (waiting for its FIFO entry).
    next_write: u64,
    any_completed: bool,
    sticky: Sticky,
}

impl SendProto {
    pub fn new(peer: u32, cfg: ProtoConfig) -> SendProto {
        assert!(cfg.qps > 0, "verbs: at least one queue pair");
        SendProto {
            peer,
            cfg,
            reqs: Ring::new(cfg.depth, peer),
            next_post: 0,
            next_write: 0,
            any_completed: false,
            sticky: Sticky::default(),
        }
    }

    /// Queues a message; it is written once the receiver has said where.
    pub fn post(&mut self, local: Local, tag: u32, now: Instant) -> Result<RequestId> {
        self.sticky.check(self.peer)?;
        let seq = self.next_post;
        let id = self.reqs.claim(
            seq,
            SendReq::Waiting {
                seq,
                local,
                tag,
                since: now,
            },
        )?;
        self.next_post += 1;
        Ok(id)
    }

    fn on_completion(&mut self, c: Completion) -> Result<()> {
        if c.status != wc::SUCCESS {
            let first = !self.any_completed;
            return Err(completion_error(
                &mut self.sticky,
                self.peer,
                &c,
                first,
                "RDMA write",
            ));
        }
        let i = self.reqs.index(c.wr_id);
        match self.reqs.get(i) {
            Slot::Active(SendReq::Writing { seq, len, .. }) if seq == c.wr_id => {
                self.reqs.set(i, Slot::Done(len as usize));
                self.any_completed = true;
            }
            _ => {
                return Err(self.sticky.fail(
                    self.peer,
                    format!(
                        "completion for message {} that is not being written",
                        c.wr_id
                    ),
                ))
            }
        }
        Ok(())
    }

    /// Consumes completions and writes every message whose FIFO entry has arrived.
    pub fn progress(&mut self, wire: &mut dyn SendWire, now: Instant) -> Result<()> {
        self.sticky.check(self.peer)?;
        let mut moved = drain(|b| wire.poll(b), |c| self.on_completion(c))?;
        while self.next_write < self.next_post {
            let seq = self.next_write;
            let i = self.reqs.index(seq);
            let Slot::Active(SendReq::Waiting { local, tag, .. }) = self.reqs.get(i) else {
                break;
            };
            let cts = wire.read_cts(i);
            if cts.marker != marker(seq) {
                break;
            }
            if local.len > cts.len {
                return Err(TransportError::Truncated {
                    peer: self.peer,
                    sent: local.len as u64,
                    posted: cts.len as usize,
                });
            }
            if tag != cts.tag {
                return Err(TransportError::TagMismatch {
                    peer: self.peer,
                    expected: cts.tag,
                    got: tag,
                });
            }
            let qp = (seq as usize) % self.cfg.qps;
            wire.post_write_imm(qp, local, cts.addr, cts.rkey, seq as u32, seq)
                .map_err(|e| {
                    self.sticky.fail(
                        self.peer,
                        format!("posting the write of message {seq}: {e}"),
                    )
                })?;
            self.reqs.set(
                i,
                Slot::Active(SendReq::Writing {
                    seq,
                    len: local.len,
                    since: now,
                }),
            );
            self.next_write += 1;
            moved = true;
        }
        if !moved {
            let peer = self.peer;
            self.reqs.check_stall(now, self.cfg.timeout, |r| match *r {
                SendReq::Waiting { seq, since, .. } => (
                    since,
                    format!("message {seq} to rank {peer} waits for the receiver's ready-to-receive entry"),
                ),
                SendReq::Writing { seq, since, .. } => (
                    since,
                    format!("the RDMA write of message {seq} to rank {peer} was never acknowledged"),
                ),
            })?;
        }
        Ok(())
    }

    /// `Some(bytes)` once `id` is complete; the id is free again afterwards.
    pub fn take(&mut self, id: RequestId) -> Result<Option<usize>> {
        self.reqs.take(id)
    }
}

#[derive(Clone, Copy, Debug)]
enum RecvReq {
    /// Posted by the caller, not yet announced to the sender (no credit yet).
    Queued { seq: u64, cts: Cts, since: Instant },
    /// Receive and FIFO entry posted; waiting for the immediate.
    Posted { seq: u64, len: u32, since: Instant },
}

/// The receiving end of one connection.
pub struct RecvProto {
    peer: u32,
    cfg: ProtoConfig,
    reqs: Ring<RecvReq>,
    next_post: u64,
    /// Next sequence number to announce.
    next_announce: u64,
    /// Announced and not yet arrived: the credits in use.
    in_flight: usize,
    /// FIFO writes whose completion has not come back (their local entry is still in use).
    cts_busy: Vec<bool>,
    any_completed: bool,
    sticky: Sticky,
}

impl RecvProto {
    pub fn new(peer: u32, cfg: ProtoConfig) -> RecvProto {
        assert!(cfg.qps > 0, "verbs: at least one queue pair");
        RecvProto {
            peer,
            cfg,
            reqs: Ring::new(cfg.depth, peer),
            next_post: 0,
            next_announce: 0,
            in_flight: 0,
            cts_busy: vec![false; cfg.depth],
            any_completed: false,
            sticky: Sticky::default(),
        }
    }

    /// Queues a receive into `addr` (`len` bytes, registered with `rkey`).
    pub fn post(
        &mut self,
        addr: u64,
        len: u32,
        rkey: u32,
        tag: u32,
        now: Instant,
    ) -> Result<RequestId> {
        self.sticky.check(self.peer)?;
        let seq = self.next_post;
        let cts = Cts {
            addr,
            rkey,
            len,
            tag,
            marker: marker(seq),
        };
        let id = self.reqs.claim(
            seq,
            RecvReq::Queued {
                seq,
                cts,
                since: now,
            },
        )?;
        self.next_post += 1;
        Ok(id)
    }

    fn on_completion(&mut self, c: Completion) -> Result<()> {
        let is_cts = c.wr_id & CTS_WR != 0;
        if c.status != wc::SUCCESS {
            let first = !self.any_completed;
            let what = if is_cts {
                "writing the ready-to-receive entry"
            } else {
                "receiving"
            };
            return Err(completion_error(
                &mut self.sticky,
                self.peer,
                &c,
                first,
                what,
            ));
        }
        match c.op {
            Op::Write if is_cts => {
                let s = self.reqs.index(c.wr_id & !CTS_WR);
                self.cts_busy[s] = false;
                self.any_completed = true;
            }
            Op::RecvImm { imm, bytes } => {
                let i = self.reqs.index(imm as u64);
                match self.reqs.get(i) {
                    Slot::Active(RecvReq::Posted { seq, len, .. }) if seq as u32 == imm => {
                        if bytes > len {
                            return Err(TransportError::Truncated { peer: self.peer, sent: bytes as u64, posted: len as usize });
                        }
                        self.reqs.set(i, Slot::Done(bytes as usize));
                        self.in_flight -= 1;
                        self.any_completed = true;
                    }
                    _ => {
                        return Err(self.sticky.fail(
                            self.peer,
                            format!("an immediate for message {imm} that was not announced (ranks out of step)"),
                        ))
                    }
                }
            }
            Op::Write => {
                return Err(self.sticky.fail(
                    self.peer,
                    format!("unexpected write completion {:#x}", c.wr_id),
                ))
            }
        }
        Ok(())
    }

    /// Announces queued receives while credits last and consumes completions.
    pub fn progress(&mut self, wire: &mut dyn RecvWire, now: Instant) -> Result<()> {
        self.sticky.check(self.peer)?;
        let mut moved = drain(|b| wire.poll(b), |c| self.on_completion(c))?;
        while self.next_announce < self.next_post && self.in_flight < self.cfg.depth {
            let seq = self.next_announce;
            let i = self.reqs.index(seq);
            let Slot::Active(RecvReq::Queued { cts, .. }) = self.reqs.get(i) else {
                break;
            };
            if self.cts_busy[i] {
                break;
            }
            let qp = (seq as usize) % self.cfg.qps;
            let peer = self.peer;
            wire.post_recv(qp, seq).map_err(|e| {
                self.sticky
                    .fail(peer, format!("posting the receive of message {seq}: {e}"))
            })?;
            wire.post_cts(0, i, &cts, CTS_WR | i as u64).map_err(|e| {
                self.sticky
                    .fail(peer, format!("announcing message {seq}: {e}"))
            })?;
            self.cts_busy[i] = true;
            self.reqs.set(
                i,
                Slot::Active(RecvReq::Posted {
                    seq,
                    len: cts.len,
                    since: now,
                }),
            );
            self.in_flight += 1;
            self.next_announce += 1;
            moved = true;
        }
        if !moved {
            let peer = self.peer;
            self.reqs.check_stall(now, self.cfg.timeout, |r| match *r {
                RecvReq::Posted { seq, since, .. } => (
                    since,
                    format!("message {seq} from rank {peer} never arrived"),
                ),
                RecvReq::Queued { seq, since, .. } => (
                    since,
                    format!("message {seq} from rank {peer} could not be announced (FIFO full)"),
                ),
            })?;
        }
        Ok(())
    }

    pub fn take(&mut self, id: RequestId) -> Result<Option<usize>> {
        self.reqs.take(id)
    }

    /// Messages announced to the sender and not yet arrived (for tests and diagnostics).
    pub fn credits_in_use(&self) -> usize {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    /// Both ends of a connection in memory: the sender's FIFO, both CQs, posted receives per
    /// queue pair, and real byte copies for the payload writes.
    #[derive(Default)]
    struct Link {
        fifo: Vec<Cts>,
        send_cq: VecDeque<Completion>,
        recv_cq: VecDeque<Completion>,
        recvs: Vec<VecDeque<u64>>,
        cts_posts: usize,
        writes: Vec<(usize, u32)>,
        /// Completions are produced but not delivered (a dead peer / lost acks).
        hold: bool,
        /// Status for the next payload write's completion.
        fail_next_write: Option<u32>,
    }

    struct Tx(Rc<RefCell<Link>>);
    struct Rx(Rc<RefCell<Link>>);

    fn ok(wr_id: u64, op: Op) -> Completion {
        Completion {
            wr_id,
            status: 0,
            vendor_err: 0,
            op,
        }
    }

    impl SendWire for Tx {
        fn read_cts(&self, slot: usize) -> Cts {
            self.0.borrow().fifo[slot]
        }
        fn post_write_imm(
            &mut self,
            qp: usize,
            local: Local,
            remote: u64,
            _rkey: u32,
            imm: u32,
            wr_id: u64,
        ) -> Result<()> {
            let mut l = self.0.borrow_mut();
            l.writes.push((qp, imm));
            if let Some(status) = l.fail_next_write.take() {
                l.send_cq.push_back(Completion {
                    wr_id,
                    status,
                    vendor_err: 0x81,
                    op: Op::Write,
                });
                return Ok(());
            }
            // SAFETY: the tests' buffers outlive the link; addresses come from them.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    local.addr as *const u8,
                    remote as *mut u8,
                    local.len as usize,
                )
            };
            let Some(_) = l.recvs[qp].pop_front() else {
                panic!("write with immediate on qp {qp} without a posted receive (RNR)");
            };
            l.recv_cq.push_back(ok(
                0,
                Op::RecvImm {
                    imm,
                    bytes: local.len,
                },
            ));
            l.send_cq.push_back(ok(wr_id, Op::Write));
            Ok(())
        }
        fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
            let mut l = self.0.borrow_mut();
            if l.hold {
                return Ok(0);
            }
            let n = out.len().min(l.send_cq.len());
            for o in out.iter_mut().take(n) {
                *o = l.send_cq.pop_front().unwrap();
            }
            Ok(n)
        }
    }

    impl RecvWire for Rx {
        fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()> {
            self.0.borrow_mut().recvs[qp].push_back(wr_id);
            Ok(())
        }
        fn post_cts(&mut self, _qp: usize, slot: usize, cts: &Cts, wr_id: u64) -> Result<()> {
            let mut l = self.0.borrow_mut();
            // Through the wire format, as the NIC would carry it.
            l.fifo[slot] = Cts::decode(&cts.encode());
            l.cts_posts += 1;
            l.recv_cq.push_back(ok(wr_id, Op::Write));
            Ok(())
        }
        fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
            let mut l = self.0.borrow_mut();
            if l.hold {
                return Ok(0);
            }
            let n = out.len().min(l.recv_cq.len());
            for o in out.iter_mut().take(n) {
                *o = l.recv_cq.pop_front().unwrap();
            }
            Ok(n)
        }
    }

    fn setup(depth: usize, qps: usize) -> (SendProto, RecvProto, Tx, Rx, Rc<RefCell<Link>>) {
        let cfg = ProtoConfig {
            depth,
            qps,
            timeout: Duration::from_secs(10),
        };
        let link = Rc::new(RefCell::new(Link {
            fifo: vec![Cts::default(); depth],
            recvs: vec![VecDeque::new(); qps],
            ..Link::default()
        }));
        (
            SendProto::new(3, cfg),
            RecvProto::new(5, cfg),
            Tx(link.clone()),
            Rx(link.clone()),
            link,
        )
    }

    fn local(buf: &[u8]) -> Local {
        Local {
            addr: buf.as_ptr() as u64,
            len: buf.len() as u32,
            lkey: 1,
        }
    }

    #[test]
    fn messages_arrive_in_order_over_several_qps() {
        let (mut s, mut r, mut tx, mut rx, link) = setup(4, 2);
        let now = Instant::now();
        let src: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i + 1; 100 + i as usize]).collect();
        let mut dst: Vec<Vec<u8>> = (0..6).map(|_| vec![0u8; 200]).collect();
        for round in 0..2 {
            let mut rids = vec![];
            let mut sids = vec![];
            for k in 0..3 {
                let m = round * 3 + k;
                let d = &mut dst[m];
                rids.push(
                    r.post(d.as_mut_ptr() as u64, d.len() as u32, 9, 7, now)
                        .unwrap(),
                );
                sids.push(s.post(local(&src[m]), 7, now).unwrap());
            }
            for _ in 0..4 {
                r.progress(&mut rx, now).unwrap();
                s.progress(&mut tx, now).unwrap();
            }
            r.progress(&mut rx, now).unwrap();
            for (k, (rid, sid)) in rids.into_iter().zip(sids).enumerate() {
                let m = round * 3 + k;
                assert_eq!(r.take(rid).unwrap(), Some(src[m].len()), "message {m} size");
                assert_eq!(s.take(sid).unwrap(), Some(src[m].len()));
                assert_eq!(&dst[m][..src[m].len()], &src[m][..], "message {m} bytes");
                assert!(r.take(rid).is_err(), "reported once");
            }
        }
        let qps: Vec<usize> = link.borrow().writes.iter().map(|w| w.0).collect();
        assert_eq!(qps, [0, 1, 0, 1, 0, 1], "round-robin over the queue pairs");
        assert_eq!(r.credits_in_use(), 0);
    }

    #[test]
    fn sender_waits_for_the_receiver_and_credits_limit_announcements() {
        let (mut s, mut r, mut tx, mut rx, link) = setup(2, 1);
        let now = Instant::now();
        let src = [[1u8; 8], [2; 8]];
        let mut dst = [[0u8; 8]; 2];
        let sids: Vec<_> = src
            .iter()
            .map(|b| s.post(local(b), 0, now))
            .collect::<Result<_>>()
            .unwrap();
        s.progress(&mut tx, now).unwrap();
        assert!(
            link.borrow().writes.is_empty(),
            "nothing is written before the receiver says where"
        );
        assert!(
            matches!(
                s.post(local(&src[0]), 0, now),
                Err(TransportError::TooManyRequests { peer: 3, max: 2 })
            ),
            "a third message would reuse message 0's slot"
        );
        let rids: Vec<_> = dst
            .iter_mut()
            .map(|d| r.post(d.as_mut_ptr() as u64, 8, 1, 0, now))
            .collect::<Result<_>>()
            .unwrap();
        r.progress(&mut rx, now).unwrap();
        assert_eq!((link.borrow().cts_posts, r.credits_in_use()), (2, 2));
        s.progress(&mut tx, now).unwrap();
        assert_eq!(link.borrow().writes.len(), 2);
        r.progress(&mut rx, now).unwrap();
        assert_eq!(r.credits_in_use(), 0, "both arrived");
        for id in rids {
            assert_eq!(r.take(id).unwrap(), Some(8));
        }
        s.progress(&mut tx, now).unwrap();
        for id in sids {
            assert_eq!(s.take(id).unwrap(), Some(8));
        }
        assert_eq!(dst, src);
    }

    #[test]
    fn receives_beyond_the_fifo_wait_for_a_credit() {
        let (mut s, mut r, mut tx, mut rx, link) = setup(2, 1);
        let now = Instant::now();
        let src = [[1u8; 4], [2; 4]];
        let mut dst = [[0u8; 4]; 2];
        let a = r.post(dst[0].as_mut_ptr() as u64, 4, 1, 0, now).unwrap();
        let b = r.post(dst[1].as_mut_ptr() as u64, 4, 1, 0, now).unwrap();
        assert!(matches!(
            r.post(0, 4, 1, 0, now),
            Err(TransportError::TooManyRequests { peer: 5, max: 2 })
        ));
        // Take the FIFO entries' completions away: the receiver must not reuse their slots.
        link.borrow_mut().hold = true;
        r.progress(&mut rx, now).unwrap();
        assert_eq!(link.borrow().cts_posts, 2);
        link.borrow_mut().hold = false;
        let sa = s.post(local(&src[0]), 0, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        r.progress(&mut rx, now).unwrap();
        assert_eq!(r.take(a).unwrap(), Some(4));
        // Message 2 reuses slot 0 now that message 0 arrived and its entry was acknowledged.
        let c = r.post(dst[0].as_mut_ptr() as u64, 4, 1, 0, now).unwrap();
        r.progress(&mut rx, now).unwrap();
        assert_eq!(link.borrow().cts_posts, 3);
        assert_eq!(r.credits_in_use(), 2);
        s.progress(&mut tx, now).unwrap();
        assert_eq!(s.take(sa).unwrap(), Some(4));
        let sb = s.post(local(&src[1]), 0, now).unwrap();
        let sc = s.post(local(&src[0]), 0, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        r.progress(&mut rx, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        assert_eq!((r.take(b).unwrap(), r.take(c).unwrap()), (Some(4), Some(4)));
        assert_eq!(
            (s.take(sb).unwrap(), s.take(sc).unwrap()),
            (Some(4), Some(4))
        );
        assert_eq!(dst, [[1; 4], [2; 4]]);
    }

    #[test]
    fn retry_exceeded_on_the_first_write_blames_reachability_and_sticks() {
        let (mut s, mut r, mut tx, mut rx, link) = setup(4, 1);
        let now = Instant::now();
        let src = [7u8; 16];
        let mut dst = [0u8; 16];
        r.post(dst.as_mut_ptr() as u64, 16, 1, 0, now).unwrap();
        r.progress(&mut rx, now).unwrap();
        s.post(local(&src), 0, now).unwrap();
        link.borrow_mut().fail_next_write = Some(wc::RETRY_EXC_ERR);
        s.progress(&mut tx, now).unwrap();
        let e = s.progress(&mut tx, now).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("peer unreachable or wrong GID") && msg.contains("rank 3"),
            "{msg}"
        );
        let again = s.progress(&mut tx, now).unwrap_err().to_string();
        assert_eq!(
            again, msg,
            "later calls report the first error, not flushes"
        );
        assert!(s.post(local(&src), 0, now).is_err());
    }

    #[test]
    fn errors_after_traffic_flowed_do_not_blame_the_gid() {
        let (mut s, mut r, mut tx, mut rx, link) = setup(4, 1);
        let now = Instant::now();
        let src = [7u8; 16];
        let mut dst = [0u8; 16];
        for _ in 0..2 {
            r.post(dst.as_mut_ptr() as u64, 16, 1, 0, now).unwrap();
        }
        r.progress(&mut rx, now).unwrap();
        let a = s.post(local(&src), 0, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        assert_eq!(s.take(a).unwrap(), Some(16));
        s.post(local(&src), 0, now).unwrap();
        link.borrow_mut().fail_next_write = Some(wc::RETRY_EXC_ERR);
        s.progress(&mut tx, now).unwrap();
        let msg = s.progress(&mut tx, now).unwrap_err().to_string();
        assert!(
            msg.contains("stopped acknowledging") && !msg.contains("wrong GID"),
            "{msg}"
        );
        // A failed receive-side completion is decoded too.
        link.borrow_mut().recv_cq.push_back(Completion {
            wr_id: 0,
            status: 10,
            vendor_err: 0,
            op: Op::Write,
        });
        let msg = r.progress(&mut rx, now).unwrap_err().to_string();
        assert!(
            msg.contains("IBV_WC_REM_ACCESS_ERR") && msg.contains("rank 5"),
            "{msg}"
        );
    }

    #[test]
    fn silence_times_out_naming_the_message() {
        let (mut s, mut r, mut tx, mut rx, link) = setup(4, 1);
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(11);
        let src = [7u8; 16];
        let mut dst = [0u8; 16];
        s.post(local(&src), 0, t0).unwrap();
        s.progress(&mut tx, t0 + Duration::from_secs(9)).unwrap();
        let e = s.progress(&mut tx, later).unwrap_err().to_string();
        assert!(
            e.contains("message 0") && e.contains("ready-to-receive"),
            "{e}"
        );

        r.post(dst.as_mut_ptr() as u64, 16, 1, 0, t0).unwrap();
        r.progress(&mut rx, t0).unwrap();
        link.borrow_mut().hold = true;
        r.progress(&mut rx, t0 + Duration::from_secs(5)).unwrap();
        let e = r.progress(&mut rx, later).unwrap_err().to_string();
        assert!(e.contains("never arrived") && e.contains("rank 5"), "{e}");
    }

    #[test]
    fn size_and_tag_disagreements_are_named() {
        let (mut s, mut r, mut tx, mut rx, _) = setup(4, 1);
        let now = Instant::now();
        let big = [1u8; 32];
        let mut dst = [0u8; 16];
        r.post(dst.as_mut_ptr() as u64, 16, 1, 4, now).unwrap();
        r.progress(&mut rx, now).unwrap();
        s.post(local(&big), 4, now).unwrap();
        assert!(matches!(
            s.progress(&mut tx, now),
            Err(TransportError::Truncated {
                peer: 3,
                sent: 32,
                posted: 16
            })
        ));

        let (mut s, mut r, mut tx, mut rx, _) = setup(4, 1);
        r.post(dst.as_mut_ptr() as u64, 16, 1, 4, now).unwrap();
        r.progress(&mut rx, now).unwrap();
        s.post(local(&big[..8]), 5, now).unwrap();
        assert!(matches!(
            s.progress(&mut tx, now),
            Err(TransportError::TagMismatch {
                peer: 3,
                expected: 4,
                got: 5
            })
        ));
    }

    #[test]
    fn fifo_entries_round_trip_and_markers_wrap() {
        let c = Cts {
            addr: 0x1234_5678_9abc,
            rkey: 0xdead,
            len: 4096,
            tag: 77,
            marker: marker(41),
        };
        assert_eq!(Cts::decode(&c.encode()), c);
        assert_eq!(marker(41), 42);
        assert_eq!(marker(u32::MAX as u64), 0);
        assert_ne!(
            marker(u32::MAX as u64),
            marker(u32::MAX as u64 - 4),
            "a stale entry never matches"
        );
    }
}
