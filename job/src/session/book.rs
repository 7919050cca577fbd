//! The communicator's peer book of a job: records fetched from the rendezvous store when a
//! peer is first connected to, each checked against this rank's transports.

use crate::error::{Context, Result};
use busbw_collectives::link::nodes::NodeMap;
use busbw_collectives::LookupError;
use busbw_collectives::{neighbours, PeerBook};
use busbw_launchers::bootstrap::Directory;
use busbw_launchers::RankInfo;
use busbw_transports::multi::{Router, TransportKind};
use busbw_transports::Handle;

pub(super) struct StoreBook {
    directory: Directory,
    /// `None` for `--transport tcp`, which reaches every peer.
    router: Option<Router>,
    transport: TransportKind,
}

/// The peers a rank looks up as it joins: its ring and tree neighbours, which it will
/// connect to, and one more rank of its node and the first rank of the next node, which
/// stand for the rest of the job in its device line (the transports it reaches the job
/// with, as when every rank checked every peer). A handful, whatever the job's size.
pub(super) fn first_peers(nodes: &NodeMap, rank: usize) -> Vec<usize> {
    let mut peers = neighbours(nodes, rank);
    if let Some(me) = nodes.node_of(rank) {
        let mate = (0..2)
            .filter_map(|i| nodes.node_rank(me, i))
            .find(|&r| r != rank);
        let next = (me + 1) % nodes.node_count().max(1);
        peers.extend(mate);
        peers.extend(nodes.node_rank(next, 0).filter(|_| next != me));
    }
    peers.sort_unstable();
    peers.dedup();
    peers.retain(|&p| p != rank);
    peers
}

impl StoreBook {
    pub(super) fn new(
        directory: Directory,
        router: Option<Router>,
        transport: TransportKind,
    ) -> StoreBook {
        StoreBook {
            directory,
            router,
            transport,
        }
    }

    /// Fetch the records of `ranks` in one wait; a rank that never registered is named.
    pub(super) fn prefetch(&mut self, ranks: &[usize]) -> Result<()> {
        self.directory
            .prefetch(ranks)
            .context("fetching the records of this rank's ring and tree neighbours")
    }

    /// The member transport that reaches `peer`, or why none does, naming the peer.
    pub(super) fn route(&mut self, peer: usize) -> Result<&'static str> {
        let handle = &self.directory.record(peer)?.handle;
        match &self.router {
            None => Ok("tcp"),
            Some(r) => r.route(handle).with_context(|| {
                format!(
                    "rank {peer} cannot be reached with --transport {}",
                    self.transport
                )
            }),
        }
    }

    /// What `rank` said of itself, if this rank holds its record (rank 0 holds every one).
    pub(super) fn info(&self, rank: usize) -> Option<&RankInfo> {
        self.directory.cached(rank).map(|r| &r.info)
    }

    pub(super) fn host(&self, rank: usize) -> Option<String> {
        self.info(rank).map(|i| i.host.clone())
    }
}

impl PeerBook for StoreBook {
    fn size(&self) -> usize {
        self.directory.size()
    }

    /// The route is checked before the handle is handed out, so a peer that none of this
    /// rank's transports reaches is named as such, not as a failed connect.
    fn handle(&mut self, rank: usize) -> Result<&Handle, LookupError> {
        self.route(rank)?;
        Ok(&self.directory.record(rank)?.handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_launchers::bootstrap::{Bootstrap, Record};
    use busbw_launchers::{MemoryStore, Store};
    use busbw_transports::inproc::InprocTransport;
    use busbw_transports::multi::{Member, MultiTransport, NodeId};
    use busbw_transports::{Identity, Transport};
    use std::sync::Arc;
    use std::time::Duration;

    /// A rank on `host` whose only transport reaches its own host.
    fn same_host_only(host: &str, rank: u32) -> MultiTransport {
        let member = Member {
            transport: Box::new(InprocTransport::new(Identity::new(1, rank))),
            same_node_only: true,
        };
        MultiTransport::new(vec![member], &NodeId::new(host, "b")).unwrap()
    }

    #[test]
    fn a_peer_no_transport_reaches_is_named_when_looked_up() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        for (rank, host) in [(1usize, "a"), (3, "b")] {
            let (handle, _) = same_host_only(host, rank as u32).listen().unwrap();
            let info = RankInfo {
                host: host.into(),
                pid: 1,
                local_rank: 0,
                node: NodeId::new(host, "b"),
            };
            let record = Record { info, handle };
            store
                .set(&format!("info/{rank}"), &record.encode())
                .unwrap();
        }
        let boot = Bootstrap::new(store, 0, 4, Duration::from_secs(5));
        let me = same_host_only("a", 0);
        let mut book = StoreBook::new(boot.directory(), Some(me.router()), TransportKind::Shm);
        assert_eq!(book.route(1).unwrap(), "inproc");
        assert!(book.handle(1).is_ok());
        let e = busbw_measure::chain(&book.route(3).unwrap_err());
        assert!(
            e.starts_with("rank 3 cannot be reached with --transport shm: "),
            "{e}"
        );
        let e = book.handle(3).unwrap_err().to_string();
        assert_eq!(e, "rank 3 cannot be reached with --transport shm");
        assert_eq!(book.host(1).as_deref(), Some("a"));
    }

    #[test]
    fn first_peers_stand_for_the_node_and_the_next_one() {
        // 16 ranks, 4 per node: rank 5's neighbours are 4 and 6 (its chain), and 4 already
        // stands for its node; rank 8 heads node 2, and rank 12 stands for node 3.
        let map = NodeMap::uniform(16, 4);
        let p5 = first_peers(&map, 5);
        assert!(
            p5.contains(&4) && p5.contains(&6) && p5.contains(&8),
            "{p5:?}"
        );
        assert!(first_peers(&map, 8).contains(&12));
        // One node: no other node to stand for; one rank per node: no mate.
        assert_eq!(first_peers(&NodeMap::uniform(4, 4), 0), vec![1, 2, 3]);
        assert!(!first_peers(&NodeMap::uniform(8, 1), 3).is_empty());
        assert!(first_peers(&NodeMap::uniform(1, 1), 0).is_empty());
    }
}
