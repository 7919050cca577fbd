//! The sweep, timed and checked as nccl-tests does it (its `TimeTest`/`BenchTime`):
//! per (type, op): a barrier, one warmup pass over doubling sizes, then per size and
//! placement (out-of-place, then in-place): data init, one untimed op, a barrier, the timed
//! loop on the host clock with buffer-offset rotation, per-rank times combined across ranks,
//! and validation after timing.
//!
//! Each timed iteration (`-m` ops) is also lapped on the same clock, so rows carry
//! per-iteration statistics (nccl-tests' `-I`) at the cost of one clock read per iteration;
//! the row's time is still the whole loop divided by `iters × agg`, as nccl-tests computes it.

use crate::plan::{Average, Plan};
use crate::specs::{Counts, DataCtx, Redop};
use anyhow::{Context, Result};
use busbw_collectives::algo::{calibrate, Algo, CostModel};
use busbw_collectives::verifiable::count_wrong;
use busbw_collectives::{all_reduce_values, barrier, Communicator, DataType, HostBuffer, ReduceOp};
use busbw_reports::run::IterStats;
use busbw_reports::{Cell, CellDetail, Measured, Row, Sink};
use std::time::Instant;

/// What the footer needs.
#[derive(Debug, Default)]
pub struct Summary {
    /// Result cells (size × placement × rank) with at least one wrong element.
    pub out_of_bounds: u64,
    pub busbw_sum: f64,
    pub busbw_cells: u64,
}

impl Summary {
    /// Mean of every printed busbw value, as nccl-tests' "Avg bus bandwidth".
    pub fn avg_busbw(&self) -> f64 {
        if self.busbw_cells == 0 {
            0.0
        } else {
            self.busbw_sum / self.busbw_cells as f64
        }
    }
}

struct Buffers {
    send: HostBuffer,
    recv: HostBuffer,
    expected: Option<HostBuffer>,
}

fn alloc(bytes: usize, what: &str, rank: usize) -> Result<HostBuffer> {
    HostBuffer::new(bytes).with_context(|| {
        format!("rank {rank}: cannot allocate {bytes} bytes for the {what} buffer; lower -e")
    })
}

pub fn run(
    comm: &mut Communicator,
    plan: &Plan,
    mut sink: Option<&mut dyn Sink>,
) -> Result<Summary> {
    let rank = comm.rank();
    let n = comm.size();
    let spec = plan.spec;
    // Largest buffers any row of any type needs.
    let mut max_send = 0;
    let mut max_recv = 0;
    for &d in &plan.dtypes {
        for &s in plan.sizes.iter().chain(&plan.warmup_sizes) {
            let c = (spec.counts)(s, d, n);
            max_send = max_send.max(c.send_bytes);
            max_recv = max_recv.max(c.recv_bytes);
        }
    }
    // In place, one buffer holds the larger of the two layouts.
    let max_recv = max_recv.max(max_send);
    let mut bufs = Buffers {
        send: alloc(max_send, "send", rank)?,
        recv: alloc(max_recv, "receive", rank)?,
        expected: if plan.check > 0 {
            Some(alloc(max_recv, "expected-result", rank)?)
        } else {
            None
        },
    };
    let mut summary = Summary::default();
    let mut seed = 0u64;
    let roots = plan.roots(n).map_err(anyhow::Error::msg)?;
    // Auto needs the job's cost model; measuring it is a collective, so every rank does it
    // here, at the same point, and gets the same model.
    let model = if plan.algo == Algo::Auto {
        Some(calibrate(comm).context("calibrating the cost model for --algo auto")?)
    } else {
        None
    };

    for &dtype in &plan.dtypes {
        for &op in &plan.ops {
            for &root in &roots {
                let c = Combo {
                    dtype,
                    op,
                    root,
                    model,
                };
                sweep(comm, plan, &mut bufs, c, &mut seed, &mut summary, &mut sink)?;
            }
        }
    }
    Ok(summary)
}

/// What one sweep runs.
#[derive(Clone, Copy)]
struct Combo {
    dtype: DataType,
    op: ReduceOp,
    root: usize,
    model: Option<CostModel>,
}

