//! The one place that talks to the operating system beyond POSIX: shared memory that other
//! processes of the host can map, reading another process's memory, the node's identity and
//! this process's resident memory.
//!
//! Two implementations sit behind [`Platform`]. `linux` is what busbw was built on: memfd
//! segments (sealed, nameless, gone when the last mapping goes), peers' files opened through
//! `/proc/<pid>/fd`, `process_vm_readv` for single-copy messages, the kernel's boot id.
//! `portable` needs only POSIX and so builds everywhere (macOS included): `shm_open`
//! objects, unlinked at once where nobody needs the name and by their owner otherwise, no
//! cross-memory reads (the shared-memory transport streams every byte through its ring),
//! abstract unix sockets replaced by socket files in the temporary directory.
//!
//! The portable one is compiled on Linux too and chosen at run time by `BUSBW_PLATFORM`
//! ([`PLATFORM_ENV`]), so that the tests run what a Mac runs without a Mac. The choice is
//! made once per connection or buffer, never per message: the data path keeps its syscalls.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::str::FromStr;
use std::sync::OnceLock;

#[cfg(target_os = "linux")]
mod linux;
mod posix;

/// The environment variable that selects the implementation: `linux` (the default on Linux)
/// or `portable` (the only one elsewhere).
pub const PLATFORM_ENV: &str = "BUSBW_PLATFORM";

/// Which implementation of the operating-system calls a process uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// memfd, `/proc`, `process_vm_readv`, abstract unix sockets.
    #[cfg(target_os = "linux")]
    Linux,
    /// POSIX shared memory and the copy path.
    Portable,
}

/// A `BUSBW_PLATFORM` value this build cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlatformError {
    #[error("{PLATFORM_ENV}={0:?} names no platform (expected {expected})", expected = Platform::EXPECTED)]
    Unknown(String),
    #[error(
        "{PLATFORM_ENV}={0:?} is not available on this operating system (expected {expected})",
        expected = Platform::EXPECTED
    )]
    Unavailable(String),
}

impl Platform {
    /// The values [`PLATFORM_ENV`] accepts here, for messages.
    #[cfg(target_os = "linux")]
    pub const EXPECTED: &'static str = "linux or portable";
    #[cfg(not(target_os = "linux"))]
    pub const EXPECTED: &'static str = "portable";

