//! Ring algorithms: AllReduce (reduce-scatter then all-gather), ReduceScatter and AllGather,
//! all driven by one pipelined ring engine.
//!
//! A buffer is cut into `n` chunks; over a number of steps each rank sends one chunk to its
//! right neighbour and receives one from its left, either reducing it with its own
//! contribution or storing it as is. AllReduce, with uneven chunks so any count works:
//!
//! ```text
//! step t < n-1  (reduce-scatter): send chunk (r-t),   receive chunk (r-t-1) and reduce it
//! step t >= n-1 (all-gather, u = t-(n-1)): send chunk (r+1-u), receive chunk (r-u) as is
//! ```
//!
//! In every ring the chunk received at step t is the chunk sent at step t+1, so each chunk is
//! cut into segments and segment k is forwarded as soon as it has been reduced (or received),
//! while segment k+1 is still on the wire: the ring is a pipeline, not a series of barriers.
//! The owner of a fully reduced chunk applies `avg`'s division once, before it travels on.
//!
//! Messages on a connection arrive in posting order, and both neighbours walk the same
//! (step, segment) sequence, so every receive is posted for exactly the message that will
//! fill it; the per-call tag catches ranks that disagree. Received segments that must be
//! reduced land in a ring of `window` staging slots; the others land in place.

use crate::communicator::{Communicator, Waiter};
pub use crate::data::Data;
use crate::data::{bytes_of, pipeline_segment};
use crate::dtype::{DataType, ReduceOp};
use crate::element::{finish_avg, reduce_inplace_par, reduce_into_par, Element};
use crate::error::CommError;
use crate::offload::{self, Offload, Reduce, Ticket};
use crate::with_dtype;
use crate::workspace::{premultiplied, scratch, staging};
use busbw_transports::RequestId;
use std::collections::VecDeque;

/// AllReduce `count` elements of `dtype` with `op` across the communicator, leaving the
/// result on every rank.
pub fn all_reduce(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let bytes = bytes_of(count, dtype)?;
    let b = data.bufs(comm.rank(), "all_reduce", bytes, bytes, dtype, (0, 0))?;
    with_dtype!(dtype, T => {
        // SAFETY: Data::bufs checked sizes and alignment; the borrows outlive the call.
        unsafe {
            let src = premultiplied(comm, op, b.src as *const T, count)?;
            all_reduce_raw::<T>(comm, src, b.dst as *mut T, count, op)
        }
    })
}

/// ReduceScatter: reduce `n × recv_count` input elements and leave block `rank` of the
/// result (`recv_count` elements) on each rank.
pub fn reduce_scatter(
    comm: &mut Communicator,
    data: Data<'_>,
    recv_count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let n = comm.size();
    let rb = bytes_of(recv_count, dtype)?;
    let sb = bytes_of(recv_count * n, dtype)?;
    let b = data.bufs(
        comm.rank(),
        "reduce_scatter",
        sb,
        rb,
        dtype,
        (0, comm.rank() * rb),
    )?;
    with_dtype!(dtype, T => {
        // SAFETY: as in all_reduce.
        unsafe {
            let src = premultiplied(comm, op, b.src as *const T, recv_count * n)?;
            reduce_scatter_raw::<T>(comm, src, b.dst as *mut T, recv_count, op)
        }
    })
}

/// AllGather: every rank contributes `send_count` elements; every rank receives all
/// `n × send_count`, block r from rank r.
pub fn all_gather(
    comm: &mut Communicator,
    data: Data<'_>,
    send_count: usize,
    dtype: DataType,
) -> Result<(), CommError> {
    let n = comm.size();
    let sb = bytes_of(send_count, dtype)?;
    let rb = bytes_of(send_count * n, dtype)?;
    let b = data.bufs(
        comm.rank(),
        "all_gather",
        sb,
        rb,
        dtype,
        (comm.rank() * sb, 0),
    )?;
    with_dtype!(dtype, T => {
        // SAFETY: as in all_reduce.
        unsafe { all_gather_raw::<T>(comm, b.src as *const T, b.dst as *mut T, send_count) }
    })
}

/// Chunk geometry: `n` chunks of `base` elements, the first `rem` one element longer.
#[derive(Clone, Copy)]
pub(crate) struct Chunks {
    pub base: usize,
    pub rem: usize,
    pub seg: usize,
}

