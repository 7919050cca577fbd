//! `alltoallv_perf`: nccl-tests' AlltoAll with a size per pair of ranks. By default a
//! generated pattern (`NCCL_TESTS_ALLTOALLV_SPREAD`, 0 uniform to 1 distance-weighted: more
//! bytes to ranks further away in rank order, every rank sending and receiving the same
//! total); with `NCCL_TESTS_ALLTOALLV_MATRIX_FILE`, the bytes each rank sends each other rank
//! (`_MATRIX_SCALE` multiplies them). Every size is rounded down to 16 bytes, as nccl-tests
//! does. algbw is the busiest rank's bytes over the time.

use super::data::{nil, rank_seed};
use super::{Buf, CollectiveSpec, Counts, DataCtx, Redop};
use busbw_collectives as coll;
use busbw_collectives::DataType;
use std::ops::Range;
use std::sync::OnceLock;

/// Where the per-pair sizes come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Pattern {
    Generated {
        spread: f64,
    },
    Matrix {
        file: String,
        scale: f64,
        dim: usize,
        bytes: Vec<usize>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub pattern: Pattern,
    /// `NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY=1`: a line per rank under each row.
    pub print_summary: bool,
}

/// A number as nccl-tests reads these variables: the whole value or nothing.
fn number(v: Option<String>) -> Option<f64> {
    v?.trim().parse::<f64>().ok().filter(|x| x.is_finite())
}

impl Config {
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let print_summary = get("NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY")
            .and_then(|v| v.trim().parse::<i64>().ok())
            .is_some_and(|v| v != 0);
        let pattern = match get("NCCL_TESTS_ALLTOALLV_MATRIX_FILE") {
            Some(file) => {
                let scale = number(get("NCCL_TESTS_ALLTOALLV_MATRIX_SCALE"))
                    .unwrap_or(1.0)
                    .max(0.0);
                let text = std::fs::read_to_string(&file).map_err(|e| {
                    format!("NCCL_TESTS_ALLTOALLV_MATRIX_FILE={file}: cannot read it: {e}")
                })?;
                let (dim, bytes) = parse_matrix(&text, scale)
                    .map_err(|m| format!("NCCL_TESTS_ALLTOALLV_MATRIX_FILE={file}: {m}"))?;
                Pattern::Matrix {
                    file,
                    scale,
                    dim,
                    bytes,
                }
            }
            None => Pattern::Generated {
                spread: number(get("NCCL_TESTS_ALLTOALLV_SPREAD"))
                    .unwrap_or(1.0)
                    .clamp(0.0, 1.0),
            },
        };
        Ok(Config {
            pattern,
            print_summary,
        })
    }

    /// Bytes rank `i` sends rank `j` in a job of `n` when the size asks for `total` bytes
    /// per rank (generated pattern), 16-byte aligned.
    pub fn peer_bytes(&self, i: usize, j: usize, n: usize, total: usize) -> usize {
        let b = match &self.pattern {
            Pattern::Matrix { dim, bytes, .. } => return bytes[i * dim + j],
            Pattern::Generated { .. } if n == 1 => total,
            Pattern::Generated { spread } => {
                let distance = (j + n - i) % n;
                let sum = (n * (n - 1) / 2) as f64;
                let uniform = total as f64 / n as f64;
                let weighted = distance as f64 * total as f64 / sum;
                ((1.0 - spread) * uniform + spread * weighted) as usize
            }
        };
        b & !15
    }

    /// What rank `r` sends to and receives from each rank.
    pub fn row_col(&self, r: usize, n: usize, total: usize) -> (Vec<usize>, Vec<usize>) {
        let sends = (0..n).map(|j| self.peer_bytes(r, j, n, total)).collect();
        let recvs = (0..n).map(|j| self.peer_bytes(j, r, n, total)).collect();
        (sends, recvs)
    }

    /// A usage error when the job is larger than the matrix.
    pub fn check_ranks(&self, n: usize) -> Result<(), String> {
        match &self.pattern {
            Pattern::Matrix { file, dim, .. } if *dim < n => Err(format!(
                "NCCL_TESTS_ALLTOALLV_MATRIX_FILE={file}: the job has {n} ranks but the matrix \
                 is {dim}×{dim}; give a row and a column for every rank"
            )),
            _ => Ok(()),
        }
    }
}

