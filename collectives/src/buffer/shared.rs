//! This process's memory that ranks of the same host can map: shared regions, recorded so
//! that a call can tell from its pointers alone where a peer finds them.
//!
//! A shared [`HostBuffer`](crate::HostBuffer) is a [`Shareable`] region of the transports'
//! [`Platform`], recorded in a process-wide table so that a call can tell from its pointers
//! alone whether (and where) its buffers can be mapped by a peer: the [`Key`] it sends is the
//! region's [`PeerKey`] (on Linux this process's pid, the memfd's descriptor, opened by the
//! peer through `/proc/<pid>/fd`; on the portable platform the POSIX object's name) and the
//! range's offset. The peer maps the whole region (MPI's XPMEM and NCCL's P2P transport hand
//! out peer pointers the same way, through a kernel module and the CUDA driver); the identity
//! and size the key carries are checked against the opened file, so a pid that means another
//! process here (ranks in separate pid namespaces) cannot map the wrong memory.

use busbw_transports::platform::{self, PeerKey, Platform, Shareable};
use std::io;
use std::ptr::NonNull;
use std::sync::Mutex;

pub(crate) use busbw_transports::platform::PeerMapping as Mapping;

/// One region of this process that peers may map.
#[derive(Clone, Copy)]
struct Local {
    base: usize,
    len: usize,
    key: PeerKey,
}

static LOCAL: Mutex<Vec<Local>> = Mutex::new(Vec::new());

/// Where a range of this process's memory can be found by a peer: the region's key and the
/// range's place in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub region: PeerKey,
    /// The range's offset in the region.
    pub off: u64,
}

impl Key {
    /// The words a key travels as.
    pub fn to_words(self) -> [u64; 6] {
        let r = self.region.to_words();
        [r[0], r[1], r[2], r[3], r[4], self.off]
    }

    pub fn from_words(w: &[u64]) -> Key {
        let mut r = [0u64; 5];
        r.copy_from_slice(&w[..5]);
        Key {
            region: PeerKey::from_words(r),
            off: w[5],
        }
    }
}

/// Allocates `len` bytes of shared memory on `platform`, every page mapped now (as `mapped`
/// does for heap buffers, so no page faults inside a measurement), and records it.
pub(crate) fn create(platform: Platform, len: usize) -> io::Result<Shareable> {
    let s = platform.shareable(len)?;
    lock().push(Local {
        base: s.as_ptr().as_ptr() as usize,
        len,
        key: s.key(),
    });
    Ok(s)
}

/// Forgets a region [`create`] made, before it is dropped.
pub(crate) fn forget(ptr: NonNull<u8>) {
    lock().retain(|l| l.base != ptr.as_ptr() as usize);
}

fn lock() -> std::sync::MutexGuard<'static, Vec<Local>> {
    // A panic elsewhere while holding the lock leaves a consistent table (every update is
    // one push or retain): keep using it.
    LOCAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key of `len` bytes at `p`, if they lie in one shared region of this process.
pub(crate) fn key_of(p: *const u8, len: usize) -> Option<Key> {
    let at = p as usize;
    let t = lock();
    let l = t
        .iter()
        .find(|l| at >= l.base && at.checked_add(len).is_some_and(|e| e <= l.base + l.len))?;
    Some(Key {
        region: l.key,
        off: (at - l.base) as u64,
    })
}

/// Maps the whole region `key` names, after checking that it is the region the key
/// describes.
pub(crate) fn map_file(key: &Key) -> io::Result<Mapping> {
    platform::map_peer(&key.region)
}
