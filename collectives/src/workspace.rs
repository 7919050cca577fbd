//! The communicator's own memory that algorithms borrow for a call: staging slots for
//! received segments, scratch, and `mulsum`'s premultiplied input.

use crate::buffer::HostBuffer;
use crate::communicator::Communicator;
use crate::dtype::ReduceOp;
use crate::element::{scale_into, Element};
use crate::error::CommError;
use crate::space::MemorySpace;

/// Grows the communicator's staging area (received segments waiting to be reduced) to
/// `elems` elements and returns it.
pub(crate) fn staging<T>(comm: &mut Communicator, elems: usize) -> Result<*mut T, CommError> {
    grow(comm, elems, |c| &mut c.staging, "staging buffers")
}

/// Grows the communicator's scratch area to `elems` elements and returns it.
pub(crate) fn scratch<T>(comm: &mut Communicator, elems: usize) -> Result<*mut T, CommError> {
    grow(comm, elems, |c| &mut c.scratch, "scratch buffers")
}

fn grow<T>(
    comm: &mut Communicator,
    elems: usize,
    area: impl Fn(&mut Communicator) -> &mut HostBuffer,
    what: &'static str,
) -> Result<*mut T, CommError> {
    let bytes = elems * std::mem::size_of::<T>();
    let rank = comm.rank();
    let buf = area(comm);
    if buf.ensure(bytes).is_none() {
        return Err(CommError::OutOfMemory { rank, bytes, what });
    }
    Ok(buf.as_mut_slice().as_mut_ptr() as *mut T)
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
    let bytes = elems * std::mem::size_of::<T>();
    if comm.premul.ensure(bytes).is_none() {
        return Err(CommError::OutOfMemory {
            rank: comm.rank(),
            bytes,
            what: "mulsum input",
        });
    }
    let rank = comm.rank();
    let out = comm.premul.as_mut_slice().as_mut_ptr() as *mut T;
    scale_into(
        std::slice::from_raw_parts_mut(out, elems),
        std::slice::from_raw_parts(src, elems),
        rank,
    );
    Ok(out as *const T)
}
