//! The versioned record of one run: what every machine-readable exporter, plot, `compare` and
//! `history` reads.
//!
//! One struct for all of them means a figure has exactly one derivation: the CSV, the
//! Prometheus file and the HTML page cannot disagree about a row. The schema carries a name
//! and a version (as NCCL versions its plugin ABI) so that a nightly archive of records stays
//! readable: readers accept their own version and older ones, and refuse newer ones with a
//! message instead of misreading them. Fields added later must be optional (`serde(default)`).
//!
//! Deliberately absent: the environment. nccl-tests' `-J` embeds all of `envp`, which leaks
//! tokens and passwords into artefacts that are uploaded and shared.

use crate::record::{DeviceInfo, Footer, PairwiseRecord, Row, Step, TiersRecord, VerdictRecord};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `schema` of every record this crate writes.
pub const SCHEMA: &str = "busbw-run";
/// Current `schema_version`. Bump it when a field changes meaning or becomes required.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub schema: String,
    pub schema_version: u32,
    pub versions: Versions,
    /// Binary name as nccl-tests spells it, e.g. `all_reduce_perf`.
    pub program: String,
    /// The command line, with secret values (`--job-token`) replaced by `***`.
    #[serde(default)]
    pub args: Vec<String>,
    /// RFC 3339, UTC.
    pub start_time: String,
    /// Unset while the run is in progress (or if it died): the file is then a partial run.
    #[serde(default)]
    pub end_time: Option<String>,
    /// False from the first write until the footer: a file whose writer died (a rank killed,
    /// a node lost, SIGTERM, a full disk) says so itself; `summary.error` gives the reason
    /// when the writer lived to record one. Records from before this field count as whole.
    #[serde(default = "whole")]
    pub complete: bool,
    pub plan: PlanRecord,
    pub world: WorldRecord,
    #[serde(default)]
    pub rows: Vec<RowRecord>,
    /// The footer; unset while the run is in progress.
    #[serde(default)]
    pub summary: Option<SummaryRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<TiersRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairwise: Option<PairwiseRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictRecord>,
    /// Everything `busbw tiers` measured, group by group and link by link; `tiers`,
    /// `pairwise` and `verdict` above are its summary in the shape every exporter reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_report: Option<crate::tiers::TierReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    pub busbw: String,
    /// The nccl-tests release whose semantics the figures reproduce.
    pub nccl_tests: String,
}

/// The checked plan: what was asked for, so two records can be told comparable or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRecord {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub step: Step,
    pub warmup_iters: u32,
    pub iters: u32,
    pub agg_iters: u32,
    pub check: u32,
    pub dtypes: Vec<String>,
    pub ops: Vec<String>,
    pub root: i64,
    /// Algorithm asked for (`ring`, `tree`, `auto`); `None` for collectives without a choice.
    #[serde(default)]
    pub algo: Option<String>,
    /// Cross-rank time aggregation (`-a`): `rank0`, `mean`, `min` or `max`.
    pub average: String,
    pub cycles: u32,
    pub timeout_s: u64,
    #[serde(default)]
    pub min_busbw: Option<f64>,
    /// `--link-rate`, GB/s: drawn as a reference line and checked by the warnings.
    #[serde(default)]
    pub link_rate_gbps: Option<f64>,
    /// `-K`: leading iterations the per-iteration summaries leave out (the times keep them).
    #[serde(default)]
    pub per_iter_skip: u32,
    /// `-C 1`: the time is nccl-tests' `cputime` (its JSON key `cpu_time`).
    #[serde(default)]
    pub cputime: bool,
    /// `-z`: nccl-tests' blocking mode, 0-3.
    #[serde(default)]
    pub blocking: u8,
    /// `-u`: elements the buffers were shifted by.
    #[serde(default)]
    pub unalign: u32,
    /// `--rotate`: the window the timed loop moved its buffers over (`16M`, `max`), which
    /// decides whether small sizes ran from cache. Absent from nccl-tests' records and from
    /// busbw's before the flag existed, both of which rotated as `max` does.
    #[serde(default)]
    pub rotate: Option<String>,
    /// `-p 1`.
    #[serde(default)]
    pub parallel_init: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorldRecord {
    pub ranks: usize,
    /// Distinct host names, in rank order of first appearance.
    pub hosts: Vec<String>,
    /// Node labels per host (topology labels such as `rdma.rack`), when discovered.
    #[serde(default)]
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Transports in use (`tcp`, `shm`, `inproc`, or `auto` for the per-peer choice).
    pub transports: Vec<String>,
    pub devices: Vec<DeviceInfo>,
}

