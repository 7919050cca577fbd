//! The data path of one TCP connection: sends write headers and payloads (or hand long
//! payloads to the helper lanes), receives read them through the framed receiver.

use super::*;

/// Maps a socket error to the error a user should see: a reset or broken pipe means the peer
/// went away, which is what to report, not an errno.
pub(super) fn peer_error(peer: u32, e: io::Error) -> TransportError {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => TransportError::PeerClosed { peer },
        _ => TransportError::PeerIo { peer, error: e },
    }
}

pub(super) struct SendReq {
    pub(super) header: [u8; HEADER_LEN],
    pub(super) ptr: *const u8,
    /// Bytes that follow the header on the control socket (0 when the lanes carry them).
    pub(super) len: usize,
    /// Full message length, reported on completion.
    pub(super) bytes: usize,
    pub(super) sent: usize,
    /// The lanes' number for this message when they carry its payload.
    pub(super) split: Option<u64>,
}

// SAFETY: the pointer is only dereferenced by the comm's owner thread while the request is in
// flight; `isend`'s contract keeps the memory valid until then.
unsafe impl Send for SendReq {}

pub(super) struct TcpSendComm {
    pub(super) slots: Slots<SendReq>,
    pub(super) stream: TcpStream,
    pub(super) peer: u32,
    pub(super) lanes: Option<Lanes>,
}

impl TcpSendComm {
    pub(super) fn new(
        stream: TcpStream,
        peer: u32,
        lanes: Option<Lanes>,
        max_requests: usize,
    ) -> Self {
        TcpSendComm {
            slots: Slots::new(max_requests, peer),
            stream,
            peer,
            lanes,
        }
    }

    pub(super) fn progress(&mut self) -> Result<()> {
        let fd = self.stream.as_raw_fd();
        while let Some(req) = self.slots.front() {
            let total = HEADER_LEN + req.len;
            while req.sent < total {
                let mut iov = [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2];
                let mut n_iov;
                if req.sent < HEADER_LEN {
                    iov[0] = libc::iovec {
                        iov_base: req.header[req.sent..].as_ptr() as *mut libc::c_void,
                        iov_len: HEADER_LEN - req.sent,
                    };
                    n_iov = 1;
                    if req.len > 0 {
                        iov[1] = libc::iovec {
                            iov_base: req.ptr as *mut libc::c_void,
                            iov_len: req.len,
                        };
                        n_iov = 2;
                    }
                } else {
                    let off = req.sent - HEADER_LEN;
                    iov[0] = libc::iovec {
                        // SAFETY: off < len, inside the caller's buffer.
                        iov_base: unsafe { req.ptr.add(off) } as *mut libc::c_void,
                        iov_len: req.len - off,
                    };
                    n_iov = 1;
                }
                // SAFETY: msghdr points at iovecs that describe valid memory (the header in
                // this request and the caller's buffer, kept alive by isend's contract).
                let n = unsafe {
                    let mut msg: libc::msghdr = std::mem::zeroed();
                    msg.msg_iov = iov.as_mut_ptr();
                    msg.msg_iovlen = n_iov;
                    libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
                };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(()),
                        io::ErrorKind::Interrupted => continue,
                        _ => return Err(peer_error(self.peer, e)),
                    }
                }
                req.sent += n as usize;
            }
            if let (Some(seq), Some(lanes)) = (req.split, &self.lanes) {
                if !lanes.is_done(seq)? {
                    return Ok(());
                }
            }
            let bytes = req.bytes;
            self.slots.complete_front(bytes);
        }
        Ok(())
    }
}

impl SendComm for TcpSendComm {
    unsafe fn isend(
        &mut self,
        registration: &Registration,
        ptr: *const u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        let header = frame::encode(MSG_MAGIC, tag, len);
        let split = match &mut self.lanes {
            // The lanes only read through the pointer (Direction::Send).
            Some(lanes) if len >= SPLIT_MIN => Some(lanes.post(ptr as *mut u8, len)?),
            _ => None,
        };
        let id = self.slots.post(SendReq {
            header,
            ptr,
            len: if split.is_some() { 0 } else { len },
            bytes: len,
            sent: 0,
            split,
        })?;
        // Start writing right away: small messages usually complete here.
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

    fn readiness_fd(&self) -> Option<i32> {
        Some(self.stream.as_raw_fd())
    }

    fn sleep_on(&mut self) -> crate::Sleep {
        match self.slots.front() {
            // Header out, payload with the helpers: the control socket says nothing useful.
            Some(r) if r.split.is_some() && r.sent >= HEADER_LEN => crate::Sleep::Nap,
            _ => crate::Sleep::Writable(self.stream.as_raw_fd()),
        }
    }
}

/// Receive buffer per connection. Small messages arrive whole with their header in one
/// recv(2) (the sender already writes header and payload with one sendmsg), so a short
/// message costs one system call on each side instead of two on the receiver's.
pub(super) const RX_BYTES: usize = 64 << 10;
/// Receives posted for at most this many bytes read ahead into the buffer; larger ones read
/// just the header there and the payload straight into the caller's memory, so bulk data is
/// copied once.
pub(super) const INLINE_MAX: usize = 16 << 10;

/// The receiving end of a connection: the control socket, its read-ahead buffer, and the
/// lanes when long messages are split over helper sockets.
pub(super) struct TcpInbound {
    pub(super) stream: TcpStream,
    pub(super) peer: u32,
    /// Bytes read from the socket but not consumed yet: `rx[rx_pos..rx_end]`.
    pub(super) rx: Box<[u8]>,
    pub(super) rx_pos: usize,
    pub(super) rx_end: usize,
    /// Length of the message whose payload is being read, once its header is in.
    pub(super) incoming: Option<usize>,
    pub(super) got: usize,
    pub(super) lanes: Option<Lanes>,
    /// The lanes' number for the incoming message when they carry its payload.
    pub(super) split: Option<u64>,
    /// The sending half over the same socket, for the acceptor of a two-way connection
    /// (until the communicator takes it).
    pub(super) reverse: Option<TcpSendComm>,
}

impl TcpInbound {
    pub(super) fn new(
        stream: TcpStream,
        peer: u32,
        lanes: Option<Lanes>,
        reverse: Option<TcpSendComm>,
    ) -> Self {
        TcpInbound {
            stream,
            peer,
            lanes,
            split: None,
            rx: vec![0; RX_BYTES].into_boxed_slice(),
            rx_pos: 0,
            rx_end: 0,
            incoming: None,
            got: 0,
            reverse,
        }
    }