    /// Every implementation this build has, native first: what tests run through.
    pub const ALL: &'static [Platform] = &[
        #[cfg(target_os = "linux")]
        Platform::Linux,
        Platform::Portable,
    ];

    /// The implementation made for this operating system.
    pub fn native() -> Platform {
        Platform::ALL[0]
    }

    /// [`PLATFORM_ENV`] as set in this process: the native implementation when unset or
    /// empty, an error naming the allowed values when misspelt.
    pub fn from_env() -> Result<Platform, PlatformError> {
        match std::env::var(PLATFORM_ENV) {
            Ok(v) if !v.trim().is_empty() => v.parse(),
            _ => Ok(Platform::native()),
        }
    }

    /// The implementation this process uses, read from the environment once. A misspelt
    /// value falls back to the native one here, because the launchers refuse it before any
    /// rank starts (`busbw_launchers::detect`) and a library has nobody to tell.
    pub fn active() -> Platform {
        static ACTIVE: OnceLock<Platform> = OnceLock::new();
        *ACTIVE.get_or_init(|| Platform::from_env().unwrap_or_else(|_| Platform::native()))
    }

    pub fn name(self) -> &'static str {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => "linux",
            Platform::Portable => "portable",
        }
    }

    /// A file of `len` bytes to share with one peer by passing its descriptor (SCM_RIGHTS):
    /// it has no name anyone could open, and where the system allows it cannot change size,
    /// so a peer cannot make our mapping fault. `label` shows in `/proc/<pid>/maps`.
    pub fn anonymous_memory(self, label: &str, len: usize) -> io::Result<OwnedFd> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::memfd(label, len, true),
            Platform::Portable => posix::anonymous(label, len),
        }
    }

    /// Checks a file received from a peer before mapping `len` bytes of it: as large as
    /// that, and (where the system can seal) unable to shrink under the mapping.
    pub fn check_received(self, fd: BorrowedFd<'_>, len: usize) -> Result<(), String> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::check_sealed(fd, len),
            Platform::Portable => posix::check_size(fd, len, false),
        }
    }

    /// Maps `len` bytes of `fd` shared, readable and writable, with the page tables filled
    /// now rather than by a fault per page inside a measurement. Undone by [`unmap`].
    pub fn map(self, fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::map_populated(fd, len),
            Platform::Portable => posix::map_touched(fd, len),
        }
    }

    /// Memory of `len` bytes that peers of this host can map from its [`PeerKey`] alone,
    /// already mapped here with every page present.
    pub fn shareable(self, len: usize) -> io::Result<Shareable> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::shareable(len),
            Platform::Portable => posix::shareable(len),
        }
    }

    /// Reads of other processes' memory, where this implementation has them; `None` means
    /// that bytes must be copied through shared memory instead.
    pub fn cross_memory(self) -> Option<CrossMemory> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => Some(CrossMemory(())),
            Platform::Portable => None,
        }
    }

    /// What changes when the machine reboots, so that two hosts of the same name (or a
    /// host before and after a reboot) are told apart; `None` where nothing says (ranks are
    /// then told apart by host name alone).
    pub fn boot_id(self) -> Option<String> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::boot_id(),
            Platform::Portable => posix::boot_id(),
        }
    }

    /// This process's resident memory in bytes. The portable figure is the peak
    /// (getrusage), which differences of phases still order but do not measure exactly.
    pub fn resident_bytes(self) -> Option<u64> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::resident_bytes(),
            Platform::Portable => posix::peak_resident_bytes(),
        }
    }

    /// The kernel's own host name, for when gethostname(2) fails.
    pub fn kernel_hostname(self) -> Option<String> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::kernel_hostname(),
            Platform::Portable => None,
        }
    }

    /// A non-blocking unix listener for the peers of this host, named after `name` (unique
    /// per process): an abstract socket on Linux, which vanishes with the process; a socket
    /// file in the temporary directory otherwise, removed when the listener drops.
    pub fn local_listener(self, name: &str) -> io::Result<LocalListener> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::abstract_listener(name),
            Platform::Portable => posix::file_listener(name),
        }
    }

    /// Fills `buf` with unpredictable bytes from the system.
    pub fn fill_random(self, buf: &mut [u8]) -> io::Result<()> {
        match self {
            #[cfg(target_os = "linux")]
            Platform::Linux => linux::fill_random(buf),
            Platform::Portable => posix::fill_random(buf),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Platform {
    type Err = PlatformError;

    fn from_str(s: &str) -> Result<Platform, PlatformError> {
        let s = s.trim();
        if let Some(p) = Platform::ALL
            .iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
        {
            return Ok(*p);
        }
        if s.eq_ignore_ascii_case("linux") {
            return Err(PlatformError::Unavailable(s.to_string()));
        }
        Err(PlatformError::Unknown(s.to_string()))
    }
}

/// Unmaps what [`Platform::map`] or a [`Shareable`] mapped.
///
/// # Safety
/// `ptr` and `len` are exactly a mapping made here, and nothing uses it any more.
pub unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
    libc::munmap(ptr.as_ptr().cast(), len);
}

/// Permission to read other processes' memory (Linux cross-memory attach). Only
/// [`Platform::cross_memory`] makes one, so holding one means the reads exist.
#[derive(Clone, Copy, Debug)]
pub struct CrossMemory(CrossInner);

#[cfg(target_os = "linux")]
type CrossInner = ();
/// No value: without cross-memory reads there is no `CrossMemory` either.
#[cfg(not(target_os = "linux"))]
#[derive(Clone, Copy, Debug)]
enum CrossInner {}

impl CrossMemory {
    /// Copies `len` bytes at `remote` in process `pid` to `dst`.
    ///
    /// # Safety
    /// `dst..dst+len` must be writable.
    #[inline]
    pub unsafe fn read(self, pid: i32, remote: u64, dst: *mut u8, len: usize) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            linux::cma_read(pid, remote, dst, len)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (pid, remote, dst, len);
            match self.0 {}
        }
    }

    /// One word of another process's memory, if this process may read it.
    pub fn read_u64(self, pid: i32, addr: u64) -> Option<u64> {
        let mut v = 0u64;
        // SAFETY: the destination is a local u64.
        unsafe { self.read(pid, addr, &mut v as *mut u64 as *mut u8, 8) }.ok()?;
        Some(v)
    }
}

