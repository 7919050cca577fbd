//! Recursive-doubling AllReduce: MPI's algorithm for short messages (Thakur, Rabenseifner and
//! Gropp, "Optimization of Collective Communication Operations in MPICH", 2005).
//!
//! A ring takes `2(n-1)` dependent hops and a tree `2·depth`; recursive doubling takes
//! `log2(n)`: in step k every rank swaps its whole partial result with the rank whose index
//! differs in bit k and reduces. It moves `log2(n)` times the buffer instead of the ring's
//! `2(n-1)/n`, so it only wins while latency dominates, which is exactly where the ring and
//! the tree lose most (8 bytes on 2 ranks: one hop instead of two; on 4 ranks sharing 2 cores:
//! two scheduler round trips instead of six).
//!
//! A rank count that is not a power of two, `n = p + rem` with `p` the largest power of two
//! below it, is folded first: each of the first `rem` even ranks hands its input to the odd
//! rank after it and waits; the remaining `p` ranks double; the folded ranks get the result
//! back at the end (two extra hops, still far fewer than a ring's).
//!
//! Every pair reduces in the same order, lower-numbered side first, so all ranks end with the
//! same bits even where an operator is not commutative bit for bit (min/max of +0 and -0, NaN
//! payloads).

use crate::communicator::{Communicator, Waiter};
use crate::data::{bytes_of, Data};
use crate::dtype::{DataType, ReduceOp};
use crate::element::{finish_avg, reduce_inplace, Element};
use crate::error::CommError;
use crate::offload;
use crate::with_dtype;
use crate::workspace::premultiplied;
use busbw_transports::{MemRegion, MemoryKind, RecvComm, Registration, SendComm};

/// Channel of recursive doubling: the ring's. Calls never overlap, so sharing it is safe, and
/// on two ranks the partner is the ring neighbour whose connections already exist.
const CHANNEL: u32 = 0;

/// AllReduce `count` elements of `dtype` with `op` by recursive doubling; same contract as
/// [`crate::all_reduce`].
pub fn rd_all_reduce(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let bytes = bytes_of(count, dtype)?;
    let b = data.bufs(comm.rank(), "rd_all_reduce", bytes, bytes, dtype, (0, 0))?;
    // Recursive doubling reduces on the host: device data is staged around it.
    let (inputs, outputs) = ([(b.src, bytes)], [(b.dst, bytes)]);
    offload::around(comm, "rd_all_reduce", &inputs, &outputs, |comm| {
        with_dtype!(dtype, T => {
            // SAFETY: Data::bufs checked sizes and alignment; the borrows outlive the call.
            unsafe {
                let src = premultiplied(comm, op, b.src as *const T, count)?;
                rd_all_reduce_raw::<T>(comm, src, b.dst as *mut T, count, op)
            }
        })
    })
}

/// Number of dependent hops recursive doubling takes on `n` ranks (for the cost model).
pub fn rd_hops(n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    p.trailing_zeros() as usize + if p == n { 0 } else { 2 }
}

/// # Safety
/// `src` and `dst` valid for `count` elements (possibly equal: in place).
pub(crate) unsafe fn rd_all_reduce_raw<T: Element>(
    comm: &mut Communicator,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let n = comm.size();
    let r = comm.rank();
    let tag = comm.next_tag();
    if !std::ptr::eq(src, dst) && count > 0 {
        std::ptr::copy_nonoverlapping(src, dst, count);
    }
    if n == 1 || count == 0 {
        return Ok(());
    }
    let esize = std::mem::size_of::<T>();
    let bytes = count * esize;
    if comm.staging.ensure(bytes).is_none() {
        return Err(CommError::OutOfMemory {
            rank: r,
            bytes,
            what: "staging buffers",
        });
    }
    let stage = comm.staging.as_mut_slice().as_mut_ptr() as *mut T;
    let reg = |p: *mut T| {
        comm.transport()
            .register(MemRegion::new(p as *mut u8, bytes, MemoryKind::Host))
            .map_err(|cause| CommError::Transport {
                rank: r,
                peer: None,
                during: "registering memory".into(),
                cause,
            })
    };
    let regs = [reg(dst)?, reg(stage)?];

    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    // Index among the `p` ranks that double, or None for a rank folded away.
    let vrank = if r < 2 * rem {
        (r % 2 == 1).then_some(r / 2)
    } else {
        Some(r - rem)
    };
    let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };
    let mut x = Xchg {
        comm,
        regs,
        tag,
        bytes,
        dst: dst as *mut u8,
        stage: stage as *mut u8,
    };

    let result = (|| -> Result<(), CommError> {
        match vrank {
            None => {
                // Folded: hand our input to r+1, get the result back at the end.
                x.run(Some(r + 1), None)?;
                x.run(None, Some((r + 1, false)))?;
            }
            Some(v) => {
                if r < 2 * rem {
                    // Absorb the even rank before us: its data is the lower side.
                    x.run(None, Some((r - 1, true)))?;
                    combine::<T>(op, dst, stage, count, false);
                }
                let mut mask = 1;
                while mask < p {
                    let partner = v ^ mask;
                    x.run(Some(real(partner)), Some((real(partner), true)))?;
                    combine::<T>(op, dst, stage, count, v < partner);
                    mask <<= 1;
                }
                if op == ReduceOp::Avg {
                    finish_avg(std::slice::from_raw_parts_mut(dst, count), n);
                }
                if r < 2 * rem {
                    x.run(Some(r - 1), None)?;
                }
            }
        }
        Ok(())
    })();
    for reg in x.regs {
        let _ = x.comm.transport().deregister(reg);
    }
    result
}

