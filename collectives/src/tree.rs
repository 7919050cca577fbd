//! Double binary tree AllReduce (NCCL's `NCCL_ALGO=Tree`).
//!
//! A ring needs `2(n-1)` sequential hops, so its latency grows linearly with the job; a tree
//! needs `2·depth`, logarithmic. A single tree wastes half the links (leaves only send up and
//! receive down), so NCCL runs two trees at once, each carrying half of the data, shaped so
//! that most ranks are a leaf in one and interior in the other (Sanders et al., "Two-tree
//! algorithms for full bandwidth broadcast, reduction and scan"). Together they keep every
//! rank's links about as busy as a ring does.
//!
//! Topology (NCCL `src/graph/trees.cc`, compat spec §5.3):
//! - trees are built over *nodes*; the ranks of one node form a chain whose head is attached
//!   to the inter-node tree, so the slow inter-node network sees one tree edge per node pair;
//! - tree 0 is the in-order binary tree over node indices with root 0 ([`btree`]); tree 1 is
//!   its mirror (`x -> N-1-x`) when N is even, its shift by one when N is odd ([`dtree`]);
//! - the intra-node chain runs in rank order in tree 0 and reversed in tree 1, so a different
//!   rank of each node carries the inter-node work of each tree;
//! - when every rank is on one node (a local run) each rank is its own node: there is no
//!   inter-node network to protect there, and a chain over all ranks would have a ring's
//!   linear latency, the one thing the tree exists to avoid.
//!
//! Data flow per tree, pipelined by chunks so chunk k+1 travels up while chunk k comes down:
//! leaves send their input up; an interior rank receives each child's chunk into a staging
//! slot and reduces it into its output buffer (`out = in ⊕ child0 ⊕ child1`, the output doubles
//! as accumulator), then sends the sum up; the root applies `avg`'s division and starts the
//! broadcast; on the way down each rank receives the final chunk into its output and forwards
//! it to its children. Each tree uses its own transport channel, so the two pipelines never
//! interleave on one ordered stream, and both progress in one loop without blocking.
//!
//! Two departures from "half the data on each tree", both NCCL's own habits: messages smaller
//! than two pipeline segments travel on tree 0 alone (NCCL runs small operations on fewer
//! channels; a second tree doubles the messages, and below a segment messages, not bytes,
//! are the cost), and chunks shrink below the segment size for medium messages so that the
//! pipeline of `2·depth` stages has enough chunks to fill it (`enqueue.cc`). On eight local
//! ranks both measurably help from 16 KiB to 1 MiB (`examples/tree_vs_ring.rs`).

use crate::communicator::{Communicator, Waiter};
use crate::data::{bytes_of, segment_elems, Data, Regs};
use crate::dtype::{DataType, ReduceOp};
use crate::element::{finish_avg, reduce_inplace, reduce_into, Element};
use crate::error::CommError;
use crate::offload::{self, Offload, Reduce, Ticket};
use crate::with_dtype;
use crate::workspace::premultiplied;
use busbw_transports::{RecvComm, RequestId, SendComm, Sleep};
use std::collections::VecDeque;

/// Transport channels of the two trees; channel 0 belongs to the rings.
pub const TREE_CHANNELS: [u32; 2] = [1, 2];

/// A node's neighbours in one binary tree over node indices `0..N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLinks {
    pub parent: Option<usize>,
    /// At most two children (NCCL's `down[0]`, `down[1]`).
    pub children: [Option<usize>; 2],
}

/// NCCL's in-order binary tree (`ncclGetBtree`) over `n` nodes, rooted at node 0: for node
/// x with lowest set bit b, the parent is `(x ^ b) | (b << 1)` (or `x ^ b` when that does not
/// exist) and the children are `x ∓ b/2`, the upper one halved down into range. Node 0's only
/// child is the highest power of two below `n`.
pub fn btree(n: usize, x: usize) -> NodeLinks {
    let none = NodeLinks {
        parent: None,
        children: [None, None],
    };
    if x >= n {
        return none;
    }
    if x == 0 {
        // The loop in NCCL stops at the first power of two >= n; its half is the child.
        let top = if n > 1 {
            Some(n.next_power_of_two() >> 1)
        } else {
            None
        };
        return NodeLinks {
            parent: None,
            children: [None, top],
        };
    }
    let bit = 1usize << x.trailing_zeros();
    let mut up = (x ^ bit) | (bit << 1);
    if up >= n {
        up = x ^ bit;
    }
    let mut low = bit >> 1;
    let down0 = (low > 0).then(|| x - low);
    while low > 0 && x + low >= n {
        low >>= 1;
    }
    let down1 = (low > 0).then(|| x + low);
    NodeLinks {
        parent: Some(up),
        children: [down0, down1],
    }
}

/// Both trees of NCCL's double binary tree (`ncclGetDtree`) for node `x` of `n`: tree 0 is
/// [`btree`]; tree 1 relabels it, mirrored for even `n` and shifted by one for odd `n` (a
/// mirror of an odd-sized tree would keep the middle node interior in both trees).
pub fn dtree(n: usize, x: usize) -> [NodeLinks; 2] {
    let t0 = btree(n, x);
    if n == 0 || x >= n {
        return [t0, t0];
    }
    let odd = n % 2 == 1;
    let to = |v: usize| if odd { (v + n - 1) % n } else { n - 1 - v };
    let from = |v: usize| if odd { (v + 1) % n } else { n - 1 - v };
    let b = btree(n, to(x));
    let t1 = NodeLinks {
        parent: b.parent.map(&from),
        children: [b.children[0].map(&from), b.children[1].map(&from)],
    };
    [t0, t1]
}

