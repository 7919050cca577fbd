//! Which node each rank runs on, in a form whose size follows the job's shape, not its size.
//!
//! Every rank needs the node map (the trees chain the ranks of a node, a waiting rank counts
//! the ranks that share its cores), but at 32768 ranks a list of one node per rank is
//! 32768 entries that rank 0 would serve to every rank: a gigabyte in all. Jobs are regular
//! (8 ranks per node, nodes in rank order), so the map is kept as segments of equal-sized
//! nodes: "nodes 0 to 4095, 8 consecutive ranks each" is one segment, whatever the job's
//! size. An irregular job (nodes of different sizes, ranks dealt round-robin over the nodes)
//! still fits, in more segments. The type belongs to the link layer, which knows which peers
//! share a node; the control plane (`busbw-launchers`' bootstrap, which publishes it) uses it
//! from here.
//!
//! Nodes are numbered in order of their lowest rank, so every rank derives the same numbers
//! from the same map and rank 0's node is node 0.

use std::collections::HashMap;
use std::hash::Hash;

/// `count` nodes numbered from `first`, each holding `per_node` consecutive ranks, in rank
/// order after the previous segment's ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub first: usize,
    pub per_node: usize,
    pub count: usize,
}

/// The node of every rank (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMap {
    segments: Vec<Segment>,
    /// First rank of each segment, then the rank count: queries binary-search it.
    starts: Vec<usize>,
    nodes: usize,
    /// Where some node's ranks are not consecutive, the node of every rank and each node's
    /// ranks, spelled out (the queries need them; such a job is rare and small).
    scattered: Option<Scattered>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Scattered {
    node: Vec<usize>,
    position: Vec<usize>,
    /// Node `x`'s ranks are `members[offsets[x]..offsets[x + 1]]`, ascending.
    offsets: Vec<usize>,
    members: Vec<usize>,
}

/// Why an encoded node map was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node map {text:?}: {why}")]
pub struct NodeMapError {
    text: String,
    why: String,
}

impl NodeMap {
    /// The map of ranks whose nodes carry `labels` (any value that tells nodes apart: a
    /// [`crate::multi::NodeId`], a boot id, an index), one per rank in rank order.
    pub fn from_labels<T: Eq + Hash>(labels: impl IntoIterator<Item = T>) -> NodeMap {
        let mut ids: HashMap<T, usize> = HashMap::new();
        let mut segments: Vec<Segment> = Vec::new();
        // The node of the block of consecutive equal ranks being read, and its length.
        let mut block: Option<(usize, usize)> = None;
        let close =
            |segments: &mut Vec<Segment>, (node, len): (usize, usize)| match segments.last_mut() {
                Some(s) if s.per_node == len && s.first + s.count == node => s.count += 1,
                _ => segments.push(Segment {
                    first: node,
                    per_node: len,
                    count: 1,
                }),
            };
        for label in labels {
            let next = ids.len();
            let node = *ids.entry(label).or_insert(next);
            block = match block {
                Some((b, len)) if b == node => Some((b, len + 1)),
                Some(done) => {
                    close(&mut segments, done);
                    Some((node, 1))
                }
                None => Some((node, 1)),
            };
        }
        if let Some(done) = block {
            close(&mut segments, done);
        }
        Self::from_segments(segments, ids.len())
    }

    /// Every rank on its own node, or every rank on one node: the two maps tests and
    /// single-host runs use.
    pub fn uniform(ranks: usize, per_node: usize) -> NodeMap {
        let per_node = per_node.max(1);
        NodeMap::from_labels((0..ranks).map(|r| r / per_node))
    }

    /// `segments` already checked: in rank order, nodes numbered by first appearance,
    /// `nodes` of them.
    fn from_segments(segments: Vec<Segment>, nodes: usize) -> NodeMap {
        let mut starts = Vec::with_capacity(segments.len() + 1);
        let mut at = 0;
        let mut fresh = 0;
        let mut consecutive = true;
        for s in &segments {
            starts.push(at);
            at += s.per_node * s.count;
            // Every node of a segment is new exactly when the nodes' ranks are consecutive.
            consecutive &= s.first == fresh;
            fresh = fresh.max(s.first + s.count);
        }
        starts.push(at);
        let mut map = NodeMap {
            segments,
            starts,
            nodes,
            scattered: None,
        };
        if !consecutive {
            map.scattered = Some(map.spell_out());
        }
        map
    }

