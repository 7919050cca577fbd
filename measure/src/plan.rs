//! The checked plan of a run: what the sweep measures (sizes, types, ops, roots), how it
//! times and checks each cell, and what every rank must agree on before anything is
//! measured ([`Plan::fingerprint`]). The program turns its flags into one, refusing what a
//! user can get wrong with a message naming the flag; tests build one from
//! [`Plan::defaults`].

use crate::sizes;
use crate::specs::CollectiveSpec;
use busbw_collectives::select::Algo;
use busbw_collectives::{DataType, ReduceOp};
use busbw_reports::Step;
use busbw_transports::multi::TransportKind;
use std::time::Duration;

/// How per-rank times become the printed time (nccl-tests `-a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    Rank0,
    Mean,
    Min,
    Max,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub spec: &'static CollectiveSpec,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub step: Step,
    pub sizes: Vec<u64>,
    pub warmup_sizes: Vec<u64>,
    pub iters: u32,
    pub warmup_iters: u32,
    pub agg_iters: u32,
    pub check: u32,
    pub dtypes: Vec<DataType>,
    pub ops: Vec<ReduceOp>,
    /// `-r`: a root, or -1 for every rank in turn.
    pub root: i64,
    /// AllReduce algorithm (collectives without a choice ignore it).
    pub algo: Algo,
    /// `--algo auto` asked for by name: the table shows each row's choice in an `algo`
    /// column. Left to the default, auto chooses the same but the table stays nccl-tests'.
    pub algo_column: bool,
    /// `--transport`.
    pub transport: TransportKind,
    pub average: Average,
    /// 0: repeat until interrupted.
    pub cycles: u32,
    pub timeout: Duration,
    pub min_busbw: Option<f64>,
    pub corrupt_rank: Option<usize>,
    /// `--debug-fail-rank`: this rank fails on purpose at its first measured size.
    pub fail_rank: Option<usize>,
    /// `-t`: ranks (OS threads) per process, each driving `gpus` devices' worth of ranks.
    pub threads: u32,
    /// `-g`: 0 for host memory, else CUDA devices per thread, one rank each.
    pub gpus: u32,
    /// `--engine`: busbw's own algorithms, or NCCL's library on the device buffers.
    pub engine: Engine,
    /// `-I 1`: per-iteration columns, with `-K` leading iterations left out of them.
    pub per_iter: Option<u32>,
    /// `-C 1`, `-S 1`.
    pub cputime: bool,
    pub timestamps: bool,
    /// Whether each size is also measured in place (nccl-tests always does). Off only for
    /// sweeps whose rows nobody prints and who read the out-of-place column alone (`busbw
    /// tiers`' group sweeps): their rows then carry an empty in-place cell (time 0, `#wrong`
    /// N/A).
    pub in_place: bool,
    /// `-z`: 0-3, nccl-tests' blocking modes (see `harness::Blocking`).
    pub blocking: u8,
    /// `-u`: elements by which the send and receive buffers are shifted.
    pub unalign: u32,
    /// `--rotate`: the window the timed loop moves its buffers over.
    pub rotation: sizes::Rotation,
    /// `-M 1`: the memory usage line in the footer.
    pub memory_report: bool,
    /// `-p 1`: only the header line; busbw's ranks always initialise concurrently.
    pub parallel_init: bool,
    /// `NCCL_TESTS_SPLIT_MASK` / `NCCL_TESTS_SPLIT`: the job runs as concurrent groups.
    pub split: Option<Split>,
    /// What nccl-tests' cross-checks turned off, and flags that do not apply here: one line
    /// each, printed once before the run.
    pub notes: Vec<String>,
}

/// Who runs the collectives: busbw's own engine (ring, tree, ... over its transports), or
/// NCCL itself (`--engine nccl`), so that a row stands beside nccl-tests' on the library the
/// training job uses. busbw's harness, validation and reports are the same either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    #[default]
    Own,
    Nccl,
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::Own => "own",
            Engine::Nccl => "nccl",
        })
    }
}

/// nccl-tests' split of a job into groups that run at once, each its own communicator: a
/// process's group (its "color", the `Group` of its device lines) is its process index
/// combined with `n`. Operators bisect a cluster with it (`MOD2` pairs even and odd nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// `NCCL_TESTS_SPLIT_MASK=<hex>`, or `NCCL_TESTS_SPLIT=AND<n>` / `&<n>`.
    And(u64),
    /// `OR<n>` / `|<n>`.
    Or(u64),
    /// `MOD<n>` / `%<n>`.
    Mod(u64),
    /// `DIV<n>` / `/<n>`.
    Div(u64),
}

