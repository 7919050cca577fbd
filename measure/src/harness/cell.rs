//! One cell's figures once its loop has run: the time combined across ranks, algbw and
//! busbw, the per-iteration spread, and the `-c` checks with the job's `#wrong`.

use super::Summary;
use crate::error::Result;
use crate::plan::{Average, Plan};
use crate::specs::DataCtx;
use busbw_collectives::{all_reduce_values, Communicator, ReduceOp};
use busbw_reports::run::IterStats;
use busbw_reports::{Cell, CellDetail};

pub(super) fn cell(
    t: f64,
    algbw: f64,
    busbw: f64,
    wrong: Option<u64>,
    d: CellDetail,
) -> (Cell, CellDetail) {
    let c = Cell {
        time_us: t * 1e6,
        algbw,
        busbw,
        wrong,
    };
    (c, d)
}

/// The `-c` validation runs of one cell (fresh seeds; stop at the first with wrong data),
/// each done by `one(comm, ctx, checked range)`, which returns this rank's wrong count;
/// `None` where the cell is not validated.
pub(super) fn checks(
    comm: &mut Communicator,
    plan: &Plan,
    ctx: &DataCtx,
    seed: &mut u64,
    summary: &mut Summary,
    mut one: impl FnMut(&mut Communicator, &DataCtx, std::ops::Range<usize>) -> Result<u64>,
) -> Result<Option<u64>> {
    let spec = plan.spec;
    if plan.check == 0 || (!spec.checks_in_place && ctx.in_place) {
        return Ok(None);
    }
    let mut local = 0u64;
    let checked = (spec.checked)(ctx);
    for _ in 0..plan.check {
        *seed += 1;
        let vctx = DataCtx {
            seed: *seed,
            ..*ctx
        };
        local = one(comm, &vctx, checked.clone())?;
        if local > 0 {
            break;
        }
    }
    Ok(Some(wrong_totals(comm, local, summary)?))
}

/// Job-wide `#wrong` of one cell from this rank's count; counts the cell as out of bounds.
fn wrong_totals(comm: &mut Communicator, local: u64, summary: &mut Summary) -> Result<u64> {
    let mut totals = [local, u64::from(local > 0)];
    all_reduce_values(comm, &mut totals, ReduceOp::Sum)?;
    summary.out_of_bounds += totals[1];
    Ok(totals[0])
}

/// The printed time (combined across ranks by `-a`), algbw, busbw and the per-iteration
/// detail of one cell.
pub(super) fn timing(
    comm: &mut Communicator,
    plan: &Plan,
    ctx: &DataCtx,
    mean_s: f64,
    laps: &[f64],
) -> Result<(f64, f64, f64, CellDetail)> {
    let (spec, n) = (plan.spec, comm.size());
    let mut secs = [mean_s];
    let detail = spread(comm, secs[0], laps)?;
    match plan.average {
        Average::Rank0 => {}
        Average::Mean => {
            all_reduce_values(comm, &mut secs, ReduceOp::Sum)?;
            secs[0] /= n as f64;
        }
        Average::Min => all_reduce_values(comm, &mut secs, ReduceOp::Min)?,
        Average::Max => all_reduce_values(comm, &mut secs, ReduceOp::Max)?,
    }
    let t = secs[0];
    let algbw = if t > 0.0 {
        (spec.alg_bytes)(&ctx.counts, n) / 1e9 / t
    } else {
        0.0
    };
    let busbw = algbw * (spec.busbw_factor)(n);
    Ok((t, algbw, busbw, detail))
}

/// Largest `ranks × iterations` matrix gathered for per-rank iteration times (512 KiB of f64):
/// beyond it only the per-iteration maximum travels.
const PER_RANK_LIMIT: usize = 1 << 16;

/// Combines this rank's mean time and iteration laps with everyone's: the fastest and slowest
/// rank's mean, each iteration's slowest rank (the job waits for it), and, for jobs small
/// enough, every rank's laps. All ranks take part; rank 0 keeps the statistics.
fn spread(comm: &mut Communicator, mean_s: f64, laps: &[f64]) -> Result<CellDetail> {
    let (rank, n, iters) = (comm.rank(), comm.size(), laps.len());
    let mut v: Vec<f64> = laps.to_vec();
    v.extend([mean_s, -mean_s]);
    all_reduce_values(comm, &mut v, ReduceOp::Max)?;
    let per_rank = if n > 1 && n * iters <= PER_RANK_LIMIT {
        let mut m = vec![0.0f64; n * iters];
        m[rank * iters..(rank + 1) * iters].copy_from_slice(laps);
        all_reduce_values(comm, &mut m, ReduceOp::Sum)?;
        m.chunks(iters.max(1))
            .map(|r| r.iter().map(|t| t * 1e6).collect())
            .collect()
    } else {
        Vec::new()
    };
    let us: Vec<f64> = v[..iters].iter().map(|t| t * 1e6).collect();
    Ok(CellDetail {
        time_min_us: -v[iters + 1] * 1e6,
        time_max_us: v[iters] * 1e6,
        iterations: if rank == 0 {
            IterStats::from_samples(&us, per_rank)
        } else {
            None
        },
    })
}
