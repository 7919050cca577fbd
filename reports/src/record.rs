//! The data a benchmark run produces, independent of how it is rendered.
//!
//! Keeping the record separate from the text table lets the same run feed the
//! nccl-tests-compatible text, JSON output or a test harness without each
//! sink re-deriving numbers; the types are serde-friendly for that reason.

use serde::{Deserialize, Serialize};

/// One participating device, as listed under "# Using devices".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Global rank (nccl-tests numbers these by world process, not by group).
    pub rank: usize,
    /// Communicator split colour.
    pub group: usize,
    pub pid: u32,
    /// Printed in full: truncating at the first '.' (as nccl-tests does)
    /// makes distinct nodes like `a.rack1` / `a.rack2` indistinguishable.
    pub hostname: String,
    pub device: i32,
    /// Bus id already formatted as `dddd:bb:dd`, e.g. `0000:07:00`.
    pub pci: String,
    pub name: String,
}

/// How message sizes grow between `min_bytes` and `max_bytes` (`-f` vs `-i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Multiply by this factor each step; printed `<n>(factor)`.
    Factor(u64),
    /// Add this many bytes each step; printed `<n>(bytes)`.
    Bytes(u64),
}

/// Everything printed before the first data row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunHeader {
    /// Binary name as nccl-tests spells it, e.g. `all_reduce_perf`.
    pub program: String,
    /// Whole first line after `"# "`, e.g.
    /// `nccl-tests version 2.19.6 busbw=0.1.0 transport=tcp`.
    pub version_line: String,
    pub nthreads: u32,
    pub ngpus: u32,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub step: Step,
    pub warmup_iters: u32,
    pub iters: u32,
    pub agg_iters: u32,
    pub validation: u32,
    pub graph: u32,
    pub unalign: u32,
    pub devices: Vec<DeviceInfo>,
    /// Labels of columns appended after nccl-tests' own (e.g. `algo` with `--algo auto`).
    /// Empty by default, which keeps the table byte-compatible with nccl-tests.
    #[serde(default)]
    pub extra_columns: Vec<String>,
    /// `-I 1`: per-iteration columns after each placement; the value is `-K`, the leading
    /// iterations their summary leaves out.
    #[serde(default)]
    pub per_iter: Option<u32>,
    /// `-C 1`: the time column is labelled `cputime`.
    #[serde(default)]
    pub cputime: bool,
    /// `-S 1`: each row ends with the time it was printed.
    #[serde(default)]
    pub timestamps: bool,
    /// `-z`: nccl-tests' blocking mode (0-3); 1-3 add a header line.
    #[serde(default)]
    pub blocking: u8,
    /// `-p 1`: the "Parallel Init Enabled" header line.
    #[serde(default)]
    pub parallel_init: bool,
    /// Where device bytes went (`-g`, `--engine nccl`): busbw's engine GPU to GPU, staged
    /// through host memory and why, or NCCL and its version; so that a staged figure is never
    /// read as a GPU figure. `None` for host memory, whose header stays nccl-tests' own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_path: Option<String>,
}

/// Measurements for one placement (out-of-place or in-place) of one size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Microseconds per operation.
    pub time_us: f64,
    /// GB/s (1e9 bytes per second).
    pub algbw: f64,
    /// GB/s, algbw scaled by the collective's bus factor.
    pub busbw: f64,
    /// Wrong elements summed over ranks; `None` when validation did not run
    /// (disabled, or unsupported such as in-place alltoall), printed `N/A`.
    pub wrong: Option<u64>,
}

/// One data line of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Total buffer bytes actually used after size rounding.
    pub size: u64,
    /// Element count passed to the collective.
    pub count: u64,
    pub dtype: String,
    /// Reduction name; `none` for non-reducing collectives.
    pub redop: String,
    /// Root rank, `-1` for rootless collectives.
    pub root: i64,
    pub out_of_place: Cell,
    pub in_place: Cell,
    /// Values of [`RunHeader::extra_columns`], in the same order.
    #[serde(default)]
    pub extra: Vec<String>,
}

/// Summary printed after the last data row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Footer {
    pub program: String,
    /// Number of result cells with at least one wrong element (not an
    /// element count), summed over threads and ranks.
    pub out_of_bounds: u64,
    /// Mean of every printed busbw value; see [`crate::busbw_average`].
    pub avg_busbw: f64,
    /// `NCCL_TESTS_MIN_BW` gate; `None` means the bandwidth is not checked.
    pub min_busbw: Option<f64>,
    /// Last transport/collective error, printed as `# error: ...`.
    pub error: Option<String>,
    /// `-M 1`: the memory usage line.
    #[serde(default)]
    pub memory: Option<MemoryUsage>,
}

