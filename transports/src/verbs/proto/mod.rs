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
//!
//! The wire format and the settings are here; `wire` is what the state machines ask of verbs,
//! `send` and `recv` are the two ends, and `ring` and `completions` hold the bookkeeping both
//! ends share.

mod completions;
mod recv;
mod ring;
mod send;
mod wire;

pub use recv::RecvProto;
pub use send::SendProto;
pub use wire::{Completion, Local, Op, RecvWire, SendWire};

use std::time::Duration;

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

#[cfg(test)]
mod tests;
