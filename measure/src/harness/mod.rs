//! The sweep, timed and checked as nccl-tests does it (its `TimeTest`/`BenchTime`):
//! per (type, op): a barrier, one warmup pass over doubling sizes, then per size and
//! placement (out-of-place, then in-place): data init, one untimed op, a barrier, the timed
//! loop on the host clock with buffer-offset rotation, per-rank times combined across ranks,
//! and validation after timing.
//!
//! Each timed iteration (`-m` ops) is also lapped on the same clock, so rows carry
//! per-iteration statistics (nccl-tests' `-I`) at the cost of one clock read per iteration;
//! the row's time is still the whole loop divided by `iters × agg`, as nccl-tests computes it.
//!
//! `-z`: busbw's operations return when this rank's part is complete, which is what
//! nccl-tests' wait after each operation gives, so modes 0 and 2 time the same loop; 1 adds
//! a barrier after each operation (timed), 3 a barrier after each iteration (not timed: the
//! time is the sum of the iterations). `-u` starts the send and receive data that many
//! elements into their buffers, which are allocated 8 bytes per element larger.

mod buffers;
mod cell;
mod clock;
mod meter;

use crate::device::DeviceMem;
use crate::error::{Context, Error, Result};
use crate::plan::Plan;
use crate::specs::{CollectiveSpec, DataCtx, Redop};
use buffers::{alloc, Buffers, Memory};
use busbw_collectives::select::{calibrate, Algo, CostModel};
use busbw_collectives::{all_reduce_values, barrier, Communicator, DataType, ReduceOp};
use busbw_reports::{Cell, CellDetail, Measured, MemoryUsage, Row, Sink};
use cell::{cell, checks, timing};
use clock::Clock;
use meter::Meter;
use std::time::Instant;

/// What the footer needs.
#[derive(Debug, Default)]
pub struct Summary {
    /// Result cells (size × placement × rank) with at least one wrong element.
    pub out_of_bounds: u64,
    pub busbw_sum: f64,
    pub busbw_cells: u64,
    /// `-M`: the memory each phase took (the largest over the job); `None` without `-M`.
    pub memory: Option<MemoryUsage>,
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

pub fn run(comm: &mut Communicator, plan: &Plan, sink: Option<&mut dyn Sink>) -> Result<Summary> {
    run_with(comm, plan, sink, None)
}

/// [`run`], with the buffers on `dev` when given (`-g 1`; see `device.rs`).
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
    // In place, one buffer holds the larger of the two layouts; both hold the rotation's
    // window, so a size rotates over the same bytes whatever the sweep's largest size.
    let max_expected = max_recv.max(max_send);
    let window = usize::try_from(plan.rotation.window_bytes()).unwrap_or(usize::MAX);
    let max_send = max_send.max(window);
    let max_recv = max_expected.max(window);
    // Room for -u of the widest type (nccl-tests pads by 8 bytes per element of shift).
    let pad = 8 * plan.unalign as usize;
    let mut meter = Meter::start(plan, dev.as_deref_mut())?;
    let mut bufs = Buffers {
        send: alloc(max_send + pad, "send", rank, true)?,
        recv: alloc(max_recv + pad, "receive", rank, true)?,
        expected: if plan.check > 0 {
            Some(alloc(max_expected, "expected-result", rank, false)?)
        } else {
            None
        },
        base: 0,
    };
    if let Some(d) = dev.as_deref_mut() {
        d.reserve(comm, max_send + pad, max_recv + pad, plan.check > 0)
            .with_context(|| format!("rank {rank}: device buffers"))?;
    }
    if let Some(m) = meter.as_mut() {
        let host = (bufs.send.len() + bufs.recv.len()) as u64
            + bufs.expected.as_ref().map_or(0, |e| e.len() as u64);
        m.allocated(comm, plan, host, dev.as_deref_mut())?;
    }
    let mut summary = Summary::default();
    let mut seed = 0u64;
    let mut warmed = false;
    let roots = plan.roots(n).map_err(Error::Usage)?;
    // Auto needs the job's cost model; measuring it is a collective, so every rank does it
    // here, at the same point, and gets the same model.
    let mut model = if plan.algo == Algo::Auto {
        Some(calibrate(comm).context("calibrating the cost model for --algo auto")?)
    } else {
        None
    };
    // The calibration timed host buffers; device data runs the ring where the direct
    // AllReduce was measured, so the choice (and the algo column) must not offer it.
    if let (Some(m), true) = (model.as_mut(), dev.is_some()) {
        let direct = busbw_collectives::select::PROBED
            .iter()
            .position(|&a| a == Algo::Direct);
        if let (Some(t), Some(d)) = (m.measured.as_mut(), direct) {
            t.secs[d] = [f64::INFINITY; 4];
        }
    }
    let direct_before = busbw_collectives::algorithms::direct::tally(comm);

