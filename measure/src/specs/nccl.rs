//! Each collective on NCCL's calls (`--engine nccl`), as nccl-tests' `*RunColl` drives them:
//! the reductions, broadcast and all-gather are NCCL's own collectives; alltoall, alltoallv,
//! scatter, gather, sendrecv and hypercube are grouped sends and receives. Buffers and
//! in-place offsets are the ones busbw's own engine uses for the same descriptor, so the
//! same data and the same checks apply to both engines.

use super::DataCtx;
use busbw_collectives::nccl::{Comm, NcclError, Stream};
use busbw_collectives::{DataType, ReduceOp};

/// NCCL's calls as the descriptors use them, on device addresses: [`Enqueue`] enqueues them
/// on a communicator and stream; a test can stand in for NCCL.
pub trait NcclOps {
    fn all_reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
    ) -> Result<(), NcclError>;
    fn reduce_scatter(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
    ) -> Result<(), NcclError>;
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), NcclError>;
    fn broadcast(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        root: usize,
    ) -> Result<(), NcclError>;
    fn all_gather(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
    ) -> Result<(), NcclError>;
    fn send(&mut self, buf: u64, count: usize, d: DataType, peer: usize) -> Result<(), NcclError>;
    fn recv(&mut self, buf: u64, count: usize, d: DataType, peer: usize) -> Result<(), NcclError>;
    /// The sends and receives `f` makes, launched together (`ncclGroupStart`/`End`).
    fn group(
        &mut self,
        f: &mut dyn FnMut(&mut dyn NcclOps) -> Result<(), NcclError>,
    ) -> Result<(), NcclError>;
}

/// NCCL's calls on a communicator, enqueued on a stream.
pub struct Enqueue<'c, 'a> {
    comm: &'c mut Comm<'a>,
    stream: Stream,
}

impl<'c, 'a> Enqueue<'c, 'a> {
    /// # Safety
    /// `stream` is a live stream of `comm`'s device, and every address later passed to
    /// the calls is memory of that device valid for the call's counts until the stream has
    /// run it (the descriptors' addresses lie inside the buffers the caller sized for the
    /// row).
    pub unsafe fn new(comm: &'c mut Comm<'a>, stream: Stream) -> Self {
        Enqueue { comm, stream }
    }
}

impl NcclOps for Enqueue<'_, '_> {
    fn all_reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
    ) -> Result<(), NcclError> {
        // SAFETY: `Enqueue::new`'s contract covers every address.
        unsafe { self.comm.all_reduce(send, recv, count, d, op, self.stream) }
    }
    fn reduce_scatter(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
    ) -> Result<(), NcclError> {
        // SAFETY: `Enqueue::new`'s contract covers every address.
        unsafe {
            self.comm
                .reduce_scatter(send, recv, count, d, op, self.stream)
        }
    }
    fn reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), NcclError> {
        // SAFETY: `Enqueue::new`'s contract covers every address.
        unsafe {
            self.comm
                .reduce(send, recv, count, d, op, root, self.stream)
        }
    }
    fn broadcast(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
        root: usize,
    ) -> Result<(), NcclError> {
        // SAFETY: `Enqueue::new`'s contract covers every address.
        unsafe { self.comm.broadcast(send, recv, count, d, root, self.stream) }
    }
    fn all_gather(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        d: DataType,
    ) -> Result<(), NcclError> {
        // SAFETY: `Enqueue::new`'s contract covers every address.
        unsafe { self.comm.all_gather(send, recv, count, d, self.stream) }
    }
    fn send(&mut self, buf: u64, count: usize, d: DataType, peer: usize) -> Result<(), NcclError> {
        // SAFETY: `Enqueue::new`'s contract covers every address.
        unsafe { self.comm.send(buf, count, d, peer, self.stream) }
    }
    fn recv(&mut self, buf: u64, count: usize, d: DataType, peer: usize) -> Result<(), NcclError> {
        // SAFETY: `Enqueue::new`'s contract covers every address.
        unsafe { self.comm.recv(buf, count, d, peer, self.stream) }
    }
    fn group(
        &mut self,
        f: &mut dyn FnMut(&mut dyn NcclOps) -> Result<(), NcclError>,
    ) -> Result<(), NcclError> {
        let stream = self.stream;
        self.comm.group(|comm| f(&mut Enqueue { comm, stream }))
    }
}

/// One call's buffers: device addresses of the send and receive data (in place only `recv`
/// is used, as by the own engine).
pub struct NcclCall<'o> {
    pub ops: &'o mut dyn NcclOps,
    pub send: u64,
    pub recv: u64,
}

