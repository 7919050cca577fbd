//! Where a cell's data lives: this rank's host buffers, or its device's (`-g`), behind one
//! [`Memory`] so the timed loop and the checks are one code path.

use crate::device::DeviceMem;
use crate::error::{Error, Result};
use crate::specs::{CollectiveSpec, DataCtx, HostFill};
use busbw_collectives::verifiable::count_wrong;
use busbw_collectives::{Communicator, DataType, HostBuffer, MemorySpace};

pub(super) struct Buffers {
    pub(super) send: HostBuffer,
    pub(super) recv: HostBuffer,
    pub(super) expected: Option<HostBuffer>,
    /// `-u` in bytes of the current type: where the send and receive data start.
    pub(super) base: usize,
}

impl Buffers {
    fn recv(&mut self) -> &mut [u8] {
        &mut self.recv.as_mut_slice()[self.base..]
    }
    /// The send and receive data, and the whole expected buffer, borrowed together.
    fn fill(&mut self, dtype: DataType, expected: bool) -> HostFill<'_> {
        HostFill {
            dtype,
            send: &mut self.send.as_mut_slice()[self.base..],
            recv: &mut self.recv.as_mut_slice()[self.base..],
            expected: match (expected, self.expected.as_mut()) {
                (true, Some(e)) => Some(e.as_mut_slice()),
                _ => None,
            },
        }
    }
}

/// A buffer with every page already mapped: the operating system maps a fresh allocation on
/// first touch, and a touch inside the timed loop (the first pass over the rotation's window)
/// would time page faults, which nccl-tests' device memory never takes. `shared`: memory
/// that local peers can map, for the direct AllReduce.
pub(super) fn alloc(bytes: usize, what: &str, rank: usize, shared: bool) -> Result<HostBuffer> {
    let b = if shared {
        HostBuffer::shared(bytes)
    } else {
        HostBuffer::mapped(bytes)
    };
    b.ok_or_else(|| {
        Error::Memory(format!(
            "rank {rank}: cannot allocate {bytes} bytes for the {what} buffer; lower -e (or \
             --rotate, whose window every buffer holds)"
        ))
    })
}

/// Where a cell's buffers live. The timed loop, its clock, the combined timing and the
/// checks are one code path (`bench`) whatever the memory; only the operation and the
/// validation run differ.
pub(super) trait Memory {
    /// How many span-sized offsets the buffers hold (nccl-tests' rotation).
    fn shifts(&self, span: usize) -> usize;
    /// Input data for the timed runs, when they are checked afterwards.
    fn prime(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
    ) -> Result<()>;
    /// One operation with its data `off` bytes in. With `timed`, the operation's own time
    /// when this memory measures it (device events), `None` for the host clock's laps.
    fn op(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
        off: usize,
        timed: bool,
    ) -> Result<Option<f64>>;
    /// One validation run: fresh data for `vctx`, the operation, this rank's wrong count
    /// over `checked` (flipping a bit there first when `corrupt`).
    fn validate(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        vctx: &DataCtx,
        checked: std::ops::Range<usize>,
        corrupt: bool,
    ) -> Result<u64>;
    /// Where this memory's operations run on a stream that a timed loop may fill before
    /// waiting (`-z 0` through NCCL), that stream's loop; `None` where each operation
    /// completes before the next starts.
    fn deferred(&mut self) -> Option<&mut dyn Deferred> {
        None
    }
}

/// `-z 0` as nccl-tests runs it on NCCL: the timed loop enqueues every operation (each
/// iteration's `-m` operations as one group) and waits once at the end, so the row pays one
/// synchronisation, not one per operation; each iteration's time is read from boundaries
/// recorded on the stream between them.
pub(super) trait Deferred {
    /// Before the loop: its first boundary. `rank` names this rank in errors.
    fn open(&mut self, rank: usize) -> Result<()>;
    /// An iteration of `agg` operations begins.
    fn iteration(&mut self, rank: usize, agg: usize) -> Result<()>;
    /// Enqueues one operation with its data `off` bytes in, without waiting for it.
    fn enqueue(&mut self, spec: &CollectiveSpec, ctx: &DataCtx, off: usize) -> Result<()>;
    /// The iteration is enqueued: its group launched, its boundary recorded.
    fn iteration_done(&mut self, rank: usize, agg: usize) -> Result<()>;
    /// Waits for everything enqueued (at most `-T`); each iteration's seconds.
    fn settle(&mut self, rank: usize, spec: &CollectiveSpec) -> Result<Vec<f64>>;
}

