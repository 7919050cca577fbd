//! What can stop a tier run. A group's sweep keeps its error whole as the source
//! ([`Error::Sweep`]), so the program still classifies it into an exit code by its type.

use busbw_collectives::CommError;
use busbw_job::BuildError;
use busbw_launchers::topology::SourceError;
use busbw_launchers::StoreError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("reading the topology labels of {node}")]
    Labels {
        node: String,
        #[source]
        source: SourceError,
    },
    #[error("exchanging topology labels")]
    Exchange(#[source] StoreError),
    /// The preset cannot be resolved against the labels seen.
    #[error("{0}")]
    Model(String),
    /// A threshold names a tier the topology does not have (a usage error: the fix is the
    /// flag); `tier` as the user wrote it.
    #[error("{tier}: no such tier; the tiers are {}", tiers.join(", "))]
    NoSuchTier { tier: String, tiers: Vec<String> },
    /// A group's communicator, `what` saying which group.
    #[error("{what}")]
    Group {
        what: String,
        #[source]
        source: Box<BuildError>,
    },
    #[error(transparent)]
    Build(Box<BuildError>),
    #[error(
        "rank {rank}: cannot allocate {bytes} bytes for the pairwise {buffer} buffer; lower \
         --pairwise-size"
    )]
    Alloc {
        rank: usize,
        bytes: usize,
        buffer: &'static str,
    },
    /// A pairwise measurement, `what` naming the pair and the round.
    #[error("{what}")]
    Pairwise {
        what: String,
        #[source]
        source: CommError,
    },
    /// Rank 0 gave up on this rank's node (it answered too late, or its partners could not
    /// reach it); the gate goes on without it and rank 0's verdict names it.
    #[error("rank 0 marked this node ({node}) failed and goes on without it: {reason}")]
    MarkedFailed { node: String, reason: String },
    #[error("the job was aborted: {0}")]
    Aborted(String),
    /// Groups or pairs (in words) that never reported within their budget.
    #[error("{} did not finish within {secs} s", missing.join(", "))]
    Unfinished { missing: Vec<String>, secs: u64 },
    #[error("collecting every rank's node name for --label-nodes")]
    NodeNames(#[source] StoreError),
    /// The Kubernetes API refused a node patch, or could not be reached.
    #[error("{0}")]
    LabelNodes(String),
    /// A group's sweep, `what` naming the group.
    #[error("{what}")]
    Sweep {
        what: String,
        #[source]
        source: busbw_measure::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl From<BuildError> for Error {
    fn from(e: BuildError) -> Self {
        Error::Build(Box::new(e))
    }
}
