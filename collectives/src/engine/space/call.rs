//! A call's resolved space and what it means for each message.
//!
//! Schedules hand out host addresses (a device's page-locked twins when the data is on a
//! device); the space decides what each message costs beyond the transport: nothing on the
//! host, copies between device and twin on a staged device, address translation on a device
//! the transport moves itself (GPUDirect RDMA). Reductions run where the data is.

use super::err;
use crate::dtype::ReduceOp;
use crate::element::{finish_avg, reduce_inplace_par, reduce_into_par, Element};
use crate::error::CommError;
use crate::offload::{self, Mirror, Offload, OffloadError, Reduce, Ticket};
use std::sync::Arc;

pub(crate) enum Space<'d> {
    /// Host memory; big reductions split over the communicator's pool.
    Host(Option<Arc<rayon::ThreadPool>>),
    /// A device whose twins the transport moves: own input is fetched before it is sent,
    /// reductions run on the device (and come back only to travel on), landed data goes up.
    Staged(&'d mut dyn Offload),
    /// A device whose memory the transport moves: schedules' twin addresses stand for their
    /// device twins, reductions run on device addresses, nothing is copied.
    Direct(&'d mut dyn Offload, Vec<Mirror>),
}

/// A space's failure in a call's words.
pub(crate) struct Failed<'a> {
    pub rank: usize,
    pub name: &'a str,
}

impl Failed<'_> {
    fn err(&self, cause: OffloadError) -> CommError {
        err(self.rank, self.name)(cause)
    }
}

fn translate<T>(
    mirrors: &[Mirror],
    p: *const T,
    elems: usize,
    f: &Failed,
) -> Result<*const T, CommError> {
    let bytes = elems * std::mem::size_of::<T>();
    let a = offload::device_of(mirrors, p as *const u8, bytes).map_err(|e| f.err(e))?;
    Ok(a as usize as *const T)
}

impl Space<'_> {
    /// The address a transport or a device reduction uses for twin `p..p+elems`.
    pub fn at<T>(&self, p: *const T, elems: usize, f: &Failed) -> Result<*const T, CommError> {
        match self {
            Space::Direct(_, mirrors) => translate(mirrors, p, elems, f),
            _ => Ok(p),
        }
    }

    /// Own input about to be sent: on a staged device its twin is fetched first, and the
    /// send waits for the returned ticket.
    pub fn fetch<T>(
        &mut self,
        p: *const T,
        elems: usize,
        f: &Failed,
    ) -> Result<Option<Ticket>, CommError> {
        match self {
            Space::Staged(d) => {
                let bytes = elems * std::mem::size_of::<T>();
                Ok(Some(
                    d.download(p as *const u8, bytes).map_err(|e| f.err(e))?,
                ))
            }
            _ => Ok(None),
        }
    }

    /// Data landed at twin `p` where it belongs: a staged device gets it while it travels on
    /// (the call syncs the device before it returns).
    pub fn landed<T>(&mut self, p: *const T, elems: usize, f: &Failed) -> Result<(), CommError> {
        if let Space::Staged(d) = self {
            let bytes = elems * std::mem::size_of::<T>();
            d.upload(p as *const u8, bytes).map_err(|e| f.err(e))?;
        }
        Ok(())
    }

    /// `out = mine op staged` (then `avg`'s division): done on return on the host, else the
    /// ticket to wait for. `staged` is the receive's own address (device staging when
    /// direct); `out` and `mine` are twins.
    ///
    /// # Safety
    /// The three ranges are valid for `elems` elements and touched by no in-flight request;
    /// `out` and `mine` are identical or disjoint.
    pub unsafe fn reduce<T: Element>(
        &mut self,
        (out, mine, staged): (*mut T, *const T, *mut T),
        elems: usize,
        op: ReduceOp,
        (avg_over, travels_on, theirs_first): (Option<usize>, bool, bool),
        f: &Failed,
    ) -> Result<Option<Ticket>, CommError> {
        let in_place = std::ptr::eq(out as *const T, mine);
        if theirs_first && !(in_place && matches!(self, Space::Host(_))) {
            return Err(CommError::Invalid(format!(
                "rank {}: {}: a reduction with the peer's data first runs in place on host memory only",
                f.rank, f.name
            )));
        }
        match self {
            Space::Host(pool) => {
                let o = std::slice::from_raw_parts_mut(out, elems);
                if theirs_first {
                    // The staging slot is ours until the receive is processed.
                    let s = std::slice::from_raw_parts_mut(staged, elems);
                    reduce_inplace_par(op, s, o, pool.as_deref());
                    o.copy_from_slice(s);
                } else if in_place {
                    let s = std::slice::from_raw_parts(staged, elems);
                    reduce_inplace_par(op, o, s, pool.as_deref());
                } else {
                    let s = std::slice::from_raw_parts(staged, elems);
                    let m = std::slice::from_raw_parts(mine, elems);
                    reduce_into_par(op, o, m, s, pool.as_deref());
                }
                if let Some(n) = avg_over {
                    finish_avg(o, n);
                }
                Ok(None)
            }
            Space::Staged(d) => {
                let job = Reduce {
                    out: out as *mut u8,
                    mine: mine as *const u8,
                    staged: staged as *const u8,
                    elems,
                    dtype: T::DTYPE,
                    op,
                    avg_over,
                    download: travels_on,
                };
                Ok(Some(d.reduce(job).map_err(|e| f.err(e))?))
            }
            Space::Direct(d, mirrors) => {
                let o = translate(mirrors, out as *const T, elems, f)? as u64;
                let m = translate(mirrors, mine, elems, f)? as u64;
                let t = d
                    .reduce_on_device(o, m, staged as u64, elems, T::DTYPE, op, avg_over)
                    .map_err(|e| f.err(e))?;
                Ok(Some(t))
            }
        }
    }

    /// Whether device work `t` has completed (the host has none).
    pub fn complete(&mut self, t: Ticket, f: &Failed) -> Result<bool, CommError> {
        match self {
            Space::Host(_) => Ok(true),
            Space::Staged(d) | Space::Direct(d, _) => d.complete(t).map_err(|e| f.err(e)),
        }
    }
}
