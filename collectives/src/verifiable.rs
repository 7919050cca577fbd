//! Verifiable data: inputs and expected outputs as pure functions of
//! `(seed, element index, rank, nranks, op, dtype)`.
//!
//! Validation compares raw bits, so every float input is built such that the reduction is
//! exact in any order, as nccl-tests' `verifiable` does: a ring, a tree and any future
//! algorithm must produce the very same bits. How:
//! - float `sum`/`avg`: all ranks share one exponent per element and contribute small signed
//!   integer mantissas whose total magnitude stays below 2^(p-1), so every partial sum is
//!   exact; `avg` then divides the exact sum once;
//! - float `prod`: one rank (chosen per element) contributes a full mantissa, the others
//!   signed powers of two, so every partial product is exact;
//! - `min`/`max` and all integer ops (wrapping) are exact by nature; integer `prod` inputs are
//!   odd so products never collapse to zero.
//!
//! The expected value is therefore the plain fold of every rank's input, which is what
//! [`fill_expected`] computes.

use crate::dtype::{DataType, ReduceOp};
use crate::element::{combine, Element};

/// splitmix64 finaliser: cheap, well mixed, and identical on every rank.
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[inline(always)]
fn hash(seed: u64, index: u64, salt: u64) -> u64 {
    mix(mix(seed ^ salt.wrapping_mul(0xa076_1d64_78bd_642f)) ^ index)
}

fn op_salt(op: ReduceOp) -> u64 {
    op as u64 + 1
}

/// Value generation per element type.
pub trait Verifiable: Element {
    /// Input of `rank` at global element `index`.
    fn input(op: ReduceOp, seed: u64, index: u64, rank: usize, nranks: usize) -> Self;
}

macro_rules! int_verifiable {
    ($t:ty) => {
        impl Verifiable for $t {
            #[inline]
            fn input(op: ReduceOp, seed: u64, index: u64, rank: usize, _n: usize) -> Self {
                let h = hash(seed, index, (rank as u64) << 8 | op_salt(op));
                let v = h as $t;
                if op == ReduceOp::Prod {
                    v | 1
                } else {
                    v
                }
            }
        }
    };
}

int_verifiable!(i8);
int_verifiable!(u8);
int_verifiable!(i32);
int_verifiable!(u32);
int_verifiable!(i64);
int_verifiable!(u64);

/// Bits of `ceil(log2(n))`, at least 1.
fn log2_ceil(n: usize) -> u32 {
    (usize::BITS - n.saturating_sub(1).leading_zeros()).max(1)
}

macro_rules! float_verifiable {
    ($t:ty, $bits:ty, $mant:expr, $ebits:expr) => {
        impl Verifiable for $t {
            #[inline]
            fn input(op: ReduceOp, seed: u64, index: u64, rank: usize, n: usize) -> Self {
                // Per-element values shared by all ranks (no rank in the salt).
                let shared = hash(seed, index, 0xff00 | op_salt(op));
                let own = hash(seed, index, (rank as u64 + 1) << 8 | op_salt(op));
                const P: u32 = $mant + 1; // precision incl. the implicit bit
                const BIAS: i32 = (1 << ($ebits - 1)) - 1;
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        // |sum of any subset| <= n * (2^b - 1) < 2^(P-1): exact.
                        let b = (P - 1).saturating_sub(log2_ceil(n)).min(20);
                        if b == 0 {
                            return 0.0;
                        }
                        let span = (1u64 << (b + 1)) - 1;
                        let m = (own % span) as i64 - ((1i64 << b) - 1);
                        let e = (shared % 17) as i32 - 8 - b as i32;
                        (m as $t) * (2.0 as $t).powi(e)
                    }
                    ReduceOp::Prod => {
                        let special = (shared % n as u64) as usize;
                        let sign: $t = if own & 1 == 1 { -1.0 } else { 1.0 };
                        if rank == special {
                            // A value in [1, 2) with random mantissa bits.
                            let mant = (own >> 1) & ((1u64 << $mant) - 1);
                            let bits = ((BIAS as u64) << $mant) | mant;
                            sign * <$t>::from_bits(bits as $bits)
                        } else if rank < 60 {
                            // Exponents in {-1, 0, 1}: the product of at most 60 stays far
                            // from overflow and underflow.
                            let k = ((own >> 1) % 3) as i32 - 1;
                            sign * (2.0 as $t).powi(k)
                        } else {
                            sign
                        }
                    }
                    ReduceOp::Min | ReduceOp::Max => {
                        // Random sign and mantissa, exponent from the middle half of the
                        // range: no NaN, infinity, zero or subnormal to blur the comparison.
                        let emax = (1u64 << $ebits) - 1;
                        let e = emax / 4 + (own >> 2) % (emax / 2);
                        let mant = (own >> 16) & ((1u64 << $mant) - 1);
                        let bits = ((own & 1) << ($mant + $ebits)) | (e << $mant) | mant;
                        <$t>::from_bits(bits as $bits)
                    }
                }
            }
        }
    };
}