/// Marks a [`PeerKey::id`] that numbers a named POSIX object rather than a descriptor.
const NAMED: u64 = 1 << 63;

/// How a peer of this host finds a [`Shareable`]: the owner's pid and either its descriptor
/// (opened through `/proc`) or the number in the object's name, then the identity and size
/// the peer checks the opened file against, so that a pid meaning another process here
/// (separate pid namespaces) or a stale name cannot map the wrong memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerKey {
    pub pid: u64,
    pub id: u64,
    pub ino: u64,
    pub dev: u64,
    pub len: u64,
}

impl PeerKey {
    /// Whether the key names a POSIX shared-memory object (the portable implementation's).
    pub fn is_named(self) -> bool {
        self.id & NAMED != 0
    }

    /// The words a key travels as.
    pub fn to_words(self) -> [u64; 5] {
        [self.pid, self.id, self.ino, self.dev, self.len]
    }

    pub fn from_words(w: [u64; 5]) -> PeerKey {
        PeerKey {
            pid: w[0],
            id: w[1],
            ino: w[2],
            dev: w[3],
            len: w[4],
        }
    }
}

/// This process's memory that peers may map: the mapping, the file behind it, and (for a
/// named object) the name, unlinked when this drops, so nothing outlives a clean exit.
pub struct Shareable {
    base: NonNull<u8>,
    len: usize,
    _fd: OwnedFd,
    key: PeerKey,
    name: Option<CString>,
}

// SAFETY: plain shared memory owned by this value, like a Vec<u8>.
unsafe impl Send for Shareable {}
unsafe impl Sync for Shareable {}

impl Shareable {
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn key(&self) -> PeerKey {
        self.key
    }
}

impl Drop for Shareable {
    fn drop(&mut self) {
        // SAFETY: mapped when this was made, with this length; unmapped only here.
        unsafe { unmap(self.base, self.len) };
        if let Some(name) = &self.name {
            posix::unlink(name);
        }
    }
}

/// A peer's [`Shareable`] mapped here, unmapped on drop.
pub struct PeerMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory owned by this value.
unsafe impl Send for PeerMapping {}

impl PeerMapping {
    /// The mapped address of byte `off`.
    pub fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.len);
        self.base.as_ptr().wrapping_add(off)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `map_peer` with this length; nothing borrows it past a call.
        unsafe { unmap(self.base, self.len) };
    }
}

/// Maps the whole of a peer's [`Shareable`], found the way its key says (whichever
/// implementation this process uses: the owner chose), after checking that the opened
/// file is the one the key describes.
// stat's field types differ by system (macOS's st_dev is signed).
#[allow(clippy::unnecessary_cast)]
pub fn map_peer(key: &PeerKey) -> io::Result<PeerMapping> {
    let len = usize::try_from(key.len).map_err(|_| invalid("buffer too large"))?;
    let (fd, platform) = if key.is_named() {
        (posix::open_named(key)?, Platform::Portable)
    } else {
        #[cfg(target_os = "linux")]
        {
            (linux::open_peer_fd(key)?, Platform::Linux)
        }
        #[cfg(not(target_os = "linux"))]
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the peer's buffer is a Linux descriptor (set BUSBW_PLATFORM=portable on every rank)",
        ));
    };
    let st = fstat(fd.as_raw_fd())?;
    // A named object's size may be rounded up to a page where the system does (macOS).
    let size_ok = if key.is_named() {
        st.st_size as u64 >= key.len
    } else {
        st.st_size as u64 == key.len
    };
    if st.st_ino as u64 != key.ino || st.st_dev as u64 != key.dev || !size_ok {
        return Err(invalid(
            "the peer's descriptor is not the buffer it described (another pid namespace?)",
        ));
    }
    // Page tables filled now, not by a fault per page on the first pass of a measurement
    // over the peer's buffer (measured: 1 MiB out of place on 2 ranks took about twice as
    // long with the tables filled per call instead). The resident set size then counts the
    // peers' buffers too, as it counts any shared memory in every process that maps it.
    let base = platform.map(fd.as_fd(), len)?;
    Ok(PeerMapping { base, len })
}