/// nccl-tests' `-M` report: memory taken while joining the job, by the benchmark's buffers,
/// and during the collectives, in bytes, the largest over the job's processes (or devices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUsage {
    /// What was measured: `GPU` (device memory, free-memory deltas as nccl-tests takes them)
    /// or `Host` (resident memory of a process with host buffers).
    pub kind: String,
    pub initialization: i64,
    pub user_allocated: i64,
    pub collective: i64,
}

impl Footer {
    /// Whether the average passes the `NCCL_TESTS_MIN_BW` gate.
    ///
    /// nccl-tests allows 10% slack below the requested minimum so that normal
    /// run-to-run noise does not fail CI; `None` when no gate was set.
    /// A NaN average fails the gate rather than silently passing.
    pub fn bandwidth_ok(&self) -> Option<bool> {
        self.min_busbw.map(|min| self.avg_busbw >= 0.9 * min)
    }
}

/// Per-topology-tier results of a run (`busbw tiers`, issue 6).
///
/// A placeholder shape owned by the reports side until the tiers work lands its own types in
/// `tiers.rs`: every exporter, plot and `compare` reads tiers only through this struct, so
/// swapping it for the tiers module's type (or filling it from it) touches one place. It lives
/// in [`crate::run::RunRecord::tiers`] as an optional field, so records without tiers stay
/// valid and records with them stay readable by older readers that ignore unknown fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TiersRecord {
    pub tiers: Vec<TierRecord>,
}

/// One tier (e.g. "same node", "same rack", "same block", "cross block") measured as its own
/// sweep over the groups of ranks that share that tier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TierRecord {
    /// Tier name as the node labels define it, e.g. `rdma.rack`.
    pub name: String,
    /// Collective program that was run, e.g. `all_reduce_perf`.
    #[serde(default)]
    pub collective: String,
    /// How many groups of ranks ran concurrently at this tier.
    #[serde(default)]
    pub groups: usize,
    /// Expected link rate of this tier in GB/s when known; drawn as a reference line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_rate_gbps: Option<f64>,
    /// Measured points, one per size (slowest group's figures).
    #[serde(default)]
    pub rows: Vec<TierRow>,
    /// Pass/fail of this tier against its expectation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictRecord>,
}

/// One size of one tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TierRow {
    pub size: u64,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
}

/// A judgement with the reason for it, for a tier or for the whole run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VerdictRecord {
    pub pass: bool,
    /// One line a person can act on, e.g. "rack r7: busbw 41 GB/s < 0.8 x 100 GB/s".
    pub reason: String,
    /// The fabric verdict's findings, each with its kind (slow node, slow link, straggler,
    /// tier under threshold, wrong data): what JUnit and Prometheus carry one by one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<crate::tiers::Finding>,
}

/// Pairwise link measurements: `busbw[i][j]` between `nodes[i]` and `nodes[j]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairwiseRecord {
    /// Node (or rank) names, indexing both matrix axes.
    pub nodes: Vec<String>,
    /// Message size the matrix was measured at.
    #[serde(default)]
    pub size: u64,
    /// GB/s; `None` for pairs not measured (the diagonal, or a pair that failed).
    pub busbw: Vec<Vec<Option<f64>>>,
    /// Links judged slow, marked on the heatmap.
    #[serde(default)]
    pub slow: Vec<SlowLink>,
}

/// A pair flagged as slow, with the reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlowLink {
    pub a: usize,
    pub b: usize,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn footer(avg: f64, min: Option<f64>) -> Footer {
        Footer {
            program: "all_reduce_perf".into(),
            out_of_bounds: 0,
            avg_busbw: avg,
            min_busbw: min,
            error: None,
            memory: None,
        }
    }

    #[test]
    fn bandwidth_gate_allows_ten_percent_slack() {
        assert_eq!(footer(5.0, None).bandwidth_ok(), None);
        assert_eq!(footer(90.0, Some(100.0)).bandwidth_ok(), Some(true));
        assert_eq!(footer(89.9, Some(100.0)).bandwidth_ok(), Some(false));
        assert_eq!(footer(200.0, Some(100.0)).bandwidth_ok(), Some(true));
        assert_eq!(footer(f64::NAN, Some(1.0)).bandwidth_ok(), Some(false));
    }
}
