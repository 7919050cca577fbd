//! Verifiable data for the non-reduction collectives: nccl-tests' "Nil" generator, values that
//! depend only on (seed, element index), so a block's content says where it came from.

use super::{Buf, Fill, Gen};
use busbw_collectives::{DataType, ReduceOp};

/// `to[off..off + len]` gets elements `first ..` of the sequence named `seed`.
pub fn nil(f: &mut dyn Fill, to: Buf, off: usize, len: usize, seed: u64, first: usize) {
    let g = Gen {
        op: ReduceOp::Sum,
        seed,
        first: first as u64,
        rank: 0,
        nranks: 1,
    };
    f.input(to, off, len, g);
}

/// Per-rank seed of the gathering collectives (nccl-tests: `33 × rep + rank`).
pub fn rank_seed(seed: u64, rank: usize) -> u64 {
    seed.wrapping_mul(33).wrapping_add(rank as u64)
}

/// Elements per rank for the collectives that divide the size by the rank count: the
/// quotient rounded down to a multiple of 16 bytes, as nccl-tests does.
pub fn per_rank(bytes: u64, dtype: DataType, n: usize) -> usize {
    let ts = dtype.size();
    let align = (16 / ts).max(1);
    let count = bytes as usize / ts;
    (count / n.max(1)) / align * align
}