impl Split {
    /// From the environment, as nccl-tests reads it: `NCCL_TESTS_SPLIT_MASK` first.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Split>, String> {
        if let Some(mask) = get("NCCL_TESTS_SPLIT_MASK") {
            let t = mask.trim();
            let digits = t
                .strip_prefix("0x")
                .or_else(|| t.strip_prefix("0X"))
                .unwrap_or(t);
            return u64::from_str_radix(digits, 16)
                .map(|m| Some(Split::And(m)))
                .map_err(|_| {
                    format!(
                        "NCCL_TESTS_SPLIT_MASK={mask}: give a hexadecimal mask, e.g. 0x1 \
                         (even and odd processes) or 0x6"
                    )
                });
        }
        let Some(spec) = get("NCCL_TESTS_SPLIT") else {
            return Ok(None);
        };
        let bad = || {
            format!(
                "NCCL_TESTS_SPLIT={spec}: give AND<n>, OR<n>, MOD<n> or DIV<n> (or &, |, %, /), \
                 n decimal, 0x hex or 0b binary, e.g. MOD2 or DIV8"
            )
        };
        let t = spec.trim();
        let upper = t.to_ascii_uppercase();
        let (op, rest) = [
            ("AND", 3),
            ("&", 1),
            ("OR", 2),
            ("|", 1),
            ("MOD", 3),
            ("%", 1),
        ]
        .into_iter()
        .chain([("DIV", 3), ("/", 1)])
        .find(|(p, _)| upper.starts_with(p))
        .map(|(p, len)| (p, &t[len..]))
        .ok_or_else(bad)?;
        let n = parse_int(rest.trim()).ok_or_else(bad)?;
        Ok(Some(match op {
            "AND" | "&" => Split::And(n),
            "OR" | "|" => Split::Or(n),
            _ if n == 0 => {
                return Err(format!(
                    "NCCL_TESTS_SPLIT={spec}: {op} by 0 has no groups; give n > 0"
                ))
            }
            "MOD" | "%" => Split::Mod(n),
            _ => Split::Div(n),
        }))
    }

    /// The group of process `process`.
    pub fn color(self, process: usize) -> usize {
        let p = process as u64;
        (match self {
            Split::And(n) => p & n,
            Split::Or(n) => p | n,
            Split::Mod(n) => p % n,
            Split::Div(n) => p / n,
        }) as usize
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Split::And(n) => write!(f, "AND{n}"),
            Split::Or(n) => write!(f, "OR{n}"),
            Split::Mod(n) => write!(f, "MOD{n}"),
            Split::Div(n) => write!(f, "DIV{n}"),
        }
    }
}

/// nccl-tests' integers: decimal, `0x` hex, `0` octal, `0b` binary.
fn parse_int(s: &str) -> Option<u64> {
    let lower = s.to_ascii_lowercase();
    if let Some(b) = lower.strip_prefix("0b") {
        u64::from_str_radix(b, 2).ok()
    } else if let Some(h) = lower.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else if lower.len() > 1 && lower.starts_with('0') {
        u64::from_str_radix(&lower[1..], 8).ok()
    } else {
        lower.parse().ok()
    }
}

/// Largest `-u`: a shift is an offset into buffers padded by 8 bytes per element of it (the
/// widest type), so a typo of a huge count would only allocate memory for nothing.
pub const MAX_UNALIGN: i64 = 1 << 20;

/// Ranks one process may host (`-t × -g`). Each is an OS thread with its own communicator,
/// listener, store connections and buffers; far past any node's GPU count, it only catches a
/// typo before it turns into thousands of threads.
pub const MAX_RANKS_PER_PROCESS: usize = 256;
impl Plan {
    /// What the program runs with no flags (nccl-tests' defaults: 32 MiB once, 20 timed
    /// iterations after one warmup, float sum, one check), on `spec`.
    pub fn defaults(spec: &'static CollectiveSpec) -> Plan {
        let mb32 = 32 << 20;
        Plan {
            spec,
            min_bytes: mb32,
            max_bytes: mb32,
            step: Step::Factor(1),
            sizes: Vec::new(),
            warmup_sizes: Vec::new(),
            iters: 20,
            warmup_iters: 1,
            agg_iters: 1,
            check: 1,
            dtypes: vec![DataType::Float32],
            ops: vec![ReduceOp::Sum],
            root: 0,
            algo: if spec.algos { Algo::Auto } else { Algo::Ring },
            algo_column: false,
            transport: TransportKind::Auto,
            average: Average::Mean,
            cycles: 1,
            timeout: Duration::from_secs(300),
            min_busbw: None,
            corrupt_rank: None,
            fail_rank: None,
            threads: 1,
            gpus: 0,
            engine: Engine::Own,
            per_iter: None,
            cputime: false,
            timestamps: false,
            in_place: true,
            blocking: 0,
            unalign: 0,
            rotation: sizes::Rotation::DEFAULT,
            memory_report: false,
            parallel_init: false,
            split: None,
            notes: Vec::new(),
        }
        .with_sizes(mb32, mb32, 1 << 20, 1)
    }

