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

use crate::gpu::DeviceMem;
use crate::memory;
use crate::plan::{Average, Plan};
use crate::specs::{CollectiveSpec, DataCtx, HostFill, Redop};
use anyhow::{Context, Result};
use busbw_collectives::algo::{calibrate, Algo, CostModel};
use busbw_collectives::verifiable::count_wrong;
use busbw_collectives::{
    all_reduce_values, barrier, Communicator, DataType, HostBuffer, MemorySpace, ReduceOp,
};
use busbw_reports::run::IterStats;
use busbw_reports::{Cell, CellDetail, Measured, MemoryUsage, Row, Sink};
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

struct Buffers {
    send: HostBuffer,
    recv: HostBuffer,
    expected: Option<HostBuffer>,
    /// `-u` in bytes of the current type: where the send and receive data start.
    base: usize,
}

impl Buffers {
    fn recv(&mut self) -> &mut [u8] {
        &mut self.recv.as_mut_slice()[self.base..]
    }
    /// The send and receive data, and the whole expected buffer, borrowed together.
    fn fill(&mut self, dtype: DataType, expected: bool) -> HostFill<'_> {
        HostFill {
            dtype,
            send: &mut self.send.as_mut_slice()[self.base..],
            recv: &mut self.recv.as_mut_slice()[self.base..],
            expected: match (expected, self.expected.as_mut()) {
                (true, Some(e)) => Some(e.as_mut_slice()),
                _ => None,
            },
        }
    }
}

/// `-z`: what follows an operation or an iteration in the timed loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blocking {
    /// 0 and 2: nothing beyond the operation's own completion.
    Off,
    /// 1: a barrier after each operation, inside the timed loop.
    EachOp,
    /// 3: a barrier after each iteration, outside the time.
    EachIter,
}

impl Blocking {
    fn of(plan: &Plan) -> Blocking {
        match plan.blocking {
            1 => Blocking::EachOp,
            3 => Blocking::EachIter,
            _ => Blocking::Off,
        }
    }
}

/// The timed loop's clock: iteration laps and the loop's total, which with `-z 3` leaves
/// out the barriers between iterations.
struct Clock {
    blocking: Blocking,
    agg: usize,
    /// The time source (a fake one in tests).
    now: fn() -> Instant,
    start: Instant,
    lap_start: Instant,
    timed: f64,
    laps: Vec<f64>,
}

impl Clock {
    fn start(plan: &Plan) -> Clock {
        Clock::with(Blocking::of(plan), plan.agg_iters, plan.iters, Instant::now)
    }

    fn with(blocking: Blocking, agg: u32, iters: u32, now: fn() -> Instant) -> Clock {
        let t = now();
        Clock {
            blocking,
            agg: agg.max(1) as usize,
            now,
            start: t,
            lap_start: t,
            timed: 0.0,
            laps: Vec::with_capacity(iters as usize),
        }
    }

    /// After operation `k` (0-based) of the loop: the barriers `-z` asks for, and a lap at
    /// the end of each iteration.
    fn after_op(&mut self, comm: &mut Communicator, k: usize) -> Result<()> {
        self.after_op_with(k, || barrier(comm).map_err(Into::into))
    }

    fn after_op_with(&mut self, k: usize, mut barrier: impl FnMut() -> Result<()>) -> Result<()> {
        if self.blocking == Blocking::EachOp {
            barrier()?;
        }
        if (k + 1).is_multiple_of(self.agg) {
            let now = (self.now)();
            let lap = (now - self.lap_start).as_secs_f64();
            self.laps.push(lap / self.agg as f64);
            self.lap_start = now;
            if self.blocking == Blocking::EachIter {
                self.timed += lap;
                barrier()?;
                self.lap_start = (self.now)();
            }
        }
        Ok(())
    }

    /// Seconds per operation.
    fn per_op(&self, total_ops: usize) -> f64 {
        let secs = match self.blocking {
            Blocking::EachIter => self.timed,
            _ => ((self.now)() - self.start).as_secs_f64(),
        };
        secs / total_ops as f64
    }
}

