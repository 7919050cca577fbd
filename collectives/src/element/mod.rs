//! Element arithmetic: the reduction kernels.
//!
//! Integer ops wrap (as NCCL's do on the GPU); float ops are plain IEEE operations. The loops
//! are written so the compiler vectorises them: the operator is chosen once outside the loop
//! and the body is a straight element-wise map. Each kernel exists at several instruction-set
//! tiers ([`Simd`]: portable, AVX2, AVX-512, AVX-512 with FP16), picked once per process from
//! the CPU and `BUSBW_SIMD`; all give the same bits.
//!
//! The narrow floats (`half`, `bfloat16`, both fp8 formats) have no native arithmetic here
//! (except half at the FP16 tier, which rounds to the same values): each operation widens both
//! operands to `f32`, operates, and rounds once back. `f32` carries
//! at least twice the narrow precision plus two bits, so that single rounding gives the
//! correctly rounded result of the narrow type, the value NCCL's `__hadd`/`__hmul` and its
//! float-based fp8 reductions produce.

pub mod fp8;
mod fused;
mod narrow;
mod simd;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use fp8::{F8E4M3, F8E5M2};
/// A cache line, on every CPU busbw runs on: the unit of streaming stores, of alignment, and
/// of the lines ranks must not share.
pub(crate) const LINE: usize = 64;
pub use fused::{reduce_to_all, reduce_to_all_simd, Pass};
/// Re-exported so `with_dtype!` and callers can name the 16-bit types without depending on
/// `half` themselves.
pub use half::{bf16, f16};
pub use simd::{Simd, UnknownSimd, SIMD_ENV};

use crate::dtype::{DataType, ReduceOp};

/// A type that can be reduced.
pub trait Element: Copy + Send + Sync + 'static + PartialOrd {
    const DTYPE: DataType;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Division by the rank count for `avg` (truncating for integers).
    fn div_n(self, n: usize) -> Self;
    /// Bits for bit-exact comparison.
    fn to_bits_u64(self) -> u64;
    /// `v` rounded to the type as its own conversions round (nearest-even for floats, `as`
    /// for integers). Scalars such as the `mulsum` premultipliers are given as `f64` and must
    /// become elements before they can take part in the type's own arithmetic.
    fn from_f64(v: f64) -> Self;
}

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DataType = $d;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                // n fits the type for any realistic job; if it does not, the average of
                // values of this width is 0 anyway.
                match <$t>::try_from(n) {
                    Ok(d) if d != 0 => self.wrapping_div(d),
                    _ => 0,
                }
            }
            #[inline(always)]
            fn to_bits_u64(self) -> u64 {
                self as u64 & (<$t>::MAX as u64 | (1u64 << (8 * std::mem::size_of::<$t>() - 1)))
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

int_element!(i8, DataType::Int8);
int_element!(u8, DataType::Uint8);
int_element!(i32, DataType::Int32);
int_element!(u32, DataType::Uint32);
int_element!(i64, DataType::Int64);
int_element!(u64, DataType::Uint64);

macro_rules! float_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DataType = $d;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                self / (n as $t)
            }
            #[inline(always)]
            fn to_bits_u64(self) -> u64 {
                self.to_bits() as u64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

float_element!(f32, DataType::Float32);
float_element!(f64, DataType::Float64);

/// Narrow floats: widen to `f32`, operate, round once (see the module documentation).
/// `$to`/`$from` are the `f32` conversions, `$from64` the correctly rounded `f64` one.
macro_rules! narrow_float_element {
    ($t:ty, $d:expr, $to:expr, $from:expr, $from64:expr) => {
        impl Element for $t {
            const DTYPE: DataType = $d;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                $from($to(self) + $to(o))
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                $from($to(self) * $to(o))
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                $from($to(self) / n as f32)
            }
            #[inline(always)]
            fn to_bits_u64(self) -> u64 {
                self.to_bits() as u64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                $from64(v)
            }
        }
    };
}

