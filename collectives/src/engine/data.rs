//! What a collective call works on, whatever its algorithm: its buffers ([`Data`], checked
//! into raw pointers), their transport registrations ([`Regs`]), sizes in bytes and the
//! pipeline's segment sizes.

use crate::dtype::DataType;
use crate::engine::space::{check_mirrors, MemorySpace};
use crate::error::CommError;
use crate::link::Communicator;
use busbw_transports::{MemRegion, MemoryKind, Registration};

/// The buffers of one collective call and the memory they live in.
///
/// In-place and out-of-place calls are distinct because Rust (rightly) will not let one slice
/// be both the source and the destination. In place, the single buffer is the larger of the
/// two (NCCL's convention): for AllGather and Gather it is the output and this rank's input
/// sits at `rank × count`; for ReduceScatter and Scatter it is the input and the output sits
/// at `rank × count`.
///
/// Buffers are host memory unless [`Data::on`] says otherwise: for data on a device they are
/// the device's page-locked host twins, and the [`MemorySpace`] decides per call what moves.
pub struct Data<'a> {
    buffers: Buffers<'a>,
    space: MemorySpace<'a>,
}

enum Buffers<'a> {
    InPlace(&'a mut [u8]),
    OutOfPlace { send: &'a [u8], recv: &'a mut [u8] },
}

/// Raw, checked pointers for a call, and the space they live in.
pub(crate) struct Bufs<'a> {
    pub src: *const u8,
    pub dst: *mut u8,
    pub space: MemorySpace<'a>,
}

impl<'a> Data<'a> {
    /// One buffer, both input and output (see the type's documentation for where each is).
    pub fn in_place(buf: &'a mut [u8]) -> Self {
        Data {
            buffers: Buffers::InPlace(buf),
            space: MemorySpace::Host,
        }
    }

    pub fn out_of_place(send: &'a [u8], recv: &'a mut [u8]) -> Self {
        Data {
            buffers: Buffers::OutOfPlace { send, recv },
            space: MemorySpace::Host,
        }
    }

    /// The same buffers, living in `space`.
    pub fn on(self, space: MemorySpace<'a>) -> Self {
        Data { space, ..self }
    }

    /// Whether the buffers are host memory (not a device's twins).
    pub(crate) fn on_host(&self) -> bool {
        matches!(self.space, MemorySpace::Host)
    }

    /// The buffers as host data, and the space they really live in: for algorithms that run
    /// on host twins made current by [`MemorySpace::around`].
    pub(crate) fn split_space(self) -> (Data<'a>, MemorySpace<'a>) {
        let space = self.space;
        let data = Data {
            buffers: self.buffers,
            space: MemorySpace::Host,
        };
        (data, space)
    }

    /// The call's input and output ranges (in place, the one buffer is both).
    #[allow(clippy::type_complexity)]
    pub(crate) fn ranges(&self) -> ([(*const u8, usize); 1], [(*mut u8, usize); 1]) {
        match &self.buffers {
            Buffers::InPlace(b) => ([(b.as_ptr(), b.len())], [(b.as_ptr() as *mut u8, b.len())]),
            Buffers::OutOfPlace { send, recv } => (
                [(send.as_ptr(), send.len())],
                [(recv.as_ptr() as *mut u8, recv.len())],
            ),
        }
    }

    /// Whether one buffer is both input and output.
    pub(crate) fn is_in_place(&self) -> bool {
        matches!(self.buffers, Buffers::InPlace(_))
    }

    /// The space the buffers live in, for a path that decides by it before the call runs.
    pub(crate) fn space_mut(&mut self) -> &mut MemorySpace<'a> {
        &mut self.space
    }

    pub(crate) fn bufs(
        mut self,
        rank: usize,
        what: &str,
        send_bytes: usize,
        recv_bytes: usize,
        dtype: DataType,
        offsets: (usize, usize),
    ) -> Result<Bufs<'a>, CommError> {
        let (src, dst) = self.ptrs(rank, what, send_bytes, recv_bytes, dtype, offsets)?;
        Ok(Bufs {
            src,
            dst,
            space: self.space,
        })
    }

    /// The checked input and output pointers of a call whose input starts `send_off` bytes
    /// and output `recv_off` bytes into an in-place buffer; see [`Data::bufs`].
    pub(crate) fn ptrs(
        &mut self,
        rank: usize,
        what: &str,
        send_bytes: usize,
        recv_bytes: usize,
        dtype: DataType,
        (send_off, recv_off): (usize, usize),
    ) -> Result<(*const u8, *mut u8), CommError> {
        let err = |m: String| CommError::Invalid(format!("rank {rank}: {what}: {m}"));
        if let MemorySpace::Device(d) = &self.space {
            let (inputs, outputs) = self.ranges();
            check_mirrors(d.mirrors(), &inputs, &outputs, rank, what)?;
        }
        let (src, dst) = match &mut self.buffers {
            Buffers::InPlace(b) => {
                let need = (send_off + send_bytes).max(recv_off + recv_bytes);
                if b.len() < need {
                    return Err(err(format!(
                        "in-place buffer of {} bytes is too small for {need} bytes",
                        b.len()
                    )));
                }
                let p = b.as_mut_ptr();
                // SAFETY: both offsets are inside the buffer (checked above).
                unsafe { (p.add(send_off) as *const u8, p.add(recv_off)) }
            }
            Buffers::OutOfPlace { send, recv } => {
                if send.len() < send_bytes || recv.len() < recv_bytes {
                    return Err(err(format!(
                        "buffers of {} and {} bytes are too small for {send_bytes} and {recv_bytes} bytes",
                        send.len(),
                        recv.len()
                    )));
                }
                (send.as_ptr(), recv.as_mut_ptr())
            }
        };
        for p in [src as usize, dst as usize] {
            if p % dtype.size() != 0 {
                return Err(err(format!("buffer at {p:#x} is not aligned for {dtype}")));
            }
        }
        Ok((src, dst))
    }
}

