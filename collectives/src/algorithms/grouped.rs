//! Collectives made of grouped point-to-point transfers (NCCL's `ncclGroupStart` + sends and
//! receives): AlltoAll, AlltoAllv, Scatter, Gather, SendRecv and the HyperCube AllGather.
//!
//! `exchange` posts a whole group at once and progresses every request together, so a rank
//! never waits for one peer while another could make progress, and a group that pairs
//! sends and receives in any order cannot deadlock.

use crate::algorithms::peer::{self, Call, Kind};
use crate::dtype::{DataType, ReduceOp};
use crate::engine::data::{bytes_of, Data};
use crate::engine::space::{host_only, MemorySpace};
use crate::engine::workspace::scratch;
use crate::engine::{self, Arrival, Dir, In, Key, Link, Out, Progress, Regions, Schedule};
use crate::error::CommError;
use crate::link::Communicator;
use smallvec::SmallVec;

/// One transfer of a group. Pointers must stay valid until the group completes.
#[derive(Clone, Copy)]
pub(crate) enum Xfer {
    Send {
        peer: usize,
        ptr: *const u8,
        len: usize,
    },
    Recv {
        peer: usize,
        ptr: *mut u8,
        len: usize,
    },
}

/// A group as a schedule: one connection per peer and direction, every transfer ready at once.
struct Group<'x> {
    xfers: &'x [Xfer],
    regions: &'x [(*const u8, usize)],
    name: &'static str,
    /// (Inline while small: a sendrecv allocates nothing.)
    links: SmallVec<[Link; 2]>,
    /// Per link, the indices of its transfers in `xfers`, in order, and how many are handed.
    order: SmallVec<[(SmallVec<[usize; 2]>, usize); 2]>,
}

impl Group<'_> {
    fn next(&mut self, link: usize) -> Option<usize> {
        let (list, handed) = &mut self.order[link];
        let i = *list.get(*handed)?;
        *handed += 1;
        Some(i)
    }
}

impl Schedule<u8> for Group<'_> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn links(&self) -> &[Link] {
        &self.links
    }
    fn slot_elems(&self) -> usize {
        0
    }
    fn regions(&self) -> Regions<u8> {
        self.regions.iter().copied().collect()
    }
    fn next_send(&mut self, link: usize, _at: &Progress) -> Option<Out<u8>> {
        match self.xfers[self.next(link)?] {
            Xfer::Send { ptr, len, .. } => Some(Out {
                from: ptr,
                len,
                own: false,
            }),
            Xfer::Recv { .. } => None,
        }
    }
    fn next_recv(&mut self, link: usize, _at: &Progress) -> Option<In<u8>> {
        match self.xfers[self.next(link)?] {
            Xfer::Recv { ptr, len, .. } => Some(In {
                into: Some(ptr),
                len,
                key: (0, 0),
            }),
            Xfer::Send { .. } => None,
        }
    }
    fn arrived(&mut self, _link: usize, _key: Key) -> Arrival<u8> {
        Arrival::Landed
    }
}

/// Run a group of transfers to completion. Transfers to the same peer in the same direction
/// are delivered in the order given.
///
/// # Safety
/// Every pointer is valid for its length and lies in one of `regions`; no two receives
/// overlap and no send reads memory a receive writes.
pub(crate) unsafe fn exchange(
    comm: &mut Communicator,
    xfers: &[Xfer],
    regions: &[(*const u8, usize)],
    channel: u32,
    name: &'static str,
) -> Result<(), CommError> {
    let mut schedule = Group {
        xfers,
        regions,
        name,
        links: SmallVec::new(),
        order: SmallVec::new(),
    };
    for (i, x) in xfers.iter().enumerate() {
        let (peer, dir) = match *x {
            Xfer::Send { peer, .. } => (peer, Dir::Send),
            Xfer::Recv { peer, .. } => (peer, Dir::Recv),
        };
        let l = match schedule
            .links
            .iter()
            .position(|l| l.peer == peer && l.dir == dir)
        {
            Some(l) => l,
            None => {
                schedule.links.push(Link {
                    peer,
                    channel,
                    dir,
                    messages: 0,
                    staged: None,
                    label: "",
                });
                schedule.order.push((SmallVec::new(), 0));
                schedule.links.len() - 1
            }
        };
        schedule.links[l].messages += 1;
        schedule.order[l].0.push(i);
    }
    // Point-to-point groups move host memory only: device data is staged around them.
    engine::run(comm, &mut schedule, ReduceOp::Sum, &mut MemorySpace::Host)
}

