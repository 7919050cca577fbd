//! The driver side (feature `cuda`): a context per rank, device buffers, the NVRTC-compiled
//! kernels of [`super::kernels`], pinned staging memory and CUDA events. Every entry point
//! probes for the libraries first ([`super::probe`]) because cudarc panics when one is
//! missing.

use super::kernels::{self, Kernel};
use super::probe::{probe, ProbeError};
use super::select::pci_bus_id;
use crate::dtype::{DataType, ReduceOp};
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DriverError,
    LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("CUDA driver call failed while {what}: {err}")]
    Driver { what: String, err: DriverError },
    #[error("NVRTC could not compile the {dtype} kernels: {log}")]
    Compile { dtype: DataType, log: String },
    #[error("a CUDA buffer of {len} bytes cannot hold {need} bytes at offset {offset}")]
    Range {
        len: usize,
        offset: usize,
        need: usize,
    },
}

fn drv<T>(what: impl Into<String>, r: Result<T, DriverError>) -> Result<T, CudaError> {
    r.map_err(|err| CudaError::Driver {
        what: what.into(),
        err,
    })
}

/// Number of devices the driver shows (after `CUDA_VISIBLE_DEVICES`).
pub fn device_count() -> Result<usize, CudaError> {
    probe()?;
    Ok(drv("counting devices", CudaContext::device_count())?.max(0) as usize)
}

/// What the `Using devices` block and the path line print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: usize,
    pub name: String,
    /// `dddd:bb:dd`.
    pub pci: String,
    pub sm_count: u32,
    pub dmabuf: bool,
    pub total_mem: usize,
}

/// One rank's device: context, the stream all its work goes on, and the kernel
/// modules compiled so far (one per element type, on first use).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: GpuInfo,
    modules: HashMap<DataType, Arc<CudaModule>>,
    wrong: CudaSlice<u64>,
}

/// Device memory of one buffer (send, receive or expected). Allocated with `cuMemAlloc`
/// rather than cudarc's stream-ordered pool: pool memory cannot be registered with a NIC
/// (GPUDirect RDMA, peermem or dma-buf), and a benchmark allocates rarely. cudarc would free
/// it with `cuMemFreeAsync`, so the slice is leaked back and freed with `cuMemFree` here.
pub struct DeviceBuffer {
    mem: std::mem::ManuallyDrop<CudaSlice<u8>>,
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `mem` is taken once, here, and not used afterwards.
        let mem = unsafe { std::mem::ManuallyDrop::take(&mut self.mem) };
        let ctx = mem.stream().context().clone();
        // leak() waits for the slice's pending work; the pointer came from cuMemAlloc.
        let ptr = mem.leak();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: allocated by malloc_sync in Gpu::alloc and freed exactly once.
        ctx.record_err(unsafe { cudarc::driver::result::free_sync(ptr) });
    }
}

impl DeviceBuffer {
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }
    fn check(&self, offset: usize, need: usize) -> Result<(), CudaError> {
        if offset.checked_add(need).is_none_or(|end| end > self.len()) {
            return Err(CudaError::Range {
                len: self.len(),
                offset,
                need,
            });
        }
        Ok(())
    }
}

/// Page-locked host memory for staging device data to TCP and shared memory.
pub struct Pinned {
    mem: PinnedHostSlice<u8>,
}

impl Pinned {
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], CudaError> {
        drv("writing pinned memory", self.mem.as_mut_slice())
    }
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }
}

/// A start/stop pair of timing events on the compute stream.
pub struct EventTimer {
    start: CudaEvent,
    stop: CudaEvent,
}

impl EventTimer {
    pub fn start(&self, gpu: &Gpu) -> Result<(), CudaError> {
        drv("recording the start event", self.start.record(&gpu.stream))
    }
    pub fn stop(&self, gpu: &Gpu) -> Result<(), CudaError> {
        drv("recording the stop event", self.stop.record(&gpu.stream))
    }
    /// Seconds between the two events; waits for the stop event.
    pub fn elapsed_s(&self) -> Result<f64, CudaError> {
        drv("waiting for the stop event", self.stop.synchronize())?;
        let ms = drv("reading event time", self.start.elapsed_ms(&self.stop))?;
        Ok(ms as f64 / 1e3)
    }
}

