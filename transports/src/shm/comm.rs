//! The data path of one connection: the sending side writes headers and payloads into the
//! ring (or only an address, for a single-copy message), the receiving side reads them out.

use super::*;

pub(super) struct SendReq {
    /// The header, followed for a single-copy message by the payload's address.
    pub(super) header: [u8; HEADER_LEN + CMA_DESC],
    pub(super) ptr: *const u8,
    pub(super) len: usize,
    /// Bytes of header and payload copied into the ring.
    pub(super) sent: usize,
    /// Single copy: the acknowledgement count that completes this send.
    pub(super) cma: Option<u64>,
}

// SAFETY: the pointer is only dereferenced by the comm's owner while the request is in flight;
// `isend`'s contract keeps the memory valid until then.
unsafe impl Send for SendReq {}

pub(super) struct ShmSendComm {
    pub(super) slots: Slots<SendReq>,
    pub(super) seg: Segment,
    pub(super) sock: OwnedFd,
    pub(super) peer: u32,
    /// Our copy of the producer counter (the shared one is only ever written by us).
    pub(super) tail: u64,
    /// Last consumer counter read from the segment.
    pub(super) head_cache: u64,
    pub(super) stalls: u32,
    /// The peer closed the socket (seen while draining doorbells).
    pub(super) hangup: bool,
    /// Single-copy messages posted so far (the acknowledgement count each one waits for).
    pub(super) cma_posted: u64,
    /// Last acknowledgement count read from the segment.
    pub(super) cma_acked: u64,
}

impl ShmSendComm {
    pub(super) fn progress(&mut self) -> Result<()> {
        if !self.slots.has_pending() {
            return Ok(());
        }
        let peer = self.peer;
        let size = self.seg.size as u64;
        if self.seg.ctl().receiver_closed.load(Ordering::Acquire) != 0 {
            return Err(TransportError::PeerClosed { peer });
        }
        while let Some(req) = self.slots.front() {
            let (hlen, total) = match req.cma {
                Some(_) => (HEADER_LEN + CMA_DESC, HEADER_LEN + CMA_DESC),
                None => (HEADER_LEN, HEADER_LEN + req.len),
            };
            while req.sent < total {
                let mut free = size - (self.tail - self.head_cache);
                if free == 0 {
                    self.head_cache = self.seg.ctl().head.load(Ordering::Acquire);
                    free = size - (self.tail - self.head_cache);
                    if free == 0 {
                        self.stalls = self.stalls.wrapping_add(1);
                        if self.hangup
                            || (self.stalls.is_multiple_of(LIVENESS_EVERY)
                                && hung_up(self.sock.as_raw_fd()))
                        {
                            return Err(TransportError::PeerClosed { peer });
                        }
                        return Ok(());
                    }
                }
                let n = if req.sent < hlen {
                    let n = (hlen - req.sent).min(free as usize);
                    // SAFETY: the ring has `free` bytes owned by the producer at `tail`.
                    unsafe {
                        self.seg
                            .write(self.tail, req.header[req.sent..].as_ptr(), n)
                    };
                    n
                } else {
                    let off = req.sent - HEADER_LEN;
                    let n = (req.len - off).min(free as usize).min(CHUNK);
                    // SAFETY: off + n <= len, inside the caller's buffer (isend's contract);
                    // the ring range is free as above.
                    unsafe { self.seg.write(self.tail, req.ptr.add(off), n) };
                    n
                };
                self.tail += n as u64;
                req.sent += n;
                let ctl = self.seg.ctl();
                ctl.tail.store(self.tail, Ordering::Release);
                wake_if_sleeping(&ctl.recv_sleeping, self.sock.as_raw_fd());
            }
            if let Some(seq) = req.cma {
                // The receiver reads the payload from our memory: the send is done when it
                // says so.
                if self.cma_acked < seq {
                    self.cma_acked = self.seg.ctl().cma_acked.load(Ordering::Acquire);
                    if self.cma_acked < seq {
                        self.stalls = self.stalls.wrapping_add(1);
                        if self.hangup
                            || (self.stalls.is_multiple_of(LIVENESS_EVERY)
                                && hung_up(self.sock.as_raw_fd()))
                        {
                            return Err(TransportError::PeerClosed { peer });
                        }
                        return Ok(());
                    }
                }
            }
            let len = req.len;
            self.slots.complete_front(len);
        }
        Ok(())
    }

    /// Whether the front request waits for the receiver's acknowledgement (its descriptor is
    /// in the ring).
    pub(super) fn awaiting_ack(&mut self) -> Option<u64> {
        let req = self.slots.front()?;
        let seq = req.cma?;
        (req.sent == HEADER_LEN + CMA_DESC).then_some(seq)
    }
}

