//! The CUDA [`Offload`]: a rank's device buffers behind pinned host twins, for transports that
//! move host memory. Every operation goes on the device's compute stream, in issue order,
//! followed by an event from a small pool; a ticket is the event's sequence number, so
//! completion is one `cuEventQuery` and tickets complete in order as the trait promises.
//!
//! A reduction copies the staged segment into a device landing area at the same offset (one
//! H2D copy on the copy engine), runs the reduction kernel of [`super::kernels`] on device
//! addresses, applies `avg`'s division when asked, and copies the result back to its twin only
//! if it travels on: the CPU reduces nothing.
//!
//! Asked to ([`CudaOffload::offer_peers`]), it also offers its memory to the ranks of its
//! host (CUDA IPC, peer access; [`super::peer`]) for the GPU-to-GPU path.

use super::device::{CudaError, DeviceBuffer, Gpu, Pinned};
use super::dmabuf::{self, Exported};
use super::gpudirect::DevicePath;
use super::peer::{self, Peers};
use crate::dtype::DataType;
use crate::offload::{
    device_of, Mirror, Offload, OffloadError, PeerHandle, PeerId, Reduce, Ticket,
};
use busbw_transports::{DmaBuf, MemRegion, MemoryKind};
use cudarc::driver::CudaEvent;
use std::collections::VecDeque;

fn oe(e: CudaError) -> OffloadError {
    OffloadError(e.to_string())
}

/// A device buffer with its pinned twin, allocated by the offload (scratch, workspace,
/// premultiplied input).
struct Pair {
    host: Pinned,
    dev: DeviceBuffer,
}

impl Pair {
    fn mirror(&mut self, gpu: &Gpu) -> Result<Mirror, OffloadError> {
        Ok(Mirror {
            host: self.host.as_mut_slice().map_err(oe)?.as_mut_ptr(),
            device: gpu.address(&self.dev, 0).map_err(oe)?,
            len: self.host.len(),
        })
    }
}

/// See the module documentation.
pub struct CudaOffload {
    gpu: Gpu,
    user: Vec<Mirror>,
    all: Vec<Mirror>,
    staging: Option<Pinned>,
    /// Device twin of `staging`: a staged segment is copied to the same offset here.
    landing: Option<DeviceBuffer>,
    /// `staging` → `landing`, read once at allocation: the reductions look it up per
    /// segment, and reading a pinned slice's pointer is a driver call.
    stage: Option<Mirror>,
    scratch: Option<Pair>,
    workspace: Option<Pair>,
    premul: Option<Pair>,
    /// Events recorded and not yet seen complete, with their tickets, oldest first.
    pending: VecDeque<(u64, CudaEvent)>,
    spare: Vec<CudaEvent>,
    issued: u64,
    done: u64,
    /// Offer device memory to transports (GPUDirect RDMA available on this host).
    direct: bool,
    /// Hand transports dma-bufs of the device ranges (the dma-buf path of GPUDirect).
    dmabuf: bool,
    /// dma-bufs exported so far: `(device address, length, export)`. Dropped whenever a
    /// buffer they might cover is freed.
    exports: Vec<(u64, usize, Exported)>,
    /// Why the direct path was given up, until the owner takes it to report it.
    refused: Option<String>,
    /// Offer this device's memory to the ranks of its host (GPU to GPU).
    offer_peers: bool,
    peers: Peers,
}

impl CudaOffload {
    pub fn new(gpu: Gpu) -> CudaOffload {
        CudaOffload {
            gpu,
            user: Vec::new(),
            all: Vec::new(),
            staging: None,
            landing: None,
            stage: None,
            scratch: None,
            workspace: None,
            premul: None,
            pending: VecDeque::new(),
            spare: Vec::new(),
            issued: 0,
            done: 0,
            direct: false,
            dmabuf: false,
            exports: Vec::new(),
            refused: None,
            offer_peers: false,
            peers: Peers::default(),
        }
    }

