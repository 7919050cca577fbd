//! Where a call's buffers live, and everything that follows from it.
//!
//! A [`MemorySpace`] travels in every [`Data`](crate::Data): the caller says where its buffers
//! are, nothing is inferred from addresses. Algorithms hand out host addresses (a device's
//! page-locked twins when the data is on a device) and never look at the space themselves:
//!
//! - the executor resolves the space once per call (`MemorySpace::resolve`) into a
//!   `Space`: host memory; a device *staged* through its pinned twins (the transport moves
//!   the twins, the device copies and reduces around each message); or a device the
//!   transport moves *directly* (GPUDirect RDMA: device memory registered, nothing copied).
//!   The resolution registers the call's memory and picks its staging, and the resolved
//!   space runs each message's fetch, landing and reduction;
//! - algorithms that only move host memory (recursive doubling, the point-to-point family)
//!   run inside `MemorySpace::around`, which makes the twins current before and the device
//!   current after;
//! - local copies, scratch and `mulsum`'s premultiplied input are made where the data is.
//!
//! Peers' buffers mapped into this process are not one more space: the direct AllReduce
//! ([`crate::algorithms::direct`]) reads and writes them itself, because owning a slice of every rank's
//! output changes what moves, not where one message lands.

mod call;

pub(crate) use call::{Failed, Space};

use crate::dtype::DataType;
use crate::engine::data::{Data, Regs};
use crate::error::CommError;
use crate::link::Communicator;
use crate::offload::{device_of, Mirror, Offload, OffloadError};
use busbw_transports::MemRegion;
use std::sync::Arc;

/// Where a call's buffers live.
pub enum MemorySpace<'d> {
    /// Host memory: what the transports move as it is.
    Host,
    /// A device's memory, whose page-locked host twins the call's buffers are (the device's
    /// [`Offload::mirrors`] pair them). Each call moves the device memory itself when the
    /// device offers it ([`Offload::device_kind`]) and the transport registers it, else the
    /// twins, with the device copying and reducing around every message.
    Device(&'d mut dyn Offload),
}

impl std::fmt::Debug for MemorySpace<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemorySpace::Host => "Host",
            MemorySpace::Device(_) => "Device",
        })
    }
}

/// Runs `f` on `data` as host data, staged around by the space it lives in (see
/// [`MemorySpace::around`]): for the algorithms that move host memory only.
#[inline]
pub(crate) fn host_only<R>(
    comm: &mut Communicator,
    data: Data<'_>,
    what: &str,
    f: impl FnOnce(&mut Communicator, Data<'_>) -> Result<R, CommError>,
) -> Result<R, CommError> {
    let (data, mut space) = data.split_space();
    let (inputs, outputs) = data.ranges();
    space.around(comm, what, &inputs, &outputs, |comm| f(comm, data))
}

/// Fails unless every non-empty range lies in `mirrors`: data said to be on a device must be
/// inside its mirrors, or the call would move memory the device never sees.
pub(crate) fn check_mirrors(
    mirrors: &[Mirror],
    inputs: &[(*const u8, usize)],
    outputs: &[(*mut u8, usize)],
    rank: usize,
    what: &str,
) -> Result<(), CommError> {
    let ranges = inputs
        .iter()
        .copied()
        .chain(outputs.iter().map(|&(p, l)| (p as *const u8, l)));
    for (p, len) in ranges.filter(|r| r.1 > 0) {
        device_of(mirrors, p, len).map_err(|cause| {
            CommError::Invalid(format!(
                "rank {rank}: {what}: the data is on a device, but {cause}: pass the device's \
                 host twins, or host data without a device"
            ))
        })?;
    }
    Ok(())
}

pub(crate) fn err(rank: usize, during: &str) -> impl Fn(OffloadError) -> CommError + '_ {
    move |cause| CommError::Device {
        rank,
        during: during.to_string(),
        cause,
    }
}