float_verifiable!(f32, u32, 23u32, 8u32);
float_verifiable!(f64, u64, 52u32, 11u32);

/// Fill `out` with `rank`'s input for elements `first_index ..`.
pub fn fill_input_typed<T: Verifiable>(
    out: &mut [T],
    op: ReduceOp,
    seed: u64,
    first_index: u64,
    rank: usize,
    nranks: usize,
) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = T::input(op, seed, first_index + i as u64, rank, nranks);
    }
}

/// Fill `out` with the reduction over all ranks (the AllReduce result).
pub fn fill_expected_typed<T: Verifiable>(
    out: &mut [T],
    op: ReduceOp,
    seed: u64,
    first_index: u64,
    nranks: usize,
) {
    for (i, o) in out.iter_mut().enumerate() {
        let idx = first_index + i as u64;
        let mut acc = T::input(op, seed, idx, 0, nranks);
        for r in 1..nranks {
            acc = combine(op, acc, T::input(op, seed, idx, r, nranks));
        }
        if op == ReduceOp::Avg {
            acc = acc.div_n(nranks);
        }
        *o = acc;
    }
}

/// Count elements whose bits differ by more than the tolerance: 0, except float `avg`, which
/// allows 2 units in the last place (as nccl-tests does) so that an implementation that
/// premultiplies by 1/n instead of dividing the sum still validates.
pub fn count_wrong_typed<T: Element>(got: &[T], expected: &[T], op: ReduceOp) -> u64 {
    let tol = if op == ReduceOp::Avg && T::DTYPE.is_float() {
        2
    } else {
        0
    };
    got.iter()
        .zip(expected)
        .filter(|(g, e)| g.to_bits_u64().abs_diff(e.to_bits_u64()) > tol)
        .count() as u64
}

/// Dispatch helper: runs `$body` with `$T` bound to the Rust type of `$dtype`.
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DataType::Int8 => {
                type $T = i8;
                $body
            }
            $crate::DataType::Uint8 => {
                type $T = u8;
                $body
            }
            $crate::DataType::Int32 => {
                type $T = i32;
                $body
            }
            $crate::DataType::Uint32 => {
                type $T = u32;
                $body
            }
            $crate::DataType::Int64 => {
                type $T = i64;
                $body
            }
            $crate::DataType::Uint64 => {
                type $T = u64;
                $body
            }
            $crate::DataType::Float32 => {
                type $T = f32;
                $body
            }
            $crate::DataType::Float64 => {
                type $T = f64;
                $body
            }
        }
    };
}

/// View raw bytes as elements. Panics only on a programming error (misaligned or ragged
/// buffer), never on user input: callers size and align buffers by element.
pub fn as_typed<T: Element>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(
        bytes.as_ptr() as usize % std::mem::align_of::<T>() == 0 && bytes.len() % size == 0,
        "buffer not aligned/sized for {}",
        T::DTYPE
    );
    // SAFETY: alignment and length checked above; every bit pattern is a valid T for the
    // integer and float types that implement Element.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) }
}

/// Mutable counterpart of [`as_typed`].
pub fn as_typed_mut<T: Element>(bytes: &mut [u8]) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(
        bytes.as_ptr() as usize % std::mem::align_of::<T>() == 0 && bytes.len() % size == 0,
        "buffer not aligned/sized for {}",
        T::DTYPE
    );
    // SAFETY: as in as_typed; the exclusive borrow carries over.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, bytes.len() / size) }
}

