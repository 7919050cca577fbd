//! Device data across hosts: GPU to GPU inside each host, one rail per local rank between
//! them.
//!
//! The peer path needs every rank on one host; in a job of several hosts it would stage
//! every byte through the host twins, the local hops included, so a node's NVLink would
//! never carry a byte. Here a collective on device data is split as NCCL splits it between
//! its P2P and network transports: the ranks of a host reduce or gather among themselves on
//! the **node** communicator, where the peer path moves device memory directly; each rank's
//! share crosses the network on its **rail** communicator (the ranks with the same local
//! index on every host), through the staged or GPUDirect engine; the host then spreads the
//! result, again GPU to GPU. Each rank sends over the network its share of the data, not
//! the whole host's, all rails at once, and nothing host-local leaves the devices.
//!
//! | collective | node | rail | node |
//! |---|---|---|---|
//! | AllReduce | ReduceScatter | AllReduce of the share | AllGather |
//! | ReduceScatter | | ReduceScatter of the host's blocks, into workspace | ReduceScatter |
//! | AllGather | AllGather into the host's blocks | AllGather of them | |
//! | Broadcast | | Broadcast (the root's rail) | Broadcast |
//! | Reduce | Reduce into workspace | Reduce (the root's rail) | |
//! | AlltoAll, AlltoAllv | AlltoAll(v) of the host's blocks | | |
//! | Scatter, Gather | on the root's host only | | |
//! | HyperCube | as AllGather | | |
//! | SendRecv | AlltoAllv of one block to the next local rank | | |
//!
//! The all-to-alls', Scatter's, Gather's and SendRecv's blocks for other hosts go over the
//! job's own communicator, staged through their twins alone (each is one rank's, to one
//! rank: no rail to share it).
//!
//! An AllReduce count that the host's ranks do not divide leaves a tail of fewer elements
//! than ranks: node AllReduce, then rail AllReduce. `mulsum` premultiplies by the rank in
//! the job before the first step and `avg` divides by the job's size after the sum, both as
//! the flat path does, so every step sums and the result is the same bits. AlltoAllv and
//! SendRecv in place run out of place from a device copy of their input.
//!
//! Hosts hold the same number of ranks, numbered host by host (job rank = host × L + local
//! rank): a host's blocks of a ReduceScatter or AllGather are then one contiguous range.

use super::{Call, Kind};
use crate::algorithms::{chain, grouped, ring};
use crate::dtype::{DataType, ReduceOp};
use crate::engine::data::Data;
use crate::engine::space::MemorySpace;
use crate::error::CommError;
use crate::link::nodes::NodeMap;
use crate::link::Communicator;
use crate::offload::{device_of, Offload, OffloadError};

/// A rank's two communicators across hosts (see the module documentation).
pub struct Hierarchy {
    node: Communicator,
    rail: Communicator,
}

impl Hierarchy {
    /// The ranks per host of a communicator whose ranks `map` places, when they split by
    /// host and rail: several hosts, the same number of ranks on each (at least two, or
    /// nothing moves inside a host), numbered host by host. Else why not, in words for the
    /// path line.
    pub fn ranks_per_host(map: &NodeMap) -> Result<usize, String> {
        let (n, hosts) = (map.len(), map.node_count());
        if hosts < 2 {
            return Err("the ranks are on one host".into());
        }
        let per = n / hosts;
        if per * hosts != n || *map != NodeMap::uniform(n, per) {
            return Err(format!(
                "the {hosts} hosts' ranks are not numbered host by host in equal numbers"
            ));
        }
        if per < 2 {
            return Err("each host has one rank: nothing moves inside a host".into());
        }
        Ok(per)
    }