/// One (type, op, root) sweep: nccl-tests' `TimeTest`.
fn sweep(
    comm: &mut Communicator,
    plan: &Plan,
    bufs: &mut Buffers,
    Combo {
        dtype,
        op,
        root,
        model,
    }: Combo,
    seed: &mut u64,
    summary: &mut Summary,
    sink: &mut Option<&mut dyn Sink>,
) -> Result<()> {
    let spec = plan.spec;
    let (rank, n) = (comm.rank(), comm.size());
    let ctx_for = |counts, seed, in_place| DataCtx {
        dtype,
        op,
        seed,
        rank,
        nranks: n,
        root,
        counts,
        in_place,
        algo: plan.algo,
        model,
    };
    barrier(comm).context("barrier before the sweep")?;
    for &size in &plan.warmup_sizes {
        let ctx = ctx_for((spec.counts)(size, dtype, n), 0, false);
        for _ in 0..plan.warmup_iters {
            (spec.run)(comm, bufs.send.as_slice(), bufs.recv.as_mut_slice(), &ctx)
                .with_context(|| format!("warmup at {size} bytes"))?;
        }
    }
    let mut cycle = 0;
    while plan.cycles == 0 || cycle < plan.cycles {
        cycle += 1;
        for &size in &plan.sizes {
            let counts = (spec.counts)(size, dtype, n);
            let mut cells = [None, None];
            let mut details = [None, None];
            for (i, in_place) in [false, true].into_iter().enumerate() {
                let ctx = ctx_for(counts, 99, in_place);
                let (cell, detail) =
                    bench(comm, plan, &ctx, bufs, seed, summary).with_context(|| {
                        format!(
                            "{} {dtype} {op} at {} bytes ({})",
                            spec.program,
                            counts.size(),
                            if in_place { "in-place" } else { "out-of-place" }
                        )
                    })?;
                summary.busbw_sum += cell.busbw;
                summary.busbw_cells += 1;
                cells[i] = Some(cell);
                details[i] = Some(detail);
            }
            if let (Some(sink), [Some(oop), Some(ip)], [Some(doop), Some(dip)]) =
                (sink.as_deref_mut(), cells, details)
            {
                let row = Row {
                    size: counts.size() as u64,
                    count: counts.count as u64,
                    dtype: dtype.name().into(),
                    redop: match spec.redop {
                        Redop::Fixed(label) => label.into(),
                        Redop::Reduces | Redop::Prints => op.name().into(),
                    },
                    root: if spec.rooted { root as i64 } else { -1 },
                    out_of_place: oop,
                    in_place: ip,
                    extra: match model {
                        Some(m) => vec![m.choose(counts.send_bytes, n).name().into()],
                        None => vec![],
                    },
                };
                sink.measured(&Measured {
                    row,
                    out_of_place: doop,
                    in_place: dip,
                })
                .context("writing the results")?;
            }
        }
    }
    Ok(())
}

fn bench(
    comm: &mut Communicator,
    plan: &Plan,
    ctx: &DataCtx,
    bufs: &mut Buffers,
    seed: &mut u64,
    summary: &mut Summary,
) -> Result<(Cell, CellDetail)> {
    let spec = plan.spec;
    let n = comm.size();
    let Counts {
        send_bytes,
        recv_bytes,
        ..
    } = ctx.counts;
    let span = send_bytes.max(recv_bytes);
    if plan.check > 0 {
        (spec.init)(
            ctx,
            bufs.send.as_mut_slice(),
            bufs.recv.as_mut_slice(),
            None,
        );
    }
    // One untimed op (connections, page faults, caches), then line everyone up.
    (spec.run)(comm, bufs.send.as_slice(), bufs.recv.as_mut_slice(), ctx)?;
    barrier(comm)?;

    // Rotate the buffer offset across iterations, as nccl-tests does, so that small sizes
    // do not run from cache and pointer-reuse races would surface.
    let shifts = bufs
        .send
        .len()
        .max(bufs.recv.len())
        .checked_div(span)
        .unwrap_or(1)
        .max(1);
    let (iters, agg) = (plan.iters as usize, plan.agg_iters as usize);
    let total_ops = iters * agg;
    let mut laps = Vec::with_capacity(iters);
    let start = Instant::now();
    let mut lap_start = start;
    for k in 0..total_ops {
        let off = span * (k % shifts);
        let send = bufs.send.as_slice();
        let s = &send[off.min(send.len().saturating_sub(send_bytes))..];
        let recv = bufs.recv.as_mut_slice();
        let roff = off.min(recv.len().saturating_sub(span));
        (spec.run)(comm, s, &mut recv[roff..], ctx)?;
        if (k + 1) % agg == 0 {
            let now = Instant::now();
            laps.push((now - lap_start).as_secs_f64() / agg as f64);
            lap_start = now;
        }
    }
    let mut secs = [start.elapsed().as_secs_f64() / total_ops as f64];
    let detail = spread(comm, secs[0], &laps)?;
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

    let validate = plan.check > 0 && (spec.checks_in_place || !ctx.in_place);
    let wrong = if validate {
        let mut local = 0u64;
        let checked = (spec.checked)(ctx);
        for _ in 0..plan.check {
            *seed += 1;
            let vctx = DataCtx {
                seed: *seed,
                ..*ctx
            };
            bufs.recv.as_mut_slice()[..span].fill(0);
            let expected = bufs.expected.as_mut().map(|e| e.as_mut_slice());
            (spec.init)(
                &vctx,
                bufs.send.as_mut_slice(),
                bufs.recv.as_mut_slice(),
                expected,
            );
            (spec.run)(comm, bufs.send.as_slice(), bufs.recv.as_mut_slice(), &vctx)?;
            if plan.corrupt_rank == Some(ctx.rank) && !checked.is_empty() {
                bufs.recv.as_mut_slice()[checked.start] ^= 0x01;
            }
            if let Some(e) = &bufs.expected {
                local = count_wrong(
                    ctx.dtype,
                    ctx.op,
                    &bufs.recv.as_slice()[checked.clone()],
                    &e.as_slice()[..checked.len()],
                );
            }
            if local > 0 {
                break;
            }
        }
        let mut totals = [local, u64::from(local > 0)];
        all_reduce_values(comm, &mut totals, ReduceOp::Sum)?;
        summary.out_of_bounds += totals[1];
        Some(totals[0])
    } else {
        None
    };
    Ok((
        Cell {
            time_us: t * 1e6,
            algbw,
            busbw,
            wrong,
        },
        detail,
    ))
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
