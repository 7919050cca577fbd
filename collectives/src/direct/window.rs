//! Memory that ranks of one host can map from each other: this process's shared regions and
//! the peers' regions mapped here.
//!
//! A shared [`HostBuffer`](crate::HostBuffer) is a memfd mapped `MAP_SHARED`, recorded in a
//! process-wide table so that a call can tell from its pointers alone whether (and where) its
//! buffers can be mapped by a peer: the [`Key`] it sends names the file (this process's pid,
//! the descriptor, the inode) and the offset. A peer opens `/proc/<pid>/fd/<fd>` and maps the
//! whole file (MPI's XPMEM and NCCL's P2P transport hand out peer pointers the same way,
//! through a kernel module and the CUDA driver). Opening a peer's descriptor through /proc
//! takes the same permission as reading its memory with `process_vm_readv` under a plain
//! ptrace policy, and less under Yama's (which restricts attaching, not /proc/<pid>/fd); the
//! inode and size the key carries are checked against the opened file, so a pid that means
//! another process here (ranks in separate pid namespaces) cannot map the wrong memory.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Mutex;

/// One region of this process that peers may map.
#[derive(Clone, Copy)]
struct Local {
    base: usize,
    len: usize,
    fd: i32,
    ino: u64,
    dev: u64,
}

static LOCAL: Mutex<Vec<Local>> = Mutex::new(Vec::new());

/// Where a range of this process's memory can be found by a peer: enough to open and check
/// the file, and the range's place in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub pid: u64,
    pub fd: u64,
    pub ino: u64,
    pub dev: u64,
    /// The whole file's length.
    pub file_len: u64,
    /// The range's offset in the file.
    pub off: u64,
}

