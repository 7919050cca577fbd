//! The control plane of a busbw job: who each rank is, how the ranks find each other, and how
//! they agree, wait for each other and stop together.
//!
//! Everything here is off the measured path. The rendezvous store, barriers and abort
//! broadcast exchange a few small messages per run, so they favour robustness and clear error
//! messages (a timeout names the keys, hence the ranks, that never showed up; a lost store
//! names rank 0) over speed. The store server is the only async code in the project: it runs a
//! tokio runtime on a private thread because it must hold a connection per rank, most of them
//! parked in a WAIT. Every API this crate exposes is blocking, so the data path (transports and
//! collectives) never runs on, or waits for, an async executor and its timings stay free of
//! scheduler noise.
//!
//! - [`world`]: the job as described by launcher environment variables.
//! - [`store`]: the key/value store (in-process and TCP) the ranks rendezvous through.
//! - [`mod@rendezvous`]: joining the job, barriers, abort broadcast, orderly shutdown.
//! - [`local`]: the `--np N` launcher that runs N ranks on this host.

pub mod local;
pub mod rendezvous;
pub mod store;
pub mod world;

pub use local::{LaunchError, LocalLaunch};
pub use rendezvous::{rendezvous, Rendezvous};
pub use store::{MemoryStore, PrefixStore, Store, StoreError, TcpStoreClient, TcpStoreServer};
pub use world::{hostname, World, WorldError};