    /// `node`: this host's ranks, numbered by local rank; `rail`: the ranks with this rank's
    /// local index on every host, numbered by host. Refused unless `world`'s ranks split
    /// ([`Hierarchy::ranks_per_host`]) with as many on each host as `node` has.
    pub fn new(
        world: &Communicator,
        node: Communicator,
        rail: Communicator,
    ) -> Result<Hierarchy, CommError> {
        let (n, g) = (world.size(), world.rank());
        let (l, h) = (node.size(), rail.size());
        let fail = |why: String| {
            Err(CommError::Invalid(format!(
                "rank {g}: device data across hosts: {why}"
            )))
        };
        match Hierarchy::ranks_per_host(world.node_map()) {
            Err(why) => return fail(why),
            Ok(per) if per != l || l * h != n => {
                return fail(format!(
                    "{n} ranks of {per} per host given communicators of {l} (host) and {h} \
                     (rail) ranks"
                ))
            }
            Ok(_) => {}
        }
        if node.rank() != g % l || rail.rank() != g / l {
            return fail(format!(
                "this rank is rank {} of its host's communicator and {} of its rail's, not {} \
                 and {}",
                node.rank(),
                rail.rank(),
                g % l,
                g / l
            ));
        }
        Ok(Hierarchy { node, rail })
    }

    /// This host's communicator.
    pub fn node(&mut self) -> &mut Communicator {
        &mut self.node
    }
}

/// Which of the two communicators a step runs on, for its errors.
#[derive(Clone, Copy)]
enum Group {
    Node,
    Rail,
}