/// Depth (edges from the root to the deepest leaf) of either tree of [`dtree`] over `n`
/// nodes: `ceil(log2 n)`. Tree 1 is a relabelling of tree 0, and in tree 0 the root's child
/// `p` (the highest power of two below `n`) heads an in-order subtree whose levels halve the
/// lowest set bit down to 1, `log2 p` edges; shrunk upper children only shorten branches.
/// Closed form because it is needed on every call.
pub fn node_tree_depth(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }
}

/// A rank's neighbours in one tree of the rank-level double tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankLinks {
    pub parent: Option<usize>,
    /// Up to three: two inter-node children and the next rank of the node's chain.
    pub children: Vec<usize>,
}

/// Node index of every rank, nodes numbered in order of their lowest rank so that every rank
/// derives the same numbering from the same map, and the number of nodes. A single node
/// becomes one node per rank (see the module documentation). O(n): it runs on every call.
fn node_index(nodes: &[usize]) -> (Vec<usize>, usize) {
    let mut ids = std::collections::HashMap::new();
    let index: Vec<usize> = nodes
        .iter()
        .map(|label| {
            let next = ids.len();
            *ids.entry(*label).or_insert(next)
        })
        .collect();
    if ids.len() <= 1 {
        return ((0..nodes.len()).collect(), nodes.len());
    }
    (index, ids.len())
}

/// Both trees at rank level for `rank`, given every rank's node (see
/// [`Communicator::set_nodes`]): the node trees of [`dtree`], each node's ranks chained in
/// rank order in tree 0 and in reverse in tree 1, the chain's first rank standing for the
/// node in the node tree.
pub fn rank_trees(nodes: &[usize], rank: usize) -> [RankLinks; 2] {
    let (index, nn) = node_index(nodes);
    let empty = RankLinks {
        parent: None,
        children: Vec::new(),
    };
    let Some(&me) = index.get(rank) else {
        return [empty.clone(), empty];
    };
    let idx = &index;
    let members = move |x: usize| (0..idx.len()).filter(move |&r| idx[r] == x);
    let head = |x: usize, t: usize| {
        if t == 0 {
            members(x).next()
        } else {
            members(x).next_back()
        }
    };
    let mates: Vec<usize> = members(me).collect();
    let links = dtree(nn, me);
    [0, 1].map(|t| {
        let pos = mates.iter().position(|&r| r == rank).unwrap_or(0);
        // Position along this tree's chain and the chain neighbours.
        let (pos, prev, next) = if t == 0 {
            (
                pos,
                pos.checked_sub(1).map(|i| mates[i]),
                mates.get(pos + 1).copied(),
            )
        } else {
            let prev = mates.get(pos + 1).copied();
            let next = pos.checked_sub(1).map(|i| mates[i]);
            (mates.len() - 1 - pos, prev, next)
        };
        let mut children = Vec::new();
        let parent = if pos == 0 {
            children.extend(
                links[t]
                    .children
                    .iter()
                    .flatten()
                    .filter_map(|&x| head(x, t)),
            );
            links[t].parent.and_then(|p| head(p, t))
        } else {
            prev
        };
        children.extend(next);
        RankLinks { parent, children }
    })
}

/// Depth of either rank-level tree: the node tree's depth plus the longest chain. The same on
/// every rank, so it may shape the chunk size without ranks disagreeing.
pub fn rank_tree_depth(nodes: &[usize]) -> usize {
    let (index, nn) = node_index(nodes);
    let mut sizes = vec![0usize; nn];
    for &x in &index {
        sizes[x] += 1;
    }
    node_tree_depth(nn) + sizes.into_iter().max().unwrap_or(1).saturating_sub(1)
}

/// Element ranges `(start, len)` of the two trees: the first half of the buffer on tree 0, the
/// second on tree 1, once each half fills at least one pipeline segment. Below that, tree 0
/// carries everything: a second tree halves the bytes each rank moves but doubles the
/// messages, and for small messages the messages are the cost (on an oversubscribed host
/// each one is a wake-up). NCCL likewise runs small operations on fewer channels. The rule
/// depends only on the count and the shared configuration, so every rank splits alike.
fn split(count: usize, esize: usize, segment_bytes: usize) -> [(usize, usize); 2] {
    if count.saturating_mul(esize) < segment_bytes.saturating_mul(2) || count < 2 {
        return [(0, count), (count, 0)];
    }
    let half = count.div_ceil(2);
    [(0, half), (half, count - half)]
}

/// Chunk size in elements for one tree: the segment size, halved as NCCL's `enqueue.cc` does
/// for the tree (down to 128, 64, 32 KiB floors) until there are 8, 4, 1 chunks per tree
/// level: a pipeline of `2·depth` stages with fewer chunks than stages is mostly filling and
/// draining.
fn chunk_elems(per_tree: usize, esize: usize, seg: usize, depth: usize) -> usize {
    let bytes = per_tree * esize;
    let mut chunk = seg * esize;
    let depth = depth.max(1);
    for (want, floor) in [
        (depth * 8, 128 << 10),
        (depth * 4, 64 << 10),
        (depth, 32 << 10),
    ] {
        while chunk > floor && bytes / chunk < want {
            chunk /= 2;
        }
    }
    (chunk / esize).max(1)
}

