//! The reference: what each collective is asked to do in a [`Case`], each rank's input and
//! what its buffers must hold afterwards, computed without the engine.

use busbw_collectives::verifiable::{count_wrong, fill_expected, fill_input};
use busbw_collectives::{
    all_gather, all_reduce, alltoall, broadcast, doubling_all_reduce, gather, hypercube, reduce,
    reduce_scatter, scatter, sendrecv, tree_all_reduce, CommError, Communicator, Data, DataType,
    ReduceOp,
};

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    Alltoall,
    Scatter,
    Gather,
    SendRecv,
    HyperCube,
    /// The AllReduce algorithms (their own files test them on host memory; here on a device).
    AllReduce,
    TreeAllReduce,
    DoublingAllReduce,
}

pub(crate) const KINDS: [Kind; 9] = [
    Kind::AllGather,
    Kind::ReduceScatter,
    Kind::Broadcast,
    Kind::Reduce,
    Kind::Alltoall,
    Kind::Scatter,
    Kind::Gather,
    Kind::SendRecv,
    Kind::HyperCube,
];

/// Every kind, for the device tests: the AllReduce algorithms too.
pub(crate) fn device_kinds() -> Vec<Kind> {
    let all_reduce = [
        Kind::AllReduce,
        Kind::TreeAllReduce,
        Kind::DoublingAllReduce,
    ];
    KINDS.iter().copied().chain(all_reduce).collect()
}

impl Kind {
    /// Whether the algorithm drives the device itself (reductions on the device, copies per
    /// segment) rather than being staged around.
    pub(crate) fn drives_device(self) -> bool {
        matches!(
            self,
            Kind::AllGather
                | Kind::ReduceScatter
                | Kind::Broadcast
                | Kind::Reduce
                | Kind::AllReduce
                | Kind::TreeAllReduce
        )
    }
    /// The ops a case of this kind runs: every op for reductions, `sum` (unused) for the rest.
    pub(crate) fn ops(self) -> &'static [ReduceOp] {
        if self.reduces() {
            &ReduceOp::ALL
        } else {
            &[ReduceOp::Sum]
        }
    }
    pub(crate) fn reduces(self) -> bool {
        matches!(
            self,
            Kind::ReduceScatter
                | Kind::Reduce
                | Kind::AllReduce
                | Kind::TreeAllReduce
                | Kind::DoublingAllReduce
        )
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Case {
    pub(crate) kind: Kind,
    pub(crate) n: usize,
    pub(crate) count: usize,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    pub(crate) in_place: bool,
    pub(crate) root: usize,
}

/// (input elements, output elements, in-place input offset, in-place output offset), in
/// elements, for rank `r`.
pub(crate) fn layout(c: &Case, r: usize) -> (usize, usize, usize, usize) {
    let (n, k) = (c.n, c.count);
    match c.kind {
        Kind::AllGather | Kind::HyperCube => (k, n * k, r * k, 0),
        Kind::Gather => (k, n * k, r * k, 0),
        Kind::ReduceScatter | Kind::Scatter => (n * k, k, 0, r * k),
        Kind::Alltoall => (n * k, n * k, 0, 0),
        Kind::Broadcast | Kind::Reduce | Kind::SendRecv => (k, k, 0, 0),
        Kind::AllReduce | Kind::TreeAllReduce | Kind::DoublingAllReduce => (k, k, 0, 0),
    }
}

/// Bytes with 8-byte alignment, so any element type can be viewed in them.
#[derive(Clone)]
pub(crate) struct Bytes(Vec<u64>, usize);

impl Bytes {
    pub(crate) fn zeroed(len: usize) -> Self {
        Bytes(vec![0u64; len.div_ceil(8)], len)
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: u64 storage viewed as its first `self.1` bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.1) }
    }
}

impl std::ops::DerefMut for Bytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, self.1) }
    }
}

pub(crate) fn input_of(c: &Case, r: usize) -> Bytes {
    let (inp, ..) = layout(c, r);
    let mut v = Bytes::zeroed(inp * c.dtype.size());
    match c.kind {
        k if k.reduces() => fill_input(c.dtype, c.op, &mut v, 42, 0, r, c.n),
        // Data movement: any bits will do, as long as every rank's differ.
        _ => fill_input(c.dtype, ReduceOp::Sum, &mut v, 1000 + r as u64, 0, 0, 1),
    }
    v
}

