//! Point-to-point transports for busbw.
//!
//! The trait is shaped after NCCL's net plugin (`listen` / `connect` / `accept` / `regMr` /
//! `isend` / `irecv` / `test`) because that boundary has already proven that TCP, RDMA verbs
//! and GPU-direct memory can all sit behind it without the collective algorithms knowing which
//! one they talk to. Connections are one-directional: the connector owns a [`SendComm`], the
//! acceptor a [`RecvComm`]. Nothing here blocks except [`Transport::connect`] and
//! [`Listener::accept`], and both take a deadline.
//!
//! Buffers are described by raw pointers ([`MemRegion`]) rather than slices: a request stays in
//! flight after the call returns and the memory may be device memory that Rust cannot borrow.
//! The callers (the algorithms in `busbw-collectives`) own the safety argument.

mod abort;
pub mod auth;
pub mod conformance;
mod conn;
mod error;
mod frame;
mod framed;
pub mod iface;
pub mod inproc;
pub mod multi;
pub mod platform;
pub mod shm;
mod slots;
pub mod tcp;
pub mod verbs;

pub use abort::Abort;
pub use error::{Result, TransportError};

use std::time::Duration;

/// Opaque connection address, produced by [`Transport::listen`] and carried through the
/// rendezvous store to the peers. Only the transport that made it interprets it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Handle(pub Vec<u8>);

/// Who a transport instance speaks for. A connector sends the job id and rank in its first
/// frame and proves the job token over the listener's challenge; the acceptor refuses
/// connections of another job id or without the proof (a stray connection from another job,
/// a port scanner), and listeners put the rank into their handles so both ends know their
/// peer. The token travels here rather than in a process-wide setting so that one process can
/// hold ranks of different jobs (tests do) and no transport depends on set-up order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Random per-job id agreed through the rendezvous store (a group's is derived from it).
    pub job: u64,
    /// Rank of the connecting side in its communicator.
    pub rank: u32,
    /// The key of the job token ([`auth::Key::from_token`]); each job id proves with its own
    /// key derived from it.
    pub token: auth::Key,
}

impl Identity {
    /// Rank `rank` of job id `job`, without a token.
    pub fn new(job: u64, rank: u32) -> Identity {
        Identity {
            job,
            rank,
            token: auth::Key::from_token(None),
        }
    }

    /// The same rank, proving `token` (none and empty are the same).
    pub fn with_token(self, token: Option<&str>) -> Identity {
        Identity {
            token: auth::Key::from_token(token),
            ..self
        }
    }

    /// The key this identity's data connections prove the token with.
    pub fn data_key(&self) -> auth::Key {
        self.token.for_job(self.job)
    }
}

/// Where a buffer lives. Transports advertise which kinds they can move directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Ordinary (possibly pinned) host memory.
    Host,
    /// CUDA device memory on the given device ordinal.
    Cuda { device: i32 },
}

/// Pointer kinds a transport can send from and receive into without staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtrSupport {
    pub host: bool,
    pub cuda: bool,
    pub dmabuf: bool,
}

/// Static facts about a transport, printed in the device table and used to pick transports.
#[derive(Clone, Debug, PartialEq)]
pub struct Properties {
    /// Short name (`tcp`, `shm`, `verbs`, `inproc`).
    pub name: &'static str,
    /// Link speed in Mbit/s when known (NIC speed from sysfs), used for reporting only.
    pub speed_mbps: Option<u64>,
    /// Typical one-way latency in microseconds when known.
    pub latency_us: Option<f64>,
    pub ptr_support: PtrSupport,
    /// Largest number of requests that may be in flight on one comm at once.
    pub max_requests: usize,
}

impl Properties {
    /// A transport that moves bytes with the CPU (host memory only) and knows neither its
    /// link speed nor its latency: tcp and shm.
    pub fn host_only(name: &'static str, max_requests: usize) -> Self {
        Properties {
            name,
            speed_mbps: None,
            latency_us: None,
            ptr_support: PtrSupport {
                host: true,
                cuda: false,
                dmabuf: false,
            },
            max_requests,
        }
    }
}

/// A dma-buf that holds a region's device memory, for NICs that register device memory
/// through dma-buf rather than through the nvidia-peermem module. Only the file descriptor
/// travels here so that this crate needs no CUDA: the CUDA code exports it
/// (`busbw_collectives::cuda::dmabuf`) and keeps it open until registration returns, after
/// which the kernel holds its own reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaBuf {
    pub fd: i32,
    /// Where the region's first byte lies inside the dma-buf (the export covers whole pages).
    pub offset: u64,
}

/// A memory range handed to a transport. Constructing one is `unsafe` because the transport
/// will read or write through the pointer for as long as a request using it is in flight.
#[derive(Clone, Copy, Debug)]
pub struct MemRegion {
    ptr: *mut u8,
    len: usize,
    kind: MemoryKind,
    dmabuf: Option<DmaBuf>,
}

