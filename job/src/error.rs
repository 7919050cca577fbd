//! What can stop a rank from joining its job or a group. Leaf errors keep their types (the
//! store's, a collective's, a flags disagreement): the program decides its exit code by
//! them; every layer adds the words that say where it happened, as `anyhow`'s context does.

use crate::session::FlagsDiffer;
use crate::subcomm::BuildError;
use busbw_collectives::CommError;
use busbw_launchers::bootstrap::BootstrapError;
use busbw_launchers::StoreError;
use busbw_transports::TransportError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Ranks started with different flags or binaries (a usage error: the fix is the
    /// command line).
    #[error(transparent)]
    Flags(#[from] FlagsDiffer),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Measure(#[from] busbw_measure::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// `--engine nccl`: this rank could not join NCCL's communicator.
    #[error(transparent)]
    Nccl(#[from] Box<crate::nccl::JoinError>),
    /// A setting that cannot work here (an interface, an RDMA port), in words.
    #[error("{0}")]
    Setup(String),
    /// Where an inner failure happened.
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// The innermost error of this crate's, below every context.
    pub fn leaf(&self) -> &Error {
        match self {
            Error::Context { source, .. } => source.leaf(),
            e => e,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `anyhow`'s `context` for this crate's typed errors.
pub(crate) trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what.into(),
            source: Box::new(e.into()),
        })
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what(),
            source: Box::new(e.into()),
        })
    }
}

/// `Option`'s `context`: `None` becomes a setup error in those words.
pub(crate) trait OrSetup<T> {
    fn or_setup(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> OrSetup<T> for Option<T> {
    fn or_setup(self, what: impl FnOnce() -> String) -> Result<T> {
        self.ok_or_else(|| Error::Setup(what()))
    }
}
