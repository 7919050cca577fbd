//! An NCCL communicator and the calls busbw's collectives map to (`--engine nccl`).
//!
//! Buffers are device addresses (`u64`, as the offload and the harness carry them) and every
//! call is enqueued on the caller's stream; NCCL returns before the work is done. The calls
//! are `unsafe`: NCCL reads and writes whatever the addresses say, so the caller promises
//! that each is device memory of this communicator's device, valid for the call's counts
//! until the stream has run it, and that `stream` is a live stream of that device. A caller
//! waits with [`Comm::wait`], which polls the stream and `ncclCommGetAsyncError` together, so
//! that a peer that stopped answering ends in an abort after `-T` rather than a hang: a
//! blocking stream synchronisation would never return.

use super::{Nccl, NcclError, RawComm, Stream};
use crate::dtype::{DataType, ReduceOp};
use crate::element::{premul_scalar, Element};
use crate::with_dtype;
use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

/// `ncclInProgress`: what the async-error query says while a non-blocking operation runs.
const IN_PROGRESS: c_int = 7;
/// `ncclScalarHostImmediate`: PreMulSum reads its scalar before the call returns.
const SCALAR_HOST_IMMEDIATE: c_int = 1;
/// `NCCL_SPLIT_NOCOLOR`.
const NO_COLOR: c_int = -1;

/// NCCL's `ncclDataType_t` for `d` (FP8 needs NCCL 2.24 or later, which says so itself).
pub fn nccl_type(d: DataType) -> c_int {
    match d {
        DataType::Int8 => 0,
        DataType::Uint8 => 1,
        DataType::Int32 => 2,
        DataType::Uint32 => 3,
        DataType::Int64 => 4,
        DataType::Uint64 => 5,
        DataType::Float16 => 6,
        DataType::Float32 => 7,
        DataType::Float64 => 8,
        DataType::BFloat16 => 9,
        DataType::F8E4M3 => 10,
        DataType::F8E5M2 => 11,
    }
}

/// The built-in `ncclRedOp_t` for `op`; `None` for `mulsum`, which is a PreMulSum operator
/// made per call with this rank's scalar.
pub fn nccl_op(op: ReduceOp) -> Option<c_int> {
    match op {
        ReduceOp::Sum => Some(0),
        ReduceOp::Prod => Some(1),
        ReduceOp::Max => Some(2),
        ReduceOp::Min => Some(3),
        ReduceOp::Avg => Some(4),
        ReduceOp::MulSum => None,
    }
}

/// `rank`'s `mulsum` scalar in `d`'s own encoding, as PreMulSum reads it (the same factor
/// busbw's engine multiplies by, so validation is the same).
pub fn premul_bytes(d: DataType, rank: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    with_dtype!(d, T => {
        let v = <T as Element>::from_f64(premul_scalar(rank));
        let n = std::mem::size_of::<T>();
        // SAFETY: `v` is a plain value of n ≤ 8 bytes, copied byte for byte.
        unsafe { std::ptr::copy_nonoverlapping((&v as *const T).cast::<u8>(), out.as_mut_ptr(), n) };
    });
    out
}

/// What a wait found: the stream's work done, or not yet.
pub type Wait<'f> = &'f mut dyn FnMut() -> Result<bool, String>;

/// One rank's NCCL communicator; destroyed when dropped, unless aborted.
pub struct Comm<'a> {
    nccl: &'a Nccl,
    raw: RawComm,
    rank: usize,
    size: usize,
}

// SAFETY: an NCCL communicator may be used from any one thread at a time, which `&mut self`
// on every call ensures.
unsafe impl Send for Comm<'_> {}

fn as_int(v: usize, what: &str) -> Result<c_int, NcclError> {
    c_int::try_from(v)
        .map_err(|_| NcclError::Unsupported(format!("{what} {v} is too large for NCCL")))
}