/// AlltoAll: block j of every rank's input (`count` elements each) goes to rank j, landing
/// in block `rank` of rank j's output. In place, one buffer is both.
pub fn alltoall(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
) -> Result<(), CommError> {
    let Some(data) = peer::offer(
        comm,
        data,
        Call::moving(Kind::Alltoall, "alltoall", count, dtype),
    )?
    else {
        return Ok(());
    };
    host_only(comm, data, "alltoall", |comm, data| {
        alltoall_host(comm, data, count, dtype)
    })
}

/// AlltoAll with a size per peer (MPI's `Alltoallv`, nccl-tests' `alltoallv_perf`): this
/// rank sends `send_bytes[j]` bytes to rank `j` and receives `recv_bytes[j]` from it, blocks
/// laid out back to back in rank order on both sides. Every rank's `send_bytes[j]` must equal
/// rank `j`'s `recv_bytes[rank]`, or the transfer fails with a length mismatch.
pub fn alltoallv(
    comm: &mut Communicator,
    data: Data<'_>,
    send_bytes: &[usize],
    recv_bytes: &[usize],
) -> Result<(), CommError> {
    check_sizes(comm, send_bytes, recv_bytes)?;
    let Some(data) = peer::offer(comm, data, Call::varying(send_bytes, recv_bytes))? else {
        return Ok(());
    };
    host_only(comm, data, "alltoallv", |comm, data| {
        alltoallv_host(comm, data, send_bytes, recv_bytes)
    })
}

/// Where each of AlltoAllv's blocks starts, blocks back to back in rank order, and after
/// them the total: one more entry than `sizes`.
pub(crate) fn offsets(sizes: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(sizes.iter().scan(0, |at, &s| {
            *at += s;
            Some(*at)
        }))
        .collect()
}

/// A rank's own sizes: one per rank, and what it sends itself what it expects.
fn check_sizes(
    comm: &Communicator,
    send_bytes: &[usize],
    recv_bytes: &[usize],
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    if send_bytes.len() != n || recv_bytes.len() != n {
        return Err(CommError::Invalid(format!(
            "rank {r}: alltoallv: {} send and {} receive sizes for {n} ranks",
            send_bytes.len(),
            recv_bytes.len()
        )));
    }
    if send_bytes[r] != recv_bytes[r] {
        return Err(CommError::Invalid(format!(
            "rank {r}: alltoallv: sends {} bytes to itself but expects {}",
            send_bytes[r], recv_bytes[r]
        )));
    }
    Ok(())
}

fn alltoallv_host(
    comm: &mut Communicator,
    data: Data<'_>,
    send_bytes: &[usize],
    recv_bytes: &[usize],
) -> Result<(), CommError> {
    // (Sizes checked by the caller: `alltoallv`, or AlltoAll's equal blocks.)
    let (n, r) = (comm.size(), comm.rank());
    let (soff, roff) = (offsets(send_bytes), offsets(recv_bytes));
    let (stotal, rtotal) = (soff[n], roff[n]);
    // Bytes need no element type: any sizes are whole.
    let b = data.bufs(r, "alltoallv", stotal, rtotal, DataType::Uint8, (0, 0))?;
    let mut src = b.src;
    if std::ptr::eq(src, b.dst) && stotal > 0 {
        // In place: send from a copy, since receives overwrite blocks not yet sent.
        let copy = scratch::<u8>(comm, stotal)?;
        // SAFETY: distinct allocations of at least `stotal` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, copy, stotal) };
        src = copy;
    }
    // SAFETY: every block lies inside the checked buffers (offsets are prefix sums of the
    // sizes whose totals were checked); receive blocks are disjoint.
    unsafe {
        if send_bytes[r] > 0 {
            std::ptr::copy_nonoverlapping(src.add(soff[r]), b.dst.add(roff[r]), send_bytes[r]);
        }
        let mut xfers = Vec::with_capacity(2 * n);
        for i in 1..n {
            let to = (r + i) % n;
            let from = (r + n - i) % n;
            xfers.push(Xfer::Send {
                peer: to,
                ptr: src.add(soff[to]),
                len: send_bytes[to],
            });
            xfers.push(Xfer::Recv {
                peer: from,
                ptr: b.dst.add(roff[from]),
                len: recv_bytes[from],
            });
        }
        exchange(
            comm,
            &xfers,
            &[(src, stotal), (b.dst as *const u8, rtotal)],
            0,
            "alltoallv",
        )
    }
}