pub(crate) fn bytes_of(count: usize, dtype: DataType) -> Result<usize, CommError> {
    count
        .checked_mul(dtype.size())
        .ok_or_else(|| CommError::Invalid(format!("count {count} of {dtype} overflows")))
}

/// A call's registrations: registers `(ptr, elems)` regions and finds the one holding a
/// pointer. Kept by the executor between calls (empty, its capacity kept): at 8 bytes moving
/// or reallocating a handful of registrations costs as much as the transfer.
#[derive(Default)]
pub(crate) struct Regs {
    regs: Vec<Registration>,
}

impl Regs {
    /// Registers host regions; on an error every region is released again.
    pub fn host<T>(
        &mut self,
        comm: &Communicator,
        regions: impl Iterator<Item = (*const T, usize)>,
    ) -> Result<(), CommError> {
        let esize = std::mem::size_of::<T>();
        // SAFETY: callers pass memory that outlives these registrations (the caller's buffers
        // and the communicator's staging/scratch, which are not resized meanwhile).
        let regions = regions.map(|(p, elems)| unsafe {
            MemRegion::new(p as *mut u8, elems * esize, MemoryKind::Host)
        });
        self.register(comm, regions)
    }

    /// Registers prepared regions (device memory for the GPUDirect path, possibly carrying
    /// a dma-buf); on an error every region is released again.
    pub fn register(
        &mut self,
        comm: &Communicator,
        regions: impl Iterator<Item = MemRegion>,
    ) -> Result<(), CommError> {
        for region in regions {
            match comm.transport().register(region) {
                Ok(reg) => self.regs.push(reg),
                Err(cause) => {
                    self.release(comm);
                    return Err(CommError::Transport {
                        rank: comm.rank(),
                        peer: None,
                        during: "registering memory".into(),
                        cause,
                    });
                }
            }
        }
        Ok(())
    }

    pub fn find(&self, ptr: *const u8, len: usize) -> &Registration {
        self.regs
            .iter()
            .find(|r| r.region.contains(ptr, len))
            .unwrap_or(&self.regs[0])
    }

    /// Deregisters everything, keeping the capacity.
    pub fn release(&mut self, comm: &Communicator) {
        for r in self.regs.drain(..) {
            let _ = comm.transport().deregister(r);
        }
    }
}

/// Smallest segment the pipeline splits a chunk into: below it, per-message costs dominate.
const MIN_PIPELINE_SEGMENT: usize = 64 << 10;
/// Segments a chunk is cut into at least, when it is big enough: with one segment per chunk
/// a ring step cannot overlap sending with receiving and reducing, which halves mid-size
/// bandwidth (NCCL shrinks its chunks for mid-size messages for the same reason).
const MIN_SEGMENTS: usize = 4;

/// Pipeline segment size in elements for chunks of `chunk` elements: the configured segment,
/// shrunk so that a chunk has at least [`MIN_SEGMENTS`] segments, but not below
/// [`MIN_PIPELINE_SEGMENT`] (or the configured size, if that is smaller). Every rank computes
/// the same value from the same arguments.
pub(crate) fn pipeline_segment<T>(comm: &Communicator, chunk: usize) -> usize {
    let esize = std::mem::size_of::<T>();
    let max = segment_elems::<T>(comm);
    let min = (MIN_PIPELINE_SEGMENT.min(comm.config().segment_bytes) / esize).clamp(1, max);
    (chunk / MIN_SEGMENTS).clamp(min, max)
}

/// Segment size in elements.
pub(crate) fn segment_elems<T>(comm: &Communicator) -> usize {
    (comm.config().segment_bytes / std::mem::size_of::<T>()).max(1)
}