// `half`'s own f16 conversions test for F16C on every call, and its bf16 rounding branches,
// which keeps the kernel loops scalar; `narrow` has branch-free equivalents (tested
// bit-identical against `half`).
narrow_float_element!(
    f16,
    DataType::Float16,
    |x: f16| narrow::f16_to_f32(x.to_bits()),
    |x: f32| f16::from_bits(narrow::encode_f32(x, &narrow::F16) as u16),
    |x: f64| f16::from_bits(narrow::encode_f64(x, &narrow::F16) as u16)
);
narrow_float_element!(
    bf16,
    DataType::BFloat16,
    |x: bf16| narrow::bf16_to_f32(x.to_bits()),
    |x: f32| bf16::from_bits(narrow::bf16_from_f32(x)),
    |x: f64| bf16::from_bits(narrow::encode_f64(x, &narrow::BF16) as u16)
);
narrow_float_element!(
    F8E4M3,
    DataType::F8E4M3,
    F8E4M3::to_f32,
    F8E4M3::from_f32,
    F8E4M3::from_f64
);
narrow_float_element!(
    F8E5M2,
    DataType::F8E5M2,
    F8E5M2::to_f32,
    F8E5M2::from_f32,
    F8E5M2::from_f64
);

#[inline(always)]
fn min<T: Element>(a: T, b: T) -> T {
    if b < a {
        b
    } else {
        a
    }
}

#[inline(always)]
fn max<T: Element>(a: T, b: T) -> T {
    if b > a {
        b
    } else {
        a
    }
}

/// `dst = dst op src`. `Avg` accumulates a sum; the division happens once, in [`finish_avg`].
/// `MulSum` is a plain sum here: each rank premultiplies its own contribution (see
/// [`scale_inplace`]) before it enters the reduction, as NCCL's PreMulSum does.
pub fn reduce_inplace<T: Element>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    inplace_at(Simd::active(), op, dst, src)
}

/// `dst = a op b` (out-of-place: the local contribution stays untouched in the send buffer).
pub fn reduce_into<T: Element>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    into_at(Simd::active(), op, dst, a, b)
}

/// [`reduce_inplace`] at tier `simd`, or the best tier below it that this CPU runs: the same
/// bits at every tier, so benchmarks and tests can compare them in one process.
pub fn reduce_inplace_simd<T: Element>(simd: Simd, op: ReduceOp, dst: &mut [T], src: &[T]) {
    inplace_at(simd.min(Simd::best()), op, dst, src)
}

/// [`reduce_into`] at tier `simd`, as [`reduce_inplace_simd`].
pub fn reduce_into_simd<T: Element>(simd: Simd, op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    into_at(simd.min(Simd::best()), op, dst, a, b)
}

/// [`reduce_inplace`] at a tier this CPU runs.
#[inline]
fn inplace_at<T: Element>(simd: Simd, op: ReduceOp, dst: &mut [T], src: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if x86::reduce_inplace(simd, op, dst, src) {
        return;
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => simd::run2(simd, dst, src, T::add),
        ReduceOp::Prod => simd::run2(simd, dst, src, T::mul),
        ReduceOp::Min => simd::run2(simd, dst, src, min),
        ReduceOp::Max => simd::run2(simd, dst, src, max),
    }
}

/// [`reduce_into`] at a tier this CPU runs.
#[inline]
fn into_at<T: Element>(simd: Simd, op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if x86::reduce_into(simd, op, dst, a, b) {
        return;
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => simd::run3(simd, dst, a, b, T::add),
        ReduceOp::Prod => simd::run3(simd, dst, a, b, T::mul),
        ReduceOp::Min => simd::run3(simd, dst, a, b, min),
        ReduceOp::Max => simd::run3(simd, dst, a, b, max),
    }
}

/// Reductions at least this large are split across a communicator's reduction threads, in
/// pieces of at least half of it: below that, fork/join costs (a few microseconds) are no
/// longer small against the work.
pub const PAR_MIN_BYTES: usize = 512 << 10;