impl Chunks {
    pub fn offset(&self, c: usize) -> usize {
        c * self.base + c.min(self.rem)
    }
    pub fn len(&self, c: usize) -> usize {
        self.base + usize::from(c < self.rem)
    }
    pub fn segments(&self, c: usize) -> usize {
        self.len(c).div_ceil(self.seg)
    }
    /// Elements `(offset, len)` of segment `k` of chunk `c`.
    pub fn segment(&self, c: usize, k: usize) -> (usize, usize) {
        let start = k * self.seg;
        (self.offset(c) + start, self.seg.min(self.len(c) - start))
    }
}

/// What a ring does at each step and where its data lives. Pointers are to the element at
/// global offset `off` (the chunk layout is the same on every rank).
pub(crate) trait RingPlan<T> {
    fn steps(&self) -> usize;
    fn send_chunk(&self, t: usize) -> usize;
    fn recv_chunk(&self, t: usize) -> usize;
    /// Whether what step `t` receives is reduced with the local contribution.
    fn reduces(&self, t: usize) -> bool;
    /// Whether the chunk reduced at step `t` is final (gets `avg`'s division).
    fn is_final(&self, t: usize) -> bool;
    fn send_from(&self, t: usize, off: usize) -> *const T;
    /// Target of a non-reducing receive.
    fn recv_into(&self, t: usize, off: usize) -> *mut T;
    /// Local contribution and output of a reducing step.
    fn reduce_in(&self, t: usize, off: usize) -> *const T;
    fn reduce_out(&self, t: usize, off: usize) -> *mut T;
    /// Memory the transport must have registered: `(pointer, elements)`.
    fn regions(&self) -> Vec<(*const T, usize)>;
    /// Who we receive from and send to; `None` at the ends of a chain.
    fn left(&self) -> Option<usize>;
    fn right(&self) -> Option<usize>;
    /// Sends that need no received data (our own input).
    fn initially_ready(&self, ch: &Chunks) -> usize;
    /// Whether processing a receive of step `t` releases the next send (the same segment,
    /// forwarded).
    fn releases_send(&self, t: usize) -> bool;
}

/// The ring-neighbour half of a [`RingPlan`] for plans that go round the whole ring.
macro_rules! ring_neighbours {
    () => {
        fn left(&self) -> Option<usize> {
            Some((self.r + self.n - 1) % self.n)
        }
        fn right(&self) -> Option<usize> {
            Some((self.r + 1) % self.n)
        }
        fn initially_ready(&self, ch: &Chunks) -> usize {
            ch.segments(self.send_chunk(0))
        }
        fn releases_send(&self, t: usize) -> bool {
            t + 1 < self.steps()
        }
    };
}

/// Walks (step, segment) pairs in the order messages travel, skipping empty chunks.
struct Cursor {
    t: usize,
    k: usize,
}

impl Cursor {
    fn start(chunk_of: impl Fn(usize) -> usize, ch: &Chunks, steps: usize) -> Self {
        let mut c = Cursor { t: 0, k: 0 };
        c.skip_empty(chunk_of, ch, steps);
        c
    }
    fn skip_empty(&mut self, chunk_of: impl Fn(usize) -> usize, ch: &Chunks, steps: usize) {
        while self.t < steps && self.k >= ch.segments(chunk_of(self.t)) {
            self.t += 1;
            self.k = 0;
        }
    }
    fn advance(&mut self, chunk_of: impl Fn(usize) -> usize, ch: &Chunks, steps: usize) {
        self.k += 1;
        self.skip_empty(chunk_of, ch, steps);
    }
}

struct PendingRecv {
    id: RequestId,
    t: usize,
    k: usize,
    slot: usize,
    /// The device reduction of what arrived, once issued.
    ticket: Option<Ticket>,
}

fn no_device(rank: usize, name: &str) -> CommError {
    CommError::Invalid(format!(
        "rank {rank}: {name}: a device reduction is pending but the call has no device"
    ))
}