impl<'a> Comm<'a> {
    pub(crate) fn new(nccl: &'a Nccl, raw: RawComm, rank: usize, size: usize) -> Comm<'a> {
        Comm {
            nccl,
            raw,
            rank,
            size,
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn library(&self) -> &'a Nccl {
        self.nccl
    }

    fn live(&self, call: &'static str) -> Result<RawComm, NcclError> {
        if self.raw.is_null() {
            Err(NcclError::Call {
                call,
                code: 5,
                what: "the communicator was aborted".into(),
                last: String::new(),
            })
        } else {
            Ok(self.raw)
        }
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), NcclError> {
        self.nccl.check(call, code, self.raw)
    }

    /// `ncclCommSplit`: the ranks with the same `color` form a new communicator, numbered by
    /// `key`; `None` takes no part (NCCL_SPLIT_NOCOLOR) and gets `None`. Every rank of this
    /// communicator must call it.
    pub fn split(
        &self,
        color: Option<usize>,
        key: usize,
        size: usize,
    ) -> Result<Option<Comm<'a>>, NcclError> {
        let raw = self.live("ncclCommSplit")?;
        let c = match color {
            Some(c) => as_int(c, "split color")?,
            None => NO_COLOR,
        };
        let k = as_int(key, "split key")?;
        let mut out: RawComm = std::ptr::null_mut();
        // SAFETY: a live communicator, an out-pointer, and no config (the parent's).
        let r = unsafe { (self.nccl.comm_split)(raw, c, k, &mut out, std::ptr::null_mut()) };
        self.check("ncclCommSplit", r)?;
        Ok((!out.is_null()).then(|| Comm::new(self.nccl, out, key, size)))
    }

    /// Ends the communicator at once, abandoning operations in flight (a peer stopped
    /// answering): `ncclCommAbort`. Later calls fail saying it was aborted.
    pub fn abort(&mut self) -> Result<(), NcclError> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        self.nccl.abort_raw(raw)
    }

