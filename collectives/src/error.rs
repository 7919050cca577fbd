use busbw_transports::TransportError;

/// Errors name this rank and, when one is involved, the peer: on a cluster that is what
/// points at the node or link to look at.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The transport error is part of the message, not a `source`: printed chains would
    /// otherwise say it twice.
    #[error("rank {rank}: {during}: {cause}")]
    Transport {
        rank: usize,
        peer: Option<usize>,
        during: String,
        cause: TransportError,
    },
    /// The peer's handle could not be had: it never registered, or this rank's transports
    /// cannot reach it. Its cause says which.
    #[error("rank {rank}: looking up how to reach rank {peer}")]
    Lookup {
        rank: usize,
        peer: usize,
        #[source]
        cause: LookupError,
    },
    #[error("rank {rank}: no progress for {secs:.0} s {what}")]
    Timeout {
        rank: usize,
        peer: Option<usize>,
        secs: f64,
        what: String,
    },
    #[error("rank {rank}: stopping because {reason}")]
    Aborted { rank: usize, reason: String },
    #[error("rank {rank}: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        rank: usize,
        bytes: usize,
        what: &'static str,
    },
    #[error("rank {rank}: {during}: device: {cause}")]
    Device {
        rank: usize,
        during: String,
        cause: crate::offload::OffloadError,
    },
    #[error("{0}")]
    Invalid(String),
}

impl CommError {
    /// A message of the wrong length: the ranks were started with different sizes or are out
    /// of step. Every algorithm reports it the same way.
    pub(crate) fn short_message(
        rank: usize,
        what: &str,
        peer: usize,
        got: usize,
        want: usize,
    ) -> Self {
        CommError::Invalid(format!(
            "rank {rank}: {what}: rank {peer} sent {got} bytes where {want} were expected (ranks disagree about the count)"
        ))
    }

    /// The peer rank the failure points at, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            CommError::Transport { peer, cause, .. } => peer.or(cause.peer().map(|p| p as usize)),
            CommError::Timeout { peer, .. } => *peer,
            CommError::Lookup { peer, .. } => Some(*peer),
            _ => None,
        }
    }
}

/// Why a peer's handle could not be had, in the book's own words (it never registered, it
/// cannot be reached with this rank's transports): the communicator adds which rank asked
/// and for whom.
pub type LookupError = Box<dyn std::error::Error + Send + Sync>;