    fn spell_out(&self) -> Scattered {
        let node: Vec<usize> = self
            .segments
            .iter()
            .flat_map(|s| (0..s.count * s.per_node).map(move |i| s.first + i / s.per_node))
            .collect();
        let mut offsets = vec![0usize; self.nodes + 1];
        for &x in &node {
            offsets[x + 1] += 1;
        }
        for x in 0..self.nodes {
            offsets[x + 1] += offsets[x];
        }
        let mut fill = offsets.clone();
        let mut members = vec![0usize; node.len()];
        let mut position = vec![0usize; node.len()];
        for (r, &x) in node.iter().enumerate() {
            position[r] = fill[x] - offsets[x];
            members[fill[x]] = r;
            fill[x] += 1;
        }
        Scattered {
            node,
            position,
            offsets,
            members,
        }
    }

    /// Ranks in the job.
    pub fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// Segments in the encoding: 1 for a regular job of any size.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The segment holding `rank` and the rank's offset in it.
    fn locate(&self, rank: usize) -> Option<(&Segment, usize)> {
        if rank >= self.len() {
            return None;
        }
        let i = self.starts.partition_point(|&s| s <= rank) - 1;
        Some((&self.segments[i], rank - self.starts[i]))
    }

    /// The node `rank` runs on.
    pub fn node_of(&self, rank: usize) -> Option<usize> {
        if let Some(s) = &self.scattered {
            return s.node.get(rank).copied();
        }
        self.locate(rank).map(|(s, off)| s.first + off / s.per_node)
    }

    /// `rank`'s index among the ranks of its node, in rank order.
    pub fn position(&self, rank: usize) -> Option<usize> {
        if let Some(s) = &self.scattered {
            return s.position.get(rank).copied();
        }
        self.locate(rank).map(|(s, off)| off % s.per_node)
    }

    /// The segment (and its index) that holds node `node`, when the nodes' ranks are
    /// consecutive.
    fn segment_of(&self, node: usize) -> Option<(usize, &Segment)> {
        if node >= self.nodes {
            return None;
        }
        let i = self.segments.partition_point(|s| s.first <= node) - 1;
        Some((i, &self.segments[i]))
    }

    /// How many ranks run on node `node`.
    pub fn node_len(&self, node: usize) -> usize {
        if let Some(s) = &self.scattered {
            return match (s.offsets.get(node), s.offsets.get(node + 1)) {
                (Some(a), Some(b)) => b - a,
                _ => 0,
            };
        }
        self.segment_of(node).map_or(0, |(_, s)| s.per_node)
    }

    /// The `i`-th rank (in rank order) of node `node`.
    pub fn node_rank(&self, node: usize, i: usize) -> Option<usize> {
        if i >= self.node_len(node) {
            return None;
        }
        if let Some(s) = &self.scattered {
            return s.members.get(s.offsets[node] + i).copied();
        }
        let (j, s) = self.segment_of(node)?;
        Some(self.starts[j] + (node - s.first) * s.per_node + i)
    }

