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

use crate::communicator::Communicator;
use crate::data::{bytes_of, segment_elems, Data};
use crate::dtype::{DataType, ReduceOp};
use crate::element::Element;
use crate::engine::{self, Arrival, Dir, In, Key, Link, Out, Plan, Progress, Regions};
use crate::error::CommError;
use crate::space::MemorySpace;
use crate::with_dtype;
use crate::workspace::premultiplied;

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

/// Both trees as one plan for the engine. Per chunk k, the rules that keep requests off
/// memory being written: children's sums are reduced into `out[k]` before the up-send of
/// `out[k]` is handed out; the down-receive into `out[k]` only after that send completed;
/// down-sends of `out[k]` once it is final, and nothing writes it afterwards.
struct TreePlan<T> {
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

impl<T> TreePlan<T> {
    /// Chunks of tree `s` whose sum over this rank's subtree is complete.
    fn summed(&self, s: &Side, at: &Progress, k: usize) -> bool {
        s.from_children.iter().all(|&l| at.done(l) > k)
    }
}

impl<T> Plan<T> for TreePlan<T> {
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
    let trees = rank_trees(comm.nodes(), r);
    let depth = rank_tree_depth(comm.nodes());
    let mut plan = TreePlan {
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
        plan.slot_elems = plan.slot_elems.max(chunk);
        let side = plan.sides.len();
        let mut link = |peer: usize, dir: Dir, role: Role| {
            plan.links.push(Link {
                peer,
                channel: TREE_CHANNELS[t],
                dir,
                messages: chunks,
                // One pool per child: every child's sums are in flight together.
                staged: matches!(role, Role::FromChild).then_some(pools),
                label: [", tree 0", ", tree 1"][t],
            });
            plan.roles.push((side, role, 0));
            pools += u8::from(matches!(role, Role::FromChild));
            plan.links.len() - 1
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
        plan.sides.push(Side {
            geo: Geometry { start, len, chunk },
            is_root: l.parent.is_none(),
            up,
            down,
            from_children,
            to_children: l.children.len(),
            reduced: vec![0; chunks],
        });
    }
    engine::run(comm, &mut plan, op, space)
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
