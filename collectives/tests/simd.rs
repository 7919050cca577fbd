//! Every kernel tier against the portable scalar path ([`combine`]), bit for bit: every op,
//! every element type, in place and out of place, on lengths around the vector widths, and
//! for the 16-bit floats every bit pattern against a few hundred partners and the special
//! values (the fp8 formats: every pair).
//!
//! The one freedom left: when both operands of a sum or product are NaN, IEEE leaves open
//! which payload (and sign) the result carries, and the compiler swaps the operands of an
//! addition when it likes: the portable loop itself, vectorised, disagrees there with the
//! scalar `combine` on some half pairs. Either operand's result is accepted in that case.
//!
//! A tier this CPU (or this compiler) cannot run is skipped, with a line saying so.

use busbw_collectives::element::{
    bf16, combine, f16, reduce_inplace_simd, reduce_into_simd, Element, Simd, F8E4M3, F8E5M2,
};
use busbw_collectives::ReduceOp;

trait Bits: Element + std::fmt::Debug {
    fn from_raw(b: u64) -> Self;
    fn nan(self) -> bool {
        false
    }
}

macro_rules! bits_int {
    ($($t:ty),*) => {$(
        impl Bits for $t {
            fn from_raw(b: u64) -> Self {
                b as $t
            }
        }
    )*};
}
bits_int!(i8, u8, i32, u32, i64, u64);

macro_rules! bits_float {
    ($($t:ty, $from:expr);*) => {$(
        impl Bits for $t {
            fn from_raw(b: u64) -> Self {
                $from(b)
            }
            fn nan(self) -> bool {
                self.is_nan()
            }
        }
    )*};
}
bits_float!(
    f16, |b| f16::from_bits(b as u16);
    bf16, |b| bf16::from_bits(b as u16);
    f32, |b| f32::from_bits(b as u32);
    f64, f64::from_bits;
    F8E4M3, |b| F8E4M3(b as u8);
    F8E5M2, |b| F8E5M2(b as u8)
);

/// xorshift64: reproducible values of every bit pattern.
fn random(seed: u64, len: usize) -> Vec<u64> {
    let mut z = seed.max(1);
    (0..len)
        .map(|_| {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        })
        .collect()
}

/// Zeros, subnormals, the normal boundary, largest finite, infinities, signalling and quiet
/// NaNs of both signs, for each width's formats (read as the other formats they are ordinary
/// values).
const SPECIALS: &[u64] = &[
    0x0000,
    0x8000,
    0x0001,
    0x8001,
    0x03ff,
    0x0400,
    0x7bff,
    0xfbff,
    0x7c00,
    0xfc00,
    0x7c01,
    0x7d00,
    0x7e00,
    0xfe00,
    0x7fff,
    0xffff,
    0x3c00,
    0xbc00,
    0x007f,
    0x0080,
    0x7f7f,
    0xff7f,
    0x7f80,
    0xff80,
    0x7f81,
    0x7fc0,
    0xffc0,
    0x3f80,
    0xbf80,
    0x00,
    0x80,
    0x01,
    0x07,
    0x08,
    0x7e,
    0x7f,
    0xfe,
    0xff,
    0x7b,
    0x7c,
    0xfc,
    0x7d,
    0x38,
    0x3c,
    0x0000_0001,
    0x007f_ffff,
    0x0080_0000,
    0x7f7f_ffff,
    0x7f80_0000,
    0xff80_0000,
    0x7f80_0001,
    0x7fc0_0000,
    0xffc0_0000,
    0x3f80_0000,
    0x7ff0_0000_0000_0000,
    0xfff8_0000_0000_0000,
    0x7ff0_0000_0000_0001,
    0x0000_0000_0000_0001,
    0x7fef_ffff_ffff_ffff,
    0x3ff0_0000_0000_0000,
    0x8000_0000_0000_0000,
    0x8000_0000,
];

/// Whether `got` is what the portable path gives for `x op y`.
fn agrees<T: Bits>(op: ReduceOp, x: T, y: T, got: T) -> bool {
    let bits = got.to_bits_u64();
    bits == combine(op, x, y).to_bits_u64()
        || (x.nan()
            && y.nan()
            && !matches!(op, ReduceOp::Min | ReduceOp::Max)
            && bits == combine(op, y, x).to_bits_u64())
}

/// Runs every op at `simd` on `a` and `b`, in place and out of place, and checks each value.
fn check<T: Bits>(simd: Simd, what: &str, a: &[T], b: &[T]) {
    for op in ReduceOp::ALL {
        let mut inplace = a.to_vec();
        reduce_inplace_simd(simd, op, &mut inplace, b);
        let mut into = b.to_vec();
        reduce_into_simd(simd, op, &mut into, a, b);
        for (form, got) in [("in place", &inplace), ("out of place", &into)] {
            let bad = (0..a.len()).find(|&i| !agrees(op, a[i], b[i], got[i]));
            if let Some(i) = bad {
                let show = |x: T| format!("{x:?} ({:#x})", x.to_bits_u64());
                panic!(
                    "{simd} {} {op} {form}, {what}, index {i}: {} op {} = {}, portable {}",
                    T::DTYPE,
                    show(a[i]),
                    show(b[i]),
                    show(got[i]),
                    show(combine(op, a[i], b[i]))
                );
            }
        }
    }
}

