//! Instruction-set tiers of the reduction kernels, chosen once per process.
//!
//! The default x86_64 target assumes SSE2 only, so the kernels are built several times, each
//! for a wider instruction set, and the best one the CPU has runs. Every tier gives the same
//! bits as the portable one: the same IEEE operations, no contraction into FMA, and the narrow
//! floats rounded by conversions tested bit-identical to the portable ones (`tests/simd.rs`
//! compares each tier with the portable path on every 16-bit pattern). The one exception is
//! the one IEEE leaves open: which payload a sum or product of two NaNs carries, which even
//! the portable loop does not pin down (the compiler may swap the operands).
//!
//! `BUSBW_SIMD=avx512fp16|avx512|avx2|portable` lowers the tier, so that one machine can
//! measure and test the fallbacks (the `reduce` bench and the tier tests call the tiers
//! directly instead). It never raises the tier above what the CPU runs; a value it does not
//! know is ignored.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// The environment variable that lowers the tier.
pub const SIMD_ENV: &str = "BUSBW_SIMD";

/// A tier of the reduction kernels, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Simd {
    /// Plain Rust built for the baseline target; runs everywhere.
    Portable,
    /// AVX2 and F16C (Haswell, Zen and later).
    Avx2,
    /// AVX-512 F, BW and VL (Skylake-SP, Ice Lake, Zen 4 and later).
    Avx512,
    /// AVX-512 with half arithmetic (FP16) and bfloat16 conversion (BF16, and DQ): Sapphire
    /// Rapids and later. Half is added in its own format, bfloat16 rounded in one instruction.
    Avx512Fp16,
}

impl Simd {
    pub const ALL: [Simd; 4] = [Simd::Portable, Simd::Avx2, Simd::Avx512, Simd::Avx512Fp16];

    pub fn name(self) -> &'static str {
        match self {
            Simd::Portable => "portable",
            Simd::Avx2 => "avx2",
            Simd::Avx512 => "avx512",
            Simd::Avx512Fp16 => "avx512fp16",
        }
    }

    /// Whether this CPU, and this build of the crate, can run the tier.
    pub fn supported(self) -> bool {
        self <= Simd::best()
    }

    /// The best tier this CPU and build run; probed once, as the kernels ask on every call.
    pub fn best() -> Simd {
        static BEST: OnceLock<Simd> = OnceLock::new();
        *BEST.get_or_init(detect)
    }

    /// The tier the kernels use: [`Simd::best`] lowered by `BUSBW_SIMD`; read once.
    pub fn active() -> Simd {
        static ACTIVE: OnceLock<Simd> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let wanted = std::env::var(SIMD_ENV).ok().and_then(|v| v.parse().ok());
            wanted.map_or(Simd::best(), |w: Simd| w.min(Simd::best()))
        })
    }
}

impl fmt::Display for Simd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A `BUSBW_SIMD` value that names no tier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown SIMD tier {0:?} (expected avx512fp16, avx512, avx2 or portable)")]
pub struct UnknownSimd(pub String);

impl FromStr for Simd {
    type Err = UnknownSimd;

    fn from_str(s: &str) -> Result<Simd, UnknownSimd> {
        let s = s.trim();
        Simd::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownSimd(s.to_string()))
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Simd {
    use std::arch::is_x86_feature_detected as has;
    #[cfg(busbw_avx512)]
    if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
        #[cfg(busbw_avx512fp16)]
        if has!("avx512dq") && has!("avx512fp16") && has!("avx512bf16") {
            return Simd::Avx512Fp16;
        }
        return Simd::Avx512;
    }
    if has!("avx2") && has!("f16c") {
        return Simd::Avx2;
    }
    Simd::Portable
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Simd {
    Simd::Portable
}

#[inline(always)]
pub(super) fn map2_loop<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

#[inline(always)]
pub(super) fn map3_loop<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}

/// How many of the first `n` elements of `dst` come before its first 64-byte boundary. The
/// wide tiers run their vector loops from there: a misaligned 64-byte store spans two cache
/// lines, which costs wide loops a tenth of their speed on plain `Vec`s (16 bytes past a
/// line).
#[inline(always)]
pub(super) fn head<T>(dst: *const T, n: usize) -> usize {
    dst.align_offset(64).min(n)
}

/// [`map2_loop`] with the part before the destination's first line boundary split off.
#[inline(always)]
fn map2_aligned<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    let h = head(dst.as_ptr(), dst.len().min(src.len()));
    let ((d0, d1), (s0, s1)) = (dst.split_at_mut(h), src.split_at(h));
    map2_loop(d0, s0, &f);
    map2_loop(d1, s1, f);
}

/// [`map3_loop`] with the part before the destination's first line boundary split off.
#[inline(always)]
fn map3_aligned<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    let h = head(dst.as_ptr(), dst.len().min(a.len()).min(b.len()));
    let ((d0, d1), (a0, a1), (b0, b1)) = (dst.split_at_mut(h), a.split_at(h), b.split_at(h));
    map3_loop(d0, a0, b0, &f);
    map3_loop(d1, a1, b1, f);
}

// The element-wise loops built for the wider tiers: the compiler vectorises them for the
// native types (floats, integers) at the tier's width; the narrow floats have their own
// kernels (`x86`). Only `run2`/`run3` call them, after checking the tier is supported.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn map2_avx2<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    map2_aligned(dst, src, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn map3_avx2<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    map3_aligned(dst, a, b, f)
}

#[cfg(all(target_arch = "x86_64", busbw_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn map2_avx512<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    map2_aligned(dst, src, f)
}

#[cfg(all(target_arch = "x86_64", busbw_avx512))]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn map3_avx512<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    map3_aligned(dst, a, b, f)
}

/// `dst = f(dst, src)` at tier `simd`, which the caller has checked is supported.
#[inline(always)]
pub(super) fn run2<T: Copy>(simd: Simd, dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    debug_assert!(simd.supported());
    match simd {
        // SAFETY (both arms): the tier is supported, so the CPU has its features.
        #[cfg(all(target_arch = "x86_64", busbw_avx512))]
        Simd::Avx512 | Simd::Avx512Fp16 => unsafe { map2_avx512(dst, src, f) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { map2_avx2(dst, src, f) },
        _ => map2_loop(dst, src, f),
    }
}

/// `dst = f(a, b)` at tier `simd`, which the caller has checked is supported.
#[inline(always)]
pub(super) fn run3<T: Copy>(simd: Simd, dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    debug_assert!(simd.supported());
    match simd {
        // SAFETY (both arms): the tier is supported, so the CPU has its features.
        #[cfg(all(target_arch = "x86_64", busbw_avx512))]
        Simd::Avx512 | Simd::Avx512Fp16 => unsafe { map3_avx512(dst, a, b, f) },
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { map3_avx2(dst, a, b, f) },
        _ => map3_loop(dst, a, b, f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_parse_and_order() {
        assert_eq!("AVX512".parse(), Ok(Simd::Avx512));
        assert_eq!(" avx2 ".parse(), Ok(Simd::Avx2));
        assert_eq!("portable".parse(), Ok(Simd::Portable));
        assert!("sse".parse::<Simd>().is_err());
        assert_eq!("avx512fp16".parse(), Ok(Simd::Avx512Fp16));
        assert!(Simd::ALL.windows(2).all(|w| w[0] < w[1]));
        assert!(Simd::Portable.supported());
        assert!(Simd::active() <= Simd::best());
        eprintln!("best tier here: {}", Simd::best());
    }
}
