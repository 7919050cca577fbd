//! `--budget`: the gate ends inside a time budget.
//!
//! The sweeps (the whole job, then each tier's groups) cost what `-b`, `-e` and `-n` ask;
//! the pairwise rounds are what grows with the cluster, so they are what the budget sizes. A
//! probe round at a small size measures what a round costs (a fixed part: communicators,
//! the store; and a part per byte, from the round's slowest pair), and the rounds then run
//! at the largest message size at which the rounds wanted fit in what the sweeps left. What
//! the rounds measured, how many pairs of all and how tightly, is reported: the precision
//! the budget bought.

use crate::analysis::{mad, median, Measured};
use std::time::{Duration, Instant};

/// The probe round's message size.
pub const PROBE_SIZE: usize = 1 << 20;
/// The smallest size the rounds run at: below it a round measures latency, not bandwidth.
pub const MIN_SIZE: usize = 256 << 10;
/// Kept back from the budget for the verdict, the exports and the labels: seconds, and a
/// share of the budget.
const RESERVE_S: f64 = 0.5;
const RESERVE_SHARE: f64 = 0.05;
/// Rounds of the round robin the coverage phase is sized for at most (on a larger cluster
/// the budget buys what it can, at the smallest size).
const COVERAGE_ROUNDS: usize = 15;
/// Rounds an adaptive pairing needs when a fault or two are found: the first, a re-pairing,
/// a confirmation.
const ADAPTIVE_ROUNDS: usize = 3;

/// Seconds left of a budget of `total` started at `started`, less the reserve.
pub fn left(started: Instant, total: Duration) -> f64 {
    let t = total.as_secs_f64();
    t - started.elapsed().as_secs_f64() - RESERVE_S - RESERVE_SHARE * t
}

/// What one round costs: a fixed part, and a part per operation and byte.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundCost {
    pub fixed_s: f64,
    pub per_byte_s: f64,
}

impl RoundCost {
    /// From a probe round that lasted `wall_s` and ran `ops` operations of `size` bytes,
    /// its slowest pair taking `op_s` seconds per operation.
    pub fn from_probe(wall_s: f64, size: usize, ops: usize, op_s: f64) -> RoundCost {
        RoundCost {
            fixed_s: (wall_s - ops as f64 * op_s).max(0.0),
            per_byte_s: op_s / size.max(1) as f64,
        }
    }

    /// Seconds of a round of `ops` operations of `size` bytes.
    pub fn round_s(&self, size: usize, ops: usize) -> f64 {
        self.fixed_s + ops as f64 * size as f64 * self.per_byte_s
    }
}

/// Rounds a budget is sized for on `n` nodes: the round robin for the full schedule; the
/// adaptive rounds and then the round robin's (a small cluster gets its whole matrix).
pub fn rounds_wanted(n: usize, adaptive: bool) -> usize {
    let robin = n.saturating_sub(1) + n % 2;
    if adaptive {
        ADAPTIVE_ROUNDS + robin.min(COVERAGE_ROUNDS)
    } else {
        robin + 1
    }
}

/// The largest power-of-two size up to `max` at which `rounds` rounds of `ops` operations
/// take at most `left` seconds; [`MIN_SIZE`] (or `max`, if smaller) when none does.
pub fn size_for(cost: RoundCost, rounds: usize, ops: usize, left: f64, max: usize) -> usize {
    let floor = MIN_SIZE.min(max);
    let mut size = floor;
    let mut next = floor.next_power_of_two().max(floor);
    while next <= max {
        if cost.round_s(next, ops) * rounds as f64 > left {
            break;
        }
        size = next;
        next *= 2;
    }
    // `max` itself when it is not a power of two but fits.
    if size < max && next > max && cost.round_s(max, ops) * rounds as f64 <= left {
        size = max;
    }
    (size / 4) * 4
}

/// How tightly the links were measured: the median over tiers of each tier's median
/// absolute deviation over its median (healthy links only: a slow one is a finding, not
/// noise).
pub fn spread(measured: &[Measured]) -> f64 {
    let mut tiers: Vec<&str> = measured.iter().map(|m| m.tier.as_str()).collect();
    tiers.sort_unstable();
    tiers.dedup();
    let per: Vec<f64> = tiers
        .iter()
        .filter_map(|t| {
            let bw: Vec<f64> = measured
                .iter()
                .filter(|m| m.tier == *t)
                .map(|m| m.busbw)
                .collect();
            let med = median(&bw);
            let healthy: Vec<f64> = bw.into_iter().filter(|&b| b >= 0.75 * med).collect();
            let med = median(&healthy);
            (healthy.len() >= 2 && med > 0.0).then(|| mad(&healthy, med) / med)
        })
        .collect();
    median(&per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_gives_a_rounds_cost_and_the_size_that_fits() {
        // 1 MiB in 8.4 ms on the slowest pair (1 Gbit/s), 2 ops, a 0.1 s round.
        let op = 8.4e-3;
        let c = RoundCost::from_probe(0.1, 1 << 20, 2, op);
        assert!((c.fixed_s - (0.1 - 2.0 * op)).abs() < 1e-12);
        assert!((c.round_s(2 << 20, 2) - (c.fixed_s + 4.0 * op)).abs() < 1e-12);
        // 10 rounds of 6 ops in 8 s: 8/10 = 0.8 s a round, 0.0832 fixed, so 0.717 s of
        // data = 85 MiB over 6 ops: 14 MiB each, so 8 MiB (the power of two below).
        assert_eq!(size_for(c, 10, 6, 8.0, 64 << 20), 8 << 20);
        // A larger budget is capped by --pairwise-size.
        assert_eq!(size_for(c, 10, 6, 1e6, 64 << 20), 64 << 20);
        assert_eq!(size_for(c, 10, 6, 1e6, 3 << 20), 3 << 20);
        // Nothing fits: the smallest size (the rounds then stop when time runs out).
        assert_eq!(size_for(c, 10, 6, 0.5, 64 << 20), MIN_SIZE);
        // Rounds wanted: 8 nodes, adaptive then the 7 rounds of the round robin.
        assert_eq!(rounds_wanted(8, true), 3 + 7);
        assert_eq!(rounds_wanted(8, false), 8);
        assert_eq!(rounds_wanted(16384, true), 3 + COVERAGE_ROUNDS);
    }

    #[test]
    fn the_spread_is_the_links_deviation_within_their_tier() {
        let m = |a, tier: &str, busbw| Measured {
            a,
            b: a + 1,
            tier: tier.into(),
            busbw,
            samples: Vec::new(),
        };
        // Within 1% in one tier, 2% in the other, and a slow link that does not count.
        let v = [
            m(0, "x", 99.0),
            m(1, "x", 100.0),
            m(2, "x", 101.0),
            m(3, "x", 30.0),
            m(4, "y", 49.0),
            m(5, "y", 50.0),
            m(6, "y", 51.0),
        ];
        let s = spread(&v);
        assert!((s - 0.015).abs() < 1e-3, "{s}");
    }
}