/// Run a ring (or chain) plan to completion on `channel`.
///
/// # Safety
/// Every pointer the plan hands out must be valid for the segment it describes, and the plan
/// must not make two in-flight requests write the same memory.
pub(crate) unsafe fn run_ring<T: Element, P: RingPlan<T>>(
    comm: &mut Communicator,
    plan: &P,
    ch: &Chunks,
    op: ReduceOp,
    channel: u32,
    name: &'static str,
) -> Result<(), CommError> {
    let esize = std::mem::size_of::<T>();
    // Host memory (the common case, and latency-bound at small sizes) allocates nothing here.
    let mut dev = if comm.has_offload() {
        let ranges: Vec<(*const u8, usize)> = plan
            .regions()
            .iter()
            .map(|&(p, e)| (p as *const u8, e * esize))
            .collect();
        comm.take_offload(&ranges)
    } else {
        None
    };
    let result = run_ring_on(comm, plan, ch, op, channel, name, dev.as_deref_mut());
    offload::finish(comm, dev, result, name)
}

/// [`run_ring`] with the plan's buffers on `dev` when given (see [`crate::offload`]): own
/// input is downloaded before it is sent, received segments are reduced on the device (and
/// downloaded only if they travel on), received final segments are uploaded, and a send or
/// staging slot is released only when its ticket is complete.
///
/// # Safety
/// As [`run_ring`].
unsafe fn run_ring_on<T: Element, P: RingPlan<T>>(
    comm: &mut Communicator,
    plan: &P,
    ch: &Chunks,
    op: ReduceOp,
    channel: u32,
    name: &'static str,
    mut dev: Option<&mut (dyn Offload + 'static)>,
) -> Result<(), CommError> {
    let n = comm.size();
    let r = comm.rank();
    let tag = comm.next_tag();
    let esize = std::mem::size_of::<T>();
    let window = comm.config().window;
    let steps = plan.steps();
    let dev_err = offload::err(r, name);
    let seg = ch.seg;
    let (stage, regs, direct) = offload::prepare(
        comm,
        dev.as_deref_mut(),
        &plan.regions(),
        window * seg,
        |comm| staging::<T>(comm, seg),
        name,
    )?;
    // On the direct path the plan's twin addresses stand for their device twins.
    let mirrors = match dev.as_deref() {
        Some(d) if direct => d.mirrors().to_vec(),
        _ => Vec::new(),
    };
    let at = |p: *const T, elems: usize| -> Result<*const T, CommError> {
        if !direct {
            return Ok(p);
        }
        let a = offload::device_of(&mirrors, p as *const u8, elems * esize).map_err(&dev_err)?;
        Ok(a as usize as *const T)
    };
    let transport_err = |peer: usize, what: &'static str| {
        move |cause| CommError::Transport {
            rank: r,
            peer: Some(peer),
            during: format!("{name} (call {tag}): {what} rank {peer}"),
            cause,
        }
    };

    // Chain ends have no neighbour on one side; the placeholder rank is never used.
    let left = plan.left().unwrap_or(r);
    let right = plan.right().unwrap_or(r);
    let mut send = match plan.right() {
        Some(p) => Some(comm.take_send(p, channel)?),
        None => None,
    };
    let mut recv = match plan.left().map(|p| comm.take_recv(p, channel)) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            if let Some(s) = send {
                comm.put_send(right, channel, s);
            }
            regs.release(comm);
            return Err(e);
        }
    };

    let send_chunk = |t| plan.send_chunk(t);
    let recv_chunk = |t| plan.recv_chunk(t);
    let total_recvs: usize = if recv.is_some() {
        (0..steps).map(|t| ch.segments(recv_chunk(t))).sum()
    } else {
        0
    };
    let total_sends: usize = if send.is_some() {
        (0..steps).map(|t| ch.segments(send_chunk(t))).sum()
    } else {
        0
    };
    // Sends of our own input are ready at once; each processed receive releases the send of
    // the segment it completed.
    let initial = if steps > 0 && send.is_some() {
        plan.initially_ready(ch)
    } else {
        0
    };
    // Sends go in cursor order: first the `initial` ones of our own input (on a device,
    // sendable once their download is complete), then one per released receive.
    let mut downloads: VecDeque<Ticket> = VecDeque::new();
    let (mut downloaded, mut released) = (0, 0);
    let mut send_cur = Cursor::start(send_chunk, ch, steps);
    let mut recv_cur = Cursor::start(recv_chunk, ch, steps);
    let (mut sends_posted, mut sends_done, mut recvs_posted, mut recvs_done) = (0, 0, 0, 0);
    let mut sends_inflight: VecDeque<RequestId> = VecDeque::with_capacity(window);
    let mut recvs_inflight: VecDeque<PendingRecv> = VecDeque::with_capacity(window);
    let mut waiter = Waiter::new(comm);
    let pool = comm.reduce_pool();

    let result = (|| -> Result<(), CommError> {
        match dev.as_deref_mut() {
            Some(d) if !direct => {
                let mut c = Cursor::start(send_chunk, ch, steps);
                for _ in 0..initial {
                    let (off, len) = ch.segment(send_chunk(c.t), c.k);
                    let p = plan.send_from(c.t, off) as *const u8;
                    downloads.push_back(d.download(p, len * esize).map_err(&dev_err)?);
                    c.advance(send_chunk, ch, steps);
                }
            }
            _ => downloaded = initial,
        }
        while sends_done < total_sends || recvs_done < total_recvs {
            let mut progressed = false;
            if let Some(d) = dev.as_deref_mut() {
                while let Some(&t) = downloads.front() {
                    if !d.complete(t).map_err(&dev_err)? {
                        break;
                    }
                    downloads.pop_front();
                    downloaded += 1;
                    progressed = true;
                }
            }
            let ready = if downloaded < initial {
                downloaded
            } else {
                initial + released
            };

            while let Some(send) = send
                .as_mut()
                .filter(|_| sends_posted < ready && sends_inflight.len() < window)
            {
                let (t, k) = (send_cur.t, send_cur.k);
                let (off, len) = ch.segment(send_chunk(t), k);
                let p = at(plan.send_from(t, off), len)? as *const u8;
                // SAFETY: the plan guarantees the segment is final for this step and is not
                // written while the send is in flight.
                let id = unsafe { send.isend(regs.find(p, len * esize), p, len * esize, tag) }
                    .map_err(transport_err(right, "sending to"))?;
                sends_inflight.push_back(id);
                sends_posted += 1;
                send_cur.advance(send_chunk, ch, steps);
                progressed = true;
            }
            while let (Some(&id), Some(send)) = (sends_inflight.front(), send.as_mut()) {
                match send.test(id).map_err(transport_err(right, "sending to"))? {
                    Some(_) => {
                        sends_inflight.pop_front();
                        sends_done += 1;
                        progressed = true;
                    }
                    None => break,
                }
            }

            while let Some(recv) = recv
                .as_mut()
                .filter(|_| recvs_posted < total_recvs && recvs_inflight.len() < window)
            {
                let (t, k) = (recv_cur.t, recv_cur.k);
                let (off, len) = ch.segment(recv_chunk(t), k);
                let slot = recvs_posted % window;
                let p = if plan.reduces(t) {
                    stage.wrapping_add(slot * ch.seg) as *const T
                } else {
                    at(plan.recv_into(t, off), len)?
                } as *mut u8;
                // SAFETY: a staging slot is free (at most `window` receives are in flight and
                // they complete in order); an in-place target is written by nobody else until
                // this receive completes.
                let id = unsafe { recv.irecv(regs.find(p, len * esize), p, len * esize, tag) }
                    .map_err(transport_err(left, "receiving from"))?;
                recvs_inflight.push_back(PendingRecv {
                    id,
                    t,
                    k,
                    slot,
                    ticket: None,
                });
                recvs_posted += 1;
                recv_cur.advance(recv_chunk, ch, steps);
                progressed = true;
            }
            while let (Some(p), Some(recv)) = (recvs_inflight.front_mut(), recv.as_mut()) {
                let (off, len) = ch.segment(recv_chunk(p.t), p.k);
                if let Some(ticket) = p.ticket {
                    // Reduced on the device: the slot and the forward wait for it.
                    let d = dev.as_deref_mut().ok_or_else(|| no_device(r, name))?;
                    if !d.complete(ticket).map_err(&dev_err)? {
                        break;
                    }
                } else {
                    let got = recv
                        .test(p.id)
                        .map_err(transport_err(left, "receiving from"))?;
                    let Some(got) = got else { break };
                    if got != len * esize {
                        return Err(CommError::short_message(r, name, left, got, len * esize));
                    }
                    let out_p = plan.reduce_out(p.t, off);
                    let in_p = plan.reduce_in(p.t, off);
                    let staged_p = stage.wrapping_add(p.slot * ch.seg);
                    let avg_over = (op == ReduceOp::Avg && plan.is_final(p.t)).then_some(n);
                    match dev.as_deref_mut() {
                        Some(d) if direct && plan.reduces(p.t) => {
                            let (o, i) = (at(out_p, len)? as u64, at(in_p, len)? as u64);
                            let tk = d
                                .reduce_on_device(
                                    o,
                                    i,
                                    staged_p as u64,
                                    len,
                                    T::DTYPE,
                                    op,
                                    avg_over,
                                )
                                .map_err(&dev_err)?;
                            p.ticket = Some(tk);
                            progressed = true;
                            continue;
                        }
                        // Direct: final data arrived in device memory itself.
                        Some(_) if direct => {}
                        Some(d) if plan.reduces(p.t) => {
                            let job = Reduce {
                                out: out_p as *mut u8,
                                mine: in_p as *const u8,
                                staged: staged_p as *const u8,
                                elems: len,
                                dtype: T::DTYPE,
                                op,
                                avg_over,
                                download: plan.releases_send(p.t),
                            };
                            p.ticket = Some(d.reduce(job).map_err(&dev_err)?);
                            progressed = true;
                            continue;
                        }
                        Some(d) => {
                            // Final data arrived in the twin: the device gets it while it
                            // travels on (the call syncs before it returns).
                            let at = plan.recv_into(p.t, off) as *const u8;
                            d.upload(at, len * esize).map_err(&dev_err)?;
                        }
                        None if plan.reduces(p.t) => {
                            // SAFETY: the staging slot, the local contribution and the
                            // output segment are valid for `len` elements and touched by no
                            // in-flight request; output and input are either identical or
                            // disjoint.
                            let staged = std::slice::from_raw_parts(staged_p, len);
                            let out = std::slice::from_raw_parts_mut(out_p, len);
                            if std::ptr::eq(out_p as *const T, in_p) {
                                reduce_inplace_par(op, out, staged, pool.as_deref());
                            } else {
                                let mine = std::slice::from_raw_parts(in_p, len);
                                reduce_into_par(op, out, mine, staged, pool.as_deref());
                            }
                            if avg_over.is_some() {
                                finish_avg(out, n);
                            }
                        }
                        None => {}
                    }
                }
                if plan.releases_send(p.t) {
                    released += 1;
                }
                recvs_inflight.pop_front();
                recvs_done += 1;
                progressed = true;
            }

            let device_busy =
                !downloads.is_empty() || recvs_inflight.front().is_some_and(|p| p.ticket.is_some());
            if progressed {
                waiter.progressed();
            } else if waiter.idle(comm, || {
                if device_busy {
                    (r, format!("waiting for the device ({name} call {tag}, {recvs_done}/{total_recvs} segments received)"))
                } else if recvs_done < total_recvs {
                    (left, format!("waiting for data from rank {left} ({name} call {tag}, {recvs_done}/{total_recvs} segments received)"))
                } else {
                    (right, format!("waiting for rank {right} to take data ({name} call {tag}, {sends_done}/{total_sends} segments sent)"))
                }
            })? {
                if device_busy {
                    // The device signals nothing a poll(2) could wait on.
                    std::thread::yield_now();
                } else {
                    waiter.sleep_pair(
                        recv.as_deref_mut().filter(|_| recvs_done < total_recvs),
                        send.as_deref_mut().filter(|_| !sends_inflight.is_empty()),
                    );
                }
            }
        }
        Ok(())
    })();

    if let Some(s) = send {
        comm.put_send(right, channel, s);
    }
    if let Some(c) = recv {
        comm.put_recv(left, channel, c);
    }
    regs.release(comm);
    result
}

