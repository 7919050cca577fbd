//! The portable implementation: POSIX shared-memory objects and socket files. Compiled on
//! every system (Linux included, where `BUSBW_PLATFORM=portable` selects it), with `cfg`s
//! only where POSIX leaves a detail to the system.

use super::{fstat, invalid, LocalListener, PeerKey, Shareable, NAMED};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Numbers this process's objects: with the pid, a name no other live process uses.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Names stay within macOS's 31 characters: `/busbw-shm.<pid>.<n>`.
fn object_name(label: &str, pid: u64, n: u64) -> io::Result<CString> {
    CString::new(format!("/{label}.{pid}.{n}")).map_err(|_| invalid("a NUL in a name"))
}

fn shm_open(name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; the result is checked. macOS's shm_open is variadic,
    // where the mode travels promoted to an unsigned int.
    #[cfg(target_vendor = "apple")]
    let raw = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600 as libc::c_uint) };
    // SAFETY: as above.
    #[cfg(not(target_vendor = "apple"))]
    let raw = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600 as libc::mode_t) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    cloexec(fd.as_raw_fd())?;
    Ok(fd)
}

fn cloexec(fd: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller holds.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(super) fn unlink(name: &CStr) {
    // SAFETY: a NUL-terminated name. A name already gone is no error worth reporting.
    unsafe { libc::shm_unlink(name.as_ptr()) };
}

/// A new object of `len` bytes under a fresh name. A name left by a crashed process that
/// had our pid is skipped, not reused (O_EXCL).
fn create_named(label: &str, len: usize) -> io::Result<(OwnedFd, CString, u64)> {
    let pid = u64::from(std::process::id());
    let size = libc::off_t::try_from(len).map_err(|_| invalid("segment too large"))?;
    for _ in 0..64 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = object_name(label, pid, n)?;
        let fd = match shm_open(&name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        // SAFETY: a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            let e = io::Error::last_os_error();
            unlink(&name);
            return Err(e);
        }
        return Ok((fd, name, n));
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free shared-memory name (stale /busbw-* objects of crashed runs?)",
    ))
}

/// Named only for the moment between shm_open and shm_unlink: afterwards it is as
/// nameless as a memfd, and goes with its last descriptor and mapping. POSIX has no seals.
pub(super) fn anonymous(label: &str, len: usize) -> io::Result<OwnedFd> {
    let (fd, name, _) = create_named(label, len)?;
    unlink(&name);
    Ok(fd)
}

/// Without seals, only the size can be checked (and macOS rounds it up to a page).
pub(super) fn check_size(fd: BorrowedFd<'_>, len: usize, exact: bool) -> Result<(), String> {
    let st = fstat(fd.as_raw_fd()).map_err(|e| format!("fstat: {e}"))?;
    let size = st.st_size as u64;
    if size < len as u64 || (exact && size != len as u64) {
        return Err(format!(
            "a segment of {size} bytes where {len} bytes were announced"
        ));
    }
    Ok(())
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a shared mapping of a file the caller sized; checked for failure.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p as *mut u8).ok_or_else(|| invalid("mmap returned null"))
}

/// POSIX has no MAP_POPULATE: a read of every page faults it in now. A read, because a peer
/// may be writing the memory already.
pub(super) fn map_touched(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    let base = map_shared(fd, len)?;
    for at in (0..len).step_by(page()) {
        // SAFETY: `at < len`, inside the mapping.
        unsafe { base.as_ptr().add(at).read_volatile() };
    }
    Ok(base)
}

/// A named object, mapped with every page written (it is new, so the zeros it holds stay).
/// The name lives until the `Shareable` drops; a process killed before that leaves it in the
/// system's shared-memory directory (`/dev/shm` on Linux), as any POSIX object would.
// stat's field types differ by system (macOS's st_dev is signed).
#[allow(clippy::unnecessary_cast)]
pub(super) fn shareable(len: usize) -> io::Result<Shareable> {
    let (fd, name, n) = create_named("busbw-buf", len)?;
    let made = (|| {
        let st = fstat(fd.as_raw_fd())?;
        let base = map_shared(fd.as_fd(), len)?;
        for at in (0..len).step_by(page()) {
            // SAFETY: `at < len`, inside a mapping nobody else knows of yet.
            unsafe { base.as_ptr().add(at).write_volatile(0) };
        }
        Ok((st, base))
    })();
    let (st, base) = match made {
        Ok(m) => m,
        Err(e) => {
            unlink(&name);
            return Err(e);
        }
    };
    Ok(Shareable {
        base,
        len,
        key: PeerKey {
            pid: u64::from(std::process::id()),
            id: NAMED | n,
            ino: st.st_ino as u64,
            dev: st.st_dev as u64,
            len: len as u64,
        },
        _fd: fd,
        name: Some(name),
    })
}

