//! A device made of host memory: its operations run in issue order on a worker thread, each
//! after an optional random delay, so an engine that reads a twin before its download is
//! complete, or finishes before its uploads are, sends or leaves stale data and fails
//! validation. It exercises everything an engine does with an [`Offload`] except the GPU
//! itself, and counts what it was asked to do so tests can tell the device path ran.
//!
//! Peer memory ([`SimDevice::ipc`]) is modelled on CUDA IPC: every allocation is entered in
//! a process-wide registry under an id never reused, a handle names the id, and opening it
//! takes a reference until the mapping is closed. Both misuses CUDA leaves undefined fail
//! loudly here: opening a handle whose owner has freed its allocation (the error names the
//! handle), and freeing an allocation a peer still has open. Devices of one island can reach each other (peer devices of
//! one process share host memory, so an opened address is the owner's), devices of two
//! islands cannot.

use super::{device_of, Mirror, Offload, OffloadError, PeerHandle, PeerId, Reduce, Ticket};
use crate::buffer::HostBuffer;
use crate::dtype::{DataType, ReduceOp};
use crate::element::{finish_avg, reduce_inplace, reduce_into, scale_into};
use crate::with_dtype;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Operations by kind, for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub downloads: u64,
    pub uploads: u64,
    pub reduces: u64,
    pub copies: u64,
    pub premultiplies: u64,
    /// Times the direct path was given up.
    pub refusals: u64,
    /// Peer handles opened (a mapping made, not one found open).
    pub peer_opens: u64,
    /// Copies between device addresses (own or a peer's).
    pub device_copies: u64,
}

/// One simulated device allocation, shared with the peers that opened it.
struct Alloc {
    id: u64,
    buf: HostBuffer,
}

impl Alloc {
    fn base(&self) -> u64 {
        self.buf.as_slice().as_ptr() as u64
    }
    fn holds(&self, dev: u64, len: usize) -> bool {
        dev >= self.base() && dev + len as u64 <= self.base() + self.buf.len() as u64
    }
}

/// Tags the words of the simulated device's ids and handles.
const SIM_TAG: u64 = u64::from_le_bytes(*b"simpeer1");

/// Every live allocation of every simulated device in this process, by id: what a handle
/// is opened through. Ids are never reused, so a handle outlives its allocation only as a
/// name that no longer opens.
static REGISTRY: Mutex<BTreeMap<u64, Weak<Alloc>>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_DEVICE: AtomicU64 = AtomicU64::new(1);

fn registered(len: usize) -> Option<Arc<Alloc>> {
    let a = Arc::new(Alloc {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        buf: HostBuffer::new(len.max(1))?,
    });
    // A poisoned registry still holds valid entries: a test that panicked elsewhere must
    // not turn every later open into a second failure.
    let mut r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    r.retain(|_, w| w.strong_count() > 0);
    r.insert(a.id, Arc::downgrade(&a));
    Some(a)
}

/// Addresses are plain `usize` so that jobs cross to the worker thread.
enum Job {
    Copy {
        dst: usize,
        src: usize,
        len: usize,
    },
    Reduce {
        out: usize,
        mine: usize,
        staged: usize,
        elems: usize,
        dtype: DataType,
        op: ReduceOp,
        avg_over: Option<usize>,
    },
    Scale {
        dst: usize,
        src: usize,
        elems: usize,
        dtype: DataType,
        rank: usize,
    },
    Avg {
        out: usize,
        elems: usize,
        dtype: DataType,
        n: usize,
    },
}

