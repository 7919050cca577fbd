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
//!
//! Small messages go eagerly. Waiting for the ready-to-receive entry costs a one-way trip
//! before the data may leave, which is most of a small message's latency; so a message of at
//! most `eager` bytes is written at once, behind an [`EAGER_HEADER`] (length, tag) taken from
//! a registered staging slot, into slot `seq % depth` of the receiver's eager ring, with the
//! eager bit set in the immediate. The sender's request completes when the write is
//! acknowledged, as every send does: a send reported done before that would leave a failed
//! write (a dead peer, a wrong GID) in a completion queue nobody polls any more. The receiver
//! copies the payload into the receive's buffer when both have arrived, in either order. Receives are pre-posted for the `depth` messages after the last one released, and
//! the receiver writes its released count into a credit word behind the sender's FIFO every
//! `depth / 2` messages: the sender may send message `seq` eagerly while `seq < credit +
//! depth`, so an eager message never lands in a slot still in use nor meets a queue pair
//! without a receive. A receive of at most `eager` bytes sends no ready-to-receive entry at
//! all. Both ends must agree on the threshold: the acceptor's reply fixes it per connection.

use super::wc;
use crate::slots::{SlotState as Slot, SlotTable};
use crate::{RequestId, Result, TransportError};
use std::time::{Duration, Instant};

/// Bytes of one FIFO entry on the wire.
pub const CTS_LEN: usize = 32;
/// Largest message one work request carries (RoCE NICs allow 1-2 GiB).
pub const MAX_MESSAGE: usize = 1 << 30;
/// `wr_id` bit marking the receiver's FIFO writes (its other work requests carry sequence
/// numbers).
pub const CTS_WR: u64 = 1 << 63;
/// `wr_id` bit marking the sender's eager writes.
pub const EAGER_WR: u64 = 1 << 62;
/// `wr_id` bit marking the receiver's credit writes.
pub const CREDIT_WR: u64 = 1 << 61;
/// Bytes in front of an eager payload in its ring slot: length and tag, little-endian.
pub const EAGER_HEADER: usize = 8;
/// Immediate bit of an eager message (the payload is in the eager ring, not the receive's
/// buffer); the other 31 bits are the low bits of the sequence number.
pub const IMM_EAGER: u32 = 1 << 31;
/// The credit word's offset behind a FIFO of `depth` entries.
pub fn credit_offset(depth: usize) -> usize {
    depth * CTS_LEN
}
/// Default eager threshold (`BUSBW_IB_EAGER`): a message this small costs less to copy
/// twice than to wait a one-way trip for its ready-to-receive entry.
pub const DEFAULT_EAGER: usize = 4096;
/// Largest eager threshold accepted: the ring is `depth` slots of this on every connection.
pub const MAX_EAGER: usize = 65536;

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

/// The sequence bits an immediate carries.
fn imm_seq(seq: u64) -> u32 {
    seq as u32 & !IMM_EAGER
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
    /// The receiver's released count as it last wrote it into the credit word.
    fn read_credit(&self) -> u64;
    /// Writes an eager header (`src.len`, `tag`, from staging slot `slot`) followed by
    /// `src` into the receiver's eager ring slot `slot` with `imm`, signaled: one write that
    /// gathers both, so the payload is never copied on this side.
    fn post_eager(
        &mut self,
        qp: usize,
        slot: usize,
        src: Local,
        tag: u32,
        imm: u32,
        wr_id: u64,
    ) -> Result<()>;
}

/// The verbs operations a receiver needs.
pub trait RecvWire {
    /// A zero-length receive on queue pair `qp` (it catches one immediate).
    fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()>;
    /// RDMA-writes `cts` into the sender's FIFO slot `slot` (signaled, `wr_id`).
    fn post_cts(&mut self, qp: usize, slot: usize, cts: &Cts, wr_id: u64) -> Result<()>;
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize>;
    /// RDMA-writes `released` into the sender's credit word (signaled, `wr_id`).
    fn post_credit(&mut self, released: u64, wr_id: u64) -> Result<()>;
    /// Length and tag from the header of eager ring slot `slot`.
    fn eager_header(&self, slot: usize) -> (u32, u32);
    /// Copies `len` payload bytes of eager ring slot `slot` to `dst` (host memory).
    fn eager_copy(&mut self, slot: usize, dst: u64, len: u32);
}

