//! One descriptor per collective, as nccl-tests' `struct testColl`: how big its buffers are,
//! how to compute its bandwidths, how to make and check its data, and how to run it. The
//! harness is shared by all of them.

pub mod alltoallv;
mod data;
mod descriptors;
pub mod nccl;

use busbw_collectives::select::{Algo, CostModel};
use busbw_collectives::verifiable::{fill_expected, fill_input};
use busbw_collectives::{CommError, Communicator, Data, DataType, MemorySpace, ReduceOp};
use std::ops::Range;

pub use descriptors::ALL;

/// Buffer geometry for one row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// The `count` column: elements passed to the collective (per rank or per peer for the
    /// collectives that divide by the rank count).
    pub count: usize,
    pub send_bytes: usize,
    pub recv_bytes: usize,
}

impl Counts {
    /// The `size` column: the larger of the two buffers actually used.
    pub fn size(&self) -> usize {
        self.send_bytes.max(self.recv_bytes)
    }
}

/// Everything that generates or checks one placement's data.
#[derive(Clone, Copy)]
pub struct DataCtx {
    pub dtype: DataType,
    pub op: ReduceOp,
    pub seed: u64,
    pub rank: usize,
    pub nranks: usize,
    pub root: usize,
    pub counts: Counts,
    pub in_place: bool,
    /// Algorithm for collectives that have a choice, and the model `Auto` chooses with.
    pub algo: Algo,
    pub model: Option<CostModel>,
}

/// Fills the inputs (in `send`, or in `recv` when in place) and the expected content of the
/// checked range of `recv`, through `f`: host memory, or a device's (kernels on the device,
/// so validation data never crosses PCIe).
pub type InitFn = fn(ctx: &DataCtx, f: &mut dyn Fill);

/// One of a placement's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    Send,
    Recv,
    /// The expected content of the checked range (validation runs only).
    Expected,
}

/// What a generator makes: `rank`'s input (of `nranks`) for `op` and `seed`, from global
/// element `first` on (see `verifiable`); the expected output ignores `rank`.
#[derive(Clone, Copy, Debug)]
pub struct Gen {
    pub op: ReduceOp,
    pub seed: u64,
    pub first: u64,
    pub rank: usize,
    pub nranks: usize,
}

impl Gen {
    /// This rank's data of `ctx` from element `first`.
    pub fn of(ctx: &DataCtx, first: u64) -> Gen {
        Gen {
            op: ctx.op,
            seed: ctx.seed,
            first,
            rank: ctx.rank,
            nranks: ctx.nranks,
        }
    }
}

/// Where a descriptor's data goes; offsets and lengths in bytes. Fills of
/// [`Buf::Expected`] do nothing where there is no expected buffer.
pub trait Fill {
    /// `g`'s input.
    fn input(&mut self, to: Buf, off: usize, len: usize, g: Gen);
    /// The reduction of every rank's input, into the expected buffer.
    fn expected(&mut self, off: usize, len: usize, g: Gen);
    fn zero(&mut self, to: Buf, off: usize, len: usize);
    /// Whether there is an expected buffer.
    fn has_expected(&self) -> bool;
}

/// [`Fill`] into host memory.
pub struct HostFill<'a> {
    pub dtype: DataType,
    pub send: &'a mut [u8],
    pub recv: &'a mut [u8],
    pub expected: Option<&'a mut [u8]>,
}

impl HostFill<'_> {
    fn buf(&mut self, to: Buf, off: usize, len: usize) -> Option<&mut [u8]> {
        let b = match to {
            Buf::Send => &mut *self.send,
            Buf::Recv => &mut *self.recv,
            Buf::Expected => self.expected.as_deref_mut()?,
        };
        Some(&mut b[off..off + len])
    }
}

impl Fill for HostFill<'_> {
    fn input(&mut self, to: Buf, off: usize, len: usize, g: Gen) {
        let d = self.dtype;
        if let Some(b) = self.buf(to, off, len) {
            fill_input(d, g.op, b, g.seed, g.first, g.rank, g.nranks);
        }
    }
    fn expected(&mut self, off: usize, len: usize, g: Gen) {
        let d = self.dtype;
        if let Some(b) = self.buf(Buf::Expected, off, len) {
            fill_expected(d, g.op, b, g.seed, g.first, g.nranks);
        }
    }
    fn zero(&mut self, to: Buf, off: usize, len: usize) {
        if let Some(b) = self.buf(to, off, len) {
            b.fill(0);
        }
    }
    fn has_expected(&self) -> bool {
        self.expected.is_some()
    }
}

