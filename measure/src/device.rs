//! `-g`: this rank's buffers on a CUDA device (feature `cuda`; docs/cuda.md).
//!
//! TCP and shared memory move host memory, so each device buffer has a pinned host twin and
//! each operation's data names the device as its memory space (`collectives::space`): ring,
//! chain and tree algorithms copy their own input out per
//! segment, reduce what arrives on the device and copy back only what travels on, all
//! overlapped with the network; recursive doubling and the point-to-point collectives are
//! staged around the operation. A row's time therefore includes the PCIe copies and device
//! reductions a job without GPUDirect pays. Each iteration is also timed with CUDA events on
//! the device's stream; those laps are the per-iteration statistics of device rows.
//!
//! Without feature `cuda` [`DeviceMem`] is uninhabited: the harness's device branches
//! compile and are never taken.

use crate::error::{Context, Result};
use crate::specs::{CollectiveSpec, DataCtx};
use busbw_collectives::cuda::select::Slot;
use busbw_collectives::Communicator;
use std::ops::Range;

/// The usage error of `-g` in a build without CUDA.
pub const NO_CUDA_BUILD: &str = "-g/--ngpus asks for CUDA device buffers, which this build lacks: \
rebuild with `cargo build --release --features cuda` (no CUDA toolkit needed to build), or drop -g \
to run on host memory";

/// What the `Using devices` line of a rank says about its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLine {
    pub index: usize,
    pub pci: String,
    pub name: String,
}

impl GpuLine {
    /// Packed for the rendezvous exchange: `index\tpci\tname`.
    pub fn encode(&self) -> String {
        format!(
            "{}\t{}\t{}",
            self.index,
            self.pci,
            self.name.replace('\t', " ")
        )
    }
    pub fn decode(s: &str) -> Option<GpuLine> {
        let mut f = s.splitn(3, '\t');
        Some(GpuLine {
            index: f.next()?.parse().ok()?,
            pci: f.next()?.to_string(),
            name: f.next()?.to_string(),
        })
    }
}

#[cfg(feature = "cuda")]
pub use imp::DeviceMem;

/// One row of the kernel table: what ran, bytes moved per run, seconds per run.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn bench_row(kernel: &str, dtype: &str, moved: usize, secs: f64, copy_gbs: f64) -> String {
    let gbs = if secs > 0.0 {
        moved as f64 / secs / 1e9
    } else {
        0.0
    };
    let rel = if copy_gbs > 0.0 {
        gbs / copy_gbs * 100.0
    } else {
        0.0
    };
    format!(
        "  {kernel:<14} {dtype:>9} {:>10.1} {gbs:>9.1} {rel:>8.0}%",
        secs * 1e6
    )
}

/// Header lines of the kernel table.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn bench_header(device: &str, bytes: usize, iters: u32) -> Vec<String> {
    vec![
        format!(
            "# gpu-bench: {device}, {bytes} bytes per operand, {iters} iterations, CUDA event time"
        ),
        format!(
            "# {:<14} {:>9} {:>10} {:>9} {:>9}",
            "kernel", "type", "time(us)", "GB/s", "vs copy"
        ),
    ]
}

/// The path line of a job split by host and rail (`peer::Hierarchy`): whether this
/// host's ranks agreed to go GPU to GPU (`local`: why not), and on how many hosts the
/// ranks did, counted by each host's first rank (`first`). Every rank calls it at the
/// same point.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn across_hosts(
    comm: &mut Communicator,
    rail_line: &str,
    local: Option<String>,
    first: bool,
) -> Result<String> {
    // Each host's first rank counts its host, and whether its ranks agreed.
    let mut agreed = if first {
        [u32::from(local.is_none()), 1]
    } else {
        [0, 0]
    };
    busbw_collectives::all_reduce_values(comm, &mut agreed, busbw_collectives::ReduceOp::Sum)
        .context("counting the hosts whose GPUs talk directly")?;
    let [ok, hosts] = agreed;
    let inside = if ok == hosts {
        format!("of each of the {hosts} hosts")
    } else {
        let here = local
            .map(|w| format!(", here because {w}"))
            .unwrap_or_default();
        format!("of {ok} of the {hosts} hosts (elsewhere staged{here})")
    };
    Ok(format!(
        "GPU to GPU between the ranks {inside} (CUDA IPC, peer access); between hosts one \
         rail per local rank (each rank's share), {rail_line}; every collective"
    ))
}