/// Settings shared by both ends.
#[derive(Clone, Copy, Debug)]
pub struct ProtoConfig {
    /// FIFO slots = messages in flight; a power of two.
    pub depth: usize,
    pub qps: usize,
    /// How long a posted message may go without its next step before the comm fails.
    pub timeout: Duration,
    /// Largest payload sent eagerly; 0: every message waits for its ready-to-receive entry.
    pub eager: usize,
}

/// The request ring both ends keep: a [`SlotTable`] indexed by sequence number modulo the
/// depth, so the id of message `seq` is known without a lookup.
struct Ring<T> {
    table: SlotTable<T>,
}

impl<T: Copy> Ring<T> {
    fn new(depth: usize, peer: u32) -> Self {
        assert!(
            depth.is_power_of_two(),
            "verbs: depth must be a power of two"
        );
        Ring {
            table: SlotTable::new(depth, peer),
        }
    }

    fn index(&self, seq: u64) -> usize {
        (seq as usize) & (self.table.len() - 1)
    }

    fn get(&self, i: usize) -> Slot<T> {
        *self.table.state(i)
    }

    fn set(&mut self, i: usize, s: Slot<T>) {
        *self.table.state_mut(i) = s;
    }

    /// Takes the slot of message `seq` for `t`, unless its previous occupant is unreported.
    fn claim(&mut self, seq: u64, t: T) -> Result<RequestId> {
        self.table.claim(self.index(seq), t)
    }

    /// `Some(bytes)` once `id` is complete; the id is free again afterwards.
    fn take(&mut self, id: RequestId) -> Result<Option<usize>> {
        self.table.take(id)
    }

