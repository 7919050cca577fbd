//! Explicit AVX2 and AVX-512 kernels for the narrow floats (bfloat16, half, both fp8); the
//! FP16/BF16 tier's own half and bfloat16 kernels are in `fp16`.
//!
//! Left to the compiler, their widen-operate-round bodies run at a fraction of memory speed:
//! the portable conversions are branch-free but long, and fp8 widening is a table lookup that
//! becomes a gather. Here every format widens with a few lane operations (a shift for
//! bfloat16, F16C for half, F16C after moving the fp8 fields into half's layout), operates in
//! `f32` exactly as the portable path does, and rounds back with the portable path's own
//! integer recipe done on whole vectors (bfloat16, fp8) or with F16C's round-to-nearest-even
//! (half). Min and max compare the widened values and pick the original bits, as the portable
//! `if b < a { b } else { a }` does, so even signalling NaN payloads pass through unchanged.
//!
//! NaN results are where hardware and the portable path could differ, so they are matched
//! explicitly: half and fp8 results are the format's canonical NaN with the `f32` result's
//! sign (F16C alone would keep payload bits), bfloat16 keeps the top of the payload and sets
//! the quiet bit (as `half::bf16::from_f32`).
//!
//! The vector body covers whole steps of two vectors from the destination's first 64-byte
//! boundary; the values before and after it run the scalar `Element` operations, which round
//! identically.
//!
//! Where the time goes: with 512-bit vectors, Intel cores issue integer and conversion work
//! on two ports only, so a kernel is as fast as its operation count allows once the data sits
//! in cache. bfloat16 costs about ten vector operations per sixteen values and half about as
//! many (F16C conversions are two each); both keep up with memory beyond the caches, and the
//! FP16/BF16 instructions take them most of the way in cache too. The fp8 formats stay
//! compute bound even beyond the caches: the exact rounding (subnormals, overflow, NaN) is
//! some fifteen operations per vector and widening another eight, which no table lookup
//! would remove; they still run several times faster than the portable loop.

mod avx2;
#[cfg(busbw_avx512)]
mod avx512;
mod codec;
// The FP16 intrinsics are stable from Rust 1.94, after the workspace's minimum: build.rs
// compiles this module only where the compiler building it has them.
#[cfg(busbw_avx512fp16)]
#[allow(clippy::incompatible_msrv)]
mod fp16;

use super::simd::Simd;
use super::{bf16, f16, Element, F8E4M3, F8E5M2};
use crate::dtype::ReduceOp;
use codec::{Bf16, Codec, E4m3, E5m2, Fp8, Halves, Step, F16};
use std::any::TypeId;