impl Job {
    /// # Safety
    /// Every address is valid for the lengths the job names, which the offload checked
    /// against its mirrors and allocations when it issued the job.
    unsafe fn run(&self) {
        match *self {
            Job::Copy { dst, src, len } => {
                std::ptr::copy(src as *const u8, dst as *mut u8, len);
            }
            Job::Reduce {
                out,
                mine,
                staged,
                elems,
                dtype,
                op,
                avg_over,
            } => with_dtype!(dtype, T => {
                let o = std::slice::from_raw_parts_mut(out as *mut T, elems);
                let s = std::slice::from_raw_parts(staged as *const T, elems);
                if out == mine {
                    reduce_inplace(op, o, s);
                } else {
                    let m = std::slice::from_raw_parts(mine as *const T, elems);
                    reduce_into(op, o, m, s);
                }
                if let Some(n) = avg_over {
                    finish_avg(o, n);
                }
            }),
            Job::Scale {
                dst,
                src,
                elems,
                dtype,
                rank,
            } => with_dtype!(dtype, T => {
                let d = std::slice::from_raw_parts_mut(dst as *mut T, elems);
                let s = std::slice::from_raw_parts(src as *const T, elems);
                scale_into(d, s, rank);
            }),
            Job::Avg {
                out,
                elems,
                dtype,
                n,
            } => with_dtype!(dtype, T => {
                finish_avg(std::slice::from_raw_parts_mut(out as *mut T, elems), n);
            }),
        }
    }
}

/// A mirrored pair allocated by the device itself (scratch, workspace, premultiplied input).
struct Pair {
    host: HostBuffer,
    dev: Option<Arc<Alloc>>,
}

impl Pair {
    fn new() -> Pair {
        Pair {
            host: HostBuffer::new(0)
                .unwrap_or_else(|| unreachable!("empty buffers allocate nothing")),
            dev: None,
        }
    }
    fn ensure(&mut self, bytes: usize) -> Result<bool, OffloadError> {
        if self.host.len() >= bytes {
            return Ok(false);
        }
        let oom = || {
            OffloadError(format!(
                "cannot allocate {bytes} bytes of simulated device memory"
            ))
        };
        self.host = HostBuffer::new(bytes).ok_or_else(oom)?;
        self.dev = Some(registered(bytes).ok_or_else(oom)?);
        Ok(true)
    }
    fn mirror(&mut self) -> Mirror {
        Mirror {
            host: self.host.as_mut_slice().as_mut_ptr(),
            device: self.dev.as_ref().map_or(0, |d| d.base()),
            len: self.host.len(),
        }
    }
}

/// See the module documentation.
pub struct SimDevice {
    tx: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    done: Arc<AtomicU64>,
    issued: u64,
    /// Device allocations made through [`SimDevice::alloc`].
    memory: Vec<Arc<Alloc>>,
    /// Peer mode: the island of devices that can reach each other, and this device's
    /// number.
    island: Option<u64>,
    number: u64,
    /// Peers' allocations opened here, kept alive until closed.
    opened: Vec<Arc<Alloc>>,
    /// Refuse every peer handle, as a driver may.
    refuse_opens: bool,
    user: Vec<Mirror>,
    all: Vec<Mirror>,
    staging: HostBuffer,
    /// Direct mode: transports may move the device memory itself, as with GPUDirect RDMA.
    direct: bool,
    device_staging: Option<u64>,
    device_staging_len: usize,
    /// Why the direct path was given up, in order.
    refusals: Vec<String>,
    scratch: Pair,
    workspace: Pair,
    premul: Pair,
    counts: Counts,
}