/// One row of the table with everything measured for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowRecord {
    pub size: u64,
    pub count: u64,
    pub dtype: String,
    pub redop: String,
    /// `-1` for rootless collectives.
    pub root: i64,
    /// Algorithm that ran this row, for collectives that have a choice.
    #[serde(default)]
    pub algo: Option<String>,
    pub out_of_place: CellRecord,
    pub in_place: CellRecord,
}

/// One placement of one row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    /// Microseconds per operation, combined across ranks as `-a` says (the table's figure).
    pub time_us: f64,
    /// Fastest and slowest rank's own mean: a wide spread points at a straggler.
    pub time_min_us: f64,
    pub time_max_us: f64,
    /// GB/s (1e9 B/s).
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements summed over ranks; `None` when not validated (the table's `N/A`).
    pub wrong: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<IterStats>,
}

/// Per-iteration statistics of one cell.
///
/// An iteration's time is the slowest rank's time for it (nccl-tests' `-I` convention: the
/// job waits for its slowest member), divided by `-m` so it is per operation like `time_us`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterStats {
    pub samples: usize,
    pub min_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub stdev_us: f64,
    /// Coefficient of variation, percent.
    pub cv_pct: f64,
    /// Every iteration, in order.
    pub times_us: Vec<f64>,
    /// Each rank's own iteration times (`[rank][iteration]`), for straggler analysis; empty
    /// when the job was too large to gather them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_rank_times_us: Vec<Vec<f64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRecord {
    /// Result cells with at least one wrong element.
    pub out_of_bounds: u64,
    pub avg_busbw: f64,
    #[serde(default)]
    pub min_busbw: Option<f64>,
    /// Whether the `--min-busbw` gate passed; `None` when there was no gate.
    #[serde(default)]
    pub bandwidth_ok: Option<bool>,
    #[serde(default)]
    pub error: Option<String>,
}

impl SummaryRecord {
    pub fn from_footer(f: &Footer) -> Self {
        SummaryRecord {
            out_of_bounds: f.out_of_bounds,
            avg_busbw: f.avg_busbw,
            min_busbw: f.min_busbw,
            bandwidth_ok: f.bandwidth_ok(),
            error: f.error.clone(),
        }
    }

    /// No wrong data, the gate (if any) passed, no error.
    pub fn ok(&self) -> bool {
        self.out_of_bounds == 0 && self.bandwidth_ok != Some(false) && self.error.is_none()
    }
}

/// What the harness knows about one placement beyond the table's [`crate::Cell`].
#[derive(Debug, Clone, PartialEq)]
pub struct CellDetail {
    pub time_min_us: f64,
    pub time_max_us: f64,
    pub iterations: Option<IterStats>,
}

/// A finished row with its details, as handed to [`crate::Sink::measured`].
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub row: Row,
    pub out_of_place: CellDetail,
    pub in_place: CellDetail,
    /// The algorithm the row ran, when the run chose per size without showing it in the
    /// table (AllReduce without `--algo`): the record keeps what the table leaves out.
    pub algo: Option<String>,
}