/// Times the device's copy and reduction kernels (`busbw gpu-bench`).
#[cfg(not(feature = "cuda"))]
pub fn kernel_bench(
    _device: usize,
    _bytes: usize,
    _iters: u32,
    _dtypes: &[busbw_collectives::DataType],
    _op: busbw_collectives::ReduceOp,
) -> Result<Vec<String>> {
    Err(crate::Error::Usage(NO_CUDA_BUILD.into()))
}

#[cfg(feature = "cuda")]
pub use imp::kernel_bench;

#[cfg(not(feature = "cuda"))]
pub enum DeviceMem {}

#[cfg(not(feature = "cuda"))]
impl DeviceMem {
    pub fn open(_slot: Slot) -> Result<DeviceMem> {
        Err(crate::Error::Usage(NO_CUDA_BUILD.into()))
    }
    pub fn line(&self) -> GpuLine {
        match *self {}
    }
    pub fn choose_path(&mut self, _comm: &mut Communicator) -> Result<String> {
        match *self {}
    }
    pub fn reserve(
        &mut self,
        _comm: &mut Communicator,
        _send: usize,
        _recv: usize,
        _check: bool,
    ) -> Result<()> {
        match *self {}
    }
    pub fn release(&mut self, _comm: &mut Communicator) -> Result<()> {
        match *self {}
    }
    pub fn shifts(&self, _span: usize) -> usize {
        match *self {}
    }
    pub fn set_unalign(&mut self, _bytes: usize) {
        match *self {}
    }
    pub fn free_memory(&mut self) -> Result<u64> {
        match *self {}
    }
    pub fn bind(&self) -> Result<()> {
        match *self {}
    }
    pub fn use_nccl(
        &mut self,
        _comm: busbw_collectives::nccl::Comm<'static>,
        _timeout: std::time::Duration,
    ) {
        match *self {}
    }
    pub fn split_nccl(&mut self, _color: Option<usize>, _key: usize, _size: usize) -> Result<()> {
        match *self {}
    }
    pub fn opened_free(&self) -> u64 {
        match *self {}
    }
    pub fn op(
        &mut self,
        _comm: &mut Communicator,
        _spec: &CollectiveSpec,
        _ctx: &DataCtx,
        _soff: usize,
        _roff: usize,
        _timed: bool,
    ) -> Result<Option<f64>> {
        match *self {}
    }
    pub fn validate(
        &mut self,
        _comm: &mut Communicator,
        _spec: &CollectiveSpec,
        _ctx: &DataCtx,
        _checked: Range<usize>,
        _corrupt: bool,
    ) -> Result<u64> {
        match *self {}
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use crate::error::Context;
    use crate::specs::nccl::{Enqueue, NcclCall};
    use crate::specs::{Buf, Fill, Gen};
    use busbw_collectives::algorithms::peer;
    use busbw_collectives::cuda::device::{
        CudaError, DeviceBuffer, EventTimer, Gpu, GpuInfo, Marks, Pinned,
    };
    use busbw_collectives::cuda::gpudirect;
    use busbw_collectives::cuda::offload::CudaOffload;
    use busbw_collectives::cuda::select::select_device;
    use busbw_collectives::nccl::NcclError;
    use busbw_collectives::{CommError, MemorySpace, Mirror};

    /// A rank's device, its send/receive/expected buffers and their pinned twins. The
    /// device lives in its [`CudaOffload`], which each operation's data names as its memory
    /// space (so the collectives reduce on the device and copy per segment).
    pub struct DeviceMem {
        dev: CudaOffload,
        info: GpuInfo,
        timer: EventTimer,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        expected: Option<DeviceBuffer>,
        hsend: Pinned,
        hrecv: Pinned,
        /// `-u` in bytes: where the send and receive data start in their buffers.
        base: usize,
        /// Free device memory once the device was open (`-M`'s starting point).
        opened_free: u64,
        /// `--engine nccl`: the communicator the collectives run on (a group's, under a
        /// split), and how long an operation may take before it is aborted (`-T`).
        nccl: Option<NcclComm>,
        nccl_parent: Option<NcclComm>,
        nccl_timeout: std::time::Duration,
        /// The boundaries of a deferred loop's iterations (`-z 0` through NCCL).
        marks: Marks,
    }

    type NcclComm = busbw_collectives::nccl::Comm<'static>;

    /// An NCCL failure during an operation, as the collectives' own failures read: a timeout
    /// is a timeout (the job then names who stopped answering), an asynchronous error a
    /// failure the peers caused, anything else a device error.
    fn nccl_error(rank: usize, what: String, e: NcclError) -> crate::Error {
        match e {
            NcclError::Timeout { secs, .. } => CommError::Timeout {
                rank,
                peer: None,
                secs,
                what: format!("in {what} (NCCL's operation did not complete; the communicator was aborted with ncclCommAbort)"),
            }
            .into(),
            e @ NcclError::Async { .. } => CommError::Aborted {
                rank,
                reason: format!("NCCL: {e}"),
            }
            .into(),
            e => crate::Error::Context {
                what: format!("rank {rank}: {what}"),
                source: Box::new(crate::Error::Device(Box::new(e))),
            },
        }
    }

    /// [`Fill`] on the device: each fill is a generator kernel launch. The first error is
    /// kept (the trait's methods cannot fail) and reported after the descriptor's init.
    struct DeviceFill<'a> {
        gpu: &'a mut Gpu,
        dtype: busbw_collectives::DataType,
        send: &'a mut DeviceBuffer,
        recv: &'a mut DeviceBuffer,
        expected: Option<&'a mut DeviceBuffer>,
        /// `-u` in bytes, added to every send and receive offset.
        base: usize,
        err: Option<CudaError>,
    }