/// Pieces of `len` elements of `T` for `threads` threads, or `None` to run on this thread.
fn par_piece<T>(len: usize, threads: usize) -> Option<usize> {
    let bytes = len * std::mem::size_of::<T>();
    if threads < 2 || bytes < PAR_MIN_BYTES {
        return None;
    }
    let min = (PAR_MIN_BYTES / 2) / std::mem::size_of::<T>().max(1);
    Some(len.div_ceil(threads).max(min))
}

/// [`reduce_inplace`], split across `pool`'s threads when the buffer is large. The split is by
/// position only, so the result is the same bits as on one thread.
pub fn reduce_inplace_par<T: Element>(
    op: ReduceOp,
    dst: &mut [T],
    src: &[T],
    pool: Option<&rayon::ThreadPool>,
) {
    use rayon::prelude::*;
    let simd = Simd::active();
    match pool.and_then(|p| Some(p).zip(par_piece::<T>(dst.len(), p.current_num_threads()))) {
        Some((p, piece)) => p.install(|| {
            dst.par_chunks_mut(piece)
                .zip(src.par_chunks(piece))
                .for_each(|(d, s)| inplace_at(simd, op, d, s))
        }),
        None => inplace_at(simd, op, dst, src),
    }
}

/// [`reduce_into`], split across `pool`'s threads when the buffer is large.
pub fn reduce_into_par<T: Element>(
    op: ReduceOp,
    dst: &mut [T],
    a: &[T],
    b: &[T],
    pool: Option<&rayon::ThreadPool>,
) {
    use rayon::prelude::*;
    let simd = Simd::active();
    match pool.and_then(|p| Some(p).zip(par_piece::<T>(dst.len(), p.current_num_threads()))) {
        Some((p, piece)) => p.install(|| {
            dst.par_chunks_mut(piece)
                .zip(a.par_chunks(piece))
                .zip(b.par_chunks(piece))
                .for_each(|((d, x), y)| into_at(simd, op, d, x, y))
        }),
        None => into_at(simd, op, dst, a, b),
    }
}

/// The post-op of `Avg`: divide the reduced sum by the rank count.
pub fn finish_avg<T: Element>(dst: &mut [T], nranks: usize) {
    for d in dst.iter_mut() {
        *d = d.div_n(nranks);
    }
}

/// The `mulsum` factor of `rank`: nccl-tests' `ncclVerifiablePremulScalar`, 1 on even ranks and
/// 2 on odd ones. Powers of two keep the premultiplication exact, so validation stays bitwise.
pub fn premul_scalar(rank: usize) -> f64 {
    if rank.is_multiple_of(2) {
        1.0
    } else {
        2.0
    }
}

/// `x` times `rank`'s [`premul_scalar`], in the type's own arithmetic (wrapping for integers).
#[inline]
pub fn premul<T: Element>(x: T, rank: usize) -> T {
    x.mul(T::from_f64(premul_scalar(rank)))
}

/// Premultiplies `rank`'s contribution in place before a `mulsum` reduction.
pub fn scale_inplace<T: Element>(buf: &mut [T], rank: usize) {
    let s = T::from_f64(premul_scalar(rank));
    for x in buf.iter_mut() {
        *x = x.mul(s);
    }
}

/// `dst = src × scalar(rank)`: the out-of-place variant, which leaves the send buffer as the
/// user wrote it.
pub fn scale_into<T: Element>(dst: &mut [T], src: &[T], rank: usize) {
    let s = T::from_f64(premul_scalar(rank));
    for (d, x) in dst.iter_mut().zip(src) {
        *d = x.mul(s);
    }
}

