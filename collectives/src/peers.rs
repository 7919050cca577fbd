//! Where a communicator learns its peers' connection handles.
//!
//! A handle is needed only when a connection to the peer is opened, and a rank of a ring or
//! tree opens a handful: asking for all of them up front makes every rank fetch every
//! rank's handle, which at 32768 ranks is a billion fetched records across the job. So the
//! communicator asks a [`PeerBook`] for one peer's handle the first time it connects to that
//! peer; the book may hold them all (a list exchanged beforehand, what tests and
//! sub-communicators use) or fetch them on demand from the rendezvous store (the job's).

use busbw_transports::nodes::NodeMap;
use busbw_transports::Handle;

/// Why a peer's handle could not be had, in the book's own words (it never registered, it
/// cannot be reached with this rank's transports): the communicator adds which rank asked
/// and for whom.
pub type LookupError = Box<dyn std::error::Error + Send + Sync>;

/// Every peer's connection handle, looked up when first needed.
pub trait PeerBook: Send {
    /// Ranks in the communicator, this one included.
    fn size(&self) -> usize;

    /// Rank `rank`'s listen handle. Books that fetch keep what they fetched: the
    /// communicator asks again for each channel it opens to the peer.
    fn handle(&mut self, rank: usize) -> Result<&Handle, LookupError>;
}

/// Every handle known up front, in rank order.
impl PeerBook for Vec<Handle> {
    fn size(&self) -> usize {
        self.len()
    }

    fn handle(&mut self, rank: usize) -> Result<&Handle, LookupError> {
        let n = self.len();
        self.get(rank)
            .ok_or_else(|| format!("no rank {rank} in a communicator of {n}").into())
    }
}

/// The peers a rank connects to for the ring (its two neighbours) and both trees (parents
/// and children), ascending, without the rank itself: what a rank should have looked up
/// before its first collective, and all that most jobs ever look up.
pub fn neighbours(nodes: &NodeMap, rank: usize) -> Vec<usize> {
    let n = nodes.len();
    if n < 2 || rank >= n {
        return Vec::new();
    }
    let mut peers = vec![(rank + 1) % n, (rank + n - 1) % n];
    for t in crate::tree::rank_trees_in(nodes, rank) {
        peers.extend(t.parent);
        peers.extend(t.children);
    }
    peers.sort_unstable();
    peers.dedup();
    peers.retain(|&p| p != rank);
    peers
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

    /// A book that cannot say how to reach rank 2.
    struct Partial(Vec<Handle>);

    impl PeerBook for Partial {
        fn size(&self) -> usize {
            3
        }

        fn handle(&mut self, rank: usize) -> Result<&Handle, LookupError> {
            match rank {
                2 => Err("rank 2 never registered".into()),
                r => self.0.handle(r),
            }
        }
    }

    #[test]
    fn a_handle_that_cannot_be_had_names_the_peer() {
        use busbw_transports::inproc::InprocTransport;
        use busbw_transports::{Identity, Transport};
        let t = InprocTransport::new(Identity::new(9, 0));
        let (h, l) = t.listen().unwrap();
        let book = Partial(vec![h.clone(), h]);
        let config = crate::CommConfig::default();
        let mut comm = crate::Communicator::new(Box::new(t), l, book, config).unwrap();
        let e = comm.connect_send(2, 0).unwrap_err();
        assert_eq!(e.peer(), Some(2));
        assert_eq!(e.to_string(), "rank 0: looking up how to reach rank 2");
        let cause = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(cause.as_deref(), Some("rank 2 never registered"));
    }

    #[test]
    fn a_list_is_a_book() {
        let mut book = vec![Handle(b"a".to_vec()), Handle(b"b".to_vec())];
        assert_eq!(PeerBook::size(&book), 2);
        assert_eq!(book.handle(1).unwrap(), &Handle(b"b".to_vec()));
        let e = book.handle(2).unwrap_err().to_string();
        assert_eq!(e, "no rank 2 in a communicator of 2");
    }
}