struct AllReducePlan<T> {
    n: usize,
    r: usize,
    src: *const T,
    dst: *mut T,
    count: usize,
}

impl<T> RingPlan<T> for AllReducePlan<T> {
    ring_neighbours!();
    fn steps(&self) -> usize {
        2 * (self.n - 1)
    }
    fn send_chunk(&self, t: usize) -> usize {
        let n = self.n;
        if t < n - 1 {
            (self.r + n - t) % n
        } else {
            (self.r + 1 + n - (t - (n - 1))) % n
        }
    }
    fn recv_chunk(&self, t: usize) -> usize {
        let n = self.n;
        if t < n - 1 {
            (self.r + 2 * n - t - 1) % n
        } else {
            (self.r + n - (t - (n - 1))) % n
        }
    }
    fn reduces(&self, t: usize) -> bool {
        t < self.n - 1
    }
    fn is_final(&self, t: usize) -> bool {
        t == self.n - 2
    }
    fn send_from(&self, t: usize, off: usize) -> *const T {
        // Step 0 sends our own input; later steps forward what we reduced or received.
        unsafe {
            if t == 0 {
                self.src.add(off)
            } else {
                self.dst.add(off) as *const T
            }
        }
    }
    fn recv_into(&self, _t: usize, off: usize) -> *mut T {
        unsafe { self.dst.add(off) }
    }
    fn reduce_in(&self, _t: usize, off: usize) -> *const T {
        unsafe { self.src.add(off) }
    }
    fn reduce_out(&self, _t: usize, off: usize) -> *mut T {
        unsafe { self.dst.add(off) }
    }
    fn regions(&self) -> Vec<(*const T, usize)> {
        vec![(self.src, self.count), (self.dst as *const T, self.count)]
    }
}

