//! Rounding into the narrow binary float formats (IEEE half, OCP fp8), and widening back.
//!
//! The reduction kernels widen every narrow operand to `f32` and round every result back, so
//! these conversions are the kernels' inner loop. The `f32` paths are therefore written
//! without data-dependent branches (selects only), which lets the compiler vectorise the
//! kernel loops; the `half` crate's own per-value conversions check CPU features on every
//! call and run an order of magnitude slower. The `f64` path is the straightforward,
//! obviously correct one and serves as the reference the fast paths are tested against.
//!
//! All rounding is to nearest, ties to even, from the exact value.

/// Layout and special-value rules of one format (codes are the bits without the sign).
pub(crate) struct Format {
    /// Stored mantissa bits.
    pub man: u32,
    pub bias: i32,
    /// Position of the sign bit.
    pub sign_shift: u32,
    /// Largest finite magnitude code.
    pub max_finite: u32,
    /// What an overflowing magnitude becomes: infinity, or NaN where there is none.
    pub overflow: u32,
    /// The quiet NaN produced for NaN inputs (with the input's sign).
    pub nan: u32,
    /// Only the all-ones magnitude is NaN and there are no infinities (fp8 E4M3, "fn").
    pub finite_only: bool,
}

pub(crate) const F16: Format = Format {
    man: 10,
    bias: 15,
    sign_shift: 15,
    max_finite: 0x7bff,
    overflow: 0x7c00,
    nan: 0x7e00,
    finite_only: false,
};

/// `half`'s own `bf16::from_f64` drops the low 32 bits before rounding, so near-ties can go
/// the wrong way; this one rounds the exact value.
pub(crate) const BF16: Format = Format {
    man: 7,
    bias: 127,
    sign_shift: 15,
    max_finite: 0x7f7f,
    overflow: 0x7f80,
    nan: 0x7fc0,
    finite_only: false,
};

pub(crate) const E4M3: Format = Format {
    man: 3,
    bias: 7,
    sign_shift: 7,
    max_finite: 0x7e,
    overflow: 0x7f,
    nan: 0x7f,
    finite_only: true,
};

pub(crate) const E5M2: Format = Format {
    man: 2,
    bias: 15,
    sign_shift: 7,
    max_finite: 0x7b,
    overflow: 0x7c,
    nan: 0x7f,
    finite_only: false,
};

/// Rounds `x` to `f`, reading the `f64` bits so that `f32` and `f64` inputs alike round once.
pub(crate) fn encode_f64(x: f64, f: &Format) -> u32 {
    let bits = x.to_bits();
    let sign = ((bits >> 63) as u32) << f.sign_shift;
    let abs = bits & !(1u64 << 63);
    if abs > 0x7ff0_0000_0000_0000 {
        return f.nan | sign;
    }
    if abs == 0x7ff0_0000_0000_0000 {
        return f.overflow | sign;
    }
    let field = (abs >> 52) as i32;
    if field == 0 {
        // Zero or an f64 subnormal, far below half the smallest narrow subnormal.
        return sign;
    }
    let e = field - 1023;
    let sig = (abs & ((1u64 << 52) - 1)) | (1u64 << 52);
    let emin = 1 - f.bias;
    // Below the normal range the quantum stops shrinking: the value becomes subnormal.
    let e_eff = e.max(emin);
    let shift = 52 - f.man as i32 + (e_eff - e);
    if shift > 54 {
        // sig < 2^53, so sig / 2^shift < 1/2: rounds to zero.
        return sign;
    }
    let shift = shift as u32;
    let half = 1u64 << (shift - 1);
    let rem = sig & ((1u64 << shift) - 1);
    let mut q = sig >> shift;
    if rem > half || (rem == half && q & 1 == 1) {
        q += 1;
    }
    // For a normal value q is in [2^man, 2^(man+1)] and adding it to the exponent field
    // shifted by one carries a rounded-up mantissa into the exponent; for a subnormal q is
    // the mantissa itself (q == 2^man is the smallest normal, which encodes the same way).
    let mag = (((e_eff - emin) as u64) << f.man) + q;
    if mag > f.max_finite as u64 {
        return f.overflow | sign;
    }
    mag as u32 | sign
}