    pub(super) fn read_some(&mut self, buf: *mut u8, len: usize) -> Result<Option<usize>> {
        loop {
            // SAFETY: buf..buf+len is writable memory (our header or the caller's buffer).
            let n = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    buf as *mut libc::c_void,
                    len,
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(peer_error(self.peer, e)),
                }
            }
            if n == 0 {
                return Err(TransportError::PeerClosed { peer: self.peer });
            }
            return Ok(Some(n as usize));
        }
    }

    /// Reads more into the receive buffer (after moving what is left to its start), at most
    /// `limit` bytes. False when the socket had nothing.
    pub(super) fn fill(&mut self, limit: usize) -> Result<bool> {
        if self.rx_pos == self.rx_end {
            self.rx_pos = 0;
            self.rx_end = 0;
        } else if self.rx_pos > 0 {
            self.rx.copy_within(self.rx_pos..self.rx_end, 0);
            self.rx_end -= self.rx_pos;
            self.rx_pos = 0;
        }
        let room = (self.rx.len() - self.rx_end).min(limit);
        let dst = self.rx[self.rx_end..].as_mut_ptr();
        match self.read_some(dst, room)? {
            Some(n) => {
                self.rx_end += n;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

impl Inbound for TcpInbound {
    fn progress(&mut self, queue: &mut Posted) -> Result<()> {
        while let Some(req) = queue.front() {
            let (ptr, posted, tag) = (req.ptr, req.len, req.tag);
            if self.incoming.is_none() {
                while self.rx_end - self.rx_pos < HEADER_LEN {
                    // A short message usually comes whole, often with the next ones: read
                    // ahead. Before a long one, take only its header into the buffer.
                    let limit = if posted <= INLINE_MAX {
                        usize::MAX
                    } else {
                        HEADER_LEN - (self.rx_end - self.rx_pos)
                    };
                    if !self.fill(limit)? {
                        return Ok(());
                    }
                }
                let mut h = [0u8; HEADER_LEN];
                h.copy_from_slice(&self.rx[self.rx_pos..self.rx_pos + HEADER_LEN]);
                self.rx_pos += HEADER_LEN;
                let len = frame::check(&h, MSG_MAGIC, "tcp", self.peer, tag, posted)?;
                self.incoming = Some(len);
                self.got = 0;
                if let Some(lanes) = &mut self.lanes {
                    if len >= SPLIT_MIN {
                        self.split = Some(lanes.post(ptr, len)?);
                    }
                }
            }
            let want = self.incoming.unwrap_or(0);
            if let (Some(seq), Some(lanes)) = (self.split, &self.lanes) {
                if !lanes.is_done(seq)? {
                    return Ok(());
                }
                self.split = None;
                self.got = want;
            }
            while self.got < want {
                let buffered = self.rx_end - self.rx_pos;
                if buffered > 0 {
                    let k = buffered.min(want - self.got);
                    // SAFETY: got + k <= want <= posted len, inside the caller's buffer
                    // (irecv's contract); the source is initialised buffer bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.rx[self.rx_pos..].as_ptr(),
                            ptr.add(self.got),
                            k,
                        )
                    };
                    self.rx_pos += k;
                    self.got += k;
                    continue;
                }
                let left = want - self.got;
                if left <= INLINE_MAX {
                    if !self.fill(usize::MAX)? {
                        return Ok(());
                    }
                    continue;
                }
                // SAFETY: got < want <= posted len, inside the caller's buffer.
                let dst = unsafe { ptr.add(self.got) };
                match self.read_some(dst, left)? {
                    Some(n) => self.got += n,
                    None => return Ok(()),
                }
            }
            queue.complete_front(want);
            self.incoming = None;
        }
        Ok(())
    }

    fn readiness_fd(&self) -> Option<i32> {
        Some(self.stream.as_raw_fd())
    }

    fn take_reverse(&mut self) -> Option<Box<dyn crate::SendComm>> {
        self.reverse
            .take()
            .map(|s| Box::new(s) as Box<dyn crate::SendComm>)
    }

    fn sleep_on(&mut self, _: &Posted) -> crate::Sleep {
        if self.split.is_some() {
            crate::Sleep::Nap
        } else {
            crate::Sleep::Readable(self.stream.as_raw_fd())
        }
    }
}
