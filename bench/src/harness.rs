//! The sweep, timed and checked as nccl-tests does it (its `TimeTest`/`BenchTime`):
//! per (type, op): a barrier, one warmup pass over doubling sizes, then per size and
//! placement (out-of-place, then in-place): data init, one untimed op, a barrier, the timed
//! loop on the host clock with buffer-offset rotation, per-rank times combined across ranks,
//! and validation after timing.
//!
//! Each timed iteration (`-m` ops) is also lapped on the same clock, so rows carry
//! per-iteration statistics (nccl-tests' `-I`) at the cost of one clock read per iteration;
//! the row's time is still the whole loop divided by `iters × agg`, as nccl-tests computes it.

use crate::gpu::DeviceMem;
use crate::plan::{Average, Plan};
use crate::specs::{Counts, DataCtx, HostFill, Redop};
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

pub fn run(comm: &mut Communicator, plan: &Plan, sink: Option<&mut dyn Sink>) -> Result<Summary> {
    run_with(comm, plan, sink, None)
}

/// [`run`], with the buffers on `dev` when given (`-g 1`; see `gpu.rs`).
pub fn run_with(
    comm: &mut Communicator,
    plan: &Plan,
    mut sink: Option<&mut dyn Sink>,
    mut dev: Option<&mut DeviceMem>,
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
    if let Some(d) = dev.as_deref_mut() {
        d.reserve(max_send, max_recv, plan.check > 0)
            .with_context(|| format!("rank {rank}: device buffers"))?;
    }
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
                let mut st = State {
                    bufs: &mut bufs,
                    dev: dev.as_deref_mut(),
                    seed: &mut seed,
                    summary: &mut summary,
                };
                sweep(comm, plan, &mut st, c, &mut sink)?;
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

/// What a sweep works on and accumulates into.
struct State<'a> {
    bufs: &'a mut Buffers,
    dev: Option<&'a mut DeviceMem>,
    seed: &'a mut u64,
    summary: &'a mut Summary,
}

/// One (type, op, root) sweep: nccl-tests' `TimeTest`.
fn sweep(
    comm: &mut Communicator,
    plan: &Plan,
    st: &mut State,
    Combo {
        dtype,
        op,
        root,
        model,
    }: Combo,
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
            match st.dev.as_deref_mut() {
                Some(d) => d.op(comm, spec.run, &ctx, 0, 0, false).map(|_| ()),
                None => (spec.run)(
                    comm,
                    st.bufs.send.as_slice(),
                    st.bufs.recv.as_mut_slice(),
                    &ctx,
                )
                .map_err(Into::into),
            }
            .with_context(|| format!("warmup at {size} bytes"))?;
        }
    }
    let mut cycle = 0;
    while plan.cycles == 0 || cycle < plan.cycles {
        cycle += 1;
        for &size in &plan.sizes {
            if plan.fail_rank == Some(rank) {
                anyhow::bail!("failing on purpose at {size} bytes (--debug-fail-rank {rank})");
            }
            let counts = (spec.counts)(size, dtype, n);
            let mut cells = [None, None];
            let mut details = [None, None];
            for (i, in_place) in [false, true].into_iter().enumerate() {
                let ctx = ctx_for(counts, 99, in_place);
                let (cell, detail) = bench(comm, plan, &ctx, st).with_context(|| {
                    format!(
                        "{} {dtype} {op} at {} bytes ({})",
                        spec.program,
                        counts.size(),
                        if in_place { "in-place" } else { "out-of-place" }
                    )
                })?;
                st.summary.busbw_sum += cell.busbw;
                st.summary.busbw_cells += 1;
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
    st: &mut State,
) -> Result<(Cell, CellDetail)> {
    if let Some(d) = st.dev.as_deref_mut() {
        return bench_device(comm, plan, ctx, d, st.seed, st.summary);
    }
    let (bufs, seed, summary) = (&mut *st.bufs, &mut *st.seed, &mut *st.summary);
    let spec = plan.spec;
    let Counts {
        send_bytes,
        recv_bytes,
        ..
    } = ctx.counts;
    let span = send_bytes.max(recv_bytes);
    if plan.check > 0 {
        let mut f = HostFill {
            dtype: ctx.dtype,
            send: bufs.send.as_mut_slice(),
            recv: bufs.recv.as_mut_slice(),
            expected: None,
        };
        (spec.init)(ctx, &mut f);
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
    let secs = start.elapsed().as_secs_f64() / total_ops as f64;
    let (t, algbw, busbw, detail) = timing(comm, plan, ctx, secs, &laps)?;

    let wrong = checks(comm, plan, ctx, seed, summary, |comm, vctx, checked| {
        bufs.recv.as_mut_slice()[..span].fill(0);
        let mut f = HostFill {
            dtype: ctx.dtype,
            send: bufs.send.as_mut_slice(),
            recv: bufs.recv.as_mut_slice(),
            expected: bufs.expected.as_mut().map(|e| e.as_mut_slice()),
        };
        (spec.init)(vctx, &mut f);
        (spec.run)(comm, bufs.send.as_slice(), bufs.recv.as_mut_slice(), vctx)?;
        if plan.corrupt_rank == Some(ctx.rank) && !checked.is_empty() {
            bufs.recv.as_mut_slice()[checked.start] ^= 0x01;
        }
        Ok(match &bufs.expected {
            Some(e) => count_wrong(
                ctx.dtype,
                ctx.op,
                &bufs.recv.as_slice()[checked.clone()],
                &e.as_slice()[..checked.len()],
            ),
            None => 0,
        })
    })?;
    Ok(cell(t, algbw, busbw, wrong, detail))
}

/// [`bench`] on device buffers: the same loop, each operation staged (`gpu.rs`), each
/// iteration lapped with CUDA events, the data made on the host and checked on the device.
fn bench_device(
    comm: &mut Communicator,
    plan: &Plan,
    ctx: &DataCtx,
    dev: &mut DeviceMem,
    seed: &mut u64,
    summary: &mut Summary,
) -> Result<(Cell, CellDetail)> {
    let spec = plan.spec;
    let span = ctx.counts.send_bytes.max(ctx.counts.recv_bytes);
    if plan.check > 0 {
        dev.validate(comm, spec.init, spec.run, ctx, 0..0, false)?;
    }
    dev.op(comm, spec.run, ctx, 0, 0, false)?;
    barrier(comm)?;
    let shifts = dev.shifts(span);
    let (iters, agg) = (plan.iters as usize, plan.agg_iters as usize);
    let total_ops = iters * agg;
    let mut laps = Vec::with_capacity(iters);
    let mut lap = 0.0;
    let start = Instant::now();
    for k in 0..total_ops {
        let off = span * (k % shifts);
        lap += dev.op(comm, spec.run, ctx, off, off, true)?.unwrap_or(0.0);
        if (k + 1) % agg == 0 {
            laps.push(lap / agg as f64);
            lap = 0.0;
        }
    }
    let secs = start.elapsed().as_secs_f64() / total_ops as f64;
    let (t, algbw, busbw, detail) = timing(comm, plan, ctx, secs, &laps)?;
    let corrupt = plan.corrupt_rank == Some(ctx.rank);
    let wrong = checks(comm, plan, ctx, seed, summary, |comm, vctx, checked| {
        dev.validate(comm, spec.init, spec.run, vctx, checked, corrupt)
    })?;
    Ok(cell(t, algbw, busbw, wrong, detail))
}

fn cell(t: f64, algbw: f64, busbw: f64, wrong: Option<u64>, d: CellDetail) -> (Cell, CellDetail) {
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
fn checks(
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
fn timing(
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
