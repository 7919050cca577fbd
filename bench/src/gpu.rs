//! `-g 1`: this rank's buffers on a CUDA device (feature `cuda`; docs/cuda.md).
//!
//! The collectives run over TCP and shared memory, which need host memory, so device data is
//! staged at the algorithm boundary: before each operation the input is copied to pinned
//! host memory in chunks alternating between two streams (two copy engines), the host
//! algorithm runs on the pinned buffers, and the result is copied back the same way. The
//! time of a row therefore includes the PCIe copies a job without GPUDirect pays. Each
//! iteration is also timed with CUDA events on the device's stream; those laps are the
//! per-iteration statistics of device rows.
//!
//! Without feature `cuda` [`DeviceMem`] is uninhabited: the harness's device branches
//! compile and are never taken.

use crate::specs::{DataCtx, InitFn, RunFn};
use anyhow::Result;
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

#[cfg(not(feature = "cuda"))]
pub enum DeviceMem {}

#[cfg(not(feature = "cuda"))]
impl DeviceMem {
    pub fn open(_local_rank: usize, _gpus: u32) -> Result<DeviceMem> {
        anyhow::bail!(NO_CUDA_BUILD)
    }
    pub fn line(&self) -> GpuLine {
        match *self {}
    }
    pub fn path(&self, _transport: &str) -> &'static str {
        match *self {}
    }
    pub fn reserve(&mut self, _send: usize, _recv: usize, _check: bool) -> Result<()> {
        match *self {}
    }
    pub fn shifts(&self, _span: usize) -> usize {
        match *self {}
    }
    #[allow(clippy::too_many_arguments)]
    pub fn op(
        &mut self,
        _comm: &mut Communicator,
        _run: RunFn,
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
        _init: InitFn,
        _run: RunFn,
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
    use anyhow::Context;
    use busbw_collectives::cuda::device::{DeviceBuffer, EventTimer, Gpu, Pinned};
    use busbw_collectives::cuda::gpudirect;
    use busbw_collectives::cuda::select::{select_device, Slot};

    /// Staging chunk: big enough to reach PCIe bandwidth, small enough that two pieces
    /// overlap.
    const STAGE_CHUNK: usize = 4 << 20;

    /// A rank's device, its send/receive/expected buffers and their pinned twins.
    pub struct DeviceMem {
        gpu: Gpu,
        timer: EventTimer,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        expected: Option<DeviceBuffer>,
        hsend: Pinned,
        hrecv: Pinned,
        hexp: Option<Pinned>,
    }

    impl DeviceMem {
        /// Selects (nccl-tests' rule) and opens this rank's device.
        pub fn open(local_rank: usize, gpus: u32) -> Result<DeviceMem> {
            let visible = busbw_collectives::cuda::device::device_count()?;
            let env = std::env::var("NCCL_TESTS_DEVICE").ok();
            let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            // One thread per process; -g is 1 (the plan refuses more).
            let _ = gpus;
            let choice = select_device(
                Slot::single(local_rank),
                visible,
                env.as_deref(),
                cvd.as_deref(),
            )?;
            let gpu = Gpu::open(choice.index)?;
            let timer = gpu.timer()?;
            let (send, recv) = (gpu.alloc(1)?, gpu.alloc(1)?);
            let (hsend, hrecv) = (gpu.alloc_pinned(1)?, gpu.alloc_pinned(1)?);
            Ok(DeviceMem {
                gpu,
                timer,
                send,
                recv,
                expected: None,
                hsend,
                hrecv,
                hexp: None,
            })
        }

        pub fn line(&self) -> GpuLine {
            let i = self.gpu.info();
            GpuLine {
                index: i.index,
                pci: i.pci.clone(),
                name: i.name.clone(),
            }
        }

        /// How device data reaches `transport`, in words (printed once by rank 0).
        pub fn path(&self, transport: &str) -> &'static str {
            // The verbs transport registers host memory only so far: even with GPUDirect
            // available, device data is staged (docs/cuda.md).
            let _ = gpudirect::choose(
                transport.contains("verbs"),
                std::path::Path::new("/sys"),
                self.gpu.info().dmabuf,
            );
            gpudirect::DevicePath::Staged.describe()
        }

        pub fn reserve(&mut self, send: usize, recv: usize, check: bool) -> Result<()> {
            let g = &self.gpu;
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
                self.hexp = Some(
                    g.alloc_pinned(recv)
                        .with_context(|| what(recv, "pinned expected"))?,
                );
            }
            Ok(())
        }

        /// Buffer-offset rotations that fit (as the host path computes them).
        pub fn shifts(&self, span: usize) -> usize {
            self.send
                .len()
                .max(self.recv.len())
                .checked_div(span)
                .unwrap_or(1)
                .max(1)
        }

        /// One operation on device data: stage the input out, run, stage the result in.
        /// Returns the CUDA-event time of the whole when `timed`.
        pub fn op(
            &mut self,
            comm: &mut Communicator,
            run: RunFn,
            ctx: &DataCtx,
            soff: usize,
            roff: usize,
            timed: bool,
        ) -> Result<Option<f64>> {
            let (sb, rb) = (ctx.counts.send_bytes, ctx.counts.recv_bytes);
            let span = sb.max(rb);
            let soff = soff.min(self.send.len().saturating_sub(sb));
            let roff = roff.min(self.recv.len().saturating_sub(span));
            if timed {
                self.timer.start(&self.gpu)?;
            }
            let hs = self.hsend.as_mut_slice()?;
            let hr = self.hrecv.as_mut_slice()?;
            if ctx.in_place {
                self.gpu
                    .download(&mut hr[..span], &self.recv, roff, STAGE_CHUNK)?;
            } else {
                self.gpu
                    .download(&mut hs[..sb], &self.send, soff, STAGE_CHUNK)?;
            }
            run(comm, &hs[..sb], &mut hr[..span], ctx)?;
            self.gpu
                .upload(&mut self.recv, roff, &hr[..span], STAGE_CHUNK)?;
            if timed {
                self.timer.stop(&self.gpu)?;
                return Ok(Some(self.timer.elapsed_s()?));
            }
            Ok(None)
        }

        /// One validation run: the descriptor's data into the device buffers, the operation,
        /// and the `#wrong` count computed on the device.
        pub fn validate(
            &mut self,
            comm: &mut Communicator,
            init: InitFn,
            run: RunFn,
            ctx: &DataCtx,
            checked: Range<usize>,
            corrupt: bool,
        ) -> Result<u64> {
            let (sb, rb) = (ctx.counts.send_bytes, ctx.counts.recv_bytes);
            let span = sb.max(rb);
            let hs = self.hsend.as_mut_slice()?;
            let hr = self.hrecv.as_mut_slice()?;
            hr[..span].fill(0);
            let he = match self.hexp.as_mut() {
                Some(e) => Some(e.as_mut_slice()?),
                None => None,
            };
            let elen = checked.len();
            init(ctx, hs, hr, he);
            self.gpu.upload(&mut self.send, 0, &hs[..sb], STAGE_CHUNK)?;
            self.gpu
                .upload(&mut self.recv, 0, &hr[..span], STAGE_CHUNK)?;
            if let (Some(de), Some(he)) = (self.expected.as_mut(), self.hexp.as_ref()) {
                self.gpu
                    .upload(de, 0, &he.as_slice()?[..elen], STAGE_CHUNK)?;
            }
            self.op(comm, run, ctx, 0, 0, false)?;
            if corrupt && !checked.is_empty() {
                let hr = self.hrecv.as_mut_slice()?;
                self.gpu.download(
                    &mut hr[checked.start..checked.start + 1],
                    &self.recv,
                    checked.start,
                    1,
                )?;
                hr[checked.start] ^= 0x01;
                let b = [hr[checked.start]];
                self.gpu.upload(&mut self.recv, checked.start, &b, 1)?;
            }
            let Some(de) = &self.expected else {
                return Ok(0);
            };
            let es = ctx.dtype.size();
            Ok(self.gpu.count_wrong(
                &self.recv,
                checked.start,
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

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_feature_opening_a_device_says_how_to_get_one() {
        let e = DeviceMem::open(0, 1).err().expect("no CUDA in this build");
        let m = e.to_string();
        assert!(
            m.contains("--features cuda") && m.contains("drop -g"),
            "{m}"
        );
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn with_the_feature_opening_a_device_works_or_says_why_not() {
        match DeviceMem::open(0, 1) {
            Ok(d) => assert!(!d.line().name.is_empty()),
            Err(e) => {
                let m = format!("{e:#}");
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