/// AllReduce `count` elements of `dtype` with `op` over the double binary tree, leaving the
/// result on every rank. Same contract as [`crate::ring::all_reduce`], so the two are
/// interchangeable call by call: `mulsum` premultiplies this rank's input (into a buffer of
/// the communicator's, the send buffer stays as it was) and then sums; `avg` divides once, at
/// the root.
pub fn tree_all_reduce(
    comm: &mut Communicator,
    data: Data<'_>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let bytes = bytes_of(count, dtype)?;
    let b = data.bufs(comm.rank(), "tree_all_reduce", bytes, bytes, dtype, (0, 0))?;
    with_dtype!(dtype, T => {
        // SAFETY: Data::bufs checked sizes and alignment; the borrows outlive the call.
        unsafe {
            let src = premultiplied(comm, op, b.src as *const T, count)?;
            tree_all_reduce_raw::<T>(comm, src, b.dst as *mut T, count, op)
        }
    })
}

/// Where one tree's share of the buffer lies and how it is cut.
#[derive(Clone, Copy)]
struct Geometry {
    start: usize,
    len: usize,
    chunk: usize,
    chunks: usize,
}

impl Geometry {
    /// Elements `(offset, len)` of chunk `k`.
    fn chunk(&self, k: usize) -> (usize, usize) {
        let s = k * self.chunk;
        (self.start + s, self.chunk.min(self.len - s))
    }
}

/// One connection of a tree with its in-flight requests, `(request, chunk)` in posting order
/// (requests on a connection complete in that order).
struct Link<C: ?Sized> {
    peer: usize,
    comm: Box<C>,
    inflight: VecDeque<(RequestId, usize)>,
    /// Received chunks being reduced on the device: their slots stay taken until then.
    reducing: VecDeque<Ticket>,
    posted: usize,
    done: usize,
}

impl<C: ?Sized> Link<C> {
    fn new(peer: usize, comm: Box<C>) -> Self {
        Link {
            peer,
            comm,
            inflight: VecDeque::new(),
            reducing: VecDeque::new(),
            posted: 0,
            done: 0,
        }
    }
}

/// One tree's share of the call: its geometry, connections and progress.
struct Tree {
    t: usize,
    channel: u32,
    geo: Geometry,
    is_root: bool,
    to_parent: Option<Link<dyn SendComm>>,
    from_parent: Option<Link<dyn RecvComm>>,
    /// Up: children's partial sums. Child `i` uses staging slots `slot0 + i·window ..`.
    from_children: Vec<Link<dyn RecvComm>>,
    /// Down: final chunks to the children.
    to_children: Vec<Link<dyn SendComm>>,
    /// Children reduced into each chunk so far: the first reduction of an out-of-place call
    /// reads the input, later ones the accumulated output.
    reduced: Vec<u8>,
    /// Root only: chunks complete and finished (avg applied).
    finished: usize,
    slot0: usize,
    /// Chunks of our own input ready to send up: all of them on the host; on a device, those
    /// whose download (tickets in `downloads`) is complete. Only a leaf sends its input.
    own_ready: usize,
    downloads: VecDeque<Ticket>,
}

impl Tree {
    /// Chunks whose sum over this rank's subtree is complete (a leaf's input is).
    fn up_ready(&self) -> usize {
        self.from_children
            .iter()
            .map(|l| l.done)
            .min()
            .unwrap_or(self.own_ready)
    }

    /// Whether the device has work this tree waits for (nothing a poll(2) could see).
    fn device_busy(&self) -> bool {
        !self.downloads.is_empty() || self.from_children.iter().any(|l| !l.reducing.is_empty())
    }

    /// Chunks holding the final result in the output.
    fn final_ready(&self) -> usize {
        match &self.from_parent {
            Some(l) => l.done,
            None => self.finished,
        }
    }

    fn complete(&self) -> bool {
        let c = self.geo.chunks;
        self.to_parent.as_ref().map_or(true, |l| l.done == c)
            && self.from_parent.as_ref().map_or(true, |l| l.done == c)
            && self.from_children.iter().all(|l| l.done == c)
            && self.to_children.iter().all(|l| l.done == c)
            && (!self.is_root || self.finished == c)
    }

    /// What to sleep on until this tree can progress: links with requests in flight only,
    /// since a connection with nothing posted cannot make progress whatever its socket says.
    fn sleep_on(&mut self, out: &mut Vec<Sleep>) {
        for l in self
            .from_children
            .iter_mut()
            .chain(self.from_parent.iter_mut())
        {
            if !l.inflight.is_empty() {
                out.push(l.comm.sleep_on());
            }
        }
        for l in self.to_parent.iter_mut().chain(self.to_children.iter_mut()) {
            if !l.inflight.is_empty() {
                out.push(l.comm.sleep_on());
            }
        }
    }

    /// The sleep prepared by [`Tree::sleep_on`] is over.
    fn woke(&mut self) {
        for l in self
            .from_children
            .iter_mut()
            .chain(self.from_parent.iter_mut())
        {
            if !l.inflight.is_empty() {
                l.comm.woke();
            }
        }
        for l in self.to_parent.iter_mut().chain(self.to_children.iter_mut()) {
            if !l.inflight.is_empty() {
                l.comm.woke();
            }
        }
    }

    /// Who this tree is waiting for, for the timeout message: data from a peer first (the
    /// usual culprit), then a peer that does not take our data.
    fn waiting_for(&self) -> Option<(usize, String)> {
        let c = self.geo.chunks;
        let t = self.t;
        for l in &self.from_children {
            if l.done < c {
                return Some((
                    l.peer,
                    format!(
                        "waiting for data from rank {} (tree {t} reduce, {}/{c} chunks received)",
                        l.peer, l.done
                    ),
                ));
            }
        }
        if let Some(l) = self.from_parent.as_ref().filter(|l| l.done < c) {
            return Some((
                l.peer,
                format!(
                    "waiting for data from rank {} (tree {t} broadcast, {}/{c} chunks received)",
                    l.peer, l.done
                ),
            ));
        }
        let sends = self.to_parent.iter().chain(self.to_children.iter());
        for l in sends {
            if l.done < c {
                return Some((
                    l.peer,
                    format!(
                        "waiting for rank {} to take data (tree {t}, {}/{c} chunks sent)",
                        l.peer, l.done
                    ),
                ));
            }
        }
        None
    }