/// A square, whitespace-separated matrix of non-negative byte counts, scaled and rounded
/// down to 16 bytes.
fn parse_matrix(text: &str, scale: f64) -> Result<(usize, Vec<usize>), String> {
    let mut rows: Vec<Vec<usize>> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut row = Vec::new();
        for (j, w) in line.split_whitespace().enumerate() {
            let v: f64 = w
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    format!("row {i} column {j}: '{w}' is not a non-negative number of bytes")
                })?;
            let scaled = v * scale;
            if scaled >= usize::MAX as f64 {
                return Err(format!("row {i} column {j}: {v} × {scale} overflows"));
            }
            row.push(scaled as usize & !15);
        }
        if !row.is_empty() {
            if let Some(first) = rows.first() {
                if first.len() != row.len() {
                    return Err(format!(
                        "row {i} has {} columns where the first has {}",
                        row.len(),
                        first.len()
                    ));
                }
            }
            rows.push(row);
        }
    }
    let dim = rows.len();
    if dim == 0 {
        return Err("the matrix is empty".into());
    }
    if rows[0].len() != dim {
        return Err(format!(
            "the matrix must be square, got {dim}×{}",
            rows[0].len()
        ));
    }
    Ok((dim, rows.concat()))
}

/// The process's configuration; the descriptor's `prepare` reads it first, so a bad one is a usage error
/// before any rank starts and the descriptor's functions below never see one.
pub fn config() -> Result<&'static Config, String> {
    static CONFIG: OnceLock<Result<Config, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| Config::from_env(|k| std::env::var(k).ok()))
        .as_ref()
        .map_err(Clone::clone)
}

fn cfg() -> &'static Config {
    static UNIFORM: Config = Config {
        pattern: Pattern::Generated { spread: 0.0 },
        print_summary: false,
    };
    config().unwrap_or(&UNIFORM)
}

/// Bytes per rank the generated pattern spreads for a row of `count` elements per peer.
fn total(ctx_count: usize, dtype: DataType, n: usize) -> usize {
    ctx_count * n * dtype.size()
}

fn counts(bytes: u64, dtype: DataType, n: usize) -> Counts {
    let c = cfg();
    let ts = dtype.size();
    let count = match c.pattern {
        Pattern::Generated { .. } => super::data::per_rank(bytes, dtype, n),
        Pattern::Matrix { .. } => 0,
    };
    let t = total(count, dtype, n);
    let (mut send, mut recv) = (0, 0);
    // Generated patterns are balanced: rank 0 stands for every rank.
    let ranks = match c.pattern {
        Pattern::Generated { .. } => 1,
        Pattern::Matrix { .. } => n,
    };
    for r in 0..ranks {
        let (s, v) = c.row_col(r, n, t);
        send = send.max(s.iter().map(|b| b / ts).sum::<usize>());
        recv = recv.max(v.iter().map(|b| b / ts).sum::<usize>());
    }
    Counts {
        count,
        send_bytes: send * ts,
        recv_bytes: recv * ts,
    }
}

fn checked(ctx: &DataCtx) -> Range<usize> {
    let t = total(ctx.counts.count, ctx.dtype, ctx.nranks);
    let (_, recvs) = cfg().row_col(ctx.rank, ctx.nranks, t);
    0..recvs.iter().sum()
}

/// The per-rank lines of `NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY`, for a row timed at `secs`.
pub fn summary(ctx: &DataCtx, secs: f64) -> Vec<String> {
    let c = cfg();
    if !c.print_summary {
        return Vec::new();
    }
    let (n, t) = (ctx.nranks, total(ctx.counts.count, ctx.dtype, ctx.nranks));
    let mut lines = vec![match &c.pattern {
        Pattern::Generated { spread } => format!(
            "# NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY: mode=generated nranks={n} total_bytes={t} \
             spread={spread:.3} time_usec={:.2}",
            secs * 1e6
        ),
        Pattern::Matrix { dim, scale, .. } => format!(
            "# NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY: mode=matrix nranks={n} matrix_dim={dim} \
             scale={scale:.3} time_usec={:.2}",
            secs * 1e6
        ),
    }];
    for r in 0..n {
        let (s, v) = c.row_col(r, n, t);
        let (s, v): (usize, usize) = (s.iter().sum(), v.iter().sum());
        let alg = s.max(v) as f64 / 1e9 / secs;
        let bus = alg * (n as f64 - 1.0) / n as f64;
        lines.push(format!(
            "#   rank={r} send_bytes={s} recv_bytes={v} alg_bw={alg:.2} bus_bw={bus:.2}"
        ));
    }
    lines
}