/// `dst = dst op stage` when our side is the lower one, else `dst = stage op dst`, so both
/// ranks of a pair compute the identical value.
///
/// # Safety
/// `dst` and `stage` are distinct and valid for `count` elements.
unsafe fn combine<T: Element>(
    op: ReduceOp,
    dst: *mut T,
    stage: *mut T,
    count: usize,
    mine_first: bool,
) {
    let d = std::slice::from_raw_parts_mut(dst, count);
    let s = std::slice::from_raw_parts_mut(stage, count);
    if mine_first {
        reduce_inplace(op, d, s);
    } else {
        reduce_inplace(op, s, d);
        d.copy_from_slice(s);
    }
}

/// One step's transfers: the whole result buffer out, the partner's into staging (or, for a
/// folded rank's last step, into the result buffer).
struct Xchg<'a> {
    comm: &'a mut Communicator,
    regs: [Registration; 2],
    tag: u32,
    bytes: usize,
    dst: *mut u8,
    stage: *mut u8,
}

impl Xchg<'_> {
    /// Send the result buffer to `to` and/or receive from `from` (`(peer, into staging)`),
    /// progressing both until done.
    fn run(&mut self, to: Option<usize>, from: Option<(usize, bool)>) -> Result<(), CommError> {
        let mut send = match to {
            Some(p) => Some((p, self.comm.take_send(p, CHANNEL)?)),
            None => None,
        };
        let mut recv = match from.map(|(p, s)| self.comm.take_recv(p, CHANNEL).map(|c| (p, s, c))) {
            None => None,
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => {
                if let Some((p, c)) = send {
                    self.comm.put_send(p, CHANNEL, c);
                }
                return Err(e);
            }
        };
        let result = self.progress(send.as_mut(), recv.as_mut());
        if let Some((p, c)) = send {
            self.comm.put_send(p, CHANNEL, c);
        }
        if let Some((p, _, c)) = recv {
            self.comm.put_recv(p, CHANNEL, c);
        }
        result
    }

    fn progress(
        &mut self,
        send: Option<&mut (usize, Box<dyn SendComm>)>,
        recv: Option<&mut (usize, bool, Box<dyn RecvComm>)>,
    ) -> Result<(), CommError> {
        let (r, tag, bytes) = (self.comm.rank(), self.tag, self.bytes);
        let err = |peer: usize, what: &'static str| {
            move |cause| CommError::Transport {
                rank: r,
                peer: Some(peer),
                during: format!("rd_all_reduce (call {tag}): {what} rank {peer}"),
                cause,
            }
        };
        // SAFETY: the result buffer is not written while the send is in flight (the receive
        // goes to staging, except a folded rank's, which sends nothing at the same time), and
        // the receive target is written by nobody else until it completes.
        let (mut send, mut recv) = (send, recv);
        let mut sid = match &mut send {
            Some((p, c)) => Some(
                unsafe { c.isend(&self.regs[0], self.dst, bytes, tag) }
                    .map_err(err(*p, "sending to"))?,
            ),
            None => None,
        };
        let mut rid = match &mut recv {
            Some((p, into_stage, c)) => {
                let (reg, ptr) = if *into_stage {
                    (&self.regs[1], self.stage)
                } else {
                    (&self.regs[0], self.dst)
                };
                Some(unsafe { c.irecv(reg, ptr, bytes, tag) }.map_err(err(*p, "receiving from"))?)
            }
            None => None,
        };
        let mut waiter = Waiter::new(self.comm);
        while sid.is_some() || rid.is_some() {
            let mut progressed = false;
            if let (Some(id), Some((p, c))) = (sid, send.as_mut()) {
                if c.test(id).map_err(err(*p, "sending to"))?.is_some() {
                    sid = None;
                    progressed = true;
                }
            }
            if let (Some(id), Some((p, _, c))) = (rid, recv.as_mut()) {
                if let Some(got) = c.test(id).map_err(err(*p, "receiving from"))? {
                    if got != bytes {
                        return Err(CommError::short_message(r, "rd_all_reduce", *p, got, bytes));
                    }
                    rid = None;
                    progressed = true;
                }
            }
            if progressed {
                waiter.progressed();
                continue;
            }
            let peer = recv
                .as_ref()
                .filter(|_| rid.is_some())
                .map(|(p, _, _)| *p)
                .or(send.as_ref().map(|(p, _)| *p))
                .unwrap_or(r);
            if waiter.idle(self.comm, || {
                (
                    peer,
                    format!("waiting for rank {peer} (rd_all_reduce call {tag})"),
                )
            })? {
                waiter.sleep_pair(
                    recv.as_mut()
                        .filter(|_| rid.is_some())
                        .map(|(_, _, c)| c.as_mut()),
                    send.as_mut()
                        .filter(|_| sid.is_some())
                        .map(|(_, c)| c.as_mut()),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops() {
        assert_eq!(rd_hops(1), 0);
        assert_eq!(rd_hops(2), 1);
        assert_eq!(rd_hops(3), 3);
        assert_eq!(rd_hops(4), 2);
        assert_eq!(rd_hops(6), 4);
        assert_eq!(rd_hops(8), 3);
        assert_eq!(rd_hops(9), 5);
    }
}