    /// The most ranks any node has.
    pub fn max_node_len(&self) -> usize {
        match &self.scattered {
            Some(s) => s.offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0),
            None => self.segments.iter().map(|s| s.per_node).max().unwrap_or(0),
        }
    }

    /// The node of every rank, in rank order.
    pub fn to_vec(&self) -> Vec<usize> {
        (0..self.len()).filter_map(|r| self.node_of(r)).collect()
    }

    /// `first:per_nodexcount` per segment, comma separated: text, so a store dump reads.
    pub fn encode(&self) -> String {
        let parts: Vec<String> = self
            .segments
            .iter()
            .map(|s| format!("{}:{}x{}", s.first, s.per_node, s.count))
            .collect();
        parts.join(",")
    }

    /// The inverse of [`NodeMap::encode`] for a job of `ranks` ranks. The text comes from
    /// the network, so it is checked whole (counts that overflow, nodes out of order, a map
    /// of another size) before anything is sized from it.
    pub fn decode(text: &str, ranks: usize) -> Result<NodeMap, NodeMapError> {
        let bad = |why: String| NodeMapError {
            text: text.chars().take(80).collect(),
            why,
        };
        let mut segments = Vec::new();
        let (mut total, mut fresh) = (0usize, 0usize);
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let parsed = part.split_once(':').and_then(|(first, rest)| {
                let (per, count) = rest.split_once('x')?;
                Some((first.parse().ok()?, per.parse().ok()?, count.parse().ok()?))
            });
            let Some((first, per_node, count)) = parsed else {
                return Err(bad(format!("{part:?} is not first:per_nodexcount")));
            };
            let s = Segment {
                first,
                per_node,
                count,
            };
            if per_node == 0 || count == 0 {
                return Err(bad(format!("{part:?} has no ranks")));
            }
            if first > fresh {
                return Err(bad(format!(
                    "{part:?} starts at node {first} before node {fresh} appeared"
                )));
            }
            total = per_node
                .checked_mul(count)
                .and_then(|n| n.checked_add(total))
                .filter(|&t| t <= ranks)
                .ok_or_else(|| bad(format!("more ranks than the job's {ranks}")))?;
            fresh = fresh.max(first + count);
            segments.push(s);
        }
        if total != ranks {
            return Err(bad(format!("{total} ranks for a job of {ranks}")));
        }
        Ok(NodeMap::from_segments(segments, fresh))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(map: &NodeMap, nodes: &[usize]) {
        assert_eq!(map.to_vec(), nodes);
        assert_eq!(map.len(), nodes.len());
        for (r, &x) in nodes.iter().enumerate() {
            let mates: Vec<usize> = (0..nodes.len()).filter(|&q| nodes[q] == x).collect();
            let pos = mates.iter().position(|&q| q == r);
            assert_eq!(map.position(r), pos, "rank {r} of {nodes:?}");
            assert_eq!(map.node_len(x), mates.len());
            for (i, &q) in mates.iter().enumerate() {
                assert_eq!(map.node_rank(x, i), Some(q));
            }
            assert_eq!(map.node_rank(x, mates.len()), None);
        }
        assert_eq!(map.node_of(nodes.len()), None);
        let back = NodeMap::decode(&map.encode(), nodes.len()).unwrap();
        assert_eq!(&back, map);
    }

    #[test]
    fn a_regular_job_is_one_segment_whatever_its_size() {
        for (ranks, per) in [(8, 8), (64, 8), (32768, 8), (4096, 1), (12, 4)] {
            let map = NodeMap::uniform(ranks, per);
            assert_eq!(map.segments().len(), 1, "{ranks} ranks, {per} per node");
            assert_eq!(map.node_count(), ranks / per);
            assert_eq!(map.encode(), format!("0:{per}x{}", ranks / per));
            assert_eq!(map.node_of(ranks - 1), Some(ranks / per - 1));
            assert_eq!(map.node_rank(ranks / per - 1, per - 1), Some(ranks - 1));
            assert_eq!(map.max_node_len(), per);
        }
        check(&NodeMap::uniform(64, 8), &NodeMap::uniform(64, 8).to_vec());
    }

    #[test]
    fn irregular_layouts_round_trip() {
        let cases: [&[usize]; 6] = [
            &[0, 0, 0, 1, 1, 2, 2, 2],       // nodes of 3, 2 and 3 ranks
            &[0, 1, 0, 1, 0, 1],             // round robin
            &[0, 0, 1, 1, 0, 0],             // a node's ranks in two blocks
            &[5, 5, 9, 9, 5, 1],             // arbitrary labels
            &[0],                            // one rank
            &[0, 0, 0, 0, 1, 1, 1, 1, 2, 2], // a short last node
        ];
        for labels in cases {
            let map = NodeMap::from_labels(labels.iter());
            // Nodes renumbered by first appearance.
            let mut seen = Vec::new();
            let want: Vec<usize> = labels
                .iter()
                .map(|l| match seen.iter().position(|s| s == l) {
                    Some(i) => i,
                    None => {
                        seen.push(*l);
                        seen.len() - 1
                    }
                })
                .collect();
            assert_eq!(map.node_count(), seen.len());
            check(&map, &want);
        }
        assert_eq!(
            NodeMap::from_labels([0, 0, 0, 1, 1, 2, 2, 2]).encode(),
            "0:3x1,1:2x1,2:3x1"
        );
        let rr = NodeMap::from_labels((0..12).map(|r| r % 4));
        assert_eq!(rr.encode(), "0:1x4,0:1x4,0:1x4");
        assert_eq!(rr.max_node_len(), 3);
        let empty = NodeMap::from_labels(Vec::<u8>::new());
        assert!(empty.is_empty());
        assert_eq!(NodeMap::decode("", 0).unwrap(), empty);
    }

    #[test]
    fn garbage_is_refused_before_anything_is_sized() {
        let e = |t: &str, n: usize| NodeMap::decode(t, n).unwrap_err().to_string();
        assert!(e("0:8x4", 16).contains("more ranks than the job's 16"));
        assert!(e("0:8x1", 16).contains("8 ranks for a job of 16"));
        assert!(e("1:8x2", 16).contains("before node 0 appeared"));
        assert!(e("0:0x2", 16).contains("has no ranks"));
        assert!(e("0:8", 8).contains("is not first:per_nodexcount"));
        assert!(e("0:99999999999999999999x1", 8).contains("is not"));
        let huge = format!("0:{}x{}", usize::MAX / 2, 3);
        assert!(e(&huge, 8).contains("more ranks than"));
    }
}