// SAFETY: a MemRegion is only an address range; the code that creates it guarantees that the
// memory stays valid and is not accessed concurrently while requests on it are in flight.
unsafe impl Send for MemRegion {}
unsafe impl Sync for MemRegion {}

impl MemRegion {
    /// # Safety
    /// `ptr..ptr+len` must stay valid (allocated, not moved) for as long as this region, or
    /// any [`Registration`] made from it, is used by a transport.
    pub unsafe fn new(ptr: *mut u8, len: usize, kind: MemoryKind) -> Self {
        MemRegion {
            ptr,
            len,
            kind,
            dmabuf: None,
        }
    }
    /// The same region, registrable through `dmabuf` where a transport supports dma-buf.
    ///
    /// # Safety
    /// `dmabuf.fd` must be a dma-buf exported for this region's device memory, with the
    /// region's first byte at `dmabuf.offset`, and stay open until every
    /// [`Transport::register`] of the returned region has returned.
    pub unsafe fn with_dmabuf(self, dmabuf: DmaBuf) -> Self {
        MemRegion {
            dmabuf: Some(dmabuf),
            ..self
        }
    }
    pub fn dmabuf(&self) -> Option<DmaBuf> {
        self.dmabuf
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }
    /// Whether `ptr..ptr+len` lies inside this region.
    pub fn contains(&self, ptr: *const u8, len: usize) -> bool {
        let start = self.ptr as usize;
        let p = ptr as usize;
        p >= start
            && p.checked_add(len)
                .is_some_and(|end| end <= start + self.len)
    }
}

/// A registered memory region. For TCP this is only bookkeeping; for verbs it carries the
/// memory region keys, which is why every `isend`/`irecv` names one.
#[derive(Debug)]
pub struct Registration {
    pub region: MemRegion,
    /// Transport-specific key (an index into the transport's MR table, an lkey, ...).
    pub key: u64,
}

impl Registration {
    /// Every transport checks a request's buffer against its registration the same way: a
    /// range outside it is a caller bug that would otherwise read or write stray memory.
    pub fn check(&self, ptr: *const u8, len: usize) -> Result<()> {
        if len > 0 && !self.region.contains(ptr, len) {
            return Err(TransportError::OutsideRegistration);
        }
        Ok(())
    }
}

/// What a comm with nothing to do now can sleep on, from [`SendComm::sleep_on`] or
/// [`RecvComm::sleep_on`]. Sleeping matters whenever ranks outnumber cores (eight ranks on a
/// laptop): a spinning rank steals the core its peer needs to produce the data it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sleep {
    /// Progress may be possible already (the peer moved while the comm got ready to sleep):
    /// test again instead of sleeping.
    Ready,
    /// Sleep in poll(2) until this descriptor is readable.
    Readable(i32),
    /// Sleep in poll(2) until this descriptor is writable.
    Writable(i32),
    /// Nothing to sleep on: nap briefly and test again.
    Nap,
}

/// Identifies one in-flight request on a comm. Request ids are small integers recycled by the
/// comm, so the data path never allocates per message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(pub u32);

/// A transport: a factory for listeners and outgoing connections.
pub trait Transport: Send + Sync {
    fn properties(&self) -> Properties;

    /// Start listening for incoming connections. The handle goes to the peers.
    fn listen(&self) -> Result<(Handle, Box<dyn Listener>)>;

    /// Who this instance speaks for.
    fn identity(&self) -> Identity;

    /// Connect to the listener behind `handle` on `channel`. Returns as soon as the
    /// connection is usable for sending; it does not wait for the peer to call accept, so
    /// ranks may connect in any order without deadlocking.
    ///
    /// Channels are independent ordered streams between the same two ranks (NCCL's channels):
    /// algorithms that run several pipelines at once, such as the two trees of a double binary
    /// tree, give each its own channel so that their messages never interleave on one stream.
    fn connect(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
    ) -> Result<Box<dyn SendComm>>;

    /// Whether a connection to the peer behind `handle` carries both directions. One TCP
    /// connection per direction answers every message with an acknowledgement segment of its
    /// own; on one connection per pair the acknowledgement rides on the other direction's data,
    /// which takes about a quarter off a small exchange on loopback. Both ends of a pair must
    /// answer alike (they do: the answer depends on the route and the job's flags).
    fn duplex(&self, _handle: &Handle) -> bool {
        false
    }

    /// Open a connection that carries both directions to the listener behind `handle`: its
    /// sending half and its receiving half. The lower-numbered rank of a pair opens it (where
    /// [`Transport::duplex`] says so); the peer's listener hands out the receiving half, whose
    /// [`RecvComm::take_reverse`] is the peer's sending half. Like `connect`, it does not wait
    /// for the peer to accept.
    fn connect_duplex(
        &self,
        _handle: &Handle,
        _channel: u32,
        _timeout: Duration,
    ) -> Result<(Box<dyn SendComm>, Box<dyn RecvComm>)> {
        Err(TransportError::Unsupported(format!(
            "{} connections carry one direction",
            self.properties().name
        )))
    }

