//! The control plane of a busbw job: who each rank is, how the ranks find each other, and how
//! they agree, wait for each other and stop together.
//!
//! Everything here is off the measured path. The rendezvous store, barriers and abort
//! broadcast exchange a few small messages per run, so they favour robustness and clear error
//! messages (a timeout names the keys, hence the ranks, that never showed up; a lost store
//! names rank 0; a rank 0 that cannot be reached says whether its name never resolved, its
//! port refused, or nothing answered) over speed. The store server is the only async code in
//! the project: it runs a tokio runtime on a private thread because it must hold a connection
//! per rank, most of them parked in a WAIT. Every API this crate exposes is blocking, so the
//! data path (transports and collectives) never runs on, or waits for, an async executor and
//! its timings stay free of scheduler noise.
//!
//! - [`mod@detect`]: the job as described by whatever launched this process (torchrun, Volcano,
//!   Slurm, MPI, Kubernetes Indexed Job / JobSet).
//! - [`world`]: the job as described by torchrun-style variables; `--nproc-per-node`
//!   expansion.
//! - [`store`]: the key/value store (in-process and TCP) the ranks rendezvous through.
//! - [`token`]: the job token that keeps other jobs out of the store.
//! - [`mod@rendezvous`]: joining the job, barriers, abort broadcast, orderly shutdown.
//! - [`bootstrap`]: the ranks' records, configuration agreement and node map through the
//!   store, each rank fetching only what it needs.
//! - [`rank_info`]: what each rank tells the others about itself when it joins.
//! - [`topology`]: node labels, their conventions and sources, and the tier model built on
//!   them (for `busbw tiers`).
//! - [`signal`]: SIGTERM/SIGINT caught and turned into an orderly, named abort.
//! - [`local`]: the `--np N` launcher that runs a whole job on this host, and the
//!   `--nproc-per-node G` launcher that runs this pod's share of a cluster job.

pub mod bootstrap;
pub mod detect;
pub mod local;
pub mod rank_info;
pub mod rendezvous;
pub mod signal;
pub mod store;
pub mod token;
pub mod topology;
pub mod world;

pub use detect::{
    detect, detect_from_env, expand_nodelist, DetectOptions, Detection, Launcher, UnknownLauncher,
};
pub use local::{run_pod, LaunchError, LocalLaunch, LAUNCHED_ENV};
pub use rank_info::RankInfo;
pub use rendezvous::{missing_ranks, never_registered, rendezvous, rendezvous_with, Rendezvous};
pub use store::{MemoryStore, PrefixStore, Store, StoreError, TcpStoreClient, TcpStoreServer};
pub use token::{token_digest, JOB_TOKEN_ENV};
pub use world::{expand, hostname, World, WorldError};