/// Allocates `len` bytes of shared memory, every page mapped now, and records it. Returns the
/// mapping and the descriptor that keeps the file open (peers open it through /proc).
pub(crate) fn create(len: usize) -> io::Result<(NonNull<u8>, OwnedFd)> {
    // SAFETY: a NUL-terminated name; flags are valid.
    let raw = unsafe { libc::memfd_create(c"busbw-buffer".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let st = fstat(fd.as_raw_fd())?;
    // The pages exist before any measurement touches them (as `mapped` does for heap
    // buffers).
    let ptr = map_populated(&fd, len)?;
    lock().push(Local {
        base: ptr.as_ptr() as usize,
        len,
        fd: fd.as_raw_fd(),
        ino: st.st_ino,
        dev: st.st_dev,
    });
    Ok((ptr, fd))
}

/// Forgets and unmaps a region [`create`] made (the caller closes the descriptor after).
///
/// # Safety
/// `ptr` and `len` are exactly what `create` returned and asked for, and nothing uses the
/// mapping any more.
pub(crate) unsafe fn release(ptr: NonNull<u8>, len: usize) {
    lock().retain(|l| l.base != ptr.as_ptr() as usize);
    libc::munmap(ptr.as_ptr().cast(), len);
}

fn lock() -> std::sync::MutexGuard<'static, Vec<Local>> {
    // A panic elsewhere while holding the lock leaves a consistent table (every update is
    // one push or retain): keep using it.
    LOCAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn fstat(fd: i32) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat to fill.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// The key of `len` bytes at `p`, if they lie in one shared region of this process.
pub(crate) fn key_of(p: *const u8, len: usize) -> Option<Key> {
    let at = p as usize;
    let t = lock();
    let l = t
        .iter()
        .find(|l| at >= l.base && at.checked_add(len).is_some_and(|e| e <= l.base + l.len))?;
    Some(Key {
        pid: u64::from(std::process::id()),
        fd: l.fd as u64,
        ino: l.ino,
        dev: l.dev,
        file_len: l.len as u64,
        off: (at - l.base) as u64,
    })
}

/// A peer's file mapped into this process (unmapped on drop).
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// The mapped address of byte `off` of the file.
    pub fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.len);
        self.base.as_ptr().wrapping_add(off)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `map_file` with this length; nothing borrows it past a call.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

// SAFETY: plain shared memory owned by this value.
unsafe impl Send for Mapping {}

/// A peer's region kept mapped by [`Windows`].
struct Mapped {
    rank: usize,
    ino: u64,
    dev: u64,
    map: Mapping,
    /// Call counter of its last use, for eviction.
    used: u64,
}

/// Peers' regions kept mapped by one communicator between calls: a sweep's buffers are
/// mapped once, on its first call.
#[derive(Default)]
pub(crate) struct Windows {
    maps: Vec<Mapped>,
    calls: u64,
}

/// Mappings kept per peer: a sweep uses two (send and receive buffers) and a calibration one
/// more; older ones are unmapped when newer ones come.
const KEEP_PER_PEER: usize = 4;

impl Windows {
    /// Starts a call: mappings used from now on are this call's.
    pub fn begin(&mut self) {
        self.calls += 1;
    }

    /// The address in this process of `len` bytes at `key` in `rank`'s memory, mapping the
    /// peer's file if it is not mapped yet.
    pub fn map(&mut self, rank: usize, key: &Key, len: u64) -> io::Result<*mut u8> {
        key.off
            .checked_add(len)
            .filter(|&e| e <= key.file_len)
            .ok_or_else(|| invalid("the range lies outside the peer's buffer"))?;
        let calls = self.calls;
        if let Some(m) = self
            .maps
            .iter_mut()
            .find(|m| m.rank == rank && m.ino == key.ino && m.dev == key.dev)
        {
            if m.map.len as u64 == key.file_len {
                m.used = calls;
                // off + len <= file_len == the mapping's length (checked above).
                return Ok(m.map.at(key.off as usize));
            }
        }
        // A stale mapping of the same file (it cannot change size, but be safe) goes first.
        self.maps
            .retain(|m| !(m.rank == rank && m.ino == key.ino && m.dev == key.dev));
        let m = Mapped {
            rank,
            ino: key.ino,
            dev: key.dev,
            map: map_file(key)?,
            used: calls,
        };
        let p = m.map.at(key.off as usize);
        self.maps.push(m);
        let mine = self.maps.iter().filter(|m| m.rank == rank).count();
        if mine > KEEP_PER_PEER {
            // Oldest first; never one used in this call.
            if let Some(i) = self
                .maps
                .iter()
                .enumerate()
                .filter(|(_, m)| m.rank == rank && m.used < calls)
                .min_by_key(|(_, m)| m.used)
                .map(|(i, _)| i)
            {
                self.maps.swap_remove(i);
            }
        }
        Ok(p)
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Maps the whole file `key` names, after checking that it is the file the key describes.
pub(crate) fn map_file(key: &Key) -> io::Result<Mapping> {
    let path = format!("/proc/{}/fd/{}\0", key.pid, key.fd);
    // SAFETY: a NUL-terminated path.
    let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor; closed when `fd` drops (the mapping keeps the file).
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let st = fstat(fd.as_raw_fd())?;
    if st.st_ino != key.ino || st.st_dev != key.dev || st.st_size as u64 != key.file_len {
        return Err(invalid(
            "the peer's descriptor is not the buffer it described (another pid namespace?)",
        ));
    }
    let len = usize::try_from(key.file_len).map_err(|_| invalid("buffer too large"))?;
    // MAP_POPULATE: the page tables are filled now, not by a fault per page on the first
    // pass of a measurement over the peer's buffer (measured: 1 MiB out of place on 2 ranks
    // took about twice as long with the tables filled per call instead). The resident set size
    // then counts the peers' buffers too, as it counts any shared memory in every process
    // that maps it; the memory is the same (BENCHMARKS.md).
    let base = map_populated(&fd, len)?;
    Ok(Mapping { base, len })
}

/// Maps all `len` bytes of the file `fd` shared, readable and writable, page tables filled.
fn map_populated(fd: &OwnedFd, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a shared mapping of a file of `len` bytes (callers checked or set its size).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p as *mut u8).ok_or_else(|| invalid("mmap returned null"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostBuffer;

    #[test]
    fn a_mapping_sees_the_same_memory_and_a_wrong_key_is_refused() {
        let mut b = HostBuffer::shared(3 * 4096).unwrap();
        assert!(b.is_shared());
        let at = b.as_slice().as_ptr().wrapping_add(4096 + 8);
        let key = key_of(at, 100).expect("inside a shared buffer");
        assert_eq!((key.off, key.file_len), (4096 + 8, 3 * 4096));
        assert!(key_of(at, 3 * 4096).is_none(), "runs past the end");
        let mut w = Windows::default();
        w.begin();
        let p = w.map(1, &key, 100).unwrap();
        b.as_mut_slice()[4096 + 8] = 0xa5;
        // SAFETY: the mapping holds 100 bytes from p.
        assert_eq!(unsafe { p.read_volatile() }, 0xa5);
        // SAFETY: as above.
        unsafe { p.add(1).write_volatile(0x5a) };
        assert_eq!(b.as_slice()[4096 + 9], 0x5a);
        // The same file again: the same mapping.
        assert_eq!(w.map(1, &key, 100).unwrap(), p);
        let wrong = Key {
            ino: key.ino ^ 1,
            ..key
        };
        let e = w.map(2, &wrong, 100).unwrap_err().to_string();
        assert!(e.contains("not the buffer it described"), "{e}");
        assert!(w.map(2, &key, 3 * 4096).is_err(), "a range beyond the file");
        drop(w);
        drop(b);
        assert!(key_of(at, 1).is_none(), "forgotten when freed");
    }

    #[test]
    fn heap_buffers_have_no_key() {
        let b = HostBuffer::mapped(8192).unwrap();
        assert!(!b.is_shared());
        assert!(key_of(b.as_slice().as_ptr(), 10).is_none());
    }
}
