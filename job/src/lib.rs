//! busbw's job: from a launcher's [`busbw_launchers::World`] to a connected
//! [`busbw_collectives::Communicator`] ([`Session`]: rendezvous, the same flags on every
//! rank, transports chosen per peer as NCCL does, the node map), the communicators of
//! groups ([`subcomm`]: tier groups, `NCCL_TESTS_SPLIT`), and what a failing job says
//! about itself ([`diagnose`]: the rank that stopped answering, the root cause behind a
//! closed connection; [`signals`]: SIGTERM as the job's abort).
//!
//! Measuring is `busbw-measure`'s; exit codes and terminal output are the program's.

pub mod diagnose;
mod error;
pub mod hosts;
pub mod nccl;
mod session;
pub mod signals;
pub mod split;
pub mod subcomm;
pub mod threads;
pub mod transport;

pub use error::{Error, Result};
pub use session::{join_rendezvous, FlagsDiffer, JoinOptions, Session, LEAVING};
pub use subcomm::{BuildError, Factory};
