//! The ten nccl-tests collectives (and `alltoallv_perf`, in its own module). Counts, algbw bytes and busbw factors follow nccl-tests'
//! `*GetCollByteCount` and `*GetBw` (compatibility spec §3); data follows its `verifiable`
//! recipes (§2): reductions use the exact-in-any-order generators, the others the Nil
//! sequence with per-rank seeds or global indices so that a misplaced block is detected.

use super::data::{nil, per_rank, rank_seed};
use super::{data, Buf, CollectiveSpec, Counts, DataCtx, Fill, Gen, Redop};
use busbw_collectives as coll;
use busbw_collectives::{CommError, Communicator, DataType};
use std::ops::Range;

pub static ALL: [&CollectiveSpec; 11] = [
    &ALL_REDUCE,
    &ALL_GATHER,
    &BROADCAST,
    &REDUCE_SCATTER,
    &REDUCE,
    &ALLTOALL,
    &super::alltoallv::ALLTOALLV,
    &SCATTER,
    &GATHER,
    &SENDRECV,
    &HYPERCUBE,
];

fn no_skip(_n: usize) -> Option<String> {
    None
}

fn whole(counts: &Counts, _n: usize) -> f64 {
    counts.size() as f64
}

fn one(_n: usize) -> f64 {
    1.0
}

/// (n-1)/n: the fraction of the data that must cross a link (nccl-tests PERFORMANCE.md).
fn gather_factor(n: usize) -> f64 {
    (n as f64 - 1.0) / n as f64
}

fn all_checked(ctx: &DataCtx) -> Range<usize> {
    0..ctx.counts.recv_bytes
}

/// Size and count for the collectives that take the whole size as their count.
fn plain_counts(bytes: u64, dtype: DataType, _n: usize) -> Counts {
    let count = bytes as usize / dtype.size();
    let b = count * dtype.size();
    Counts {
        count,
        send_bytes: b,
        recv_bytes: b,
    }
}

/// The input buffer of a placement and the offset in it: `send`, or the receive buffer at
/// `offset` in place.
fn input(ctx: &DataCtx, offset: usize) -> (Buf, usize) {
    if ctx.in_place {
        (Buf::Recv, offset)
    } else {
        (Buf::Send, 0)
    }
}

// ---------------------------------------------------------------------------- all_reduce

pub static ALL_REDUCE: CollectiveSpec = CollectiveSpec {
    program: "all_reduce_perf",
    redop: Redop::Reduces,
    rooted: false,
    algos: true,
    counts: plain_counts,
    alg_bytes: whole,
    // 2(n-1) transfers of every element over n links.
    busbw_factor: |n| 2.0 * (n as f64 - 1.0) / n as f64,
    init: |ctx, f| {
        let b = ctx.counts.send_bytes;
        let (to, off) = input(ctx, 0);
        f.input(to, off, b, Gen::of(ctx, 0));
        f.expected(0, b, Gen::of(ctx, 0));
    },
    checked: all_checked,
    checks_in_place: true,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::select::all_reduce_with(
            comm,
            d,
            ctx.counts.count,
            ctx.dtype,
            ctx.op,
            ctx.algo,
            ctx.model.as_ref(),
        )
        .map(|_| ())
    },
    nccl: super::nccl::all_reduce,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- all_gather

fn gathered_counts(bytes: u64, dtype: DataType, n: usize) -> Counts {
    let pr = per_rank(bytes, dtype, n);
    Counts {
        count: pr,
        send_bytes: pr * dtype.size(),
        recv_bytes: pr * n * dtype.size(),
    }
}

/// Every rank's block j holds rank j's sequence (AllGather, HyperCube).
fn init_gathered(ctx: &DataCtx, f: &mut dyn Fill) {
    let sb = ctx.counts.send_bytes;
    let (to, off) = input(ctx, ctx.rank * sb);
    nil(f, to, off, sb, rank_seed(ctx.seed, ctx.rank), 0);
    if f.has_expected() {
        for j in 0..ctx.nranks {
            nil(f, Buf::Expected, j * sb, sb, rank_seed(ctx.seed, j), 0);
        }
    }
}

pub static ALL_GATHER: CollectiveSpec = CollectiveSpec {
    program: "all_gather_perf",
    redop: Redop::Fixed("none"),
    rooted: false,
    algos: false,
    counts: gathered_counts,
    alg_bytes: whole,
    busbw_factor: gather_factor,
    init: init_gathered,
    checked: all_checked,
    checks_in_place: true,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::all_gather(comm, d, ctx.counts.count, ctx.dtype)
    },
    nccl: super::nccl::all_gather,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- broadcast