/// [`encode_f64`] for an `f32`, branch-free. Normal results round by integer addition on the
/// bits (the carry out of the mantissa bumps the exponent, as it should); subnormal results
/// let the FPU round, by adding a power of two whose ulp is the subnormal quantum.
#[inline(always)]
pub(crate) fn encode_f32(x: f32, f: &Format) -> u32 {
    let u = x.to_bits();
    let abs = u & 0x7fff_ffff;
    let sign = (u >> 31) << f.sign_shift;
    let shift = 23 - f.man;
    let odd = (abs >> shift) & 1;
    let rebias = ((127 - f.bias) as u32) << 23;
    let normal = abs
        .wrapping_sub(rebias)
        .wrapping_add((1 << (shift - 1)) - 1 + odd)
        >> shift;
    // 2^(1 - bias - man + 23): its ulp is the smallest subnormal of the format.
    let magic = f32::from_bits(((1 - f.bias - f.man as i32 + 23 + 127) as u32) << 23);
    let sub = (f32::from_bits(abs) + magic)
        .to_bits()
        .wrapping_sub(magic.to_bits());
    let min_normal = ((1 - f.bias + 127) as u32) << 23;
    let mag = if abs < min_normal { sub } else { normal };
    let mag = if mag > f.max_finite { f.overflow } else { mag };
    let mag = if abs > 0x7f80_0000 { f.nan } else { mag };
    mag | sign
}

/// `f32` bits of the narrow value `b` (every narrow value is exact in `f32`); a `const fn`
/// so fp8 decoding can be a table built at compile time.
pub(crate) const fn decode_bits(b: u32, f: &Format) -> u32 {
    let sign = ((b >> f.sign_shift) & 1) << 31;
    let mag = b & ((1 << f.sign_shift) - 1);
    let e = (mag >> f.man) as i32;
    let m = mag & ((1 << f.man) - 1);
    let all_ones = (1 << (f.sign_shift - f.man)) - 1;
    if f.finite_only {
        if mag == (1 << f.sign_shift) - 1 {
            return sign | 0x7fc0_0000;
        }
    } else if e == all_ones {
        return sign | if m == 0 { 0x7f80_0000 } else { 0x7fc0_0000 };
    }
    if e == 0 {
        if m == 0 {
            return sign;
        }
        // Subnormal m * 2^(1 - bias - man): normalise on m's top bit h.
        let h = 31 - m.leading_zeros();
        let exp = 1 - f.bias - f.man as i32 + h as i32;
        return sign | (((exp + 127) as u32) << 23) | ((m - (1 << h)) << (23 - h));
    }
    sign | (((e - f.bias + 127) as u32) << 23) | (m << (23 - f.man))
}

/// IEEE half to `f32`, branch-free: shift the exponent and mantissa into place and rebias;
/// infinities and NaN get the rest of the exponent range, subnormals are renormalised by the
/// FPU (subtracting the value that the rebias added).
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let shifted = (h & 0x7fff) << 13;
    let exp = shifted & 0x0f80_0000;
    let o = shifted + ((127 - 15) << 23);
    let inf_nan = o + ((128 - 16) << 23);
    let renorm = f32::from_bits(o + (1 << 23)) - f32::from_bits(113 << 23);
    let o = if exp == 0x0f80_0000 {
        inf_nan
    } else if exp == 0 {
        renorm.to_bits()
    } else {
        o
    };
    f32::from_bits(o | (h & 0x8000) << 16)
}

