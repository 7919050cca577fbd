//! C `printf` conversions re-implemented bit for bit.
//!
//! nccl-tests formats every number with glibc `printf`. Rust's `format!` rounds
//! the same way (correctly rounded, ties-to-even on the exact binary value) but
//! spells exponents, infinities and NaNs differently and has no `%g`. Parsers
//! written against nccl-tests output compare these strings literally, so every
//! spelling difference here would be a compatibility bug.

/// Significant digits used by a bare `%g` (C's default precision).
const G_PRECISION: i32 = 6;

/// Spelling of non-finite values shared by `%f`, `%e` and `%g` in glibc.
///
/// glibc prints the sign of a NaN (a runtime `0.0/0.0` on x86 yields a
/// negative NaN and prints as `-nan`), so the sign bit is honoured here too.
fn non_finite(value: f64) -> Option<String> {
    if value.is_nan() {
        Some(
            if value.is_sign_negative() {
                "-nan"
            } else {
                "nan"
            }
            .to_string(),
        )
    } else if value.is_infinite() {
        Some(if value < 0.0 { "-inf" } else { "inf" }.to_string())
    } else {
        None
    }
}

/// Right-aligns `s` in `width` bytes, never truncating (C `%*s`).
///
/// Counts bytes rather than chars because C does, so non-ASCII host or device
/// names line up exactly as they would under nccl-tests.
pub fn pad_left(s: &str, width: usize) -> String {
    let fill = width.saturating_sub(s.len());
    let mut out = String::with_capacity(s.len() + fill);
    out.push_str(&" ".repeat(fill));
    out.push_str(s);
    out
}

/// Splits Rust's `LowerExp` output (`"1.5e-3"`) into mantissa and exponent.
///
/// Rust always emits this shape for finite values; the fallback only keeps
/// the function total instead of panicking on an impossible input.
fn split_exp(s: &str) -> (&str, i32) {
    match s.split_once('e') {
        Some((mantissa, exp)) => (mantissa, exp.parse().unwrap_or(0)),
        None => (s, 0),
    }
}

/// Joins a mantissa and exponent the way C does: explicit sign, at least two
/// exponent digits (`1.2e+07`, `1e-05`).
fn c_exp_suffix(mantissa: &str, exp: i32) -> String {
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
}

/// C `%.<precision>f`.
pub fn c_f(value: f64, precision: usize) -> String {
    non_finite(value).unwrap_or_else(|| format!("{value:.precision$}"))
}

/// C `%.<precision>e`.
pub fn c_e(value: f64, precision: usize) -> String {
    if let Some(s) = non_finite(value) {
        return s;
    }
    let rust = format!("{value:.precision$e}");
    let (mantissa, exp) = split_exp(&rust);
    c_exp_suffix(mantissa, exp)
}

/// Removes trailing fractional zeros and a dangling point, as `%g` does
/// (it has no `#` flag in nccl-tests' format strings).
fn strip_fraction_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// C `%g`: six significant digits, fixed or exponent notation chosen by the
/// decimal exponent *after* rounding, trailing zeros removed.
///
/// The "Avg bus bandwidth" footer and the `#wrong` column use it, so large
/// error counts must read `1.04858e+06` exactly as nccl-tests prints them.
pub fn c_g(value: f64) -> String {
    if let Some(s) = non_finite(value) {
        return s;
    }
    let p = G_PRECISION;
    // The exponent must come from the rounded value: 999999.5 rounds to
    // 1e+06 and therefore switches to exponent notation.
    let exp = if value == 0.0 {
        0
    } else {
        let rounded = format!("{value:.prec$e}", prec = (p - 1) as usize);
        split_exp(&rounded).1
    };
    if (-4..p).contains(&exp) {
        let fixed = format!("{value:.prec$}", prec = (p - 1 - exp) as usize);
        strip_fraction_zeros(&fixed).to_string()
    } else {
        let rust = format!("{value:.prec$e}", prec = (p - 1) as usize);
        let (mantissa, exp) = split_exp(&rust);
        c_exp_suffix(strip_fraction_zeros(mantissa), exp)
    }
}

/// C `%<width>g`, e.g. the 6-wide `#wrong` column.
pub fn c_g_width(value: f64, width: usize) -> String {
    pad_left(&c_g(value), width)
}

