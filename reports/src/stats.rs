//! Per-iteration statistics: percentiles from an HDR histogram, moments from the samples.
//!
//! Percentiles come from `hdrhistogram` (3 significant digits, the same resolution at 10 µs and
//! at 10 s) so that large iteration counts cost constant memory; min, max, mean and standard
//! deviation are exact because they are cheap to compute from the samples themselves.

use crate::run::IterStats;
use hdrhistogram::Histogram;

/// Largest value the histogram tracks: one hour in nanoseconds. Longer iterations saturate.
const MAX_NS: u64 = 3_600_000_000_000;

/// nccl-tests' `-I` summary of iteration times (its `computeIterStats`): exact order
/// statistics, p50 `sorted[n/2]`, p95/p99 by nearest rank, population standard deviation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NcclIterSummary {
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub stdev: f64,
    /// Percent; 0 when the mean is 0.
    pub cv_pct: f64,
}

impl NcclIterSummary {
    /// `None` without samples.
    pub fn of(times: &[f64]) -> Option<NcclIterSummary> {
        let mut v = times.to_vec();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let rank = |p: usize| v[(n * p).div_ceil(100).saturating_sub(1).min(n - 1)];
        let avg = v.iter().sum::<f64>() / n as f64;
        let stdev = (v.iter().map(|t| (t - avg) * (t - avg)).sum::<f64>() / n as f64).sqrt();
        Some(NcclIterSummary {
            min: v[0],
            max: v[n - 1],
            avg,
            p50: v[n / 2],
            p95: rank(95),
            p99: rank(99),
            stdev,
            cv_pct: if avg > 0.0 { stdev / avg * 100.0 } else { 0.0 },
        })
    }
}

impl IterStats {
    /// Statistics of `times_us` (one value per iteration); `None` without samples.
    /// `per_rank_times_us` is stored as given.
    pub fn from_samples(times_us: &[f64], per_rank_times_us: Vec<Vec<f64>>) -> Option<IterStats> {
        let finite: Vec<f64> = times_us.iter().copied().filter(|t| t.is_finite()).collect();
        if finite.is_empty() {
            return None;
        }
        let mut h = Histogram::<u64>::new_with_bounds(1, MAX_NS, 3).ok()?;
        for &t in &finite {
            let ns = (t * 1e3).round().clamp(1.0, MAX_NS as f64) as u64;
            h.saturating_record(ns);
        }
        let n = finite.len() as f64;
        let mean = finite.iter().sum::<f64>() / n;
        let var = finite.iter().map(|t| (t - mean) * (t - mean)).sum::<f64>() / n;
        let stdev = var.sqrt();
        let pct = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
        Some(IterStats {
            samples: finite.len(),
            min_us: finite.iter().copied().fold(f64::INFINITY, f64::min),
            max_us: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            mean_us: mean,
            p50_us: pct(0.50),
            p95_us: pct(0.95),
            p99_us: pct(0.99),
            stdev_us: stdev,
            cv_pct: if mean > 0.0 {
                stdev / mean * 100.0
            } else {
                0.0
            },
            times_us: times_us.to_vec(),
            per_rank_times_us,
        })
    }

    /// Iterations whose modified Z-score (median and MAD, Iglewicz–Hoaglin) exceeds 14.826,
    /// hyperfine's outlier rule: robust to the outliers themselves, unlike mean ± k·σ.
    pub fn outliers(&self) -> usize {
        let mut v: Vec<f64> = self
            .times_us
            .iter()
            .copied()
            .filter(|t| t.is_finite())
            .collect();
        if v.len() < 3 {
            return 0;
        }
        let med = median(&mut v);
        let mut dev: Vec<f64> = v.iter().map(|t| (t - med).abs()).collect();
        let mad = median(&mut dev);
        if mad <= 0.0 {
            return 0;
        }
        v.iter()
            .filter(|t| 0.6745 * (*t - med).abs() / mad > 14.826)
            .count()
    }

    /// First iteration's time over the median of the others (how much slower the first was).
    pub fn first_iteration_ratio(&self) -> Option<f64> {
        let (first, rest) = self.times_us.split_first()?;
        if rest.is_empty() {
            return None;
        }
        let mut rest = rest.to_vec();
        let med = median(&mut rest);
        (med > 0.0).then(|| first / med)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_moments() {
        let t: Vec<f64> = (1..=100).map(|i| i as f64).collect();
        let s = IterStats::from_samples(&t, vec![]).unwrap();
        assert_eq!(s.samples, 100);
        assert_eq!((s.min_us, s.max_us), (1.0, 100.0));
        assert!((s.mean_us - 50.5).abs() < 1e-9);
        assert!((s.p50_us - 50.0).abs() < 0.1, "{}", s.p50_us);
        assert!((s.p99_us - 99.0).abs() < 0.1, "{}", s.p99_us);
        assert!((s.cv_pct - 57.16).abs() < 0.01, "{}", s.cv_pct);
        assert!(IterStats::from_samples(&[], vec![]).is_none());
    }

    #[test]
    fn outliers_and_slow_first_iteration() {
        let mut t = vec![10.0, 10.5, 9.8, 10.1, 10.2, 9.9, 10.0];
        let s = IterStats::from_samples(&t, vec![]).unwrap();
        assert_eq!(s.outliers(), 0);
        assert!(s.first_iteration_ratio().unwrap() < 1.1);
        t[0] = 100.0;
        let s = IterStats::from_samples(&t, vec![]).unwrap();
        assert_eq!(s.outliers(), 1);
        assert!(s.first_iteration_ratio().unwrap() > 9.0);
    }
}