/// A buffer with every page already mapped: the operating system maps a fresh allocation on
/// first touch, and a touch inside the timed loop (the first pass over the rotation's window)
/// would time page faults, which nccl-tests' device memory never takes. `shared`: memory
/// that local peers can map, for the direct AllReduce.
fn alloc(bytes: usize, what: &str, rank: usize, shared: bool) -> Result<HostBuffer> {
    let b = if shared {
        HostBuffer::shared(bytes)
    } else {
        HostBuffer::mapped(bytes)
    };
    b.with_context(|| {
        format!(
            "rank {rank}: cannot allocate {bytes} bytes for the {what} buffer; lower -e (or \
             --rotate, whose window every buffer holds)"
        )
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
        d.reserve(max_send + pad, max_recv + pad, plan.check > 0)
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
    let roots = plan.roots(n).map_err(anyhow::Error::msg)?;
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
        let direct = busbw_collectives::algo::PROBED
            .iter()
            .position(|&a| a == Algo::Direct);
        if let (Some(t), Some(d)) = (m.measured.as_mut(), direct) {
            t.secs[d] = [f64::INFINITY; 4];
        }
    }
    let direct_before = busbw_collectives::direct::tally(comm);

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
                    warmed: &mut warmed,
                };
                sweep(comm, plan, &mut st, c, &mut sink)?;
            }
        }
    }
    // Say so where the direct AllReduce that was asked for (or chosen) ran the ring.
    let (ran, fell_back, why) = busbw_collectives::direct::tally(comm);
    let fell_back = fell_back - direct_before.1;
    if let (Some(sink), true, Some(why)) = (sink, fell_back > 0, why) {
        sink.comment(&format!(
            "# direct AllReduce: {fell_back} of {} calls ran the ring instead: {}",
            fell_back + ran - direct_before.0,
            why.describe()
        ))
        .context("writing the results")?;
    }
    if let Some(m) = meter {
        summary.memory = Some(m.finish(comm, dev)?);
    }
    Ok(summary)
}

/// `-M`: the memory figures at each phase boundary (see `memory.rs`).
struct Meter {
    /// Host: resident bytes; device: free bytes, at the start of the phase being measured.
    joined: u64,
    initialization: i64,
    user_allocated: i64,
    ready: u64,
}

impl Meter {
    /// Before the buffers are allocated: the job is joined.
    fn start(plan: &Plan, dev: Option<&mut DeviceMem>) -> Result<Option<Meter>> {
        if !plan.memory_report {
            return Ok(None);
        }
        let (joined, initialization) = match dev {
            Some(d) => {
                let free = d.free_memory()?;
                (free, d.opened_free() as i64 - free as i64)
            }
            None => {
                let now = memory::resident();
                (now, now as i64 - memory::start() as i64)
            }
        };
        Ok(Some(Meter {
            joined,
            initialization,
            user_allocated: 0,
            ready: 0,
        }))
    }

    /// After the buffers are allocated (`host` bytes of this rank's host buffers). With
    /// several ranks per process, the resident memory is theirs together: a barrier lets
    /// every rank allocate first, and the process's buffers are counted exactly.
    fn allocated(
        &mut self,
        comm: &mut Communicator,
        plan: &Plan,
        host: u64,
        dev: Option<&mut DeviceMem>,
    ) -> Result<()> {
        match dev {
            Some(d) => {
                self.ready = d.free_memory()?;
                self.user_allocated = self.joined as i64 - self.ready as i64;
            }
            None => {
                barrier(comm).context("barrier after allocating the buffers")?;
                self.ready = memory::resident();
                let process = host as i64 * plan.ranks_per_process() as i64;
                self.user_allocated = process;
                // Whatever else arrived since the job was joined (other ranks' joins on this
                // process's threads) belongs to initialisation.
                self.initialization += self.ready as i64 - self.joined as i64 - process;
            }
        }
        Ok(())
    }

    /// After the sweep: what the collectives kept (staging, connections, registrations),
    /// then the largest figures over the job.
    fn finish(self, comm: &mut Communicator, dev: Option<&mut DeviceMem>) -> Result<MemoryUsage> {
        let (kind, collective) = match dev {
            Some(d) => ("GPU", self.ready as i64 - d.free_memory()? as i64),
            None => {
                barrier(comm).context("barrier before measuring memory")?;
                ("Host", memory::resident() as i64 - self.ready as i64)
            }
        };
        let mut v = [self.initialization, self.user_allocated, collective];
        all_reduce_values(comm, &mut v, ReduceOp::Max).context("combining -M's figures")?;
        Ok(MemoryUsage {
            kind: kind.into(),
            initialization: v[0],
            user_allocated: v[1],
            collective: v[2],
        })
    }
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
    /// Whether a cell has warmed up in this process yet.
    warmed: &'a mut bool,
}