    /// Offer this device's memory to the ranks of its host, so that collectives run GPU to
    /// GPU where every rank's device reaches every other's (`crate::algorithms::peer`);
    /// off by default: the owner decides, the algorithms never guess.
    pub fn offer_peers(&mut self, on: bool) {
        self.offer_peers = on;
    }

    /// Why the direct path was given up since the last call, if it was: the owner reports it.
    pub fn take_refusal(&mut self) -> Option<String> {
        self.refused.take()
    }

    /// Offer device memory to transports that can register it when GPUDirect RDMA is the
    /// path (`PeerMem`: the device address; `DmaBuf`: a dma-buf of it); engines fall back to
    /// the twins where the transport refuses.
    pub fn set_path(&mut self, path: DevicePath) {
        self.direct = path != DevicePath::Staged;
        self.dmabuf = path == DevicePath::DmaBuf;
    }

    /// Export whole device buffers now (on the dma-buf path), so each collective's ranges
    /// find their dma-buf instead of exporting their own.
    pub fn export_buffers(&mut self, buffers: &[(u64, usize)]) -> Result<(), OffloadError> {
        if !self.dmabuf {
            return Ok(());
        }
        for &(a, len) in buffers {
            self.export_of(a, len)?;
        }
        Ok(())
    }

    /// Forget every dma-buf: the buffers they cover are about to be freed or replaced.
    pub fn forget_exports(&mut self) {
        self.exports.clear();
    }

    /// The dma-buf covering `addr..addr+len` and the range's offset into it.
    fn export_of(&mut self, addr: u64, len: usize) -> Result<DmaBuf, OffloadError> {
        let covers =
            |&(a, l, _): &(u64, usize, Exported)| addr >= a && addr + len as u64 <= a + l as u64;
        if !self.exports.iter().any(covers) {
            let e = dmabuf::export(addr, len)
                .map_err(|e| OffloadError(format!("exporting a dma-buf of device memory: {e}")))?;
            self.exports.push((addr, len, e));
        }
        match self.exports.iter().find(|x| covers(x)) {
            Some((a, _, e)) => {
                let d = e.dmabuf();
                Ok(DmaBuf {
                    fd: d.fd,
                    offset: d.offset + (addr - a),
                })
            }
            None => Err(OffloadError("a dma-buf export vanished".into())),
        }
    }

    /// The device, for work outside collectives (fills, `#wrong` counts, timing events).
    pub fn gpu(&mut self) -> &mut Gpu {
        &mut self.gpu
    }

    pub fn gpu_ref(&self) -> &Gpu {
        &self.gpu
    }

    /// The caller's mirrored buffers.
    pub fn set_mirrors(&mut self, mirrors: Vec<Mirror>) -> Result<(), OffloadError> {
        self.user = mirrors;
        self.remirror()
    }

    fn remirror(&mut self) -> Result<(), OffloadError> {
        let mut all = self.user.clone();
        for p in [&mut self.scratch, &mut self.workspace, &mut self.premul]
            .into_iter()
            .flatten()
        {
            all.push(p.mirror(&self.gpu)?);
        }
        self.all = all;
        Ok(())
    }

    fn dev(&self, p: *const u8, len: usize) -> Result<u64, OffloadError> {
        device_of(&self.all, p, len)
    }

    /// Device address in the landing area of staged host `p`.
    fn landed(&self, p: *const u8, len: usize) -> Result<u64, OffloadError> {
        let Some(m) = self.stage else {
            return Err(OffloadError("no staging memory was set up".into()));
        };
        m.device_of(p, len).ok_or_else(|| {
            OffloadError(format!(
                "{len} bytes at {p:p} are not in the offload's staging memory"
            ))
        })
    }