impl SimDevice {
    /// A device whose operations each wait up to `jitter` (uniformly, from a fixed seed)
    /// before they run.
    pub fn new(jitter: Duration, seed: u64) -> SimDevice {
        let (tx, rx) = mpsc::channel::<Job>();
        let done = Arc::new(AtomicU64::new(0));
        let d = done.clone();
        let worker = std::thread::spawn(move || {
            let mut x = seed | 1;
            for job in rx {
                if !jitter.is_zero() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let ns = x % (jitter.as_nanos() as u64 + 1);
                    std::thread::sleep(Duration::from_nanos(ns));
                }
                // SAFETY: see Job::run; the issuing side keeps the memory alive until the
                // ticket completes (engines sync before they return).
                unsafe { job.run() };
                d.fetch_add(1, Ordering::Release);
            }
        });
        let empty =
            || HostBuffer::new(0).unwrap_or_else(|| unreachable!("empty buffers allocate nothing"));
        SimDevice {
            tx: Some(tx),
            worker: Some(worker),
            done,
            issued: 0,
            memory: Vec::new(),
            island: None,
            number: NEXT_DEVICE.fetch_add(1, Ordering::Relaxed),
            opened: Vec::new(),
            refuse_opens: false,
            user: Vec::new(),
            all: Vec::new(),
            staging: empty(),
            direct: false,
            device_staging: None,
            device_staging_len: 0,
            refusals: Vec::new(),
            scratch: Pair::new(),
            workspace: Pair::new(),
            premul: Pair::new(),
            counts: Counts::default(),
        }
    }

    /// Offer the device's memory to transports that can move it (`device_kind`), as a GPU
    /// with GPUDirect RDMA does; engines use it where the transport registers it.
    pub fn direct(mut self) -> SimDevice {
        self.direct = true;
        self
    }

    /// Offer peer memory (CUDA IPC, peer access) to devices of the same `island`; devices
    /// of other islands cannot reach this one, as GPUs without peer access cannot.
    pub fn ipc(mut self, island: u64) -> SimDevice {
        self.island = Some(island);
        self
    }

    /// Refuse to open every peer handle, as a driver refusing them would: for tests of
    /// what the ranks do when one fails.
    pub fn refusing_opens(mut self) -> SimDevice {
        self.refuse_opens = true;
        self
    }

    /// `len` bytes of device memory, zeroed; returns its device address.
    pub fn alloc(&mut self, len: usize) -> Option<u64> {
        let a = registered(len)?;
        let at = a.base();
        self.memory.push(a);
        Some(at)
    }

    /// Frees the allocation at `dev` (after the work issued so far): its handles no longer
    /// open. Refused while a peer has it open (CUDA leaves that undefined): the peers close
    /// their mappings first.
    pub fn free(&mut self, dev: u64) -> Result<(), OffloadError> {
        self.sync()?;
        let i = self
            .memory
            .iter()
            .position(|a| a.base() == dev)
            .ok_or_else(|| OffloadError(format!("no allocation starts at device {dev:#x}")))?;
        let peers = Arc::strong_count(&self.memory[i]) - 1;
        if peers > 0 {
            return Err(OffloadError(format!(
                "freeing device {dev:#x} (IPC handle sim#{}) while {peers} peer mapping(s) \
                 still hold it: peers close their mappings first (peer::release)",
                self.memory[i].id
            )));
        }
        self.memory.swap_remove(i);
        Ok(())
    }

    fn allocation(&self, dev: u64, len: usize) -> Option<usize> {
        self.memory.iter().position(|a| a.holds(dev, len))
    }

    /// Whether `dev..dev+len` is memory this device may touch: its own allocations, its
    /// mirrored buffers and peers' allocations it opened.
    fn reachable(&self, dev: u64, len: usize) -> bool {
        self.allocation(dev, len).is_some()
            || self
                .all
                .iter()
                .any(|m| dev >= m.device && dev + len as u64 <= m.device + m.len as u64)
            || self.opened.iter().any(|a| a.holds(dev, len))
    }

    /// The allocation of this device's (a buffer, scratch or `mulsum` input) holding a range.
    fn owned(&self, dev: u64, len: usize) -> Option<&Arc<Alloc>> {
        let pairs = [&self.scratch, &self.workspace, &self.premul].into_iter();
        self.memory
            .iter()
            .chain(pairs.filter_map(|p| p.dev.as_ref()))
            .find(|a| a.holds(dev, len))
    }

    /// Writes device memory (synchronously: waits for every issued operation first).
    pub fn write(&mut self, dev: u64, bytes: &[u8]) -> Result<(), OffloadError> {
        self.sync()?;
        self.allocation(dev, bytes.len())
            .ok_or_else(|| OffloadError(format!("write outside device memory at {dev:#x}")))?;
        // SAFETY: `allocation` checked that the range lies in a live allocation of ours; the
        // device is idle (synced), and a peer writing it meanwhile is the test's own race.
        unsafe { std::ptr::copy(bytes.as_ptr(), dev as usize as *mut u8, bytes.len()) };
        Ok(())
    }

    /// Reads device memory (after every issued operation).
    pub fn read(&mut self, dev: u64, len: usize) -> Result<Vec<u8>, OffloadError> {
        self.sync()?;
        self.allocation(dev, len)
            .ok_or_else(|| OffloadError(format!("read outside device memory at {dev:#x}")))?;
        // SAFETY: as in write.
        Ok(unsafe { std::slice::from_raw_parts(dev as usize as *const u8, len) }.to_vec())
    }

    /// The caller's mirrored buffers (device addresses from [`SimDevice::alloc`]).
    pub fn set_mirrors(&mut self, mirrors: Vec<Mirror>) -> Result<(), OffloadError> {
        for m in &mirrors {
            if m.len > 0 && self.allocation(m.device, m.len).is_none() {
                return Err(OffloadError(format!(
                    "mirror of {} bytes at device {:#x} is outside device memory",
                    m.len, m.device
                )));
            }
        }
        self.user = mirrors;
        self.remirror();
        Ok(())
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Why the direct path was given up, if it was.
    pub fn refusals(&self) -> &[String] {
        &self.refusals
    }

    /// The host side of one of the device's own pairs (`slot`: scratch, workspace or the
    /// `mulsum` input), reallocated and mirrored again when it holds fewer than `bytes`.
    /// Nothing in flight may still use the old memory, so it waits for the queue first.
    fn grown(
        &mut self,
        slot: fn(&mut Self) -> &mut Pair,
        bytes: usize,
    ) -> Result<*mut u8, OffloadError> {
        self.sync()?;
        if slot(self).ensure(bytes)? {
            self.remirror();
        }
        Ok(slot(self).host.as_mut_slice().as_mut_ptr())
    }

    fn remirror(&mut self) {
        let mut all = self.user.clone();
        for p in [&mut self.scratch, &mut self.workspace, &mut self.premul] {
            if !p.host.is_empty() {
                all.push(p.mirror());
            }
        }
        self.all = all;
    }

    fn issue(&mut self, job: Job) -> Result<Ticket, OffloadError> {
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| OffloadError("the simulated device has shut down".into()))?;
        tx.send(job)
            .map_err(|_| OffloadError("the simulated device's worker has died".into()))?;
        self.issued += 1;
        Ok(Ticket(self.issued))
    }

    fn dev(&self, p: *const u8, len: usize) -> Result<usize, OffloadError> {
        Ok(device_of(&self.all, p, len)? as usize)
    }

    fn staged(&self, p: *const u8, len: usize) -> Result<usize, OffloadError> {
        let s = self.staging.as_slice().as_ptr() as usize;
        let at = p as usize;
        if at >= s && at + len <= s + self.staging.len() {
            Ok(at)
        } else {
            Err(OffloadError(format!(
                "{len} bytes at {p:p} are not in the device's staging memory"
            )))
        }
    }
}

