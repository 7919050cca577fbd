//! Peer memory of the CUDA offload (feature `cuda`): what
//! [`CudaOffload`](super::offload::CudaOffload) needs to let the ranks of one host work on
//! each other's device buffers (`crate::algorithms::peer`), as NCCL's P2P transport does.
//!
//! - A device is known to its peers by its PCI bus id and its owner's process
//!   ([`id`]): the bus id names the same GPU in every process whatever
//!   `CUDA_VISIBLE_DEVICES` says, and the process tells a peer whether a raw pointer is
//!   valid for it.
//! - A range is exported as the CUDA IPC handle of its allocation (`cuIpcGetMemHandle` on
//!   the allocation's base, from `cuMemGetAddressRange`), the base pointer, the process and
//!   the offset. Buffers come from `cuMemAlloc`, which IPC accepts (stream-ordered pool
//!   memory needs pools made for export, which busbw does not make).
//! - Another process opens the handle with `cuIpcOpenMemHandle` (peer access enabled
//!   lazily, so devices that differ work too) and closes it with `cuIpcCloseMemHandle`;
//!   ranks of one process (`-t`, `-g > 1`) use the owner's pointer itself, valid under
//!   unified addressing, after `cuCtxEnablePeerAccess` where the devices differ (IPC refuses
//!   handles of its own process).

use super::device::Gpu;
use crate::offload::{OffloadError, PeerHandle, PeerId};
use cudarc::driver::sys;
use std::ffi::CString;

/// Tags the words of the CUDA offload's ids and handles.
const TAG: u64 = u64::from_le_bytes(*b"cudapeer");

fn failed(what: String) -> impl FnOnce(cudarc::driver::DriverError) -> OffloadError {
    move |e| OffloadError(format!("{what}: {e}"))
}

/// This process, told apart from the others of the host even across pid namespaces (two
/// containers may both run a pid 7): the pid and the time it first asked, mixed.
fn pid() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        ((std::process::id() as u64) << 32) ^ t
    })
}

