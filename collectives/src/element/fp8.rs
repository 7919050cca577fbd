//! The two OCP 8-bit float formats NCCL reduces (`ncclFloat8e4m3`, `ncclFloat8e5m2`).
//!
//! Rust has no native fp8, and the validation compares raw bits, so the conversions here must
//! round exactly as CUDA's `__nv_fp8_*` constructors do: round to nearest, ties to even, from
//! the exact value (converting from `f64` directly, so `f32` and `f64` inputs both round once).
//!
//! Overflow follows CUDA's default `__NV_NOSAT` mode, which is the OCP spec's non-saturating
//! mode: a value whose rounding exceeds the largest finite number becomes infinity in E5M2
//! and NaN in E4M3 (which has no infinity). Saturating to the largest finite value would hide
//! an overflow in a reduction result; NaN makes it count as wrong. NaN inputs give `0x7f` with
//! the input's sign bit.
//!
//! Decoding goes through a 256-entry table built at compile time; encoding is the
//! branch-free rounding that the sibling `narrow` module also uses for IEEE half.

use super::narrow::{decode_bits, encode_f32, encode_f64, Format, E4M3, E5M2};
use std::cmp::Ordering;
use std::fmt;

const fn decode_table(f: &Format) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode_bits(i as u32, f);
        i += 1;
    }
    t
}

static E4M3_TO_F32: [u32; 256] = decode_table(&E4M3);
static E5M2_TO_F32: [u32; 256] = decode_table(&E5M2);