fn alltoall_host(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
) -> Result<(), CommError> {
    // AlltoAll is AlltoAllv with every block the same size.
    let block = bytes_of(count, dtype)?;
    let sizes = vec![block; comm.size()];
    alltoallv_host(comm, data, &sizes, &sizes)
}

/// One block of a [`staged_blocks`] exchange: the peer, and the offset and length in this
/// rank's input (a send) or output (a receive).
pub(crate) type Block = (usize, usize, usize);

/// Sends and receives `blocks` of a call's buffers (`src`, `sb` bytes; `dst`, `rb` bytes;
/// one buffer in place) over the communicator, staging through the twins of those blocks
/// alone: the hierarchical paths move the rest GPU to GPU themselves, so nothing else of
/// the buffers is copied or touched.
pub(crate) fn staged_blocks(
    comm: &mut Communicator,
    data: Data<'_>,
    (sb, rb): (usize, usize),
    (sends, recvs): (&[Block], &[Block]),
    name: &'static str,
) -> Result<(), CommError> {
    let r = comm.rank();
    let b = data.bufs(r, name, sb, rb, DataType::Uint8, (0, 0))?;
    let (src, dst, mut space) = (b.src, b.dst, b.space);
    let outside = |blocks: &[Block], size: usize| blocks.iter().find(|b| b.1 + b.2 > size).copied();
    if let Some((p, at, len)) = outside(sends, sb).or(outside(recvs, rb)) {
        return Err(CommError::Invalid(format!(
            "rank {r}: {name}: a block of {len} bytes at {at} for rank {p} is outside the buffers"
        )));
    }
    // SAFETY: each block was checked against its buffer's size above.
    let (ins, outs): (Vec<_>, Vec<_>) = unsafe {
        (
            sends
                .iter()
                .map(|&(_, at, len)| (src.add(at), len))
                .collect(),
            recvs
                .iter()
                .map(|&(_, at, len)| (dst.add(at), len))
                .collect(),
        )
    };
    space.around(comm, name, &ins, &outs, |comm| {
        let mut from = src;
        // SAFETY: as above; in place, the blocks sent are read from a copy, since receives
        // may overwrite blocks not yet sent.
        unsafe {
            if std::ptr::eq(src, dst) && !sends.is_empty() {
                let copy = scratch::<u8>(comm, sb)?;
                for &(_, at, len) in sends {
                    std::ptr::copy_nonoverlapping(src.add(at), copy.add(at), len);
                }
                from = copy;
            }
            let xfers: Vec<Xfer> = sends
                .iter()
                .map(|&(peer, at, len)| Xfer::Send {
                    peer,
                    ptr: from.add(at),
                    len,
                })
                .chain(recvs.iter().map(|&(peer, at, len)| Xfer::Recv {
                    peer,
                    ptr: dst.add(at),
                    len,
                }))
                .collect();
            let regions = [(from, sb), (dst as *const u8, rb)];
            exchange(comm, &xfers, &regions, 0, name)
        }
    })
}