impl SendComm for ShmSendComm {
    unsafe fn isend(
        &mut self,
        registration: &Registration,
        ptr: *const u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        let cma = len >= CMA_MIN
            && registration.region.kind() == crate::MemoryKind::Host
            && self.seg.ctl().cma_ok.load(Ordering::Acquire) != 0;
        let mut header = [0u8; HEADER_LEN + CMA_DESC];
        header[..HEADER_LEN].copy_from_slice(&frame::encode(
            if cma { MSG_MAGIC_CMA } else { MSG_MAGIC },
            tag,
            len,
        ));
        header[HEADER_LEN..].copy_from_slice(&(ptr as u64).to_le_bytes());
        let seq = cma.then(|| self.cma_posted + 1);
        let id = self.slots.post(SendReq {
            header,
            ptr,
            len,
            sent: 0,
            cma: seq,
        })?;
        if cma {
            self.cma_posted += 1;
        }
        self.progress()?;
        Ok(id)
    }

    fn test(&mut self, request: RequestId) -> Result<Option<usize>> {
        self.progress()?;
        self.slots.take(request)
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn sleep_on(&mut self) -> Sleep {
        let waiting_ack = self.awaiting_ack().is_some();
        let ctl = self.seg.ctl();
        let armed = if waiting_ack {
            arm(&ctl.send_sleeping, &ctl.cma_acked, self.cma_acked)
        } else {
            arm(&ctl.send_sleeping, &ctl.head, self.head_cache)
        };
        if !self.slots.has_pending() || ctl.receiver_closed.load(Ordering::Acquire) != 0 || !armed {
            return Sleep::Ready;
        }
        Sleep::Readable(self.sock.as_raw_fd())
    }

    fn woke(&mut self) {
        self.seg.ctl().send_sleeping.store(0, Ordering::Relaxed);
        self.hangup |= !drain_doorbells(self.sock.as_raw_fd());
    }
}

impl Drop for ShmSendComm {
    fn drop(&mut self) {
        // Release: everything written before is visible to a receiver that sees the flag.
        self.seg.ctl().sender_closed.store(1, Ordering::Release);
    }
}

/// The receiving end of a connection: the consumer side of the segment's ring.
pub(super) struct ShmInbound {
    pub(super) seg: Segment,
    pub(super) sock: OwnedFd,
    pub(super) peer: u32,
    /// Our copy of the consumer counter (the shared one is only ever written by us).
    pub(super) head: u64,
    /// Last producer counter read from the segment.
    pub(super) tail_cache: u64,
    /// Last consumer counter stored into the segment.
    pub(super) head_published: u64,
    /// Length of the message whose payload is being read, once its header is in.
    pub(super) incoming: Option<usize>,
    pub(super) got: usize,
    pub(super) stalls: u32,
    /// The peer closed the socket (seen while draining doorbells).
    pub(super) hangup: bool,
    /// The sender's process, for single-copy reads.
    pub(super) peer_pid: i32,
    /// How single-copy messages are read; `None` where the platform has no cross-memory
    /// reads, and then the acceptor never offered them.
    pub(super) cross: Option<CrossMemory>,
    /// Where the payload of the message being received lives in the sender's memory.
    pub(super) remote: Option<u64>,
    /// Single-copy messages read so far (published as `cma_acked`).
    pub(super) cma_done: u64,
}

impl ShmInbound {
    /// Refreshes the producer counter; true when at least `need` bytes are readable.
    pub(super) fn available(&mut self, need: u64) -> bool {
        if self.tail_cache - self.head >= need {
            return true;
        }
        self.tail_cache = self.seg.ctl().tail.load(Ordering::Acquire);
        self.tail_cache - self.head >= need
    }

    /// Hands consumed ring space back to the sender (Release: our reads of it are done).
    pub(super) fn publish(&mut self) {
        if self.head != self.head_published {
            let ctl = self.seg.ctl();
            ctl.head.store(self.head, Ordering::Release);
            self.head_published = self.head;
            wake_if_sleeping(&ctl.send_sleeping, self.sock.as_raw_fd());
        }
    }