impl Offload for SimDevice {
    fn mirrors(&self) -> &[Mirror] {
        &self.all
    }

    fn device_kind(&self) -> Option<busbw_transports::MemoryKind> {
        self.direct
            .then_some(busbw_transports::MemoryKind::Cuda { device: 0 })
    }

    fn direct_refused(&mut self, why: String) {
        self.direct = false;
        self.counts.refusals += 1;
        self.refusals.push(why);
    }

    fn device_staging(&mut self, bytes: usize) -> Result<u64, OffloadError> {
        if !self.direct {
            return Err(OffloadError(
                "this simulated device is not in direct mode".into(),
            ));
        }
        match self.device_staging {
            Some(a) if self.device_staging_len >= bytes => Ok(a),
            _ => {
                self.sync()?;
                let a = self.alloc(bytes).ok_or_else(|| {
                    OffloadError(format!("cannot allocate {bytes} bytes of device staging"))
                })?;
                self.device_staging = Some(a);
                self.device_staging_len = bytes;
                Ok(a)
            }
        }
    }

    fn reduce_on_device(
        &mut self,
        out: u64,
        mine: u64,
        staged: u64,
        elems: usize,
        dtype: DataType,
        op: ReduceOp,
        avg_over: Option<usize>,
    ) -> Result<Ticket, OffloadError> {
        let bytes = elems * dtype.size();
        for a in [out, mine, staged] {
            if !self.reachable(a, bytes) {
                return Err(OffloadError(format!(
                    "{bytes} bytes at device {a:#x} are outside device memory"
                )));
            }
        }
        self.counts.reduces += 1;
        self.issue(Job::Reduce {
            out: out as usize,
            mine: mine as usize,
            staged: staged as usize,
            elems,
            dtype,
            op,
            avg_over,
        })
    }

