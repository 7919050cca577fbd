//! The kernels of the `Avx512Fp16` tier: half in its own arithmetic, bfloat16 rounded by the
//! hardware conversion. Both cut the operations per value to a fraction of the widening
//! kernels', which is what a reduction on data in cache is bound by.

use super::avx512::Avx512;
use super::codec::{Bf16Round, IntRound, Step};
use super::{Add, Lanes, Max, Min, Mul, Op};
use crate::element::{f16, Element};
use std::arch::x86_64::*;

/// Thirty-two halves added or multiplied in their own format. `vaddph` rounds the exact sum
/// once; the portable path rounds it twice (to `f32`, then to half), which gives the same
/// value because `f32` has more than twice half's precision plus two bits; a product of two
/// halves is exact in `f32`, so both round it once. Subnormals are computed in full: the FP16
/// instructions do not flush them.
pub(super) struct F16x32;

impl Step for F16x32 {
    type Elem = f16;
    type Raw = __m512i;
    const W: usize = 32;
    #[inline(always)]
    unsafe fn load(p: *const f16) -> __m512i {
        _mm512_loadu_si512(p.cast())
    }
    #[inline(always)]
    unsafe fn store(p: *mut f16, r: __m512i) {
        _mm512_storeu_si512(p.cast(), r)
    }
}

/// NaN results made the portable path's half NaN, `0x7e00` with the result's sign (the
/// hardware would keep payload bits).
#[inline(always)]
unsafe fn canonical(r: __m512h) -> __m512i {
    let nan = _mm512_cmp_ph_mask::<_CMP_UNORD_Q>(r, r);
    let b = _mm512_castph_si512(r);
    let sign = _mm512_and_si512(b, _mm512_set1_epi16(0x8000_u16 as i16));
    _mm512_mask_blend_epi16(nan, b, _mm512_or_si512(sign, _mm512_set1_epi16(0x7e00)))
}

/// An arithmetic op on halves: one instruction, NaN made canonical.
macro_rules! half_arith {
    ($name:ident, $op:ident, $vec:ident) => {
        impl Op<F16x32> for $name {
            #[inline(always)]
            unsafe fn vec(a: __m512i, b: __m512i) -> __m512i {
                canonical($vec(_mm512_castsi512_ph(a), _mm512_castsi512_ph(b)))
            }
            #[inline(always)]
            fn one(a: f16, b: f16) -> f16 {
                a.$op(b)
            }
        }
    };
}

half_arith!(Add, add, _mm512_add_ph);
half_arith!(Mul, mul, _mm512_mul_ph);

/// A choosing op on halves: `b` where `$x < $y`, else `a`, as the portable `min`/`max`.
macro_rules! half_choose {
    ($name:ident, $scalar:ident, |$a:ident, $b:ident| $x:ident < $y:ident) => {
        impl Op<F16x32> for $name {
            #[inline(always)]
            unsafe fn vec($a: __m512i, $b: __m512i) -> __m512i {
                let (x, y) = (_mm512_castsi512_ph($x), _mm512_castsi512_ph($y));
                _mm512_mask_blend_epi16(_mm512_cmp_ph_mask::<_CMP_LT_OQ>(x, y), $a, $b)
            }
            #[inline(always)]
            fn one(a: f16, b: f16) -> f16 {
                crate::element::$scalar(a, b)
            }
        }
    };
}

half_choose!(Min, min, |a, b| b < a);
half_choose!(Max, max, |a, b| a < b);

/// bfloat16 rounding by `vcvtne2ps2bf16`: to nearest even, NaN kept quiet with the top of its
/// payload, as the integer recipe, except that it flushes subnormal inputs to zero; a step
/// with a subnormal sum (rare) takes the integer recipe instead.
pub(super) struct NeRound;

/// Word `k` of the result takes word `k / 2` (even `k`) or `16 + k / 2` (odd `k`) of the
/// conversion, which puts the even values' results first.
const INTERLEAVE: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut k = 0;
    while k < 32 {
        t[k] = ((k % 2) * 16 + k / 2) as u16;
        k += 1;
    }
    t
};

const SUBNORMAL: i32 = 0x20;

impl Bf16Round<Avx512> for NeRound {
    #[inline(always)]
    unsafe fn round(even: __m512, odd: __m512) -> __m512i {
        let sub =
            _mm512_fpclass_ps_mask::<SUBNORMAL>(even) | _mm512_fpclass_ps_mask::<SUBNORMAL>(odd);
        if sub != 0 {
            return <IntRound as Bf16Round<Avx512>>::round(even, odd);
        }
        // SAFETY: both are 512 bits of plain lanes.
        let halves: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(odd, even));
        let idx = Avx512::load(INTERLEAVE.as_ptr().cast());
        _mm512_permutexvar_epi16(idx, halves)
    }
}
