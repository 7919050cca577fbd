//! Rooted collectives as pipelined chains: Broadcast flows root → root+1 → … → root-1;
//! Reduce flows root+1 → … → root-1 → root, each rank adding its contribution on the way.
//!
//! A chain is a ring with one link cut, so it runs on the ring engine: segment k is forwarded
//! the moment it arrives (or is reduced) while segment k+1 is on the wire, which makes the
//! time for large messages `size / link bandwidth` plus `n-1` segment latencies, as NCCL's
//! ring Broadcast and Reduce do.

use crate::algorithms::peer::{self, Call, Kind};
use crate::algorithms::ring::{run_ring, Chunks, RingSchedule};
use crate::dtype::{DataType, ReduceOp};
use crate::element::Element;
use crate::engine::data::{bytes_of, pipeline_segment, Data};
use crate::engine::space::MemorySpace;
use crate::engine::workspace::{premultiplied, scratch};
use crate::engine::Regions;
use crate::error::CommError;
use crate::link::Communicator;
use crate::with_dtype;

fn check_root(comm: &Communicator, root: usize, what: &str) -> Result<(), CommError> {
    if root >= comm.size() {
        return Err(CommError::Invalid(format!(
            "{what}: root {root} is not a rank of a communicator of {} ranks",
            comm.size()
        )));
    }
    Ok(())
}

/// Broadcast `count` elements from `root`'s send buffer into every rank's receive buffer.
/// In place, the single buffer is both (the root's data is already there).
pub fn broadcast(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    root: usize,
) -> Result<(), CommError> {
    check_root(comm, root, "broadcast")?;
    let Some(data) = peer::offer(
        comm,
        data,
        Call::moving(Kind::Broadcast, "broadcast", count, dtype).at(root),
    )?
    else {
        return Ok(());
    };
    let bytes = bytes_of(count, dtype)?;
    let mut b = data.bufs(comm.rank(), "broadcast", bytes, bytes, dtype, (0, 0))?;
    let space = &mut b.space;
    with_dtype!(dtype, T => {
        // SAFETY: Data::bufs checked sizes and alignment; the borrows outlive the call.
        unsafe { broadcast_raw::<T>(comm, space, b.src as *const T, b.dst as *mut T, count, root) }
    })
}

/// Reduce `count` elements from every rank into `root`'s receive buffer. Other ranks'
/// receive buffers are left untouched.
pub fn reduce(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
) -> Result<(), CommError> {
    check_root(comm, root, "reduce")?;
    let Some(data) = peer::offer(
        comm,
        data,
        Call::reducing(Kind::Reduce, "reduce", count, dtype, op).at(root),
    )?
    else {
        return Ok(());
    };
    let bytes = bytes_of(count, dtype)?;
    let mut b = data.bufs(comm.rank(), "reduce", bytes, bytes, dtype, (0, 0))?;
    let space = &mut b.space;
    with_dtype!(dtype, T => {
        // SAFETY: as in broadcast.
        unsafe {
            let src = premultiplied(comm, space, op, b.src as *const T, count)?;
            reduce_raw::<T>(comm, space, src, b.dst as *mut T, count, op, root)
        }
    })
}

/// Position-aware chain schedule over one chunk holding the whole buffer.
struct ChainSchedule<T> {
    prev: Option<usize>,
    next: Option<usize>,
    count: usize,
    /// Broadcast: where forwarded data is read from (root: its input; others: the output).
    send_src: *const T,
    /// Broadcast: where received data lands.
    recv_dst: *mut T,
    /// Reduce: whether received segments are reduced, and where.
    reduce: Option<(*const T, *mut T)>,
    is_root: bool,
}