/// Vector bodies, remainders, an empty call, and starts off the vector alignment; a longer
/// destination keeps the part beyond the sources untouched.
fn check_lengths<T: Bits>(simd: Simd) {
    let mut raw = random(T::DTYPE as u64 + 11, 2100);
    raw.splice(0..0, SPECIALS.iter().copied());
    let v: Vec<T> = raw.iter().map(|&b| T::from_raw(b)).collect();
    let (a, b) = v.split_at(v.len() / 2);
    for len in [0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000 + 3] {
        for start in [0, 1, 3] {
            let (x, y) = (&a[start..start + len], &b[start + 5..start + 5 + len]);
            check(simd, &format!("length {len} from {start}"), x, y);
        }
    }
    for op in ReduceOp::ALL {
        let mut d: Vec<T> = a[..70].to_vec();
        reduce_inplace_simd(simd, op, &mut d, &b[..65]);
        let mut e: Vec<T> = a[..70].to_vec();
        reduce_into_simd(simd, op, &mut e, &b[..65], &b[100..200]);
        let bits = |s: &[T]| s.iter().map(|x| x.to_bits_u64()).collect::<Vec<_>>();
        assert_eq!(bits(&d[65..]), bits(&a[65..70]), "{simd} {op} beyond src");
        assert_eq!(bits(&e[65..]), bits(&a[65..70]), "{simd} {op} beyond a");
    }
}

/// Each 16-bit pattern against each partner, the partners rotating across the vector lanes.
fn check_all_patterns<T: Bits>(simd: Simd) {
    let a: Vec<T> = (0..=u16::MAX as u64).map(T::from_raw).collect();
    let mut partners: Vec<u64> = SPECIALS.iter().map(|&b| b & 0xffff).collect();
    partners.extend(random(T::DTYPE as u64 + 1, 320));
    let partners: Vec<T> = partners.into_iter().map(T::from_raw).collect();
    for r in 0..partners.len() {
        let b: Vec<T> = (0..a.len())
            .map(|i| partners[(i + r) % partners.len()])
            .collect();
        check(simd, &format!("partner rotation {r}"), &a, &b);
    }
}

/// Every pair of fp8 values, in one call (pairs fall on every lane position).
fn check_all_pairs<T: Bits>(simd: Simd) {
    let a: Vec<T> = (0..1u64 << 16).map(|i| T::from_raw(i & 0xff)).collect();
    let b: Vec<T> = (0..1u64 << 16).map(|i| T::from_raw(i >> 8)).collect();
    check(simd, "all pairs", &a, &b);
}

/// Whether the test can run at `simd`; says why not.
fn runs(simd: Simd, test: &str) -> bool {
    if !simd.supported() {
        eprintln!(
            "SKIP {test}: this CPU or build has no {simd} tier (best: {})",
            Simd::best()
        );
    }
    simd.supported()
}

macro_rules! tier_tests {
    ($tier:ident, $simd:expr) => {
        mod $tier {
            use super::*;

            #[test]
            fn every_type_and_length_matches_portable() {
                if !runs($simd, "every_type_and_length_matches_portable") {
                    return;
                }
                check_lengths::<i8>($simd);
                check_lengths::<u8>($simd);
                check_lengths::<i32>($simd);
                check_lengths::<u32>($simd);
                check_lengths::<i64>($simd);
                check_lengths::<u64>($simd);
                check_lengths::<f16>($simd);
                check_lengths::<f32>($simd);
                check_lengths::<f64>($simd);
                check_lengths::<bf16>($simd);
                check_lengths::<F8E4M3>($simd);
                check_lengths::<F8E5M2>($simd);
            }

            #[test]
            fn every_bf16_pattern_matches_portable() {
                if runs($simd, "every_bf16_pattern_matches_portable") {
                    check_all_patterns::<bf16>($simd);
                }
            }

            #[test]
            fn every_f16_pattern_matches_portable() {
                if runs($simd, "every_f16_pattern_matches_portable") {
                    check_all_patterns::<f16>($simd);
                }
            }

            #[test]
            fn every_fp8_pair_matches_portable() {
                if runs($simd, "every_fp8_pair_matches_portable") {
                    check_all_pairs::<F8E4M3>($simd);
                    check_all_pairs::<F8E5M2>($simd);
                }
            }
        }
    };
}

tier_tests!(portable, Simd::Portable);
tier_tests!(avx2, Simd::Avx2);
tier_tests!(avx512, Simd::Avx512);
tier_tests!(avx512fp16, Simd::Avx512Fp16);

#[test]
fn the_active_tier_is_one_this_cpu_runs() {
    let active = Simd::active();
    assert!(active.supported(), "{active}");
    match std::env::var(busbw_collectives::element::SIMD_ENV) {
        Ok(v) => match v.parse::<Simd>() {
            Ok(want) => assert_eq!(active, want.min(Simd::best()), "BUSBW_SIMD={v}"),
            Err(_) => assert_eq!(active, Simd::best(), "unknown BUSBW_SIMD={v} is ignored"),
        },
        Err(_) => assert_eq!(active, Simd::best()),
    }
}