    for &dtype in &plan.dtypes {
        for &op in &plan.ops {
            for &root in &roots {
                let c = Series {
                    dtype,
                    op,
                    root,
                    model,
                };
                let mut st = SweepState {
                    bufs: &mut bufs,
                    dev: dev.as_deref_mut(),
                    seed: &mut seed,
                    summary: &mut summary,
                    warmed: &mut warmed,
                };
                sweep(comm, plan, &mut st, c, &mut sink)?;
            }
        }
    }
    // Say so where the direct AllReduce that was asked for (or chosen) ran the ring.
    let (ran, fell_back, why) = busbw_collectives::algorithms::direct::tally(comm);
    let fell_back = fell_back - direct_before.1;
    if let (Some(sink), true, Some(why)) = (sink, fell_back > 0, why) {
        sink.comment(&format!(
            "# direct AllReduce: {fell_back} of {} calls ran the ring instead: {}",
            fell_back + ran - direct_before.0,
            why.describe()
        ))
        .context("writing the results")?;
    }
    if let Some(d) = dev.as_deref_mut() {
        // Peers' mappings close before any rank frees its buffers.
        d.release(comm)
            .with_context(|| format!("rank {rank}: device buffers"))?;
    }
    if let Some(m) = meter {
        summary.memory = Some(m.finish(comm, dev)?);
    }
    Ok(summary)
}

/// What one sweep runs.
#[derive(Clone, Copy)]
struct Series {
    dtype: DataType,
    op: ReduceOp,
    root: usize,
    model: Option<CostModel>,
}

/// What a sweep works on and accumulates into.
struct SweepState<'a> {
    bufs: &'a mut Buffers,
    dev: Option<&'a mut DeviceMem>,
    seed: &'a mut u64,
    summary: &'a mut Summary,
    /// Whether a cell has warmed up in this process yet.
    warmed: &'a mut bool,
}

/// Where a rank's data lives: the device's buffers under `-g`, else the host's (the fields
/// of a [`SweepState`], apart so that its other fields stay borrowable).
fn memory<'m>(dev: &'m mut Option<&mut DeviceMem>, bufs: &'m mut Buffers) -> &'m mut dyn Memory {
    match dev.as_deref_mut() {
        Some(d) => d,
        None => bufs,
    }
}

