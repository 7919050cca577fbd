//! Verifiable data: inputs and expected outputs as pure functions of
//! `(seed, element index, rank, nranks, op, dtype)`.
//!
//! Validation compares raw bits, so every float input is built such that the reduction is
//! exact in any order, as nccl-tests' `verifiable` does: a ring, a tree and any future
//! algorithm must produce the very same bits. How, for a type of precision `p` (mantissa bits
//! including the implicit one):
//! - float `sum`/`avg`/`mulsum`: per element only `k = min(n, 2^(p-3))` ranks (a window of
//!   consecutive ranks at a per-element offset, so every rank contributes somewhere) give
//!   nonzero values, each a signed integer below `2^b` times a power of two `2^E` shared by
//!   the element, with `b = p - 1 - ceil(log2 k)` (one bit less for `mulsum`, whose odd ranks
//!   double their input). Every subset sum is then an integer below `2^(p-1)` times `2^E`:
//!   exact. `E` keeps every value and partial sum normal and finite, which for the fp8 types
//!   leaves only a dozen or two exponents. The others give `+0.0`, never `-0.0`, so no
//!   order can produce a negative zero. `avg` divides the exact sum once;
//! - float `prod`: one rank per element gives a full mantissa, up to a budget of the next
//!   ranks give `±2^-1`, `±2^0` or `±2^1`, the rest `±1`; the budget and the full-mantissa
//!   value's exponent keep every partial product normal and finite;
//! - `min`/`max` and all integer ops (wrapping) are exact by nature; float `min`/`max` inputs
//!   avoid zero, subnormals, infinities and NaN so the comparisons are unambiguous; integer
//!   `prod` inputs are odd so products never collapse to zero.
//!
//! The expected value is therefore the plain fold of every rank's (premultiplied, for
//! `mulsum`) input, which is what [`fill_expected`] computes.

use crate::dtype::{DataType, ReduceOp};
use crate::element::{bf16, combine, f16, premul, Element, F8E4M3, F8E5M2};

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

/// Per-element randomness shared by all ranks (the top bit keeps it apart from every rank's
/// own salt).
#[inline(always)]
fn shared_hash(op: ReduceOp, seed: u64, index: u64) -> u64 {
    hash(seed, index, 1 << 63 | op_salt(op))
}

/// Per-element randomness of one rank.
#[inline(always)]
fn own_hash(op: ReduceOp, seed: u64, index: u64, rank: usize) -> u64 {
    hash(seed, index, (rank as u64 + 1) << 8 | op_salt(op))
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
                let v = own_hash(op, seed, index, rank) as $t;
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

/// `ceil(log2(n))`; 0 for n <= 1.
fn log2_ceil(n: u64) -> u32 {
    u64::BITS - n.saturating_sub(1).leading_zeros()
}

/// `2^e` for `e` in f64's normal range, built from bits so it is exact by construction.
fn pow2(e: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&e));
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// A uniformly chosen integer of `[lo, hi]` (`lo <= hi`).
fn pick(h: u64, lo: i32, hi: i32) -> i32 {
    lo + (h % (hi - lo + 1) as u64) as i32
}

/// `[lo, hi]` narrowed to `[wlo, whi]` where they overlap; otherwise the type's own range
/// wins (or its top, if even that is empty), since exactness matters more than looks.
fn clamp_range(lo: i32, hi: i32, wlo: i32, whi: i32) -> (i32, i32) {
    let (a, b) = (lo.max(wlo), hi.min(whi));
    if a <= b {
        (a, b)
    } else if lo <= hi {
        (lo, hi)
    } else {
        (hi, hi)
    }
}

/// What the float generators need to know about a type to build exactly representable
/// values and to keep them inside the normal, finite range.
trait FloatLayout: Element {
    /// Stored mantissa bits (precision minus the implicit bit).
    const MANT: u32;
    const EXP_BITS: u32;
    /// Exponent of the smallest normal value.
    const EMIN: i32;
    /// Largest `e` with `2^e` finite: every magnitude below `2^EMAX` is finite.
    const EMAX: i32;
    fn from_raw(bits: u64) -> Self;
    /// Exact; lets the tests compare against exact arithmetic.
    #[cfg(test)]
    fn to_f64(self) -> f64;
}