/// # Safety
/// `src` and `dst` valid for `count` elements (possibly equal: in place).
pub(crate) unsafe fn all_reduce_raw<T: Element>(
    comm: &mut Communicator,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let n = comm.size();
    if n == 1 || count == 0 {
        comm.next_tag();
        let bytes = count * std::mem::size_of::<T>();
        return offload::local_copy(comm, dst as *mut u8, src as *const u8, bytes, "all_reduce");
    }
    let ch = Chunks {
        base: count / n,
        rem: count % n,
        seg: pipeline_segment::<T>(comm, count.div_ceil(n)),
    };
    let plan = AllReducePlan {
        n,
        r: comm.rank(),
        src,
        dst,
        count,
    };
    run_ring(comm, &plan, &ch, op, 0, "all_reduce")
}

struct ReduceScatterPlan<T> {
    n: usize,
    r: usize,
    rc: usize,
    src: *const T,
    dst: *mut T,
    /// Partial sums of chunks other than ours, `n × rc` elements, indexed like `src`.
    acc: *mut T,
}

impl<T> RingPlan<T> for ReduceScatterPlan<T> {
    ring_neighbours!();
    fn steps(&self) -> usize {
        self.n - 1
    }
    // Shifted by one from AllReduce so that rank r ends up owning chunk r.
    fn send_chunk(&self, t: usize) -> usize {
        (self.r + 2 * self.n - t - 1) % self.n
    }
    fn recv_chunk(&self, t: usize) -> usize {
        (self.r + 2 * self.n - t - 2) % self.n
    }
    fn reduces(&self, _t: usize) -> bool {
        true
    }
    fn is_final(&self, t: usize) -> bool {
        t == self.n - 2
    }
    fn send_from(&self, t: usize, off: usize) -> *const T {
        unsafe {
            if t == 0 {
                self.src.add(off)
            } else {
                self.acc.add(off) as *const T
            }
        }
    }
    fn recv_into(&self, _t: usize, off: usize) -> *mut T {
        unsafe { self.acc.add(off) }
    }
    fn reduce_in(&self, _t: usize, off: usize) -> *const T {
        unsafe { self.src.add(off) }
    }
    fn reduce_out(&self, t: usize, off: usize) -> *mut T {
        unsafe {
            if self.is_final(t) {
                self.dst.add(off - self.r * self.rc)
            } else {
                self.acc.add(off)
            }
        }
    }
    fn regions(&self) -> Vec<(*const T, usize)> {
        vec![
            (self.src, self.n * self.rc),
            (self.dst as *const T, self.rc),
            (self.acc as *const T, self.n * self.rc),
        ]
    }
}