/// Events recorded on the compute stream at the boundaries of a run of enqueued work (the
/// iterations of `-z 0` on NCCL), read once after one wait: each stretch's time without a
/// synchronisation between them, as nccl-tests' `-I` records them.
pub struct Marks {
    events: Vec<CudaEvent>,
    used: usize,
}

impl Marks {
    /// Forgets the marks recorded (their events are reused).
    pub fn clear(&mut self) {
        self.used = 0;
    }

    /// Records the next mark behind everything enqueued so far.
    pub fn record(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        if self.used == self.events.len() {
            let ev = drv(
                "creating a timing event",
                gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
            )?;
            self.events.push(ev);
        }
        drv(
            "recording a mark",
            self.events[self.used].record(&gpu.stream),
        )?;
        self.used += 1;
        Ok(())
    }

    /// Seconds between successive marks (one fewer than recorded); waits for the last.
    pub fn stretches_s(&self) -> Result<Vec<f64>, CudaError> {
        let marks = &self.events[..self.used];
        let Some(last) = marks.last() else {
            return Ok(Vec::new());
        };
        drv("waiting for the last mark", last.synchronize())?;
        marks
            .windows(2)
            .map(|w| {
                let ms = drv("reading event time", w[0].elapsed_ms(&w[1]))?;
                Ok(ms as f64 / 1e3)
            })
            .collect()
    }
}