pub static ALLTOALLV: CollectiveSpec = CollectiveSpec {
    program: "alltoallv_perf",
    redop: Redop::Fixed("none"),
    rooted: false,
    algos: false,
    counts,
    alg_bytes: |c, _n| c.size() as f64,
    busbw_factor: |n| (n as f64 - 1.0) / n as f64,
    init: |ctx, f| {
        let (n, r, ts) = (ctx.nranks, ctx.rank, ctx.dtype.size());
        let t = total(ctx.counts.count, ctx.dtype, n);
        let (sends, recvs) = cfg().row_col(r, n, t);
        let to = if ctx.in_place { Buf::Recv } else { Buf::Send };
        nil(f, to, 0, sends.iter().sum(), rank_seed(ctx.seed, r), 0);
        if f.has_expected() {
            // Block from `src` is the part of its send stream addressed to this rank.
            let mut at = 0;
            for (src, &len) in recvs.iter().enumerate() {
                let first: usize = (0..r).map(|k| cfg().peer_bytes(src, k, n, t) / ts).sum();
                if len > 0 {
                    nil(f, Buf::Expected, at, len, rank_seed(ctx.seed, src), first);
                }
                at += len;
            }
        }
    },
    checked,
    // nccl-tests runs in place without checking it (its alltoallv has no in-place form).
    checks_in_place: false,
    run: |comm, send, recv, space, ctx| {
        let d = super::data(ctx, send, recv, space);
        let t = total(ctx.counts.count, ctx.dtype, ctx.nranks);
        let (sends, recvs) = cfg().row_col(ctx.rank, ctx.nranks, t);
        coll::alltoallv(comm, d, &sends, &recvs)
    },
    nccl: |c, ctx| {
        let t = total(ctx.counts.count, ctx.dtype, ctx.nranks);
        let (sends, recvs) = cfg().row_col(ctx.rank, ctx.nranks, t);
        super::nccl::alltoallv(c, ctx, &sends, &recvs)
    },
    skip: |_| None,
    comments: summary,
    prepare,
    ranks_ok: |n| config().and_then(|c| c.check_ranks(n)),
};

/// Reads the pattern or matrix (a bad one is a usage error before any rank starts) and
/// notes that a matrix fixes every row's bytes.
fn prepare(one_size: bool) -> Result<Vec<String>, String> {
    let c = config()?;
    Ok(match c.pattern {
        Pattern::Matrix { .. } if !one_size => vec![
            "alltoallv_perf with a traffic matrix: every size moves the matrix's bytes \
             (give -b equal to -e)"
                .into(),
        ],
        _ => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generated(spread: f64) -> Config {
        Config {
            pattern: Pattern::Generated { spread },
            print_summary: false,
        }
    }

    #[test]
    fn generated_patterns_spread_by_distance_and_stay_balanced() {
        // 4 ranks, 4096 bytes each: uniform is 1024 to everyone; weighted is 0, 1/6, 2/6,
        // 3/6 of the total by distance, rounded down to 16 bytes.
        let (s, v) = generated(0.0).row_col(0, 4, 4096);
        assert_eq!(s, [1024; 4]);
        assert_eq!(v, [1024; 4]);
        let (s, v) = generated(1.0).row_col(1, 4, 4096);
        assert_eq!(s, [2048, 0, 672, 1360]);
        assert_eq!(v, [672, 0, 2048, 1360]);
        // Every rank sends and receives the same total.
        let c = generated(0.5);
        let totals: Vec<(usize, usize)> = (0..5)
            .map(|r| {
                let (s, v) = c.row_col(r, 5, 10_000);
                (s.iter().sum(), v.iter().sum())
            })
            .collect();
        assert!(
            totals
                .iter()
                .all(|&(s, v)| s == totals[0].0 && v == totals[0].0),
            "{totals:?}"
        );
    }

    #[test]
    fn matrix_files_as_nccl_tests_reads_them() {
        let (dim, bytes) = parse_matrix("100 200 150\n 50 100 75\n\n300 150 200\n", 2.0).unwrap();
        assert_eq!(dim, 3);
        assert_eq!(bytes, [192, 400, 288, 96, 192, 144, 592, 288, 400]);
        assert!(parse_matrix("1 2\n3\n", 1.0)
            .unwrap_err()
            .contains("row 1 has 1"));
        assert!(parse_matrix("1 2\n3 4\n5 6\n", 1.0)
            .unwrap_err()
            .contains("square"));
        assert!(parse_matrix("1 -2\n3 4\n", 1.0)
            .unwrap_err()
            .contains("'-2'"));
        assert!(parse_matrix(" \n", 1.0).unwrap_err().contains("empty"));
        let c = Config {
            pattern: Pattern::Matrix {
                file: "m".into(),
                scale: 1.0,
                dim,
                bytes,
            },
            print_summary: false,
        };
        assert_eq!(c.peer_bytes(2, 0, 3, 0), 592);
        assert!(c.check_ranks(3).is_ok());
        assert!(c.check_ranks(4).unwrap_err().contains("4 ranks"));
    }
}
