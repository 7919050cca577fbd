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

/// How far the timed loop moves its buffers between operations (`--rotate`).
///
/// nccl-tests shifts iteration k by `bytes × (k mod ⌊maxBytes/bytes⌋)`, so the window a size
/// rotates over is the sweep's largest size: the same 2 MiB row runs from cache alone (`-b 2M
/// -e 2M`, one position) and from memory inside `-b 8 -e 16M` (eight positions, 16 MiB of
/// buffers per rank), and on a CPU with 4 MiB of L2 the two differ twofold. A window fixed
/// independently of `-e` makes a size measure the same wherever it runs; `max` keeps
/// nccl-tests' own rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotation {
    /// Rotate over this many bytes (0: never move the buffers).
    Window(u64),
    /// nccl-tests: over the sweep's largest buffer.
    Max,
}

impl Rotation {
    /// Twice the largest L2 of a current CPU core (4 MiB), so a size up to half of it cycles
    /// through memory no core keeps, yet small enough that the buffers it adds stay within
    /// the memory budget (3 × the largest buffer + 64 MiB) for a sweep of small sizes: two
    /// buffers of 8 MiB, with everything else a rank holds (16 MiB would pass it by 3 MiB:
    /// 71 MB peak for `--np 2 -b 8 -e 1M` on shared memory).
    pub const DEFAULT: Rotation = Rotation::Window(8 << 20);

    /// Bytes the buffers must hold for the window, beyond the sweep's own largest size.
    pub fn window_bytes(self) -> u64 {
        match self {
            Rotation::Window(w) => w,
            Rotation::Max => 0,
        }
    }

    /// How many `span`-sized positions the loop cycles through, given the buffers hold
    /// `room` of them.
    pub fn positions(self, span: usize, room: usize) -> usize {
        let room = room.max(1);
        match self {
            Rotation::Max => room,
            Rotation::Window(w) => usize::try_from(w)
                .unwrap_or(usize::MAX)
                .checked_div(span)
                .unwrap_or(1)
                .clamp(1, room),
        }
    }

    /// `--rotate`: `max`, or a size with nccl-tests' suffixes.
    pub fn parse(text: &str) -> Result<Rotation, String> {
        if text.trim().eq_ignore_ascii_case("max") {
            return Ok(Rotation::Max);
        }
        parse_size(text)
            .map(Rotation::Window)
            .map_err(|e| format!("{e}; or `max` for nccl-tests' window, the largest size"))
    }
}

impl std::fmt::Display for Rotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rotation::Window(w) => {
                match [(30, "G"), (20, "M"), (10, "K")]
                    .into_iter()
                    .find(|&(sh, _)| *w != 0 && w % (1u64 << sh) == 0)
                {
                    Some((sh, unit)) => write!(f, "{}{unit}", w >> sh),
                    None => write!(f, "{w}"),
                }
            }
            Rotation::Max => f.write_str("max"),
        }
    }
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

    #[test]
    fn rotation_window_is_independent_of_the_sweep() {
        let w = Rotation::Window(16 << 20);
        // 2 MiB: eight positions whether the buffers hold 2 MiB (alone, with the window
        // allocated) or 64 MiB (inside a larger sweep).
        assert_eq!(w.positions(2 << 20, 8), 8);
        assert_eq!(w.positions(2 << 20, 32), 8);
        // Sizes at or beyond the window stay put; never more positions than the room.
        assert_eq!(w.positions(16 << 20, 4), 1);
        assert_eq!(w.positions(64 << 20, 1), 1);
        assert_eq!(w.positions(8, 3), 3);
        assert_eq!(Rotation::Window(0).positions(8, 100), 1);
        // nccl-tests' rule: as many as the buffers hold.
        assert_eq!(Rotation::Max.positions(2 << 20, 8), 8);
        assert_eq!(Rotation::Max.positions(2 << 20, 0), 1);
        assert_eq!(Rotation::parse("max"), Ok(Rotation::Max));
        assert_eq!(Rotation::parse("4M"), Ok(Rotation::Window(4 << 20)));
        assert_eq!(Rotation::parse("0"), Ok(Rotation::Window(0)));
        assert!(Rotation::parse("lots").unwrap_err().contains("`max`"));
        assert_eq!(Rotation::DEFAULT.to_string(), "8M");
        assert_eq!(Rotation::Window(1536).to_string(), "1536");
        assert_eq!(Rotation::Window(3 << 30).to_string(), "3G");
        assert_eq!(Rotation::Window(0).to_string(), "0");
        for r in [Rotation::DEFAULT, Rotation::Max, Rotation::Window(1536)] {
            assert_eq!(Rotation::parse(&r.to_string()), Ok(r));
        }
    }
}