/// What rank `r`'s output buffer (in place: the whole buffer) must hold afterwards.
pub(crate) fn expected_of(c: &Case, r: usize, inputs: &[Bytes]) -> Bytes {
    let ts = c.dtype.size();
    let kb = c.count * ts;
    let (inp, out, in_off, out_off) = layout(c, r);
    // Start from what the buffer held before: zeros, plus our input when in place.
    let len = if c.in_place { inp.max(out) } else { out } * ts;
    let mut e = Bytes::zeroed(len);
    if c.in_place {
        e[in_off * ts..in_off * ts + inp * ts].copy_from_slice(&inputs[r]);
    }
    let o = if c.in_place { out_off * ts } else { 0 };
    match c.kind {
        Kind::AllGather | Kind::HyperCube => {
            for (j, x) in inputs.iter().enumerate() {
                e[j * kb..(j + 1) * kb].copy_from_slice(x);
            }
        }
        Kind::Gather if r == c.root => {
            for (j, x) in inputs.iter().enumerate() {
                e[j * kb..(j + 1) * kb].copy_from_slice(x);
            }
        }
        Kind::Gather => {}
        Kind::ReduceScatter => {
            fill_expected(
                c.dtype,
                c.op,
                &mut e[o..o + kb],
                42,
                (r * c.count) as u64,
                c.n,
            );
        }
        Kind::Reduce if r == c.root => fill_expected(c.dtype, c.op, &mut e[..kb], 42, 0, c.n),
        Kind::Reduce => {}
        Kind::Broadcast => e[..kb].copy_from_slice(&inputs[c.root]),
        Kind::Scatter => e[o..o + kb].copy_from_slice(&inputs[c.root][r * kb..(r + 1) * kb]),
        Kind::Alltoall => {
            for (j, x) in inputs.iter().enumerate() {
                e[j * kb..(j + 1) * kb].copy_from_slice(&x[r * kb..(r + 1) * kb]);
            }
        }
        Kind::SendRecv => e[..kb].copy_from_slice(&inputs[(r + c.n - 1) % c.n]),
        Kind::AllReduce | Kind::TreeAllReduce | Kind::DoublingAllReduce => {
            fill_expected(c.dtype, c.op, &mut e[..kb], 42, 0, c.n)
        }
    }
    e
}

pub(crate) fn call(comm: &mut Communicator, c: &Case, d: Data<'_>) -> Result<(), CommError> {
    match c.kind {
        Kind::AllGather => all_gather(comm, d, c.count, c.dtype),
        Kind::ReduceScatter => reduce_scatter(comm, d, c.count, c.dtype, c.op),
        Kind::Broadcast => broadcast(comm, d, c.count, c.dtype, c.root),
        Kind::Reduce => reduce(comm, d, c.count, c.dtype, c.op, c.root),
        Kind::Alltoall => alltoall(comm, d, c.count, c.dtype),
        Kind::Scatter => scatter(comm, d, c.count, c.dtype, c.root),
        Kind::Gather => gather(comm, d, c.count, c.dtype, c.root),
        Kind::SendRecv => sendrecv(comm, d, c.count, c.dtype),
        Kind::HyperCube => hypercube(comm, d, c.count, c.dtype),
        Kind::AllReduce => all_reduce(comm, d, c.count, c.dtype, c.op),
        Kind::TreeAllReduce => tree_all_reduce(comm, d, c.count, c.dtype, c.op),
        Kind::DoublingAllReduce => doubling_all_reduce(comm, d, c.count, c.dtype, c.op),
    }
}

/// Validation must notice a misplaced block, or the tests of the other modules prove nothing.
#[test]
fn reference_detects_a_wrong_block() {
    let c = Case {
        kind: Kind::AllGather,
        n: 3,
        count: 10,
        dtype: DataType::Int32,
        op: ReduceOp::Sum,
        in_place: false,
        root: 0,
    };
    let inputs: Vec<Bytes> = (0..3).map(|r| input_of(&c, r)).collect();
    let e = expected_of(&c, 0, &inputs);
    let mut swapped = e.clone();
    swapped[..40].copy_from_slice(&e[40..80]);
    assert_eq!(count_wrong(c.dtype, c.op, &swapped, &e), 10);
}