/// nccl-tests `getFloatStr`: fit `value` into `width` columns, dropping
/// decimals as the integer part grows and falling back to exponent form.
///
/// Reproduced decision for decision (including the digit-counting loop that
/// treats every value below 1 as zero digits) because the chosen precision is
/// visible in the output: `1234.50` vs `1234.5` is a byte difference that a
/// column-diffing script would flag.
pub fn float_str(value: f64, width: usize) -> String {
    // C: for (uint64_t val = 1; value >= val; val *= 10) power++;
    // The finiteness guard stops the loop for +inf, where C would spin forever.
    let mut power: i64 = 0;
    let mut val = 1.0_f64;
    while value >= val && val.is_finite() {
        power += 1;
        val *= 10.0;
    }
    let w = i64::try_from(width).unwrap_or(i64::MAX);
    let body = if power < w - 2 {
        c_f(value, 2)
    } else if power < w - 1 {
        c_f(value, 1)
    } else if power < w + 1 {
        c_f(value, 0)
    } else if width >= 7 {
        c_e(value, 1)
    } else {
        c_e(value, 0)
    };
    pad_left(&body, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_matches_printf() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (-0.0, "-0"),
            (1.0, "1"),
            (0.5, "0.5"),
            (12.3456, "12.3456"),
            (1234567.0, "1.23457e+06"),
            (1048576.0, "1.04858e+06"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.00012345678, "0.000123457"),
            (100000.0, "100000"),
            (999999.0, "999999"),
            (999999.5, "1e+06"),
            (1e100, "1e+100"),
            (-2.5, "-2.5"),
            (-1234567.0, "-1.23457e+06"),
            (190.6, "190.6"),
            (123456.7, "123457"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (-f64::NAN, "-nan"),
        ];
        for &(v, want) in cases {
            assert_eq!(c_g(v), want, "%g of {v:e}");
        }
    }

    #[test]
    fn g_width_right_aligns_without_truncating() {
        assert_eq!(c_g_width(0.0, 6), "     0");
        assert_eq!(c_g_width(1048576.0, 6), "1.04858e+06");
    }

    #[test]
    fn e_uses_c_exponent_spelling() {
        assert_eq!(c_e(12345678.0, 1), "1.2e+07");
        assert_eq!(c_e(1.25e7, 1), "1.2e+07"); // tie rounds to even
                                               // 2.5e-3 is stored slightly above the tie, so it rounds up in C too.
        assert_eq!(c_e(2.5e-3, 0), "3e-03");
        assert_eq!(c_e(2.5, 0), "2e+00");
        assert_eq!(c_e(-0.0, 1), "-0.0e+00");
        assert_eq!(c_e(1e123, 0), "1e+123");
    }

    #[test]
    fn float_str_follows_get_float_str() {
        let cases: &[(f64, usize, &str)] = &[
            (12.34, 7, "  12.34"),
            (1234.5, 7, "1234.50"),
            (12345.6, 7, "12345.6"),
            (123456.7, 7, " 123457"),
            (1234567.8, 7, "1234568"),
            (12345678.0, 7, "1.2e+07"),
            (0.001, 6, "  0.00"),
            (0.0, 6, "  0.00"),
            (108.72, 6, "108.72"),
            (1234.5, 6, "1234.5"),
            (12345.4, 6, " 12345"),
            (123456.4, 6, "123456"),
            (1234567.0, 6, " 1e+06"),
            (0.125, 6, "  0.12"), // exact tie, half-to-even like glibc
            (0.375, 6, "  0.38"),
            (-1.5, 6, " -1.50"),
            (f64::NAN, 6, "   nan"),
            (f64::INFINITY, 7, "    inf"),
        ];
        for &(v, w, want) in cases {
            assert_eq!(float_str(v, w), want, "getFloatStr({v}, {w})");
        }
    }

    #[test]
    fn float_str_handles_degenerate_widths() {
        // No width leaves room for any digit, so C falls through to %*.0e.
        assert_eq!(float_str(5.0, 0), "5e+00");
        assert_eq!(float_str(0.5, 1), "0"); // %1.0f, exact tie to even
        assert_eq!(float_str(50.0, 1), "5e+01");
    }

    #[test]
    fn pad_left_counts_bytes_like_c() {
        assert_eq!(pad_left("ab", 4), "  ab");
        assert_eq!(pad_left("abcdef", 4), "abcdef");
        assert_eq!(pad_left("é", 3), " é");
    }
}