/// One call on `world`'s ranks: `src` and `dst` are the call's checked twin ranges (as the
/// flat path's layout has them).
///
/// # Safety
/// `src` and `dst` lie inside the device's mirrors for the call's sizes and stay valid for
/// the call; in place, they point into one buffer.
pub(crate) unsafe fn run(
    world: &mut Communicator,
    h: &mut Hierarchy,
    d: &mut dyn Offload,
    c: &Call<'_>,
    src: *const u8,
    dst: *mut u8,
    in_place: bool,
) -> Result<(), CommError> {
    let g = world.rank();
    let (ranks, hosts) = (h.node.size(), h.rail.size());
    let n = ranks * hosts;
    let (l, host) = (h.node.rank(), h.rail.rank());
    let (count, dtype) = (c.count, c.dtype);
    let es = dtype.size();
    let kb = count * es;
    // Every step sums; `avg` divides once, `mulsum` premultiplies once, by job rank.
    let (op, avg) = match c.op {
        ReduceOp::Avg | ReduceOp::MulSum => (ReduceOp::Sum, c.op == ReduceOp::Avg),
        op => (op, false),
    };
    let dev = |cause: OffloadError| CommError::Device {
        rank: g,
        during: format!("{} across hosts", c.name),
        cause,
    };
    // AlltoAllv and SendRecv in place run out of place from a device copy of the input: a
    // host's blocks of AlltoAllv need not start at one offset as input and as output, and
    // SendRecv's block for the next host is the one its first rank's local receive
    // overwrites first.
    let mut src = src;
    if matches!(c.kind, Kind::Alltoallv | Kind::SendRecv) && in_place {
        let sb = match c.kind {
            Kind::Alltoallv => c.sends.iter().sum(),
            _ => kb,
        };
        if sb > 0 {
            let ws = d.workspace(sb).map_err(dev)?;
            d.copy(ws, src, sb, false).map_err(dev)?;
            d.sync().map_err(dev)?;
            src = ws;
        }
    }
    // The call's input, premultiplied for `mulsum` into a buffer of its own.
    let input = |d: &mut dyn Offload, elems: usize| -> Result<*const u8, CommError> {
        if c.op == ReduceOp::MulSum {
            d.premultiply(src, elems, dtype, g).map_err(dev)
        } else {
            Ok(src)
        }
    };
    let on = |grp: Group| move |e: CommError| in_group(e, g, grp, ranks, hosts);
    let (node, rail) = (&mut h.node, &mut h.rail);
    match c.kind {
        Kind::AllReduce => {
            let input = input(d, count)?;
            let same = std::ptr::eq(input, dst);
            let main = count - count % ranks;
            let (share, blk) = (main / ranks, main / ranks * es);
            if share > 0 {
                let mine = dst.add(l * blk);
                // Out of place the ReduceScatter writes only this rank's block of `dst`.
                let x = if same {
                    inplace(d, dst, main * es)
                } else {
                    oop(d, input, main * es, mine, blk)
                };
                ring::reduce_scatter(node, x, share, dtype, op).map_err(on(Group::Node))?;
                let x = inplace(d, mine, blk);
                (c.all_reduce)(rail, x, share, dtype, op).map_err(on(Group::Rail))?;
                if avg {
                    divide(d, mine, share, dtype, n).map_err(dev)?;
                }
                let x = inplace(d, dst, main * es);
                ring::all_gather(node, x, share, dtype).map_err(on(Group::Node))?;
            }
            // Fewer elements than the host has ranks: every rank carries them.
            let tail = count - main;
            if tail > 0 {
                let (off, tb) = (main * es, tail * es);
                let out = dst.add(off);
                let x = if same {
                    inplace(d, out, tb)
                } else {
                    oop(d, input.add(off), tb, out, tb)
                };
                ring::all_reduce(node, x, tail, dtype, op).map_err(on(Group::Node))?;
                let x = inplace(d, out, tb);
                ring::all_reduce(rail, x, tail, dtype, op).map_err(on(Group::Rail))?;
                if avg {
                    divide(d, out, tail, dtype, n).map_err(dev)?;
                }
            }
        }
        Kind::ReduceScatter => {
            // Rail first: host `host`'s blocks (one contiguous chunk) reduced over the rail
            // into workspace, then among the host's ranks into each one's block.
            let chunk = ranks * kb;
            let input = input(d, n * count)?;
            let ws = d.workspace(chunk).map_err(dev)?;
            let x = oop(d, input, n * kb, ws, chunk);
            ring::reduce_scatter(rail, x, ranks * count, dtype, op).map_err(on(Group::Rail))?;
            // In place `dst` is already this rank's block of the one buffer.
            let x = oop(d, ws, chunk, dst, kb);
            ring::reduce_scatter(node, x, count, dtype, op).map_err(on(Group::Node))?;
            if avg {
                divide(d, dst, count, dtype, n).map_err(dev)?;
            }
        }
        // The HyperCube's result is the AllGather's; inside a host the peer path pulls it
        // as AllGather, so across hosts it takes the AllGather's steps too.
        Kind::AllGather | Kind::HyperCube => {
            // `dst` is the whole output; in place, this rank's input sits in its block.
            let chunk = ranks * kb;
            let ours = dst.add(host * chunk);
            let x = if in_place {
                inplace(d, ours, chunk)
            } else {
                oop(d, src, kb, ours, chunk)
            };
            ring::all_gather(node, x, count, dtype).map_err(on(Group::Node))?;
            let x = inplace(d, dst, n * kb);
            ring::all_gather(rail, x, ranks * count, dtype).map_err(on(Group::Rail))?;
        }
        Kind::Broadcast => {
            let (root_host, root_local) = (c.root / ranks, c.root % ranks);
            if l == root_local {
                let x = if in_place {
                    inplace(d, dst, kb)
                } else {
                    oop(d, src, kb, dst, kb)
                };
                chain::broadcast(rail, x, count, dtype, root_host).map_err(on(Group::Rail))?;
            }
            let x = inplace(d, dst, kb);
            chain::broadcast(node, x, count, dtype, root_local).map_err(on(Group::Node))?;
        }
        Kind::Reduce => {
            // Into workspace first: a local root that is not the job's root keeps its output
            // untouched, as every non-root's is.
            let (root_host, root_local) = (c.root / ranks, c.root % ranks);
            let input = input(d, count)?;
            let ws = d.workspace(kb).map_err(dev)?;
            let x = oop(d, input, kb, ws, kb);
            chain::reduce(node, x, count, dtype, op, root_local).map_err(on(Group::Node))?;
            if l == root_local {
                let x = oop(d, ws, kb, dst, kb);
                chain::reduce(rail, x, count, dtype, op, root_host).map_err(on(Group::Rail))?;
            }
            if avg && g == c.root {
                divide(d, dst, count, dtype, n).map_err(dev)?;
            }
        }
        Kind::Alltoall => {
            // The host's blocks GPU to GPU among its ranks, then the other hosts' blocks
            // over the job's communicator, staged through their twins alone.
            let chunk = ranks * kb;
            let ours = host * chunk;
            let x = if in_place {
                inplace(d, dst.add(ours), chunk)
            } else {
                oop(d, src.add(ours), chunk, dst.add(ours), chunk)
            };
            grouped::alltoall(node, x, count, dtype).map_err(on(Group::Node))?;
            let x = if in_place {
                inplace(d, dst, n * kb)
            } else {
                oop(d, src, n * kb, dst, n * kb)
            };
            let local = host * ranks..(host + 1) * ranks;
            let sizes = vec![kb; n];
            grouped::alltoallv_remote(world, x, (&sizes, &sizes), local, "alltoall")?;
        }
        Kind::Alltoallv => {
            // As AlltoAll, with the host's blocks where the sizes put them.
            let (sends, recvs) = (c.sends, c.recvs);
            let local = host * ranks..(host + 1) * ranks;
            let (soff, roff) = (grouped::offsets(sends), grouped::offsets(recvs));
            let (s_lo, s_hi) = (soff[local.start], soff[local.end]);
            let (r_lo, r_hi) = (roff[local.start], roff[local.end]);
            let x = oop(d, src.add(s_lo), s_hi - s_lo, dst.add(r_lo), r_hi - r_lo);
            let (ls, lr) = (&sends[local.clone()], &recvs[local.clone()]);
            grouped::alltoallv(node, x, ls, lr).map_err(on(Group::Node))?;
            let x = oop(d, src, soff[n], dst, roff[n]);
            grouped::alltoallv_remote(world, x, (sends, recvs), local, "alltoallv")?;
        }
        Kind::SendRecv => {
            // The ring shift inside the host: a node AlltoAllv of one block to the next local
            // rank; the host's last rank's block crosses to the next host's first, staged.
            let (to_next, from_prev) = (l + 1 < ranks, l > 0);
            let (mut sends, mut recvs) = (vec![0; ranks], vec![0; ranks]);
            if to_next {
                sends[l + 1] = kb;
            }
            if from_prev {
                recvs[l - 1] = kb;
            }
            let x = oop(d, src, sends.iter().sum(), dst, recvs.iter().sum());
            grouped::alltoallv(node, x, &sends, &recvs).map_err(on(Group::Node))?;
            let out: &[grouped::Block] = if to_next {
                &[]
            } else {
                &[((g + 1) % n, 0, kb)]
            };
            let inn: &[grouped::Block] = if from_prev {
                &[]
            } else {
                &[((g + n - 1) % n, 0, kb)]
            };
            let x = oop(d, src, kb, dst, kb);
            grouped::staged_blocks(world, x, (kb, kb), (out, inn), c.name)?;
        }
        Kind::Scatter | Kind::Gather => {
            // The root's host's blocks GPU to GPU from (or to) the root's local rank; the
            // other hosts' blocks straight between the root and their ranks, staged.
            let (root_host, root_local) = (c.root / ranks, c.root % ranks);
            let scatter = c.kind == Kind::Scatter;
            let at_root = g == c.root;
            let chunk = ranks * kb;
            // In place the one buffer is numbered in blocks from the start of a Scatter's
            // input or a Gather's output, this rank's own block at g; a non-root's need not
            // go further.
            let whole = if scatter { src as *mut u8 } else { dst };
            let len = if at_root { n * kb } else { (g + 1) * kb };
            if host == root_host {
                let base = root_host * chunk;
                let x = if in_place {
                    let mine = if at_root { chunk } else { (l + 1) * kb };
                    inplace(d, whole.add(base), mine)
                } else if scatter {
                    let (s, sl) = if at_root {
                        (src.add(base), chunk)
                    } else {
                        (src, 0)
                    };
                    oop(d, s, sl, dst, kb)
                } else {
                    let (t, tl) = if at_root {
                        (dst.add(base), chunk)
                    } else {
                        (dst, 0)
                    };
                    oop(d, src, kb, t, tl)
                };
                if scatter {
                    grouped::scatter(node, x, count, dtype, root_local)
                } else {
                    grouped::gather(node, x, count, dtype, root_local)
                }
                .map_err(on(Group::Node))?;
            }
            let theirs: Vec<grouped::Block> = if at_root {
                (0..n)
                    .filter(|p| p / ranks != root_host)
                    .map(|p| (p, p * kb, kb))
                    .collect()
            } else if host != root_host {
                vec![(c.root, if in_place { g * kb } else { 0 }, kb)]
            } else {
                Vec::new()
            };
            if !theirs.is_empty() {
                // The root sends a Scatter's blocks and receives a Gather's.
                let (sends, recvs): (&[_], &[_]) = if scatter == at_root {
                    (&theirs, &[])
                } else {
                    (&[], &theirs)
                };
                let (x, sizes) = if in_place {
                    (inplace(d, whole, len), (len, len))
                } else {
                    let (sb, rb) = match (scatter, at_root) {
                        (true, true) => (n * kb, kb),
                        (true, false) => (0, kb),
                        (false, true) => (kb, n * kb),
                        (false, false) => (kb, 0),
                    };
                    (oop(d, src, sb, dst, rb), (sb, rb))
                };
                grouped::staged_blocks(world, x, sizes, (sends, recvs), c.name)?;
            }
        }
    }
    Ok(())
}