    /// The sizes of `-b min -e max -i step_bytes -f factor` (a factor above 1 multiplies,
    /// else `step_bytes` adds), and the warmup's.
    pub fn with_sizes(mut self, min: u64, max: u64, step_bytes: u64, factor: u64) -> Plan {
        self.min_bytes = min;
        self.max_bytes = max;
        self.step = if factor > 1 {
            Step::Factor(factor)
        } else {
            Step::Bytes(step_bytes)
        };
        self.sizes = sizes::sweep(min, max, step_bytes, factor);
        self.warmup_sizes = sizes::warmup_sizes(min, max);
        self
    }

    /// Ranks each process hosts, one OS thread each: nccl-tests' threads × GPUs per thread.
    pub fn ranks_per_process(&self) -> usize {
        self.threads as usize * self.gpus.max(1) as usize
    }

    /// Roots to run for a communicator of `n` ranks.
    pub fn roots(&self, n: usize) -> Result<Vec<usize>, String> {
        if !self.spec.rooted {
            return Ok(vec![0]);
        }
        match usize::try_from(self.root) {
            Err(_) => Ok((0..n).collect()),
            Ok(r) if r < n => Ok(vec![r]),
            Ok(r) => Err(format!(
                "-r {r}: the job has {n} ranks (0..{}); give one of them, or -1 for all",
                n - 1
            )),
        }
    }

    /// What every rank must agree on, one `flag<TAB>value` per line; compared at rendezvous so
    /// that ranks started with different flags (or binaries) fail at once, naming the flags,
    /// instead of deadlocking mid-sweep.
    pub fn fingerprint(&self) -> String {
        let step = match self.step {
            Step::Factor(f) => format!("-f {f}"),
            Step::Bytes(b) => format!("-i {b}"),
        };
        let names = |v: &[String]| v.join(",");
        let dtypes: Vec<String> = self.dtypes.iter().map(|d| d.name().to_string()).collect();
        let ops: Vec<String> = self.ops.iter().map(|o| o.name().to_string()).collect();
        [
            ("busbw version", env!("CARGO_PKG_VERSION").to_string()),
            ("collective", self.spec.program.to_string()),
            ("-b/--minbytes", self.min_bytes.to_string()),
            ("-e/--maxbytes", self.max_bytes.to_string()),
            ("-f/--stepfactor, -i/--stepbytes", step),
            ("-n/--iters", self.iters.to_string()),
            ("-w/--warmup_iters", self.warmup_iters.to_string()),
            ("-m/--agg_iters", self.agg_iters.to_string()),
            ("-c/--check", self.check.to_string()),
            ("-d/--datatype", names(&dtypes)),
            ("-o/--op", names(&ops)),
            ("-r/--root", self.root.to_string()),
            ("--algo", format!("{:?}", self.algo)),
            ("--transport", self.transport.to_string()),
            ("-a/--average", format!("{:?}", self.average)),
            ("-N/--run_cycles", self.cycles.to_string()),
            ("-t/--nthreads", self.threads.to_string()),
            ("-g/--ngpus", self.gpus.to_string()),
            ("--engine", self.engine.to_string()),
            (
                "-I/--per_iter_timing, -K/--per_iter_skip",
                format!("{:?}", self.per_iter),
            ),
            ("-C/--report_cputime", self.cputime.to_string()),
            ("-S/--report_timestamps", self.timestamps.to_string()),
            ("-z/--blocking", self.blocking.to_string()),
            ("-u/--unalign", self.unalign.to_string()),
            ("--rotate", self.rotation.to_string()),
            ("-M/--memory", self.memory_report.to_string()),
            ("-p/--parallel_init", self.parallel_init.to_string()),
            ("NCCL_TESTS_SPLIT(_MASK)", format!("{:?}", self.split)),
        ]
        .iter()
        .map(|(k, v)| format!("{k}\t{v}"))
        .collect::<Vec<_>>()
        .join("\n")
    }
}

