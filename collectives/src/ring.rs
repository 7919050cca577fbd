//! Ring AllReduce: reduce-scatter followed by all-gather, pipelined by segments.
//!
//! The buffer of `count` elements is cut into `n` chunks (sizes differ by at most one element;
//! some are empty when `count < n`). Over `2(n-1)` steps each rank sends one chunk to its
//! right neighbour and receives one from its left:
//!
//! ```text
//! step t < n-1  (reduce-scatter): send chunk (r-t),   receive chunk (r-t-1) and reduce it
//! step t >= n-1 (all-gather, u = t-(n-1)): send chunk (r+1-u), receive chunk (r-u) as is
//! ```
//!
//! The chunk received at step t is the chunk sent at step t+1, so each chunk is cut into
//! segments and segment k is forwarded as soon as it has been reduced (or received), while
//! segment k+1 is still on the wire: the ring is a pipeline, not `2(n-1)` barriers. After the
//! last reduce-scatter step rank r owns the fully reduced chunk r+1; `avg` divides it there,
//! once, before it is gathered.
//!
//! Messages on a connection arrive in posting order, and both neighbours walk the same
//! (step, segment) sequence, so every receive is posted for exactly the message that will
//! fill it; the per-call tag catches ranks that disagree. Received reduce-scatter segments
//! land in a ring of `window` staging slots; all-gather segments land in place.

use crate::communicator::{Communicator, Readiness, Waiter};
use crate::dtype::{DataType, ReduceOp};
use crate::element::{finish_avg, reduce_inplace, reduce_into, Element};
use crate::error::CommError;
use crate::with_dtype;
use busbw_transports::{MemRegion, MemoryKind, Registration, RequestId};
use std::collections::VecDeque;

/// The buffers of one collective call. In-place and out-of-place are distinct variants
/// because Rust (rightly) will not let one slice be both the source and the destination.
pub enum Data<'a> {
    InPlace(&'a mut [u8]),
    OutOfPlace { send: &'a [u8], recv: &'a mut [u8] },
}

impl Data<'_> {
    fn check(&self, bytes: usize) -> Result<(), String> {
        let (s, r) = match self {
            Data::InPlace(b) => (b.len(), b.len()),
            Data::OutOfPlace { send, recv } => (send.len(), recv.len()),
        };
        if s < bytes || r < bytes {
            return Err(format!(
                "buffers of {s} and {r} bytes are too small for {bytes} bytes"
            ));
        }
        Ok(())
    }
}

/// AllReduce `count` elements of `dtype` with `op` across the communicator, leaving the
/// result on every rank.
pub fn all_reduce(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let bytes = count
        .checked_mul(dtype.size())
        .ok_or_else(|| CommError::Invalid(format!("count {count} overflows")))?;
    data.check(bytes)
        .map_err(|e| CommError::Invalid(format!("rank {}: all_reduce: {e}", comm.rank())))?;
    let (src, dst) = match data {
        Data::InPlace(b) => (b.as_ptr(), b.as_mut_ptr()),
        Data::OutOfPlace { send, recv } => (send.as_ptr(), recv.as_mut_ptr()),
    };
    for p in [src as usize, dst as usize] {
        if p % dtype.size() != 0 {
            return Err(CommError::Invalid(format!(
                "all_reduce: buffer at {p:#x} is not aligned for {dtype}"
            )));
        }
    }
    with_dtype!(dtype, T => {
        // SAFETY: both pointers cover `count` elements (checked above), are aligned, and come
        // from borrows that live until this call returns.
        unsafe { ring_all_reduce::<T>(comm, src as *const T, dst as *mut T, count, op) }
    })
}

/// Chunk `c` of the buffer: `(first element, element count)`.
#[derive(Clone, Copy)]
struct Chunks {
    n: usize,
    base: usize,
    rem: usize,
    seg: usize,
}

impl Chunks {
    fn offset(&self, c: usize) -> usize {
        c * self.base + c.min(self.rem)
    }
    fn len(&self, c: usize) -> usize {
        self.base + usize::from(c < self.rem)
    }
    fn segments(&self, c: usize) -> usize {
        self.len(c).div_ceil(self.seg)
    }
    /// Elements `(offset, len)` of segment `k` of chunk `c`.
    fn segment(&self, c: usize, k: usize) -> (usize, usize) {
        let start = k * self.seg;
        (self.offset(c) + start, self.seg.min(self.len(c) - start))
    }
}

/// Which chunk a rank sends or receives at a step.
#[derive(Clone, Copy)]
struct Schedule {
    n: usize,
    r: usize,
}

impl Schedule {
    fn steps(&self) -> usize {
        2 * (self.n - 1)
    }
    fn send_chunk(&self, t: usize) -> usize {
        let n = self.n;
        if t < n - 1 {
            (self.r + n - t) % n
        } else {
            (self.r + 1 + n - (t - (n - 1))) % n
        }
    }
    fn recv_chunk(&self, t: usize) -> usize {
        let n = self.n;
        if t < n - 1 {
            (self.r + 2 * n - t - 1) % n
        } else {
            (self.r + n - (t - (n - 1))) % n
        }
    }
}