/// Runs the collective once on `send` and `recv` in `space` (see [`data`]); `send` is
/// ignored in place.
pub type RunFn = for<'a> fn(
    comm: &mut Communicator,
    send: &'a [u8],
    recv: &'a mut [u8],
    space: MemorySpace<'a>,
    ctx: &DataCtx,
) -> Result<(), CommError>;

/// A placement's buffers for its collective, in `space`: the receive buffer alone in place
/// (`send` is ignored), else both, each cut to the sizes the row uses.
pub fn data<'a>(
    ctx: &DataCtx,
    send: &'a [u8],
    recv: &'a mut [u8],
    space: MemorySpace<'a>,
) -> Data<'a> {
    let c = ctx.counts;
    let d = if ctx.in_place {
        Data::in_place(&mut recv[..c.size()])
    } else {
        Data::out_of_place(&send[..c.send_bytes], &mut recv[..c.recv_bytes])
    };
    d.on(space)
}

/// What the `redop` column shows and whether `-o` is looped over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redop {
    /// A reduction: loop over `-o`, print the op.
    Reduces,
    /// Not a reduction, but nccl-tests loops over `-o` and prints it anyway (sendrecv).
    Prints,
    /// Print this fixed label (`none`, or empty for hypercube); `-o` is ignored.
    Fixed(&'static str),
}

pub struct CollectiveSpec {
    /// Program name as nccl-tests names its binary (`all_reduce_perf`).
    pub program: &'static str,
    pub redop: Redop,
    /// Whether `-r` applies (broadcast, reduce, scatter, gather).
    pub rooted: bool,
    /// Whether `--algo` applies (AllReduce: ring or double binary tree).
    pub algos: bool,
    pub counts: fn(bytes: u64, dtype: DataType, nranks: usize) -> Counts,
    /// Bytes that `algbw` is computed from.
    pub alg_bytes: fn(counts: &Counts, nranks: usize) -> f64,
    /// `busbw = algbw × factor`; see nccl-tests' PERFORMANCE.md for the reasoning.
    pub busbw_factor: fn(nranks: usize) -> f64,
    pub init: InitFn,
    /// The bytes of the receive buffer that validation compares.
    pub checked: fn(ctx: &DataCtx) -> Range<usize>,
    /// Whether in-place results are validated (nccl-tests does not for alltoall).
    pub checks_in_place: bool,
    pub run: RunFn,
    /// The same collective on NCCL's calls (`--engine nccl`).
    pub nccl: nccl::NcclFn,
    /// A reason to skip the whole test at this rank count (hypercube needs a power of two).
    pub skip: fn(nranks: usize) -> Option<String>,
    /// Lines printed before a row, from a placement's context and its time in seconds
    /// (alltoallv's per-rank summary).
    pub comments: fn(ctx: &DataCtx, secs: f64) -> Vec<String>,
    /// Reads the collective's own settings from the environment before any rank starts
    /// (alltoallv's pattern or traffic matrix), so that a bad one is a usage error there;
    /// `one_size` when the sweep has a single size. Returns notes to print once.
    pub prepare: fn(one_size: bool) -> Result<Vec<String>, String>,
    /// A usage error for a communicator of `nranks` (a traffic matrix smaller than the job),
    /// which each rank judges for its own group before the sweep.
    pub ranks_ok: fn(nranks: usize) -> Result<(), String>,
}

/// For collectives with no settings of their own.
pub fn no_settings(_one_size: bool) -> Result<Vec<String>, String> {
    Ok(Vec::new())
}

/// For collectives that run on any number of ranks.
pub fn any_ranks(_nranks: usize) -> Result<(), String> {
    Ok(())
}

/// For collectives that print nothing but their rows.
pub fn no_comments(_ctx: &DataCtx, _secs: f64) -> Vec<String> {
    Vec::new()
}

impl std::fmt::Debug for CollectiveSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.program)
    }
}

/// Look a collective up by its program name (`all_reduce_perf`) or short name (`all_reduce`).
pub fn find(name: &str) -> Option<&'static CollectiveSpec> {
    let short = name.strip_suffix("_perf").unwrap_or(name);
    ALL.iter()
        .copied()
        .find(|s| s.program.strip_suffix("_perf") == Some(short))
}