    /// Waits until `done` says the stream's work completed, polling NCCL's asynchronous
    /// error meanwhile; after `timeout` (or on an asynchronous error) the communicator is
    /// aborted and the error says what did not complete.
    pub fn wait(&mut self, what: &str, timeout: Duration, done: Wait<'_>) -> Result<(), NcclError> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            match done() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    return Err(NcclError::Async {
                        what: what.into(),
                        code: 1,
                        error: e,
                        last: self.nccl.last_error(self.raw),
                    })
                }
            }
            let raw = self.live("ncclCommGetAsyncError")?;
            let mut state: c_int = 0;
            // SAFETY: a live communicator and an out-pointer.
            let r = unsafe { (self.nccl.get_async_error)(raw, &mut state) };
            self.check("ncclCommGetAsyncError", r)?;
            if state != 0 && state != IN_PROGRESS {
                let e = NcclError::Async {
                    what: what.into(),
                    code: state,
                    error: self.nccl.error_string(state),
                    last: self.nccl.last_error(raw),
                };
                let _ = self.abort();
                return Err(e);
            }
            if start.elapsed() >= timeout {
                let _ = self.abort();
                return Err(NcclError::Timeout {
                    what: what.into(),
                    secs: timeout.as_secs_f64(),
                });
            }
            // Spin briefly (small operations finish in microseconds), then yield the core.
            spins += 1;
            if spins > 64 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Opens a group that the calls up to [`Comm::group_end`] join: `-m`'s aggregated
    /// operations, launched together as nccl-tests launches them.
    pub fn group_start(&mut self) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        let r = unsafe { (self.nccl.group_start)() };
        self.check("ncclGroupStart", r)
    }

    /// Launches the group [`Comm::group_start`] opened.
    pub fn group_end(&mut self) -> Result<(), NcclError> {
        // SAFETY: no arguments; the caller opened the group.
        let r = unsafe { (self.nccl.group_end)() };
        self.check("ncclGroupEnd", r)
    }

    /// `f` between `ncclGroupStart` and `ncclGroupEnd`: point-to-point calls of one
    /// collective, launched together.
    pub fn group(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), NcclError>,
    ) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        let r = unsafe { (self.nccl.group_start)() };
        self.check("ncclGroupStart", r)?;
        let inner = f(self);
        // SAFETY: no arguments; ends the group started above, whatever the calls returned.
        let r = unsafe { (self.nccl.group_end)() };
        inner?;
        self.check("ncclGroupEnd", r)
    }

    /// The reduction operator of `op` for a call in type `d`, and whether it must be
    /// destroyed after the call.
    fn op(&self, d: DataType, op: ReduceOp) -> Result<(c_int, bool), NcclError> {
        if let Some(o) = nccl_op(op) {
            return Ok((o, false));
        }
        let raw = self.live("ncclRedOpCreatePreMulSum")?;
        let mut scalar = premul_bytes(d, self.rank);
        let mut o: c_int = 0;
        // SAFETY: an out-pointer, the scalar in the call's type read before return
        // (host-immediate), and a live communicator.
        let r = unsafe {
            (self.nccl.premul_sum)(
                &mut o,
                scalar.as_mut_ptr().cast::<c_void>(),
                nccl_type(d),
                SCALAR_HOST_IMMEDIATE,
                raw,
            )
        };
        self.check("ncclRedOpCreatePreMulSum", r)?;
        Ok((o, true))
    }

    fn reducing(
        &mut self,
        d: DataType,
        op: ReduceOp,
        call: impl FnOnce(&Self, c_int) -> Result<(), NcclError>,
    ) -> Result<(), NcclError> {
        let (o, made) = self.op(d, op)?;
        let r = call(self, o);
        if made {
            // SAFETY: an operator made above on this communicator; the call has returned.
            unsafe { (self.nccl.red_op_destroy)(o, self.raw) };
        }
        r
    }

    /// `ncclAllReduce`.
    ///
    /// # Safety
    /// As the module says: device addresses of this communicator's device, valid for
    /// the counts until `stream` has run the call.
    pub unsafe fn all_reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<(), NcclError> {
        let f = self.nccl.all_reduce;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.element_wise("ncclAllReduce", f, [send, recv], count, d, op, stream) }
    }

    /// `ncclReduceScatter` (`count` is each rank's share).
    ///
    /// # Safety
    /// As [`Comm::all_reduce`], with the send buffer `size` shares long.
    pub unsafe fn reduce_scatter(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<(), NcclError> {
        let f = self.nccl.reduce_scatter;
        // SAFETY: the caller's promise, passed on.
        unsafe { self.element_wise("ncclReduceScatter", f, [send, recv], count, d, op, stream) }
    }

    /// The two reductions with one signature (AllReduce, ReduceScatter).
    ///
    /// # Safety
    /// As [`Comm::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn element_wise(
        &mut self,
        call: &'static str,
        f: super::AllReduce,
        [send, recv]: [u64; 2],
        count: usize,
        d: DataType,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<(), NcclError> {
        let raw = self.live(call)?;
        self.reducing(d, op, |c, o| {
            // SAFETY: device addresses the caller owns for the call's counts, on its stream.
            let r = unsafe {
                f(
                    ptr(send),
                    mut_ptr(recv),
                    count,
                    nccl_type(d),
                    o,
                    raw,
                    stream,
                )
            };
            c.check(call, r)
        })
    }

    /// `ncclReduce` to `root`.
    ///
    /// # Safety
    /// As the module says: device addresses of this communicator's device, valid for
    /// the counts until `stream` has run the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
        root: usize,
        stream: Stream,
    ) -> Result<(), NcclError> {
        let raw = self.live("ncclReduce")?;
        let root = as_int(root, "root")?;
        self.reducing(d, op, |c, o| {
            // SAFETY: as all_reduce.
            let r = unsafe {
                (c.nccl.reduce)(
                    ptr(send),
                    mut_ptr(recv),
                    count,
                    nccl_type(d),
                    o,
                    root,
                    raw,
                    stream,
                )
            };
            c.check("ncclReduce", r)
        })
    }

    /// `ncclBroadcast` from `root`.
    ///
    /// # Safety
    /// As the module says: device addresses of this communicator's device, valid for
    /// the counts until `stream` has run the call.
    pub unsafe fn broadcast(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        root: usize,
        stream: Stream,
    ) -> Result<(), NcclError> {
        let raw = self.live("ncclBroadcast")?;
        let root = as_int(root, "root")?;
        // SAFETY: device addresses the caller owns for `count` elements, on its stream.
        let r = unsafe {
            (self.nccl.broadcast)(
                ptr(send),
                mut_ptr(recv),
                count,
                nccl_type(d),
                root,
                raw,
                stream,
            )
        };
        self.check("ncclBroadcast", r)
    }

    /// `ncclAllGather` (`count` is each rank's share).
    ///
    /// # Safety
    /// As the module says: device addresses of this communicator's device, valid for
    /// the counts until `stream` has run the call.
    pub unsafe fn all_gather(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        stream: Stream,
    ) -> Result<(), NcclError> {
        let raw = self.live("ncclAllGather")?;
        // SAFETY: device addresses the caller owns (the receive buffer `size` shares long).
        let r = unsafe {
            (self.nccl.all_gather)(ptr(send), mut_ptr(recv), count, nccl_type(d), raw, stream)
        };
        self.check("ncclAllGather", r)
    }

    /// `ncclSend` to `peer` (inside [`Comm::group`] for anything but a lone send).
    ///
    /// # Safety
    /// As the module says: device addresses of this communicator's device, valid for
    /// the counts until `stream` has run the call.
    pub unsafe fn send(
        &mut self,
        buf: u64,
        count: usize,
        d: DataType,
        peer: usize,
        stream: Stream,
    ) -> Result<(), NcclError> {
        let raw = self.live("ncclSend")?;
        let p = as_int(peer, "peer")?;
        // SAFETY: a device address the caller owns for `count` elements.
        let r = unsafe { (self.nccl.send)(ptr(buf), count, nccl_type(d), p, raw, stream) };
        self.check("ncclSend", r)
    }

    /// `ncclRecv` from `peer`.
    ///
    /// # Safety
    /// As the module says: device addresses of this communicator's device, valid for
    /// the counts until `stream` has run the call.
    pub unsafe fn recv(
        &mut self,
        buf: u64,
        count: usize,
        d: DataType,
        peer: usize,
        stream: Stream,
    ) -> Result<(), NcclError> {
        let raw = self.live("ncclRecv")?;
        let p = as_int(peer, "peer")?;
        // SAFETY: a device address the caller owns for `count` elements.
        let r = unsafe { (self.nccl.recv)(mut_ptr(buf), count, nccl_type(d), p, raw, stream) };
        self.check("ncclRecv", r)
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            self.nccl
                .destroy(std::mem::replace(&mut self.raw, std::ptr::null_mut()));
        }
    }
}