/// Walks (step, segment) pairs in the order messages travel, skipping empty chunks.
struct Cursor {
    t: usize,
    k: usize,
}

impl Cursor {
    fn start(chunk_of: impl Fn(usize) -> usize, ch: &Chunks, steps: usize) -> Self {
        let mut c = Cursor { t: 0, k: 0 };
        c.skip_empty(chunk_of, ch, steps);
        c
    }
    fn skip_empty(&mut self, chunk_of: impl Fn(usize) -> usize, ch: &Chunks, steps: usize) {
        while self.t < steps && self.k >= ch.segments(chunk_of(self.t)) {
            self.t += 1;
            self.k = 0;
        }
    }
    fn advance(&mut self, chunk_of: impl Fn(usize) -> usize, ch: &Chunks, steps: usize) {
        self.k += 1;
        self.skip_empty(chunk_of, ch, steps);
    }
}

struct PendingRecv {
    id: RequestId,
    t: usize,
    k: usize,
    slot: usize,
}

/// # Safety
/// `src` and `dst` must be valid for `count` elements (they may be equal: in-place), and not
/// accessed by anyone else during the call.
unsafe fn ring_all_reduce<T: Element>(
    comm: &mut Communicator,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let n = comm.size();
    let r = comm.rank();
    let tag = comm.next_tag();
    let in_place = std::ptr::eq(src, dst);
    if n == 1 || count == 0 {
        if !in_place && count > 0 {
            // SAFETY: distinct buffers of `count` elements (caller contract).
            unsafe { std::ptr::copy_nonoverlapping(src, dst, count) };
        }
        return Ok(());
    }
    let esize = std::mem::size_of::<T>();
    let window = comm.config().window;
    let seg = (comm.config().segment_bytes / esize).max(1);
    let ch = Chunks {
        n,
        base: count / n,
        rem: count % n,
        seg,
    };
    debug_assert_eq!(ch.offset(ch.n), count);
    let sched = Schedule { n, r };
    let steps = sched.steps();
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;

    let stage_bytes = window * seg * esize;
    if comm.staging.ensure(stage_bytes).is_none() {
        return Err(CommError::OutOfMemory {
            rank: r,
            bytes: stage_bytes,
            what: "ring staging buffers",
        });
    }
    let stage = comm.staging.as_mut_slice().as_mut_ptr() as *mut T;
    let transport_err = |peer: usize, what: &'static str| {
        move |cause| CommError::Transport {
            rank: r,
            peer: Some(peer),
            during: format!("all_reduce (call {tag}): {what} rank {peer}"),
            cause,
        }
    };

    // SAFETY (regions): the ranges are the caller's buffers and our staging buffer, all alive
    // until the registrations are dropped at the end of this function.
    let reg = |ptr: *const T, elems: usize| -> Result<Registration, CommError> {
        let region = unsafe { MemRegion::new(ptr as *mut u8, elems * esize, MemoryKind::Host) };
        comm.transport()
            .register(region)
            .map_err(transport_err(r, "registering memory for"))
    };
    let src_reg = reg(src, count)?;
    let dst_reg = reg(dst, count)?;
    let stage_reg = reg(stage, window * seg)?;

    let mut send = comm.take_send(right)?;
    let mut recv = match comm.take_recv(left) {
        Ok(c) => c,
        Err(e) => {
            comm.put_send(right, send);
            return Err(e);
        }
    };

    let total_recvs: usize = (0..steps).map(|t| ch.segments(sched.recv_chunk(t))).sum();
    let total_sends: usize = (0..steps).map(|t| ch.segments(sched.send_chunk(t))).sum();
    let mut ready = ch.segments(sched.send_chunk(0));
    let send_chunk = |t| sched.send_chunk(t);
    let recv_chunk = |t| sched.recv_chunk(t);
    let mut send_cur = Cursor::start(send_chunk, &ch, steps);
    let mut recv_cur = Cursor::start(recv_chunk, &ch, steps);
    let (mut sends_posted, mut sends_done, mut recvs_posted, mut recvs_done) = (0, 0, 0, 0);
    let mut sends_inflight: VecDeque<RequestId> = VecDeque::with_capacity(window);
    let mut recvs_inflight: VecDeque<PendingRecv> = VecDeque::with_capacity(window);
    let mut waiter = Waiter::new();

    let result = (|| -> Result<(), CommError> {
        while sends_done < total_sends || recvs_done < total_recvs {
            let mut progressed = false;

            while sends_posted < ready && sends_inflight.len() < window {
                let (t, k) = (send_cur.t, send_cur.k);
                let (off, len) = ch.segment(sched.send_chunk(t), k);
                // Step 0 sends our own input; later steps forward what we reduced/received.
                let (base, reg) = if t == 0 {
                    (src, &src_reg)
                } else {
                    (dst as *const T, &dst_reg)
                };
                // SAFETY: off+len <= count; the segment is not written again while the send
                // is in flight (it was finalised for this step and the ring only writes a
                // chunk region again after its successor has consumed it).
                let id = unsafe { send.isend(reg, base.add(off) as *const u8, len * esize, tag) }
                    .map_err(transport_err(right, "sending to"))?;
                sends_inflight.push_back(id);
                sends_posted += 1;
                send_cur.advance(send_chunk, &ch, steps);
                progressed = true;
            }
            while let Some(&id) = sends_inflight.front() {
                match send.test(id).map_err(transport_err(right, "sending to"))? {
                    Some(_) => {
                        sends_inflight.pop_front();
                        sends_done += 1;
                        progressed = true;
                    }
                    None => break,
                }
            }

            while recvs_posted < total_recvs && recvs_inflight.len() < window {
                let (t, k) = (recv_cur.t, recv_cur.k);
                let (off, len) = ch.segment(sched.recv_chunk(t), k);
                let slot = recvs_posted % window;
                let (ptr, reg) = if t < n - 1 {
                    (stage.add(slot * seg), &stage_reg)
                } else {
                    (dst.add(off), &dst_reg)
                };
                // SAFETY: the staging slot is free (at most `window` receives are in flight
                // and they complete in order); an all-gather target segment is written by
                // nobody else until this receive completes.
                let id = unsafe { recv.irecv(reg, ptr as *mut u8, len * esize, tag) }
                    .map_err(transport_err(left, "receiving from"))?;
                recvs_inflight.push_back(PendingRecv { id, t, k, slot });
                recvs_posted += 1;
                recv_cur.advance(recv_chunk, &ch, steps);
                progressed = true;
            }
            while let Some(p) = recvs_inflight.front() {
                let got = recv
                    .test(p.id)
                    .map_err(transport_err(left, "receiving from"))?;
                let Some(got) = got else { break };
                let (off, len) = ch.segment(sched.recv_chunk(p.t), p.k);
                if got != len * esize {
                    return Err(CommError::Invalid(format!(
                        "rank {r}: all_reduce: rank {left} sent {got} bytes where {} were expected (ranks disagree about the count)",
                        len * esize
                    )));
                }
                if p.t < n - 1 {
                    // SAFETY: disjoint ranges: a staging slot and a destination segment that
                    // no in-flight request touches.
                    let staged = std::slice::from_raw_parts(stage.add(p.slot * seg), len);
                    let out = std::slice::from_raw_parts_mut(dst.add(off), len);
                    if in_place {
                        reduce_inplace(op, out, staged);
                    } else {
                        let mine = std::slice::from_raw_parts(src.add(off), len);
                        reduce_into(op, out, mine, staged);
                    }
                    if p.t == n - 2 && op == ReduceOp::Avg {
                        finish_avg(out, n);
                    }
                }
                if p.t + 1 < steps {
                    ready += 1;
                }
                recvs_inflight.pop_front();
                recvs_done += 1;
                progressed = true;
            }

            if progressed {
                waiter.progressed();
            } else {
                let blocked_on = [
                    (recvs_done < total_recvs)
                        .then(|| recv.readiness_fd().map(Readiness::Readable))
                        .flatten(),
                    (!sends_inflight.is_empty())
                        .then(|| send.readiness_fd().map(Readiness::Writable))
                        .flatten(),
                ];
                waiter.idle(comm, &blocked_on, || {
                    if recvs_done < total_recvs {
                        (left, format!("waiting for data from rank {left} (all_reduce call {tag}, {recvs_done}/{total_recvs} segments received)"))
                    } else {
                        (right, format!("waiting for rank {right} to take data (all_reduce call {tag}, {sends_done}/{total_sends} segments sent)"))
                    }
                })?;
            }
        }
        Ok(())
    })();

    comm.put_send(right, send);
    comm.put_recv(left, recv);
    for reg in [src_reg, dst_reg, stage_reg] {
        let _ = comm.transport().deregister(reg);
    }
    result
}

/// AllReduce a few control values (timings, error counts) through the same engine, so the
/// harness needs no second communication channel.
pub fn all_reduce_values<T: Element>(
    comm: &mut Communicator,
    values: &mut [T],
    op: ReduceOp,
) -> Result<(), CommError> {
    let count = values.len();
    // SAFETY: a slice of plain numbers viewed as bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            values.as_mut_ptr() as *mut u8,
            std::mem::size_of_val(values),
        )
    };
    all_reduce(comm, Data::InPlace(bytes), count, T::DTYPE, op)
}

/// A barrier: returns once every rank has entered it.
pub fn barrier(comm: &mut Communicator) -> Result<(), CommError> {
    let mut v = [0u8; 1];
    all_reduce_values(comm, &mut v, ReduceOp::Sum)
}
