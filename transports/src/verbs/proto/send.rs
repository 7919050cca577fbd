//! The sending end: a message waits for its ready-to-receive entry (or, when small, for a
//! credit), is written with its sequence number as immediate, and completes when the write is
//! acknowledged.

use super::completions::{completion_error, drain, Sticky};
use super::ring::Ring;
use super::{imm_seq, marker, Completion, Local, ProtoConfig, SendWire, EAGER_WR, IMM_EAGER};
use crate::slots::SlotState as Slot;
use crate::verbs::wc;
use crate::{RequestId, Result, TransportError};
use std::time::Instant;

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