impl Gpu {
    /// Opens device `index` (an index among the visible devices).
    pub fn open(index: usize) -> Result<Gpu, CudaError> {
        probe()?;
        let ctx = drv(format!("opening device {index}"), CudaContext::new(index))?;
        // One stream and explicit synchronisation: cudarc's per-launch event
        // tracking would add an event record to every timed kernel.
        // SAFETY: called before any allocation or launch on this context.
        unsafe { ctx.disable_event_tracking() };
        let attr = |a| drv("reading a device attribute", ctx.attribute(a));
        let pci = pci_bus_id(
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)? as u32,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)? as u32,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)? as u32,
        );
        let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let dmabuf =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED).unwrap_or(0) != 0;
        let info = GpuInfo {
            index,
            name: drv("reading the device name", ctx.name())?,
            pci,
            sm_count,
            dmabuf,
            total_mem: drv("reading the memory size", ctx.total_mem())?,
        };
        let stream = drv("creating a stream", ctx.new_stream())?;
        let wrong = drv("allocating the wrong counter", stream.alloc_zeros::<u64>(1))?;
        Ok(Gpu {
            ctx,
            stream,
            info,
            modules: HashMap::new(),
            wrong,
        })
    }

    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer, CudaError> {
        let len = len.max(1);
        self.bind()?;
        // SAFETY: a plain allocation; the slice below owns it (see DeviceBuffer's Drop).
        let ptr = drv(format!("allocating {len} bytes of device memory"), unsafe {
            cudarc::driver::result::malloc_sync(len)
        })?;
        // SAFETY: `ptr` is a fresh allocation of `len` bytes; it is zeroed before use.
        let mem = unsafe { self.stream.upgrade_device_ptr::<u8>(ptr, len) };
        let mut b = DeviceBuffer {
            mem: std::mem::ManuallyDrop::new(mem),
        };
        drv(
            "zeroing device memory",
            self.stream.memset_zeros(&mut *b.mem),
        )?;
        Ok(b)
    }

    /// Page-locked host memory, portable across contexts.
    pub fn alloc_pinned(&self, len: usize) -> Result<Pinned, CudaError> {
        // SAFETY: u8 has no invalid bit patterns; the memory is zeroed below before use.
        let mut mem = drv(format!("allocating {len} bytes of pinned memory"), unsafe {
            self.ctx.alloc_pinned_with_flags::<u8>(
                len.max(1),
                cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        })?;
        drv("zeroing pinned memory", mem.as_mut_slice())?.fill(0);
        Ok(Pinned { mem })
    }

    pub fn timer(&self) -> Result<EventTimer, CudaError> {
        let ev = || {
            drv(
                "creating a timing event",
                self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
            )
        };
        Ok(EventTimer {
            start: ev()?,
            stop: ev()?,
        })
    }

    /// An empty set of marks on this device's stream.
    pub fn marks(&self) -> Marks {
        Marks {
            events: Vec::new(),
            used: 0,
        }
    }

    /// Free memory on the device, bytes.
    pub fn free_memory(&self) -> Result<u64, CudaError> {
        let (free, _) = drv("reading free device memory", self.ctx.mem_get_info())?;
        Ok(free as u64)
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        drv("waiting for the device", self.stream.synchronize())
    }

    fn function(
        &mut self,
        k: Kernel,
        d: DataType,
        op: ReduceOp,
    ) -> Result<CudaFunction, CudaError> {
        if !self.modules.contains_key(&d) {
            let opts = CompileOptions {
                fmad: Some(false),
                options: vec!["--std=c++14".into(), "-default-device".into()],
                ..Default::default()
            };
            let ptx = compile_ptx_with_opts(kernels::module_source(d), opts).map_err(|e| {
                CudaError::Compile {
                    dtype: d,
                    log: e.to_string(),
                }
            })?;
            let m = drv(
                format!("loading the {d} kernels"),
                self.ctx.load_module(ptx),
            )?;
            self.modules.insert(d, m);
        }
        let name = kernels::kernel_name(k, d, op);
        let m = &self.modules[&d];
        drv(format!("finding kernel {name}"), m.load_function(&name))
    }

    fn cfg(&self, count: usize) -> LaunchConfig {
        let (blocks, threads) = kernels::launch_dims(count as u64, self.info.sm_count);
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Launches a generator `k` writing `count` elements of `buf[offset..]`; `args` follow
    /// the output pointer and the count.
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &mut self,
        k: Kernel,
        buf: &mut DeviceBuffer,
        offset: usize,
        count: usize,
        d: DataType,
        op: ReduceOp,
        args: &[u64],
    ) -> Result<(), CudaError> {
        buf.check(offset, count * d.size())?;
        let f = self.function(k, d, op)?;
        let cfg = self.cfg(count);
        let mut view = buf.mem.slice_mut(offset..);
        let c = count as u64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut view).arg(&c);
        for a in args {
            b.arg(a);
        }
        // SAFETY: the kernel writes `count` elements from `offset`, checked above; `args`
        // match the kernel's parameters (kernels.rs documents them per kernel).
        drv(format!("launching {k:?}"), unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// `rank`'s verifiable input for elements `first ..` into `buf[offset..]`.
    #[allow(clippy::too_many_arguments)]
    pub fn fill_input(
        &mut self,
        buf: &mut DeviceBuffer,
        offset: usize,
        count: usize,
        d: DataType,
        op: ReduceOp,
        seed: u64,
        first: u64,
        rank: usize,
        nranks: usize,
    ) -> Result<(), CudaError> {
        let args = [seed, first, rank as u64, nranks as u64];
        self.generate(Kernel::FillInput, buf, offset, count, d, op, &args)
    }

    /// The reduction over `nranks` ranks of elements `first ..` into `buf[offset..]`.
    #[allow(clippy::too_many_arguments)]
    pub fn fill_expected(
        &mut self,
        buf: &mut DeviceBuffer,
        offset: usize,
        count: usize,
        d: DataType,
        op: ReduceOp,
        seed: u64,
        first: u64,
        nranks: usize,
    ) -> Result<(), CudaError> {
        let args = [seed, first, nranks as u64];
        self.generate(Kernel::FillExpected, buf, offset, count, d, op, &args)
    }

    /// Elements of `got[goff..]` whose bits differ from `want[woff..]` (nccl-tests' `#wrong`);
    /// only the count crosses PCIe.
    #[allow(clippy::too_many_arguments)]
    pub fn count_wrong(
        &mut self,
        got: &DeviceBuffer,
        goff: usize,
        want: &DeviceBuffer,
        woff: usize,
        count: usize,
        d: DataType,
        op: ReduceOp,
    ) -> Result<u64, CudaError> {
        got.check(goff, count * d.size())?;
        want.check(woff, count * d.size())?;
        let f = self.function(Kernel::CountWrong, d, op)?;
        let cfg = self.cfg(count);
        drv(
            "zeroing the wrong counter",
            self.stream.memset_zeros(&mut self.wrong),
        )?;
        let (g, w) = (got.mem.slice(goff..), want.mem.slice(woff..));
        let c = count as u64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&g).arg(&w).arg(&c).arg(&mut self.wrong);
        // SAFETY: reads `count` elements of each, checked above; one u64 counter.
        drv("launching count_wrong", unsafe { b.launch(cfg) })?;
        let v = drv(
            "reading the wrong count",
            self.stream.clone_dtoh(&self.wrong),
        )?;
        Ok(v.first().copied().unwrap_or(0))
    }

    /// `dst = a op b` for `count` elements, on the device (`gpu-bench`'s reduction).
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &mut self,
        dst: &mut DeviceBuffer,
        a: &DeviceBuffer,
        b: &DeviceBuffer,
        count: usize,
        d: DataType,
        op: ReduceOp,
    ) -> Result<(), CudaError> {
        let bytes = count * d.size();
        dst.check(0, bytes)?;
        a.check(0, bytes)?;
        b.check(0, bytes)?;
        let (pd, pa, pb) = (
            self.address(dst, 0)?,
            self.address(a, 0)?,
            self.address(b, 0)?,
        );
        // SAFETY: `count` elements of each buffer, checked above; dst is its own buffer.
        unsafe { self.reduce_at(pd, pa, pb, count, d, op) }
    }

    /// The device address of `buf[offset..]`, for [`super::offload::CudaOffload`]'s mirrors.
    pub fn address(&self, buf: &DeviceBuffer, offset: usize) -> Result<u64, CudaError> {
        use cudarc::driver::DevicePtr;
        buf.check(offset, 0)?;
        let (p, _sync) = buf.mem.device_ptr(&self.stream);
        Ok(p + offset as u64)
    }

    /// Makes this device's context current on the calling thread, as the raw driver calls of
    /// the offload need (cudarc's safe calls do it themselves), and as NCCL needs before a
    /// rank joins: it uses the calling thread's current device.
    pub fn bind(&self) -> Result<(), CudaError> {
        drv("making the context current", self.ctx.bind_to_thread())
    }

    /// The compute stream's handle, for a library that enqueues its own work on it (NCCL).
    pub fn raw_stream(&self) -> *mut std::ffi::c_void {
        self.stream.cu_stream().cast()
    }

    /// Whether everything enqueued on the compute stream has completed (`cuStreamQuery`),
    /// for waits that must not block past a timeout.
    pub fn stream_done(&self) -> Result<bool, CudaError> {
        use cudarc::driver::sys::CUresult;
        self.bind()?;
        // SAFETY: a live stream of this context, current on this thread.
        let r = unsafe { cudarc::driver::sys::cuStreamQuery(self.stream.cu_stream()) };
        match r {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => drv("waiting for the stream", Err(DriverError(e))),
        }
    }

    pub(crate) fn cu_device(&self) -> cudarc::driver::sys::CUdevice {
        self.ctx.cu_device()
    }

    pub(crate) fn cu_stream(&self) -> cudarc::driver::sys::CUstream {
        self.stream.cu_stream()
    }

    pub(crate) fn new_event(&self) -> Result<CudaEvent, CudaError> {
        drv("creating an event", self.ctx.new_event(None))
    }

    pub(crate) fn record(&self, e: &CudaEvent) -> Result<(), CudaError> {
        drv("recording an event", e.record(&self.stream))
    }

    /// Launches kernel `k` over `count` elements with `args` (device addresses and
    /// integers, each passed as 64 bits, as the kernels declare them; kernels.rs lists them).
    ///
    /// # Safety
    /// Every address in `args` is valid device memory for what the kernel touches.
    unsafe fn launch_at(
        &mut self,
        k: Kernel,
        d: DataType,
        op: ReduceOp,
        count: usize,
        args: &[u64],
    ) -> Result<(), CudaError> {
        let f = self.function(k, d, op)?;
        let cfg = self.cfg(count);
        let mut l = self.stream.launch_builder(&f);
        for a in args {
            l.arg(a);
        }
        drv(format!("launching {k:?}"), l.launch(cfg)).map(|_| ())
    }

    /// `dst = a op b` over `count` elements at raw device addresses.
    ///
    /// # Safety
    /// Each address is valid device memory for `count` elements; `dst` equals `a` or
    /// overlaps neither operand.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce_at(
        &mut self,
        dst: u64,
        a: u64,
        b: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
    ) -> Result<(), CudaError> {
        self.launch_at(Kernel::Reduce, d, op, count, &[dst, a, b, count as u64])
    }

    /// `avg`'s division of `count` elements at `dst` by `n`.
    ///
    /// # Safety
    /// `dst` is valid device memory for `count` elements.
    pub(crate) unsafe fn finish_avg_at(
        &mut self,
        dst: u64,
        count: usize,
        n: usize,
        d: DataType,
    ) -> Result<(), CudaError> {
        let args = [dst, count as u64, n as u64];
        self.launch_at(Kernel::FinishAvg, d, ReduceOp::Avg, count, &args)
    }

    /// `mulsum`'s `dst = src × scalar(rank)`.
    ///
    /// # Safety
    /// Both addresses are valid device memory for `count` elements, disjoint.
    pub(crate) unsafe fn premultiply_at(
        &mut self,
        dst: u64,
        src: u64,
        count: usize,
        rank: usize,
        d: DataType,
    ) -> Result<(), CudaError> {
        let args = [dst, src, count as u64, rank as u64];
        self.launch_at(Kernel::Premultiply, d, ReduceOp::MulSum, count, &args)
    }

    /// Device-to-device copy of `len` bytes on the compute stream (the bandwidth reference
    /// for the reduction kernels).
    pub fn copy_dtod(
        &self,
        dst: &mut DeviceBuffer,
        src: &DeviceBuffer,
        len: usize,
    ) -> Result<(), CudaError> {
        dst.check(0, len)?;
        src.check(0, len)?;
        let s = src.mem.slice(..len);
        let mut d = dst.mem.slice_mut(..len);
        drv(
            "copying device to device",
            self.stream.memcpy_dtod(&s, &mut d),
        )
    }

    pub fn zero(&self, buf: &mut DeviceBuffer, offset: usize, len: usize) -> Result<(), CudaError> {
        buf.check(offset, len)?;
        let mut v = buf.mem.slice_mut(offset..offset + len);
        drv("zeroing device memory", self.stream.memset_zeros(&mut v))
    }

    /// Host to device, `src` to `dst[offset..]`, waiting until it has landed (the
    /// `-c` corruption check's single byte; collectives copy through the offload).
    pub fn upload(
        &self,
        dst: &mut DeviceBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<(), CudaError> {
        dst.check(offset, src.len())?;
        let mut d = dst.mem.slice_mut(offset..offset + src.len());
        drv(
            "copying host to device",
            self.stream.memcpy_htod(src, &mut d),
        )?;
        self.synchronize()
    }

    /// Device to host, the mirror of [`Gpu::upload`]: `dst.len()` bytes from `src[offset..]`.
    pub fn download(
        &self,
        dst: &mut [u8],
        src: &DeviceBuffer,
        offset: usize,
    ) -> Result<(), CudaError> {
        src.check(offset, dst.len())?;
        let v = src.mem.slice(offset..offset + dst.len());
        drv("copying device to host", self.stream.memcpy_dtoh(&v, dst))?;
        self.synchronize()
    }
}
