//! Which member of a multi-transport reaches a peer, decided from the peer's handle alone.

use super::decode;
use crate::{Handle, Result, TransportError};

/// The rule that picks the member a connection uses, without the members themselves: a
/// rank checks that it can reach a peer when it learns the peer's handle, which at scale is
/// long after its transports went into the communicator (peers are looked up on demand).
#[derive(Clone, Debug)]
pub struct Router {
    /// Each member's name and whether it reaches only the same node, in priority order.
    pub(super) members: Vec<(&'static str, bool)>,
    /// This rank's node, compared as the text the peers' handles carry.
    pub(super) node: String,
}

impl Router {
    /// Name of the transport a connection to `handle` would use.
    pub fn route(&self, handle: &Handle) -> Result<&'static str> {
        Ok(self.members[self.route_index(handle)?].0)
    }

    /// Index (in priority order) of the member a connection to `handle` would use.
    pub fn route_index(&self, handle: &Handle) -> Result<usize> {
        let (node, subs) = decode(handle)?;
        self.pick(&node, &subs)
    }

    pub(super) fn pick(&self, node: &str, subs: &[(String, Handle)]) -> Result<usize> {
        let same = node == self.node;
        self.members
            .iter()
            .position(|&(name, same_node_only)| {
                subs.iter().any(|(n, _)| n == name) && (same || !same_node_only)
            })
            .ok_or_else(|| {
                TransportError::Unsupported(format!(
                    "no transport reaches the peer (on {node}, listening on {}) from {}: {}",
                    subs.iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join("+"),
                    self.node,
                    if same {
                        "the peer listens on none of ours"
                    } else {
                        "it is on another host and only same-host transports are enabled"
                    }
                ))
            })
    }
}
