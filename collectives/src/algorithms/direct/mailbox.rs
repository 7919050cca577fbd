//! The direct AllReduce for small messages: one shared mailbox per rank.
//!
//! At a few bytes a call is all latency, and any message protocol pays for its framing,
//! its requests and its acknowledgements. Here each rank owns a small shared segment that
//! every peer of the host maps once: a call copies the rank's input into its mailbox and
//! then publishes the call's sequence number, waits until every peer has published the same
//! number, and reduces all the mailboxes itself, in rank order (so every rank computes the
//! same bits). Up to 56 bytes the data shares the number's cache line, so one line travels
//! each way per peer; nothing else is sent (the one-shot AllReduce of MPI's shared-memory
//! collectives).
//!
//! Two slots alternate by call: a rank overwrites the slot of call `k` only in call `k + 2`,
//! and it got there by seeing every peer publish `k + 1`, which each did after it finished
//! reading everyone's slot of call `k`. No completion message is needed.

use super::window::{self, Key, Mapping};
use crate::dtype::ReduceOp;
use crate::element::{Element, LINE};
use crate::error::CommError;
use crate::link::{Communicator, Waiter};
use crate::HostBuffer;
use std::sync::atomic::{AtomicU64, Ordering};

/// Largest message the mailbox takes; larger calls map the peers' buffers instead.
pub const MAX_BYTES: usize = 8 << 10;
/// The sequence word, at the head of a slot.
const HEAD: usize = 8;
/// A slot: the sequence word's line, then room for the largest message ([`data_offset`]).
const SLOT: usize = LINE + MAX_BYTES;
/// The sequence word: the call's number in the low bits, its byte count above.
const COUNT_SHIFT: u32 = 40;
const SEQ_MASK: u64 = (1 << COUNT_SHIFT) - 1;

/// Where a message of `bytes` starts in its slot. Up to 56 bytes it shares the sequence
/// word's line, so one line travels. Longer, it starts on the next line: aligned there, it
/// spans as few lines as its length allows, and no load or store of the copy or of the
/// reduction straddles two lines. On 2 ranks (Intel Xeon family 6 model 167, 2026-12-05,
/// medians of six runs alternating with the layout before, which started every message 8
/// bytes into the word's line) 64 bytes took 0.32 us instead of 0.38, 512 bytes 0.48 instead
/// of 0.55 and 4 KiB 1.37 instead of 1.44; up to 32 bytes the same. It is the alignment: the
/// word alone on its line with the data still 8 bytes off the next measured 0.41-0.45 us at
/// 64 bytes and 0.54-0.57 at 512, against 0.32-0.36 and 0.51-0.53 aligned (four runs).
fn data_offset(bytes: usize) -> usize {
    if bytes <= LINE - HEAD {
        HEAD
    } else {
        LINE
    }
}

/// One rank's view of every mailbox of the host.
pub(crate) struct Mailboxes {
    /// Ours: written by this rank only.
    own: HostBuffer,
    /// The peers' (`None` at our rank), mapped.
    peers: Vec<Option<Mapping>>,
    /// Calls made through the mailboxes.
    seq: u64,
    /// Scratch for `mulsum` (words: every element type is aligned in them).
    tmp: Vec<u64>,
}

impl Mailboxes {
    /// Our new mailbox, and its key for the peers.
    pub fn create() -> Option<(HostBuffer, Key)> {
        let own = HostBuffer::shared(2 * SLOT)?;
        let key = window::key_of(own.as_slice().as_ptr(), 2 * SLOT)?;
        Some((own, key))
    }

    /// Maps every peer's mailbox from its key (`keys[me]` is ignored).
    pub fn open(own: HostBuffer, keys: &[Key], me: usize) -> std::io::Result<Mailboxes> {
        let mut peers = Vec::with_capacity(keys.len());
        for (p, k) in keys.iter().enumerate() {
            peers.push(if p == me {
                None
            } else {
                if k.region.len < (2 * SLOT) as u64 || k.off != 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the peer's mailbox is not a mailbox",
                    ));
                }
                Some(window::map_file(k)?)
            });
        }
        Ok(Mailboxes {
            own,
            peers,
            seq: 0,
            tmp: vec![0; MAX_BYTES / 8],
        })
    }

    fn slot(&self, p: usize, me: usize, parity: usize) -> *mut u8 {
        let off = parity * SLOT;
        match &self.peers[p] {
            Some(m) => m.at(off),
            None if p == me => self.own.as_slice().as_ptr().wrapping_add(off) as *mut u8,
            None => std::ptr::null_mut(),
        }
    }

    /// AllReduce `count` elements (at most [`MAX_BYTES`]) from `src` into `dst`.
    ///
    /// # Safety
    /// `src` and `dst` are valid for `count` elements (they may be the same buffer); every
    /// rank of the communicator makes the same call.
    pub unsafe fn all_reduce<T: Element>(
        &mut self,
        comm: &Communicator,
        src: *const T,
        dst: *mut T,
        count: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (me, n) = (comm.rank(), comm.size());
        let bytes = count * std::mem::size_of::<T>();
        debug_assert!(bytes <= MAX_BYTES);
        self.seq = (self.seq + 1) & SEQ_MASK;
        let k = self.seq;
        let parity = (k % 2) as usize;
        let mine = self.slot(me, me, parity);
        let at = data_offset(bytes);
        std::ptr::copy_nonoverlapping(src as *const u8, mine.add(at), bytes);
        // The word carries the byte count too, so ranks that disagree about it fail.
        let word_k = k | (bytes as u64) << COUNT_SHIFT;
        seq_word(mine).store(word_k, Ordering::Release);
        let mut waiter = Waiter::new(comm);
        for p in (0..n).filter(|&p| p != me) {
            let word = seq_word(self.slot(p, me, parity));
            loop {
                let seen = word.load(Ordering::Acquire);
                if seen == word_k {
                    waiter.progressed();
                    break;
                }
                if seen & SEQ_MASK == k {
                    return Err(CommError::short_message(
                        me,
                        "direct_all_reduce",
                        p,
                        (seen >> COUNT_SHIFT) as usize,
                        bytes,
                    ));
                }
                let seen = seen & SEQ_MASK;
                if waiter.idle(comm, || {
                    (
                        p,
                        format!(
                            "waiting for rank {p}'s part of a small direct AllReduce (its \
                             mailbox holds call {seen}, this is call {k})"
                        ),
                    )
                })? {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            }
        }
        let tmp = self.tmp.as_mut_ptr() as *mut T;
        let input = |p: usize| {
            std::slice::from_raw_parts(self.slot(p, me, parity).add(at) as *const T, count)
        };
        // The inputs are the mailboxes' copies, so the output never aliases one.
        let out = std::slice::from_raw_parts_mut(dst, count);
        // `mulsum`'s premultiplied input, allocated once with the mailboxes (zeroing a
        // stack array of MAX_BYTES on every call would cost more than an 8-byte call).
        let tmp = std::slice::from_raw_parts_mut(tmp, count);
        super::reduce_all(op, n, out, tmp, input);
        Ok(())
    }
}

/// The sequence word at the head of a slot.
///
/// # Safety
/// `slot` is a slot of a mapped mailbox (8-byte aligned, page-aligned base).
unsafe fn seq_word<'a>(slot: *mut u8) -> &'a AtomicU64 {
    &*(slot as *const AtomicU64)
}
