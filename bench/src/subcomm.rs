//! Communicators over a subset of the job's ranks, with their own rank numbering.
//!
//! A sub-communicator is a full `Communicator` on its own transport instance: its identity
//! carries the member's rank *in the group* (what the algorithms and the connection hello
//! use) and a job id derived from the group's name, so connections of two groups, or of a
//! group and the world, can never be mistaken for each other. Handles are exchanged under a
//! store prefix of the group's name. Groups that run at once share nothing but the wire.

use crate::session::{multi_transport, tcp_transport, JoinOptions, TcpSetup};
use anyhow::{Context, Result};
use busbw_collectives::{CommConfig, Communicator};
use busbw_launchers::{never_registered, token_digest, Store, StoreError, World};
use busbw_transports::multi::{NodeId, TransportKind};
use busbw_transports::{Abort, Handle, Identity, Transport};
use std::sync::Arc;
use std::time::Duration;

/// What every sub-communicator of this rank is built from.
pub struct Factory {
    store: Arc<dyn Store>,
    job: u64,
    /// The job token, which every group's connections prove.
    token: Option<String>,
    tcp: TcpSetup,
    node: NodeId,
    transport: TransportKind,
    timeout: Duration,
    abort: Abort,
    rank: usize,
    local_rank: usize,
    ib_hca: Option<String>,
    /// `-g`: the groups' verbs transports keep off their eager path (see `verbs::for_rank`).
    device_buffers: bool,
}

/// FNV-1a: a stable 64-bit digest of a group's name.
fn fnv64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Factory {
    pub fn new(
        world: &World,
        store: Arc<dyn Store>,
        opts: &JoinOptions,
        transport: TransportKind,
        timeout: Duration,
        abort: Abort,
        device_buffers: bool,
    ) -> Result<Self> {
        let job = std::str::from_utf8(&store.wait(&["job"], timeout)?[0])
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .context("malformed job token in the rendezvous store")?
            ^ opts.token.as_deref().map(token_digest).unwrap_or(0);
        let addr = crate::session::local_address(world, opts.socket_ifname.as_deref())?;
        Ok(Self {
            store,
            job,
            token: opts.token.clone(),
            tcp: opts.tcp(addr),
            node: NodeId::here(&world.hostname),
            transport,
            timeout,
            abort,
            rank: world.rank,
            local_rank: world.local_rank,
            ib_hca: opts.ib_hca.clone(),
            device_buffers,
        })
    }

    /// The group's transports, chosen as the job's were (the same `--transport`, the same
    /// RDMA port), but instances of their own: a group's queue pairs, slots and memory
    /// registrations live and die with its communicator and are never seen by another group.
    fn transport(&self, identity: Identity) -> Result<Box<dyn Transport>> {
        let verbs = crate::verbs::for_rank(
            self.transport,
            self.device_buffers,
            self.ib_hca.as_deref(),
            self.local_rank,
            self.timeout,
            identity,
            self.tcp.bind,
            self.tcp.advertise,
        )?
        .map(|(member, _)| member);
        Ok(
            match multi_transport(self.transport, identity, self.tcp, &self.node, verbs)? {
                Some(m) => Box::new(m),
                None => tcp_transport(identity, self.tcp),
            },
        )
    }

    /// The communicator of group `name` whose members are `ranks` (global, ascending; this
    /// rank among them) on nodes `nodes` (node index per member). Every member must call it.
    pub fn build(&self, name: &str, ranks: &[usize], nodes: &[usize]) -> Result<Communicator> {
        let me = ranks
            .iter()
            .position(|&r| r == self.rank)
            .with_context(|| format!("rank {} is not in group {name}", self.rank))?;
        let identity =
            Identity::new(self.job ^ fnv64(name), me as u32).with_token(self.token.as_deref());
        let transport = self.transport(identity)?;
        let (handle, listener) = transport
            .listen()
            .with_context(|| format!("opening the data listener of group {name}"))?;
        let prefix = format!("sub/{name}");
        self.store.set(&format!("{prefix}/{me}"), &handle.0)?;
        let keys: Vec<String> = (0..ranks.len()).map(|i| format!("{prefix}/{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let handles = self
            .store
            .wait(&refs, self.timeout)
            .map_err(|e| match &e {
                StoreError::Timeout { missing, .. } => {
                    let who = never_registered(missing, &prefix)
                        .map(|w| {
                            // Member numbers to global ranks.
                            let globals: Vec<String> =
                                busbw_launchers::rendezvous::missing_ranks(missing, &prefix)
                                    .iter()
                                    .filter_map(|i| ranks.get(*i).map(|r| r.to_string()))
                                    .collect();
                            format!("{w} in group {name} (global ranks {})", globals.join(", "))
                        })
                        .unwrap_or_default();
                    anyhow::Error::new(e).context(who)
                }
                _ => e.into(),
            })?
            .into_iter()
            .map(Handle)
            .collect();
        let config = CommConfig {
            timeout: self.timeout,
            abort: self.abort.clone(),
            ..CommConfig::default()
        };
        let mut comm = Communicator::new(transport, listener, handles, config)?;
        comm.set_nodes(nodes.to_vec())?;
        Ok(comm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_give_distinct_job_ids() {
        assert_ne!(fnv64("t1/g0"), fnv64("t1/g1"));
        assert_eq!(fnv64(""), 0xcbf2_9ce4_8422_2325);
    }
}