/// The value one reduction of `a` and `b` gives; the reference the kernels are checked against.
pub fn combine<T: Element>(op: ReduceOp, a: T, b: T) -> T {
    match op {
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => a.add(b),
        ReduceOp::Prod => a.mul(b),
        ReduceOp::Min => min(a, b),
        ReduceOp::Max => max(a, b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_match_scalar_reference() {
        let a: Vec<i8> = vec![100, -100, 7, 0, 127];
        let b: Vec<i8> = vec![100, -100, -8, 5, 1];
        for op in ReduceOp::ALL {
            let mut d = a.clone();
            reduce_inplace(op, &mut d, &b);
            let mut e = vec![0; a.len()];
            reduce_into(op, &mut e, &a, &b);
            let want: Vec<i8> = a.iter().zip(&b).map(|(x, y)| combine(op, *x, *y)).collect();
            assert_eq!(d, want, "{op}");
            assert_eq!(e, want, "{op}");
        }
        let mut s = vec![-7i32, 7, 9];
        finish_avg(&mut s, 2);
        assert_eq!(s, vec![-3, 3, 4], "integer avg truncates toward zero");
        assert_eq!(200u8.add(100), 44, "integer sum wraps");
        assert_eq!((-1i8).to_bits_u64(), 0xff);
        assert_eq!((-1i64).to_bits_u64(), u64::MAX);
    }

    /// Builds test values from raw bits.
    trait FromRaw: Element {
        fn from_raw(b: u64) -> Self;
        fn is_nan_value(self) -> bool {
            false
        }
    }

    macro_rules! from_raw_int {
        ($($t:ty),*) => {$(
            impl FromRaw for $t {
                fn from_raw(b: u64) -> Self {
                    b as $t
                }
            }
        )*};
    }
    from_raw_int!(i8, u8, i32, u32, i64, u64);

    macro_rules! from_raw_float {
        ($($t:ty, $from:expr, $nan:expr);*) => {$(
            impl FromRaw for $t {
                fn from_raw(b: u64) -> Self {
                    $from(b)
                }
                fn is_nan_value(self) -> bool {
                    $nan(self)
                }
            }
        )*};
    }
    from_raw_float!(
        f16, |b| f16::from_bits(b as u16), |x: f16| x.is_nan();
        f32, |b| f32::from_bits(b as u32), |x: f32| x.is_nan();
        f64, f64::from_bits, |x: f64| x.is_nan();
        bf16, |b| bf16::from_bits(b as u16), |x: bf16| x.is_nan();
        F8E4M3, |b| F8E4M3(b as u8), |x: F8E4M3| x.is_nan();
        F8E5M2, |b| F8E5M2(b as u8), |x: F8E5M2| x.is_nan()
    );

    /// Random values of every bit pattern except NaN, whose payload an optimised loop may
    /// legitimately take from either operand.
    fn random_values<T: FromRaw>(seed: u64, len: usize) -> Vec<T> {
        let mut z = seed;
        (0..len)
            .map(|_| loop {
                z ^= z << 13;
                z ^= z >> 7;
                z ^= z << 17;
                let v = T::from_raw(z);
                if !v.is_nan_value() {
                    break v;
                }
            })
            .collect()
    }

    fn check_kernels<T: FromRaw>() {
        // An odd length exercises the vector loops' remainders.
        let a: Vec<T> = random_values(1, 1037);
        let b: Vec<T> = random_values(2, 1037);
        for op in ReduceOp::ALL {
            let want: Vec<u64> = a
                .iter()
                .zip(&b)
                .map(|(x, y)| combine(op, *x, *y).to_bits_u64())
                .collect();
            let mut d = a.clone();
            reduce_inplace(op, &mut d, &b);
            let mut e = a.clone();
            reduce_into(op, &mut e, &b, &a);
            let mut e2 = b.clone();
            reduce_into(op, &mut e2, &a, &b);
            let bits = |v: &[T]| v.iter().map(|x| x.to_bits_u64()).collect::<Vec<_>>();
            assert_eq!(bits(&d), want, "{} {op} in place", T::DTYPE);
            assert_eq!(bits(&e2), want, "{} {op} out of place", T::DTYPE);
            if op != ReduceOp::Min && op != ReduceOp::Max {
                // Sum and product commute (min/max of +0 and -0 keep the first operand).
                assert_eq!(bits(&e), want, "{} {op} commuted", T::DTYPE);
            }
        }
    }

    #[test]
    fn kernels_match_scalar_reference_for_every_type() {
        check_kernels::<i8>();
        check_kernels::<u8>();
        check_kernels::<i32>();
        check_kernels::<u32>();
        check_kernels::<i64>();
        check_kernels::<u64>();
        check_kernels::<f16>();
        check_kernels::<f32>();
        check_kernels::<f64>();
        check_kernels::<bf16>();
        check_kernels::<F8E4M3>();
        check_kernels::<F8E5M2>();
    }

    /// Every pair of fp8 values, and a sample of half values: widening to f32 and rounding
    /// once must equal rounding the exact result (which f64 holds exactly for these types).
    #[test]
    fn narrow_arithmetic_is_correctly_rounded() {
        fn check<T: FromRaw + std::fmt::Debug>(
            x: T,
            y: T,
            wide: impl Fn(T) -> f64,
            round: impl Fn(f64) -> T,
        ) {
            let same = |got: T, want: T| {
                got.to_bits_u64() == want.to_bits_u64()
                    || (got.is_nan_value() && want.is_nan_value())
            };
            let (a, b) = (wide(x), wide(y));
            assert!(
                same(x.add(y), round(a + b)),
                "{x:?} + {y:?} = {:?}",
                x.add(y)
            );
            assert!(
                same(x.mul(y), round(a * b)),
                "{x:?} * {y:?} = {:?}",
                x.mul(y)
            );
        }
        for i in 0..=255u8 {
            for j in 0..=255u8 {
                check(
                    F8E4M3(i),
                    F8E4M3(j),
                    |x| x.to_f32() as f64,
                    F8E4M3::from_f64,
                );
                check(
                    F8E5M2(i),
                    F8E5M2(j),
                    |x| x.to_f32() as f64,
                    F8E5M2::from_f64,
                );
            }
            for n in [1usize, 2, 3, 7, 1000] {
                let x = F8E4M3(i);
                let want = F8E4M3::from_f64(x.to_f32() as f64 / n as f64);
                assert!(x.div_n(n).0 == want.0 || x.is_nan(), "{x:?} / {n}");
                let x = F8E5M2(i);
                let want = F8E5M2::from_f64(x.to_f32() as f64 / n as f64);
                assert!(x.div_n(n).0 == want.0 || x.is_nan(), "{x:?} / {n}");
            }
        }
        let a: Vec<f16> = random_values(3, 100_000);
        let b: Vec<f16> = random_values(4, 100_000);
        for (x, y) in a.into_iter().zip(b) {
            check(x, y, |v| v.to_f64(), <f16 as Element>::from_f64);
        }
    }

    #[test]
    fn premultiplication_doubles_odd_ranks_in_the_types_own_arithmetic() {
        assert_eq!(premul_scalar(0), 1.0);
        assert_eq!(premul_scalar(1), 2.0);
        assert_eq!(premul_scalar(6), 1.0);
        let mut v = vec![100i8, -100, 3];
        scale_inplace(&mut v, 4);
        assert_eq!(v, vec![100, -100, 3]);
        scale_inplace(&mut v, 3);
        assert_eq!(v, vec![-56, 56, 6], "integer premultiplication wraps");
        let src = [1.5f32, -0.25, 3.0e38];
        let mut dst = [0f32; 3];
        scale_into(&mut dst, &src, 1);
        assert_eq!(dst, [3.0, -0.5, f32::INFINITY]);
        assert_eq!(src, [1.5, -0.25, 3.0e38], "source untouched");
        let mut h = [F8E4M3::from_f32(1.5), F8E4M3::from_f32(256.0)];
        scale_inplace(&mut h, 1);
        assert_eq!(h[0].to_f32(), 3.0);
        assert!(h[1].is_nan(), "E4M3 overflow is NaN, not a saturated 448");
        assert_eq!(premul(f16::from_f32(0.75), 5).to_f32(), 1.5);
        assert_eq!(premul(bf16::from_f32(0.75), 2).to_f32(), 0.75);
        // The kernels treat mulsum as a sum of already premultiplied contributions.
        assert_eq!(combine(ReduceOp::MulSum, 3u8, 4u8), 7);
    }
}