    /// Ends an issued batch of work with an event: its ticket.
    fn ticket(&mut self) -> Result<Ticket, OffloadError> {
        let ev = match self.spare.pop() {
            Some(e) => e,
            None => self.gpu.new_event().map_err(oe)?,
        };
        self.gpu.record(&ev).map_err(oe)?;
        self.issued += 1;
        self.pending.push_back((self.issued, ev));
        Ok(Ticket(self.issued))
    }

    fn htod(&mut self, dst: u64, src: *const u8, len: usize) -> Result<(), OffloadError> {
        self.gpu.bind().map_err(oe)?;
        // SAFETY: `src` is a twin or staging range checked against its mirror (valid host
        // memory for `len` bytes, page-locked), `dst` the matching device range; callers keep
        // both alive until the ticket completes.
        unsafe {
            let s = std::slice::from_raw_parts(src, len);
            cudarc::driver::result::memcpy_htod_async(dst, s, self.gpu.cu_stream())
        }
        .map_err(|e| OffloadError(format!("copying {len} bytes to the device: {e}")))
    }

    fn dtoh(&mut self, dst: *mut u8, src: u64, len: usize) -> Result<(), OffloadError> {
        self.gpu.bind().map_err(oe)?;
        // SAFETY: as in htod, the other way.
        unsafe {
            let d = std::slice::from_raw_parts_mut(dst, len);
            cudarc::driver::result::memcpy_dtoh_async(d, src, self.gpu.cu_stream())
        }
        .map_err(|e| OffloadError(format!("copying {len} bytes from the device: {e}")))
    }

    fn pair(&mut self, bytes: usize, what: &str) -> Result<Pair, OffloadError> {
        self.sync()?;
        self.exports.clear();
        let host = self.gpu.alloc_pinned(bytes).map_err(oe)?;
        let dev = self
            .gpu
            .alloc(bytes)
            .map_err(|e| OffloadError(format!("allocating {bytes} bytes of device {what}: {e}")))?;
        Ok(Pair { host, dev })
    }

    /// The host side of one of the offload's own pairs (`slot`: scratch, workspace or the
    /// `mulsum` input), reallocated and mirrored again when it holds fewer than `bytes`.
    fn grown(
        &mut self,
        slot: fn(&mut Self) -> &mut Option<Pair>,
        bytes: usize,
        what: &str,
    ) -> Result<*mut u8, OffloadError> {
        if slot(self).as_ref().is_none_or(|p| p.host.len() < bytes) {
            let pair = self.pair(bytes, what)?;
            *slot(self) = Some(pair);
            self.remirror()?;
        }
        match slot(self).as_mut() {
            Some(p) => Ok(p.host.as_mut_slice().map_err(oe)?.as_mut_ptr()),
            None => Err(OffloadError(format!("no {what} memory"))),
        }
    }
}

impl Offload for CudaOffload {
    fn mirrors(&self) -> &[Mirror] {
        &self.all
    }

    fn device_kind(&self) -> Option<MemoryKind> {
        let device = self.gpu.info().index as i32;
        self.direct.then_some(MemoryKind::Cuda { device })
    }

    fn direct_refused(&mut self, why: String) {
        self.direct = false;
        self.dmabuf = false;
        self.refused.get_or_insert(why);
    }

    fn device_region(&mut self, addr: u64, len: usize) -> Result<MemRegion, OffloadError> {
        let device = self.gpu.info().index as i32;
        // SAFETY: the engines pass ranges of mirrored device buffers or device staging, which
        // stay allocated while the call's registrations are in use.
        let r =
            unsafe { MemRegion::new(addr as usize as *mut u8, len, MemoryKind::Cuda { device }) };
        if !self.dmabuf {
            return Ok(r);
        }
        let d = self.export_of(addr, len)?;
        // SAFETY: the descriptor stays open in `exports` while the region is registered.
        Ok(unsafe { r.with_dmabuf(d) })
    }

