//! Extra data sockets per connection, served by helper threads (NCCL's
//! `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD`).
//!
//! One TCP flow rarely fills a fast link: a single core runs out of copy bandwidth near
//! 20–40 Gbit/s, and on an ECMP fabric one flow hashes onto one path. So a connection can carry
//! `lanes` data sockets beside its control socket. The control socket still carries every
//! message header (and the payload of short messages, inline); the payload of a long message is
//! cut into one slice per lane, and each helper thread moves the slices of its lanes while the
//! rank's own thread goes on progressing its other peers.
//!
//! The rank's thread and a helper share only a single-producer, single-consumer ring of tasks
//! per lane, allocated when the connection is made: posting a slice is two atomic stores and an
//! `unpark`, completion is one atomic load, so the data path takes no lock and allocates
//! nothing. Both ends cut a message the same way from its length alone ([`slice`]), so the
//! slices need no headers of their own and stay in order on each lane's byte stream.

use crate::{Result, TransportError};
use std::cell::UnsafeCell;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// Messages at least this long travel on the lanes; shorter ones stay on the control socket,
/// where the header and payload go out in one system call and no thread hand-off adds latency.
pub(crate) const SPLIT_MIN: usize = 64 << 10;
/// Smallest slice worth a lane (NCCL's socket transport uses the same floor): below it the
/// per-slice hand-off costs more than the parallel socket gains.
const SLICE_MIN: usize = 64 << 10;
/// Slices are page multiples so each lane's copies stay aligned.
const SLICE_ALIGN: usize = 4096;
/// Most lanes one connection may ask for (NCCL caps threads × sockets at 64 as well); a peer's
/// hello asking for more is refused.
pub(crate) const MAX_LANES: usize = 64;
/// Most helper threads per connection (NCCL's `NCCL_SOCKET_NTHREADS` limit).
pub(crate) const MAX_THREADS: usize = 16;
/// How long an idle helper spins before parking: a ring step posts its next slice within
/// microseconds, and a park/unpark round trip costs more than that.
const SPIN: Duration = Duration::from_micros(50);
/// How often a helper blocked on its sockets or parked looks at the stop flag.
const POLL_SLICE: Duration = Duration::from_millis(20);

/// Byte range of slice `i` of a `len`-byte message cut for `lanes` lanes (empty past the end).
/// Sender and receiver both call this, which is what lets slices travel without headers.
pub(crate) fn slice(len: usize, lanes: usize, i: usize) -> (usize, usize) {
    let per = len.div_ceil(lanes.max(1)).max(SLICE_MIN);
    let per = per.div_ceil(SLICE_ALIGN) * SLICE_ALIGN;
    let start = (i * per).min(len);
    let end = ((i + 1) * per).min(len);
    (start, end - start)
}

/// Which way a connection's lanes move bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Send,
    Recv,
}

#[derive(Clone, Copy)]
struct Task {
    ptr: *mut u8,
    len: usize,
}

/// Single-producer (the rank's thread), single-consumer (the lane's helper) ring of tasks.
struct Ring {
    tasks: Box<[UnsafeCell<Task>]>,
    /// Tasks pushed so far (written by the producer only).
    pushed: AtomicU64,
    /// Tasks finished so far (written by the consumer only).
    done: AtomicU64,
}

// SAFETY: a task cell is written by the producer only while it is outside `done..pushed` and
// read by the consumer only while inside it; the Release/Acquire pairs on `pushed` and `done`
// order those accesses. The pointers in tasks are the caller's buffers, valid until the task is
// done by the isend/irecv contract.
unsafe impl Sync for Ring {}
unsafe impl Send for Ring {}

impl Ring {
    fn new(capacity: usize) -> Ring {
        Ring {
            tasks: (0..capacity.max(1))
                .map(|_| {
                    UnsafeCell::new(Task {
                        ptr: std::ptr::null_mut(),
                        len: 0,
                    })
                })
                .collect(),
            pushed: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }
}

/// What a helper saw go wrong, kept for the rank's thread to report.
struct Failure {
    lane: usize,
    error: io::Error,
}

struct Shared {
    rings: Vec<Ring>,
    stop: AtomicBool,
    failed: AtomicBool,
    failure: Mutex<Option<Failure>>,
}

/// The lanes of one connection and their helper threads.
pub(crate) struct Lanes {
    shared: Arc<Shared>,
    /// Helper serving lane `i` is `threads[i % threads.len()]`.
    threads: Vec<JoinHandle<()>>,
    handles: Vec<Thread>,
    peer: u32,
    /// Messages split so far, which is also each lane's task count: every split message gives
    /// every lane one task (possibly empty), so one number says when a message is done.
    split: u64,
}

impl Lanes {
    /// Starts `threads` helpers over `streams` (one per lane, already handshaken).
    pub(crate) fn start(
        streams: Vec<TcpStream>,
        threads: usize,
        direction: Direction,
        capacity: usize,
        peer: u32,
    ) -> Result<Lanes> {
        let lanes = streams.len();
        let threads = threads.clamp(1, lanes.max(1));
        for s in &streams {
            s.set_nonblocking(true)
                .map_err(|error| TransportError::PeerIo { peer, error })?;
        }
        let shared = Arc::new(Shared {
            rings: (0..lanes).map(|_| Ring::new(capacity)).collect(),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
        });
        let mut mine: Vec<Vec<(usize, TcpStream)>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, s) in streams.into_iter().enumerate() {
            mine[i % threads].push((i, s));
        }
        let mut joins = Vec::with_capacity(threads);
        for (t, set) in mine.into_iter().enumerate() {
            let sh = shared.clone();
            let j = thread::Builder::new()
                .name(format!("busbw-tcp-{peer}-{t}"))
                .spawn(move || serve(&sh, set, direction))
                .map_err(TransportError::Io)?;
            joins.push(j);
        }
        let handles = joins.iter().map(|j| j.thread().clone()).collect();
        Ok(Lanes {
            shared,
            threads: joins,
            handles,
            peer,
            split: 0,
        })
    }