/// Byte-level [`fill_input_typed`]; `out.len()` must be a multiple of the element size.
pub fn fill_input(
    dtype: DataType,
    op: ReduceOp,
    out: &mut [u8],
    seed: u64,
    first_index: u64,
    rank: usize,
    nranks: usize,
) {
    with_dtype!(dtype, T => fill_input_typed::<T>(as_typed_mut(out), op, seed, first_index, rank, nranks))
}

/// Byte-level [`fill_expected_typed`].
pub fn fill_expected(
    dtype: DataType,
    op: ReduceOp,
    out: &mut [u8],
    seed: u64,
    first_index: u64,
    nranks: usize,
) {
    with_dtype!(dtype, T => fill_expected_typed::<T>(as_typed_mut(out), op, seed, first_index, nranks))
}

/// Byte-level [`count_wrong_typed`].
pub fn count_wrong(dtype: DataType, op: ReduceOp, got: &[u8], expected: &[u8]) -> u64 {
    with_dtype!(dtype, T => count_wrong_typed::<T>(as_typed(got), as_typed(expected), op))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The property the whole scheme rests on: any reduction order gives the same bits.
    #[test]
    fn float_reductions_are_order_independent() {
        for n in [1usize, 2, 3, 7, 8, 64, 1000] {
            for op in ReduceOp::ALL {
                for idx in 0..200u64 {
                    let vals: Vec<f32> = (0..n).map(|r| f32::input(op, 5, idx, r, n)).collect();
                    let fwd = vals
                        .iter()
                        .copied()
                        .reduce(|a, b| combine(op, a, b))
                        .unwrap();
                    let rev = vals
                        .iter()
                        .rev()
                        .copied()
                        .reduce(|a, b| combine(op, a, b))
                        .unwrap();
                    // Pairwise (tree-like) order.
                    let mut layer = vals.clone();
                    while layer.len() > 1 {
                        layer = layer
                            .chunks(2)
                            .map(|c| {
                                if c.len() == 2 {
                                    combine(op, c[0], c[1])
                                } else {
                                    c[0]
                                }
                            })
                            .collect();
                    }
                    assert_eq!(fwd.to_bits(), rev.to_bits(), "n={n} op={op} idx={idx}");
                    assert_eq!(fwd.to_bits(), layer[0].to_bits(), "n={n} op={op} idx={idx}");
                    assert!(fwd.is_finite(), "n={n} op={op} idx={idx}: {fwd}");
                    let vals: Vec<f64> = (0..n).map(|r| f64::input(op, 5, idx, r, n)).collect();
                    let fwd = vals
                        .iter()
                        .copied()
                        .reduce(|a, b| combine(op, a, b))
                        .unwrap();
                    let rev = vals
                        .iter()
                        .rev()
                        .copied()
                        .reduce(|a, b| combine(op, a, b))
                        .unwrap();
                    assert_eq!(fwd.to_bits(), rev.to_bits(), "f64 n={n} op={op} idx={idx}");
                }
            }
        }
    }

    #[test]
    fn inputs_differ_by_rank_and_are_not_trivial() {
        let a: Vec<f32> = (0..64)
            .map(|i| f32::input(ReduceOp::Sum, 1, i, 0, 4))
            .collect();
        let b: Vec<f32> = (0..64)
            .map(|i| f32::input(ReduceOp::Sum, 1, i, 1, 4))
            .collect();
        assert_ne!(a, b);
        assert!(a.iter().filter(|v| **v != 0.0).count() > 50);
        let p: Vec<i8> = (0..64)
            .map(|i| i8::input(ReduceOp::Prod, 1, i, 0, 4))
            .collect();
        assert!(p.iter().all(|v| v & 1 == 1));
    }

    #[test]
    fn count_wrong_is_bitwise_with_avg_tolerance() {
        let e = [1.0f32, 2.0, 3.0];
        let mut g = e;
        assert_eq!(count_wrong_typed(&g, &e, ReduceOp::Sum), 0);
        g[1] = f32::from_bits(2.0f32.to_bits() + 1);
        assert_eq!(count_wrong_typed(&g, &e, ReduceOp::Sum), 1);
        assert_eq!(count_wrong_typed(&g, &e, ReduceOp::Avg), 0);
        g[2] = -3.0;
        assert_eq!(count_wrong_typed(&g, &e, ReduceOp::Avg), 1);
        assert_eq!(count_wrong_typed(&[0.0f32], &[-0.0f32], ReduceOp::Max), 1);
    }
}