impl Memory for Buffers {
    fn shifts(&self, span: usize) -> usize {
        let (send, recv) = (self.send.len(), self.recv.len());
        (send.max(recv) - self.base)
            .checked_div(span)
            .unwrap_or(1)
            .max(1)
    }
    fn prime(
        &mut self,
        _comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
    ) -> Result<()> {
        (spec.init)(ctx, &mut self.fill(ctx.dtype, false));
        Ok(())
    }
    fn op(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
        off: usize,
        _timed: bool,
    ) -> Result<Option<f64>> {
        let (sb, span) = (
            ctx.counts.send_bytes,
            ctx.counts.send_bytes.max(ctx.counts.recv_bytes),
        );
        let send = &self.send.as_slice()[self.base..];
        let recv = &mut self.recv.as_mut_slice()[self.base..];
        let s = &send[off.min(send.len().saturating_sub(sb))..];
        let roff = off.min(recv.len().saturating_sub(span));
        (spec.run)(comm, s, &mut recv[roff..], MemorySpace::Host, ctx)?;
        Ok(None)
    }
    fn validate(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        vctx: &DataCtx,
        checked: std::ops::Range<usize>,
        corrupt: bool,
    ) -> Result<u64> {
        let span = vctx.counts.send_bytes.max(vctx.counts.recv_bytes);
        self.recv()[..span].fill(0);
        (spec.init)(vctx, &mut self.fill(vctx.dtype, true));
        let send = &self.send.as_slice()[self.base..];
        let recv = &mut self.recv.as_mut_slice()[self.base..];
        (spec.run)(comm, send, recv, MemorySpace::Host, vctx)?;
        if corrupt && !checked.is_empty() {
            recv[checked.start] ^= 0x01;
        }
        Ok(match &self.expected {
            Some(e) => count_wrong(
                vctx.dtype,
                vctx.op,
                &recv[checked.clone()],
                &e.as_slice()[..checked.len()],
            ),
            None => 0,
        })
    }
}

/// Device buffers (`-g 1`; `gpu.rs`): each operation staged through the pinned twins and
/// lapped with CUDA events, the data made and checked on the device.
impl Memory for DeviceMem {
    fn shifts(&self, span: usize) -> usize {
        DeviceMem::shifts(self, span)
    }
    fn prime(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
    ) -> Result<()> {
        self.validate(comm, spec, ctx, 0..0, false).map(drop)
    }
    fn op(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
        off: usize,
        timed: bool,
    ) -> Result<Option<f64>> {
        DeviceMem::op(self, comm, spec, ctx, off, off, timed)
    }
    fn validate(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        vctx: &DataCtx,
        checked: std::ops::Range<usize>,
        corrupt: bool,
    ) -> Result<u64> {
        DeviceMem::validate(self, comm, spec, vctx, checked, corrupt)
    }
    #[cfg(feature = "cuda")]
    fn deferred(&mut self) -> Option<&mut dyn Deferred> {
        DeviceMem::deferred(self).map(|d| d as &mut dyn Deferred)
    }
}

#[cfg(feature = "cuda")]
impl Deferred for DeviceMem {
    fn open(&mut self, _rank: usize) -> Result<()> {
        self.defer_open()
    }
    fn iteration(&mut self, rank: usize, agg: usize) -> Result<()> {
        self.defer_iteration(rank, agg)
    }
    fn enqueue(&mut self, spec: &CollectiveSpec, ctx: &DataCtx, off: usize) -> Result<()> {
        self.defer_op(ctx.rank, spec, ctx, off)
    }
    fn iteration_done(&mut self, rank: usize, agg: usize) -> Result<()> {
        self.defer_iteration_done(rank, agg)
    }
    fn settle(&mut self, rank: usize, spec: &CollectiveSpec) -> Result<Vec<f64>> {
        self.defer_settle(rank, spec)
    }
}