fn ptr(a: u64) -> *const c_void {
    a as usize as *const c_void
}

fn mut_ptr(a: u64) -> *mut c_void {
    a as usize as *mut c_void
}

impl std::fmt::Debug for Comm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nccl::Comm(rank {} of {})", self.rank, self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_and_op_has_its_nccl_counterpart() {
        // nccl.h's numbering, in busbw's order of types.
        let codes: Vec<c_int> = DataType::ALL.iter().map(|&d| nccl_type(d)).collect();
        assert_eq!(codes, (0..12).collect::<Vec<_>>());
        assert_eq!(nccl_op(ReduceOp::Sum), Some(0));
        assert_eq!(nccl_op(ReduceOp::Avg), Some(4));
        assert_eq!(
            nccl_op(ReduceOp::MulSum),
            None,
            "a PreMulSum operator per call"
        );
    }

    #[test]
    fn premul_scalars_are_encoded_in_the_calls_type() {
        assert_eq!(
            premul_bytes(DataType::Float32, 1)[..4],
            2.0f32.to_le_bytes()
        );
        assert_eq!(
            premul_bytes(DataType::Float32, 2)[..4],
            1.0f32.to_le_bytes()
        );
        assert_eq!(premul_bytes(DataType::Int64, 3), 2i64.to_le_bytes());
        assert_eq!(
            premul_bytes(DataType::Float16, 1)[..2],
            half::f16::from_f32(2.0).to_le_bytes()
        );
        assert_eq!(
            premul_bytes(DataType::BFloat16, 0)[..2],
            half::bf16::from_f32(1.0).to_le_bytes()
        );
        assert_eq!(premul_bytes(DataType::Uint8, 5)[0], 2);
    }
}