    fn avg_on_device(
        &mut self,
        out: u64,
        elems: usize,
        dtype: DataType,
        n: usize,
    ) -> Result<Ticket, OffloadError> {
        let bytes = elems * dtype.size();
        if !self.reachable(out, bytes) {
            return Err(OffloadError(format!(
                "{bytes} bytes at device {out:#x} are outside device memory"
            )));
        }
        self.issue(Job::Avg {
            out: out as usize,
            elems,
            dtype,
            n,
        })
    }

    fn staging(&mut self, bytes: usize) -> Result<*mut u8, OffloadError> {
        if self.staging.len() < bytes {
            // Nothing in flight may still read the old staging memory.
            self.sync()?;
            self.staging = HostBuffer::new(bytes)
                .ok_or_else(|| OffloadError(format!("cannot allocate {bytes} bytes of staging")))?;
        }
        Ok(self.staging.as_mut_slice().as_mut_ptr())
    }

    fn scratch(&mut self, bytes: usize) -> Result<*mut u8, OffloadError> {
        self.grown(|d| &mut d.scratch, bytes)
    }

    fn workspace(&mut self, bytes: usize) -> Result<*mut u8, OffloadError> {
        self.grown(|d| &mut d.workspace, bytes)
    }

    fn download(&mut self, host: *const u8, len: usize) -> Result<Ticket, OffloadError> {
        let src = self.dev(host, len)?;
        self.counts.downloads += 1;
        self.issue(Job::Copy {
            dst: host as usize,
            src,
            len,
        })
    }

    fn upload(&mut self, host: *const u8, len: usize) -> Result<Ticket, OffloadError> {
        let dst = self.dev(host, len)?;
        self.counts.uploads += 1;
        self.issue(Job::Copy {
            dst,
            src: host as usize,
            len,
        })
    }

    fn copy(
        &mut self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        download: bool,
    ) -> Result<Ticket, OffloadError> {
        let (d, s) = (self.dev(dst, len)?, self.dev(src, len)?);
        self.counts.copies += 1;
        let t = self.issue(Job::Copy {
            dst: d,
            src: s,
            len,
        })?;
        if download {
            return self.download(dst, len);
        }
        Ok(t)
    }

    fn reduce(&mut self, j: Reduce) -> Result<Ticket, OffloadError> {
        let bytes = j.elems * j.dtype.size();
        let out = self.dev(j.out, bytes)?;
        let mine = self.dev(j.mine, bytes)?;
        let staged = self.staged(j.staged, bytes)?;
        self.counts.reduces += 1;
        let t = self.issue(Job::Reduce {
            out,
            mine,
            staged,
            elems: j.elems,
            dtype: j.dtype,
            op: j.op,
            avg_over: j.avg_over,
        })?;
        if j.download {
            return self.download(j.out, bytes);
        }
        Ok(t)
    }

    fn premultiply(
        &mut self,
        src: *const u8,
        elems: usize,
        dtype: DataType,
        rank: usize,
    ) -> Result<*const u8, OffloadError> {
        let bytes = elems * dtype.size();
        let s = self.dev(src, bytes)?;
        let host = self.grown(|d| &mut d.premul, bytes)?;
        let dst = self.dev(host, bytes)?;
        self.counts.premultiplies += 1;
        self.issue(Job::Scale {
            dst,
            src: s,
            elems,
            dtype,
            rank,
        })?;
        Ok(host)
    }