/// A unix listener for local peers and the address they connect to (`@name` for an abstract
/// socket, a path otherwise), as handles carry it.
pub struct LocalListener {
    listener: UnixListener,
    addr: String,
    /// The socket file to remove on drop, where there is one.
    path: Option<PathBuf>,
}

impl LocalListener {
    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for LocalListener {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A non-blocking, close-on-exec connect to a [`LocalListener`]'s address: `Ok(None)` while
/// the listener's backlog is full or the socket is not there (yet). The address says which
/// kind it is, so a connector needs no platform of its own.
pub fn connect_local(addr: &str) -> io::Result<Option<OwnedFd>> {
    let (abstract_name, bytes) = match addr.strip_prefix('@') {
        Some(name) => (true, name.as_bytes()),
        None => (false, addr.as_bytes()),
    };
    if abstract_name && cfg!(not(target_os = "linux")) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "abstract unix sockets exist on Linux only (set BUSBW_PLATFORM=portable on every rank)",
        ));
    }
    let fd = posix::unix_socket()?;
    // SAFETY: sockaddr_un is plain data; zeroed is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // An abstract name starts with a NUL and has no terminator; a path has one.
    let start = usize::from(abstract_name);
    if start + bytes.len() + 1 > sa.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket name too long",
        ));
    }
    for (i, b) in bytes.iter().enumerate() {
        sa.sun_path[start + i] = *b as libc::c_char;
    }
    let path_offset = std::mem::offset_of!(libc::sockaddr_un, sun_path);
    let len = path_offset + start + bytes.len() + usize::from(!abstract_name);
    loop {
        // SAFETY: sa is a valid sockaddr_un of at least `len` bytes.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                &sa as *const libc::sockaddr_un as *const libc::sockaddr,
                len as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(Some(fd));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) | Some(libc::ECONNREFUSED) | Some(libc::ENOENT) => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// Makes a descriptor received over a unix socket close-on-exec where [`RECV_FD_FLAGS`]
/// could not, so no child inherits a peer's segment.
pub fn received_descriptor(fd: &OwnedFd) -> io::Result<()> {
    if RECV_FD_FLAGS == 0 {
        posix::received_cloexec(fd)?;
    }
    Ok(())
}

/// Flags for sends on local sockets: no SIGPIPE from a peer that went away, where the system
/// has the flag (macOS sets `SO_NOSIGPIPE` on the socket instead, in `unix_socket`).
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub const SEND_FLAGS: libc::c_int = libc::MSG_NOSIGNAL;
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub const SEND_FLAGS: libc::c_int = 0;

/// Poll events that mean the peer of a stream socket hung up (`POLLRDHUP` sees a peer's
/// shutdown even while its last bytes are unread, where it exists).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub const HANGUP_EVENTS: libc::c_short = libc::POLLRDHUP;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub const HANGUP_EVENTS: libc::c_short = libc::POLLHUP;

/// recvmsg flags that make received descriptors close-on-exec at once, where the system can.
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub const RECV_FD_FLAGS: libc::c_int = libc::MSG_CMSG_CLOEXEC;
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub const RECV_FD_FLAGS: libc::c_int = 0;

/// Runs the congestion control `name` on a TCP socket, where the system lets a socket choose
/// (Linux); `false` where it did not.
pub fn set_tcp_congestion(fd: RawFd, name: &str) -> bool {
    #[cfg(target_os = "linux")]
    {
        linux::set_tcp_congestion(fd, name)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (fd, name);
        false
    }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor and a stat to fill.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests;