/// # Safety
/// `src` valid for `n × rc` elements, `dst` for `rc` (in place: `dst == src + rank × rc`).
pub(crate) unsafe fn reduce_scatter_raw<T: Element>(
    comm: &mut Communicator,
    src: *const T,
    dst: *mut T,
    rc: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let n = comm.size();
    let r = comm.rank();
    if n == 1 || rc == 0 {
        comm.next_tag();
        let mine = src.add(r * rc) as *const u8;
        let bytes = rc * std::mem::size_of::<T>();
        return offload::local_copy(comm, dst as *mut u8, mine, bytes, "reduce_scatter");
    }
    let esize = std::mem::size_of::<T>();
    let near = [
        (src as *const u8, n * rc * esize),
        (dst as *const u8, rc * esize),
    ];
    let acc = match offload::scratch_near(comm, n * rc * esize, &near, "reduce_scatter")? {
        Some(p) => p as *mut T,
        None => scratch::<T>(comm, n * rc)?,
    };
    let ch = Chunks {
        base: rc,
        rem: 0,
        seg: pipeline_segment::<T>(comm, rc),
    };
    let plan = ReduceScatterPlan {
        n,
        r,
        rc,
        src,
        dst,
        acc,
    };
    run_ring(comm, &plan, &ch, op, 0, "reduce_scatter")
}

