//! One descriptor per collective, as nccl-tests' `struct testColl`: how big its buffers are,
//! how to compute its bandwidths, how to make and check its data, and how to run it. The
//! harness is shared by all of them.

pub mod all_reduce;

use busbw_collectives::{CommError, Communicator, DataType, ReduceOp};

/// Buffer geometry for one row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// The `count` column: elements passed to the collective.
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
pub struct DataCtx {
    pub dtype: DataType,
    pub op: ReduceOp,
    pub seed: u64,
    pub rank: usize,
    pub nranks: usize,
    pub counts: Counts,
    pub in_place: bool,
}

/// Fills the inputs (in `send`, or in `recv` when in place) and the expected output.
pub type InitFn = fn(ctx: &DataCtx, send: &mut [u8], recv: &mut [u8], expected: Option<&mut [u8]>);

/// Runs the collective once; `send` is ignored in place.
pub type RunFn = fn(
    comm: &mut Communicator,
    send: &[u8],
    recv: &mut [u8],
    ctx: &DataCtx,
) -> Result<(), CommError>;

pub struct CollectiveSpec {
    /// Program name as nccl-tests names its binary (`all_reduce_perf`).
    pub program: &'static str,
    /// Whether `-o` applies (reductions); others print `none`.
    pub reduces: bool,
    pub counts: fn(bytes: u64, dtype: DataType, nranks: usize) -> Counts,
    /// Bytes that `algbw` is computed from.
    pub alg_bytes: fn(counts: &Counts, nranks: usize) -> f64,
    /// `busbw = algbw × factor`; see nccl-tests' PERFORMANCE.md for the reasoning.
    pub busbw_factor: fn(nranks: usize) -> f64,
    pub init: InitFn,
    pub run: RunFn,
}

/// Look a collective up by its program name (`all_reduce_perf`) or short name (`all_reduce`).
pub fn find(name: &str) -> Option<&'static CollectiveSpec> {
    let short = name.strip_suffix("_perf").unwrap_or(name);
    match short {
        "all_reduce" => Some(&all_reduce::SPEC),
        _ => None,
    }
}