/// One (type, op, root) sweep: nccl-tests' `TimeTest`.
fn sweep(
    comm: &mut Communicator,
    plan: &Plan,
    st: &mut SweepState,
    Series {
        dtype,
        op,
        root,
        model,
    }: Series,
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
    // -u shifts by elements of this sweep's type, as nccl-tests moves its pointers per type.
    st.bufs.base = plan.unalign as usize * dtype.size();
    if let Some(d) = st.dev.as_deref_mut() {
        d.set_unalign(st.bufs.base);
    }
    for &size in &plan.warmup_sizes {
        let ctx = ctx_for((spec.counts)(size, dtype, n), 0, false);
        for _ in 0..plan.warmup_iters {
            memory(&mut st.dev, st.bufs)
                .op(comm, spec, &ctx, 0, false)
                .with_context(|| format!("warmup at {size} bytes"))?;
        }
    }
    let mut cycle = 0;
    while plan.cycles == 0 || cycle < plan.cycles {
        cycle += 1;
        for &size in &plan.sizes {
            if plan.fail_rank == Some(rank) {
                return Err(Error::Injected(format!(
                    "failing on purpose at {size} bytes (--debug-fail-rank {rank})"
                )));
            }
            let counts = (spec.counts)(size, dtype, n);
            let mut cells = [None, None];
            let mut details = [None, None];
            let mut comments = Vec::new();
            if !plan.in_place {
                cells[1] = Some(Cell {
                    time_us: 0.0,
                    algbw: 0.0,
                    busbw: 0.0,
                    wrong: None,
                });
                details[1] = Some(CellDetail {
                    time_min_us: 0.0,
                    time_max_us: 0.0,
                    iterations: None,
                });
            }
            let placements = if plan.in_place { 2 } else { 1 };
            for (i, in_place) in [false, true].into_iter().enumerate().take(placements) {
                let ctx = ctx_for(counts, 99, in_place);
                let (cell, detail) = bench(comm, plan, &ctx, st).with_context(|| {
                    format!(
                        "{} {dtype} {op} at {} bytes ({})",
                        spec.program,
                        counts.size(),
                        if in_place { "in-place" } else { "out-of-place" }
                    )
                })?;
                comments.extend((spec.comments)(&ctx, cell.time_us / 1e6));
                st.summary.busbw_sum += cell.busbw;
                st.summary.busbw_cells += 1;
                cells[i] = Some(cell);
                details[i] = Some(detail);
            }
            if let (Some(sink), [Some(oop), Some(ip)], [Some(doop), Some(dip)]) =
                (sink.as_deref_mut(), cells, details)
            {
                for c in &comments {
                    sink.comment(c).context("writing the results")?;
                }
                let chosen = model.map(|m| m.choose(counts.send_bytes, n));
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
                    extra: match (chosen, plan.algo_column) {
                        (Some(a), true) => vec![a.name().into()],
                        _ => vec![],
                    },
                };
                sink.measured(&Measured {
                    row,
                    out_of_place: doop,
                    in_place: dip,
                    algo: chosen.map(|a| a.name().into()),
                })
                .context("writing the results")?;
            }
        }
    }
    Ok(())
}

/// Longest first warmup pass over a cell's rotation positions that is followed by a second.
const SECOND_WARM_PASS_SECS: f64 = 0.01;
/// How long the process's first cell warms up at least, where its passes are cheap.
const FIRST_CELL_WARM_SECS: f64 = 0.025;

