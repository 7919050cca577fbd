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

use crate::algorithms::peer::{self, Call, Kind};
use crate::dtype::{DataType, ReduceOp};
use crate::element::Element;
use crate::engine::data::{bytes_of, segment_elems, Data};
use crate::engine::space::MemorySpace;
use crate::engine::workspace::premultiplied;
use crate::engine::{self, Arrival, Dir, In, Key, Link, Out, Progress, Regions, Schedule};
use crate::error::CommError;
use crate::link::Communicator;
use crate::with_dtype;

mod shape;

pub use shape::{
    btree, dtree, node_tree_depth, rank_tree_depth, rank_tree_depth_in, rank_trees, rank_trees_in,
    NodeLinks, RankLinks,
};

/// Transport channels of the two trees; channel 0 belongs to the rings.
pub const TREE_CHANNELS: [u32; 2] = [1, 2];

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
/// result on every rank. Same contract as [`crate::algorithms::ring::all_reduce`], so the two are
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
    let Some(data) = peer::offer(
        comm,
        data,
        Call::reducing(Kind::AllReduce, "tree_all_reduce", count, dtype, op).by(tree_all_reduce),
    )?
    else {
        return Ok(());
    };
    let bytes = bytes_of(count, dtype)?;
    let mut b = data.bufs(comm.rank(), "tree_all_reduce", bytes, bytes, dtype, (0, 0))?;
    let space = &mut b.space;
    with_dtype!(dtype, T => {
        // SAFETY: Data::bufs checked sizes and alignment; the borrows outlive the call.
        unsafe {
            let src = premultiplied(comm, space, op, b.src as *const T, count)?;
            tree_all_reduce_raw::<T>(comm, space, src, b.dst as *mut T, count, op)
        }
    })
}

/// Where one tree's share of the buffer lies and how it is cut.
#[derive(Clone, Copy)]
struct Geometry {
    start: usize,
    len: usize,
    chunk: usize,
}

impl Geometry {
    /// Elements `(offset, len)` of chunk `k`.
    fn chunk(&self, k: usize) -> (usize, usize) {
        let s = k * self.chunk;
        (self.start + s, self.chunk.min(self.len - s))
    }
}

/// What a connection is to the tree it belongs to.
#[derive(Clone, Copy)]
enum Role {
    /// Our partial sum (a leaf: our input) up to the parent.
    Up,
    /// The final result down from the parent.
    Down,
    /// A child's partial sum, reduced into the output.
    FromChild,
    /// The final result down to a child.
    ToChild,
}

/// One tree's share of the call.
struct Side {
    geo: Geometry,
    is_root: bool,
    up: Option<usize>,
    down: Option<usize>,
    from_children: Vec<usize>,
    to_children: usize,
    /// Children reduced into each chunk so far: the first reduction of an out-of-place call
    /// reads the input, later ones the accumulated output.
    reduced: Vec<u8>,
}

/// Both trees as one schedule for the engine. Per chunk k, the rules that keep requests off
/// memory being written: children's sums are reduced into `out[k]` before the up-send of
/// `out[k]` is handed out; the down-receive into `out[k]` only after that send completed;
/// down-sends of `out[k]` once it is final, and nothing writes it afterwards.
struct TreeSchedule<T> {
    n: usize,
    op: ReduceOp,
    src: *const T,
    dst: *mut T,
    count: usize,
    sides: Vec<Side>,
    links: Vec<Link>,
    /// Per link: its tree (index into `sides`), its role, messages handed out so far.
    roles: Vec<(usize, Role, usize)>,
    slot_elems: usize,
}

impl<T> TreeSchedule<T> {
    /// Chunks of tree `s` whose sum over this rank's subtree is complete.
    fn summed(&self, s: &Side, at: &Progress, k: usize) -> bool {
        s.from_children.iter().all(|&l| at.done(l) > k)
    }
}

