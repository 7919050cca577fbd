//! Exporting device memory as a dma-buf (feature `cuda`), so the verbs transport can
//! register it with `ibv_reg_dmabuf_mr` where the nvidia-peermem module is not loaded.
//!
//! The transport crate has no CUDA dependency, so the export happens here and only the file
//! descriptor and the region's offset inside the dma-buf cross over
//! ([`busbw_transports::DmaBuf`]). The driver exports whole host pages, so the window is
//! widened to page boundaries and the region is registered at its offset inside it.
//!
//! Every refusal is an [`ExportError::Unsupported`] with the reason, which callers print on the
//! staged path line ([`super::gpudirect`]) rather than failing the run.

use super::probe::{probe, ProbeError};
use busbw_transports::{DmaBuf, MemRegion, MemoryKind};
use cudarc::driver::sys::{self, CUdevice_attribute, CUpointer_attribute, CUresult};
use cudarc::driver::DriverError;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// CUDA 11.7 (driver 515) added `cuMemGetHandleForAddressRange`; cudarc's dynamic loading
/// panics on a missing symbol, so older drivers are turned away before the call.
pub const MIN_DRIVER: i32 = 11070;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("CUDA driver call failed while {what}: {err}")]
    Driver {
        what: &'static str,
        err: DriverError,
    },
    #[error("{0}")]
    Unsupported(String),
}

/// The page-aligned range the driver exports for `ptr..ptr+len`, and where `ptr` lies in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub base: u64,
    pub size: usize,
    pub offset: u64,
}

/// `None` when the range wraps the address space or `page` is not a power of two.
pub fn window(ptr: u64, len: usize, page: u64) -> Option<Window> {
    if !page.is_power_of_two() {
        return None;
    }
    let mask = !(page - 1);
    let base = ptr & mask;
    let end = ptr.checked_add(len.max(1) as u64)?.checked_add(page - 1)? & mask;
    Some(Window {
        base,
        size: usize::try_from(end - base).ok()?,
        offset: ptr - base,
    })
}

/// `12040` as `12.4`, for messages.
pub fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// A dma-buf of one device buffer; the descriptor closes on drop (the NIC's registration
/// keeps its own reference to the dma-buf, so dropping after registering is fine).
#[derive(Debug)]
pub struct Exported {
    fd: OwnedFd,
    ptr: u64,
    len: usize,
    device: i32,
    offset: u64,
}

impl Exported {
    pub fn dmabuf(&self) -> DmaBuf {
        DmaBuf {
            fd: self.fd.as_raw_fd(),
            offset: self.offset,
        }
    }

    /// The exported buffer as a region that carries its dma-buf.
    ///
    /// # Safety
    /// The device memory must stay allocated while the region, or a registration made from
    /// it, is used; the region may only be registered while `self` is alive.
    pub unsafe fn region(&self) -> MemRegion {
        let r = MemRegion::new(
            self.ptr as *mut u8,
            self.len,
            MemoryKind::Cuda {
                device: self.device,
            },
        );
        r.with_dmabuf(self.dmabuf())
    }
}

fn check(what: &'static str, r: CUresult) -> Result<(), ExportError> {
    r.result().map_err(|err| ExportError::Driver { what, err })
}

/// A pointer attribute that is a 32-bit integer (or a boolean the driver writes as one).
fn attr_i32(ptr: u64, a: CUpointer_attribute, what: &'static str) -> Result<i32, ExportError> {
    let mut v = 0i32;
    // SAFETY: v is a valid out-parameter of the attribute's size.
    check(what, unsafe {
        sys::cuPointerGetAttribute(&mut v as *mut i32 as *mut c_void, a, ptr)
    })?;
    Ok(v)
}

