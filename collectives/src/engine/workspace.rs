//! The engine's memory that algorithms borrow for a call (staging slots for received
//! segments, scratch, `mulsum`'s premultiplied input) and the threads large reductions are
//! split across: kept with the communicator from call to call, grown when a call needs more.

use crate::buffer::HostBuffer;
use crate::dtype::ReduceOp;
use crate::element::{scale_into, Element};
use crate::engine::space::MemorySpace;
use crate::error::CommError;
use crate::link::Communicator;
use std::sync::Arc;

/// What the engine keeps with a communicator ([`Communicator::kept`]).
#[derive(Default)]
pub(crate) struct Workspace {
    /// Receive staging for reductions.
    staging: Option<HostBuffer>,
    /// Partial results that must outlive a step (reduce-scatter, reduce).
    scratch: Option<HostBuffer>,
    /// This rank's input multiplied by its `mulsum` scalar.
    premul: Option<HostBuffer>,
    /// Threads for large reductions (`CommConfig::reduce_threads`), built on first use:
    /// `Some(None)` where there is to be none.
    pool: Option<Option<Arc<rayon::ThreadPool>>>,
}

impl crate::link::Kept for Workspace {
    const SLOT: usize = 1;
}

/// Grows the communicator's staging area (received segments waiting to be reduced) to
/// `elems` elements and returns it.
#[inline]
pub(crate) fn staging<T>(comm: &mut Communicator, elems: usize) -> Result<*mut T, CommError> {
    grow(comm, elems, |w| &mut w.staging, "staging buffers")
}

/// Grows the communicator's scratch area to `elems` elements and returns it.
#[inline]
pub(crate) fn scratch<T>(comm: &mut Communicator, elems: usize) -> Result<*mut T, CommError> {
    grow(comm, elems, |w| &mut w.scratch, "scratch buffers")
}

#[inline]
fn grow<T>(
    comm: &mut Communicator,
    elems: usize,
    area: impl Fn(&mut Workspace) -> &mut Option<HostBuffer>,
    what: &'static str,
) -> Result<*mut T, CommError> {
    let bytes = elems * std::mem::size_of::<T>();
    let rank = comm.rank();
    let buf = area(comm.kept::<Workspace>());
    let grown = match buf.as_mut() {
        Some(b) => b.ensure(bytes).is_some(),
        None => {
            *buf = HostBuffer::new(bytes);
            buf.is_some()
        }
    };
    match (grown, buf.as_mut()) {
        (true, Some(b)) => Ok(b.as_mut_slice().as_mut_ptr() as *mut T),
        _ => Err(CommError::OutOfMemory { rank, bytes, what }),
    }
}

/// The pool large reductions are split across, if the communicator's configuration asks
/// for more than one thread.
pub(crate) fn reduce_pool(comm: &mut Communicator) -> Option<Arc<rayon::ThreadPool>> {
    let (threads, rank) = (comm.config().reduce_threads, comm.rank());
    comm.kept::<Workspace>()
        .pool
        .get_or_insert_with(|| {
            (threads > 1)
                .then(|| {
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .thread_name(move |i| format!("busbw-reduce-{rank}.{i}"))
                        .build()
                        .ok()
                        .map(Arc::new)
                })
                .flatten()
        })
        .clone()
}

/// For `mulsum`, this rank's input times its scalar, in a buffer of the communicator's (of
/// the device's, for device data); the algorithms then simply sum. Other ops use the input
/// as is.
///
/// # Safety
/// `src` valid for `elems` elements.
pub(crate) unsafe fn premultiplied<T: Element>(
    comm: &mut Communicator,
    space: &mut MemorySpace,
    op: ReduceOp,
    src: *const T,
    elems: usize,
) -> Result<*const T, CommError> {
    if op != ReduceOp::MulSum || elems == 0 {
        return Ok(src);
    }
    if let Some(p) = space.premultiply(comm.rank(), src as *const u8, elems, T::DTYPE)? {
        return Ok(p as *const T);
    }
    let rank = comm.rank();
    let out: *mut T = grow(comm, elems, |w| &mut w.premul, "mulsum input")?;
    scale_into(
        std::slice::from_raw_parts_mut(out, elems),
        std::slice::from_raw_parts(src, elems),
        rank,
    );
    Ok(out as *const T)
}
