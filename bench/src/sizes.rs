//! Size arguments and the size sweep, with nccl-tests' semantics.

/// Parse a size as nccl-tests' `parsesize` does: a number (fractions allowed) with an
/// optional K, M or G suffix, binary multiples, case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => {
                    return Err(format!(
                    "invalid size '{text}': unknown suffix '{c}' (use K, M or G, binary multiples)"
                ))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid size '{text}': expected a number with an optional K/M/G suffix, e.g. 8, 64K, 1.5G"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "invalid size '{text}': must be a non-negative number"
        ));
    }
    let bytes = v * mult as f64;
    if bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("invalid size '{text}': too large"));
    }
    Ok(bytes as u64)
}

/// The sizes of one sweep: `min`, then ×`factor` (if > 1) or +`step`, while ≤ `max`.
pub fn sweep(min: u64, max: u64, step: u64, factor: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut size = min;
    while size <= max {
        out.push(size);
        let next = if factor > 1 {
            size.saturating_mul(factor)
        } else {
            size.saturating_add(step)
        };
        if next == size {
            break;
        }
        size = next;
    }
    out
}

/// Warmup sizes: always doubling from `min` to `max`, whatever `-f`/`-i` say (nccl-tests).
pub fn warmup_sizes(min: u64, max: u64) -> Vec<u64> {
    sweep(min, max, 0, 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_nccl_tests() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("256m").unwrap(), 256 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("0x10").ok(), None);
        assert!(parse_size("2T").unwrap_err().contains("suffix"));
        assert!(parse_size("abc").is_err());
        assert!(parse_size("-5").is_err());
    }

    #[test]
    fn sweeps() {
        assert_eq!(sweep(8, 128, 0, 4), vec![8, 32, 128]);
        assert_eq!(sweep(8, 100, 0, 4), vec![8, 32]);
        assert_eq!(sweep(10, 30, 10, 1), vec![10, 20, 30]);
        assert_eq!(sweep(5, 5, 0, 1), vec![5]);
        assert_eq!(sweep(0, 0, 0, 2), vec![0]);
        assert_eq!(warmup_sizes(8, 100), vec![8, 16, 32, 64]);
    }
}