pub(super) fn open_named(key: &PeerKey) -> io::Result<OwnedFd> {
    shm_open(
        &object_name("busbw-buf", key.pid, key.id & !NAMED)?,
        libc::O_RDWR,
    )
}

/// Where the system records it: kern.boottime on the BSDs and macOS; nothing elsewhere.
pub(super) fn boot_id() -> Option<String> {
    #[cfg(any(target_vendor = "apple", target_os = "freebsd"))]
    {
        // SAFETY: timeval is plain data; sysctlbyname writes at most `len` bytes into it.
        let mut tv: libc::timeval = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::timeval>();
        let rc = unsafe {
            libc::sysctlbyname(
                c"kern.boottime".as_ptr(),
                &mut tv as *mut libc::timeval as *mut libc::c_void,
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc == 0 && tv.tv_sec > 0 {
            return Some(format!("boot-{}.{:06}", tv.tv_sec, tv.tv_usec));
        }
        None
    }
    #[cfg(not(any(target_vendor = "apple", target_os = "freebsd")))]
    None
}

/// getrusage's peak resident set: kilobytes on most systems, bytes on macOS.
pub(super) fn peak_resident_bytes() -> Option<u64> {
    // SAFETY: rusage is plain data for getrusage to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a rusage to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let max = u64::try_from(ru.ru_maxrss).ok()?;
    Some(if cfg!(target_vendor = "apple") {
        max
    } else {
        max * 1024
    })
}

/// A socket file in the temporary directory (or /tmp where that path would not fit in a
/// socket address), removed when the listener drops.
pub(super) fn file_listener(name: &str) -> io::Result<LocalListener> {
    let dir = std::env::temp_dir();
    let mut path: PathBuf = dir.join(name);
    if !path.is_absolute() || path.as_os_str().len() >= 100 {
        path = PathBuf::from("/tmp").join(name);
    }
    let addr = path
        .to_str()
        .ok_or_else(|| invalid("the temporary directory is not UTF-8"))?
        .to_string();
    let listener = UnixListener::bind(&path)?;
    let l = LocalListener {
        listener,
        addr,
        path: Some(path),
    };
    l.listener.set_nonblocking(true)?;
    Ok(l)
}

/// A non-blocking, close-on-exec unix stream socket that raises no SIGPIPE where the system
/// lets a socket say so (macOS; elsewhere each send says it).
pub(super) fn unix_socket() -> io::Result<OwnedFd> {
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
    let kind = libc::SOCK_STREAM;
    // SAFETY: plain socket(2); the result is checked and owned at once.
    let raw = unsafe { libc::socket(libc::AF_UNIX, kind, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
    {
        cloexec(fd.as_raw_fd())?;
        // SAFETY: fcntl and setsockopt on a socket we own, with an int option value.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0
                || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) != 0
            {
                return Err(io::Error::last_os_error());
            }
            #[cfg(target_vendor = "apple")]
            {
                let one: libc::c_int = 1;
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_NOSIGPIPE,
                    &one as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
    Ok(fd)
}

/// Descriptors received without `MSG_CMSG_CLOEXEC` (which not every system has) are made
/// close-on-exec here, so no child inherits a peer's segment.
pub(super) fn received_cloexec(fd: &OwnedFd) -> io::Result<()> {
    cloexec(fd.as_raw_fd())
}

/// getentropy(3) gives at most 256 bytes a call.
pub(super) fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    for chunk in buf.chunks_mut(256) {
        // SAFETY: the chunk is writable for its length, at most 256 bytes.
        if unsafe { libc::getentropy(chunk.as_mut_ptr().cast(), chunk.len()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
