//! The shared segment of one connection: its control page (counters, flags), the file that
//! holds it (made and mapped by the [`Platform`]), and the doorbell handshake on the unix
//! socket.

use super::*;

/// Whether the peer behind `sock` has gone away (closed its end, or died). Doorbell bytes
/// make the socket readable too, so only the hang-up events count.
pub(super) fn hung_up(sock: RawFd) -> bool {
    let hangup = platform::HANGUP_EVENTS;
    match poll_fd(sock, hangup, Duration::ZERO) {
        Ok(r) => r & (hangup | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0,
        Err(_) => true,
    }
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
            libc::MSG_DONTWAIT | platform::SEND_FLAGS,
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
    pub(super) fn map(platform: Platform, fd: &OwnedFd, ring_bytes: usize) -> io::Result<Segment> {
        let map_len = CONTROL_BYTES + ring_bytes;
        let base = platform.map(fd.as_fd(), map_len)?;
        Ok(Segment {
            base: base.as_ptr(),
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
        if let Some(base) = std::ptr::NonNull::new(self.base) {
            // SAFETY: base/map_len describe the mapping made in `map`, unmapped only here.
            unsafe { platform::unmap(base, self.map_len) };
        }
    }
}

/// Creates the segment's file (sealed where the platform can) with an initialised control
/// page; its name in `/proc/<pid>/maps` is `busbw-shm`.
pub(super) fn create_segment(
    platform: Platform,
    ring_bytes: usize,
) -> io::Result<(OwnedFd, Segment)> {
    let fd = platform.anonymous_memory("busbw-shm", CONTROL_BYTES + ring_bytes)?;
    let seg = Segment::map(platform, &fd, ring_bytes)?;
    // SAFETY: nobody else sees the segment yet; the atomics are already zero (a new file).
    unsafe {
        let ctl = seg.base as *mut Control;
        (*ctl).magic = SEGMENT_MAGIC;
        (*ctl).ring_bytes = ring_bytes as u64;
    }
    Ok((fd, seg))
}