impl RowRecord {
    /// `extra_columns` names the row's extra values (the header's); the algorithm the row
    /// says it ran wins, then an `algo` column, then the run's `default_algo`.
    pub fn from_measured(
        m: &Measured,
        extra_columns: &[String],
        default_algo: Option<&str>,
    ) -> Self {
        let r = &m.row;
        let algo = m
            .algo
            .clone()
            .or_else(|| {
                let i = extra_columns.iter().position(|c| c == "algo")?;
                r.extra.get(i).cloned()
            })
            .or_else(|| default_algo.map(String::from));
        let cell = |c: &crate::Cell, d: &CellDetail| CellRecord {
            time_us: c.time_us,
            time_min_us: d.time_min_us,
            time_max_us: d.time_max_us,
            algbw: c.algbw,
            busbw: c.busbw,
            wrong: c.wrong,
            iterations: d.iterations.clone(),
        };
        RowRecord {
            size: r.size,
            count: r.count,
            dtype: r.dtype.clone(),
            redop: r.redop.clone(),
            root: r.root,
            algo,
            out_of_place: cell(&r.out_of_place, &m.out_of_place),
            in_place: cell(&r.in_place, &m.in_place),
        }
    }

    /// The two placements with their names, in table order.
    pub fn cells(&self) -> [(&'static str, &CellRecord); 2] {
        [
            ("out_of_place", &self.out_of_place),
            ("in_place", &self.in_place),
        ]
    }
}

/// Why a file could not be read as a run record.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON ({source}); give a file written by --export-json")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error(
        "{path} looks like nccl-tests -J output (version {version}) but cannot be read: {msg}"
    )]
    NcclTests {
        path: String,
        version: i64,
        msg: String,
    },
    #[error("{path} is not a busbw run record (no \"schema\": \"{SCHEMA}\"); give a file written by --export-json")]
    NotARun { path: String },
    #[error(
        "{path} has schema version {found}, newer than this busbw reads ({SCHEMA_VERSION}); \
         use a newer busbw"
    )]
    TooNew { path: String, found: u32 },
    #[error("{path} is a busbw run record but malformed: {source}")]
    Malformed {
        path: String,
        source: serde_json::Error,
    },
}

/// What `busbw compare`/`report` do with a file a user hands them, on arbitrary bytes: parse
/// it (busbw record or nccl-tests `-J`) and, when it parses, compare it with itself. The fuzz
/// targets' entry point (`fuzz/`, and its stable twin in the JSON exporter's tests).
#[doc(hidden)]
pub fn fuzz_load(bytes: &[u8]) {
    if let Ok(r) = RunRecord::from_slice(bytes, "fuzz.json") {
        let _ = crate::compare::compare(&r, &r, 5.0);
    }
}

fn whole() -> bool {
    true
}

impl RunRecord {
    /// Reads a record written by `--export-json`, saying precisely what is wrong otherwise.
    pub fn load(path: &std::path::Path) -> Result<RunRecord, LoadError> {
        let p = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Io {
            path: p.clone(),
            source,
        })?;
        Self::from_slice(&bytes, &p)
    }

    /// As [`RunRecord::load`], from bytes; `path` only names the source in errors.
    pub fn from_slice(bytes: &[u8], path: &str) -> Result<RunRecord, LoadError> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|source| LoadError::Json {
                path: path.into(),
                source,
            })?;
        if v.get("schema").and_then(|s| s.as_str()) != Some(SCHEMA) {
            if let (Some(version), Some(_)) =
                (v.get("version").and_then(|x| x.as_i64()), v.get("results"))
            {
                return crate::export::nccl_json::import(&v).map_err(|msg| LoadError::NcclTests {
                    path: path.into(),
                    version,
                    msg,
                });
            }
            return Err(LoadError::NotARun { path: path.into() });
        }
        let found = v
            .get("schema_version")
            .and_then(|x| x.as_u64())
            .unwrap_or(0) as u32;
        if found > SCHEMA_VERSION {
            return Err(LoadError::TooNew {
                path: path.into(),
                found,
            });
        }
        serde_json::from_value(v).map_err(|source| LoadError::Malformed {
            path: path.into(),
            source,
        })
    }

    /// Host names in rank order of first appearance.
    pub fn hosts_of(devices: &[DeviceInfo]) -> Vec<String> {
        let mut hosts: Vec<String> = Vec::new();
        for d in devices {
            if !hosts.contains(&d.hostname) {
                hosts.push(d.hostname.clone());
            }
        }
        hosts
    }

    /// Collective name without the `_perf` suffix (`all_reduce`), for labels and titles.
    pub fn collective(&self) -> &str {
        self.program.strip_suffix("_perf").unwrap_or(&self.program)
    }
}
