//! Memory registration: memory regions (host, peer-memory and dma-buf), the buffers a comm
//! owns, and the cache that keeps a collective's buffers registered from one call to the next.

use super::{reg_dmabuf_mr, Device};
use crate::verbs::gpudirect::RegPath;
use crate::{MemRegion, Registration, Result, TransportError};
use ibverbs_sys as ffi;
use std::collections::HashMap;
use std::io;

impl Device {
    /// NCCL's dma-buf probe: register nothing from an invalid descriptor and return the errno
    /// (see [`super::gpudirect::dmabuf_from_probe`]); `None` when libibverbs lacks the call.
    pub fn dmabuf_probe(&self) -> Option<i32> {
        let f = reg_dmabuf_mr()?;
        // SAFETY: pd is valid; fd -1 makes the kernel reject the call before touching memory.
        let mr = unsafe { f(self.pd, 0, 0, 0, -1, 0) };
        if mr.is_null() {
            return Some(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        // SAFETY: a region the call above returned; deregistered once.
        unsafe { ffi::ibv_dereg_mr(mr) };
        Some(0)
    }

    /// Registers `region` by `path`, reusing a cached registration of the same range. The key
    /// carries both keys (lkey high, rkey low) so the data path needs no lookup.
    pub fn register(&self, region: MemRegion, path: RegPath) -> Result<Registration> {
        if region.is_empty() {
            // Nothing to read or write: zero-length messages carry no SGE.
            return Ok(Registration { region, key: 0 });
        }
        let mut cache = self.mrs.lock().unwrap_or_else(|p| p.into_inner());
        let k = (region.ptr() as usize, region.len());
        if let Some(e) = cache.map.get_mut(&k) {
            e.refs += 1;
            return Ok(Registration {
                region,
                key: e.mr.key(),
            });
        }
        // A freed buffer whose address range was reused must not keep its old pages pinned
        // behind a stale registration: drop unused entries that overlap the new range.
        cache.evict_overlapping(k);
        // A device registration that fails leaves staging as the way out: say so in the
        // error callers already handle that way.
        let device = |what: String| TransportError::DeviceMemory {
            transport: "verbs",
            missing: what,
        };
        let mr = match path {
            RegPath::Host => Mr::new(self.pd, region.ptr(), region.len())?,
            RegPath::PeerMem => Mr::reg(self.pd, region.ptr(), region.len()).map_err(|e| {
                device(format!(
                    "ibv_reg_mr of {} bytes of device memory through the peer-memory module failed: {e}",
                    region.len()
                ))
            })?,
            RegPath::DmaBuf(d) => Mr::dmabuf(self.pd, &region, d)
                .map_err(|e| device(format!("registering its dma-buf failed: {e}")))?,
        };
        let key = mr.key();
        cache.map.insert(k, MrEntry { mr, refs: 1 });
        cache.trim();
        Ok(Registration { region, key })
    }

    /// Releases a registration; the memory region stays cached for the next collective call
    /// on the same buffers (registration costs milliseconds on large buffers).
    pub fn release(&self, r: &Registration) {
        let mut cache = self.mrs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = cache
            .map
            .get_mut(&(r.region.ptr() as usize, r.region.len()))
        {
            e.refs = e.refs.saturating_sub(1);
        }
        cache.trim();
    }

    /// A registered, zeroed buffer owned by a comm (FIFO, FIFO staging).
    pub fn buffer(&self, len: usize) -> Result<OwnedMr> {
        let mut mem = vec![0u8; len.max(64)].into_boxed_slice();
        let mr = Mr::new(self.pd, mem.as_mut_ptr(), mem.len())?;
        Ok(OwnedMr { mr, mem })
    }
}

pub struct Mr {
    mr: *mut ffi::ibv_mr,
}

const ACCESS: ffi::ibv_access_flags = ffi::ibv_access_flags(
    ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
);

impl Mr {
    fn new(pd: *mut ffi::ibv_pd, ptr: *mut u8, len: usize) -> Result<Mr> {
        Mr::reg(pd, ptr, len).map_err(|e| {
            TransportError::Unsupported(format!(
                "registering {len} bytes for RDMA: {e} (raise `ulimit -l`, the locked-memory limit)"
            ))
        })
    }

    /// `ibv_reg_mr`, with the bare OS error: host memory's failure is usually the
    /// locked-memory limit, device memory's is not, so callers word it.
    fn reg(pd: *mut ffi::ibv_pd, ptr: *mut u8, len: usize) -> io::Result<Mr> {
        // SAFETY: pd is valid; the caller keeps ptr..ptr+len allocated while registered.
        let mr = unsafe { ffi::ibv_reg_mr(pd, ptr as *mut _, len.max(1), ACCESS.0 as i32) };
        if mr.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Mr { mr })
    }

    /// Registers `region` from dma-buf `d` with the region's own address as the I/O virtual
    /// address, so work requests name device memory exactly as they name host memory.
    fn dmabuf(pd: *mut ffi::ibv_pd, region: &MemRegion, d: crate::DmaBuf) -> Result<Mr> {
        let f = reg_dmabuf_mr().ok_or_else(|| {
            TransportError::Unsupported("this libibverbs has no ibv_reg_dmabuf_mr".into())
        })?;
        let len = region.len();
        // SAFETY: pd is valid; the caller keeps the dma-buf's memory allocated while
        // registered and fd open for the call (MemRegion::with_dmabuf's contract).
        let mr = unsafe {
            f(
                pd,
                d.offset,
                len,
                region.ptr() as u64,
                d.fd,
                ACCESS.0 as i32,
            )
        };
        if mr.is_null() {
            return Err(TransportError::Unsupported(format!(
                "ibv_reg_dmabuf_mr of {len} bytes at offset {} of dma-buf fd {}: {}",
                d.offset,
                d.fd,
                io::Error::last_os_error()
            )));
        }
        Ok(Mr { mr })
    }
    pub fn lkey(&self) -> u32 {
        // SAFETY: mr is valid for self's lifetime.
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
    fn key(&self) -> u64 {
        ((self.lkey() as u64) << 32) | self.rkey() as u64
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

/// A registered buffer and its memory (dropped after the registration: field order).
pub struct OwnedMr {
    pub mr: Mr,
    pub mem: Box<[u8]>,
}

impl OwnedMr {
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
}

struct MrEntry {
    mr: Mr,
    refs: usize,
}

/// Registrations keyed by exact range, kept after release up to [`MrCache::KEEP`] unused
/// entries.
#[derive(Default)]
pub(super) struct MrCache {
    map: HashMap<(usize, usize), MrEntry>,
}

impl MrCache {
    const KEEP: usize = 64;

    fn evict_overlapping(&mut self, (p, l): (usize, usize)) {
        self.map
            .retain(|&(q, m), e| e.refs > 0 || q + m <= p || p + l <= q);
    }

    fn trim(&mut self) {
        let idle = self.map.values().filter(|e| e.refs == 0).count();
        if idle > Self::KEEP {
            self.map.retain(|_, e| e.refs > 0);
        }
    }
}