    fn device_staging(&mut self, bytes: usize) -> Result<u64, OffloadError> {
        // The landing area is device memory of the staging size: in the direct path,
        // received segments land there straight from the NIC.
        self.staging(bytes)?;
        match self.stage {
            Some(m) => Ok(m.device),
            None => Err(OffloadError("no device staging memory".into())),
        }
    }

    fn reduce_on_device(
        &mut self,
        out: u64,
        mine: u64,
        staged: u64,
        elems: usize,
        dtype: DataType,
        op: crate::dtype::ReduceOp,
        avg_over: Option<usize>,
    ) -> Result<Ticket, OffloadError> {
        // SAFETY: the engines pass device addresses of mirrored buffers and of the device
        // staging, for `elems` elements each; `out` equals `mine` or is disjoint from it.
        unsafe {
            self.gpu
                .reduce_at(out, mine, staged, elems, dtype, op)
                .map_err(oe)?;
            if let Some(n) = avg_over {
                self.gpu.finish_avg_at(out, elems, n, dtype).map_err(oe)?;
            }
        }
        self.ticket()
    }

    fn avg_on_device(
        &mut self,
        out: u64,
        elems: usize,
        dtype: DataType,
        n: usize,
    ) -> Result<Ticket, OffloadError> {
        // SAFETY: the hierarchical path passes a device address of a mirrored buffer for
        // `elems` elements.
        unsafe { self.gpu.finish_avg_at(out, elems, n, dtype) }.map_err(oe)?;
        self.ticket()
    }

    fn staging(&mut self, bytes: usize) -> Result<*mut u8, OffloadError> {
        match self.stage {
            Some(m) if m.len >= bytes => return Ok(m.host),
            _ => {}
        }
        self.sync()?;
        self.exports.clear();
        self.stage = None;
        let mut host = self.gpu.alloc_pinned(bytes).map_err(oe)?;
        let land = self.gpu.alloc(bytes).map_err(oe)?;
        let m = Mirror {
            host: host.as_mut_slice().map_err(oe)?.as_mut_ptr(),
            device: self.gpu.address(&land, 0).map_err(oe)?,
            len: bytes,
        };
        (self.staging, self.landing, self.stage) = (Some(host), Some(land), Some(m));
        Ok(m.host)
    }

    fn scratch(&mut self, bytes: usize) -> Result<*mut u8, OffloadError> {
        self.grown(|o| &mut o.scratch, bytes, "scratch")
    }

    fn workspace(&mut self, bytes: usize) -> Result<*mut u8, OffloadError> {
        self.grown(|o| &mut o.workspace, bytes, "workspace")
    }

    fn download(&mut self, host: *const u8, len: usize) -> Result<Ticket, OffloadError> {
        let src = self.dev(host, len)?;
        self.dtoh(host as *mut u8, src, len)?;
        self.ticket()
    }

    fn upload(&mut self, host: *const u8, len: usize) -> Result<Ticket, OffloadError> {
        let dst = self.dev(host, len)?;
        self.htod(dst, host, len)?;
        self.ticket()
    }

    fn copy(
        &mut self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        download: bool,
    ) -> Result<Ticket, OffloadError> {
        let (d, s) = (self.dev(dst, len)?, self.dev(src, len)?);
        self.gpu.bind().map_err(oe)?;
        // SAFETY: both device ranges come from mirrors checked for `len` bytes.
        unsafe { cudarc::driver::result::memcpy_dtod_async(d, s, len, self.gpu.cu_stream()) }
            .map_err(|e| OffloadError(format!("copying {len} bytes on the device: {e}")))?;
        if download {
            self.dtoh(dst, d, len)?;
        }
        self.ticket()
    }

