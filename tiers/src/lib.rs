//! `busbw tiers` as a library: does each tier of the fabric deliver, and which node or link
//! does not?
//!
//! Every rank publishes its node's labels; all derive the same tier model and groups from
//! them ([`Topology`]). Then [`run`]: the collective over the whole job; per tier, closest
//! first, the collective in every group of the tier at once, each group on its own
//! sub-communicator (`busbw_job::subcomm`); a round robin of node pairs running sendrecv
//! ([`schedule`]); and on rank 0 the tier table, the link matrix and a verdict from robust
//! statistics over the links ([`analysis`]), which `--label-nodes` turns into node labels
//! ([`gate`]).
//!
//! The program sweeps the whole job itself (the main table) and hands what it measured to
//! [`run`], which sweeps the groups on `busbw-measure`'s harness. Flags, joining the job,
//! and exit codes stay with the program.

pub mod adaptive;
pub mod analysis;
pub mod budget;
mod conclude;
mod error;
pub mod fabric;
pub mod gate;
pub mod halve;
mod liveness;
mod pairwise;
mod run;
pub mod schedule;
mod topology;
pub mod uplink;

pub use conclude::Conclusion;
pub use error::Error;
pub use liveness::Lost;
pub use run::{run, Collect, Job, Options, Sweep};
pub use topology::Topology;
