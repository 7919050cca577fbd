//! The 512-bit primitives: sixteen `f32` lanes per vector, mask registers for compares and
//! blends, truncating moves (`vpmovdb`) for narrowing.

use super::Lanes;
use std::arch::x86_64::*;

pub(super) struct Avx512;

const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

impl Lanes for Avx512 {
    const N: usize = 16;
    type F = __m512;
    type I = __m512i;
    type M = __mmask16;
    type H = __m256i;
    type B = __m128i;
    #[inline(always)]
    unsafe fn splat(x: u32) -> __m512i {
        _mm512_set1_epi32(x as i32)
    }
    #[inline(always)]
    unsafe fn bits(f: __m512) -> __m512i {
        _mm512_castps_si512(f)
    }
    #[inline(always)]
    unsafe fn float(i: __m512i) -> __m512 {
        _mm512_castsi512_ps(i)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn lt(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn is_nan(a: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a)
    }
    #[inline(always)]
    unsafe fn iadd(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn isub(a: __m512i, b: __m512i) -> __m512i {
        _mm512_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        _mm512_and_si512(a, b)
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        _mm512_or_si512(a, b)
    }
    #[inline(always)]
    unsafe fn shl(a: __m512i, n: u32) -> __m512i {
        _mm512_sll_epi32(a, _mm_cvtsi32_si128(n as i32))
    }
    #[inline(always)]
    unsafe fn shr(a: __m512i, n: u32) -> __m512i {
        _mm512_srl_epi32(a, _mm_cvtsi32_si128(n as i32))
    }
    #[inline(always)]
    unsafe fn gt(a: __m512i, b: __m512i) -> __mmask16 {
        _mm512_cmpgt_epi32_mask(a, b)
    }
    #[inline(always)]
    unsafe fn blend(m: __mmask16, t: __m512i, f: __m512i) -> __m512i {
        _mm512_mask_blend_epi32(m, f, t)
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p.cast())
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: __m512i) {
        _mm512_storeu_si512(p.cast(), v)
    }
    #[inline(always)]
    unsafe fn load_h(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.cast())
    }
    #[inline(always)]
    unsafe fn store_h(p: *mut u8, v: __m256i) {
        _mm256_storeu_si256(p.cast(), v)
    }
    #[inline(always)]
    unsafe fn load_b(p: *const u8) -> __m128i {
        _mm_loadu_si128(p.cast())
    }
    #[inline(always)]
    unsafe fn store_b(p: *mut u8, v: __m128i) {
        _mm_storeu_si128(p.cast(), v)
    }
    #[inline(always)]
    unsafe fn join16(even: __m512i, odd: __m512i) -> __m512i {
        _mm512_mask_blend_epi16(0xaaaa_aaaa, _mm512_srli_epi32::<16>(even), odd)
    }
    #[inline(always)]
    unsafe fn cvtph(h: __m256i) -> __m512 {
        _mm512_cvtph_ps(h)
    }
    #[inline(always)]
    unsafe fn cvtps_ph(f: __m512) -> __m256i {
        _mm512_cvtps_ph::<NEAREST>(f)
    }
    #[inline(always)]
    unsafe fn blend_h(m: __mmask16, t: __m256i, f: __m256i) -> __m256i {
        _mm256_mask_blend_epi16(m, f, t)
    }
    #[inline(always)]
    unsafe fn blend_b(m: __mmask16, t: __m128i, f: __m128i) -> __m128i {
        _mm_mask_blend_epi8(m, f, t)
    }
    #[inline(always)]
    unsafe fn pack_b(i: __m512i) -> __m128i {
        _mm512_cvtepi32_epi8(i)
    }
    #[inline(always)]
    unsafe fn bytes_high(b: __m128i) -> __m256i {
        _mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(b))
    }
    #[inline(always)]
    unsafe fn e4m3_half(b: __m128i) -> __m256i {
        let x = _mm256_cvtepu8_epi16(b);
        let mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7f));
        let all_ones = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f));
        let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(x, _mm256_set1_epi16(0x80)));
        let h = _mm256_or_si256(_mm256_slli_epi16::<7>(mag), sign);
        _mm256_mask_blend_epi16(all_ones, h, _mm256_or_si256(h, _mm256_set1_epi16(0x7c00)))
    }
}