    pub(crate) fn count(&self) -> usize {
        self.shared.rings.len()
    }

    /// Hands the slices of a `len`-byte message at `ptr` to the lanes; returns the number
    /// [`Lanes::is_done`] takes.
    pub(crate) fn post(&mut self, ptr: *mut u8, len: usize) -> Result<u64> {
        self.check()?;
        let lanes = self.count();
        let capacity = self.shared.rings.first().map_or(0, |r| r.tasks.len()) as u64;
        if self.split - self.oldest_done() >= capacity {
            return Err(TransportError::TooManyRequests {
                peer: self.peer,
                max: capacity as usize,
            });
        }
        for (i, ring) in self.shared.rings.iter().enumerate() {
            let (off, n) = slice(len, lanes, i);
            let at = (self.split % capacity) as usize;
            // SAFETY: cell `at` is outside done..pushed (checked against capacity above), so
            // the helper does not read it; off + n <= len keeps the pointer in the buffer.
            unsafe {
                *ring.tasks[at].get() = Task {
                    ptr: ptr.add(off),
                    len: n,
                }
            };
            ring.pushed.store(self.split + 1, Ordering::Release);
        }
        self.split += 1;
        for h in &self.handles {
            h.unpark();
        }
        Ok(self.split)
    }

    fn oldest_done(&self) -> u64 {
        self.shared
            .rings
            .iter()
            .map(|r| r.done.load(Ordering::Acquire))
            .min()
            .unwrap_or(self.split)
    }

    /// Whether split message number `seq` (from [`Lanes::post`]) has fully moved.
    pub(crate) fn is_done(&self, seq: u64) -> Result<bool> {
        self.check()?;
        Ok(self.oldest_done() >= seq)
    }

    fn check(&self) -> Result<()> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let peer = self.peer;
        let taken = self.shared.failure.lock().ok().and_then(|mut f| f.take());
        Err(match taken {
            Some(Failure { lane, error }) => match error.kind() {
                io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::UnexpectedEof => TransportError::PeerClosed { peer },
                _ => TransportError::PeerIo {
                    peer,
                    error: io::Error::new(error.kind(), format!("data socket {lane}: {error}")),
                },
            },
            // Reported once already; later calls still fail.
            None => TransportError::PeerClosed { peer },
        })
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for h in &self.handles {
            h.unpark();
        }
        for j in self.threads.drain(..) {
            let _ = j.join();
        }
    }
}

/// One lane as its helper sees it: the task being worked on and how far it got.
struct Worker {
    lane: usize,
    stream: TcpStream,
    offset: usize,
}

fn serve(shared: &Shared, set: Vec<(usize, TcpStream)>, direction: Direction) {
    let mut lanes: Vec<Worker> = set
        .into_iter()
        .map(|(lane, stream)| Worker {
            lane,
            stream,
            offset: 0,
        })
        .collect();
    let mut idle_since: Option<Instant> = None;
    while !shared.stop.load(Ordering::Acquire) {
        let mut moved = false;
        let mut waiting = false;
        for w in &mut lanes {
            match step(shared, w, direction) {
                Ok(Step::Moved) => moved = true,
                Ok(Step::Blocked) => waiting = true,
                Ok(Step::Idle) => {}
                Err(error) => {
                    if let Ok(mut f) = shared.failure.lock() {
                        f.get_or_insert(Failure {
                            lane: w.lane,
                            error,
                        });
                    }
                    shared.failed.store(true, Ordering::Release);
                    return;
                }
            }
        }
        if moved {
            idle_since = None;
        } else if waiting {
            idle_since = None;
            wait_sockets(&lanes, shared, direction);
        } else {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                thread::park_timeout(POLL_SLICE);
            }
        }
    }
}

enum Step {
    Moved,
    Blocked,
    Idle,
}