pub static BROADCAST: CollectiveSpec = CollectiveSpec {
    program: "broadcast_perf",
    redop: Redop::Fixed("none"),
    rooted: true,
    algos: false,
    counts: plain_counts,
    alg_bytes: whole,
    busbw_factor: one,
    init: |ctx, f| {
        let b = ctx.counts.send_bytes;
        if ctx.rank == ctx.root {
            let (to, off) = input(ctx, 0);
            nil(f, to, off, b, ctx.seed, 0);
        }
        nil(f, Buf::Expected, 0, b, ctx.seed, 0);
    },
    checked: all_checked,
    checks_in_place: true,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::broadcast(comm, d, ctx.counts.count, ctx.dtype, ctx.root)
    },
    nccl: super::nccl::broadcast,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- reduce_scatter

fn scattered_counts(bytes: u64, dtype: DataType, n: usize) -> Counts {
    let pr = per_rank(bytes, dtype, n);
    Counts {
        count: pr,
        send_bytes: pr * n * dtype.size(),
        recv_bytes: pr * dtype.size(),
    }
}

/// In place, the output is block `rank` of the (input-sized) buffer.
fn own_block(ctx: &DataCtx) -> Range<usize> {
    let rb = ctx.counts.recv_bytes;
    if ctx.in_place {
        ctx.rank * rb..(ctx.rank + 1) * rb
    } else {
        0..rb
    }
}

pub static REDUCE_SCATTER: CollectiveSpec = CollectiveSpec {
    program: "reduce_scatter_perf",
    redop: Redop::Reduces,
    rooted: false,
    algos: false,
    counts: scattered_counts,
    alg_bytes: whole,
    busbw_factor: gather_factor,
    init: |ctx, f| {
        let c = ctx.counts;
        let (to, off) = input(ctx, 0);
        f.input(to, off, c.send_bytes, Gen::of(ctx, 0));
        let first = (ctx.rank * c.count) as u64;
        f.expected(0, c.recv_bytes, Gen::of(ctx, first));
    },
    checked: own_block,
    checks_in_place: true,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::reduce_scatter(comm, d, ctx.counts.count, ctx.dtype, ctx.op)
    },
    nccl: super::nccl::reduce_scatter,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- reduce

pub static REDUCE: CollectiveSpec = CollectiveSpec {
    program: "reduce_perf",
    redop: Redop::Reduces,
    rooted: true,
    algos: false,
    counts: plain_counts,
    alg_bytes: whole,
    busbw_factor: one,
    init: |ctx, f| {
        let b = ctx.counts.send_bytes;
        let (to, off) = input(ctx, 0);
        f.input(to, off, b, Gen::of(ctx, 0));
        if ctx.rank == ctx.root {
            f.expected(0, b, Gen::of(ctx, 0));
        } else if ctx.in_place {
            // Not the root: the buffer must still hold our input.
            f.input(Buf::Expected, 0, b, Gen::of(ctx, 0));
        } else {
            // Not the root: the (zeroed) receive buffer must stay untouched.
            f.zero(Buf::Expected, 0, b);
        }
    },
    checked: all_checked,
    checks_in_place: true,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::reduce(comm, d, ctx.counts.count, ctx.dtype, ctx.op, ctx.root)
    },
    nccl: super::nccl::reduce,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- alltoall

fn alltoall_counts(bytes: u64, dtype: DataType, n: usize) -> Counts {
    let pr = per_rank(bytes, dtype, n);
    let b = pr * n * dtype.size();
    Counts {
        count: pr,
        send_bytes: b,
        recv_bytes: b,
    }
}

pub static ALLTOALL: CollectiveSpec = CollectiveSpec {
    program: "alltoall_perf",
    redop: Redop::Fixed("none"),
    rooted: false,
    algos: false,
    counts: alltoall_counts,
    alg_bytes: whole,
    // 1/n of the data stays local (nccl-tests#130).
    busbw_factor: gather_factor,
    init: |ctx, f| {
        let c = ctx.counts;
        let (to, off) = input(ctx, 0);
        nil(f, to, off, c.send_bytes, rank_seed(ctx.seed, ctx.rank), 0);
        if f.has_expected() {
            let blk = c.count * ctx.dtype.size();
            for j in 0..ctx.nranks {
                nil(
                    f,
                    Buf::Expected,
                    j * blk,
                    blk,
                    rank_seed(ctx.seed, j),
                    ctx.rank * c.count,
                );
            }
        }
    },
    checked: all_checked,
    checks_in_place: false,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::alltoall(comm, d, ctx.counts.count, ctx.dtype)
    },
    nccl: super::nccl::alltoall,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- scatter

