//! In-process transport: ranks are threads of one test process.
//!
//! It exists so that algorithm tests can run dozens of rank counts and buffer sizes in
//! milliseconds without sockets, and so that a failure in such a test points at the
//! algorithm, not at TCP. Messages are copied through channels; a send completes at once,
//! or, with [`InprocTransport::with_late_reads`], reads its buffer only when it completes, a
//! test later, as an RDMA NIC may read a send's memory at any time until its completion.

use crate::slots::Slots;
use crate::{
    Handle, Identity, Listener, MemRegion, MemoryKind, Properties, PtrSupport, RecvComm,
    Registration, RequestId, Result, SendComm, Transport, TransportError,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

struct Message {
    tag: u32,
    data: Vec<u8>,
}

struct Incoming {
    from: Identity,
    channel: u32,
    messages: Receiver<Message>,
}

fn registry() -> &'static Mutex<HashMap<u64, Sender<Incoming>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Sender<Incoming>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// In-process transport for one rank (one thread).
#[derive(Debug)]
pub struct InprocTransport {
    identity: Identity,
    device_memory: bool,
    late_reads: bool,
}

impl InprocTransport {
    pub fn new(identity: Identity) -> Self {
        InprocTransport {
            identity,
            device_memory: false,
            late_reads: false,
        }
    }

    /// Sends read their memory when they complete (on the second test of the oldest one),
    /// not when posted: an algorithm that writes memory an in-flight send still reads, which
    /// RDMA punishes and TCP does under a full socket, gets wrong data here too, at once.
    pub fn with_late_reads(identity: Identity) -> Self {
        InprocTransport {
            identity,
            device_memory: false,
            late_reads: true,
        }
    }

    /// An in-process transport that also registers and moves `MemoryKind::Cuda` regions,
    /// as a NIC with GPUDirect RDMA does: the tests' simulated devices keep "device memory"
    /// in host memory, so the direct path of the algorithms runs without a GPU or NIC.
    pub fn with_device_memory(identity: Identity) -> Self {
        InprocTransport {
            identity,
            device_memory: true,
            late_reads: false,
        }
    }
}

fn handle_bytes(id: u64, rank: u32) -> Handle {
    let mut v = b"inproc".to_vec();
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&rank.to_le_bytes());
    Handle(v)
}

fn parse_handle(h: &Handle) -> Result<(u64, u32)> {
    let b = &h.0;
    if b.len() != 18 || &b[..6] != b"inproc" {
        return Err(TransportError::BadHandle("not an inproc handle".into()));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&b[6..14]);
    let mut rank = [0u8; 4];
    rank.copy_from_slice(&b[14..18]);
    Ok((u64::from_le_bytes(id), u32::from_le_bytes(rank)))
}

impl Transport for InprocTransport {
    fn properties(&self) -> Properties {
        Properties {
            name: "inproc",
            speed_mbps: None,
            latency_us: None,
            ptr_support: PtrSupport {
                host: true,
                cuda: self.device_memory,
                dmabuf: false,
            },
            max_requests: 1024,
        }
    }

    fn register(&self, region: MemRegion) -> Result<Registration> {
        match region.kind() {
            MemoryKind::Cuda { .. } if !self.device_memory => Err(TransportError::DeviceMemory {
                transport: "inproc",
                missing: "it moves bytes with the CPU, which cannot address device memory (GPUDirect RDMA needs the verbs transport)".into(),
            }),
            _ => Ok(Registration { region, key: 0 }),
        }
    }

    fn identity(&self) -> Identity {
        self.identity
    }

    fn listen(&self) -> Result<(Handle, Box<dyn Listener>)> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        registry()
            .lock()
            .map_err(|_| TransportError::Unsupported("inproc registry poisoned".into()))?
            .insert(id, tx);
        Ok((
            handle_bytes(id, self.identity.rank),
            Box::new(InprocListener {
                id,
                job: self.identity.job,
                incoming: rx,
            }),
        ))
    }

    fn connect(
        &self,
        handle: &Handle,
        channel: u32,
        _timeout: Duration,
    ) -> Result<Box<dyn SendComm>> {
        let (id, peer) = parse_handle(handle)?;
        let tx = registry()
            .lock()
            .map_err(|_| TransportError::Unsupported("inproc registry poisoned".into()))?
            .get(&id)
            .cloned()
            .ok_or(TransportError::PeerClosed { peer })?;
        let (mtx, mrx) = mpsc::channel();
        tx.send(Incoming {
            from: self.identity,
            channel,
            messages: mrx,
        })
        .map_err(|_| TransportError::PeerClosed { peer })?;
        Ok(Box::new(InprocSend {
            tx: mtx,
            peer,
            slots: Slots::new(1024, peer),
            late: self.late_reads.then(Late::default),
        }))
    }
}