/// `f32` to bfloat16 bits, rounding to nearest even, without branches: adding `0x7fff` plus
/// the lowest kept bit carries into the kept half exactly when the dropped half is above one
/// half, or exactly one half with an odd kept half. NaN keeps its top payload and is made
/// quiet. Bit for bit what `half::bf16::from_f32` returns, but its NaN test and rounding are
/// branches that keep the kernel loops scalar (a third of memcpy's speed).
#[inline(always)]
pub(crate) fn bf16_from_f32(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    (if b & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

/// bfloat16 bits to `f32`: the kept half of an `f32`.
#[inline(always)]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_fast_path_matches_the_half_crate() {
        let check = |u: u32| {
            let x = f32::from_bits(u);
            assert_eq!(
                bf16_from_f32(x),
                half::bf16::from_f32(x).to_bits(),
                "{u:#010x}"
            );
        };
        for high in 0..(1u32 << 16) {
            for low in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                check(high << 16 | low);
            }
        }
        for u in [
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001,
            0xffff_ffff,
            0x7f7f_ffff,
        ] {
            check(u);
        }
        for b in 0..=u16::MAX {
            let want = half::bf16::from_bits(b).to_f32();
            if want.is_nan() {
                // `half` quiets signalling NaNs; widening as the GPU does keeps the bits.
                // Any arithmetic on either quiets it the same way.
                assert!(bf16_to_f32(b).is_nan(), "{b:#06x}");
                assert_eq!((bf16_to_f32(b) + 1.0).to_bits(), (want + 1.0).to_bits());
            } else {
                assert_eq!(bf16_to_f32(b).to_bits(), want.to_bits(), "{b:#06x}");
            }
        }
    }

    /// The f32 fast path against the f64 reference on every f32 whose rounding could matter:
    /// all sign/exponent/top-mantissa combinations (the rounding bit of every format sits at
    /// bit 13 or above) with low bits that exercise ties and near-ties.
    fn check_fast_path(f: &Format) {
        let lows = [
            0u32, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001, 0x2fff, 0x3000, 0x3001,
            0x3fff,
        ];
        for high in 0..(1u32 << 18) {
            for low in lows {
                let x = f32::from_bits(high << 14 | low);
                let want = encode_f64(x as f64, f);
                let got = encode_f32(x, f);
                if x.is_nan() {
                    assert_eq!(got, want, "NaN {:#010x}", x.to_bits());
                } else {
                    assert_eq!(got, want, "{x:e} = {:#010x}", x.to_bits());
                }
            }
        }
    }

    #[test]
    fn fast_f32_encoding_matches_reference() {
        check_fast_path(&F16);
        check_fast_path(&BF16);
        check_fast_path(&E4M3);
        check_fast_path(&E5M2);
    }

    /// The kernels round bf16 with `half`'s `from_f32` and scalars with `encode_f64`: they
    /// must agree.
    #[test]
    fn bf16_reference_matches_the_half_crate() {
        for high in 0..(1u32 << 18) {
            for low in [0u32, 1, 0x3fff, 0x2000] {
                let x = f32::from_bits(high << 14 | low);
                if x.is_nan() {
                    continue;
                }
                let want = half::bf16::from_f32(x).to_bits() as u32;
                assert_eq!(encode_f64(x as f64, &BF16), want, "{x:e}");
            }
        }
        // Just above a tie in bits that f64 has and half's from_f64 ignores.
        let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(encode_f64(x, &BF16), 0x3f81);
    }

    /// Every f32 bit pattern, for all three formats (a few minutes; run on demand with `--ignored`).
    #[test]
    #[ignore]
    fn fast_f32_encoding_matches_reference_exhaustively() {
        for f in [&F16, &BF16, &E4M3, &E5M2] {
            for u in 0..=u32::MAX {
                let x = f32::from_bits(u);
                assert_eq!(encode_f32(x, f), encode_f64(x as f64, f), "{u:#010x}");
            }
        }
        for u in 0..=u32::MAX {
            let x = f32::from_bits(u);
            assert_eq!(
                bf16_from_f32(x),
                half::bf16::from_f32(x).to_bits(),
                "{u:#010x}"
            );
        }
    }

    #[test]
    fn f16_matches_the_half_crate() {
        for b in 0..=u16::MAX {
            let want = half::f16::from_bits(b).to_f32();
            let got = f16_to_f32(b);
            if want.is_nan() {
                assert!(got.is_nan(), "{b:#06x}");
                assert!(
                    f32::from_bits(decode_bits(b as u32, &F16)).is_nan(),
                    "{b:#06x}"
                );
                continue;
            }
            assert_eq!(got.to_bits(), decode_bits(b as u32, &F16), "{b:#06x}");
            assert_eq!(got.to_bits(), want.to_bits(), "{b:#06x}");
            assert_eq!(encode_f32(got, &F16), b as u32, "round trip {b:#06x}");
            assert_eq!(
                encode_f64(got as f64, &F16),
                b as u32,
                "round trip {b:#06x}"
            );
        }
        // Rounding: every f32 around every half value, against half's own conversion.
        for b in 0..0x7c00u32 {
            let x = f16_to_f32(b as u16).to_bits();
            for d in [0u32, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000] {
                for y in [x.wrapping_add(d), x.wrapping_sub(d) & 0x7fff_ffff] {
                    let y = f32::from_bits(y);
                    if y.is_nan() {
                        continue;
                    }
                    let want = half::f16::from_f32(y).to_bits() as u32;
                    assert_eq!(encode_f32(y, &F16), want, "{y:e}");
                    assert_eq!(encode_f32(-y, &F16), want | 0x8000, "{y:e}");
                }
            }
        }
        assert_eq!(
            encode_f32(65520.0, &F16),
            0x7c00,
            "tie at the top rounds to infinity"
        );
        assert_eq!(encode_f32(65519.0, &F16), 0x7bff);
    }
}