/// Where a rank's data lives: the device's buffers under `-g`, else the host's (the fields
/// of a [`State`], apart so that its other fields stay borrowable).
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
                anyhow::bail!("failing on purpose at {size} bytes (--debug-fail-rank {rank})");
            }
            let counts = (spec.counts)(size, dtype, n);
            let mut cells = [None, None];
            let mut details = [None, None];
            let mut comments = Vec::new();
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

/// Where a cell's buffers live. The timed loop, its clock, the combined timing and the
/// checks are one code path (`bench`) whatever the memory; only the operation and the
/// validation run differ.
trait Memory {
    /// How many span-sized offsets the buffers hold (nccl-tests' rotation).
    fn shifts(&self, span: usize) -> usize;
    /// Input data for the timed runs, when they are checked afterwards.
    fn prime(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
    ) -> Result<()>;
    /// One operation with its data `off` bytes in. With `timed`, the operation's own time
    /// when this memory measures it (device events), `None` for the host clock's laps.
    fn op(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
        off: usize,
        timed: bool,
    ) -> Result<Option<f64>>;
    /// One validation run: fresh data for `vctx`, the operation, this rank's wrong count
    /// over `checked` (flipping a bit there first when `corrupt`).
    fn validate(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        vctx: &DataCtx,
        checked: std::ops::Range<usize>,
        corrupt: bool,
    ) -> Result<u64>;
}

impl Memory for Buffers {
    fn shifts(&self, span: usize) -> usize {
        let (send, recv) = (self.send.len(), self.recv.len());
        (send.max(recv) - self.base)
            .checked_div(span)
            .unwrap_or(1)
            .max(1)
    }
    fn prime(
        &mut self,
        _comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
    ) -> Result<()> {
        (spec.init)(ctx, &mut self.fill(ctx.dtype, false));
        Ok(())
    }
    fn op(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
        off: usize,
        _timed: bool,
    ) -> Result<Option<f64>> {
        let (sb, span) = (
            ctx.counts.send_bytes,
            ctx.counts.send_bytes.max(ctx.counts.recv_bytes),
        );
        let send = &self.send.as_slice()[self.base..];
        let recv = &mut self.recv.as_mut_slice()[self.base..];
        let s = &send[off.min(send.len().saturating_sub(sb))..];
        let roff = off.min(recv.len().saturating_sub(span));
        (spec.run)(comm, s, &mut recv[roff..], MemorySpace::Host, ctx)?;
        Ok(None)
    }
    fn validate(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        vctx: &DataCtx,
        checked: std::ops::Range<usize>,
        corrupt: bool,
    ) -> Result<u64> {
        let span = vctx.counts.send_bytes.max(vctx.counts.recv_bytes);
        self.recv()[..span].fill(0);
        (spec.init)(vctx, &mut self.fill(vctx.dtype, true));
        let send = &self.send.as_slice()[self.base..];
        let recv = &mut self.recv.as_mut_slice()[self.base..];
        (spec.run)(comm, send, recv, MemorySpace::Host, vctx)?;
        if corrupt && !checked.is_empty() {
            recv[checked.start] ^= 0x01;
        }
        Ok(match &self.expected {
            Some(e) => count_wrong(
                vctx.dtype,
                vctx.op,
                &recv[checked.clone()],
                &e.as_slice()[..checked.len()],
            ),
            None => 0,
        })
    }
}