/// One cell: data init, untimed ops at the timed loop's positions, the timed loop with buffer-offset
/// rotation (so small sizes do not run from cache and pointer-reuse races would surface, as
/// nccl-tests does), the time combined across ranks, then the `-c` validation runs.
fn bench(
    comm: &mut Communicator,
    plan: &Plan,
    ctx: &DataCtx,
    st: &mut SweepState,
) -> Result<(Cell, CellDetail)> {
    let mem = memory(&mut st.dev, st.bufs);
    let spec = plan.spec;
    let span = ctx.counts.send_bytes.max(ctx.counts.recv_bytes);
    if plan.check > 0 {
        mem.prime(comm, spec, ctx)?;
    }
    let shifts = plan.rotation.positions(span, mem.shifts(span));
    let agg = plan.agg_iters as usize;
    let total_ops = plan.iters as usize * agg;
    // Untimed ops first (connections, page faults, caches), one at every position the timed
    // loop will use, then line everyone up. One at offset 0 only left the rest of the window
    // cold: a size alone then timed its first pass over the window (page walks, cold lines),
    // while inside a sweep the warmup at the largest size had touched it; 256 KiB on 2 local
    // ranks measured 41-50 us alone against 26-31 inside `-e 16M` at `-n 40`, and the same
    // 26-30 either way at `-n 2000` (BENCHMARKS.md, point 0). `--rotate max` is nccl-tests'
    // own rule, and keeps its single untimed op.
    let warm = if plan.rotation == crate::sizes::Rotation::Max {
        1
    } else {
        total_ops.min(shifts).max(1)
    };
    let started = Instant::now();
    for k in 0..warm {
        mem.op(comm, spec, ctx, span * k, false)?;
    }
    // One pass was not enough: 256 KiB on 2 local ranks still measured 0.65 of its time alone
    // inside a sweep (sweep-fidelity.sh, 5 rounds) after it, 0.92 after two (BENCHMARKS.md,
    // point 0). The second pass runs only where the first was cheap, as every rank agrees (the
    // agreement lines everyone up, as the barrier did): on emulated RDMA or a slow network a
    // pass costs seconds and the timed loop no longer needs it to be fair.
    let mut first = [started.elapsed().as_secs_f64()];
    all_reduce_values(comm, &mut first, ReduceOp::Max)?;
    if warm > 1 && first[0] < SECOND_WARM_PASS_SECS {
        // The process's first cell goes on until its warmup has lasted FIRST_CELL_WARM_SECS:
        // a size timed alone starts a few milliseconds after an idle machine woke its cores,
        // where inside a sweep the warmups of the larger sizes have kept them busy for
        // hundreds (TCP, 2 ranks, 256 KiB at -n 20: 116 us alone vs 104 in the sweep, the
        // same 103 vs 100 at -n 200; BENCHMARKS.md). Every rank agrees on each pass.
        let goal = if *st.warmed {
            0.0
        } else {
            FIRST_CELL_WARM_SECS
        };
        loop {
            for k in 0..warm {
                mem.op(comm, spec, ctx, span * k, false)?;
            }
            let mut spent = [started.elapsed().as_secs_f64()];
            all_reduce_values(comm, &mut spent, ReduceOp::Max)?;
            if spent[0] >= goal {
                break;
            }
        }
    }
    *st.warmed = true;

    // The host clock gives the row's time (and -z's barriers); the laps are the memory's
    // own when it times operations itself.
    let mut clock = Clock::start(plan);
    let rank = comm.rank();
    let (secs, laps) = match mem.deferred().filter(|_| plan.blocking == 0) {
        Some(d) => {
            let laps = deferred_loop(d, rank, spec, ctx, plan, span, shifts)?;
            (clock.per_op(total_ops), laps)
        }
        None => {
            let mut own_laps: Option<Vec<f64>> = None;
            let mut lap = 0.0;
            for k in 0..total_ops {
                let off = span * (k % shifts);
                if let Some(t) = mem.op(comm, spec, ctx, off, true)? {
                    lap += t;
                    own_laps.get_or_insert_with(|| Vec::with_capacity(plan.iters as usize));
                }
                clock.after_op(comm, k)?;
                if let Some(laps) = own_laps.as_mut().filter(|_| (k + 1) % agg == 0) {
                    laps.push(lap / agg as f64);
                    lap = 0.0;
                }
            }
            let secs = clock.per_op(total_ops);
            (
                secs,
                own_laps.unwrap_or_else(|| std::mem::take(&mut clock.laps)),
            )
        }
    };
    let (t, algbw, busbw, detail) = timing(comm, plan, ctx, secs, &laps)?;

    let corrupt = plan.corrupt_rank == Some(ctx.rank);
    let wrong = checks(
        comm,
        plan,
        ctx,
        st.seed,
        st.summary,
        |comm, vctx, checked| mem.validate(comm, spec, vctx, checked, corrupt),
    )?;
    Ok(cell(t, algbw, busbw, wrong, detail))
}