/// `avg`'s division of `elems` elements at twin `p` by the job's size, on the device, then
/// waited for, since the next step may read it from the host twin.
fn divide(
    d: &mut dyn Offload,
    p: *mut u8,
    elems: usize,
    dtype: DataType,
    n: usize,
) -> Result<(), OffloadError> {
    let a = device_of(d.mirrors(), p, elems * dtype.size())?;
    d.avg_on_device(a, elems, dtype, n)?;
    d.sync()
}

/// One step's buffer, in place.
///
/// # Safety
/// `p..p+len` lies in the device's mirrors, and nothing else refers to it while the data
/// lives.
unsafe fn inplace<'x>(d: &'x mut dyn Offload, p: *mut u8, len: usize) -> Data<'x> {
    Data::in_place(std::slice::from_raw_parts_mut(p, len)).on(MemorySpace::Device(d))
}

/// One step's buffers, out of place.
///
/// # Safety
/// As [`inplace`], for both ranges; they do not overlap.
unsafe fn oop<'x>(
    d: &'x mut dyn Offload,
    s: *const u8,
    sl: usize,
    t: *mut u8,
    tl: usize,
) -> Data<'x> {
    let (send, recv) = (
        std::slice::from_raw_parts(s, sl),
        std::slice::from_raw_parts_mut(t, tl),
    );
    Data::out_of_place(send, recv).on(MemorySpace::Device(d))
}

