//! The receiving end: it announces receives in the sender's FIFO, keeps a receive posted for
//! every message the sender may write, matches immediates to receives, serves eager messages
//! from the ring in whichever order message and receive come, and returns credits.

use super::completions::{completion_error, Sticky, NO_COMPLETION};
use super::ring::Ring;
use super::{
    imm_seq, marker, Completion, Cts, Op, ProtoConfig, RecvWire, CREDIT_WR, CTS_WR, EAGER_HEADER,
    IMM_EAGER,
};
use crate::slots::SlotState as Slot;
use crate::verbs::wc;
use crate::{RequestId, Result, TransportError};
use std::time::Instant;

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