/// The flags on which two fingerprints differ: (flag, value in `mine`, value in `theirs`).
/// A line only one side has (another busbw version's fingerprint) counts as a difference.
pub fn fingerprint_diff(mine: &str, theirs: &str) -> Vec<(String, String, String)> {
    let parse = |f: &str| -> Vec<(String, String)> {
        f.lines()
            .map(|l| match l.split_once('\t') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (l.to_string(), String::new()),
            })
            .collect()
    };
    let (a, b) = (parse(mine), parse(theirs));
    let get = |v: &[(String, String)], k: &str| {
        v.iter()
            .find(|(key, _)| key == k)
            .map_or_else(|| "(not given)".to_string(), |(_, val)| val.clone())
    };
    let mut keys: Vec<String> = a.iter().map(|(k, _)| k.clone()).collect();
    for (k, _) in &b {
        if !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (get(&a, &k), get(&b, &k));
            (x != y).then_some((k, x, y))
        })
        .collect()
}
#[cfg(test)]
mod split_tests {
    use super::Split;

    fn split(k: &str, v: &str) -> Result<Option<Split>, String> {
        Split::from_env(|key| (key == k).then(|| v.to_string()))
    }

    #[test]
    fn nccl_tests_split_syntax_and_colors() {
        assert_eq!(split("X", ""), Ok(None));
        assert_eq!(
            split("NCCL_TESTS_SPLIT_MASK", "0x6"),
            Ok(Some(Split::And(6)))
        );
        assert_eq!(
            split("NCCL_TESTS_SPLIT_MASK", "ff"),
            Ok(Some(Split::And(255)))
        );
        assert_eq!(split("NCCL_TESTS_SPLIT", "MOD2"), Ok(Some(Split::Mod(2))));
        assert_eq!(
            split("NCCL_TESTS_SPLIT", "mod 0x4"),
            Ok(Some(Split::Mod(4)))
        );
        assert_eq!(split("NCCL_TESTS_SPLIT", "%3"), Ok(Some(Split::Mod(3))));
        assert_eq!(split("NCCL_TESTS_SPLIT", "/8"), Ok(Some(Split::Div(8))));
        assert_eq!(split("NCCL_TESTS_SPLIT", "DIV010"), Ok(Some(Split::Div(8))));
        assert_eq!(split("NCCL_TESTS_SPLIT", "&0b101"), Ok(Some(Split::And(5))));
        assert_eq!(split("NCCL_TESTS_SPLIT", "or1"), Ok(Some(Split::Or(1))));
        for bad in ["XOR2", "MOD", "MOD2x", "DIV0", "%0", ""] {
            let e = split("NCCL_TESTS_SPLIT", bad).unwrap_err();
            assert!(e.contains("NCCL_TESTS_SPLIT="), "{bad}: {e}");
        }
        assert!(split("NCCL_TESTS_SPLIT_MASK", "0xg").is_err());
        // Colors of processes 0..8.
        let colors = |s: Split| (0..8).map(|p| s.color(p)).collect::<Vec<_>>();
        assert_eq!(colors(Split::Mod(2)), [0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!(colors(Split::Div(4)), [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(colors(Split::And(6)), [0, 0, 2, 2, 4, 4, 6, 6]);
        assert_eq!(colors(Split::Or(1)), [1, 1, 3, 3, 5, 5, 7, 7]);
    }
}

#[cfg(test)]
mod fingerprint_tests {
    use super::fingerprint_diff;

    #[test]
    fn differences_name_the_flag_and_both_values() {
        let a = "busbw version\t0.1.0\n-n/--iters\t20\n-b/--minbytes\t8";
        let b = "busbw version\t0.2.0\n-n/--iters\t20\n-b/--minbytes\t64\nnew flag\tx";
        assert_eq!(
            fingerprint_diff(a, b),
            [
                ("busbw version".into(), "0.1.0".into(), "0.2.0".into()),
                ("-b/--minbytes".into(), "8".into(), "64".into()),
                ("new flag".into(), "(not given)".into(), "x".into()),
            ]
        );
        assert!(fingerprint_diff(a, a).is_empty());
    }
}
