//! The trees' shape: NCCL's double binary tree over node indices, and each rank's place in
//! it once the ranks of a node are chained under their node (module documentation of
//! [`super`]). Pure functions of the rank count and the node map, so every rank derives the
//! same trees without talking.

use crate::link::nodes::NodeMap;

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

/// The nodes the trees are built over: the job's nodes, or one node per rank when the job
/// has a single node (see the module documentation). Every query is a lookup in the
/// [`NodeMap`]'s segments, so a rank finds its neighbours without walking the job: the
/// bootstrap does it once per rank before any connection exists, for up to tens of
/// thousands of ranks simulated in one process.
struct TreeNodes<'a> {
    map: &'a NodeMap,
    per_rank: bool,
}

impl TreeNodes<'_> {
    fn of(map: &NodeMap) -> TreeNodes<'_> {
        TreeNodes {
            map,
            per_rank: map.node_count() <= 1,
        }
    }

    fn count(&self) -> usize {
        if self.per_rank {
            self.map.len()
        } else {
            self.map.node_count()
        }
    }

    fn node_of(&self, rank: usize) -> Option<usize> {
        if self.per_rank {
            (rank < self.map.len()).then_some(rank)
        } else {
            self.map.node_of(rank)
        }
    }

    fn position(&self, rank: usize) -> usize {
        if self.per_rank {
            0
        } else {
            self.map.position(rank).unwrap_or(0)
        }
    }

    fn len(&self, node: usize) -> usize {
        if self.per_rank {
            1
        } else {
            self.map.node_len(node)
        }
    }

    fn rank(&self, node: usize, i: usize) -> Option<usize> {
        if self.per_rank {
            (i == 0 && node < self.map.len()).then_some(node)
        } else {
            self.map.node_rank(node, i)
        }
    }
}

/// Both trees at rank level for `rank`, given every rank's node (see
/// [`Communicator::set_nodes`]). See [`rank_trees_in`].
pub fn rank_trees(nodes: &[usize], rank: usize) -> [RankLinks; 2] {
    rank_trees_in(&NodeMap::from_labels(nodes), rank)
}

/// Both trees at rank level for `rank`: the node trees of [`dtree`], each node's ranks
/// chained in rank order in tree 0 and in reverse in tree 1, the chain's first rank standing
/// for the node in the node tree.
pub fn rank_trees_in(map: &NodeMap, rank: usize) -> [RankLinks; 2] {
    let nodes = TreeNodes::of(map);
    let Some(me) = nodes.node_of(rank) else {
        let empty = RankLinks {
            parent: None,
            children: Vec::new(),
        };
        return [empty.clone(), empty];
    };
    let links = dtree(nodes.count(), me);
    let nodes = &nodes;
    chain_links(
        links,
        me,
        nodes.position(rank),
        |x| nodes.len(x),
        |x, i| nodes.rank(x, i),
    )
}

/// A rank's links in both trees, given its node's links in the node trees (`links`), its
/// node `me` and position `pos` there, and where the ranks are: each node's rank count
/// (`len`) and `i`-th rank (`member`). The chain of a node runs in rank order in tree 0 and
/// in reverse in tree 1; its first rank stands for the node.
fn chain_links(
    links: [NodeLinks; 2],
    me: usize,
    pos: usize,
    len: impl Fn(usize) -> usize,
    member: impl Fn(usize, usize) -> Option<usize>,
) -> [RankLinks; 2] {
    let head = |x: usize, t: usize| {
        if t == 0 {
            member(x, 0)
        } else {
            member(x, len(x).checked_sub(1)?)
        }
    };
    let mates = len(me);
    [0, 1].map(|t| {
        // Position along this tree's chain and the chain neighbours.
        let (pos, prev, next) = if t == 0 {
            (
                pos,
                pos.checked_sub(1).and_then(|i| member(me, i)),
                member(me, pos + 1),
            )
        } else {
            let prev = member(me, pos + 1);
            let next = pos.checked_sub(1).and_then(|i| member(me, i));
            (mates - 1 - pos, prev, next)
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
    rank_tree_depth_in(&NodeMap::from_labels(nodes))
}

/// [`rank_tree_depth`] over a [`NodeMap`].
pub fn rank_tree_depth_in(map: &NodeMap) -> usize {
    let nodes = TreeNodes::of(map);
    let longest = if nodes.per_rank {
        1
    } else {
        map.max_node_len()
    };
    node_tree_depth(nodes.count()) + longest.max(1) - 1
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

    /// The trees' lookups done the plain way, over a list of nodes walked whole: what the
    /// segment lookups must reproduce.
    fn dense_trees(nodes: &[usize], rank: usize) -> [RankLinks; 2] {
        let mut ids = std::collections::HashMap::new();
        let mut index: Vec<usize> = nodes
            .iter()
            .map(|label| {
                let next = ids.len();
                *ids.entry(*label).or_insert(next)
            })
            .collect();
        let mut nn = ids.len();
        if nn <= 1 {
            index = (0..nodes.len()).collect();
            nn = nodes.len();
        }
        let index = &index;
        let members = move |x: usize| (0..index.len()).filter(move |&r| index[r] == x);
        let me = index[rank];
        let pos = members(me).position(|r| r == rank).unwrap_or(0);
        chain_links(
            dtree(nn, me),
            me,
            pos,
            move |x| members(x).count(),
            move |x, i| members(x).nth(i),
        )
    }

    fn check_rank_trees(nodes: &[usize]) {
        let n = nodes.len();
        for r in 0..n {
            assert_eq!(
                rank_trees(nodes, r),
                dense_trees(nodes, r),
                "{nodes:?} r={r}"
            );
        }
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
            check_rank_trees(
                &(0..n)
                    .map(|r| [0, 0, 0, 1, 1, 2][r % 6] + r / 6 * 3)
                    .collect::<Vec<_>>(),
            );
            check_rank_trees(&(0..n).map(|r| r % 2).collect::<Vec<_>>());
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
}