/// Runs a descriptor's collective through NCCL.
pub type NcclFn = fn(call: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError>;

impl NcclCall<'_> {
    /// The input: the send buffer, or `at` bytes into the receive buffer in place.
    fn input(&self, ctx: &DataCtx, at: usize) -> u64 {
        if ctx.in_place {
            self.recv + at as u64
        } else {
            self.send
        }
    }

    /// The output: the receive buffer, at `at` bytes in place.
    fn output(&self, ctx: &DataCtx, at: usize) -> u64 {
        if ctx.in_place {
            self.recv + at as u64
        } else {
            self.recv
        }
    }
}

fn bytes(ctx: &DataCtx, count: usize) -> u64 {
    (count * ctx.dtype.size()) as u64
}

pub fn all_reduce(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let (s, r) = (c.input(ctx, 0), c.recv);
    c.ops.all_reduce(s, r, ctx.counts.count, ctx.dtype, ctx.op)
}

pub fn all_gather(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let s = c.input(ctx, ctx.rank * ctx.counts.send_bytes);
    let r = c.recv;
    c.ops.all_gather(s, r, ctx.counts.count, ctx.dtype)
}

pub fn broadcast(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let (s, r) = (c.input(ctx, 0), c.recv);
    c.ops.broadcast(s, r, ctx.counts.count, ctx.dtype, ctx.root)
}

pub fn reduce_scatter(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let s = c.input(ctx, 0);
    let r = c.output(ctx, ctx.rank * ctx.counts.recv_bytes);
    c.ops
        .reduce_scatter(s, r, ctx.counts.count, ctx.dtype, ctx.op)
}

pub fn reduce(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let (s, r) = (c.input(ctx, 0), c.recv);
    c.ops
        .reduce(s, r, ctx.counts.count, ctx.dtype, ctx.op, ctx.root)
}

/// Every rank's block `j` to rank `j`, and rank `j`'s block for us into our block `j`.
pub fn alltoall(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let (s, r) = (c.input(ctx, 0), c.recv);
    let (n, count, d) = (ctx.nranks, ctx.counts.count, ctx.dtype);
    let blk = bytes(ctx, count);
    c.ops.group(&mut |comm| {
        for j in 0..n {
            comm.send(s + j as u64 * blk, count, d, j)?;
            comm.recv(r + j as u64 * blk, count, d, j)?;
        }
        Ok(())
    })
}

/// `sends[j]` bytes to rank `j` and `recvs[j]` from it, each stream packed in peer order
/// (the traffic matrix of [`super::alltoallv`]); bytes travel as `uint8`.
pub fn alltoallv(
    c: &mut NcclCall<'_>,
    ctx: &DataCtx,
    sends: &[usize],
    recvs: &[usize],
) -> Result<(), NcclError> {
    let (s, r) = (c.input(ctx, 0), c.recv);
    c.ops.group(&mut |comm| {
        let (mut so, mut ro) = (0u64, 0u64);
        for (j, (&sb, &rb)) in sends.iter().zip(recvs).enumerate() {
            if sb > 0 {
                comm.send(s + so, sb, DataType::Uint8, j)?;
            }
            if rb > 0 {
                comm.recv(r + ro, rb, DataType::Uint8, j)?;
            }
            so += sb as u64;
            ro += rb as u64;
        }
        Ok(())
    })
}

/// The root's block `j` to rank `j` (itself included, as nccl-tests does).
pub fn scatter(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let (count, d, root) = (ctx.counts.count, ctx.dtype, ctx.root);
    let blk = bytes(ctx, count);
    let s = c.input(ctx, 0);
    let r = c.output(ctx, ctx.rank * ctx.counts.recv_bytes);
    c.ops.group(&mut |comm| {
        if ctx.rank == root {
            for j in 0..ctx.nranks {
                comm.send(s + j as u64 * blk, count, d, j)?;
            }
        }
        comm.recv(r, count, d, root)
    })
}

/// Every rank's block to the root, which receives rank `j`'s into its block `j`.
pub fn gather(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let (count, d, root) = (ctx.counts.count, ctx.dtype, ctx.root);
    let blk = bytes(ctx, count);
    let s = c.input(ctx, ctx.rank * ctx.counts.send_bytes);
    let r = c.recv;
    c.ops.group(&mut |comm| {
        comm.send(s, count, d, root)?;
        if ctx.rank == root {
            for j in 0..ctx.nranks {
                comm.recv(r + j as u64 * blk, count, d, j)?;
            }
        }
        Ok(())
    })
}