/// AlltoAllv's blocks to and from the ranks outside `local` (this rank's host's ranks, whose
/// blocks the hierarchical AlltoAll and AlltoAllv move GPU to GPU themselves), through
/// [`staged_blocks`]. Sizes as [`alltoallv`]'s, already checked.
pub(crate) fn alltoallv_remote(
    comm: &mut Communicator,
    data: Data<'_>,
    (send_bytes, recv_bytes): (&[usize], &[usize]),
    local: std::ops::Range<usize>,
    name: &'static str,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    let (soff, roff) = (offsets(send_bytes), offsets(recv_bytes));
    // In ring order from this rank, as the flat AlltoAllv posts them.
    let sends: Vec<Block> = (1..n)
        .map(|i| (r + i) % n)
        .filter(|to| !local.contains(to))
        .map(|to| (to, soff[to], send_bytes[to]))
        .collect();
    let recvs: Vec<Block> = (1..n)
        .map(|i| (r + n - i) % n)
        .filter(|from| !local.contains(from))
        .map(|from| (from, roff[from], recv_bytes[from]))
        .collect();
    staged_blocks(comm, data, (soff[n], roff[n]), (&sends, &recvs), name)
}

/// Scatter: block j of `root`'s input (`count` elements each) goes to rank j. In place, the
/// buffer is the input and rank r's output is its block r.
pub fn scatter(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    root: usize,
) -> Result<(), CommError> {
    let Some(data) = peer::offer(
        comm,
        data,
        Call::moving(Kind::Scatter, "scatter", count, dtype).at(root),
    )?
    else {
        return Ok(());
    };
    host_only(comm, data, "scatter", |comm, data| {
        scatter_host(comm, data, count, dtype, root)
    })
}

fn scatter_host(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    root: usize,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    if root >= n {
        return Err(CommError::Invalid(format!(
            "scatter: root {root} is not a rank of {n}"
        )));
    }
    let block = bytes_of(count, dtype)?;
    // Only the root reads a full input; the others need room for their block only.
    let send_bytes = if r == root { block * n } else { 0 };
    let b = data.bufs(r, "scatter", send_bytes, block, dtype, (0, r * block))?;
    let mut xfers = Vec::new();
    // SAFETY: blocks are inside the checked buffers.
    unsafe {
        if r == root {
            if block > 0 && !std::ptr::eq(b.src.add(r * block), b.dst) {
                std::ptr::copy_nonoverlapping(b.src.add(r * block), b.dst, block);
            }
            for i in 1..n {
                let to = (r + i) % n;
                xfers.push(Xfer::Send {
                    peer: to,
                    ptr: b.src.add(to * block),
                    len: block,
                });
            }
        } else {
            xfers.push(Xfer::Recv {
                peer: root,
                ptr: b.dst,
                len: block,
            });
        }
        exchange(
            comm,
            &xfers,
            &[(b.src, send_bytes), (b.dst as *const u8, block)],
            0,
            "scatter",
        )
    }
}

/// Gather: every rank's `count` elements land in block `rank` of `root`'s output. In place,
/// the buffer is the output and rank r's input is its block r.
pub fn gather(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    root: usize,
) -> Result<(), CommError> {
    let Some(data) = peer::offer(
        comm,
        data,
        Call::moving(Kind::Gather, "gather", count, dtype).at(root),
    )?
    else {
        return Ok(());
    };
    host_only(comm, data, "gather", |comm, data| {
        gather_host(comm, data, count, dtype, root)
    })
}

fn gather_host(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    root: usize,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    if root >= n {
        return Err(CommError::Invalid(format!(
            "gather: root {root} is not a rank of {n}"
        )));
    }
    let block = bytes_of(count, dtype)?;
    let recv_bytes = if r == root { block * n } else { 0 };
    let b = data.bufs(r, "gather", block, recv_bytes, dtype, (r * block, 0))?;
    let mut xfers = Vec::new();
    // SAFETY: blocks are inside the checked buffers; receives target disjoint blocks.
    unsafe {
        if r == root {
            if block > 0 && !std::ptr::eq(b.src, b.dst.add(r * block)) {
                std::ptr::copy_nonoverlapping(b.src, b.dst.add(r * block), block);
            }
            for i in 1..n {
                let from = (r + i) % n;
                xfers.push(Xfer::Recv {
                    peer: from,
                    ptr: b.dst.add(from * block),
                    len: block,
                });
            }
        } else {
            xfers.push(Xfer::Send {
                peer: root,
                ptr: b.src,
                len: block,
            });
        }
        exchange(
            comm,
            &xfers,
            &[(b.src, block), (b.dst as *const u8, recv_bytes)],
            0,
            "gather",
        )
    }
}