macro_rules! float_layout {
    ($t:ty, $mant:expr, $ebits:expr, $emin:expr, $emax:expr, $from:expr, $to:expr) => {
        impl FloatLayout for $t {
            const MANT: u32 = $mant;
            const EXP_BITS: u32 = $ebits;
            const EMIN: i32 = $emin;
            const EMAX: i32 = $emax;
            #[inline(always)]
            fn from_raw(bits: u64) -> Self {
                $from(bits)
            }
            #[cfg(test)]
            fn to_f64(self) -> f64 {
                $to(self)
            }
        }
    };
}

float_layout!(
    f16,
    10,
    5,
    -14,
    15,
    |b| f16::from_bits(b as u16),
    |x: f16| x.to_f64()
);
float_layout!(
    f32,
    23,
    8,
    -126,
    127,
    |b| f32::from_bits(b as u32),
    |x: f32| x as f64
);
float_layout!(f64, 52, 11, -1022, 1023, f64::from_bits, |x: f64| x);
float_layout!(
    bf16,
    7,
    8,
    -126,
    127,
    |b| bf16::from_bits(b as u16),
    |x: bf16| x.to_f64()
);
// E4M3 tops out at 448 = 1.75 * 2^8: 2^8 is finite, 2^9 is not.
float_layout!(
    F8E4M3,
    3,
    4,
    -6,
    8,
    |b| F8E4M3(b as u8),
    |x: F8E4M3| x.to_f32() as f64
);
float_layout!(
    F8E5M2,
    2,
    5,
    -14,
    15,
    |b| F8E5M2(b as u8),
    |x: F8E5M2| x.to_f32() as f64
);

/// Magnitudes are kept within `2^±WINDOW` where the type's range allows it: any exponent
/// would validate, but values near 1 are easier to read when a mismatch is debugged.
const WINDOW: i32 = 16;

#[inline]
fn float_input<T: FloatLayout>(op: ReduceOp, seed: u64, index: u64, rank: usize, n: usize) -> T {
    let shared = shared_hash(op, seed, index);
    let own = own_hash(op, seed, index, rank);
    let n = n.max(1) as u64;
    let rank = rank as u64;
    let p = T::MANT + 1;
    let sign = if own & 1 == 1 { -1.0 } else { 1.0 };
    match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => {
            let k = n.min(1 << (p - 3));
            // The window rotates with the index, so any n consecutive elements have every
            // rank contribute k times; the seed shifts it so repetitions differ.
            let start = (index % n + mix(seed) % n) % n;
            if (rank + n - start) % n >= k {
                return T::from_f64(0.0);
            }
            let mut b = p - 1 - log2_ceil(k);
            if op == ReduceOp::MulSum {
                b -= 1;
            }
            // |partial sum| < 2^(p-1+E) <= 2^EMAX: finite; every nonzero |value| >= 2^E:
            // normal. For avg the quotient by n stays normal too where the range allows.
            let hi = T::EMAX - (p - 1) as i32;
            let lo = T::EMIN
                + if op == ReduceOp::Avg {
                    log2_ceil(n) as i32
                } else {
                    0
                };
            let top = (p - 1) as i32;
            let (lo, hi) = clamp_range(lo, hi, -WINDOW - top, WINDOW - top);
            let e = pick(shared, lo, hi);
            let m = 1 + (own >> 1) % ((1u64 << b) - 1);
            T::from_f64(sign * m as f64 * pow2(e))
        }
        ReduceOp::Prod => {
            // Each of the `c` ranks after the special one shifts the exponent by at most one:
            // partial products lie in [2^(es-c), 2^(es+c+1)), inside [2^EMIN, 2^EMAX).
            let budget = ((T::EMAX - 1 - T::EMIN) / 4).min(60) as u64;
            let c = budget.min(n - 1);
            let special = shared % n;
            let pos = (rank + n - special) % n;
            if pos == 0 {
                let (lo, hi) = clamp_range(T::EMIN + c as i32, T::EMAX - 1 - c as i32, -8, 8);
                let es = pick(shared >> 16, lo, hi);
                let mant = (own >> 1) & ((1u64 << T::MANT) - 1);
                let m = (1u64 << T::MANT) | mant;
                T::from_f64(sign * m as f64 * pow2(es - T::MANT as i32))
            } else if pos <= c {
                let e = ((own >> 1) % 3) as i32 - 1;
                T::from_f64(sign * pow2(e))
            } else {
                T::from_f64(sign)
            }
        }
        ReduceOp::Min | ReduceOp::Max => {
            // Random sign and mantissa, exponent field from the middle half of the range: no
            // NaN, infinity, zero or subnormal to blur the comparison.
            let emax = (1u64 << T::EXP_BITS) - 1;
            let e = emax / 4 + (own >> 2) % (emax / 2);
            let mant = (own >> 16) & ((1u64 << T::MANT) - 1);
            T::from_raw(((own & 1) << (T::MANT + T::EXP_BITS)) | (e << T::MANT) | mant)
        }
    }
}