struct InprocListener {
    id: u64,
    job: u64,
    incoming: Receiver<Incoming>,
}

impl Drop for InprocListener {
    fn drop(&mut self) {
        if let Ok(mut r) = registry().lock() {
            r.remove(&self.id);
        }
    }
}

impl Listener for InprocListener {
    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn RecvComm>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.incoming.recv_timeout(left) {
                Ok(inc) if inc.from.job == self.job => {
                    let peer = inc.from.rank;
                    return Ok(Box::new(InprocRecv {
                        rx: inc.messages,
                        peer,
                        channel: inc.channel,
                        slots: Slots::new(1024, peer),
                    }));
                }
                Ok(_) => continue,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(TransportError::Timeout {
                        secs: timeout.as_secs_f64(),
                        what: "waiting for a peer to connect".into(),
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(TransportError::Unsupported("listener closed".into()))
                }
            }
        }
    }
}

struct InprocSend {
    tx: Sender<Message>,
    peer: u32,
    slots: Slots<()>,
    late: Option<Late>,
}

/// Sends posted but not yet read (late-read mode): address, length, tag, in posting order,
/// and whether the oldest has been tested once.
#[derive(Default)]
struct Late {
    pending: std::collections::VecDeque<(usize, usize, u32)>,
    tested: bool,
}

impl InprocSend {
    fn deliver(&self, ptr: *const u8, len: usize, tag: u32) -> Result<()> {
        let data = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: isend's contract: ptr..ptr+len is valid for reads until the send
            // completes, which is now.
            unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
        };
        self.tx
            .send(Message { tag, data })
            .map_err(|_| TransportError::PeerClosed { peer: self.peer })
    }
}

impl SendComm for InprocSend {
    unsafe fn isend(
        &mut self,
        registration: &Registration,
        ptr: *const u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        if let Some(late) = self.late.as_mut() {
            let id = self.slots.post(())?;
            late.pending.push_back((ptr as usize, len, tag));
            return Ok(id);
        }
        self.deliver(ptr, len, tag)?;
        let id = self.slots.post(())?;
        self.slots.complete_front(len);
        Ok(id)
    }

    fn test(&mut self, request: RequestId) -> Result<Option<usize>> {
        if let Some(mut late) = self.late.take() {
            // The oldest send is read on its second test: the first one only finds it posted.
            let read = match late.pending.front() {
                Some(&(ptr, len, tag)) if late.tested => Some((ptr, len, tag)),
                Some(_) => {
                    late.tested = true;
                    None
                }
                None => None,
            };
            let delivered =
                read.map(|(ptr, len, tag)| (self.deliver(ptr as *const u8, len, tag), len));
            if let Some((sent, len)) = delivered {
                late.pending.pop_front();
                late.tested = false;
                self.late = Some(late);
                sent?;
                self.slots.complete_front(len);
            } else {
                self.late = Some(late);
            }
        }
        self.slots.take(request)
    }

    fn peer(&self) -> u32 {
        self.peer
    }
}

struct InprocRecv {
    rx: Receiver<Message>,
    peer: u32,
    channel: u32,
    slots: Slots<(usize, *mut u8, u32)>,
}

// SAFETY: the raw pointers in pending slots are only used by the owning thread, under irecv's
// contract.
unsafe impl Send for InprocRecv {}

impl RecvComm for InprocRecv {
    unsafe fn irecv(
        &mut self,
        registration: &Registration,
        ptr: *mut u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        self.slots.post((len, ptr, tag))
    }

    fn test(&mut self, request: RequestId) -> Result<Option<usize>> {
        while let Some(&mut (len, ptr, tag)) = self.slots.front() {
            let msg = match self.rx.try_recv() {
                Ok(m) => m,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    return Err(TransportError::PeerClosed { peer: self.peer })
                }
            };
            if msg.tag != tag {
                return Err(TransportError::TagMismatch {
                    peer: self.peer,
                    expected: tag,
                    got: msg.tag,
                });
            }
            if msg.data.len() > len {
                return Err(TransportError::Truncated {
                    peer: self.peer,
                    sent: msg.data.len() as u64,
                    posted: len,
                });
            }
            if !msg.data.is_empty() {
                // SAFETY: irecv's contract: ptr..ptr+len is valid for writes; data fits.
                unsafe { std::ptr::copy_nonoverlapping(msg.data.as_ptr(), ptr, msg.data.len()) };
            }
            self.slots.complete_front(msg.data.len());
        }
        self.slots.take(request)
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn channel(&self) -> u32 {
        self.channel
    }
}
