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

use crate::algorithms::peer::{self, Call, Kind};
use crate::dtype::{DataType, ReduceOp};
use crate::element::Element;
pub use crate::engine::data::Data;
use crate::engine::data::{bytes_of, pipeline_segment};
use crate::engine::space::MemorySpace;
use crate::engine::workspace::{premultiplied, scratch};
use crate::engine::{self, Arrival, Dir, In, Key, Link, Out, Progress, Regions, Schedule};
use crate::error::CommError;
use crate::link::Communicator;
use crate::with_dtype;

/// AllReduce `count` elements of `dtype` with `op` across the communicator, leaving the
/// result on every rank.
pub fn all_reduce(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let Some(data) = peer::offer(
        comm,
        data,
        Call::reducing(Kind::AllReduce, "all_reduce", count, dtype, op),
    )?
    else {
        return Ok(());
    };
    let bytes = bytes_of(count, dtype)?;
    let mut b = data.bufs(comm.rank(), "all_reduce", bytes, bytes, dtype, (0, 0))?;
    let space = &mut b.space;
    with_dtype!(dtype, T => {
        // SAFETY: Data::bufs checked sizes and alignment; the borrows outlive the call.
        unsafe {
            let src = premultiplied(comm, space, op, b.src as *const T, count)?;
            all_reduce_raw::<T>(comm, space, src, b.dst as *mut T, count, op)
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
    let Some(data) = peer::offer(
        comm,
        data,
        Call::reducing(Kind::ReduceScatter, "reduce_scatter", recv_count, dtype, op),
    )?
    else {
        return Ok(());
    };
    let n = comm.size();
    let rb = bytes_of(recv_count, dtype)?;
    let sb = bytes_of(recv_count * n, dtype)?;
    let mut b = data.bufs(
        comm.rank(),
        "reduce_scatter",
        sb,
        rb,
        dtype,
        (0, comm.rank() * rb),
    )?;
    let space = &mut b.space;
    with_dtype!(dtype, T => {
        // SAFETY: as in all_reduce.
        unsafe {
            let src = premultiplied(comm, space, op, b.src as *const T, recv_count * n)?;
            reduce_scatter_raw::<T>(comm, space, src, b.dst as *mut T, recv_count, op)
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
    let Some(data) = peer::offer(
        comm,
        data,
        Call::moving(Kind::AllGather, "all_gather", send_count, dtype),
    )?
    else {
        return Ok(());
    };
    let n = comm.size();
    let sb = bytes_of(send_count, dtype)?;
    let rb = bytes_of(send_count * n, dtype)?;
    let mut b = data.bufs(
        comm.rank(),
        "all_gather",
        sb,
        rb,
        dtype,
        (comm.rank() * sb, 0),
    )?;
    let space = &mut b.space;
    with_dtype!(dtype, T => {
        // SAFETY: as in all_reduce.
        unsafe { all_gather_raw::<T>(comm, space, b.src as *const T, b.dst as *mut T, send_count) }
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
pub(crate) trait RingSchedule<T> {
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
    fn regions(&self) -> Regions<T>;
    /// Who we receive from and send to; `None` at the ends of a chain.
    fn left(&self) -> Option<usize>;
    fn right(&self) -> Option<usize>;
    /// Sends that need no received data (our own input).
    fn initially_ready(&self, ch: &Chunks) -> usize;
    /// Whether processing a receive of step `t` releases the next send (the same segment,
    /// forwarded).
    fn releases_send(&self, t: usize) -> bool;
}

/// The ring-neighbour half of a [`RingSchedule`] for schedules that go round the whole ring.
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

/// A [`RingSchedule`] as the engine runs it: messages in (step, segment) order on the one
/// connection each way; the first `initial` sends read our own input, each later one
/// forwards the segment a processed receive completed.
struct RingRun<'p, T, P> {
    schedule: &'p P,
    ch: Chunks,
    n: usize,
    op: ReduceOp,
    name: &'static str,
    links: smallvec::SmallVec<[Link; 2]>,
    send_cur: Cursor,
    recv_cur: Cursor,
    initial: usize,
    sent: usize,
    released: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T, P: RingSchedule<T>> Schedule<T> for RingRun<'_, T, P> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn links(&self) -> &[Link] {
        &self.links
    }
    fn slot_elems(&self) -> usize {
        self.ch.seg
    }
    fn regions(&self) -> Regions<T> {
        self.schedule.regions()
    }
    fn next_send(&mut self, _link: usize, _at: &Progress) -> Option<Out<T>> {
        let (p, ch, steps) = (self.schedule, &self.ch, self.schedule.steps());
        if self.sent >= self.initial + self.released || self.send_cur.t >= steps {
            return None;
        }
        let (t, k) = (self.send_cur.t, self.send_cur.k);
        let (off, len) = ch.segment(p.send_chunk(t), k);
        let own = self.sent < self.initial;
        self.send_cur.advance(|t| p.send_chunk(t), ch, steps);
        self.sent += 1;
        Some(Out {
            from: p.send_from(t, off),
            len,
            own,
        })
    }
    fn next_recv(&mut self, _link: usize, _at: &Progress) -> Option<In<T>> {
        let (p, ch, steps) = (self.schedule, &self.ch, self.schedule.steps());
        let (t, k) = (self.recv_cur.t, self.recv_cur.k);
        let (off, len) = ch.segment(p.recv_chunk(t), k);
        self.recv_cur.advance(|t| p.recv_chunk(t), ch, steps);
        Some(In {
            into: (!p.reduces(t)).then(|| p.recv_into(t, off)),
            len,
            // (step, segment)
            key: (t, k),
        })
    }
    fn arrived(&mut self, _link: usize, (t, k): Key) -> Arrival<T> {
        let p = self.schedule;
        if !p.reduces(t) {
            return Arrival::Landed;
        }
        let (off, _) = self.ch.segment(p.recv_chunk(t), k);
        Arrival::Reduce {
            out: p.reduce_out(t, off),
            mine: p.reduce_in(t, off),
            avg_over: (self.op == ReduceOp::Avg && p.is_final(t)).then_some(self.n),
            travels_on: p.releases_send(t),
            theirs_first: false,
        }
    }
    fn processed(&mut self, _link: usize, (t, _): Key) {
        if self.schedule.releases_send(t) {
            self.released += 1;
        }
    }
}

/// Run a ring (or chain) schedule to completion on `channel`.
///
/// # Safety
/// Every pointer the schedule hands out must be valid for the segment it describes, and the schedule
/// must not make two in-flight requests write the same memory.
pub(crate) unsafe fn run_ring<T: Element, P: RingSchedule<T>>(
    comm: &mut Communicator,
    space: &mut MemorySpace,
    schedule: &P,
    ch: &Chunks,
    op: ReduceOp,
    channel: u32,
    name: &'static str,
) -> Result<(), CommError> {
    let steps = schedule.steps();
    let total = |chunk_of: &dyn Fn(usize) -> usize| -> usize {
        (0..steps).map(|t| ch.segments(chunk_of(t))).sum()
    };
    let mut links = smallvec::SmallVec::new();
    if let Some(peer) = schedule.right() {
        links.push(Link {
            peer,
            channel,
            dir: Dir::Send,
            messages: total(&|t| schedule.send_chunk(t)),
            staged: None,
            label: "",
        });
    }
    if let Some(peer) = schedule.left() {
        links.push(Link {
            peer,
            channel,
            dir: Dir::Recv,
            messages: total(&|t| schedule.recv_chunk(t)),
            staged: Some(0),
            label: "",
        });
    }
    let initial = if steps > 0 && schedule.right().is_some() {
        schedule.initially_ready(ch)
    } else {
        0
    };
    let mut run = RingRun {
        schedule,
        ch: *ch,
        n: comm.size(),
        op,
        name,
        links,
        send_cur: Cursor::start(|t| schedule.send_chunk(t), ch, steps),
        recv_cur: Cursor::start(|t| schedule.recv_chunk(t), ch, steps),
        initial,
        sent: 0,
        released: 0,
        _t: std::marker::PhantomData,
    };
    engine::run(comm, &mut run, op, space)
}

struct AllReduceSchedule<T> {
    n: usize,
    r: usize,
    src: *const T,
    dst: *mut T,
    count: usize,
}

impl<T> RingSchedule<T> for AllReduceSchedule<T> {
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
    fn regions(&self) -> Regions<T> {
        smallvec::smallvec![(self.src, self.count), (self.dst as *const T, self.count)]
    }
}

/// # Safety
/// `src` and `dst` valid for `count` elements (possibly equal: in place).
pub(crate) unsafe fn all_reduce_raw<T: Element>(
    comm: &mut Communicator,
    space: &mut MemorySpace,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let n = comm.size();
    if n == 1 || count == 0 {
        comm.next_tag();
        let bytes = count * std::mem::size_of::<T>();
        let r = comm.rank();
        return space.copy(r, dst as *mut u8, src as *const u8, bytes, "all_reduce");
    }
    let ch = Chunks {
        base: count / n,
        rem: count % n,
        seg: pipeline_segment::<T>(comm, count.div_ceil(n)),
    };
    let schedule = AllReduceSchedule {
        n,
        r: comm.rank(),
        src,
        dst,
        count,
    };
    run_ring(comm, space, &schedule, &ch, op, 0, "all_reduce")
}

struct ReduceScatterSchedule<T> {
    n: usize,
    r: usize,
    rc: usize,
    src: *const T,
    dst: *mut T,
    /// Partial sums of chunks other than ours, `n × rc` elements, indexed like `src`.
    acc: *mut T,
}

impl<T> RingSchedule<T> for ReduceScatterSchedule<T> {
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
    fn regions(&self) -> Regions<T> {
        smallvec::smallvec![
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
    space: &mut MemorySpace,
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
        return space.copy(r, dst as *mut u8, mine, bytes, "reduce_scatter");
    }
    let esize = std::mem::size_of::<T>();
    let acc = match space.scratch(r, n * rc * esize, "reduce_scatter")? {
        Some(p) => p as *mut T,
        None => scratch::<T>(comm, n * rc)?,
    };
    let ch = Chunks {
        base: rc,
        rem: 0,
        seg: pipeline_segment::<T>(comm, rc),
    };
    let schedule = ReduceScatterSchedule {
        n,
        r,
        rc,
        src,
        dst,
        acc,
    };
    run_ring(comm, space, &schedule, &ch, op, 0, "reduce_scatter")
}

struct AllGatherSchedule<T> {
    n: usize,
    r: usize,
    sc: usize,
    dst: *mut T,
}

impl<T> RingSchedule<T> for AllGatherSchedule<T> {
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
    fn regions(&self) -> Regions<T> {
        smallvec::smallvec![(self.dst as *const T, self.n * self.sc)]
    }
}

/// # Safety
/// `src` valid for `sc` elements, `dst` for `n × sc` (in place: `src == dst + rank × sc`).
pub(crate) unsafe fn all_gather_raw<T: Element>(
    comm: &mut Communicator,
    space: &mut MemorySpace,
    src: *const T,
    dst: *mut T,
    sc: usize,
) -> Result<(), CommError> {
    let n = comm.size();
    let r = comm.rank();
    let mine = dst.add(r * sc);
    let bytes = sc * std::mem::size_of::<T>();
    space.copy(r, mine as *mut u8, src as *const u8, bytes, "all_gather")?;
    if n == 1 || sc == 0 {
        comm.next_tag();
        return Ok(());
    }
    let ch = Chunks {
        base: sc,
        rem: 0,
        seg: pipeline_segment::<T>(comm, sc),
    };
    let schedule = AllGatherSchedule { n, r, sc, dst };
    run_ring(comm, space, &schedule, &ch, ReduceOp::Sum, 0, "all_gather")
}