/// A step's error in the job's words: its ranks are the group's, so they are renamed to
/// job ranks, and the words say which group it was.
fn in_group(e: CommError, g: usize, grp: Group, ranks: usize, hosts: usize) -> CommError {
    let (host, l) = (g / ranks, g % ranks);
    let job = |r: usize| match grp {
        Group::Node => host * ranks + r,
        Group::Rail => r * ranks + l,
    };
    let what = match grp {
        Group::Node => format!(
            "among host {host}'s ranks (job ranks {}-{})",
            job(0),
            job(ranks - 1)
        ),
        Group::Rail => format!(
            "on rail {l} (local rank {l} of each of {hosts} hosts: job ranks {l}, {}, ...)",
            l + ranks
        ),
    };
    match e {
        CommError::Transport {
            peer,
            during,
            cause,
            ..
        } => CommError::Transport {
            rank: g,
            peer: peer.map(job),
            during: format!("{what}: {during}"),
            cause,
        },
        CommError::Lookup { peer, cause, .. } => CommError::Lookup {
            rank: g,
            peer: job(peer),
            cause,
        },
        CommError::Timeout {
            peer,
            secs,
            what: w,
            ..
        } => CommError::Timeout {
            rank: g,
            peer: peer.map(job),
            secs,
            what: format!("{w} ({what}, where the ranks are numbered from 0)"),
        },
        CommError::Aborted { reason, .. } => CommError::Aborted { rank: g, reason },
        CommError::OutOfMemory { bytes, what: w, .. } => CommError::OutOfMemory {
            rank: g,
            bytes,
            what: w,
        },
        CommError::Device { during, cause, .. } => CommError::Device {
            rank: g,
            during: format!("{what}: {during}"),
            cause,
        },
        CommError::Invalid(m) => {
            CommError::Invalid(format!("{m} ({what}, where the ranks are numbered from 0)"))
        }
    }
}