/// Moves what the socket takes of lane `w`'s current task without blocking.
fn step(shared: &Shared, w: &mut Worker, direction: Direction) -> io::Result<Step> {
    let ring = &shared.rings[w.lane];
    let done = ring.done.load(Ordering::Relaxed);
    if done == ring.pushed.load(Ordering::Acquire) {
        return Ok(Step::Idle);
    }
    // SAFETY: done < pushed, so the producer has published this cell and will not touch it
    // until `done` moves past it.
    let task = unsafe { *ring.tasks[(done % ring.tasks.len() as u64) as usize].get() };
    let mut moved = false;
    while w.offset < task.len {
        let left = task.len - w.offset;
        // SAFETY: offset < len keeps the pointer inside the caller's buffer, which stays valid
        // until this task is marked done (isend/irecv contract).
        let p = unsafe { task.ptr.add(w.offset) } as *mut libc::c_void;
        let fd = w.stream.as_raw_fd();
        // SAFETY: p..p+left is the caller's buffer (readable for sends, writable for receives).
        let n = unsafe {
            match direction {
                Direction::Send => libc::send(fd, p, left, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT),
                Direction::Recv => libc::recv(fd, p, left, libc::MSG_DONTWAIT),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => {
                    return Ok(if moved { Step::Moved } else { Step::Blocked })
                }
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        if n == 0 && direction == Direction::Recv {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        w.offset += n as usize;
        moved = true;
    }
    w.offset = 0;
    ring.done.store(done + 1, Ordering::Release);
    Ok(Step::Moved)
}

/// Sleeps until one of the lanes with work can move (or briefly, to notice a stop).
fn wait_sockets(lanes: &[Worker], shared: &Shared, direction: Direction) {
    let events = match direction {
        Direction::Send => libc::POLLOUT,
        Direction::Recv => libc::POLLIN,
    };
    let mut fds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX_LANES];
    let mut n = 0;
    for w in lanes {
        let ring = &shared.rings[w.lane];
        if ring.done.load(Ordering::Relaxed) != ring.pushed.load(Ordering::Acquire) && n < MAX_LANES
        {
            fds[n] = libc::pollfd {
                fd: w.stream.as_raw_fd(),
                events,
                revents: 0,
            };
            n += 1;
        }
    }
    // SAFETY: fds[..n] are valid pollfds over sockets this helper owns.
    unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            n as libc::nfds_t,
            POLL_SLICE.as_millis() as libc::c_int,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn slices_cover_the_message_exactly_once() {
        for &(len, lanes) in &[
            (SPLIT_MIN, 1),
            (SPLIT_MIN, 4),
            (1 << 20, 4),
            ((1 << 20) + 17, 3),
            (10 << 20, 64),
            (123_457, 7),
        ] {
            let mut next = 0;
            for i in 0..lanes {
                let (off, n) = slice(len, lanes, i);
                if n == 0 {
                    continue;
                }
                assert_eq!(off, next, "len {len} lanes {lanes} slice {i}");
                if off + n < len {
                    assert_eq!(n % SLICE_ALIGN, 0);
                    assert!(n >= SLICE_MIN);
                }
                next = off + n;
            }
            assert_eq!(next, len, "len {len} lanes {lanes}");
        }
        // A message just over the floor keeps most lanes empty rather than cutting tiny slices.
        assert_eq!(slice(SPLIT_MIN, 8, 1).1, 0);
    }

    #[test]
    fn helpers_move_slices_in_order_and_report_a_closed_peer() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let lanes = 3;
        let out: Vec<TcpStream> = (0..lanes)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let inc: Vec<TcpStream> = (0..lanes).map(|_| listener.accept().unwrap().0).collect();
        let mut tx = Lanes::start(out, 2, Direction::Send, 4, 1).unwrap();
        let mut rx = Lanes::start(inc, 2, Direction::Recv, 4, 0).unwrap();
        let len = 3 * (1 << 20) + 4096 + 5;
        let mut src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0u8; len];
        let mut seqs = Vec::new();
        for _ in 0..2 {
            let r = rx.post(dst.as_mut_ptr(), len).unwrap();
            let s = tx.post(src.as_mut_ptr(), len).unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while !(rx.is_done(r).unwrap() && tx.is_done(s).unwrap()) {
                assert!(Instant::now() < deadline, "lanes made no progress");
                thread::yield_now();
            }
            assert!(dst == src);
            seqs.push((r, s));
            dst.iter_mut().for_each(|b| *b = 0);
            src.reverse();
        }
        assert_eq!(seqs, vec![(1, 1), (2, 2)]);
        drop(tx);
        let r = rx.post(dst.as_mut_ptr(), len).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let err = loop {
            match rx.is_done(r) {
                Err(e) => break e,
                Ok(done) => assert!(!done, "nothing was sent"),
            }
            assert!(Instant::now() < deadline, "closed peer never reported");
            thread::sleep(Duration::from_millis(1));
        };
        assert!(
            matches!(err, TransportError::PeerClosed { peer: 0 }),
            "{err}"
        );
    }
}