impl<'d> MemorySpace<'d> {
    /// The space for one call, with the call's memory registered into `regs`: the device's
    /// memory when it offers it and the transport accepts it (GPUDirect RDMA: no copies),
    /// else its twins (staged), else host memory. Returns the space and the staging for
    /// `stage_elems` received elements: the device's for a device, `host_staging`'s on the
    /// host. `pool` splits big host reductions.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn resolve<'s, T>(
        &'s mut self,
        comm: &mut Communicator,
        regions: &[(*const T, usize)],
        stage_elems: usize,
        pool: Option<Arc<rayon::ThreadPool>>,
        host_staging: impl FnOnce(&mut Communicator) -> Result<*mut T, CommError>,
        what: &str,
        regs: &mut Regs,
    ) -> Result<(Space<'s>, *mut T), CommError> {
        let esize = std::mem::size_of::<T>();
        let with = |comm: &Communicator, stage: *mut T, regs: &mut Regs| {
            let all = regions.iter().copied();
            regs.host(comm, all.chain([(stage as *const T, stage_elems)]))
        };
        let d = match self {
            MemorySpace::Host => {
                let stage = host_staging(comm)?;
                with(comm, stage, regs)?;
                return Ok((Space::Host(pool), stage));
            }
            MemorySpace::Device(d) => &mut **d,
        };
        if d.device_kind().is_some() {
            let attempt = (|| {
                let stage = d.device_staging(stage_elems * esize)?;
                let mut dev_regions: smallvec::SmallVec<[MemRegion; 5]> =
                    smallvec::SmallVec::with_capacity(regions.len() + 1);
                for &(p, elems) in regions {
                    let a = device_of(d.mirrors(), p as *const u8, elems * esize)?;
                    dev_regions.push(d.device_region(a, elems * esize)?);
                }
                dev_regions.push(d.device_region(stage, stage_elems * esize)?);
                Ok::<_, OffloadError>((stage, dev_regions))
            })();
            // A transport that cannot move device memory refuses the registration: stage.
            match attempt {
                Ok((stage, dev_regions)) => match regs.register(comm, dev_regions.into_iter()) {
                    Ok(()) => {
                        let mirrors = d.mirrors().to_vec();
                        return Ok((Space::Direct(d, mirrors), stage as usize as *mut T));
                    }
                    Err(refused) => d.direct_refused(refused.to_string()),
                },
                Err(failed) => d.direct_refused(failed.to_string()),
            }
        }
        let stage = d
            .staging(stage_elems * esize)
            .map_err(err(comm.rank(), what))? as *mut T;
        with(comm, stage, regs)?;
        Ok((Space::Staged(d), stage))
    }

    /// Ends a call's work in this space: waits for the device (nothing may still write a
    /// twin or read staging once the call has returned).
    #[inline]
    pub(crate) fn finish(
        &mut self,
        rank: usize,
        result: Result<(), CommError>,
        what: &str,
    ) -> Result<(), CommError> {
        match self {
            MemorySpace::Host => result,
            MemorySpace::Device(d) => {
                let synced = d.sync().map_err(err(rank, what));
                result.and(synced)
            }
        }
    }

    /// Runs `f` on host twins made current: every input range copied out of the device
    /// first, every output range copied in afterwards (outputs are copied out too: what the
    /// collective leaves alone must come back as it was). On the host, `f` runs as is.
    #[inline]
    pub(crate) fn around<R>(
        &mut self,
        comm: &mut Communicator,
        what: &str,
        inputs: &[(*const u8, usize)],
        outputs: &[(*mut u8, usize)],
        f: impl FnOnce(&mut Communicator) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        // Host data, the latency-bound common case, costs one test.
        let MemorySpace::Device(dev) = self else {
            return f(comm);
        };
        let r = comm.rank();
        check_mirrors(dev.mirrors(), inputs, outputs, r, what)?;
        let all = inputs
            .iter()
            .copied()
            .chain(outputs.iter().map(|&(p, l)| (p as *const u8, l)));
        let during = format!("{what}: staging device buffers");
        let staged = (|| {
            for (p, len) in all.filter(|r| r.1 > 0) {
                dev.download(p, len)?;
            }
            dev.sync()
        })()
        .map_err(err(r, &during));
        staged.and_then(|()| f(comm)).and_then(|v| {
            (|| {
                for &(p, len) in outputs.iter().filter(|r| r.1 > 0) {
                    dev.upload(p, len)?;
                }
                dev.sync()
            })()
            .map_err(err(r, &during))?;
            Ok(v)
        })
    }

    /// Copies `len` bytes `src` → `dst` where the data lives (on a device, waiting for the
    /// copy).
    ///
    /// # Safety
    /// Both ranges valid for `len` bytes and disjoint (or equal, which copies nothing).
    #[inline]
    pub(crate) unsafe fn copy(
        &mut self,
        rank: usize,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        what: &str,
    ) -> Result<(), CommError> {
        if len == 0 || std::ptr::eq(dst as *const u8, src) {
            return Ok(());
        }
        match self {
            MemorySpace::Device(d) => d
                .copy(dst, src, len, false)
                .and_then(|_| d.sync())
                .map_err(err(rank, what)),
            MemorySpace::Host => {
                std::ptr::copy_nonoverlapping(src, dst, len);
                Ok(())
            }
        }
    }

    /// Scratch memory beside the call's buffers: a mirrored buffer of the device's, or
    /// `None` on the host (use the communicator's scratch).
    #[inline]
    pub(crate) fn scratch(
        &mut self,
        rank: usize,
        bytes: usize,
        what: &str,
    ) -> Result<Option<*mut u8>, CommError> {
        match self {
            MemorySpace::Host => Ok(None),
            MemorySpace::Device(d) => d.scratch(bytes).map(Some).map_err(err(rank, what)),
        }
    }

    /// `mulsum`'s premultiplied input made on the device, or `None` on the host.
    #[inline]
    pub(crate) fn premultiply(
        &mut self,
        rank: usize,
        src: *const u8,
        elems: usize,
        dtype: DataType,
    ) -> Result<Option<*const u8>, CommError> {
        match self {
            MemorySpace::Host => Ok(None),
            MemorySpace::Device(d) => d
                .premultiply(src, elems, dtype, rank)
                .map(Some)
                .map_err(err(rank, "mulsum premultiplication")),
        }
    }
}