    /// Fails when an active request has waited longer than `timeout` for its next step;
    /// `describe` gives its start and what it waits for.
    fn check_stall(
        &self,
        now: Instant,
        timeout: Duration,
        describe: impl Fn(&T) -> (Instant, String),
    ) -> Result<()> {
        for t in self.table.pending() {
            let (since, what) = describe(t);
            if now.duration_since(since) > timeout {
                return Err(TransportError::Timeout {
                    secs: timeout.as_secs_f64(),
                    what,
                });
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum SendReq {
    /// Waiting for the receiver's FIFO entry, or (eager) for a credit and a free staging slot.
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
    /// Sequence number of the next message to write (waiting for its FIFO entry or credit).
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

    /// The eager threshold the receiver agreed to (known once the handshake is done; until
    /// then nothing is written).
    pub fn set_eager(&mut self, eager: usize) {
        self.cfg.eager = eager;
    }

    fn eager(&self, local: &Local) -> bool {
        (local.len as usize) <= self.cfg.eager
    }

    /// Queues a message; it is written once the receiver has said where, or at once when it
    /// is small and the receiver has room.
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
        // Eager or not, the message is done; an eager one's staging slot (its header) is free
        // again with its request slot.
        let seq = c.wr_id & !EAGER_WR;
        let i = self.reqs.index(seq);
        match self.reqs.get(i) {
            Slot::Pending(SendReq::Writing { seq: s, len, .. }) if s == seq => {
                self.reqs.set(i, Slot::Done(len as usize));
                self.any_completed = true;
            }
            _ => {
                return Err(self.sticky.fail(
                    self.peer,
                    format!("completion for message {seq} that is not being written"),
                ))
            }
        }
        Ok(())
    }

    /// Consumes completions and writes every message whose FIFO entry (or credit) has
    /// arrived, in order.
    pub fn progress(&mut self, wire: &mut dyn SendWire, now: Instant) -> Result<()> {
        self.sticky.check(self.peer)?;
        let mut moved = drain(|b| wire.poll(b), |c| self.on_completion(c))?;
        let depth = self.cfg.depth as u64;
        let mut credit = None;
        while self.next_write < self.next_post {
            let seq = self.next_write;
            let i = self.reqs.index(seq);
            let Slot::Pending(SendReq::Waiting { local, tag, .. }) = self.reqs.get(i) else {
                break;
            };
            let eager = self.eager(&local);
            let qp = (seq as usize) % self.cfg.qps;
            if eager {
                let c = *credit.get_or_insert_with(|| wire.read_credit());
                // A ready-to-receive entry for this very message is a credit too.
                if seq >= c + depth && wire.read_cts(i).marker != marker(seq) {
                    break;
                }
                let imm = imm_seq(seq) | IMM_EAGER;
                wire.post_eager(qp, i, local, tag, imm, EAGER_WR | seq)
                    .map_err(|e| {
                        self.sticky.fail(
                            self.peer,
                            format!("posting the eager write of message {seq}: {e}"),
                        )
                    })?;
            } else {
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
                wire.post_write_imm(qp, local, cts.addr, cts.rkey, imm_seq(seq), seq)
                    .map_err(|e| {
                        self.sticky.fail(
                            self.peer,
                            format!("posting the write of message {seq}: {e}"),
                        )
                    })?;
            }
            self.reqs.set(
                i,
                Slot::Pending(SendReq::Writing {
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
            let eager_max = self.cfg.eager;
            self.reqs.check_stall(now, self.cfg.timeout, |r| match *r {
                SendReq::Waiting {
                    seq, local, since, ..
                } if local.len as usize <= eager_max => (
                    since,
                    format!(
                        "message {seq} to rank {peer} waits for a credit (rank {peer} has not \
                         received message {})",
                        seq.wrapping_sub(depth)
                    ),
                ),
                SendReq::Waiting {
                    seq, local, since, ..
                } => (
                    since,
                    if eager_max > 0 && local.len as usize > eager_max {
                        format!(
                            "message {seq} to rank {peer} ({} bytes) waits for the receiver's \
                             ready-to-receive entry (a receive of at most {eager_max} bytes \
                             posted for it sends none)",
                            local.len
                        )
                    } else {
                        format!(
                            "message {seq} to rank {peer} waits for the receiver's \
                             ready-to-receive entry"
                        )
                    },
                ),
                SendReq::Writing { seq, since, .. } => (
                    since,
                    format!(
                        "the RDMA write of message {seq} to rank {peer} was never acknowledged"
                    ),
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

/// A receive as the receiver keeps it.
#[derive(Clone, Copy, Debug)]
struct Want {
    seq: u64,
    addr: u64,
    len: u32,
    rkey: u32,
    tag: u32,
    host: bool,
    since: Instant,
}

#[derive(Clone, Copy, Debug)]
enum RecvReq {
    /// Posted by the caller, not yet matched: announced next (credit and FIFO staging
    /// permitting), or satisfied from the eager ring.
    Queued(Want),
    /// Waiting for the data: announced with a FIFO entry (`announced`), or small enough to
    /// come eagerly.
    Posted { want: Want, announced: bool },
}

impl RecvReq {
    fn want(&self) -> &Want {
        match self {
            RecvReq::Queued(w) | RecvReq::Posted { want: w, .. } => w,
        }
    }
}

/// An eager message that landed before its receive was posted.
#[derive(Clone, Copy, Debug)]
struct Early {
    seq: u64,
    len: u32,
    tag: u32,
}

/// The receiving end of one connection.
pub struct RecvProto {
    peer: u32,
    cfg: ProtoConfig,
    reqs: Ring<RecvReq>,
    next_post: u64,
    /// Next sequence number to match (announce, or serve from the eager ring).
    next_match: u64,
    /// Announced and not yet arrived.
    in_flight: usize,
    /// FIFO writes whose completion has not come back (their local entry is still in use).
    cts_busy: Vec<bool>,
    /// Messages below this have landed in their receive's buffer: their ring slots are free
    /// and a receive is posted for every message below `released + depth`.
    released: u64,
    recv_posted: u64,
    /// Per slot: the message that landed there and is not yet counted into `released`.
    landed: Vec<Option<u64>>,
    /// Per slot: an eager message waiting for its receive.
    early: Vec<Option<Early>>,
    /// The released count last written to the sender's credit word, and whether that write
    /// is still in flight.
    credit_sent: u64,
    credit_busy: bool,
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
            next_match: 0,
            in_flight: 0,
            cts_busy: vec![false; cfg.depth],
            released: 0,
            recv_posted: 0,
            landed: vec![None; cfg.depth],
            early: vec![None; cfg.depth],
            credit_sent: 0,
            credit_busy: false,
            any_completed: false,
            sticky: Sticky::default(),
        }
    }

    /// Posts the receives of the first `depth` messages: done before the sender learns the
    /// queue pairs, since an eager write may follow at once.
    pub fn prime(&mut self, wire: &mut dyn RecvWire) -> Result<()> {
        self.advance(wire)
    }

    /// Queues a receive into `addr` (`len` bytes, registered with `rkey`; `host`: host
    /// memory, which an eager message can be copied into).
    pub fn post(
        &mut self,
        addr: u64,
        len: u32,
        rkey: u32,
        tag: u32,
        host: bool,
        now: Instant,
    ) -> Result<RequestId> {
        self.sticky.check(self.peer)?;
        let seq = self.next_post;
        let want = Want {
            seq,
            addr,
            len,
            rkey,
            tag,
            host,
            since: now,
        };
        let id = self.reqs.claim(seq, RecvReq::Queued(want))?;
        self.next_post += 1;
        Ok(id)
    }

    /// The full sequence number of an immediate: within the `depth` messages after
    /// `released`, the only ones the sender may have written.
    fn seq_of(&mut self, imm: u32) -> Result<u64> {
        let low = imm & !IMM_EAGER;
        let ahead = low.wrapping_sub(imm_seq(self.released)) & !IMM_EAGER;
        if ahead as usize >= self.cfg.depth {
            return Err(self.sticky.fail(
                self.peer,
                format!(
                    "an immediate for message {low} (mod 2^31) outside the window of {} messages \
                     after {} (ranks out of step)",
                    self.cfg.depth, self.released
                ),
            ));
        }
        Ok(self.released + ahead as u64)
    }

    /// Copies eager message `e` from its ring slot into `w`'s buffer.
    fn deliver(&mut self, wire: &mut dyn RecvWire, w: &Want, e: Early) -> Result<usize> {
        if e.len > w.len {
            return Err(TransportError::Truncated {
                peer: self.peer,
                sent: e.len as u64,
                posted: w.len as usize,
            });
        }
        if e.tag != w.tag {
            return Err(TransportError::TagMismatch {
                peer: self.peer,
                expected: w.tag,
                got: e.tag,
            });
        }
        if !w.host {
            return Err(self.sticky.fail(
                self.peer,
                format!(
                    "message {} came eagerly but its receive buffer is device memory, which \
                     the eager ring cannot be copied into (set BUSBW_IB_EAGER=0 on every rank)",
                    e.seq
                ),
            ));
        }
        wire.eager_copy(self.reqs.index(e.seq), w.addr, e.len);
        Ok(e.len as usize)
    }

    fn on_completion(&mut self, wire: &mut dyn RecvWire, c: Completion) -> Result<()> {
        let is_cts = c.wr_id & CTS_WR != 0;
        let is_credit = c.wr_id & CREDIT_WR != 0;
        if c.status != wc::SUCCESS {
            let first = !self.any_completed;
            let what = if is_cts {
                "writing the ready-to-receive entry"
            } else if is_credit {
                "writing the credit word"
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
            Op::Write if is_credit => {
                self.credit_busy = false;
                self.any_completed = true;
            }
            Op::RecvImm { imm, bytes } if imm & IMM_EAGER != 0 => {
                let seq = self.seq_of(imm)?;
                let i = self.reqs.index(seq);
                let (len, tag) = wire.eager_header(i);
                if bytes as usize != EAGER_HEADER + len as usize || self.early[i].is_some() {
                    return Err(self.sticky.fail(
                        self.peer,
                        format!(
                            "eager message {seq} is malformed ({bytes} bytes for a {len}-byte \
                             payload) or its slot is still in use (ranks out of step)"
                        ),
                    ));
                }
                let e = Early { seq, len, tag };
                self.any_completed = true;
                match self.reqs.get(i) {
                    Slot::Pending(r) if r.want().seq == seq => {
                        let w = *r.want();
                        let n = self.deliver(wire, &w, e)?;
                        if let RecvReq::Posted {
                            announced: true, ..
                        } = r
                        {
                            self.in_flight -= 1;
                        }
                        self.reqs.set(i, Slot::Done(n));
                        self.landed[i] = Some(seq);
                    }
                    _ => self.early[i] = Some(e),
                }
            }
            Op::RecvImm { imm, bytes } => {
                let seq = self.seq_of(imm)?;
                let i = self.reqs.index(seq);
                match self.reqs.get(i) {
                    Slot::Pending(RecvReq::Posted {
                        want,
                        announced: true,
                    }) if want.seq == seq => {
                        if bytes > want.len {
                            return Err(TransportError::Truncated {
                                peer: self.peer,
                                sent: bytes as u64,
                                posted: want.len as usize,
                            });
                        }
                        self.reqs.set(i, Slot::Done(bytes as usize));
                        self.landed[i] = Some(seq);
                        self.in_flight -= 1;
                        self.any_completed = true;
                    }
                    _ => {
                        return Err(self.sticky.fail(
                            self.peer,
                            format!("an immediate for message {seq} that was not announced (ranks out of step)"),
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

    /// Counts landed messages into `released`, posts the receives that frees, and tells the
    /// sender every `depth / 2` messages (eager connections only: otherwise the FIFO entries
    /// are the only credits the sender needs).
    fn advance(&mut self, wire: &mut dyn RecvWire) -> Result<()> {
        loop {
            let i = self.reqs.index(self.released);
            if self.landed[i] != Some(self.released) {
                break;
            }
            self.landed[i] = None;
            self.released += 1;
        }
        let depth = self.cfg.depth as u64;
        while self.recv_posted < self.released + depth {
            let seq = self.recv_posted;
            let qp = (seq as usize) % self.cfg.qps;
            let peer = self.peer;
            wire.post_recv(qp, seq).map_err(|e| {
                self.sticky
                    .fail(peer, format!("posting the receive of message {seq}: {e}"))
            })?;
            self.recv_posted += 1;
        }
        if self.cfg.eager > 0
            && !self.credit_busy
            && self.released >= self.credit_sent + (depth / 2).max(1)
        {
            let peer = self.peer;
            wire.post_credit(self.released, CREDIT_WR).map_err(|e| {
                self.sticky
                    .fail(peer, format!("writing the credit word: {e}"))
            })?;
            self.credit_sent = self.released;
            self.credit_busy = true;
        }
        Ok(())
    }

    /// Matches posted receives (from the eager ring, or by announcing them while credits
    /// last) and consumes completions.
    pub fn progress(&mut self, wire: &mut dyn RecvWire, now: Instant) -> Result<()> {
        self.sticky.check(self.peer)?;
        let mut wcs = [NO_COMPLETION; 32];
        let mut moved = false;
        loop {
            let n = wire.poll(&mut wcs)?;
            for c in &wcs[..n] {
                self.on_completion(wire, *c)?;
            }
            moved |= n > 0;
            if n < wcs.len() {
                break;
            }
        }
        // Receives for what just landed first: an announcement needs its receive posted.
        self.advance(wire)?;
        while self.next_match < self.next_post {
            let seq = self.next_match;
            let i = self.reqs.index(seq);
            let want = match self.reqs.get(i) {
                Slot::Pending(RecvReq::Queued(w)) if w.seq == seq => w,
                // Served already (it came eagerly while queued).
                _ => {
                    self.next_match += 1;
                    continue;
                }
            };
            if let Some(e) = self.early[i].filter(|e| e.seq == seq) {
                let n = self.deliver(wire, &want, e)?;
                self.early[i] = None;
                self.reqs.set(i, Slot::Done(n));
                self.landed[i] = Some(seq);
            } else if want.host && want.len as usize <= self.cfg.eager {
                // Whatever fits comes eagerly: no entry to announce.
                self.reqs.set(
                    i,
                    Slot::Pending(RecvReq::Posted {
                        want,
                        announced: false,
                    }),
                );
            } else {
                if seq >= self.recv_posted || self.cts_busy[i] {
                    break;
                }
                let cts = Cts {
                    addr: want.addr,
                    rkey: want.rkey,
                    len: want.len,
                    tag: want.tag,
                    marker: marker(seq),
                };
                let peer = self.peer;
                wire.post_cts(0, i, &cts, CTS_WR | i as u64).map_err(|e| {
                    self.sticky
                        .fail(peer, format!("announcing message {seq}: {e}"))
                })?;
                self.cts_busy[i] = true;
                self.reqs.set(
                    i,
                    Slot::Pending(RecvReq::Posted {
                        want: Want { since: now, ..want },
                        announced: true,
                    }),
                );
                self.in_flight += 1;
            }
            self.next_match += 1;
            moved = true;
        }
        self.advance(wire)?;
        if !moved {
            let peer = self.peer;
            self.reqs.check_stall(now, self.cfg.timeout, |r| match *r {
                RecvReq::Posted { want, .. } => (
                    want.since,
                    format!("message {} from rank {peer} never arrived", want.seq),
                ),
                RecvReq::Queued(w) => (
                    w.since,
                    format!(
                        "message {} from rank {peer} could not be announced (FIFO full)",
                        w.seq
                    ),
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
        /// The receiver's eager ring and the sender's credit word.
        eager: Vec<u8>,
        eager_stride: usize,
        credit: u64,
        credit_posts: usize,
        /// Completions are produced but not delivered (a dead peer / lost acks).
        hold: bool,
        /// Status for the next payload write's completion.
        fail_next_write: Option<u32>,
    }

    impl Link {
        /// Logs a write with immediate of `bytes` and queues its completions, or a failed one
        /// when asked (`false`: nothing lands).
        fn write_imm(&mut self, qp: usize, imm: u32, bytes: u32, wr_id: u64) -> bool {
            self.writes.push((qp, imm));
            if let Some(status) = self.fail_next_write.take() {
                self.send_cq.push_back(Completion {
                    wr_id,
                    status,
                    vendor_err: 0x81,
                    op: Op::Write,
                });
                return false;
            }
            let Some(_) = self.recvs[qp].pop_front() else {
                panic!("write with immediate on qp {qp} without a posted receive (RNR)");
            };
            self.recv_cq.push_back(ok(0, Op::RecvImm { imm, bytes }));
            self.send_cq.push_back(ok(wr_id, Op::Write));
            true
        }
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
            if self.0.borrow_mut().write_imm(qp, imm, local.len, wr_id) {
                // SAFETY: the tests' buffers outlive the link; addresses come from them.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        local.addr as *const u8,
                        remote as *mut u8,
                        local.len as usize,
                    )
                };
            }
            Ok(())
        }
        fn read_credit(&self) -> u64 {
            self.0.borrow().credit
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
            let mut l = self.0.borrow_mut();
            if !l.write_imm(qp, imm, EAGER_HEADER as u32 + src.len, wr_id) {
                return Ok(());
            }
            let off = slot * l.eager_stride;
            assert!(
                src.len as usize + EAGER_HEADER <= l.eager_stride,
                "eager message larger than a slot"
            );
            l.eager[off..off + 4].copy_from_slice(&src.len.to_le_bytes());
            l.eager[off + 4..off + 8].copy_from_slice(&tag.to_le_bytes());
            // SAFETY: the tests' buffers outlive the link.
            let payload =
                unsafe { std::slice::from_raw_parts(src.addr as *const u8, src.len as usize) };
            let at = off + EAGER_HEADER;
            l.eager[at..at + payload.len()].copy_from_slice(payload);
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
        fn post_credit(&mut self, released: u64, wr_id: u64) -> Result<()> {
            let mut l = self.0.borrow_mut();
            l.credit = released;
            l.credit_posts += 1;
            l.recv_cq.push_back(ok(wr_id, Op::Write));
            Ok(())
        }
        fn eager_header(&self, slot: usize) -> (u32, u32) {
            let l = self.0.borrow();
            let off = slot * l.eager_stride;
            let w = |i: usize| u32::from_le_bytes(l.eager[i..i + 4].try_into().unwrap());
            (w(off), w(off + 4))
        }
        fn eager_copy(&mut self, slot: usize, dst: u64, len: u32) {
            let l = self.0.borrow();
            let at = slot * l.eager_stride + EAGER_HEADER;
            // SAFETY: the tests' buffers outlive the link; dst holds len bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(l.eager[at..].as_ptr(), dst as *mut u8, len as usize)
            };
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
        setup_eager(depth, qps, 0)
    }

    fn setup_eager(
        depth: usize,
        qps: usize,
        eager: usize,
    ) -> (SendProto, RecvProto, Tx, Rx, Rc<RefCell<Link>>) {
        let cfg = ProtoConfig {
            depth,
            qps,
            timeout: Duration::from_secs(10),
            eager,
        };
        let stride = EAGER_HEADER + eager;
        let link = Rc::new(RefCell::new(Link {
            fifo: vec![Cts::default(); depth],
            recvs: vec![VecDeque::new(); qps],
            eager: vec![0; depth * stride],
            eager_stride: stride,
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
                    r.post(d.as_mut_ptr() as u64, d.len() as u32, 9, 7, true, now)
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
            .map(|d| r.post(d.as_mut_ptr() as u64, 8, 1, 0, true, now))
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
        let a = r
            .post(dst[0].as_mut_ptr() as u64, 4, 1, 0, true, now)
            .unwrap();
        let b = r
            .post(dst[1].as_mut_ptr() as u64, 4, 1, 0, true, now)
            .unwrap();
        assert!(matches!(
            r.post(0, 4, 1, 0, true, now),
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
        let c = r
            .post(dst[0].as_mut_ptr() as u64, 4, 1, 0, true, now)
            .unwrap();
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
        r.post(dst.as_mut_ptr() as u64, 16, 1, 0, true, now)
            .unwrap();
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
            r.post(dst.as_mut_ptr() as u64, 16, 1, 0, true, now)
                .unwrap();
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

        r.post(dst.as_mut_ptr() as u64, 16, 1, 0, true, t0).unwrap();
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
        r.post(dst.as_mut_ptr() as u64, 16, 1, 4, true, now)
            .unwrap();
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
        r.post(dst.as_mut_ptr() as u64, 16, 1, 4, true, now)
            .unwrap();
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

    fn eager_imm(link: &Rc<RefCell<Link>>) -> Vec<bool> {
        link.borrow()
            .writes
            .iter()
            .map(|w| w.1 & IMM_EAGER != 0)
            .collect()
    }

    #[test]
    fn small_messages_leave_at_once_and_land_whichever_side_comes_first() {
        let (mut s, mut r, mut tx, mut rx, link) = setup_eager(4, 2, 64);
        let now = Instant::now();
        r.prime(&mut rx).unwrap();
        let src: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 10; 8 + i as usize]).collect();
        let sids: Vec<_> = src
            .iter()
            .map(|b| s.post(local(b), 3, now).unwrap())
            .collect();
        s.progress(&mut tx, now).unwrap();
        assert_eq!(eager_imm(&link), [true; 3], "no receive was posted yet");
        s.progress(&mut tx, now).unwrap();
        for (id, b) in sids.into_iter().zip(&src) {
            assert_eq!(s.take(id).unwrap(), Some(b.len()), "done once acknowledged");
        }
        let mut dst = [[0u8; 64]; 3];
        // The first receive is posted before the receiver sees anything, the others after.
        let a = r
            .post(dst[0].as_mut_ptr() as u64, 64, 1, 3, true, now)
            .unwrap();
        r.progress(&mut rx, now).unwrap();
        let rest: Vec<_> = dst[1..]
            .iter_mut()
            .map(|d| r.post(d.as_mut_ptr() as u64, 64, 1, 3, true, now).unwrap())
            .collect();
        r.progress(&mut rx, now).unwrap();
        assert_eq!(r.take(a).unwrap(), Some(8));
        for (k, id) in rest.into_iter().enumerate() {
            assert_eq!(r.take(id).unwrap(), Some(src[k + 1].len()));
        }
        for (d, b) in dst.iter().zip(&src) {
            assert_eq!(&d[..b.len()], &b[..]);
        }
        let l = link.borrow();
        assert_eq!(l.cts_posts, 0, "small receives announce nothing");
        assert_eq!(
            l.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
            [0, 1, 0],
            "round-robin over the queue pairs"
        );
    }

    #[test]
    fn the_eager_window_closes_at_the_ring_and_credits_reopen_it() {
        let (mut s, mut r, mut tx, mut rx, link) = setup_eager(4, 1, 16);
        let now = Instant::now();
        r.prime(&mut rx).unwrap();
        let src = [5u8; 16];
        let mut sent = 0;
        // Eight messages; the receiver takes none yet.
        for _ in 0..8 {
            let id = s.post(local(&src), 0, now).unwrap();
            s.progress(&mut tx, now).unwrap();
            s.progress(&mut tx, now).unwrap();
            if s.take(id).unwrap().is_some() {
                sent += 1;
            } else {
                // Not written: the receiver's ring is full. It must stay queued.
                assert_eq!(link.borrow().writes.len(), 4);
                break;
            }
        }
        assert_eq!(sent, 4, "a ring of four slots takes four messages");
        let mut dst = [[0u8; 16]; 4];
        let mut rids: Vec<_> = dst
            .iter_mut()
            .take(2)
            .map(|d| r.post(d.as_mut_ptr() as u64, 16, 1, 0, true, now).unwrap())
            .collect();
        r.progress(&mut rx, now).unwrap();
        assert_eq!(
            link.borrow().credit,
            2,
            "two released: half the ring, worth telling"
        );
        s.progress(&mut tx, now).unwrap();
        assert_eq!(
            link.borrow().writes.len(),
            5,
            "message 4 went; the next waits for its slot"
        );
        for id in rids.drain(..) {
            assert_eq!(r.take(id).unwrap(), Some(16));
        }
        // Messages 2-4 (message 4 went on the credit).
        for d in dst.iter_mut().skip(1) {
            rids.push(r.post(d.as_mut_ptr() as u64, 16, 1, 0, true, now).unwrap());
        }
        r.progress(&mut rx, now).unwrap();
        for id in rids {
            assert_eq!(r.take(id).unwrap(), Some(16));
        }
        assert_eq!(link.borrow().credit, 5);
        assert_eq!(link.borrow().credit_posts, 2);
        assert_eq!(dst, [[5u8; 16]; 4]);
    }

    #[test]
    fn eager_and_announced_messages_mix_in_order() {
        let (mut s, mut r, mut tx, mut rx, link) = setup_eager(8, 1, 16);
        let now = Instant::now();
        r.prime(&mut rx).unwrap();
        let src = [vec![1u8; 8], vec![2u8; 100], vec![3u8; 8], vec![4u8; 16]];
        // A large receive for a small message: it still comes eagerly.
        let caps = [8usize, 100, 100, 16];
        let mut dst: Vec<Vec<u8>> = caps.iter().map(|&c| vec![0u8; c]).collect();
        let sids: Vec<_> = src
            .iter()
            .map(|b| s.post(local(b), 0, now).unwrap())
            .collect();
        s.progress(&mut tx, now).unwrap();
        assert_eq!(
            eager_imm(&link),
            [true],
            "message 1 waits for its entry and holds back message 2"
        );
        let rids: Vec<_> = dst
            .iter_mut()
            .map(|d| {
                r.post(d.as_mut_ptr() as u64, d.len() as u32, 1, 0, true, now)
                    .unwrap()
            })
            .collect();
        for _ in 0..3 {
            r.progress(&mut rx, now).unwrap();
            s.progress(&mut tx, now).unwrap();
        }
        r.progress(&mut rx, now).unwrap();
        assert_eq!(eager_imm(&link), [true, false, true, true]);
        assert_eq!(link.borrow().cts_posts, 2, "the two large receives");
        s.progress(&mut tx, now).unwrap();
        for (k, (rid, sid)) in rids.into_iter().zip(sids).enumerate() {
            assert_eq!(r.take(rid).unwrap(), Some(src[k].len()), "message {k}");
            assert_eq!(s.take(sid).unwrap(), Some(src[k].len()));
            assert_eq!(&dst[k][..src[k].len()], &src[k][..]);
        }
        assert_eq!(r.credits_in_use(), 0);
    }

    #[test]
    fn eager_disagreements_are_named_by_the_receiver() {
        let now = Instant::now();
        let src = [1u8; 12];
        let dst = [0u8; 12];
        let case = |cap: u32, tag: u32, host: bool| {
            let (mut s, mut r, mut tx, mut rx, _) = setup_eager(4, 1, 16);
            r.prime(&mut rx).unwrap();
            s.post(local(&src), 4, now).unwrap();
            s.progress(&mut tx, now).unwrap();
            let d = dst.as_ptr() as u64;
            r.post(d, cap, 1, tag, host, now).unwrap();
            r.progress(&mut rx, now).unwrap_err()
        };
        assert!(matches!(
            case(8, 4, true),
            TransportError::Truncated {
                peer: 5,
                sent: 12,
                posted: 8
            }
        ));
        assert!(matches!(
            case(12, 9, true),
            TransportError::TagMismatch {
                peer: 5,
                expected: 9,
                got: 4
            }
        ));
        let e = case(12, 4, false).to_string();
        assert!(
            e.contains("device memory") && e.contains("BUSBW_IB_EAGER=0"),
            "{e}"
        );
        assert_eq!(dst, [0u8; 12], "nothing was copied");
    }

    #[test]
    fn a_failed_eager_write_fails_its_send() {
        let (mut s, mut r, mut tx, mut rx, link) = setup_eager(4, 1, 16);
        let now = Instant::now();
        r.prime(&mut rx).unwrap();
        let src = [7u8; 8];
        link.borrow_mut().fail_next_write = Some(wc::RETRY_EXC_ERR);
        let a = s.post(local(&src), 0, now).unwrap();
        s.progress(&mut tx, now).unwrap();
        assert_eq!(
            s.take(a).unwrap(),
            None,
            "not done before its acknowledgement"
        );
        let e = s.progress(&mut tx, now).unwrap_err().to_string();
        assert!(e.contains("peer unreachable or wrong GID"), "{e}");
        assert!(s.post(local(&src), 0, now).is_err());
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
