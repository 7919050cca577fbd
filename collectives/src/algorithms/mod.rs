//! The algorithms, each a plain function that builds a schedule for the engine (or, for
//! `direct`, reads peers' buffers itself): rings, pipelined chains, NCCL's double binary
//! tree, recursive doubling, grouped point-to-point exchanges and the direct AllReduce of
//! one host's ranks.

pub mod chain;
pub mod direct;
pub mod doubling;
pub mod grouped;
pub mod peer;
pub mod ring;
pub mod tree;

use crate::error::CommError;
use crate::link::nodes::NodeMap;
use crate::link::Communicator;

/// The peers a rank connects to for the ring (its two neighbours) and both trees (parents
/// and children), ascending, without the rank itself: what a rank should have looked up
/// before its first collective, and all that most jobs ever look up.
pub fn neighbours(nodes: &NodeMap, rank: usize) -> Vec<usize> {
    let n = nodes.len();
    if n < 2 || rank >= n {
        return Vec::new();
    }
    let mut peers = vec![(rank + 1) % n, (rank + n - 1) % n];
    for t in crate::algorithms::tree::rank_trees_in(nodes, rank) {
        peers.extend(t.parent);
        peers.extend(t.children);
    }
    peers.sort_unstable();
    peers.dedup();
    peers.retain(|&p| p != rank);
    peers
}

/// Opens the ring's connections (to rank+1, from rank-1) now rather than inside the first
/// timed collective.
pub fn connect_ring(comm: &mut Communicator) -> Result<(), CommError> {
    let (rank, size) = (comm.rank(), comm.size());
    if size < 2 {
        return Ok(());
    }
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    comm.connect_send(right, 0)?;
    comm.accept_recv(left, 0)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_are_the_ring_and_the_trees() {
        // 16 ranks, 4 per node: rank 5 is second on node 1; its chain neighbours are 4 and 6
        // (tree 0) and the same in reverse (tree 1); the ring adds nothing new.
        let map = NodeMap::uniform(16, 4);
        assert_eq!(neighbours(&map, 5), vec![4, 6]);
        // Rank 0 heads node 0 in tree 0 (root, child node 2's head 8) and is the chain's
        // tail in tree 1; the ring adds 15.
        let n0 = neighbours(&map, 0);
        assert!(
            n0.contains(&1) && n0.contains(&15) && n0.contains(&8),
            "{n0:?}"
        );
        // Every rank's list is short whatever the job's size.
        let big = NodeMap::uniform(32768, 8);
        assert!((0..32768)
            .step_by(97)
            .all(|r| neighbours(&big, r).len() <= 8));
        assert!(neighbours(&NodeMap::uniform(1, 1), 0).is_empty());
        assert_eq!(neighbours(&NodeMap::uniform(2, 2), 1), vec![0]);
    }
}
