//! `-M`: how much memory joining the job, the benchmark's buffers and the collectives took,
//! as nccl-tests reports it. nccl-tests takes free-device-memory differences; on host buffers
//! the same phases are differences of the process's resident memory (so with `-t`, the
//! process's ranks together). Host buffers are zeroed when allocated, so they count as
//! allocated memory rather than where a later size first writes them.

use std::sync::OnceLock;

static START: OnceLock<u64> = OnceLock::new();

/// Records the resident memory of a process that has not joined a job yet; later calls keep
/// the first figure.
pub fn mark_start() {
    START.get_or_init(resident);
}

/// The figure [`mark_start`] kept (now, if it was never called).
pub fn start() -> u64 {
    *START.get_or_init(resident)
}

/// Resident memory of this process, bytes (0 where the platform cannot tell; the portable
/// platform gives the peak, `getrusage`'s figure).
pub fn resident() -> u64 {
    busbw_transports::platform::Platform::active()
        .resident_bytes()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `buf` the kernel holds in memory, and all its pages (mincore(2): about this
    /// buffer alone, so other tests' allocations do not disturb it).
    fn resident_pages(buf: &[u8]) -> (usize, usize) {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let start = buf.as_ptr() as usize / page * page;
        let len = buf.as_ptr() as usize + buf.len() - start;
        let mut v = vec![0u8; len.div_ceil(page)];
        // SAFETY: the range covers pages of a live allocation; `v` has one byte per page.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        (v.iter().filter(|b| *b & 1 == 1).count(), v.len())
    }

    #[test]
    fn host_buffers_are_resident_from_allocation() {
        assert!(
            resident() > 0,
            "/proc/self/statm should give a resident size"
        );
        let b = busbw_collectives::HostBuffer::new(64 << 20).unwrap();
        let (resident, pages) = resident_pages(b.as_slice());
        assert_eq!(resident, pages);
    }
}