    impl DeviceFill<'_> {
        fn keep(&mut self, r: Result<(), CudaError>) {
            if let (Err(e), None) = (r, &self.err) {
                self.err = Some(e);
            }
        }
        /// The device and the buffer `to`, borrowed together; `None` for a missing expected
        /// buffer.
        /// The device, the buffer `to` and where its data starts, borrowed together; `None`
        /// for a missing expected buffer.
        fn parts(&mut self, to: Buf) -> Option<(&mut Gpu, &mut DeviceBuffer, usize)> {
            let (b, base) = match to {
                Buf::Send => (&mut *self.send, self.base),
                Buf::Recv => (&mut *self.recv, self.base),
                Buf::Expected => (self.expected.as_deref_mut()?, 0),
            };
            Some((&mut *self.gpu, b, base))
        }
    }

    impl Fill for DeviceFill<'_> {
        fn input(&mut self, to: Buf, off: usize, len: usize, g: Gen) {
            let d = self.dtype;
            if let Some((gpu, b, base)) = self.parts(to) {
                let count = len / d.size();
                let off = base + off;
                let r = gpu.fill_input(b, off, count, d, g.op, g.seed, g.first, g.rank, g.nranks);
                self.keep(r);
            }
        }
        fn expected(&mut self, off: usize, len: usize, g: Gen) {
            let d = self.dtype;
            if let Some((gpu, e, _)) = self.parts(Buf::Expected) {
                let count = len / d.size();
                let r = gpu.fill_expected(e, off, count, d, g.op, g.seed, g.first, g.nranks);
                self.keep(r);
            }
        }
        fn zero(&mut self, to: Buf, off: usize, len: usize) {
            if let Some((gpu, b, base)) = self.parts(to) {
                let r = gpu.zero(b, base + off, len);
                self.keep(r);
            }
        }
        fn has_expected(&self) -> bool {
            self.expected.is_some()
        }
    }

    /// Times a device-to-device copy of `bytes` (2 × bytes moved) and each type's
    /// out-of-place reduction `dst = a op b` (3 × bytes moved) with CUDA events.
    pub fn kernel_bench(
        device: usize,
        bytes: usize,
        iters: u32,
        dtypes: &[busbw_collectives::DataType],
        op: busbw_collectives::ReduceOp,
    ) -> Result<Vec<String>> {
        let mut gpu = Gpu::open(device)?;
        let info = gpu.info().clone();
        let timer = gpu.timer()?;
        let (mut a, mut b, mut dst) = (gpu.alloc(bytes)?, gpu.alloc(bytes)?, gpu.alloc(bytes)?);
        let mut out = bench_header(
            &format!("device {} [{}] {}", info.index, info.pci, info.name),
            bytes,
            iters,
        );
        let time = |gpu: &mut Gpu, f: &mut dyn FnMut(&mut Gpu) -> Result<()>| -> Result<f64> {
            f(gpu)?;
            timer.start(gpu)?;
            for _ in 0..iters {
                f(gpu)?;
            }
            timer.stop(gpu)?;
            Ok(timer.elapsed_s()? / iters as f64)
        };
        let copy = time(&mut gpu, &mut |g| Ok(g.copy_dtod(&mut dst, &a, bytes)?))?;
        let copy_gbs = 2.0 * bytes as f64 / copy / 1e9;
        out.push(bench_row("copy (dtod)", "-", 2 * bytes, copy, copy_gbs));
        for &d in dtypes {
            let count = bytes / d.size();
            gpu.fill_input(&mut a, 0, count, d, op, 1, 0, 0, 2)?;
            gpu.fill_input(&mut b, 0, count, d, op, 1, 0, 1, 2)?;
            let t = time(&mut gpu, &mut |g| {
                Ok(g.reduce(&mut dst, &a, &b, count, d, op)?)
            })?;
            out.push(bench_row(
                &format!("reduce {}", op.name()),
                d.name(),
                3 * count * d.size(),
                t,
                copy_gbs,
            ));
        }
        Ok(out)
    }

    /// The device, when no operation holds it (always, between operations).
    impl DeviceMem {
        /// Selects (nccl-tests' rule) and opens the device of the rank at `slot`.
        pub fn open(slot: Slot) -> Result<DeviceMem> {
            let visible = busbw_collectives::cuda::device::device_count()?;
            let env = std::env::var("NCCL_TESTS_DEVICE").ok();
            let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            let choice = select_device(slot, visible, env.as_deref(), cvd.as_deref())?;
            let gpu = Gpu::open(choice.index)?;
            let timer = gpu.timer()?;
            let marks = gpu.marks();
            let (send, recv) = (gpu.alloc(1)?, gpu.alloc(1)?);
            let (hsend, hrecv) = (gpu.alloc_pinned(1)?, gpu.alloc_pinned(1)?);
            let info = gpu.info().clone();
            let opened_free = gpu.free_memory()?;
            Ok(DeviceMem {
                dev: CudaOffload::new(gpu),
                info,
                timer,
                send,
                recv,
                expected: None,
                hsend,
                hrecv,
                base: 0,
                opened_free,
                nccl: None,
                nccl_parent: None,
                nccl_timeout: std::time::Duration::from_secs(300),
                marks,
            })
        }

        /// Makes the device current on the calling thread: NCCL joins a rank on it.
        pub fn bind(&self) -> Result<()> {
            Ok(self.dev.gpu_ref().bind()?)
        }

        /// `--engine nccl`: from now on every operation runs on `comm`, each waited for at
        /// most `timeout` before the communicator is aborted.
        pub fn use_nccl(&mut self, comm: NcclComm, timeout: std::time::Duration) {
            self.nccl = Some(comm);
            self.nccl_timeout = timeout;
        }

        /// A group of the job (`NCCL_TESTS_SPLIT`, a tier's groups): from now on this rank's
        /// operations run on `ncclCommSplit` of the job's communicator by `color` (`None`:
        /// no group this time), numbered by `key`, `size` ranks. Every rank of the job calls
        /// it, in the same order; each split starts again from the job's communicator.
        pub fn split_nccl(&mut self, color: Option<usize>, key: usize, size: usize) -> Result<()> {
            let parent = match self.nccl_parent.take() {
                Some(p) => p,
                None => self
                    .nccl
                    .take()
                    .ok_or_else(|| crate::Error::Usage("no NCCL communicator to split".into()))?,
            };
            self.nccl = None;
            let group = parent.split(color, key, size);
            self.nccl_parent = Some(parent);
            self.nccl = group
                .map_err(|e| crate::Error::Device(Box::new(e)))
                .context("splitting NCCL's communicator into the groups (ncclCommSplit)")?;
            Ok(())
        }

        /// One operation through NCCL on the device buffers at `soff` and `roff`, enqueued
        /// on the device's stream and waited for (polling, so `-T` can abort it).
        fn nccl_op(
            &mut self,
            rank: usize,
            spec: &CollectiveSpec,
            ctx: &DataCtx,
            soff: usize,
            roff: usize,
            timed: bool,
        ) -> Result<Option<f64>> {
            if timed {
                self.timer.start(self.dev.gpu())?;
            }
            self.nccl_enqueue(rank, spec, ctx, soff, roff)?;
            if timed {
                self.timer.stop(self.dev.gpu())?;
            }
            self.nccl_wait(rank, spec)?;
            if timed {
                return Ok(Some(self.timer.elapsed_s()?));
            }
            Ok(None)
        }

        /// Enqueues one operation through NCCL on the device buffers at `soff` and `roff`
        /// (already placed by [`DeviceMem::place`]), without waiting for it.
        fn nccl_enqueue(
            &mut self,
            rank: usize,
            spec: &CollectiveSpec,
            ctx: &DataCtx,
            soff: usize,
            roff: usize,
        ) -> Result<()> {
            let Some(comm) = self.nccl.as_mut() else {
                return Err(crate::Error::Usage(format!(
                    "rank {rank}: {} through NCCL outside any group of the split",
                    spec.program
                )));
            };
            let gpu = self.dev.gpu();
            let (send, recv) = (
                gpu.address(&self.send, soff)?,
                gpu.address(&self.recv, roff)?,
            );
            let stream = gpu.raw_stream();
            // SAFETY: the device's own stream; the descriptors' addresses lie inside the send
            // and receive buffers, which `reserve` sized for the row and which outlive the
            // wait that follows (`nccl_wait`, or `settle` after a deferred loop: buffers are
            // replaced only between cells).
            let mut ops = unsafe { Enqueue::new(comm, stream) };
            let mut call = NcclCall {
                ops: &mut ops,
                send,
                recv,
            };
            (spec.nccl)(&mut call, ctx)
                .map_err(|e| nccl_error(rank, format!("{} through NCCL", spec.program), e))
        }

        /// Waits for everything enqueued on the stream, polling NCCL's asynchronous error;
        /// aborts the communicator after `-T`.
        fn nccl_wait(&mut self, rank: usize, spec: &CollectiveSpec) -> Result<()> {
            let Some(comm) = self.nccl.as_mut() else {
                return Ok(());
            };
            let gpu = &*self.dev.gpu();
            // The program's name, not a formatted one: this runs for every operation, and the
            // words are only needed on a failure (`nccl_error` adds them).
            comm.wait(spec.program, self.nccl_timeout, &mut || {
                gpu.stream_done().map_err(|e| e.to_string())
            })
            .map_err(|e| nccl_error(rank, format!("{} through NCCL", spec.program), e))
        }

        /// `-z 0` through NCCL, as nccl-tests runs it: the timed loop enqueues every
        /// operation (each iteration's `-m` operations in one group) and waits once, and the
        /// iterations' times are events recorded between them. `None` on busbw's own engine,
        /// whose operations complete on the host.
        pub fn deferred(&mut self) -> Option<&mut DeviceMem> {
            self.nccl.is_some().then_some(self)
        }

        /// Before a deferred loop: its first boundary.
        pub fn defer_open(&mut self) -> Result<()> {
            self.marks.clear();
            Ok(self.marks.record(self.dev.gpu())?)
        }

        /// Starts an iteration of `agg` deferred operations: a group when there are several.
        pub fn defer_iteration(&mut self, rank: usize, agg: usize) -> Result<()> {
            match self.nccl.as_mut() {
                Some(c) if agg > 1 => c
                    .group_start()
                    .map_err(|e| nccl_error(rank, "opening an iteration's group".into(), e)),
                _ => Ok(()),
            }
        }

        /// One deferred operation with its data `off` bytes in.
        pub fn defer_op(
            &mut self,
            rank: usize,
            spec: &CollectiveSpec,
            ctx: &DataCtx,
            off: usize,
        ) -> Result<()> {
            let (soff, roff) = self.place(ctx, off, off);
            self.nccl_enqueue(rank, spec, ctx, soff, roff)
        }

        /// Ends an iteration: launches its group, records its boundary.
        pub fn defer_iteration_done(&mut self, rank: usize, agg: usize) -> Result<()> {
            if let Some(c) = self.nccl.as_mut().filter(|_| agg > 1) {
                c.group_end()
                    .map_err(|e| nccl_error(rank, "launching an iteration's group".into(), e))?;
            }
            Ok(self.marks.record(self.dev.gpu())?)
        }

        /// Waits for the whole deferred loop (at most `-T`), and returns each iteration's
        /// seconds, from its boundaries.
        pub fn defer_settle(&mut self, rank: usize, spec: &CollectiveSpec) -> Result<Vec<f64>> {
            self.nccl_wait(rank, spec)?;
            Ok(self.marks.stretches_s()?)
        }

        /// `-u`: the send and receive data start `bytes` into their buffers (which the
        /// harness reserved that much larger).
        pub fn set_unalign(&mut self, bytes: usize) {
            self.base = bytes;
        }

        /// Free device memory now (nccl-tests' `-M` takes differences of it).
        pub fn free_memory(&mut self) -> Result<u64> {
            Ok(self.dev.gpu().free_memory()?)
        }

        pub fn opened_free(&self) -> u64 {
            self.opened_free
        }

        pub fn line(&self) -> GpuLine {
            let i = &self.info;
            GpuLine {
                index: i.index,
                pci: i.pci.clone(),
                name: i.name.clone(),
            }
        }

        /// Decides how device data moves (GPU to GPU where every rank is on this host and
        /// every device reaches every other's, agreed with the other ranks: every rank calls
        /// this at the same point; else GPUDirect RDMA where the NIC registers device memory,
        /// else staged through the twins), tells the offload, and returns the line rank 0
        /// prints, with why device data is not moved GPU to GPU. A job split by host and rail
        /// (`peer::Hierarchy`) agrees per host instead, and says on how many hosts.
        pub fn choose_path(&mut self, comm: &mut Communicator) -> Result<String> {
            let props = comm.transport().properties();
            let sysfs = std::path::Path::new("/sys");
            let (path, line) = gpudirect::path_line(&props, None, self.info.dmabuf, sysfs);
            self.dev.set_path(path);
            self.dev.offer_peers(true);
            if let Some(h) = peer::hierarchy(comm) {
                let local = peer::agree(h.node(), &mut self.dev)
                    .context("agreeing whether this host's GPUs talk directly")?;
                let first = h.node().rank() == 0;
                return super::across_hosts(comm, &line, local, first);
            }
            let why = peer::agree(comm, &mut self.dev)
                .context("agreeing whether local GPUs talk directly")?;
            let Some(why) = why else {
                return Ok(
                    "GPU to GPU between the ranks of this host (CUDA IPC, peer access): \
                    reductions by kernels reading the peers' buffers in place, copies by the \
                    copy engines, every collective"
                        .into(),
                );
            };
            let around = "recursive doubling and point-to-point staged around the operation";
            Ok(match path {
                gpudirect::DevicePath::Staged => format!(
                    "{line}; reductions on the device, copies per segment overlapped with the \
                     network (ring, tree, chains; {around})"
                ),
                _ => format!(
                    "{line}; ring, tree and chains send and receive device memory, reduce on \
                     the device and fall back to the twins where a connection refuses it; {around}"
                ),
            } + &format!("; not GPU to GPU: {why}"))
        }

        /// Closes this rank's mappings of its peers' buffers once every rank has finished
        /// with them (every rank calls it at the same point): before device buffers are
        /// freed, since CUDA leaves freeing memory a peer still maps undefined.
        pub fn release(&mut self, comm: &mut Communicator) -> Result<()> {
            peer::release(comm, &mut self.dev).context("closing the peers' device buffers")
        }

        /// Replaces the device buffers (every rank at the same point: peers' mappings of the
        /// old ones are closed first).
        pub fn reserve(
            &mut self,
            comm: &mut Communicator,
            send: usize,
            recv: usize,
            check: bool,
        ) -> Result<()> {
            self.release(comm)?;
            // The dma-bufs of the buffers about to be replaced.
            self.dev.forget_exports();
            let g = self.dev.gpu();
            let what = |b: usize, w: &str| format!("allocating {b} bytes of {w} memory; lower -e");
            self.send = g.alloc(send).with_context(|| what(send, "device send"))?;
            self.recv = g
                .alloc(recv)
                .with_context(|| what(recv, "device receive"))?;
            self.hsend = g
                .alloc_pinned(send)
                .with_context(|| what(send, "pinned send"))?;
            self.hrecv = g
                .alloc_pinned(recv)
                .with_context(|| what(recv, "pinned receive"))?;
            if check {
                self.expected = Some(
                    g.alloc(recv)
                        .with_context(|| what(recv, "device expected"))?,
                );
            }
            let whole = [
                (g.address(&self.send, 0)?, self.send.len()),
                (g.address(&self.recv, 0)?, self.recv.len()),
            ];
            self.dev
                .export_buffers(&whole)
                .context("exporting the device buffers for GPUDirect RDMA")?;
            Ok(())
        }

        /// Buffer-offset rotations that fit (as the host path computes them).
        pub fn shifts(&self, span: usize) -> usize {
            (self.send.len().max(self.recv.len()) - self.base)
                .checked_div(span)
                .unwrap_or(1)
                .max(1)
        }

        /// Where an operation's send and receive data start for offsets `soff` and `roff`
        /// into the rotation: after `-u`'s bytes, kept inside the buffers.
        fn place(&self, ctx: &DataCtx, soff: usize, roff: usize) -> (usize, usize) {
            let sb = ctx.counts.send_bytes;
            let span = sb.max(ctx.counts.recv_bytes);
            (
                (self.base + soff).min(self.send.len().saturating_sub(sb)),
                (self.base + roff).min(self.recv.len().saturating_sub(span)),
            )
        }

        /// One operation on device data: the collective runs on the pinned twins in the
        /// device's memory space, so ring, chain and tree reduce on the device and copy per
        /// segment, overlapped with the network, and the other algorithms are staged around
        /// (`collectives::space`). Returns the CUDA-event time of the whole when `timed`.
        pub fn op(
            &mut self,
            comm: &mut Communicator,
            spec: &CollectiveSpec,
            ctx: &DataCtx,
            soff: usize,
            roff: usize,
            timed: bool,
        ) -> Result<Option<f64>> {
            let (sb, rb) = (ctx.counts.send_bytes, ctx.counts.recv_bytes);
            let span = sb.max(rb);
            let (soff, roff) = self.place(ctx, soff, roff);
            if self.nccl.is_some() || self.nccl_parent.is_some() {
                return self.nccl_op(comm.rank(), spec, ctx, soff, roff, timed);
            }
            let run = spec.run;
            let hs = self.hsend.as_mut_slice()?;
            let hr = self.hrecv.as_mut_slice()?;
            let mirrors = vec![
                Mirror {
                    host: hs.as_mut_ptr(),
                    device: self.dev.gpu().address(&self.send, soff)?,
                    len: sb,
                },
                Mirror {
                    host: hr.as_mut_ptr(),
                    device: self.dev.gpu().address(&self.recv, roff)?,
                    len: span,
                },
            ];
            self.dev.set_mirrors(mirrors)?;
            if timed {
                self.timer.start(self.dev.gpu())?;
            }
            let space = MemorySpace::Device(&mut self.dev);
            run(comm, &hs[..sb], &mut hr[..span], space, ctx)?;
            if timed {
                self.timer.stop(self.dev.gpu())?;
                return Ok(Some(self.timer.elapsed_s()?));
            }
            Ok(None)
        }

        /// One validation run: the descriptor's data made on the device (generator
        /// kernels), the operation, and the `#wrong` count computed on the device: only the
        /// count crosses PCIe.
        pub fn validate(
            &mut self,
            comm: &mut Communicator,
            spec: &CollectiveSpec,
            ctx: &DataCtx,
            checked: Range<usize>,
            corrupt: bool,
        ) -> Result<u64> {
            let init = spec.init;
            let span = ctx.counts.send_bytes.max(ctx.counts.recv_bytes);
            // The device holds the truth; the twins are only staging.
            let gpu = self.dev.gpu();
            gpu.zero(&mut self.recv, self.base, span)?;
            let mut f = DeviceFill {
                gpu,
                dtype: ctx.dtype,
                send: &mut self.send,
                recv: &mut self.recv,
                expected: self.expected.as_mut(),
                base: self.base,
                err: None,
            };
            init(ctx, &mut f);
            if let Some(e) = f.err {
                return Err(e).context("making validation data on the device");
            }
            self.op(comm, spec, ctx, 0, 0, false)?;
            let gpu = self.dev.gpu();
            if corrupt && !checked.is_empty() {
                let at = self.base + checked.start;
                let mut b = [0u8];
                gpu.download(&mut b, &self.recv, at)?;
                b[0] ^= 0x01;
                gpu.upload(&mut self.recv, at, &b)?;
            }
            let elen = checked.len();
            let Some(de) = &self.expected else {
                return Ok(0);
            };
            let es = ctx.dtype.size();
            Ok(gpu.count_wrong(
                &self.recv,
                self.base + checked.start,
                de,
                0,
                elen / es,
                ctx.dtype,
                ctx.op,
            )?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lines_round_trip_the_rendezvous_encoding() {
        let l = GpuLine {
            index: 3,
            pci: "0000:07:00".into(),
            name: "NVIDIA H100\t80GB HBM3".into(),
        };
        let back = GpuLine::decode(&l.encode()).unwrap();
        assert_eq!(back.index, 3);
        assert_eq!(back.pci, "0000:07:00");
        assert_eq!(back.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(GpuLine::decode("x\t0000:00:00\tname"), None);
        assert_eq!(GpuLine::decode("1\tonly-two"), None);
    }

    #[test]
    fn the_kernel_table_gives_bandwidth_and_share_of_the_copy() {
        let h = bench_header("device 0 [0000:07:00] GPU", 1 << 20, 5);
        assert!(h[0].contains("1048576 bytes per operand"));
        // 3 MB in 1 ms = 3 GB/s, half of a 6 GB/s copy.
        let r = bench_row("reduce sum", "half", 3_000_000, 1e-3, 6.0);
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(f, ["reduce", "sum", "half", "1000.0", "3.0", "50%"]);
        assert_eq!(h[1].split_whitespace().count(), 7);
    }

    /// Hosts are counted once each (by their first rank), whatever their ranks per host, and
    /// a host whose devices cannot reach each other is named as staged.
    #[test]
    fn the_path_across_hosts_counts_hosts_not_ranks() {
        use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
        let lines = |refused: Option<usize>| {
            let comms = thread_world(6, ThreadTransport::Inproc, Default::default()).unwrap();
            run_threads(comms, |comm| {
                let (host, first) = (comm.rank() / 3, comm.rank() % 3 == 0);
                let local = (Some(host) == refused).then(|| "no peer access".to_string());
                across_hosts(comm, "staged", local, first).unwrap()
            })
        };
        for l in lines(None) {
            assert!(
                l.starts_with("GPU to GPU between the ranks of each of the 2 hosts"),
                "{l}"
            );
            assert!(
                l.contains("one rail per local rank (each rank's share), staged"),
                "{l}"
            );
        }
        let l = lines(Some(1));
        assert!(
            l[0].contains("of 1 of the 2 hosts (elsewhere staged)"),
            "{}",
            l[0]
        );
        assert!(
            l[3].contains("of 1 of the 2 hosts (elsewhere staged, here because no peer access)"),
            "{}",
            l[3]
        );
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_feature_opening_a_device_says_how_to_get_one() {
        let e = DeviceMem::open(Slot::single(0))
            .err()
            .expect("no CUDA in this build");
        let m = e.to_string();
        assert!(
            m.contains("--features cuda") && m.contains("drop -g"),
            "{m}"
        );
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn with_the_feature_opening_a_device_works_or_says_why_not() {
        match DeviceMem::open(Slot::single(0)) {
            Ok(d) => assert!(!d.line().name.is_empty()),
            Err(e) => {
                let m = crate::chain(&e);
                eprintln!("SKIP device test: {m}");
                assert!(
                    m.contains("run without -g")
                        || m.contains("Invalid number of GPUs")
                        || m.contains("CUDA driver call failed"),
                    "{m}"
                );
            }
        }
    }
}
