//! The shared segment of one connection: its control page (counters, flags), the memfd
//! that holds it, the doorbell handshake on the unix socket, and cross-memory reads.

use super::*;

/// Whether the peer behind `sock` has gone away (closed its end, or died). Doorbell bytes
/// make the socket readable too, so only the hang-up events count.
pub(super) fn hung_up(sock: RawFd) -> bool {
    match poll_fd(sock, libc::POLLRDHUP, Duration::ZERO) {
        Ok(r) => r & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0,
        Err(_) => true,
    }
}

/// Copies `len` bytes at `remote` in process `pid` to `dst` with one `process_vm_readv` per
/// piece the kernel returns.
///
/// # Safety
/// `dst..dst+len` must be writable.
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

/// One word of another process's memory, if this process may read it.
pub(super) fn cma_read_u64(pid: i32, addr: u64) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: the destination is a local u64.
    unsafe { cma_read(pid, addr, &mut v as *mut u64 as *mut u8, 8) }.ok()?;
    Some(v)
}

/// Wakes the peer sleeping behind `sock`. A full socket buffer already holds doorbells and a
/// dead peer is noticed by the liveness checks, so errors are ignored.
pub(super) fn ring_doorbell(sock: RawFd) {
    let b = 1u8;
    // SAFETY: one byte from a live local to a socket we own.
    unsafe {
        libc::send(
            sock,
            &b as *const u8 as *const libc::c_void,
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

/// Swallows doorbell bytes after a sleep. Returns false once the peer has closed its end.
pub(super) fn drain_doorbells(sock: RawFd) -> bool {
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reads into a live local buffer of the given length.
        let n = unsafe {
            libc::recv(
                sock,
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => return false,
            n if n > 0 => continue,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return true;
            }
        }
    }
}

/// Publisher's half of the sleep handshake: after storing a counter, wake the other side if
/// it said it sleeps.
#[inline]
pub(super) fn wake_if_sleeping(flag: &AtomicU32, sock: RawFd) {
    fence(Ordering::SeqCst);
    if flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0 {
        ring_doorbell(sock);
    }
}

/// Sleeper's half: raise `flag`, then look at the peer's counter once more. Returns whether
/// it is still `seen` (sleeping is safe); if not, the flag is taken down again.
#[inline]
pub(super) fn arm(flag: &AtomicU32, counter: &AtomicU64, seen: u64) -> bool {
    flag.store(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    if counter.load(Ordering::Acquire) != seen {
        flag.store(0, Ordering::Relaxed);
        return false;
    }
    true
}

/// The segment's first page. Counters sit 128 bytes apart (two lines: the adjacent-line
/// prefetcher pairs lines) so that producer and consumer never write the same line.
#[repr(C)]
pub(super) struct Control {
    pub(super) magic: u64,
    pub(super) ring_bytes: u64,
    pub(super) sender_closed: AtomicU32,
    pub(super) receiver_closed: AtomicU32,
    pub(super) _pad0: [u8; 128 - 24],
    /// Bytes ever written by the sender.
    pub(super) tail: AtomicU64,
    pub(super) _pad1: [u8; 120],
    /// Bytes ever consumed by the receiver.
    pub(super) head: AtomicU64,
    pub(super) _pad2: [u8; 120],
    /// Raised by the receiver before it sleeps waiting for data; cleared by the sender when
    /// it rings the doorbell. Its own line: the sender reads it after every publish, and a
    /// line nobody writes stays cached on both sides.
    pub(super) recv_sleeping: AtomicU32,
    pub(super) _pad3: [u8; 124],
    /// Raised by the sender before it sleeps waiting for ring space or an acknowledgement.
    pub(super) send_sleeping: AtomicU32,
    pub(super) _pad4: [u8; 124],
    /// Set by the acceptor once it has proven it can read the connector's memory.
    pub(super) cma_ok: AtomicU32,
    pub(super) _pad5: [u8; 124],
    /// Single-copy messages the receiver has finished reading.
    pub(super) cma_acked: AtomicU64,
    pub(super) _pad6: [u8; 120],
}

const _: () = assert!(std::mem::size_of::<Control>() <= CONTROL_BYTES);

/// One mapping of a connection's segment.
pub(super) struct Segment {
    pub(super) base: *mut u8,
    pub(super) map_len: usize,
    pub(super) size: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; all cross-side access goes
// through the atomics in `Control` and the SPSC protocol.
unsafe impl Send for Segment {}

impl Segment {
    pub(super) fn map(fd: &OwnedFd, ring_bytes: usize) -> io::Result<Segment> {
        let map_len = CONTROL_BYTES + ring_bytes;
        // SAFETY: a fresh shared mapping of a descriptor we hold; checked for failure.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Segment {
            base: base as *mut u8,
            map_len,
            size: ring_bytes,
        })
    }

    pub(super) fn ctl(&self) -> &Control {
        // SAFETY: the mapping starts with a page-aligned Control and lives as long as self.
        unsafe { &*(self.base as *const Control) }
    }

    pub(super) fn ring(&self) -> *mut u8 {
        // SAFETY: the ring follows the control page inside the mapping.
        unsafe { self.base.add(CONTROL_BYTES) }
    }

    /// Copies `n <= size` bytes into the ring at stream position `pos`, wrapping around.
    ///
    /// # Safety
    /// `src..src+n` must be readable and the ring range must be owned by the producer.
    pub(super) unsafe fn write(&self, pos: u64, src: *const u8, n: usize) {
        let off = (pos as usize) & (self.size - 1);
        let first = n.min(self.size - off);
        std::ptr::copy_nonoverlapping(src, self.ring().add(off), first);
        if first < n {
            std::ptr::copy_nonoverlapping(src.add(first), self.ring(), n - first);
        }
    }

    /// Copies `n <= size` bytes out of the ring at stream position `pos`, wrapping around.
    ///
    /// # Safety
    /// `dst..dst+n` must be writable and the ring range must hold published data.
    pub(super) unsafe fn read(&self, pos: u64, dst: *mut u8, n: usize) {
        let off = (pos as usize) & (self.size - 1);
        let first = n.min(self.size - off);
        std::ptr::copy_nonoverlapping(self.ring().add(off), dst, first);
        if first < n {
            std::ptr::copy_nonoverlapping(self.ring(), dst.add(first), n - first);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: base/map_len describe the mapping made in `map`, unmapped only here.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}

/// Creates a sealed memfd of the right size with an initialised control page.
pub(super) fn create_segment(ring_bytes: usize) -> io::Result<(OwnedFd, Segment)> {
    // SAFETY: the name is a NUL-terminated literal; the result is checked.
    let raw = unsafe {
        libc::memfd_create(
            c"busbw-shm".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = (CONTROL_BYTES + ring_bytes) as libc::off_t;
    // SAFETY: plain syscalls on a descriptor we own.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), len) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Fixed size from now on: neither side can be hit by SIGBUS from a shrunk segment.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let seg = Segment::map(&fd, ring_bytes)?;
    // SAFETY: nobody else sees the segment yet; the atomics are already zero (fresh memfd).
    unsafe {
        let ctl = seg.base as *mut Control;
        (*ctl).magic = SEGMENT_MAGIC;
        (*ctl).ring_bytes = ring_bytes as u64;
    }
    Ok((fd, seg))
}