/// This device for its peers: tag, process token, PCI bus id (`dddd:bb:dd`, 16 bytes at most).
pub(crate) fn id(gpu: &Gpu) -> PeerId {
    let mut pci = [0u8; 16];
    let b = gpu.info().pci.as_bytes();
    let n = b.len().min(16);
    pci[..n].copy_from_slice(&b[..n]);
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&pci[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    PeerId([TAG, pid(), word(0), word(1)])
}

fn pci_of(peer: &PeerId) -> Result<String, OffloadError> {
    let mut b = Vec::with_capacity(16);
    for w in &peer.0[2..4] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    b.truncate(end);
    String::from_utf8(b).map_err(|_| OffloadError("a peer's PCI bus id is not text".into()))
}

/// What this rank holds of its peers: mappings opened through IPC (closed on
/// [`Peers::close`]) and the peer devices whose contexts it enabled access to.
#[derive(Default)]
pub(crate) struct Peers {
    /// (allocation key, base address here, opened through IPC rather than shared).
    opened: Vec<([u64; 10], u64, bool)>,
    /// Devices of this process whose primary context was retained for peer access.
    retained: Vec<sys::CUdevice>,
}

impl Peers {
    /// Whether `gpu` can read and write the device `peer` names: the same GPU, or
    /// `cuDeviceCanAccessPeer`. For a device of this process, access is enabled here.
    pub fn can_access(&mut self, gpu: &Gpu, peer: &PeerId) -> Result<bool, OffloadError> {
        if peer.0[0] != TAG {
            return Ok(false);
        }
        let pci = pci_of(peer)?;
        let c = CString::new(pci.clone())
            .map_err(|_| OffloadError(format!("PCI bus id {pci:?} holds a NUL")))?;
        gpu.bind().map_err(|e| OffloadError(e.to_string()))?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: `c` is a NUL-terminated string; `dev` receives an ordinal.
        unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, c.as_ptr()).result() }.map_err(failed(
            format!("finding the peer's GPU {pci} (is it visible to this process?)"),
        ))?;
        let own = gpu.cu_device();
        if dev == own {
            return Ok(true);
        }
        let mut can = 0;
        // SAFETY: two valid device ordinals.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, own, dev).result() }
            .map_err(failed(format!("asking whether GPU {pci} is reachable")))?;
        if can == 0 {
            return Ok(false);
        }
        if peer.0[1] == pid() && !self.retained.contains(&dev) {
            self.enable(gpu, dev, &pci)?;
        }
        Ok(true)
    }

    /// Lets this context read and write device `dev`'s primary context (ranks of one
    /// process on different GPUs).
    fn enable(&mut self, gpu: &Gpu, dev: sys::CUdevice, pci: &str) -> Result<(), OffloadError> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `dev` is a valid ordinal; the retained context is released on drop.
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev).result() }
            .map_err(failed(format!("retaining GPU {pci}'s context")))?;
        self.retained.push(dev);
        gpu.bind().map_err(|e| OffloadError(e.to_string()))?;
        // SAFETY: `ctx` was just retained; this thread's current context is our device's.
        match unsafe { sys::cuCtxEnablePeerAccess(ctx, 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            e => Err(failed(format!("enabling peer access to GPU {pci}"))(
                cudarc::driver::DriverError(e),
            )),
        }
    }

    /// A handle for `addr..addr+len`, inside one `cuMemAlloc` allocation.
    pub fn export(&self, gpu: &Gpu, addr: u64, len: usize) -> Result<PeerHandle, OffloadError> {
        gpu.bind().map_err(|e| OffloadError(e.to_string()))?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: plain queries of the allocation holding `addr`.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr).result() }.map_err(
            failed(format!("finding the allocation of device {addr:#x}")),
        )?;
        if addr + len as u64 > base + size as u64 {
            return Err(OffloadError(format!(
                "{len} bytes at device {addr:#x} run past their allocation ({size} bytes at {base:#x})"
            )));
        }
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `base` is the start of a live allocation of this context.
        unsafe { sys::cuIpcGetMemHandle(&mut h, base).result() }
            .map_err(failed(format!("exporting device {base:#x} for CUDA IPC")))?;
        let mut key = [0u64; 10];
        for (i, w) in key[..8].iter_mut().enumerate() {
            let mut b = [0u8; 8];
            for (j, c) in b.iter_mut().enumerate() {
                *c = h.reserved[i * 8 + j] as u8;
            }
            *w = u64::from_le_bytes(b);
        }
        (key[8], key[9]) = (pid(), base);
        Ok(PeerHandle {
            key,
            offset: addr - base,
            len: len as u64,
        })
    }

    /// The address here of a peer's exported range; opens its allocation once.
    pub fn open(&mut self, gpu: &Gpu, h: &PeerHandle) -> Result<u64, OffloadError> {
        let (owner, base) = (h.key[8], h.key[9]);
        let name = || {
            format!(
                "the CUDA IPC handle of process {:#x}'s allocation at {base:#x} (+{} bytes)",
                owner >> 32,
                h.offset
            )
        };
        if let Some(&(_, at, _)) = self.opened.iter().find(|o| o.0 == h.key) {
            return Ok(at + h.offset);
        }
        if owner == pid() {
            // One process: the pointer is valid here (peer access was enabled when asked).
            self.opened.push((h.key, base, false));
            return Ok(base + h.offset);
        }
        let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
        for (i, w) in h.key[..8].iter().enumerate() {
            for (j, b) in w.to_le_bytes().into_iter().enumerate() {
                raw.reserved[i * 8 + j] = b as _;
            }
        }
        gpu.bind().map_err(|e| OffloadError(e.to_string()))?;
        let mut at = 0u64;
        let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the handle's bytes are what the owner's cuIpcGetMemHandle wrote; a stale
        // or foreign handle is refused by the driver, not dereferenced.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut at, raw, lazy).result() }.map_err(failed(
            format!("opening {} (has its owner freed it, or exited?)", name()),
        ))?;
        self.opened.push((h.key, at, true));
        Ok(at + h.offset)
    }

    /// Closes every IPC mapping; the caller has waited for the work that read them.
    pub fn close(&mut self, gpu: &Gpu) {
        if self.opened.iter().any(|o| o.2) && gpu.bind().is_err() {
            // Without the context nothing can be closed; the driver does at exit.
            self.opened.clear();
            return;
        }
        for (_, at, ipc) in self.opened.drain(..) {
            if ipc {
                // SAFETY: `at` came from cuIpcOpenMemHandle in this context and is closed
                // once. A failure leaves a mapping the driver closes at exit.
                let _ = unsafe { sys::cuIpcCloseMemHandle(at) };
            }
        }
    }

    /// Releases the retained peer contexts (after [`Peers::close`]).
    pub fn release(&mut self) {
        for dev in self.retained.drain(..) {
            // SAFETY: retained once in `enable`, released once here.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pci_bus_id_survives_the_words() {
        let mut pci = [0u8; 16];
        pci[..10].copy_from_slice(b"0000:07:00");
        let w = |i: usize| u64::from_le_bytes(pci[i * 8..i * 8 + 8].try_into().unwrap());
        let id = PeerId([TAG, 1, w(0), w(1)]);
        assert_eq!(pci_of(&id).unwrap(), "0000:07:00");
    }
}