/// The calls that need the buffer's context current.
fn export_current(ptr: u64, w: Window) -> Result<OwnedFd, ExportError> {
    let one: u32 = 1;
    // SAFETY: the attribute's value is an unsigned int read through the pointer.
    check("setting SYNC_MEMOPS on the buffer", unsafe {
        sys::cuPointerSetAttribute(
            &one as *const u32 as *const c_void,
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
            ptr,
        )
    })?;
    let mut fd: i32 = -1;
    // SAFETY: a DMA_BUF_FD handle is an int written through the pointer; the window is page
    // aligned as the call requires.
    check("exporting the buffer as a dma-buf", unsafe {
        sys::cuMemGetHandleForAddressRange(
            &mut fd as *mut i32 as *mut c_void,
            w.base,
            w.size,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    })?;
    if fd < 0 {
        return Err(ExportError::Unsupported(
            "the driver returned no dma-buf descriptor".into(),
        ));
    }
    // SAFETY: the driver handed over a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Exports device memory `ptr..ptr+len` (a `cuMemAlloc` allocation, or a part of one) as a
/// dma-buf. Also sets `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`, which GPUDirect RDMA needs so that
/// copies the driver makes into the buffer are complete before the NIC reads it.
pub fn export(ptr: u64, len: usize) -> Result<Exported, ExportError> {
    probe()?;
    let mut v = 0;
    // SAFETY: plain out-parameter.
    check("reading the driver version", unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    if v < MIN_DRIVER {
        return Err(ExportError::Unsupported(format!(
            "the CUDA driver ({}) is older than 11.7, the first that exports dma-bufs",
            version_text(v)
        )));
    }
    let capable = attr_i32(
        ptr,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
        "asking whether the buffer is GPUDirect RDMA capable",
    )?;
    if capable == 0 {
        return Err(ExportError::Unsupported(
            "the buffer is not GPUDirect RDMA capable (stream-ordered pool memory is not; cuMemAlloc memory is)".into(),
        ));
    }
    let ordinal = attr_i32(
        ptr,
        CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        "reading the buffer's device",
    )?;
    let mut dev = 0;
    // SAFETY: plain out-parameter; the ordinal came from the driver.
    check("opening the buffer's device", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal)
    })?;
    let mut supported = 0;
    // SAFETY: plain out-parameter. An unknown attribute (an old driver) reads as "no".
    let r = unsafe {
        sys::cuDeviceGetAttribute(
            &mut supported,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
            dev,
        )
    };
    if r.result().is_err() || supported == 0 {
        return Err(ExportError::Unsupported(format!(
            "GPU {ordinal} or its driver cannot export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)"
        )));
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let w = window(ptr, len, page).ok_or_else(|| {
        ExportError::Unsupported(format!("{len} bytes at {ptr:#x} wrap the address space"))
    })?;

    // cudarc allocates in the device's primary context; make it current for the calls that
    // need one, whatever this thread had current before.
    let mut ctx = std::ptr::null_mut();
    // SAFETY: plain out-parameter; released below.
    check("retaining the primary context", unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
    })?;
    // SAFETY: ctx was retained above.
    let result = check("making the context current", unsafe {
        sys::cuCtxPushCurrent_v2(ctx)
    })
    .and_then(|()| {
        let r = export_current(ptr, w);
        let mut prev = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        unsafe { sys::cuCtxPopCurrent_v2(&mut prev) };
        r
    });
    // SAFETY: balances the retain above.
    unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
    Ok(Exported {
        fd: result?,
        ptr,
        len,
        device: ordinal,
        offset: w.offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_window_covers_whole_pages_around_the_region() {
        let w = window(0x7f00_0000_1234, 100, 4096).unwrap();
        assert_eq!(
            w,
            Window {
                base: 0x7f00_0000_1000,
                size: 4096,
                offset: 0x234
            }
        );
        // Crossing a page boundary takes both pages; an aligned region is its own window.
        assert_eq!(window(0x1ff0, 0x20, 4096).unwrap().size, 8192);
        assert_eq!(
            window(0x10000, 1 << 20, 65536).unwrap(),
            Window {
                base: 0x10000,
                size: 1 << 20,
                offset: 0
            }
        );
        assert_eq!(window(u64::MAX - 10, 100, 4096), None);
        assert_eq!(window(0x1000, 10, 3000), None);
        assert_eq!(version_text(12040), "12.4");
        assert_eq!(version_text(11070), "11.7");
    }

    /// Export needs a GPU; without a driver the probe's error comes back instead of a panic.
    #[test]
    fn export_without_a_driver_is_an_error_not_a_panic() {
        if probe().is_ok() {
            let _ = writeln!(std::io::stderr(),
                "SKIP export_without_a_driver_is_an_error_not_a_panic because a CUDA driver is present (a_cumemalloc_buffer_exports_on_a_gpu runs instead)"
            );
            return;
        }
        match export(0x1000, 64) {
            Err(ExportError::Probe(_)) => {}
            other => panic!("{other:?}"),
        }
    }

    /// On a GPU: a `cuMemAlloc` buffer exports (or is refused with a reason when the GPU
    /// cannot export dma-bufs), and the descriptor is a live dma-buf.
    #[test]
    fn a_cumemalloc_buffer_exports_on_a_gpu() {
        let why = match probe() {
            Err(e) => Some(e.to_string()),
            Ok(_) => match cudarc::driver::CudaContext::device_count() {
                Ok(n) if n > 0 => None,
                Ok(_) => Some("the driver shows no device".into()),
                Err(e) => Some(e.to_string()),
            },
        };
        if let Some(why) = why {
            let _ = writeln!(
                std::io::stderr(),
                "SKIP a_cumemalloc_buffer_exports_on_a_gpu because there is no GPU ({why})"
            );
            return;
        }
        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        ctx.bind_to_thread().unwrap();
        let len = (1usize << 20) + 100;
        let mut p = 0;
        // SAFETY: plain allocation in the current (primary) context, freed below.
        unsafe { sys::cuMemAlloc_v2(&mut p, len) }.result().unwrap();
        match export(p + 4096 + 16, len - 8192) {
            Ok(e) => {
                let d = e.dmabuf();
                assert!(d.fd >= 0);
                assert_eq!(d.offset, 16);
                // SAFETY: fstat on a descriptor this test owns.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                assert_eq!(unsafe { libc::fstat(d.fd, &mut st) }, 0);
                let r = unsafe { e.region() };
                assert_eq!(
                    (r.len(), r.dmabuf(), r.kind()),
                    (len - 8192, Some(d), MemoryKind::Cuda { device: 0 })
                );
                let _ = writeln!(
                    std::io::stderr(),
                    "dma-buf export: fd {} offset {}",
                    d.fd,
                    d.offset
                );
            }
            Err(ExportError::Unsupported(why)) => {
                let _ =
                    writeln!(std::io::stderr(),
                    "SKIP the export half of a_cumemalloc_buffer_exports_on_a_gpu because {why}"
                );
            }
            Err(e) => panic!("{e}"),
        }
        // SAFETY: allocated above; nothing uses it any more.
        unsafe { sys::cuMemFree_v2(p) }.result().unwrap();
    }
}