    fn reduce(&mut self, j: Reduce) -> Result<Ticket, OffloadError> {
        let bytes = j.elems * j.dtype.size();
        let out = self.dev(j.out, bytes)?;
        let mine = self.dev(j.mine, bytes)?;
        let land = self.landed(j.staged, bytes)?;
        self.htod(land, j.staged, bytes)?;
        // SAFETY: the three device ranges were checked for `bytes` against their mirrors and
        // the landing area; `out` equals `mine` or is disjoint from it (the engines' rule).
        unsafe {
            self.gpu
                .reduce_at(out, mine, land, j.elems, j.dtype, j.op)
                .map_err(oe)?;
            if let Some(n) = j.avg_over {
                self.gpu
                    .finish_avg_at(out, j.elems, n, j.dtype)
                    .map_err(oe)?;
            }
        }
        if j.download {
            self.dtoh(j.out, out, bytes)?;
        }
        self.ticket()
    }

    fn premultiply(
        &mut self,
        src: *const u8,
        elems: usize,
        dtype: DataType,
        rank: usize,
    ) -> Result<*const u8, OffloadError> {
        let bytes = elems * dtype.size();
        let s = self.dev(src, bytes)?;
        let host = self.grown(|o| &mut o.premul, bytes, "mulsum input")?;
        let d = self.dev(host, bytes)?;
        // SAFETY: both ranges checked for `bytes`; the premultiplied buffer is the offload's.
        unsafe { self.gpu.premultiply_at(d, s, elems, rank, dtype) }.map_err(oe)?;
        Ok(host)
    }

    fn peer_id(&mut self) -> Option<PeerId> {
        self.offer_peers.then(|| peer::id(&self.gpu))
    }

    fn can_access_peer(&mut self, p: &PeerId) -> Result<bool, OffloadError> {
        self.peers.can_access(&self.gpu, p)
    }

    fn export_peer(&mut self, addr: u64, len: usize) -> Result<PeerHandle, OffloadError> {
        self.peers.export(&self.gpu, addr, len)
    }

    fn open_peer(&mut self, h: &PeerHandle) -> Result<u64, OffloadError> {
        self.peers.open(&self.gpu, h)
    }

    fn close_peers(&mut self) {
        // Nothing in flight may still read a mapping that goes.
        let _ = self.sync();
        self.peers.close(&self.gpu);
    }

    fn copy_on_device(&mut self, dst: u64, src: u64, len: usize) -> Result<Ticket, OffloadError> {
        self.gpu.bind().map_err(oe)?;
        // SAFETY: the peer path passes ranges of this device's buffers and of peers' buffers
        // opened here, for `len` bytes each.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, len, self.gpu.cu_stream()) }
            .map_err(|e| OffloadError(format!("copying {len} bytes device to device: {e}")))?;
        self.ticket()
    }

    fn complete(&mut self, t: Ticket) -> Result<bool, OffloadError> {
        if self.done < t.0 {
            self.gpu.bind().map_err(oe)?;
        }
        while self.done < t.0 {
            let Some((seq, ev)) = self.pending.pop_front() else {
                return Err(OffloadError(format!(
                    "ticket {} was never issued (last {})",
                    t.0, self.issued
                )));
            };
            // SAFETY: the event is alive (owned here); querying has no other effect.
            match unsafe { cudarc::driver::result::event::query(ev.cu_event()) } {
                Ok(()) => {
                    self.done = seq;
                    self.spare.push(ev);
                }
                Err(e) if e.0 == cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_READY => {
                    self.pending.push_front((seq, ev));
                    return Ok(false);
                }
                Err(e) => return Err(OffloadError(format!("waiting for the device: {e}"))),
            }
        }
        Ok(true)
    }

    fn sync(&mut self) -> Result<(), OffloadError> {
        self.gpu.synchronize().map_err(oe)?;
        self.done = self.issued;
        self.spare.extend(self.pending.drain(..).map(|(_, e)| e));
        Ok(())
    }
}

impl Drop for CudaOffload {
    fn drop(&mut self) {
        // Peers' mappings close before their contexts go.
        self.close_peers();
        self.peers.release();
    }
}