macro_rules! fp8_type {
    ($(#[$doc:meta])* $name:ident, $fmt:expr, $table:expr) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Default)]
        pub struct $name(pub u8);

        impl $name {
            pub const fn from_bits(b: u8) -> Self {
                Self(b)
            }

            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// Round to nearest even; overflow as described in the module documentation.
            #[inline]
            pub fn from_f32(x: f32) -> Self {
                Self(encode_f32(x, &$fmt) as u8)
            }

            /// As [`Self::from_f32`], rounding once from the `f64` value.
            #[inline]
            pub fn from_f64(x: f64) -> Self {
                Self(encode_f64(x, &$fmt) as u8)
            }

            /// Exact.
            #[inline(always)]
            pub fn to_f32(self) -> f32 {
                f32::from_bits($table[self.0 as usize])
            }

            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }

        // Value semantics, consistent with the ordering: +0 == -0 and NaN != NaN. Bitwise
        // comparison, which validation needs, goes through `to_bits`.
        impl PartialEq for $name {
            #[inline(always)]
            fn eq(&self, o: &Self) -> bool {
                self.to_f32() == o.to_f32()
            }
        }

        impl PartialOrd for $name {
            #[inline(always)]
            fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
                self.to_f32().partial_cmp(&o.to_f32())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#04x} = {})", stringify!($name), self.0, self.to_f32())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }

        impl From<$name> for f32 {
            fn from(x: $name) -> f32 {
                x.to_f32()
            }
        }
    };
}

fp8_type!(
    /// OCP FP8 E4M3 ("fn": bias 7, no infinities, NaN = `0x7f`/`0xff`, largest finite 448,
    /// smallest subnormal 2^-9), NCCL's `ncclFloat8e4m3`, CUDA's `__nv_fp8_e4m3`.
    F8E4M3,
    E4M3,
    E4M3_TO_F32
);

fp8_type!(
    /// OCP FP8 E5M2 (IEEE-like: bias 15, infinities `0x7c`/`0xfc`, NaN above them, largest
    /// finite 57344, smallest subnormal 2^-16), NCCL's `ncclFloat8e5m2`, CUDA's
    /// `__nv_fp8_e5m2`.
    F8E5M2,
    E5M2,
    E5M2_TO_F32
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `b` from the format's definition, computed independently of the table.
    fn reference(b: u8, f: &Format) -> f64 {
        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((b & 0x7f) >> f.man) as i32;
        let m = (b & ((1 << f.man) - 1)) as f64;
        let all_ones = (1 << (7 - f.man)) - 1;
        if f.finite_only && b & 0x7f == 0x7f {
            return f64::NAN;
        }
        if !f.finite_only && e == all_ones {
            return if m == 0.0 {
                s * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        let scale = (1u64 << f.man) as f64;
        if e == 0 {
            s * m / scale * 2f64.powi(1 - f.bias)
        } else {
            s * (1.0 + m / scale) * 2f64.powi(e - f.bias)
        }
    }

    fn check_format(f: &Format, from32: fn(f32) -> u8, from64: fn(f64) -> u8, to: fn(u8) -> f32) {
        for b in 0..=255u8 {
            let want = reference(b, f);
            let got = to(b);
            if want.is_nan() {
                assert!(got.is_nan(), "{b:#04x}");
                assert!(from32(got) & 0x7f == 0x7f, "{b:#04x}");
                continue;
            }
            assert_eq!(got as f64, want, "{b:#04x}");
            assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "{b:#04x}");
            // Round trip is exact for every non-NaN pattern, -0 and infinities included.
            assert_eq!(from32(got), b, "{b:#04x} = {got}");
            assert_eq!(from64(got as f64), b, "{b:#04x} = {got}");
        }
        // Every midpoint between neighbours ties to the even pattern; a hair either side goes
        // to the nearer one.
        for b in 0..f.max_finite as u8 {
            let (lo, hi) = (to(b) as f64, to(b + 1) as f64);
            let mid = (lo + hi) / 2.0;
            let even = if b % 2 == 0 { b } else { b + 1 };
            assert_eq!(from64(mid), even, "tie between {b:#04x} and {:#04x}", b + 1);
            assert_eq!(from64(-mid), even | 0x80, "negative tie at {b:#04x}");
            let eps = (hi - lo) / 1024.0;
            assert_eq!(from64(mid - eps), b, "below midpoint {b:#04x}");
            assert_eq!(from64(mid + eps), b + 1, "above midpoint {b:#04x}");
            assert_eq!(from32((mid - eps) as f32), b, "f32 below midpoint {b:#04x}");
            assert_eq!(
                from32((mid + eps) as f32),
                b + 1,
                "f32 above midpoint {b:#04x}"
            );
        }
        // Below half the smallest subnormal: zero; exactly half: ties to even (zero).
        let tiny = to(1) as f64;
        assert_eq!(from64(tiny / 2.0), 0);
        assert_eq!(from64(-tiny / 2.0), 0x80);
        assert_eq!(from64(tiny * 0.5000001), 1);
        assert_eq!(from64(1e-300), 0);
        assert_eq!(from64(f64::MIN_POSITIVE / 4.0), 0, "f64 subnormal");
        assert_eq!(from64(f64::NAN) & 0x7f, 0x7f);
    }

    #[test]
    fn e4m3_conversions() {
        check_format(
            &E4M3,
            |x| F8E4M3::from_f32(x).0,
            |x| F8E4M3::from_f64(x).0,
            |b| F8E4M3(b).to_f32(),
        );
        assert_eq!(F8E4M3(0x7e).to_f32(), 448.0);
        assert_eq!(F8E4M3(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(F8E4M3(0x08).to_f32(), 2f32.powi(-6), "smallest normal");
        assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
        assert!(F8E4M3(0x7f).is_nan() && F8E4M3(0xff).is_nan());
        // 464 is the midpoint between 448 and the (NaN) next pattern: ties to 448; anything
        // larger overflows to NaN because E4M3 has no infinity.
        assert_eq!(F8E4M3::from_f32(464.0).0, 0x7e);
        assert_eq!(F8E4M3::from_f32(-464.0).0, 0xfe);
        assert_eq!(F8E4M3::from_f32(464.01).0, 0x7f);
        assert_eq!(F8E4M3::from_f32(-1e6).0, 0xff);
        assert_eq!(F8E4M3::from_f32(f32::INFINITY).0, 0x7f);
        assert_eq!(F8E4M3::from_f32(f32::NEG_INFINITY).0, 0xff);
    }

    #[test]
    fn e5m2_conversions() {
        check_format(
            &E5M2,
            |x| F8E5M2::from_f32(x).0,
            |x| F8E5M2::from_f64(x).0,
            |b| F8E5M2(b).to_f32(),
        );
        assert_eq!(F8E5M2(0x7b).to_f32(), 57344.0);
        assert_eq!(F8E5M2(0x7c).to_f32(), f32::INFINITY);
        assert_eq!(F8E5M2(0xfc).to_f32(), f32::NEG_INFINITY);
        assert_eq!(F8E5M2(0x01).to_f32(), 2f32.powi(-16));
        assert_eq!(F8E5M2(0x3c).to_f32(), 1.0);
        assert!(F8E5M2(0x7d).is_nan() && F8E5M2(0xff).is_nan());
        // 61440 is the midpoint between 57344 (odd pattern) and infinity (even): IEEE rounds
        // it up to infinity, just below stays finite.
        assert_eq!(F8E5M2::from_f32(61440.0).0, 0x7c);
        assert_eq!(F8E5M2::from_f32(61439.0).0, 0x7b);
        assert_eq!(F8E5M2::from_f32(-1e9).0, 0xfc);
    }

    #[test]
    fn value_semantics_of_comparisons() {
        assert_eq!(F8E4M3(0x00), F8E4M3(0x80), "+0 == -0");
        assert_ne!(F8E4M3(0x7f), F8E4M3(0x7f), "NaN != NaN");
        assert!(F8E4M3(0xb8) < F8E4M3(0x38), "-1 < 1");
        assert!(F8E5M2(0x7c) > F8E5M2(0x7b), "inf > max");
        assert_eq!(format!("{:?}", F8E4M3(0x38)), "F8E4M3(0x38 = 1)");
        assert_eq!(F8E5M2(0xbc).to_string(), "-1");
    }
}
