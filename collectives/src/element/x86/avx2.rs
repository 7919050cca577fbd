//! The 256-bit primitives: eight `f32` lanes per vector, AVX2 integer lanes, F16C conversions.

use super::Lanes;
use std::arch::x86_64::*;

pub(super) struct Avx2;

/// A lane mask narrowed to 16-bit values.
#[inline(always)]
unsafe fn mask16(m: __m256i) -> __m128i {
    _mm_packs_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m))
}

// F16C's immediate has no exception-suppression bit: round to nearest, ties to even.
const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT;

impl Lanes for Avx2 {
    const N: usize = 8;
    type F = __m256;
    type I = __m256i;
    type M = __m256i;
    type H = __m128i;
    /// The low eight bytes.
    type B = __m128i;
    #[inline(always)]
    unsafe fn splat(x: u32) -> __m256i {
        _mm256_set1_epi32(x as i32)
    }
    #[inline(always)]
    unsafe fn bits(f: __m256) -> __m256i {
        _mm256_castps_si256(f)
    }
    #[inline(always)]
    unsafe fn float(i: __m256i) -> __m256 {
        _mm256_castsi256_ps(i)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn lt(a: __m256, b: __m256) -> __m256i {
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(a, b))
    }
    #[inline(always)]
    unsafe fn is_nan(a: __m256) -> __m256i {
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
    }
    #[inline(always)]
    unsafe fn iadd(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn isub(a: __m256i, b: __m256i) -> __m256i {
        _mm256_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        _mm256_and_si256(a, b)
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        _mm256_or_si256(a, b)
    }
    #[inline(always)]
    unsafe fn shl(a: __m256i, n: u32) -> __m256i {
        _mm256_sll_epi32(a, _mm_cvtsi32_si128(n as i32))
    }
    #[inline(always)]
    unsafe fn shr(a: __m256i, n: u32) -> __m256i {
        _mm256_srl_epi32(a, _mm_cvtsi32_si128(n as i32))
    }
    #[inline(always)]
    unsafe fn gt(a: __m256i, b: __m256i) -> __m256i {
        _mm256_cmpgt_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn blend(m: __m256i, t: __m256i, f: __m256i) -> __m256i {
        _mm256_blendv_epi8(f, t, m)
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.cast())
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: __m256i) {
        _mm256_storeu_si256(p.cast(), v)
    }
    #[inline(always)]
    unsafe fn load_h(p: *const u8) -> __m128i {
        _mm_loadu_si128(p.cast())
    }
    #[inline(always)]
    unsafe fn store_h(p: *mut u8, v: __m128i) {
        _mm_storeu_si128(p.cast(), v)
    }
    #[inline(always)]
    unsafe fn load_b(p: *const u8) -> __m128i {
        _mm_loadl_epi64(p.cast())
    }
    #[inline(always)]
    unsafe fn store_b(p: *mut u8, v: __m128i) {
        _mm_storel_epi64(p.cast(), v)
    }
    #[inline(always)]
    unsafe fn join16(even: __m256i, odd: __m256i) -> __m256i {
        _mm256_blend_epi16::<0xaa>(_mm256_srli_epi32::<16>(even), odd)
    }
    #[inline(always)]
    unsafe fn cvtph(h: __m128i) -> __m256 {
        _mm256_cvtph_ps(h)
    }
    #[inline(always)]
    unsafe fn cvtps_ph(f: __m256) -> __m128i {
        _mm256_cvtps_ph::<NEAREST>(f)
    }
    #[inline(always)]
    unsafe fn blend_h(m: __m256i, t: __m128i, f: __m128i) -> __m128i {
        _mm_blendv_epi8(f, t, mask16(m))
    }
    #[inline(always)]
    unsafe fn blend_b(m: __m256i, t: __m128i, f: __m128i) -> __m128i {
        let m = mask16(m);
        _mm_blendv_epi8(f, t, _mm_packs_epi16(m, m))
    }
    #[inline(always)]
    unsafe fn pack_b(i: __m256i) -> __m128i {
        let w = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256::<1>(i));
        _mm_packus_epi16(w, w)
    }
    #[inline(always)]
    unsafe fn bytes_high(b: __m128i) -> __m128i {
        _mm_unpacklo_epi8(_mm_setzero_si128(), b)
    }
    #[inline(always)]
    unsafe fn e4m3_half(b: __m128i) -> __m128i {
        let x = _mm_cvtepu8_epi16(b);
        let mag = _mm_and_si128(x, _mm_set1_epi16(0x7f));
        let all_ones = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f));
        let nan = _mm_and_si128(all_ones, _mm_set1_epi16(0x7c00));
        let sign = _mm_slli_epi16::<8>(_mm_and_si128(x, _mm_set1_epi16(0x80)));
        _mm_or_si128(_mm_or_si128(_mm_slli_epi16::<7>(mag), sign), nan)
    }
}
