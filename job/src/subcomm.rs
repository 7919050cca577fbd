//! Communicators over a subset of the job's ranks, with their own rank numbering.
//!
//! A sub-communicator is a full `Communicator` on its own transport instance: its identity
//! carries the member's rank *in the group* (what the algorithms and the connection hello
//! use) and a job id derived from the group's name, so connections of two groups, or of a
//! group and the world, can never be mistaken for each other. Handles are exchanged under a
//! store prefix of the group's name. Groups that run at once share nothing but the wire.

use busbw_collectives::{CommConfig, CommError, Communicator};
use busbw_launchers::rendezvous::missing_ranks;
use busbw_launchers::{never_registered, token_digest, Store, StoreError};
use busbw_transports::{Abort, Handle, Identity, Transport, TransportError};
use std::sync::Arc;
use std::time::Duration;

/// Any error of the program's transport set-up, kept whole so its causes still read.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A group's transport for an identity, chosen as the job's were (the same `--transport`,
/// interfaces, RDMA port): see `transport::group_factory`.
pub type MakeTransport = Box<dyn Fn(Identity) -> Result<Box<dyn Transport>, BoxError>>;

/// Why a group's communicator could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    #[error("malformed job token in the rendezvous store")]
    MalformedJob,
    #[error("rank {rank} is not in group {group}")]
    NotMember { rank: usize, group: String },
    #[error(transparent)]
    Transport(BoxError),
    #[error("opening the data listener of group {group}")]
    Listen {
        group: String,
        #[source]
        source: TransportError,
    },
    /// A member never published its handle: `who` names it by its global rank.
    #[error("{who} in group {group} (global ranks {ranks})")]
    NeverRegistered {
        who: String,
        group: String,
        ranks: String,
        #[source]
        source: Box<StoreError>,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// What every sub-communicator of this rank is built from.
pub struct Factory {
    store: Arc<dyn Store>,
    job: u64,
    /// The job token, which every group's connections prove.
    token: Option<String>,
    transports: MakeTransport,
    timeout: Duration,
    abort: Abort,
    rank: usize,
    /// Whether the groups' ranks of one host may map each other's buffers (device buffers
    /// GPU to GPU: `CommConfig::map_peers`).
    map_peers: bool,
}

/// FNV-1a: a stable 64-bit digest of a group's name.
fn fnv64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Factory {
    /// `rank` is this rank in the job; the job id comes from the store, where the session
    /// put it, mixed with the token so two jobs with one store never share ids.
    pub fn new(
        store: Arc<dyn Store>,
        token: Option<String>,
        rank: usize,
        timeout: Duration,
        abort: Abort,
        transports: MakeTransport,
    ) -> Result<Self, BuildError> {
        let job = std::str::from_utf8(&store.wait(&["job"], timeout)?[0])
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or(BuildError::MalformedJob)?
            ^ token.as_deref().map(token_digest).unwrap_or(0);
        Ok(Self {
            store,
            job,
            token,
            transports,
            timeout,
            abort,
            rank,
            map_peers: false,
        })
    }

    /// Lets the ranks of one host in a group map each other's buffers, as the job's
    /// communicator does with `--transport shm` or `auto` (device buffers then go GPU to
    /// GPU inside a group, as in the whole job).
    pub fn map_peers(mut self, on: bool) -> Self {
        self.map_peers = on;
        self
    }

    /// The communicator of group `name` whose members are `ranks` (global, ascending; this
    /// rank among them) on nodes `nodes` (node index per member). Every member must call it.
    pub fn build(
        &self,
        name: &str,
        ranks: &[usize],
        nodes: &[usize],
    ) -> Result<Communicator, BuildError> {
        let me =
            ranks
                .iter()
                .position(|&r| r == self.rank)
                .ok_or_else(|| BuildError::NotMember {
                    rank: self.rank,
                    group: name.into(),
                })?;
        let identity =
            Identity::new(self.job ^ fnv64(name), me as u32).with_token(self.token.as_deref());
        let transport = self.transports.as_ref()(identity).map_err(BuildError::Transport)?;
        let (handle, listener) = transport.listen().map_err(|source| BuildError::Listen {
            group: name.into(),
            source,
        })?;
        let prefix = format!("sub/{name}");
        self.store.set(&format!("{prefix}/{me}"), &handle.0)?;
        let keys: Vec<String> = (0..ranks.len()).map(|i| format!("{prefix}/{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let handles: Vec<Handle> = self
            .store
            .wait(&refs, self.timeout)
            .map_err(|e| named(e, &prefix, name, ranks))?
            .into_iter()
            .map(Handle)
            .collect();
        let config = CommConfig {
            timeout: self.timeout,
            abort: self.abort.clone(),
            map_peers: self.map_peers,
            ..CommConfig::default()
        };
        let mut comm = Communicator::new(transport, listener, handles, config)?;
        comm.set_nodes(nodes.to_vec())?;
        Ok(comm)
    }
}

/// A timeout on the members' handles names the members that never came, by global rank:
/// the group's own numbering means nothing to whoever reads the error.
fn named(e: StoreError, prefix: &str, group: &str, ranks: &[usize]) -> BuildError {
    let StoreError::Timeout { missing, .. } = &e else {
        return e.into();
    };
    let Some(who) = never_registered(missing, prefix) else {
        return e.into();
    };
    let globals: Vec<String> = missing_ranks(missing, prefix)
        .iter()
        .filter_map(|i| ranks.get(*i).map(|r| r.to_string()))
        .collect();
    BuildError::NeverRegistered {
        who,
        group: group.into(),
        ranks: globals.join(", "),
        source: Box::new(e),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use busbw_launchers::MemoryStore;

    /// A factory for job rank `rank` whose groups connect over TCP on loopback through
    /// `store` (which holds the job's id, "42").
    pub(crate) fn loopback_factory(
        store: Arc<MemoryStore>,
        rank: usize,
        timeout: Duration,
    ) -> Factory {
        let tcp = crate::transport::TcpSetup {
            bind: std::net::IpAddr::from([127, 0, 0, 1]),
            advertise: None,
            threads: 1,
            socks_per_thread: 1,
        };
        store.set("job", b"42").unwrap();
        Factory::new(
            store,
            None,
            rank,
            timeout,
            Abort::new(),
            Box::new(
                move |id: Identity| -> Result<Box<dyn Transport>, BoxError> {
                    Ok(crate::transport::tcp_transport(id, tcp))
                },
            ),
        )
        .unwrap()
    }

    #[test]
    fn group_names_give_distinct_job_ids() {
        assert_ne!(fnv64("t1/g0"), fnv64("t1/g1"));
        assert_eq!(fnv64(""), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn a_member_that_never_came_is_named_by_its_global_rank() {
        let e = StoreError::Timeout {
            secs: 1.0,
            missing: vec!["sub/t1/g0/1".into()],
        };
        let e = named(e, "sub/t1/g0", "t1/g0", &[4, 6]);
        assert_eq!(
            e.to_string(),
            "rank 1 never registered in group t1/g0 (global ranks 6)"
        );
    }

    #[test]
    fn a_malformed_job_id_is_refused() {
        let store = Arc::new(MemoryStore::new());
        store.set("job", b"not a number").unwrap();
        let f = Factory::new(
            store,
            None,
            0,
            Duration::from_millis(50),
            Abort::new(),
            Box::new(|_: Identity| -> Result<Box<dyn Transport>, BoxError> {
                Err("unused".into())
            }),
        );
        assert!(matches!(f, Err(BuildError::MalformedJob)));
    }

    /// Groups' communicators let one host's ranks map each other's buffers only when asked
    /// (device buffers over shm/auto): the GPU-to-GPU path agrees on it per communicator.
    #[test]
    fn a_group_maps_peers_only_when_asked() {
        for on in [false, true] {
            let store = Arc::new(MemoryStore::new());
            let f = loopback_factory(store, 0, Duration::from_secs(5)).map_peers(on);
            let comm = f.build("t0/g0", &[0], &[0]).unwrap();
            assert_eq!(comm.config().map_peers, on);
        }
    }
}
