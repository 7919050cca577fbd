//! The values of the bootstrap's store keys, each written in one place and read in one.

use crate::rank_info::RankInfo;
use busbw_collectives::link::nodes::{NodeMap, NodeMapError};
use busbw_transports::Handle;
use serde::{Deserialize, Serialize};

/// What a rank publishes under `info/<rank>`: its description and its connection handle,
/// one value so that a peer that needs either fetches one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub info: RankInfo,
    pub handle: Handle,
}

impl Record {
    /// The [`RankInfo`] text, a newline, then the handle's bytes: the text stays first so
    /// that [`RankInfo::host_of`] still reads the host of a record a diagnosis fetched.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.info.encode().into_bytes();
        v.push(b'\n');
        v.extend_from_slice(&self.handle.0);
        v
    }

    /// A made-up rank `rank` on node `rank / per_node`, each node a machine of its own, with
    /// a handle of `handle_len` bytes that names the rank: what the scale example and the
    /// tests simulate ranks with. Host names have five digits and pids six, so that every
    /// record of a job has one size and what a rank fetches compares across job sizes.
    #[doc(hidden)]
    pub fn simulated(rank: usize, per_node: usize, handle_len: usize) -> Record {
        let host = format!("node{:05}", rank / per_node.max(1));
        let mut handle = format!("rank {rank};").into_bytes();
        handle.resize(handle_len.max(handle.len()), b'.');
        Record {
            info: RankInfo {
                host: host.clone(),
                pid: 100_000 + rank as u32,
                local_rank: rank % per_node.max(1),
                node: busbw_transports::multi::NodeId::new(host.clone(), host),
            },
            handle: Handle(handle),
        }
    }

    /// The inverse of [`Record::encode`], or what is wrong with `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Record, String> {
        let cut = bytes
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("no handle after the description")?;
        Ok(Record {
            info: RankInfo::decode(&bytes[..cut])?,
            handle: Handle(bytes[cut + 1..].to_vec()),
        })
    }
}

/// Where the job's ranks run, as rank 0 worked it out from every record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Nodes by [`busbw_transports::multi::NodeId`]: host name and boot id, what shared
    /// memory needs and what the trees chain.
    pub nodes: NodeMap,
    /// Machines by boot id alone: ranks that share cores, even in network namespaces that
    /// give each its own host name (a simulated cluster).
    pub machines: NodeMap,
}

impl Layout {
    pub fn of(infos: &[RankInfo]) -> Layout {
        Layout {
            nodes: NodeMap::from_labels(infos.iter().map(|i| &i.node)),
            machines: NodeMap::from_labels(infos.iter().map(|i| &i.node.boot)),
        }
    }

    /// Ranks on `rank`'s machine (itself included), which decides how a waiting rank may use
    /// its core.
    pub fn local_ranks(&self, rank: usize) -> usize {
        self.machines
            .node_of(rank)
            .map_or(1, |m| self.machines.node_len(m))
    }

    /// `nodes <map>` and `machines <map>` lines.
    pub(super) fn encode(&self) -> String {
        format!(
            "nodes {}\nmachines {}",
            self.nodes.encode(),
            self.machines.encode()
        )
    }

    pub(super) fn decode(text: &str, ranks: usize) -> Result<Layout, String> {
        let line = |name: &str| -> Result<NodeMap, String> {
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .ok_or_else(|| format!("no {name} line in {text:?}"))?;
            NodeMap::decode(value, ranks).map_err(|e: NodeMapError| e.to_string())
        };
        Ok(Layout {
            nodes: line("nodes")?,
            machines: line("machines")?,
        })
    }
}

/// Rank 0's judgement of the configurations: its own fingerprint and the ranks whose
/// fingerprint differs from it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Verdict {
    pub reference: String,
    /// The first few ranks that differ and their fingerprints: enough to see the pattern.
    pub examples: Vec<(usize, String)>,
    /// Every rank that differs.
    pub ranks: Vec<usize>,
}

/// Ranks whose fingerprint differs from rank 0's, as one rank sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disagreement {
    /// The rank that reports it.
    pub rank: usize,
    /// Its own fingerprint.
    pub mine: String,
    /// Rank 0's, which the others are compared with.
    pub reference: String,
    /// The first few ranks that differ from rank 0, with their fingerprints.
    pub examples: Vec<(usize, String)>,
    /// Every rank that differs from rank 0.
    pub ranks: Vec<usize>,
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = crate::rendezvous::ranks_that(&self.ranks, "runs", "run");
        write!(f, "{who} with another configuration than rank 0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use busbw_transports::multi::NodeId;

    fn info(host: &str, boot: &str) -> RankInfo {
        RankInfo {
            host: host.into(),
            pid: 7,
            local_rank: 0,
            node: NodeId::new(host, boot),
        }
    }

    #[test]
    fn records_round_trip_and_keep_the_host_first() {
        let r = Record {
            info: info("gpu-3", "b00t"),
            handle: Handle(b"busbw-multi/2\nx\n\xff\x00tail".to_vec()),
        };
        let bytes = r.encode();
        assert_eq!(Record::decode(&bytes), Ok(r));
        assert_eq!(RankInfo::host_of(&bytes), Some("gpu-3".into()));
        assert!(Record::decode(b"gpu-3\t7\t0\tgpu-3/b").is_err());
        assert!(Record::decode(b"nonsense\nhandle").is_err());
    }

    #[test]
    fn layouts_count_machines_apart_from_nodes() {
        // Two simulated nodes (network namespaces) on one machine, then a real second one.
        let infos = [
            info("a", "m1"),
            info("a", "m1"),
            info("b", "m1"),
            info("b", "m1"),
            info("c", "m2"),
            info("c", "m2"),
        ];
        let l = Layout::of(&infos);
        assert_eq!(l.nodes.to_vec(), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(l.local_ranks(0), 4);
        assert_eq!(l.local_ranks(5), 2);
        let text = l.encode();
        assert_eq!(text, "nodes 0:2x3\nmachines 0:4x1,1:2x1");
        assert_eq!(Layout::decode(&text, 6), Ok(l));
        assert!(Layout::decode(&text, 7)
            .unwrap_err()
            .contains("for a job of 7"));
        assert!(Layout::decode("nodes 0:1x1", 1)
            .unwrap_err()
            .contains("no machines line"));
    }
}