    /// Return the connections to the communicator.
    fn give_back(self, comm: &mut Communicator) {
        let ch = self.channel;
        if let Some(l) = self.to_parent {
            comm.put_send(l.peer, ch, l.comm);
        }
        if let Some(l) = self.from_parent {
            comm.put_recv(l.peer, ch, l.comm);
        }
        for l in self.from_children {
            comm.put_recv(l.peer, ch, l.comm);
        }
        for l in self.to_children {
            comm.put_send(l.peer, ch, l.comm);
        }
    }
}

/// What every pass of the progress loop needs besides the trees.
struct Ctx<'a, T> {
    n: usize,
    r: usize,
    tag: u32,
    op: ReduceOp,
    src: *const T,
    dst: *mut T,
    stage: *mut T,
    /// Elements per staging slot.
    slot_elems: usize,
    window: usize,
    regs: &'a Regs,
    /// `src`, `dst` and `stage` are device addresses the transport moves itself
    /// (GPUDirect RDMA): reductions run on them, nothing is copied.
    direct: bool,
}

impl<T: Element> Ctx<'_, T> {
    fn err(
        &self,
        t: usize,
        peer: usize,
        what: &'static str,
    ) -> impl Fn(busbw_transports::TransportError) -> CommError {
        let (r, tag) = (self.r, self.tag);
        move |cause| CommError::Transport {
            rank: r,
            peer: Some(peer),
            during: format!("tree_all_reduce (call {tag}, tree {t}): {what} rank {peer}"),
            cause,
        }
    }

    fn check_len(&self, peer: usize, got: usize, want: usize) -> Result<(), CommError> {
        if got != want {
            return Err(CommError::short_message(
                self.r,
                "tree_all_reduce",
                peer,
                got,
                want,
            ));
        }
        Ok(())
    }

    /// # Safety
    /// `(ptr, len)` lies in a registered region and obeys `isend`'s contract.
    unsafe fn isend(
        &self,
        t: usize,
        l: &mut Link<dyn SendComm>,
        k: usize,
        p: *const T,
        len: usize,
    ) -> Result<(), CommError> {
        let (p, bytes) = (p as *const u8, len * std::mem::size_of::<T>());
        let id = l
            .comm
            .isend(self.regs.find(p, bytes), p, bytes, self.tag)
            .map_err(self.err(t, l.peer, "sending to"))?;
        l.inflight.push_back((id, k));
        l.posted += 1;
        Ok(())
    }

    /// # Safety
    /// `(ptr, len)` lies in a registered region and obeys `irecv`'s contract.
    unsafe fn irecv(
        &self,
        t: usize,
        l: &mut Link<dyn RecvComm>,
        k: usize,
        p: *mut T,
        len: usize,
    ) -> Result<(), CommError> {
        let (p, bytes) = (p as *mut u8, len * std::mem::size_of::<T>());
        let id = l
            .comm
            .irecv(self.regs.find(p, bytes), p, bytes, self.tag)
            .map_err(self.err(t, l.peer, "receiving from"))?;
        l.inflight.push_back((id, k));
        l.posted += 1;
        Ok(())
    }

    /// Retire completed sends at the front of `l`; returns how many.
    fn test_sends(&self, t: usize, l: &mut Link<dyn SendComm>) -> Result<usize, CommError> {
        let mut n = 0;
        while let Some(&(id, _)) = l.inflight.front() {
            match l.comm.test(id).map_err(self.err(t, l.peer, "sending to"))? {
                Some(_) => {
                    l.inflight.pop_front();
                    l.done += 1;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    /// One pass over a tree: post what may be posted, retire what completed. Returns whether
    /// anything happened.
    ///
    /// Ordering rules that keep requests off memory being written, per chunk k:
    /// children's sums are reduced into `out[k]` before the up-send of `out[k]` is posted;
    /// the down-receive into `out[k]` is posted only after that send completed; down-sends
    /// of `out[k]` start once it is final, and nothing writes it afterwards.
    ///
    /// # Safety
    /// `src` and `dst` are valid for the call's count and `stage` for every tree's slots.
    unsafe fn pass(
        &self,
        tr: &mut Tree,
        mut dev: Option<&mut (dyn Offload + 'static)>,
    ) -> Result<bool, CommError> {
        let (w, t, g, op) = (self.window, tr.t, tr.geo, self.op);
        let in_place = std::ptr::eq(self.src, self.dst);
        let mut progressed = false;
        let esize = std::mem::size_of::<T>();
        let dev_err = offload::err(self.r, "tree_all_reduce");

        if let Some(d) = dev.as_deref_mut() {
            while let Some(&tk) = tr.downloads.front() {
                if !d.complete(tk).map_err(&dev_err)? {
                    break;
                }
                tr.downloads.pop_front();
                tr.own_ready += 1;
                progressed = true;
            }
            for l in tr.from_children.iter_mut() {
                while let Some(&tk) = l.reducing.front() {
                    if !d.complete(tk).map_err(&dev_err)? {
                        break;
                    }
                    l.reducing.pop_front();
                    l.done += 1;
                    progressed = true;
                }
            }
        }

        // Up, receive: a child's chunk lands in a staging slot and is reduced at once, so a
        // slot is free whenever fewer than `window` receives are in flight on its link.
        let n_children = tr.from_children.len();
        for (i, l) in tr.from_children.iter_mut().enumerate() {
            let slot = |k: usize| {
                let at = (tr.slot0 + i * w + k % w) * self.slot_elems;
                self.stage.wrapping_add(at)
            };
            while l.posted < g.chunks && l.inflight.len() + l.reducing.len() < w {
                let k = l.posted;
                self.irecv(t, l, k, slot(k), g.chunk(k).1)?;
                progressed = true;
            }
            while let Some(&(id, k)) = l.inflight.front() {
                let got = l
                    .comm
                    .test(id)
                    .map_err(self.err(t, l.peer, "receiving from"))?;
                let Some(got) = got else { break };
                let (off, len) = g.chunk(k);
                self.check_len(l.peer, got, len * esize)?;
                let mine_p = if tr.reduced[k] == 0 && !in_place {
                    self.src.wrapping_add(off)
                } else {
                    self.dst.wrapping_add(off) as *const T
                };
                l.inflight.pop_front();
                tr.reduced[k] += 1;
                progressed = true;
                let last = usize::from(tr.reduced[k]) == n_children;
                let avg_over = (last && tr.is_root && op == ReduceOp::Avg).then_some(self.n);
                if let Some(d) = dev.as_deref_mut().filter(|_| self.direct) {
                    let o = self.dst.wrapping_add(off) as u64;
                    let tk = d
                        .reduce_on_device(
                            o,
                            mine_p as u64,
                            slot(k) as u64,
                            len,
                            T::DTYPE,
                            op,
                            avg_over,
                        )
                        .map_err(&dev_err)?;
                    l.reducing.push_back(tk);
                    continue;
                }
                if let Some(d) = dev.as_deref_mut() {
                    // The last child's sum finishes the chunk: it goes up (downloaded) or,
                    // at the root, gets avg's division and goes down.
                    let job = Reduce {
                        out: self.dst.wrapping_add(off) as *mut u8,
                        mine: mine_p as *const u8,
                        staged: slot(k) as *const u8,
                        elems: len,
                        dtype: T::DTYPE,
                        op,
                        avg_over,
                        download: last && (tr.to_parent.is_some() || !tr.to_children.is_empty()),
                    };
                    l.reducing.push_back(d.reduce(job).map_err(&dev_err)?);
                    continue;
                }
                let staged = std::slice::from_raw_parts(slot(k), len);
                let out = std::slice::from_raw_parts_mut(self.dst.wrapping_add(off), len);
                if std::ptr::eq(mine_p, self.dst.wrapping_add(off)) {
                    reduce_inplace(op, out, staged);
                } else {
                    let mine = std::slice::from_raw_parts(mine_p, len);
                    reduce_into(op, out, mine, staged);
                }
                l.done += 1;
            }
        }
        let ready = tr.up_ready();

        if tr.is_root {
            while tr.finished < ready {
                let (off, len) = g.chunk(tr.finished);
                if let Some(d) = dev.as_deref_mut() {
                    // The last child's reduction divided and downloaded the chunk; a root
                    // without children (one rank) has only its input to copy.
                    if tr.from_children.is_empty() && !in_place && self.direct {
                        return Err(CommError::Invalid(format!(
                            "rank {}: tree_all_reduce: a root without children on the direct path (one rank never gets here)",
                            self.r
                        )));
                    }
                    if tr.from_children.is_empty() && !in_place {
                        let (dp, sp) = (
                            self.dst.wrapping_add(off) as *mut u8,
                            self.src.wrapping_add(off) as *const u8,
                        );
                        d.copy(dp, sp, len * esize, true).map_err(&dev_err)?;
                        d.sync().map_err(&dev_err)?;
                    }
                    tr.finished += 1;
                    progressed = true;
                    continue;
                }
                if tr.from_children.is_empty() && !in_place {
                    std::ptr::copy_nonoverlapping(
                        self.src.wrapping_add(off),
                        self.dst.wrapping_add(off),
                        len,
                    );
                }
                if op == ReduceOp::Avg {
                    finish_avg(
                        std::slice::from_raw_parts_mut(self.dst.wrapping_add(off), len),
                        self.n,
                    );
                }
                tr.finished += 1;
                progressed = true;
            }
        }

        // Up, send: a leaf sends its input, an interior rank its accumulated output.
        if let Some(l) = tr.to_parent.as_mut() {
            let from = if tr.from_children.is_empty() {
                self.src
            } else {
                self.dst as *const T
            };
            while l.posted < ready && l.inflight.len() < w {
                let k = l.posted;
                let (off, len) = g.chunk(k);
                self.isend(t, l, k, from.wrapping_add(off), len)?;
                progressed = true;
            }
            progressed |= self.test_sends(t, l)? > 0;
        }

        // Down, receive: the final chunk overwrites what we sent up, so only after that send
        // completed.
        if let (Some(l), Some(up)) = (tr.from_parent.as_mut(), tr.to_parent.as_ref()) {
            while l.posted < up.done && l.inflight.len() < w {
                let k = l.posted;
                let (off, len) = g.chunk(k);
                self.irecv(t, l, k, self.dst.wrapping_add(off), len)?;
                progressed = true;
            }
            while let Some(&(id, k)) = l.inflight.front() {
                let got = l
                    .comm
                    .test(id)
                    .map_err(self.err(t, l.peer, "receiving from"))?;
                let Some(got) = got else { break };
                let (off, len) = g.chunk(k);
                self.check_len(l.peer, got, len * esize)?;
                if let Some(d) = dev.as_deref_mut().filter(|_| !self.direct) {
                    // Final data in the twin: the device gets it while it travels down.
                    let at = self.dst.wrapping_add(off) as *const u8;
                    d.upload(at, len * esize).map_err(&dev_err)?;
                }
                l.inflight.pop_front();
                l.done += 1;
                progressed = true;
            }
        }

        // Down, send: final chunks to every child.
        let fin = tr.final_ready();
        for l in tr.to_children.iter_mut() {
            while l.posted < fin && l.inflight.len() < w {
                let k = l.posted;
                let (off, len) = g.chunk(k);
                self.isend(t, l, k, self.dst.wrapping_add(off), len)?;
                progressed = true;
            }
            progressed |= self.test_sends(t, l)? > 0;
        }
        Ok(progressed)
    }
}

/// Take every connection the trees need: all sends first (connecting never waits for the
/// peer), then all receives (accepting waits for the peer's connect, which every peer makes
/// in its own send phase), so ranks cannot wait on each other in a cycle.
fn connect(
    comm: &mut Communicator,
    links: &[RankLinks; 2],
    trees: &mut [Tree],
) -> Result<(), CommError> {
    for tr in trees.iter_mut() {
        let l = &links[tr.t];
        if let Some(p) = l.parent {
            tr.to_parent = Some(Link::new(p, comm.take_send(p, tr.channel)?));
        }
        for &c in &l.children {
            tr.to_children
                .push(Link::new(c, comm.take_send(c, tr.channel)?));
        }
    }
    for tr in trees.iter_mut() {
        let l = &links[tr.t];
        for &c in &l.children {
            tr.from_children
                .push(Link::new(c, comm.take_recv(c, tr.channel)?));
        }
        if let Some(p) = l.parent {
            tr.from_parent = Some(Link::new(p, comm.take_recv(p, tr.channel)?));
        }
    }
    Ok(())
}

/// # Safety
/// `src` and `dst` valid for `count` elements (possibly equal: in place).
pub(crate) unsafe fn tree_all_reduce_raw<T: Element>(
    comm: &mut Communicator,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    let tag = comm.next_tag();
    if n == 1 || count == 0 {
        let bytes = count * std::mem::size_of::<T>();
        return offload::local_copy(
            comm,
            dst as *mut u8,
            src as *const u8,
            bytes,
            "tree_all_reduce",
        );
    }
    let esize = std::mem::size_of::<T>();
    let window = comm.config().window;
    let seg = segment_elems::<T>(comm);
    let links = rank_trees(comm.nodes(), r);
    let mut trees = Vec::with_capacity(2);
    let mut slots = 0;
    let mut slot_elems = 1;
    for (t, (start, len)) in split(count, esize, comm.config().segment_bytes)
        .into_iter()
        .enumerate()
    {
        if len == 0 {
            continue; // every rank skips the same tree: the split depends on the count only
        }
        let depth = rank_tree_depth(comm.nodes());
        let chunk = chunk_elems(len, esize, seg, depth);
        let chunks = len.div_ceil(chunk);
        slot_elems = slot_elems.max(chunk);
        trees.push(Tree {
            t,
            channel: TREE_CHANNELS[t],
            geo: Geometry {
                start,
                len,
                chunk,
                chunks,
            },
            is_root: links[t].parent.is_none(),
            to_parent: None,
            from_parent: None,
            from_children: Vec::new(),
            to_children: Vec::new(),
            reduced: vec![0; chunks],
            finished: 0,
            slot0: slots,
            own_ready: chunks,
            downloads: VecDeque::new(),
        });
        slots += links[t].children.len() * window;
    }

    let stage_bytes = slots * slot_elems * esize;
    let bytes = count * esize;
    let mut dev = comm.take_offload(&[(src as *const u8, bytes), (dst as *const u8, bytes)]);
    let result = run_trees(
        comm,
        src,
        dst,
        count,
        op,
        (trees, &links),
        (stage_bytes, slot_elems),
        tag,
        dev.as_deref_mut(),
    );
    offload::finish(comm, dev, result, "tree_all_reduce")
}

/// The trees' progress loop, on `dev` when given (see [`crate::offload`]).
///
/// # Safety
/// As [`tree_all_reduce_raw`].
#[allow(clippy::too_many_arguments)]
unsafe fn run_trees<T: Element>(
    comm: &mut Communicator,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
    (mut trees, links): (Vec<Tree>, &[RankLinks; 2]),
    (stage_bytes, slot_elems): (usize, usize),
    tag: u32,
    mut dev: Option<&mut (dyn Offload + 'static)>,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    let window = comm.config().window;
    let dev_err = offload::err(r, "tree_all_reduce");
    let esize = std::mem::size_of::<T>();
    let slots = stage_bytes / (slot_elems * esize).max(1);
    let host_staging = |comm: &mut Communicator| {
        if comm.staging.ensure(stage_bytes).is_none() {
            return Err(CommError::OutOfMemory {
                rank: r,
                bytes: stage_bytes,
                what: "tree staging buffers",
            });
        }
        Ok(comm.staging.as_mut_slice().as_mut_ptr() as *mut T)
    };
    let regions = [(src, count), (dst as *const T, count)];
    let (stage, regs, direct) = offload::prepare(
        comm,
        dev.as_deref_mut(),
        &regions,
        slots * slot_elems,
        host_staging,
        "tree_all_reduce",
    )?;
    // On the direct path the trees work on the device addresses themselves.
    let (src, dst) = match dev.as_deref() {
        Some(d) if direct => {
            let m = d.mirrors();
            let s = offload::device_of(m, src as *const u8, count * esize).map_err(&dev_err)?;
            let t = offload::device_of(m, dst as *const u8, count * esize).map_err(&dev_err)?;
            (s as usize as *const T, t as usize as *mut T)
        }
        _ => (src, dst),
    };

    let result = connect(comm, links, &mut trees).and_then(|()| {
        let ctx = Ctx {
            n,
            r,
            tag,
            op,
            src,
            dst,
            stage,
            slot_elems,
            window,
            regs: &regs,
            direct,
        };
        if let Some(d) = dev.as_deref_mut().filter(|_| !direct) {
            // A leaf sends its own input up: once each chunk is off the device.
            for tr in trees
                .iter_mut()
                .filter(|tr| tr.from_children.is_empty() && tr.to_parent.is_some())
            {
                tr.own_ready = 0;
                for k in 0..tr.geo.chunks {
                    let (off, len) = tr.geo.chunk(k);
                    let p = src.add(off) as *const u8;
                    tr.downloads.push_back(
                        d.download(p, len * std::mem::size_of::<T>())
                            .map_err(&dev_err)?,
                    );
                }
            }
        }
        let mut waiter = Waiter::new(comm);
        let mut on = Vec::with_capacity(16);
        while !trees.iter().all(Tree::complete) {
            let mut progressed = false;
            for tr in trees.iter_mut() {
                progressed |= ctx.pass(tr, dev.as_deref_mut())?;
            }
            if progressed {
                waiter.progressed();
                continue;
            }
            let sleep = waiter.idle(comm, || {
                trees
                    .iter()
                    .find_map(Tree::waiting_for)
                    .map(|(p, what)| (p, format!("{what}, tree_all_reduce call {tag}")))
                    .unwrap_or((r, format!("tree_all_reduce call {tag}")))
            })?;
            if sleep && trees.iter().any(Tree::device_busy) {
                // The device signals nothing a poll(2) could wait on.
                std::thread::yield_now();
            } else if sleep {
                on.clear();
                for tr in trees.iter_mut() {
                    tr.sleep_on(&mut on);
                }
                waiter.sleep(&on);
                for tr in trees.iter_mut() {
                    tr.woke();
                }
            }
        }
        Ok(())
    });

    for tr in trees {
        tr.give_back(comm);
    }
    regs.release(comm);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent_in(n: usize, x: usize, t: usize) -> Option<usize> {
        dtree(n, x)[t].parent
    }

    #[test]
    fn nccl_examples_by_hand() {
        // n = 8, tree 0: 0 -> 4; 4 -> 2, 6; 2 -> 1, 3; 6 -> 5, 7.
        assert_eq!(btree(8, 0).children, [None, Some(4)]);
        assert_eq!(
            btree(8, 4),
            NodeLinks {
                parent: Some(0),
                children: [Some(2), Some(6)]
            }
        );
        assert_eq!(
            btree(8, 2),
            NodeLinks {
                parent: Some(4),
                children: [Some(1), Some(3)]
            }
        );
        assert_eq!(
            btree(8, 6),
            NodeLinks {
                parent: Some(4),
                children: [Some(5), Some(7)]
            }
        );
        assert_eq!(
            btree(8, 7),
            NodeLinks {
                parent: Some(6),
                children: [None, None]
            }
        );
        // n = 6: 0 -> 4; 4 -> 2, 5 (6 is out of range, halved to 5); 2 -> 1, 3.
        assert_eq!(btree(6, 0).children, [None, Some(4)]);
        assert_eq!(
            btree(6, 4),
            NodeLinks {
                parent: Some(0),
                children: [Some(2), Some(5)]
            }
        );
        assert_eq!(btree(6, 5).parent, Some(4));
        // n = 5: node 4's parent (4^4)|8 = 8 is out of range, so 0.
        assert_eq!(
            btree(5, 4),
            NodeLinks {
                parent: Some(0),
                children: [Some(2), None]
            }
        );
        // n = 3: 0 -> 2 -> 1.
        assert_eq!(
            btree(3, 2),
            NodeLinks {
                parent: Some(0),
                children: [Some(1), None]
            }
        );
        // Mirror for even n: tree 1 of 8 is rooted at 7, whose child is 7-4 = 3.
        assert_eq!(
            dtree(8, 7)[1],
            NodeLinks {
                parent: None,
                children: [None, Some(3)]
            }
        );
        assert_eq!(dtree(8, 3)[1].parent, Some(7));
        // Shift for odd n: tree 1 of 3 is rooted at 1: 1 -> 0 -> 2.
        assert_eq!(dtree(3, 1)[1].parent, None);
        assert_eq!(dtree(3, 0)[1].parent, Some(1));
        assert_eq!(dtree(3, 2)[1].parent, Some(0));
    }

    /// Every node has exactly one parent except the root, parents and children agree, no
    /// cycles, logarithmic depth, and most nodes are a leaf in at least one tree.
    #[test]
    fn double_trees_are_spanning_shallow_trees() {
        for n in 1usize..=64 {
            let log = usize::BITS - (n - 1).leading_zeros(); // ceil(log2 n)
            for t in 0..2 {
                let mut roots = 0;
                let mut child_count = vec![0; n];
                for x in 0..n {
                    let l = dtree(n, x)[t];
                    match l.parent {
                        None => roots += 1,
                        Some(p) => {
                            assert!(p < n && p != x, "n={n} t={t} x={x} parent {p}");
                            assert!(
                                dtree(n, p)[t].children.contains(&Some(x)),
                                "n={n} t={t}: {p} does not list child {x}"
                            );
                        }
                    }
                    for c in l.children.iter().flatten() {
                        assert!(*c < n);
                        assert_eq!(parent_in(n, *c, t), Some(x), "n={n} t={t} child {c} of {x}");
                        child_count[*c] += 1;
                    }
                }
                assert_eq!(roots, 1, "n={n} t={t}");
                assert_eq!(child_count.iter().filter(|&&c| c == 1).count(), n - 1);
                assert!(child_count.iter().all(|&c| c <= 1));
                // Walking up from every node ends at the root (no cycle), within the depth.
                let walked = (0..n)
                    .map(|x| {
                        let (mut y, mut d) = (x, 0);
                        while let Some(p) = parent_in(n, y, t) {
                            y = p;
                            d += 1;
                            assert!(d <= n, "n={n} t={t}: cycle through {x}");
                        }
                        d
                    })
                    .max()
                    .unwrap_or(0);
                assert_eq!(walked, node_tree_depth(n), "n={n} t={t}");
                assert!(walked <= log as usize + 1, "n={n} t={t} depth {walked}");
            }
            // Double tree property: no node is interior in both trees (NCCL's aim), except
            // what the shape forces for small or odd n.
            let both = (0..n)
                .filter(|&x| {
                    dtree(n, x)
                        .iter()
                        .all(|l| l.children.iter().any(Option::is_some))
                })
                .count();
            assert!(
                both <= 1 + n / 8,
                "n={n}: {both} nodes interior in both trees"
            );
        }
    }

    fn check_rank_trees(nodes: &[usize]) {
        let n = nodes.len();
        for t in 0..2 {
            let all: Vec<_> = (0..n).map(|r| rank_trees(nodes, r)[t].clone()).collect();
            let roots = all.iter().filter(|l| l.parent.is_none()).count();
            assert_eq!(roots, 1, "{nodes:?} t={t}");
            for (r, l) in all.iter().enumerate() {
                assert!(l.children.len() <= 3);
                if let Some(p) = l.parent {
                    assert!(all[p].children.contains(&r), "{nodes:?} t={t}: {p} !> {r}");
                }
                for &c in &l.children {
                    assert_eq!(all[c].parent, Some(r), "{nodes:?} t={t}");
                }
                // Walk up: reaches the root within the stated depth.
                let (mut x, mut d) = (r, 0);
                while let Some(p) = all[x].parent {
                    x = p;
                    d += 1;
                    assert!(d <= rank_tree_depth(nodes), "{nodes:?} t={t} r={r}");
                }
            }
        }
    }

    #[test]
    fn rank_trees_chain_ranks_of_a_node() {
        for n in 1..=12 {
            check_rank_trees(&vec![0; n]);
            check_rank_trees(&(0..n).collect::<Vec<_>>());
            check_rank_trees(&(0..n).map(|r| r / 3).collect::<Vec<_>>());
            check_rank_trees(&(0..n).map(|r| (r * 7) % 4).collect::<Vec<_>>());
        }
        // 9 ranks on 3 nodes: node heads 0, 3, 6 in tree 0; the chain 0 -> 1 -> 2.
        let nodes = [0, 0, 0, 1, 1, 1, 2, 2, 2];
        let t0 = |r| rank_trees(&nodes, r)[0].clone();
        assert_eq!(t0(0).parent, None);
        assert_eq!(t0(1).parent, Some(0));
        assert_eq!(t0(2).parent, Some(1));
        assert_eq!(t0(6).parent, Some(0), "node 2 is node 0's child in tree 0");
        assert_eq!(t0(3).parent, Some(6));
        // Tree 1 chains in reverse, so rank 2 heads node 0 and rank 0 is the chain's tail.
        let t1 = |r| rank_trees(&nodes, r)[1].clone();
        assert_eq!(t1(1).parent, Some(2));
        assert_eq!(t1(0).parent, Some(1));
        assert!(t1(0).children.is_empty());
        // One node: every rank is a node, so the depth is logarithmic, not a chain.
        assert_eq!(rank_tree_depth(&[0; 8]), 3);
        assert_eq!(rank_tree_depth(&[0, 0, 0, 0, 1, 1, 1, 1]), 4);
    }

    #[test]
    fn chunks_shrink_for_pipelining_but_not_below_the_floors() {
        // 8 MiB per tree, depth 3, 1 MiB segments: 8 chunks are fewer than 8 per stage, so
        // halve until 8 MiB / 256 KiB = 32 >= 24.
        assert_eq!(chunk_elems(8 << 20, 1, 1 << 20, 3), 256 << 10);
        // Large messages keep the segment size.
        assert_eq!(chunk_elems(256 << 20, 1, 1 << 20, 3), 1 << 20);
        // Small segments are never grown.
        assert_eq!(chunk_elems(1000, 4, 2, 3), 2);
        // 64 KiB: the 32 KiB floor.
        assert_eq!(chunk_elems(16 << 10, 4, 1 << 18, 3), 8 << 10);
        assert_eq!(split(1, 4, 1), [(0, 1), (1, 0)]);
        assert_eq!(split(2, 4, 1), [(0, 1), (1, 1)]);
        assert_eq!(split(1 << 20, 1, 1 << 20), [(0, 1 << 20), (1 << 20, 0)]);
        assert_eq!(
            split(1 << 21, 1, 1 << 20),
            [(0, 1 << 20), (1 << 20, 1 << 20)]
        );
        assert_eq!(split(4099, 4, 1024), [(0, 2050), (2050, 2049)]);
    }
}