struct AllGatherPlan<T> {
    n: usize,
    r: usize,
    sc: usize,
    dst: *mut T,
}

impl<T> RingPlan<T> for AllGatherPlan<T> {
    ring_neighbours!();
    fn steps(&self) -> usize {
        self.n - 1
    }
    fn send_chunk(&self, t: usize) -> usize {
        (self.r + self.n - t) % self.n
    }
    fn recv_chunk(&self, t: usize) -> usize {
        (self.r + 2 * self.n - t - 1) % self.n
    }
    fn reduces(&self, _t: usize) -> bool {
        false
    }
    fn is_final(&self, _t: usize) -> bool {
        false
    }
    fn send_from(&self, _t: usize, off: usize) -> *const T {
        unsafe { self.dst.add(off) as *const T }
    }
    fn recv_into(&self, _t: usize, off: usize) -> *mut T {
        unsafe { self.dst.add(off) }
    }
    fn reduce_in(&self, _t: usize, off: usize) -> *const T {
        unsafe { self.dst.add(off) as *const T }
    }
    fn reduce_out(&self, _t: usize, off: usize) -> *mut T {
        unsafe { self.dst.add(off) }
    }
    fn regions(&self) -> Vec<(*const T, usize)> {
        vec![(self.dst as *const T, self.n * self.sc)]
    }
}

/// # Safety
/// `src` valid for `sc` elements, `dst` for `n × sc` (in place: `src == dst + rank × sc`).
pub(crate) unsafe fn all_gather_raw<T: Element>(
    comm: &mut Communicator,
    src: *const T,
    dst: *mut T,
    sc: usize,
) -> Result<(), CommError> {
    let n = comm.size();
    let r = comm.rank();
    let mine = dst.add(r * sc);
    let bytes = sc * std::mem::size_of::<T>();
    offload::local_copy(comm, mine as *mut u8, src as *const u8, bytes, "all_gather")?;
    if n == 1 || sc == 0 {
        comm.next_tag();
        return Ok(());
    }
    let ch = Chunks {
        base: sc,
        rem: 0,
        seg: pipeline_segment::<T>(comm, sc),
    };
    let plan = AllGatherPlan { n, r, sc, dst };
    run_ring(comm, &plan, &ch, ReduceOp::Sum, 0, "all_gather")
}

/// AllReduce a few control values (timings, error counts) over the same connections, so the
/// harness needs no second communication channel. Recursive doubling: these are a few bytes,
/// and the harness's barrier and timing exchanges should cost as little as possible.
pub fn all_reduce_values<T: Element>(
    comm: &mut Communicator,
    values: &mut [T],
    op: ReduceOp,
) -> Result<(), CommError> {
    let count = values.len();
    // SAFETY: a slice of plain numbers viewed as bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            values.as_mut_ptr() as *mut u8,
            std::mem::size_of_val(values),
        )
    };
    crate::rd::rd_all_reduce(comm, Data::InPlace(bytes), count, T::DTYPE, op)
}

/// A barrier: returns once every rank has entered it.
pub fn barrier(comm: &mut Communicator) -> Result<(), CommError> {
    let mut v = [0u8; 1];
    all_reduce_values(comm, &mut v, ReduceOp::Sum)
}