macro_rules! float_verifiable {
    ($($t:ty),*) => {$(
        impl Verifiable for $t {
            #[inline]
            fn input(op: ReduceOp, seed: u64, index: u64, rank: usize, n: usize) -> Self {
                float_input(op, seed, index, rank, n)
            }
        }
    )*};
}

float_verifiable!(f16, f32, f64, bf16, F8E4M3, F8E5M2);

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

/// Fill `out` with the reduction over all ranks (the AllReduce result). For `mulsum` that is
/// the sum of every rank's input times its [`crate::element::premul_scalar`].
pub fn fill_expected_typed<T: Verifiable>(
    out: &mut [T],
    op: ReduceOp,
    seed: u64,
    first_index: u64,
    nranks: usize,
) {
    // Each rank's contribution as it enters the reduction.
    let contribution = |idx: u64, r: usize| {
        let x = T::input(op, seed, idx, r, nranks);
        if op == ReduceOp::MulSum {
            premul(x, r)
        } else {
            x
        }
    };
    for (i, o) in out.iter_mut().enumerate() {
        let idx = first_index + i as u64;
        let mut acc = contribution(idx, 0);
        for r in 1..nranks {
            acc = combine(op, acc, contribution(idx, r));
        }
        if op == ReduceOp::Avg {
            acc = acc.div_n(nranks);
        }
        *o = acc;
    }
}

/// Count elements whose bits differ by more than the tolerance: 0, except float `avg`, which
/// allows 2 units in the last place (as nccl-tests does) so that an implementation that
/// premultiplies by 1/n instead of dividing the sum still validates. `mulsum` is exact: its
/// scalars are powers of two.
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
            $crate::DataType::Float16 => {
                type $T = $crate::element::f16;
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
            $crate::DataType::BFloat16 => {
                type $T = $crate::element::bf16;
                $body
            }
            $crate::DataType::F8E4M3 => {
                type $T = $crate::element::F8E4M3;
                $body
            }
            $crate::DataType::F8E5M2 => {
                type $T = $crate::element::F8E5M2;
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
        (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
            && bytes.len().is_multiple_of(size),
        "buffer not aligned/sized for {}",
        T::DTYPE
    );
    // SAFETY: alignment and length checked above; every bit pattern is a valid T for the
    // types that implement Element (primitive integers and floats, and the `repr(transparent)`
    // wrappers of u16/u8 that `half` and `element::fp8` define).
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) }
}

/// Mutable counterpart of [`as_typed`].
pub fn as_typed_mut<T: Element>(bytes: &mut [u8]) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(
        (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
            && bytes.len().is_multiple_of(size),
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
mod tests;
