//! A device made of host memory: its operations run in issue order on a worker thread, each
//! after an optional random delay, so an engine that reads a twin before its download is
//! complete, or finishes before its uploads are, sends or leaves stale data and fails
//! validation. It exercises everything an engine does with an [`Offload`] except the GPU
//! itself, and counts what it was asked to do so tests can tell the device path ran.

use super::{device_of, Mirror, Offload, OffloadError, Reduce, Ticket};
use crate::buffer::HostBuffer;
use crate::dtype::{DataType, ReduceOp};
use crate::element::{finish_avg, reduce_inplace, reduce_into, scale_into};
use crate::with_dtype;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
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
        }
    }
}

/// A mirrored pair allocated by the device itself (scratch, premultiplied input).
struct Pair {
    host: HostBuffer,
    dev: HostBuffer,
}

impl Pair {
    fn new() -> Pair {
        Pair {
            host: HostBuffer::new(0)
                .unwrap_or_else(|| unreachable!("empty buffers allocate nothing")),
            dev: HostBuffer::new(0)
                .unwrap_or_else(|| unreachable!("empty buffers allocate nothing")),
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
        self.dev = HostBuffer::new(bytes).ok_or_else(oom)?;
        Ok(true)
    }
    fn mirror(&mut self) -> Mirror {
        Mirror {
            host: self.host.as_mut_slice().as_mut_ptr(),
            device: self.dev.as_mut_slice().as_mut_ptr() as u64,
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
    memory: Vec<HostBuffer>,
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
            user: Vec::new(),
            all: Vec::new(),
            staging: empty(),
            direct: false,
            device_staging: None,
            device_staging_len: 0,
            refusals: Vec::new(),
            scratch: Pair::new(),
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

    /// `len` bytes of device memory, zeroed; returns its device address.
    pub fn alloc(&mut self, len: usize) -> Option<u64> {
        let mut b = HostBuffer::new(len.max(1))?;
        let a = b.as_mut_slice().as_mut_ptr() as u64;
        self.memory.push(b);
        Some(a)
    }

    fn allocation(&self, dev: u64, len: usize) -> Option<usize> {
        self.memory.iter().position(|b| {
            let s = b.as_slice().as_ptr() as u64;
            dev >= s && dev + len as u64 <= s + b.len() as u64
        })
    }

    /// Writes device memory (synchronously: waits for every issued operation first).
    pub fn write(&mut self, dev: u64, bytes: &[u8]) -> Result<(), OffloadError> {
        self.sync()?;
        let i = self
            .allocation(dev, bytes.len())
            .ok_or_else(|| OffloadError(format!("write outside device memory at {dev:#x}")))?;
        let b = &mut self.memory[i];
        let at = (dev - b.as_slice().as_ptr() as u64) as usize;
        b.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    /// Reads device memory (after every issued operation).
    pub fn read(&mut self, dev: u64, len: usize) -> Result<Vec<u8>, OffloadError> {
        self.sync()?;
        let i = self
            .allocation(dev, len)
            .ok_or_else(|| OffloadError(format!("read outside device memory at {dev:#x}")))?;
        let b = &self.memory[i];
        let at = (dev - b.as_slice().as_ptr() as u64) as usize;
        Ok(b.as_slice()[at..at + len].to_vec())
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

    fn remirror(&mut self) {
        let mut all = self.user.clone();
        for p in [&mut self.scratch, &mut self.premul] {
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
        let mirrored = |a: u64| {
            self.all
                .iter()
                .any(|m| a >= m.device && a + bytes as u64 <= m.device + m.len as u64)
        };
        for a in [out, mine, staged] {
            if self.allocation(a, bytes).is_none() && !mirrored(a) {
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
        self.sync()?;
        if self.scratch.ensure(bytes)? {
            self.remirror();
        }
        Ok(self.scratch.host.as_mut_slice().as_mut_ptr())
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
        self.sync()?;
        if self.premul.ensure(bytes)? {
            self.remirror();
        }
        let host = self.premul.host.as_mut_slice().as_mut_ptr();
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