/// The timed loop of a memory that defers (`-z 0` through NCCL): every iteration enqueued,
/// its `-m` operations together, the buffer offsets rotating as in the host loop, then one
/// wait. Returns the laps: each iteration's seconds per operation.
fn deferred_loop(
    d: &mut dyn buffers::Deferred,
    rank: usize,
    spec: &CollectiveSpec,
    ctx: &DataCtx,
    plan: &Plan,
    span: usize,
    shifts: usize,
) -> Result<Vec<f64>> {
    let agg = plan.agg_iters.max(1) as usize;
    d.open(rank)?;
    let mut k = 0;
    for _ in 0..plan.iters {
        d.iteration(rank, agg)?;
        for _ in 0..agg {
            d.enqueue(spec, ctx, span * (k % shifts))?;
            k += 1;
        }
        d.iteration_done(rank, agg)?;
    }
    let iterations = d.settle(rank, spec)?;
    Ok(iterations.into_iter().map(|t| t / agg as f64).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_collectives::MemorySpace;

    /// What a spy saw of one operation: rank, send bytes, send and receive addresses.
    type Seen = (usize, usize, usize, usize);

    /// A `RunFn` that records each operation in `$log` and runs the real AllReduce. Each test
    /// has its own log: tests run at once.
    macro_rules! spy {
        ($name:ident, $log:ident) => {
            static $log: std::sync::Mutex<Vec<Seen>> = std::sync::Mutex::new(Vec::new());
            fn $name<'a>(
                comm: &mut Communicator,
                send: &'a [u8],
                recv: &'a mut [u8],
                space: MemorySpace<'a>,
                ctx: &DataCtx,
            ) -> Result<(), busbw_collectives::CommError> {
                let at = (
                    ctx.rank,
                    ctx.counts.send_bytes,
                    send.as_ptr() as usize,
                    recv.as_ptr() as usize,
                );
                $log.lock().unwrap_or_else(|e| e.into_inner()).push(at);
                let real = crate::specs::find("all_reduce").unwrap();
                (real.run)(comm, send, recv, space, ctx)
            }
        };
    }
    spy!(unalign_spy, UNALIGNED);
    spy!(rotation_spy, ROTATED);

    /// `busbw all_reduce_perf -d float -b min -e max -f factor -n iters <more>` on two
    /// in-process ranks with `run` as the AllReduce: each rank's count of wrong elements,
    /// and what `log` recorded (taken out of it).
    fn run_spied(
        sizes: (u64, u64, u64, u32),
        more: impl FnOnce(&mut Plan),
        run: crate::specs::RunFn,
        log: &std::sync::Mutex<Vec<Seen>>,
    ) -> (Plan, Vec<u64>, Vec<Seen>) {
        let real = crate::specs::find("all_reduce").unwrap();
        let spec: &'static crate::specs::CollectiveSpec =
            Box::leak(Box::new(crate::specs::CollectiveSpec { run, ..*real }));
        let (min, max, factor, iters) = sizes;
        let mut plan = Plan::defaults(spec).with_sizes(min, max, 1 << 20, factor);
        plan.iters = iters;
        more(&mut plan);
        let comms = busbw_collectives::testing::thread_world(
            2,
            busbw_collectives::testing::ThreadTransport::Inproc,
            Default::default(),
        )
        .unwrap();
        let wrong = busbw_collectives::testing::run_threads(comms, |c| {
            super::run(c, &plan, None).map(|s| s.out_of_bounds)
        })
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
        let seen = std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()));
        (plan, wrong, seen)
    }

    #[test]
    fn unalign_shifts_every_operation_by_whole_elements_and_still_validates() {
        // -b 64 -e 256 -f 2 -n 3 -u 3
        let (plan, wrong, seen) =
            run_spied((64, 256, 2, 3), |p| p.unalign = 3, unalign_spy, &UNALIGNED);
        assert_eq!(plan.unalign, 3);
        assert_eq!(wrong, [0, 0], "validation fails on shifted buffers");
        // Warmup, untimed, timed and validation operations, 2 ranks, 3 sizes, 2 placements.
        assert!(seen.len() > 30, "{}", seen.len());
        // 3 floats: 12 bytes past the 4 KiB-aligned buffers, and rotations move by the
        // size (a multiple of 64).
        let at: Vec<(usize, usize)> = seen.iter().map(|s| (s.2 % 64, s.3 % 64)).collect();
        assert!(at.iter().all(|&a| a == (12, 12)), "{at:?}");
    }

    /// Distinct send addresses rank 0 used for 64-byte operations, and how far apart the
    /// extremes are, in a run of `-b 64 -e <max> --rotate <rotate>`.
    fn positions_of_64(max: &str, rotate: &str) -> (usize, usize) {
        let max = crate::sizes::parse_size(max).unwrap();
        let rotation = crate::sizes::Rotation::parse(rotate).unwrap();
        let more = |p: &mut Plan| {
            p.check = 0;
            p.rotation = rotation;
        };
        let (_, _, seen) = run_spied((64, max, 4, 40), more, rotation_spy, &ROTATED);
        let mut at: Vec<usize> = seen
            .iter()
            .filter(|s| s.0 == 0 && s.1 == 64)
            .map(|s| s.2)
            .collect();
        at.sort_unstable();
        at.dedup();
        (at.len(), at[at.len() - 1] - at[0])
    }

    #[test]
    fn a_size_rotates_over_the_same_window_alone_and_inside_a_sweep() {
        // One configuration after the other: they share the spy's log.
        // --rotate 1K: 16 positions of 64 bytes, 960 bytes from first to last, whether the
        // sweep ends at 64 bytes or goes on to 4 KiB.
        assert_eq!(positions_of_64("64", "1K"), (16, 960));
        assert_eq!(positions_of_64("4K", "1K"), (16, 960));
        // nccl-tests' rule differs between the two: alone the buffers never move; inside the
        // sweep they cover the 4 KiB buffer (40 iterations reach 40 of its 64 positions).
        assert_eq!(positions_of_64("64", "max"), (1, 0));
        assert_eq!(positions_of_64("4K", "max"), (40, 39 * 64));
        // 0: never moved.
        assert_eq!(positions_of_64("4K", "0"), (1, 0));
    }

    /// A stream-like memory that records what the deferred loop asked of it.
    #[derive(Default)]
    struct Stream {
        log: Vec<String>,
        enqueued: usize,
    }

    impl buffers::Deferred for Stream {
        fn open(&mut self, rank: usize) -> Result<()> {
            self.log.push(format!("open {rank}"));
            Ok(())
        }
        fn iteration(&mut self, _rank: usize, agg: usize) -> Result<()> {
            self.log.push(format!("iteration of {agg}"));
            Ok(())
        }
        fn enqueue(&mut self, _spec: &CollectiveSpec, _ctx: &DataCtx, off: usize) -> Result<()> {
            self.log.push(format!("op at {off}"));
            self.enqueued += 1;
            Ok(())
        }
        fn iteration_done(&mut self, _rank: usize, _agg: usize) -> Result<()> {
            self.log.push("done".into());
            Ok(())
        }
        fn settle(&mut self, _rank: usize, _spec: &CollectiveSpec) -> Result<Vec<f64>> {
            self.log.push("settle".into());
            // Each iteration took 10 ms more than the one before.
            let iters = self.log.iter().filter(|l| *l == "done").count();
            Ok((1..=iters).map(|i| i as f64 * 0.01).collect())
        }
    }

    #[test]
    fn a_deferred_loop_enqueues_every_iteration_as_a_group_and_waits_once() {
        let spec = crate::specs::find("all_reduce").unwrap();
        let mut plan = Plan::defaults(spec);
        plan.iters = 3;
        plan.agg_iters = 2;
        let ctx = DataCtx {
            dtype: DataType::Float32,
            op: ReduceOp::Sum,
            seed: 7,
            rank: 1,
            nranks: 2,
            root: 0,
            counts: (spec.counts)(256, DataType::Float32, 2),
            in_place: false,
            algo: Algo::Ring,
            model: None,
        };
        let mut s = Stream::default();
        // 256-byte operations rotating over 4 positions.
        let laps = deferred_loop(&mut s, 1, spec, &ctx, &plan, 256, 4).unwrap();
        let expect = [
            "open 1",
            "iteration of 2",
            "op at 0",
            "op at 256",
            "done",
            "iteration of 2",
            "op at 512",
            "op at 768",
            "done",
            "iteration of 2",
            "op at 0",
            "op at 256",
            "done",
            "settle",
        ];
        assert_eq!(s.log, expect);
        // Each iteration's time per operation: its boundaries' time over -m.
        let want = [0.005, 0.01, 0.015];
        assert!(
            laps.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{laps:?}"
        );
    }
}
