//! What can stop a measurement. Leaf errors keep their types (a collective's [`CommError`]
//! above all: the program decides its exit code by it), and every layer adds the words that
//! say where it happened, as `anyhow`'s context does, so a message reads "all_reduce_perf
//! float sum at 1048576 bytes (in-place): rank 3 closed the connection".

use busbw_collectives::CommError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A collective or a control exchange (barrier, combined times) failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Memory a rank asked for could not be had, or a device call failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Memory a rank asked for could not be had, in words that say what to lower.
    #[error("{0}")]
    Memory(String),
    /// A device call failed: CUDA, the device's selection, its export for RDMA.
    #[error(transparent)]
    Device(Box<dyn std::error::Error + Send + Sync>),
    /// The plan does not fit this communicator (a root outside it), or this build.
    #[error("{0}")]
    Usage(String),
    /// `--debug-fail-rank`: the failure asked for.
    #[error("{0}")]
    Injected(String),
    /// Where an inner failure happened.
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// The collective's failure underneath the context, if that is what stopped the run.
    pub fn comm(&self) -> Option<&CommError> {
        match self {
            Error::Comm(c) => Some(c),
            Error::Context { source, .. } => source.comm(),
            _ => None,
        }
    }
}

impl From<busbw_collectives::cuda::select::SelectError> for Error {
    fn from(e: busbw_collectives::cuda::select::SelectError) -> Self {
        Error::Device(Box::new(e))
    }
}

impl From<busbw_collectives::OffloadError> for Error {
    fn from(e: busbw_collectives::OffloadError) -> Self {
        Error::Device(Box::new(e))
    }
}

#[cfg(feature = "cuda")]
impl From<busbw_collectives::cuda::device::CudaError> for Error {
    fn from(e: busbw_collectives::cuda::device::CudaError) -> Self {
        Error::Device(Box::new(e))
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

/// The error and its causes in one line, as `anyhow` prints `{:#}`: what a program shows.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
