//! Host buffers.
//!
//! Page-aligned so that any element type, any transport (verbs registers whole pages) and
//! the buffer-offset rotation of the harness keep natural alignment.

pub(crate) mod shared;

use busbw_transports::platform::{Platform, Shareable};
use busbw_transports::{MemRegion, MemoryKind};
use std::alloc::{self, Layout};
use std::ptr::NonNull;

const ALIGN: usize = 4096;

/// A zero-initialised, page-aligned host allocation.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// The region behind a [`HostBuffer::shared`] buffer, and the platform that made it;
    /// `None` for heap memory.
    shared: Option<(Shareable, Platform)>,
}

// SAFETY: HostBuffer owns its allocation like a Vec<u8>.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocate `len` zeroed bytes. Returns None if the allocator refuses (out of memory), so
    /// the harness can say how much it asked for instead of aborting.
    pub fn new(len: usize) -> Option<Self> {
        if len == 0 {
            return Some(HostBuffer {
                ptr: NonNull::<u64>::dangling().cast(),
                len: 0,
                shared: None,
            });
        }
        let layout = Layout::from_size_align(len, ALIGN).ok()?;
        // SAFETY: layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        Some(HostBuffer {
            ptr,
            len,
            shared: None,
        })
    }

    /// [`HostBuffer::mapped`] in memory that ranks on the same host can map (a memfd, or a
    /// POSIX shared-memory object on the portable platform): the direct AllReduce
    /// ([`crate::algorithms::direct`]) reads and writes peers' buffers in place when every rank's are
    /// shared. Where none can be had, a heap buffer, which algorithms move by copying as
    /// before. The platform is this process's ([`Platform::active`]).
    pub fn shared(len: usize) -> Option<Self> {
        Self::shared_on(Platform::active(), len)
    }

    /// [`HostBuffer::shared`] made by a given platform (tests run both).
    pub fn shared_on(platform: Platform, len: usize) -> Option<Self> {
        if len == 0 {
            return Self::new(0);
        }
        match shared::create(platform, len) {
            Ok(s) => Some(HostBuffer {
                ptr: s.as_ptr(),
                len,
                shared: Some((s, platform)),
            }),
            Err(_) => Self::mapped(len),
        }
    }

    /// Whether peers on this host can map this buffer.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Which platform shares this buffer with peers, if one does.
    pub fn sharing(&self) -> Option<Platform> {
        self.shared.as_ref().map(|s| s.1)
    }

    /// [`HostBuffer::new`] with every page mapped now (by writing the zeros it holds), so
    /// that first touches do not fault later, inside a measurement.
    pub fn mapped(len: usize) -> Option<Self> {
        const PAGE: usize = 4096;
        let b = Self::new(len)?;
        let base = b.ptr.as_ptr();
        for at in (0..b.len).step_by(PAGE) {
            // SAFETY: `at < len`, inside the allocation, which is zeroed: the store keeps its
            // contents. Volatile so that it is not elided as a write of the value there.
            unsafe { base.add(at).write_volatile(0) };
        }
        Some(b)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Grow to at least `len` bytes (contents are not preserved).
    pub fn ensure(&mut self, len: usize) -> Option<()> {
        if self.len < len {
            *self = HostBuffer::new(len)?;
        }
        Some(())
    }

    /// The region a transport sees; valid while `self` is neither dropped nor grown.
    pub fn region(&mut self) -> MemRegion {
        // SAFETY: the pointer is valid for len bytes; callers keep self alive and unmoved
        // (it is heap memory, so moving the HostBuffer value itself is fine) for the
        // registration's lifetime.
        unsafe { MemRegion::new(self.ptr.as_ptr(), self.len, MemoryKind::Host) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some((region, _)) = self.shared.take() {
            // Out of the table first, so that no call finds a key to unmapped memory.
            shared::forget(self.ptr);
            drop(region);
        } else if self.len > 0 {
            if let Ok(layout) = Layout::from_size_align(self.len, ALIGN) {
                // SAFETY: allocated in `new` with this very layout.
                unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
            }
        }
    }
}