    /// Nothing to read: publish what was consumed and find out whether more can come.
    pub(super) fn stalled(&mut self) -> Result<()> {
        self.publish();
        let ctl = self.seg.ctl();
        self.stalls = self.stalls.wrapping_add(1);
        let gone = ctl.sender_closed.load(Ordering::Acquire) != 0
            || self.hangup
            || (self.stalls.is_multiple_of(LIVENESS_EVERY) && hung_up(self.sock.as_raw_fd()));
        if gone {
            // The sender's last writes happen before its flag (or its exit): if the counter
            // did not move since we looked, nothing more is coming.
            let tail = ctl.tail.load(Ordering::Acquire);
            if tail == self.tail_cache {
                return Err(TransportError::PeerClosed { peer: self.peer });
            }
        }
        Ok(())
    }
}

impl Inbound for ShmInbound {
    fn progress(&mut self, queue: &mut Posted) -> Result<()> {
        while queue.has_pending() {
            if self.incoming.is_none() {
                if !self.available(HEADER_LEN as u64) {
                    return self.stalled();
                }
                let mut h = [0u8; HEADER_LEN + CMA_DESC];
                // SAFETY: HEADER_LEN published bytes at head.
                unsafe { self.seg.read(self.head, h.as_mut_ptr(), HEADER_LEN) };
                let cma = h[..4] == MSG_MAGIC_CMA.to_le_bytes();
                if cma {
                    if !self.available((HEADER_LEN + CMA_DESC) as u64) {
                        return self.stalled();
                    }
                    // SAFETY: the descriptor's bytes are published too (checked above).
                    unsafe {
                        self.seg.read(
                            self.head + HEADER_LEN as u64,
                            h[HEADER_LEN..].as_mut_ptr(),
                            CMA_DESC,
                        )
                    };
                }
                let peer = self.peer;
                let req = queue
                    .front()
                    .ok_or(TransportError::UnknownRequest(u32::MAX))?;
                let hdr: &[u8; HEADER_LEN] = h[..HEADER_LEN].try_into().unwrap_or(&[0; HEADER_LEN]);
                let magic = if cma { MSG_MAGIC_CMA } else { MSG_MAGIC };
                let len = frame::check(hdr, magic, "shared-memory", peer, req.tag, req.len)?;
                self.head += if cma {
                    HEADER_LEN + CMA_DESC
                } else {
                    HEADER_LEN
                } as u64;
                self.remote = cma.then(|| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(&h[HEADER_LEN..]);
                    u64::from_le_bytes(a)
                });
                self.incoming = Some(len as usize);
                self.got = 0;
            }
            let want = self.incoming.unwrap_or(0);
            let Some(req) = queue.front() else {
                return Ok(());
            };
            let ptr = req.ptr;
            if let Some(remote) = self.remote {
                let cross = self.cross.ok_or_else(|| {
                    TransportError::Handshake(format!(
                        "rank {} sent a single-copy message, which was never offered",
                        self.peer
                    ))
                })?;
                // SAFETY: ptr..ptr+want is inside the caller's buffer (irecv's contract).
                unsafe { cross.read(self.peer_pid, remote, ptr, want) }.map_err(|e| {
                    TransportError::Handshake(format!(
                        "single-copy read of {want} bytes from rank {} (pid {}) failed: {e}",
                        self.peer, self.peer_pid
                    ))
                })?;
                self.got = want;
                self.remote = None;
                self.cma_done += 1;
                let ctl = self.seg.ctl();
                ctl.cma_acked.store(self.cma_done, Ordering::Release);
                wake_if_sleeping(&ctl.send_sleeping, self.sock.as_raw_fd());
            }
            while self.got < want {
                if !self.available(1) {
                    return self.stalled();
                }
                let avail = (self.tail_cache - self.head) as usize;
                let n = avail.min(want - self.got).min(CHUNK);
                // SAFETY: n published bytes at head; got + n <= want <= posted len, inside
                // the caller's buffer (irecv's contract).
                unsafe { self.seg.read(self.head, ptr.add(self.got), n) };
                self.head += n as u64;
                self.got += n;
                self.publish();
            }
            queue.complete_front(want);
            self.incoming = None;
        }
        // A header-only message moved head without a store above.
        self.publish();
        Ok(())
    }

    fn sleep_on(&mut self, queue: &Posted) -> Sleep {
        // Consumed space must be visible before we sleep, or a sender waiting for it would
        // sleep too.
        self.publish();
        let ctl = self.seg.ctl();
        if !queue.has_pending()
            || ctl.sender_closed.load(Ordering::Acquire) != 0
            || !arm(&ctl.recv_sleeping, &ctl.tail, self.tail_cache)
        {
            return Sleep::Ready;
        }
        Sleep::Readable(self.sock.as_raw_fd())
    }

    fn woke(&mut self) {
        self.seg.ctl().recv_sleeping.store(0, Ordering::Relaxed);
        self.hangup |= !drain_doorbells(self.sock.as_raw_fd());
    }
}

impl Drop for ShmInbound {
    fn drop(&mut self) {
        self.seg.ctl().receiver_closed.store(1, Ordering::Release);
    }
}