/// To the next rank, from the previous one.
pub fn sendrecv(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let (n, count, d) = (ctx.nranks, ctx.counts.count, ctx.dtype);
    let (s, r) = (c.input(ctx, 0), c.recv);
    let (to, from) = ((ctx.rank + 1) % n, (ctx.rank + n - 1) % n);
    c.ops.group(&mut |comm| {
        comm.send(s, count, d, to)?;
        comm.recv(r, count, d, from)
    })
}

/// Recursive doubling of the gathered blocks: in round `mask` a rank swaps the `mask` blocks
/// it holds with its partner `rank ^ mask`. Out of place, its own block is first copied into
/// place (a send to itself, which NCCL turns into a device copy).
pub fn hypercube(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
    let (n, rank, count, d) = (ctx.nranks, ctx.rank, ctx.counts.count, ctx.dtype);
    let blk = bytes(ctx, count);
    let r = c.recv;
    let mine = r + rank as u64 * blk;
    if !ctx.in_place {
        let s = c.send;
        c.ops.group(&mut |comm| {
            comm.send(s, count, d, rank)?;
            comm.recv(mine, count, d, rank)
        })?;
    }
    let mut mask = 1;
    while mask < n {
        let have = rank & !(mask - 1);
        let get = have ^ mask;
        let peer = rank ^ mask;
        c.ops.group(&mut |comm| {
            comm.send(r + have as u64 * blk, count * mask, d, peer)?;
            comm.recv(r + get as u64 * blk, count * mask, d, peer)
        })?;
        mask <<= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Every descriptor's NCCL calls, run by a stand-in for NCCL on host memory with NCCL's
    //! semantics (reductions in rank order; a group's receives matched, in order, with the
    //! peer's sends to this rank), then checked with the descriptor's own data and checks: the
    //! buffers, offsets, counts, peers and roots busbw hands NCCL are the ones nccl-tests does.

    use super::*;
    use crate::specs::{self, CollectiveSpec, Counts, HostFill, ALL};
    use busbw_collectives::element::combine;
    use busbw_collectives::verifiable::count_wrong;
    use busbw_collectives::with_dtype;

    #[derive(Debug)]
    enum P2p {
        Send { buf: u64, bytes: usize, peer: usize },
        Recv { buf: u64, bytes: usize, peer: usize },
    }

    #[derive(Debug)]
    enum Call {
        /// Every collective: `out[..]` from every rank's `send` (`root` where it has one).
        Coll {
            kind: &'static str,
            send: u64,
            recv: u64,
            count: usize,
            d: DataType,
            op: ReduceOp,
            root: usize,
        },
        Group(Vec<P2p>),
    }

    #[derive(Default)]
    struct Recorder {
        calls: Vec<Call>,
        group: Option<Vec<P2p>>,
    }

    impl Recorder {
        #[allow(clippy::too_many_arguments)]
        fn coll(
            &mut self,
            kind: &'static str,
            send: u64,
            recv: u64,
            count: usize,
            d: DataType,
            op: ReduceOp,
            root: usize,
        ) -> Result<(), NcclError> {
            assert!(self.group.is_none(), "{kind} inside a group");
            self.calls.push(Call::Coll {
                kind,
                send,
                recv,
                count,
                d,
                op,
                root,
            });
            Ok(())
        }
        fn p2p(&mut self, p: P2p) -> Result<(), NcclError> {
            match &mut self.group {
                Some(g) => g.push(p),
                None => self.calls.push(Call::Group(vec![p])),
            }
            Ok(())
        }
    }

    impl NcclOps for Recorder {
        fn all_reduce(
            &mut self,
            s: u64,
            r: u64,
            c: usize,
            d: DataType,
            op: ReduceOp,
        ) -> Result<(), NcclError> {
            self.coll("all_reduce", s, r, c, d, op, 0)
        }
        fn reduce_scatter(
            &mut self,
            s: u64,
            r: u64,
            c: usize,
            d: DataType,
            op: ReduceOp,
        ) -> Result<(), NcclError> {
            self.coll("reduce_scatter", s, r, c, d, op, 0)
        }
        fn reduce(
            &mut self,
            s: u64,
            r: u64,
            c: usize,
            d: DataType,
            op: ReduceOp,
            root: usize,
        ) -> Result<(), NcclError> {
            self.coll("reduce", s, r, c, d, op, root)
        }
        fn broadcast(
            &mut self,
            s: u64,
            r: u64,
            c: usize,
            d: DataType,
            root: usize,
        ) -> Result<(), NcclError> {
            self.coll("broadcast", s, r, c, d, ReduceOp::Sum, root)
        }
        fn all_gather(&mut self, s: u64, r: u64, c: usize, d: DataType) -> Result<(), NcclError> {
            self.coll("all_gather", s, r, c, d, ReduceOp::Sum, 0)
        }
        fn send(
            &mut self,
            buf: u64,
            count: usize,
            d: DataType,
            peer: usize,
        ) -> Result<(), NcclError> {
            self.p2p(P2p::Send {
                buf,
                bytes: count * d.size(),
                peer,
            })
        }
        fn recv(
            &mut self,
            buf: u64,
            count: usize,
            d: DataType,
            peer: usize,
        ) -> Result<(), NcclError> {
            self.p2p(P2p::Recv {
                buf,
                bytes: count * d.size(),
                peer,
            })
        }
        fn group(
            &mut self,
            f: &mut dyn FnMut(&mut dyn NcclOps) -> Result<(), NcclError>,
        ) -> Result<(), NcclError> {
            assert!(self.group.is_none(), "nested group");
            self.group = Some(Vec::new());
            f(self)?;
            let g = self.group.take().unwrap_or_default();
            self.calls.push(Call::Group(g));
            Ok(())
        }
    }

    fn read(at: u64, len: usize) -> Vec<u8> {
        // SAFETY: the addresses are the test's own buffers, alive for the whole run.
        unsafe { std::slice::from_raw_parts(at as usize as *const u8, len).to_vec() }
    }

    fn write(at: u64, data: &[u8]) {
        // SAFETY: as `read`; the calls' ranges lie inside the buffers.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at as usize as *mut u8, data.len()) }
    }

    /// `op` over every rank's `count` elements (rank order), as bytes.
    fn reduced(inputs: &[Vec<u8>], count: usize, d: DataType, op: ReduceOp) -> Vec<u8> {
        let mut out = inputs[0][..count * d.size()].to_vec();
        with_dtype!(d, T => {
            let sz = std::mem::size_of::<T>();
            for i in 0..count {
                let at = |b: &[u8]| -> T {
                    // SAFETY: `sz` bytes of a plain value inside the slice.
                    unsafe { std::ptr::read_unaligned(b[i * sz..].as_ptr().cast::<T>()) }
                };
                let mut acc = at(&inputs[0]);
                for inp in &inputs[1..] {
                    acc = combine(op, acc, at(inp));
                }
                // SAFETY: as above, into the output.
                unsafe { std::ptr::write_unaligned(out[i * sz..].as_mut_ptr().cast::<T>(), acc) };
            }
        });
        out
    }

    /// Executes every rank's recorded calls step by step, all ranks together.
    fn execute(ranks: &[Recorder]) {
        let n = ranks.len();
        let steps = ranks[0].calls.len();
        assert!(
            ranks.iter().all(|r| r.calls.len() == steps),
            "ranks differ in their calls"
        );
        for k in 0..steps {
            match &ranks[0].calls[k] {
                Call::Coll {
                    kind,
                    count,
                    d,
                    op,
                    root,
                    ..
                } => {
                    let (count, d, op, root) = (*count, *d, *op, *root);
                    let parts: Vec<(u64, u64)> = ranks
                        .iter()
                        .map(|r| match &r.calls[k] {
                            Call::Coll {
                                kind: k2,
                                send,
                                recv,
                                count: c2,
                                root: r2,
                                ..
                            } => {
                                assert_eq!((k2, *c2, *r2), (kind, count, root), "ranks disagree");
                                (*send, *recv)
                            }
                            g => panic!("{kind} against {g:?}"),
                        })
                        .collect();
                    let b = count * d.size();
                    let in_len = if *kind == "reduce_scatter" { b * n } else { b };
                    let inputs: Vec<Vec<u8>> =
                        parts.iter().map(|&(s, _)| read(s, in_len)).collect();
                    for (r, &(_, recv)) in parts.iter().enumerate() {
                        match *kind {
                            "all_reduce" => write(recv, &reduced(&inputs, count, d, op)),
                            "reduce" if r == root => write(recv, &reduced(&inputs, count, d, op)),
                            "reduce" => {}
                            "broadcast" => write(recv, &inputs[root]),
                            "all_gather" => write(recv, &inputs.concat()),
                            "reduce_scatter" => {
                                let mine: Vec<Vec<u8>> = inputs
                                    .iter()
                                    .map(|i| i[r * b..(r + 1) * b].to_vec())
                                    .collect();
                                write(recv, &reduced(&mine, count, d, op));
                            }
                            other => panic!("{other}"),
                        }
                    }
                }
                Call::Group(_) => {
                    // Every send's data first (a group's sends read before its receives land).
                    let mut sent: Vec<Vec<std::collections::VecDeque<Vec<u8>>>> =
                        vec![vec![Default::default(); n]; n];
                    for (r, rk) in ranks.iter().enumerate() {
                        let Call::Group(g) = &rk.calls[k] else {
                            panic!("rank {r}: a group expected")
                        };
                        for p in g {
                            if let P2p::Send { buf, bytes, peer } = *p {
                                sent[r][peer].push_back(read(buf, bytes));
                            }
                        }
                    }
                    for (r, rk) in ranks.iter().enumerate() {
                        let Call::Group(g) = &rk.calls[k] else {
                            unreachable!()
                        };
                        for p in g {
                            if let P2p::Recv { buf, bytes, peer } = *p {
                                let data = sent[peer][r].pop_front().unwrap_or_else(|| {
                                    panic!("rank {r} receives from {peer}, which sent nothing")
                                });
                                assert_eq!(data.len(), bytes, "rank {r} from {peer}: sizes differ");
                                write(buf, &data);
                            }
                        }
                    }
                    for (r, q) in sent.iter().enumerate() {
                        for (p, left) in q.iter().enumerate() {
                            assert!(left.is_empty(), "rank {r}'s send to {p} was never received");
                        }
                    }
                }
            }
        }
    }

    /// One descriptor at `n` ranks, `bytes`, one placement: the number of wrong elements.
    fn wrong(
        spec: &CollectiveSpec,
        n: usize,
        bytes: u64,
        d: DataType,
        op: ReduceOp,
        root: usize,
        in_place: bool,
    ) -> u64 {
        let counts: Counts = (spec.counts)(bytes, d, n);
        let span = counts.size();
        let ctx = |rank| DataCtx {
            dtype: d,
            op,
            seed: 7,
            rank,
            nranks: n,
            root,
            counts,
            in_place,
            algo: busbw_collectives::select::Algo::Ring,
            model: None,
        };
        let mut bufs: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = (0..n)
            .map(|_| {
                (
                    vec![0u8; span.max(1)],
                    vec![0u8; span.max(1)],
                    vec![0u8; span.max(1)],
                )
            })
            .collect();
        let mut ranks: Vec<Recorder> = (0..n).map(|_| Recorder::default()).collect();
        for (r, (s, v, e)) in bufs.iter_mut().enumerate() {
            (spec.init)(
                &ctx(r),
                &mut HostFill {
                    dtype: d,
                    send: s,
                    recv: v,
                    expected: Some(e),
                },
            );
            let mut call = NcclCall {
                ops: &mut ranks[r],
                send: s.as_ptr() as u64,
                recv: v.as_mut_ptr() as u64,
            };
            (spec.nccl)(&mut call, &ctx(r)).expect("recording");
        }
        execute(&ranks);
        bufs.iter()
            .enumerate()
            .map(|(r, (_, v, e))| {
                let checked = (spec.checked)(&ctx(r));
                count_wrong(d, op, &v[checked.clone()], &e[..checked.len()])
            })
            .sum()
    }

    #[test]
    fn every_collective_on_nccls_calls_gives_what_busbws_checks_expect() {
        for spec in ALL {
            for n in 1..=4usize {
                if (spec.skip)(n).is_some() {
                    continue;
                }
                let ops: &[ReduceOp] = match spec.redop {
                    specs::Redop::Reduces => &[ReduceOp::Sum, ReduceOp::Max],
                    _ => &[ReduceOp::Sum],
                };
                let roots: Vec<usize> = if spec.rooted { vec![0, n - 1] } else { vec![0] };
                for &d in &[DataType::Float32, DataType::Int8] {
                    for &op in ops {
                        for &root in &roots {
                            for in_place in [false, true] {
                                if in_place && !spec.checks_in_place {
                                    continue;
                                }
                                let w = wrong(spec, n, 4096, d, op, root, in_place);
                                assert_eq!(
                                    w, 0,
                                    "{} n={n} {d} {op} root {root} in_place {in_place}",
                                    spec.program
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_wrong_offset_is_caught() {
        // The stand-in is not lenient: gather with every rank's block sent from offset 0
        // in place (instead of its own block) must fail.
        fn bad_gather(c: &mut NcclCall<'_>, ctx: &DataCtx) -> Result<(), NcclError> {
            let ctx = DataCtx {
                in_place: false,
                ..*ctx
            };
            gather(
                &mut NcclCall {
                    ops: &mut *c.ops,
                    send: c.recv,
                    recv: c.recv,
                },
                &ctx,
            )
        }
        let spec = CollectiveSpec {
            nccl: bad_gather,
            ..crate::specs::descriptors::GATHER
        };
        assert!(wrong(&spec, 3, 4096, DataType::Float32, ReduceOp::Sum, 0, true) > 0);
    }
}