/// One vector width's primitives: `f32` and 32-bit integer lane operations, in which the
/// codecs (`codec`) are written once for both widths, and the few format moves that need
/// each width's own instructions.
trait Lanes {
    /// `f32` lanes per vector.
    const N: usize;
    /// `N` `f32` lanes.
    type F: Copy;
    /// `N` 32-bit integer lanes.
    type I: Copy;
    /// A mask of `N` lanes.
    type M: Copy;
    /// `N` 16-bit values.
    type H: Copy;
    /// `N` bytes.
    type B: Copy;
    unsafe fn splat(x: u32) -> Self::I;
    unsafe fn bits(f: Self::F) -> Self::I;
    unsafe fn float(i: Self::I) -> Self::F;
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a < b`, false when either is NaN.
    unsafe fn lt(a: Self::F, b: Self::F) -> Self::M;
    unsafe fn is_nan(a: Self::F) -> Self::M;
    unsafe fn iadd(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn isub(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    /// Logical shifts of every lane by `n` (a constant once inlined).
    unsafe fn shl(a: Self::I, n: u32) -> Self::I;
    unsafe fn shr(a: Self::I, n: u32) -> Self::I;
    /// Signed `a > b`.
    unsafe fn gt(a: Self::I, b: Self::I) -> Self::M;
    /// `m ? t : f` per lane.
    unsafe fn blend(m: Self::M, t: Self::I, f: Self::I) -> Self::I;
    unsafe fn load(p: *const u8) -> Self::I;
    unsafe fn store(p: *mut u8, v: Self::I);
    unsafe fn load_h(p: *const u8) -> Self::H;
    unsafe fn store_h(p: *mut u8, v: Self::H);
    unsafe fn load_b(p: *const u8) -> Self::B;
    unsafe fn store_b(p: *mut u8, v: Self::B);
    /// The high 16 bits of each lane of `even` and of `odd`, interleaved, `even`'s first.
    unsafe fn join16(even: Self::I, odd: Self::I) -> Self::I;
    /// Half to `f32` (exact).
    unsafe fn cvtph(h: Self::H) -> Self::F;
    /// `f32` to half, to nearest, ties to even.
    unsafe fn cvtps_ph(f: Self::F) -> Self::H;
    /// `m ? t : f` per 16-bit value.
    unsafe fn blend_h(m: Self::M, t: Self::H, f: Self::H) -> Self::H;
    /// `m ? t : f` per byte.
    unsafe fn blend_b(m: Self::M, t: Self::B, f: Self::B) -> Self::B;
    /// The low byte of each lane.
    unsafe fn pack_b(i: Self::I) -> Self::B;
    /// Each byte `b` as the 16-bit `b << 8`: E5M2 is the top byte of a half.
    unsafe fn bytes_high(b: Self::B) -> Self::H;
    /// E4M3 codes moved into half's fields, where they read as 2^-8 times the value (E4M3's
    /// subnormals become half's, exactly); the NaN code (all ones) gets half's all-ones
    /// exponent.
    unsafe fn e4m3_half(b: Self::B) -> Self::H;
}

/// An element-wise operation: on whole steps, and on single values for the remainder.
trait Op<C: Step> {
    unsafe fn vec(a: C::Raw, b: C::Raw) -> C::Raw;
    fn one(a: C::Elem, b: C::Elem) -> C::Elem;
}

struct Add;
struct Mul;
struct Min;
struct Max;

/// An arithmetic op: widen, operate in `f32`, round once.
macro_rules! arith {
    ($name:ident, $op:ident) => {
        impl<C: Codec> Op<C> for $name {
            #[inline(always)]
            unsafe fn vec(a: C::Raw, b: C::Raw) -> C::Raw {
                let (a, b) = (C::widen(a), C::widen(b));
                C::round([C::L::$op(a[0], b[0]), C::L::$op(a[1], b[1])])
            }
            #[inline(always)]
            fn one(a: C::Elem, b: C::Elem) -> C::Elem {
                a.$op(b)
            }
        }
    };
}

arith!(Add, add);
arith!(Mul, mul);

/// A choosing op: `b` where `$x < $y` on the widened values, else `a`, as the portable
/// `min`/`max` choose.
macro_rules! choose {
    ($name:ident, $scalar:ident, |$wa:ident, $wb:ident| $x:ident < $y:ident) => {
        impl<C: Codec> Op<C> for $name {
            #[inline(always)]
            unsafe fn vec(a: C::Raw, b: C::Raw) -> C::Raw {
                let ($wa, $wb) = (C::widen(a), C::widen(b));
                let m = [C::L::lt($x[0], $y[0]), C::L::lt($x[1], $y[1])];
                C::select(m, (b, $wb), (a, $wa))
            }
            #[inline(always)]
            fn one(a: C::Elem, b: C::Elem) -> C::Elem {
                super::$scalar(a, b)
            }
        }
    };
}

choose!(Min, min, |wa, wb| wb < wa);
choose!(Max, max, |wa, wb| wa < wb);

/// The vector body of `n` values from `dst`: from its first 64-byte boundary (see
/// `simd::head`) over whole steps; single values before and after.
#[inline(always)]
fn body<C: Step>(dst: *const C::Elem, n: usize) -> std::ops::Range<usize> {
    let h = super::simd::head(dst, n);
    h..h + (n - h) / C::W * C::W
}

/// `dst = o(dst, src)` on the common length.
#[inline(always)]
unsafe fn map2<C: Step, O: Op<C>>(dst: &mut [C::Elem], src: &[C::Elem]) {
    let n = dst.len().min(src.len());
    let body = body::<C>(dst.as_ptr(), n);
    let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
    let mut i = body.start;
    while i < body.end {
        C::store(d.add(i), O::vec(C::load(d.add(i)), C::load(s.add(i))));
        i += C::W;
    }
    for i in (0..body.start).chain(body.end..n) {
        dst[i] = O::one(dst[i], src[i]);
    }
}

/// `dst = o(a, b)` on the common length.
#[inline(always)]
unsafe fn map3<C: Step, O: Op<C>>(dst: &mut [C::Elem], a: &[C::Elem], b: &[C::Elem]) {
    let n = dst.len().min(a.len()).min(b.len());
    let body = body::<C>(dst.as_ptr(), n);
    let (d, pa, pb) = (dst.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    let mut i = body.start;
    while i < body.end {
        C::store(d.add(i), O::vec(C::load(pa.add(i)), C::load(pb.add(i))));
        i += C::W;
    }
    for i in (0..body.start).chain(body.end..n) {
        dst[i] = O::one(a[i], b[i]);
    }
}

/// A step type with all four operations: what the entry points run.
trait Ops: Step {
    unsafe fn inplace(op: ReduceOp, dst: &mut [Self::Elem], src: &[Self::Elem]);
    unsafe fn into(op: ReduceOp, dst: &mut [Self::Elem], a: &[Self::Elem], b: &[Self::Elem]);
}

impl<C: Step> Ops for C
where
    Add: Op<C>,
    Mul: Op<C>,
    Min: Op<C>,
    Max: Op<C>,
{
    #[inline(always)]
    unsafe fn inplace(op: ReduceOp, dst: &mut [C::Elem], src: &[C::Elem]) {
        match op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => map2::<C, Add>(dst, src),
            ReduceOp::Prod => map2::<C, Mul>(dst, src),
            ReduceOp::Min => map2::<C, Min>(dst, src),
            ReduceOp::Max => map2::<C, Max>(dst, src),
        }
    }
    #[inline(always)]
    unsafe fn into(op: ReduceOp, dst: &mut [C::Elem], a: &[C::Elem], b: &[C::Elem]) {
        match op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => map3::<C, Add>(dst, a, b),
            ReduceOp::Prod => map3::<C, Mul>(dst, a, b),
            ReduceOp::Min => map3::<C, Min>(dst, a, b),
            ReduceOp::Max => map3::<C, Max>(dst, a, b),
        }
    }
}

/// The entry points of one tier: [`Ops`] built with the tier's target features.
macro_rules! entries {
    ($(#[$cfg:meta])* $features:literal, $inplace:ident, $into:ident) => {
        $(#[$cfg])*
        #[target_feature(enable = $features)]
        unsafe fn $inplace<C: Ops>(op: ReduceOp, dst: &mut [C::Elem], src: &[C::Elem]) {
            C::inplace(op, dst, src)
        }

        $(#[$cfg])*
        #[target_feature(enable = $features)]
        unsafe fn $into<C: Ops>(op: ReduceOp, dst: &mut [C::Elem], a: &[C::Elem], b: &[C::Elem]) {
            C::into(op, dst, a, b)
        }
    };
}

entries!("avx2,f16c", inplace_avx2, into_avx2);
entries!(
    #[cfg(busbw_avx512)]
    "avx512f,avx512bw,avx512vl,avx2,f16c",
    inplace_avx512,
    into_avx512
);
entries!(
    #[cfg(busbw_avx512fp16)]
    "avx512f,avx512bw,avx512vl,avx512dq,avx512fp16,avx512bf16,avx2,f16c",
    inplace_fp16,
    into_fp16
);

/// `s` as a slice of `U` when `T` is `U`.
fn cast<T: 'static, U: 'static>(s: &[T]) -> Option<&[U]> {
    // SAFETY: same type, so same layout.
    (TypeId::of::<T>() == TypeId::of::<U>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) })
}

fn cast_mut<T: 'static, U: 'static>(s: &mut [T]) -> Option<&mut [U]> {
    // SAFETY: same type, so same layout; the borrow moves into the result.
    (TypeId::of::<T>() == TypeId::of::<U>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) })
}

/// Runs the narrow-float kernel of `T` at tier `$simd` (supported, not portable) when `T` is
/// one of the narrow floats: `[$avx2, $avx512, $fp16]` are the tiers' entry points, `$d` the
/// destination, `$s` the sources (identifiers, rebound to the narrow type).
macro_rules! narrow {
    ($simd:expr, $T:ty, $entries:tt, $op:expr, $d:ident, $($s:ident),+) => {
        narrow!(@ $simd, $T, $entries, $op, $d, [$($s),+], bf16,
            Bf16<avx2::Avx2>, Bf16<avx512::Avx512>, Bf16<avx512::Avx512, fp16::NeRound>);
        narrow!(@ $simd, $T, $entries, $op, $d, [$($s),+], f16,
            Halves<F16, avx2::Avx2>, Halves<F16, avx512::Avx512>, fp16::F16x32);
        narrow!(@ $simd, $T, $entries, $op, $d, [$($s),+], F8E4M3,
            Halves<Fp8<E4m3>, avx2::Avx2>, Halves<Fp8<E4m3>, avx512::Avx512>,
            Halves<Fp8<E4m3>, avx512::Avx512>);
        narrow!(@ $simd, $T, $entries, $op, $d, [$($s),+], F8E5M2,
            Halves<Fp8<E5m2>, avx2::Avx2>, Halves<Fp8<E5m2>, avx512::Avx512>,
            Halves<Fp8<E5m2>, avx512::Avx512>);
    };
    (@ $simd:expr, $T:ty, [$avx2:ident, $avx512:ident, $fp16:ident], $op:expr, $d:ident,
     [$($s:ident),+], $E:ty, $c2:ty, $c512:ty, $cfp16:ty) => {
        if let (Some(d), $(Some($s)),+) = (cast_mut::<$T, $E>($d), $(cast::<$T, $E>($s)),+) {
            // SAFETY: the caller checked that the CPU runs the tier.
            unsafe {
                match $simd {
                    #[cfg(busbw_avx512fp16)]
                    Simd::Avx512Fp16 => $fp16::<$cfp16>($op, d, $($s),+),
                    #[cfg(busbw_avx512)]
                    Simd::Avx512 => $avx512::<$c512>($op, d, $($s),+),
                    _ => $avx2::<$c2>($op, d, $($s),+),
                }
            }
            return true;
        }
    };
}

/// `dst = dst op src` with the narrow-float kernels when `T` has them at tier `simd`, which
/// the caller has checked the CPU runs; false when it left the work to the generic loops.
pub(super) fn reduce_inplace<T: Element>(
    simd: Simd,
    op: ReduceOp,
    dst: &mut [T],
    src: &[T],
) -> bool {
    if simd == Simd::Portable {
        return false;
    }
    narrow!(
        simd,
        T,
        [inplace_avx2, inplace_avx512, inplace_fp16],
        op,
        dst,
        src
    );
    false
}

/// `dst = a op b`, as [`reduce_inplace`].
pub(super) fn reduce_into<T: Element>(
    simd: Simd,
    op: ReduceOp,
    dst: &mut [T],
    a: &[T],
    b: &[T],
) -> bool {
    if simd == Simd::Portable {
        return false;
    }
    narrow!(simd, T, [into_avx2, into_avx512, into_fp16], op, dst, a, b);
    false
}