impl<T> Schedule<T> for TreeSchedule<T> {
    fn name(&self) -> &'static str {
        "tree_all_reduce"
    }
    fn links(&self) -> &[Link] {
        &self.links
    }
    fn slot_elems(&self) -> usize {
        self.slot_elems
    }
    fn regions(&self) -> Regions<T> {
        smallvec::smallvec![(self.src, self.count), (self.dst as *const T, self.count)]
    }
    fn next_send(&mut self, link: usize, at: &Progress) -> Option<Out<T>> {
        let (t, role, k) = self.roles[link];
        let s = &self.sides[t];
        let leaf = s.from_children.is_empty();
        let ready = match role {
            // A leaf's input is ready at once; an interior rank's sum once every child's
            // part is in.
            Role::Up => self.summed(s, at, k),
            // Final: received from the parent, or, at the root, summed (avg's division ran
            // with the last child's reduction).
            Role::ToChild => match s.down {
                Some(d) => at.done(d) > k,
                None => self.summed(s, at, k),
            },
            Role::Down | Role::FromChild => false,
        };
        if !ready {
            return None;
        }
        let (off, len) = s.geo.chunk(k);
        let leaf_up = leaf && matches!(role, Role::Up);
        let base = if leaf_up { self.src } else { self.dst };
        self.roles[link].2 += 1;
        Some(Out {
            from: base.wrapping_add(off),
            len,
            own: leaf_up,
        })
    }
    fn next_recv(&mut self, link: usize, at: &Progress) -> Option<In<T>> {
        let (t, role, k) = self.roles[link];
        let s = &self.sides[t];
        let (off, len) = s.geo.chunk(k);
        let into = match role {
            Role::FromChild => None,
            // The final chunk overwrites what we sent up: only after that send completed.
            Role::Down => match s.up {
                Some(u) if at.done(u) > k => Some(self.dst.wrapping_add(off)),
                _ => return None,
            },
            Role::Up | Role::ToChild => return None,
        };
        self.roles[link].2 += 1;
        // (chunk, unused)
        Some(In {
            into,
            len,
            key: (k, 0),
        })
    }
    fn arrived(&mut self, link: usize, (k, _): Key) -> Arrival<T> {
        let (t, role, _) = self.roles[link];
        if let Role::Down = role {
            return Arrival::Landed;
        }
        let in_place = std::ptr::eq(self.src, self.dst);
        let (n, op) = (self.n, self.op);
        let s = &mut self.sides[t];
        let (off, _) = s.geo.chunk(k);
        let first = s.reduced[k] == 0;
        s.reduced[k] += 1;
        let last = usize::from(s.reduced[k]) == s.from_children.len();
        let mine = if first && !in_place {
            self.src.wrapping_add(off)
        } else {
            self.dst.wrapping_add(off) as *const T
        };
        Arrival::Reduce {
            out: self.dst.wrapping_add(off),
            mine,
            avg_over: (last && s.is_root && op == ReduceOp::Avg).then_some(n),
            travels_on: last && (s.up.is_some() || s.to_children > 0),
            theirs_first: false,
        }
    }
}

/// # Safety
/// `src` and `dst` valid for `count` elements (possibly equal: in place).
pub(crate) unsafe fn tree_all_reduce_raw<T: Element>(
    comm: &mut Communicator,
    space: &mut MemorySpace,
    src: *const T,
    dst: *mut T,
    count: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, r) = (comm.size(), comm.rank());
    if n == 1 || count == 0 {
        comm.next_tag();
        let bytes = count * std::mem::size_of::<T>();
        return space.copy(
            r,
            dst as *mut u8,
            src as *const u8,
            bytes,
            "tree_all_reduce",
        );
    }
    let esize = std::mem::size_of::<T>();
    let seg = segment_elems::<T>(comm);
    let trees = rank_trees_in(comm.node_map(), r);
    let depth = rank_tree_depth_in(comm.node_map());
    let mut schedule = TreeSchedule {
        n,
        op,
        src,
        dst,
        count,
        sides: Vec::with_capacity(2),
        links: Vec::new(),
        roles: Vec::new(),
        slot_elems: 1,
    };
    let mut pools = 0u8;
    for (t, (start, len)) in split(count, esize, comm.config().segment_bytes)
        .into_iter()
        .enumerate()
    {
        if len == 0 {
            continue; // every rank skips the same tree: the split depends on the count only
        }
        let chunk = chunk_elems(len, esize, seg, depth);
        let chunks = len.div_ceil(chunk);
        schedule.slot_elems = schedule.slot_elems.max(chunk);
        let side = schedule.sides.len();
        let mut link = |peer: usize, dir: Dir, role: Role| {
            schedule.links.push(Link {
                peer,
                channel: TREE_CHANNELS[t],
                dir,
                messages: chunks,
                // One pool per child: every child's sums are in flight together.
                staged: matches!(role, Role::FromChild).then_some(pools),
                label: [", tree 0", ", tree 1"][t],
            });
            schedule.roles.push((side, role, 0));
            pools += u8::from(matches!(role, Role::FromChild));
            schedule.links.len() - 1
        };
        let l = &trees[t];
        let up = l.parent.map(|p| link(p, Dir::Send, Role::Up));
        for &c in &l.children {
            link(c, Dir::Send, Role::ToChild);
        }
        let from_children: Vec<usize> = l
            .children
            .iter()
            .map(|&c| link(c, Dir::Recv, Role::FromChild))
            .collect();
        let down = l.parent.map(|p| link(p, Dir::Recv, Role::Down));
        schedule.sides.push(Side {
            geo: Geometry { start, len, chunk },
            is_root: l.parent.is_none(),
            up,
            down,
            from_children,
            to_children: l.children.len(),
            reduced: vec![0; chunks],
        });
    }
    engine::run(comm, &mut schedule, op, space)
}

#[cfg(test)]
mod tests {
    use super::*;

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