    /// Register memory for use in `isend`/`irecv`. Transports that move bytes with the CPU
    /// (sockets, shared-memory copies) cannot dereference device pointers, so by default
    /// device memory is refused with [`TransportError::DeviceMemory`]: the caller stages it
    /// through pinned host memory instead.
    fn register(&self, region: MemRegion) -> Result<Registration> {
        if region.kind() != MemoryKind::Host {
            return Err(TransportError::DeviceMemory {
                transport: self.properties().name,
                missing: "it moves bytes with the CPU, which cannot address device memory (GPUDirect RDMA needs the verbs transport)".into(),
            });
        }
        Ok(Registration { region, key: 0 })
    }

    /// Release a registration made by [`Transport::register`].
    fn deregister(&self, _registration: Registration) -> Result<()> {
        Ok(())
    }
}

/// The accepting end of [`Transport::listen`].
pub trait Listener: Send {
    /// Wait for the next authenticated incoming connection. Connections that fail the
    /// handshake (wrong magic, wrong job token) are dropped and waiting goes on.
    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn RecvComm>>;
}

/// Sending half of a connection.
pub trait SendComm: Send {
    /// Queue `len` bytes at `ptr` for sending with `tag`. Messages on one comm are delivered in
    /// the order they were posted.
    ///
    /// # Safety
    /// `ptr..ptr+len` must lie inside `registration` and stay valid and unmodified until
    /// [`SendComm::test`] reports the request complete.
    unsafe fn isend(
        &mut self,
        registration: &Registration,
        ptr: *const u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId>;

    /// Make progress and report whether `request` is complete (`Some(bytes)`). A completed
    /// request id may be reused by a later `isend`.
    fn test(&mut self, request: RequestId) -> Result<Option<usize>>;

    /// Rank of the peer this comm talks to (for error messages).
    fn peer(&self) -> u32;

    /// A file descriptor that becomes writable when `test` may make progress, so that a rank
    /// with nothing to do can sleep in poll(2) instead of spinning. This matters whenever
    /// ranks outnumber cores (eight ranks on a laptop): a spinning rank steals the core its
    /// peer needs to produce the data it waits for. `None`: the caller must poll `test`.
    fn readiness_fd(&self) -> Option<i32> {
        None
    }

    /// Get ready to sleep until `test` may make progress, and say on what. A comm whose peer
    /// must be told that it sleeps (shared memory raises a flag the peer checks after every
    /// publish) arms itself here; [`SendComm::woke`] disarms it. Called only after spinning
    /// and yielding found nothing to do, so arming stays off the fast path.
    fn sleep_on(&mut self) -> Sleep {
        self.readiness_fd().map_or(Sleep::Nap, Sleep::Writable)
    }

    /// The sleep that [`SendComm::sleep_on`] prepared is over (woken or timed out).
    fn woke(&mut self) {}
}

/// Receiving half of a connection.
pub trait RecvComm: Send {
    /// Post a receive of at most `len` bytes into `ptr` for the next message. A message larger
    /// than `len` or with another tag is an error ([`TransportError::Truncated`],
    /// [`TransportError::TagMismatch`]): both mean the ranks disagree about the collective.
    ///
    /// # Safety
    /// `ptr..ptr+len` must lie inside `registration`, stay valid, and not be read or written by
    /// anyone else until [`RecvComm::test`] reports the request complete.
    unsafe fn irecv(
        &mut self,
        registration: &Registration,
        ptr: *mut u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId>;

    /// Make progress and report whether `request` is complete (`Some(bytes received)`).
    fn test(&mut self, request: RequestId) -> Result<Option<usize>>;

    /// Rank of the peer this comm talks to (for error messages).
    fn peer(&self) -> u32;

    /// The channel the connector asked for in [`Transport::connect`].
    fn channel(&self) -> u32;

    /// A file descriptor that becomes readable when `test` may make progress, so that a rank
    /// with nothing to do can sleep in poll(2) instead of spinning. This matters whenever
    /// ranks outnumber cores (eight ranks on a laptop): a spinning rank steals the core its
    /// peer needs to produce the data it waits for. `None`: the caller must poll `test`.
    fn readiness_fd(&self) -> Option<i32> {
        None
    }

    /// As [`SendComm::sleep_on`], for data to arrive.
    fn sleep_on(&mut self) -> Sleep {
        self.readiness_fd().map_or(Sleep::Nap, Sleep::Readable)
    }

    /// As [`SendComm::woke`].
    fn woke(&mut self) {}

    /// The accepting side's sending half of a connection opened by
    /// [`Transport::connect_duplex`]; `None` for one-way connections, and once taken.
    fn take_reverse(&mut self) -> Option<Box<dyn SendComm>> {
        None
    }
}
