//! The Linux implementation: memfd, `/proc`, `process_vm_readv`, abstract unix sockets.

use super::{fstat, invalid, LocalListener, PeerKey, Shareable};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::ptr::NonNull;

/// A memfd of `len` bytes; `sealed`: its size fixed for good, so that no process holding it
/// can shrink it under another's mapping (which would fault with SIGBUS there).
pub(super) fn memfd(label: &str, len: usize, sealed: bool) -> io::Result<OwnedFd> {
    let name = CString::new(label).map_err(|_| invalid("a NUL in a memfd label"))?;
    let flags = if sealed {
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING
    } else {
        libc::MFD_CLOEXEC
    };
    // SAFETY: a NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = libc::off_t::try_from(len).map_err(|_| invalid("segment too large"))?;
    // SAFETY: plain syscalls on a descriptor we own.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), size) != 0 {
            return Err(io::Error::last_os_error());
        }
        if sealed {
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(fd)
}

/// A received segment must be exactly `len` bytes and unable to shrink under us.
pub(super) fn check_sealed(fd: BorrowedFd<'_>, len: usize) -> Result<(), String> {
    let st = fstat(fd.as_raw_fd()).map_err(|e| format!("fstat: {e}"))?;
    // SAFETY: fcntl on a descriptor the caller holds.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if st.st_size as u64 != len as u64 || seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(format!(
            "a segment of {} bytes (seals {seals}) where {len} sealed bytes were announced",
            st.st_size
        ));
    }
    Ok(())
}

/// MAP_POPULATE: the kernel fills the page tables in the one mmap call.
pub(super) fn map_populated(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a shared mapping of a file the caller sized; checked for failure.
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

/// A memfd mapped here, found by peers as `/proc/<pid>/fd/<fd>`: no name in any file system,
/// so a crashed job leaves nothing behind. Opening a peer's descriptor through /proc takes
/// the same permission as reading its memory with `process_vm_readv` under a plain ptrace
/// policy, and less under Yama's (which restricts attaching, not /proc/<pid>/fd).
pub(super) fn shareable(len: usize) -> io::Result<Shareable> {
    let fd = memfd("busbw-buffer", len, false)?;
    let st = fstat(fd.as_raw_fd())?;
    let base = map_populated(fd.as_fd(), len)?;
    Ok(Shareable {
        base,
        len,
        key: PeerKey {
            pid: u64::from(std::process::id()),
            id: fd.as_raw_fd() as u64,
            ino: st.st_ino,
            dev: st.st_dev,
            len: len as u64,
        },
        _fd: fd,
        name: None,
    })
}

pub(super) fn open_peer_fd(key: &PeerKey) -> io::Result<OwnedFd> {
    let path = CString::new(format!("/proc/{}/fd/{}", key.pid, key.id))
        .map_err(|_| invalid("a NUL in a path"))?;
    // SAFETY: a NUL-terminated path.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor; closed when dropped (a mapping keeps the file).
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// One `process_vm_readv` per piece the kernel returns.
///
/// # Safety
/// `dst..dst+len` must be writable.
#[inline]
pub(super) unsafe fn cma_read(pid: i32, remote: u64, dst: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let local = libc::iovec {
            iov_base: dst.add(done) as *mut libc::c_void,
            iov_len: len - done,
        };
        let far = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        let n = libc::process_vm_readv(pid, &local, 1, &far, 1, 0);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read no bytes",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

pub(super) fn boot_id() -> Option<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The second field of statm (resident pages), in bytes.
pub(super) fn resident_bytes() -> Option<u64> {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}

pub(super) fn kernel_hostname() -> Option<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Abstract sockets are scoped by the network namespace and have no file to clean up.
pub(super) fn abstract_listener(name: &str) -> io::Result<LocalListener> {
    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
    listener.set_nonblocking(true)?;
    Ok(LocalListener {
        listener,
        addr: format!("@{name}"),
        path: None,
    })
}

pub(super) fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: getrandom writes at most the given length into the buffer.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

pub(super) fn set_tcp_congestion(fd: RawFd, name: &str) -> bool {
    // SAFETY: the value is `name`'s bytes and length; a bad descriptor is only an error.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr() as *const libc::c_void,
            name.len() as libc::socklen_t,
        )
    };
    rc == 0
}