/// SendRecv: send `count` elements to rank+1 and receive as many from rank-1 (a ring shift).
pub fn sendrecv(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
) -> Result<(), CommError> {
    let Some(data) = peer::offer(
        comm,
        data,
        Call::moving(Kind::SendRecv, "sendrecv", count, dtype),
    )?
    else {
        return Ok(());
    };
    host_only(comm, data, "sendrecv", |comm, data| {
        sendrecv_host(comm, data, count, dtype)
    })
}

fn sendrecv_host(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    let bytes = bytes_of(count, dtype)?;
    let b = data.bufs(r, "sendrecv", bytes, bytes, dtype, (0, 0))?;
    let mut src = b.src;
    if std::ptr::eq(src, b.dst) && bytes > 0 && n > 1 {
        let copy = scratch::<u8>(comm, bytes)?;
        // SAFETY: distinct allocations of `bytes` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, copy, bytes) };
        src = copy;
    }
    if n == 1 {
        comm.next_tag();
        if !std::ptr::eq(src, b.dst) && bytes > 0 {
            // SAFETY: distinct checked buffers.
            unsafe { std::ptr::copy_nonoverlapping(src, b.dst, bytes) };
        }
        return Ok(());
    }
    let xfers = [
        Xfer::Send {
            peer: (r + 1) % n,
            ptr: src,
            len: bytes,
        },
        Xfer::Recv {
            peer: (r + n - 1) % n,
            ptr: b.dst,
            len: bytes,
        },
    ];
    // SAFETY: checked buffers (the send reads a copy when in place).
    unsafe {
        exchange(
            comm,
            &xfers,
            &[(src, bytes), (b.dst as *const u8, bytes)],
            0,
            "sendrecv",
        )
    }
}

/// HyperCube AllGather (recursive doubling): in round i each rank swaps everything it has
/// gathered so far with rank `r ^ 2^i`. Needs a power-of-two rank count.
pub fn hypercube(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
) -> Result<(), CommError> {
    let Some(data) = peer::offer(
        comm,
        data,
        Call::moving(Kind::HyperCube, "hypercube", count, dtype),
    )?
    else {
        return Ok(());
    };
    host_only(comm, data, "hypercube", |comm, data| {
        hypercube_host(comm, data, count, dtype)
    })
}

fn hypercube_host(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    if !n.is_power_of_two() {
        return Err(CommError::Invalid(format!(
            "hypercube needs a power-of-two number of ranks, not {n}"
        )));
    }
    let block = bytes_of(count, dtype)?;
    let b = data.bufs(r, "hypercube", block, block * n, dtype, (r * block, 0))?;
    // SAFETY: blocks are inside the checked buffers; each round sends and receives disjoint
    // halves of the output.
    unsafe {
        if block > 0 && !std::ptr::eq(b.src, b.dst.add(r * block)) {
            std::ptr::copy_nonoverlapping(b.src, b.dst.add(r * block), block);
        }
        let mut mask = 1;
        while mask < n {
            let have = r & !(mask - 1);
            let get = have ^ mask;
            let xfers = [
                Xfer::Send {
                    peer: r ^ mask,
                    ptr: b.dst.add(have * block),
                    len: block * mask,
                },
                Xfer::Recv {
                    peer: r ^ mask,
                    ptr: b.dst.add(get * block),
                    len: block * mask,
                },
            ];
            exchange(
                comm,
                &xfers,
                &[(b.dst as *const u8, block * n)],
                0,
                "hypercube",
            )?;
            mask <<= 1;
        }
        if n == 1 {
            comm.next_tag();
        }
    }
    Ok(())
}
