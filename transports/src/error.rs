use std::io;

pub type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Errors name the peer rank whenever one is known, so that the message a user sees points at
/// the node or link to look at.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("peer rank {peer} closed the connection")]
    PeerClosed { peer: u32 },
    // The io::Error is part of the message rather than a `source`, so that error chains
    // printed with `{:#}` do not repeat it.
    #[error("I/O error with peer rank {peer}: {error}")]
    PeerIo { peer: u32, error: io::Error },
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("message truncated: peer rank {peer} sent {sent} bytes but only {posted} were posted (ranks disagree about the collective's size)")]
    Truncated { peer: u32, sent: u64, posted: usize },
    #[error("tag mismatch from peer rank {peer}: expected {expected}, got {got} (ranks are out of step)")]
    TagMismatch { peer: u32, expected: u32, got: u32 },
    #[error("bad handle: {0}")]
    BadHandle(String),
    #[error("handshake failed: {0}")]
    Handshake(String),
    #[error("timed out after {secs:.1}s {what}")]
    Timeout { secs: f64, what: String },
    #[error("too many requests in flight on the comm to rank {peer} (max {max})")]
    TooManyRequests { peer: u32, max: usize },
    #[error("unknown request id {0}")]
    UnknownRequest(u32),
    #[error("buffer outside its registration")]
    OutsideRegistration,
    #[error("{0}")]
    Unsupported(String),
    /// Device memory offered to a transport that cannot register it. Callers fall back to
    /// staging through pinned host memory and print `missing` as the reason.
    #[error("the {transport} transport cannot register CUDA device memory: {missing}; stage it through pinned host memory instead")]
    DeviceMemory {
        transport: &'static str,
        missing: String,
    },
    /// A failed RDMA work completion or verbs call, decoded (`verbs::wc`).
    #[error("RDMA with peer rank {peer}: {msg}")]
    Rdma { peer: u32, msg: String },
}

impl TransportError {
    /// The peer this error is about, if any.
    pub fn peer(&self) -> Option<u32> {
        match self {
            TransportError::PeerClosed { peer }
            | TransportError::PeerIo { peer, .. }
            | TransportError::Truncated { peer, .. }
            | TransportError::TagMismatch { peer, .. }
            | TransportError::TooManyRequests { peer, .. }
            | TransportError::Rdma { peer, .. } => Some(*peer),
            _ => None,
        }
    }
}