impl<T> RingSchedule<T> for ChainSchedule<T> {
    fn steps(&self) -> usize {
        1
    }
    fn send_chunk(&self, _t: usize) -> usize {
        0
    }
    fn recv_chunk(&self, _t: usize) -> usize {
        0
    }
    fn reduces(&self, _t: usize) -> bool {
        self.reduce.is_some()
    }
    fn is_final(&self, _t: usize) -> bool {
        self.is_root
    }
    fn send_from(&self, _t: usize, off: usize) -> *const T {
        unsafe { self.send_src.add(off) }
    }
    fn recv_into(&self, _t: usize, off: usize) -> *mut T {
        unsafe { self.recv_dst.add(off) }
    }
    fn reduce_in(&self, _t: usize, off: usize) -> *const T {
        match self.reduce {
            Some((i, _)) => unsafe { i.add(off) },
            None => std::ptr::null(),
        }
    }
    fn reduce_out(&self, _t: usize, off: usize) -> *mut T {
        match self.reduce {
            Some((_, o)) => unsafe { o.add(off) },
            None => std::ptr::null_mut(),
        }
    }
    fn regions(&self) -> Regions<T> {
        let mut v = smallvec::smallvec![
            (self.send_src, self.count),
            (self.recv_dst as *const T, self.count),
        ];
        if let Some((i, o)) = self.reduce {
            v.push((i, self.count));
            v.push((o as *const T, self.count));
        }
        v
    }
    fn left(&self) -> Option<usize> {
        self.prev
    }
    fn right(&self) -> Option<usize> {
        self.next
    }
    fn initially_ready(&self, ch: &Chunks) -> usize {
        if self.prev.is_none() {
            ch.segments(0)
        } else {
            0
        }
    }
    fn releases_send(&self, _t: usize) -> bool {
        self.next.is_some()
    }
}

/// # Safety
/// `src` and `dst` valid for `count` elements (possibly equal).
pub(crate) unsafe fn broadcast_raw<T: Element>(
    comm: &mut Communicator,
    space: &mut MemorySpace,
    src: *const T,
    dst: *mut T,
    count: usize,
    root: usize,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    if r == root {
        let bytes = count * std::mem::size_of::<T>();
        space.copy(r, dst as *mut u8, src as *const u8, bytes, "broadcast")?;
    }
    if n == 1 || count == 0 {
        comm.next_tag();
        return Ok(());
    }
    let pos = (r + n - root) % n;
    let schedule = ChainSchedule {
        prev: (pos > 0).then(|| (r + n - 1) % n),
        next: (pos < n - 1).then(|| (r + 1) % n),
        count,
        send_src: dst as *const T,
        recv_dst: dst,
        reduce: None,
        is_root: r == root,
    };
    let ch = Chunks {
        base: count,
        rem: 0,
        seg: pipeline_segment::<T>(comm, count),
    };
    run_ring(comm, space, &schedule, &ch, ReduceOp::Sum, 0, "broadcast")
}

/// # Safety
/// `src` and `dst` valid for `count` elements (possibly equal).
pub(crate) unsafe fn reduce_raw<T: Element>(
    comm: &mut Communicator,
    space: &mut MemorySpace,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
    root: usize,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    if n == 1 || count == 0 {
        comm.next_tag();
        let bytes = count * std::mem::size_of::<T>();
        return space.copy(r, dst as *mut u8, src as *const u8, bytes, "reduce");
    }
    // Position along the chain: root+1 first, root last.
    let pos = (r + n - root - 1) % n;
    let is_root = r == root;
    // Intermediate partial sums go to scratch: a non-root's receive buffer must stay as is.
    let esize = std::mem::size_of::<T>();
    let out = if is_root {
        dst
    } else {
        match space.scratch(r, count * esize, "reduce")? {
            Some(p) => p as *mut T,
            None => scratch::<T>(comm, count)?,
        }
    };
    let first = pos == 0;
    let schedule = ChainSchedule {
        prev: (!first).then(|| (r + n - 1) % n),
        next: (!is_root).then(|| (r + 1) % n),
        count,
        send_src: if first { src } else { out as *const T },
        recv_dst: out,
        reduce: (!first).then_some((src, out)),
        is_root,
    };
    let ch = Chunks {
        base: count,
        rem: 0,
        seg: pipeline_segment::<T>(comm, count),
    };
    run_ring(comm, space, &schedule, &ch, op, 0, "reduce")
}