/// Device buffers (`-g 1`; `gpu.rs`): each operation staged through the pinned twins and
/// lapped with CUDA events, the data made and checked on the device.
impl Memory for DeviceMem {
    fn shifts(&self, span: usize) -> usize {
        DeviceMem::shifts(self, span)
    }
    fn prime(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
    ) -> Result<()> {
        self.validate(comm, spec.init, spec.run, ctx, 0..0, false)
            .map(drop)
    }
    fn op(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        ctx: &DataCtx,
        off: usize,
        timed: bool,
    ) -> Result<Option<f64>> {
        DeviceMem::op(self, comm, spec.run, ctx, off, off, timed)
    }
    fn validate(
        &mut self,
        comm: &mut Communicator,
        spec: &CollectiveSpec,
        vctx: &DataCtx,
        checked: std::ops::Range<usize>,
        corrupt: bool,
    ) -> Result<u64> {
        DeviceMem::validate(self, comm, spec.init, spec.run, vctx, checked, corrupt)
    }
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
    st: &mut State,
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
    // inside a sweep (sweep_fidelity.sh, 5 rounds) after it, 0.92 after two (BENCHMARKS.md,
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
    let laps = own_laps.as_deref().unwrap_or(&clock.laps);
    let (t, algbw, busbw, detail) = timing(comm, plan, ctx, secs, laps)?;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::OnceLock;
    use std::time::Duration;

    thread_local! {
        /// The fake clock's reading, as an offset from a fixed instant.
        static FAKE: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }
    fn fake_now() -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now) + FAKE.with(|f| f.get())
    }
    fn advance(d: Duration) {
        FAKE.with(|f| f.set(f.get() + d));
    }

    /// 3 iterations of 2 operations, each operation 10 ms and each barrier 1 s on a fake
    /// clock: returns (seconds per operation, laps, barriers run).
    fn run(blocking: Blocking) -> (f64, Vec<f64>, usize) {
        let (iters, agg) = (3u32, 2u32);
        let mut clock = Clock::with(blocking, agg, iters, fake_now);
        let mut barriers = 0;
        for k in 0..(iters * agg) as usize {
            advance(Duration::from_millis(10));
            clock
                .after_op_with(k, || {
                    barriers += 1;
                    advance(Duration::from_secs(1));
                    Ok(())
                })
                .unwrap();
        }
        (clock.per_op((iters * agg) as usize), clock.laps, barriers)
    }

    #[test]
    fn blocking_modes_put_their_barriers_inside_or_outside_the_time() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // -z 0/2: no barrier; each iteration's lap is its operations' mean.
        let (t, laps, b) = run(Blocking::Off);
        assert_eq!(b, 0);
        assert!(close(t, 0.010), "{t}");
        assert!(
            laps.len() == 3 && laps.iter().all(|&l| close(l, 0.010)),
            "{laps:?}"
        );
        // -z 1: a barrier after every operation, timed.
        let (t, laps, b) = run(Blocking::EachOp);
        assert_eq!(b, 6);
        assert!(close(t, 1.010), "{t}");
        assert!(laps.iter().all(|&l| close(l, 1.010)), "{laps:?}");
        // -z 3: a barrier after every iteration, left out of the time and the laps.
        let (t, laps, b) = run(Blocking::EachIter);
        assert_eq!(b, 3);
        assert!(close(t, 0.010), "{t}");
        assert!(laps.iter().all(|&l| close(l, 0.010)), "{laps:?}");
    }

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

    /// `busbw all_reduce_perf <flags>` on two in-process ranks with `run` as the AllReduce:
    /// each rank's count of wrong elements, and what `log` recorded (taken out of it).
    fn run_spied(
        flags: &str,
        run: crate::specs::RunFn,
        log: &std::sync::Mutex<Vec<Seen>>,
    ) -> (Plan, Vec<u64>, Vec<Seen>) {
        use clap::Parser;
        let args = ["busbw", "all_reduce_perf"]
            .into_iter()
            .chain(flags.split_whitespace());
        let cli = crate::cli::Cli::try_parse_from(args).unwrap();
        let real = crate::specs::find("all_reduce").unwrap();
        let spec: &'static crate::specs::CollectiveSpec =
            Box::leak(Box::new(crate::specs::CollectiveSpec { run, ..*real }));
        let plan = Plan::new(spec, cli.command.args().unwrap()).unwrap();
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
        let flags = "-b 64 -e 256 -f 2 -n 3 -u 3 -d float";
        let (plan, wrong, seen) = run_spied(flags, unalign_spy, &UNALIGNED);
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
        let flags = format!("-b 64 -e {max} -f 4 -n 40 -c 0 -d float --rotate {rotate}");
        let (_, _, seen) = run_spied(&flags, rotation_spy, &ROTATED);
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
}