pub static SCATTER: CollectiveSpec = CollectiveSpec {
    program: "scatter_perf",
    redop: Redop::Fixed("none"),
    rooted: true,
    algos: false,
    counts: scattered_counts,
    alg_bytes: whole,
    busbw_factor: gather_factor,
    init: |ctx, f| {
        let c = ctx.counts;
        if ctx.rank == ctx.root {
            let (to, off) = input(ctx, 0);
            nil(f, to, off, c.send_bytes, ctx.seed, 0);
        }
        nil(
            f,
            Buf::Expected,
            0,
            c.recv_bytes,
            ctx.seed,
            ctx.rank * c.count,
        );
    },
    checked: own_block,
    checks_in_place: true,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::scatter(comm, d, ctx.counts.count, ctx.dtype, ctx.root)
    },
    nccl: super::nccl::scatter,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- gather

pub static GATHER: CollectiveSpec = CollectiveSpec {
    program: "gather_perf",
    redop: Redop::Fixed("none"),
    rooted: true,
    algos: false,
    counts: gathered_counts,
    alg_bytes: whole,
    busbw_factor: gather_factor,
    init: |ctx, f| {
        let c = ctx.counts;
        let sb = c.send_bytes;
        let (to, off) = input(ctx, ctx.rank * sb);
        nil(f, to, off, sb, ctx.seed, ctx.rank * c.count);
        if ctx.rank == ctx.root {
            nil(f, Buf::Expected, 0, c.recv_bytes, ctx.seed, 0);
        } else {
            f.zero(Buf::Expected, 0, c.recv_bytes);
            if ctx.in_place {
                nil(
                    f,
                    Buf::Expected,
                    ctx.rank * sb,
                    sb,
                    ctx.seed,
                    ctx.rank * c.count,
                );
            }
        }
    },
    checked: all_checked,
    checks_in_place: true,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::gather(comm, d, ctx.counts.count, ctx.dtype, ctx.root)
    },
    nccl: super::nccl::gather,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- sendrecv

pub static SENDRECV: CollectiveSpec = CollectiveSpec {
    program: "sendrecv_perf",
    redop: Redop::Prints,
    rooted: false,
    algos: false,
    counts: plain_counts,
    alg_bytes: whole,
    busbw_factor: one,
    init: |ctx, f| {
        let c = ctx.counts;
        let (to, off) = input(ctx, 0);
        nil(f, to, off, c.send_bytes, ctx.seed, ctx.rank * c.count);
        let from = (ctx.rank + ctx.nranks - 1) % ctx.nranks;
        nil(f, Buf::Expected, 0, c.recv_bytes, ctx.seed, from * c.count);
    },
    checked: all_checked,
    checks_in_place: true,
    run: |comm, send, recv, space, ctx| {
        let d = data(ctx, send, recv, space);
        coll::sendrecv(comm, d, ctx.counts.count, ctx.dtype)
    },
    nccl: super::nccl::sendrecv,
    skip: no_skip,
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};

// ---------------------------------------------------------------------------- hypercube

pub static HYPERCUBE: CollectiveSpec = CollectiveSpec {
    program: "hypercube_perf",
    redop: Redop::Fixed(""),
    rooted: false,
    algos: false,
    counts: gathered_counts,
    // Each rank receives (n-1) blocks.
    alg_bytes: |c, n| (c.send_bytes * (n - 1)) as f64,
    busbw_factor: one,
    init: init_gathered,
    checked: all_checked,
    checks_in_place: true,
    run: |comm: &mut Communicator, send, recv, space, ctx| -> Result<(), CommError> {
        coll::hypercube(
            comm,
            data(ctx, send, recv, space),
            ctx.counts.count,
            ctx.dtype,
        )
    },
    nccl: super::nccl::hypercube,
    skip: |n| (!n.is_power_of_two()).then(|| format!("nRanks {n} is not a power of 2, skipping")),
    comments: super::no_comments,
    prepare: super::no_settings,
    ranks_ok: super::any_ranks,
};