    fn peer_id(&mut self) -> Option<PeerId> {
        self.island
            .map(|i| PeerId([SIM_TAG, i, self.number, std::process::id() as u64]))
    }

    fn can_access_peer(&mut self, peer: &PeerId) -> Result<bool, OffloadError> {
        let p = peer.0;
        Ok(p[0] == SIM_TAG && p[3] == std::process::id() as u64 && Some(p[1]) == self.island)
    }

    fn export_peer(&mut self, addr: u64, len: usize) -> Result<PeerHandle, OffloadError> {
        if self.island.is_none() {
            return Err(OffloadError(
                "this simulated device offers no peer memory".into(),
            ));
        }
        let a = self.owned(addr, len).ok_or_else(|| {
            OffloadError(format!(
                "cannot export {len} bytes at device {addr:#x}: not inside one allocation of this device"
            ))
        })?;
        let mut key = [0u64; 10];
        (key[0], key[1], key[2]) = (SIM_TAG, a.id, self.number);
        Ok(PeerHandle {
            key,
            offset: addr - a.base(),
            len: len as u64,
        })
    }

    fn open_peer(&mut self, h: &PeerHandle) -> Result<u64, OffloadError> {
        let [tag, id, owner, ..] = h.key;
        let name = || format!("IPC handle sim#{id} (device {owner}, +{} bytes)", h.offset);
        if tag != SIM_TAG {
            return Err(OffloadError(format!(
                "{}: not a simulated device's handle",
                name()
            )));
        }
        let at = |a: &Alloc| -> Result<u64, OffloadError> {
            let end = h.offset.checked_add(h.len);
            if end.is_none_or(|e| e > a.buf.len() as u64) {
                return Err(OffloadError(format!(
                    "{}: {} bytes run past its allocation of {}",
                    name(),
                    h.len,
                    a.buf.len()
                )));
            }
            Ok(a.base() + h.offset)
        };
        if self.refuse_opens {
            return Err(OffloadError(format!(
                "opening {}: the simulated driver refuses peer handles",
                name()
            )));
        }
        if let Some(a) = self.opened.iter().find(|a| a.id == id) {
            return at(a);
        }
        let live = {
            let r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
            r.get(&id).and_then(Weak::upgrade)
        };
        let a = live.ok_or_else(|| {
            OffloadError(format!(
                "opening {}: its owner has freed the memory (a handle must be opened while \
                 its owner still holds the buffer)",
                name()
            ))
        })?;
        let addr = at(&a)?;
        self.counts.peer_opens += 1;
        self.opened.push(a);
        Ok(addr)
    }

    fn close_peers(&mut self) {
        // Nothing in flight may still read a peer's memory once its mapping is gone.
        let _ = self.sync();
        self.opened.clear();
    }

    fn copy_on_device(&mut self, dst: u64, src: u64, len: usize) -> Result<Ticket, OffloadError> {
        for (a, what) in [(dst, "destination"), (src, "source")] {
            if !self.reachable(a, len) {
                return Err(OffloadError(format!(
                    "device copy {what} of {len} bytes at {a:#x} is neither this device's \
                     memory nor a peer's opened here"
                )));
            }
        }
        self.counts.device_copies += 1;
        self.issue(Job::Copy {
            dst: dst as usize,
            src: src as usize,
            len,
        })
    }

    fn complete(&mut self, t: Ticket) -> Result<bool, OffloadError> {
        if self.worker.as_ref().is_some_and(|w| w.is_finished()) {
            return Err(OffloadError(
                "the simulated device's worker has died".into(),
            ));
        }
        Ok(self.done.load(Ordering::Acquire) >= t.0)
    }

    fn sync(&mut self) -> Result<(), OffloadError> {
        let t = Ticket(self.issued);
        while !self.complete(t)? {
            std::thread::yield_now();
        }
        Ok(())
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
