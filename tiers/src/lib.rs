//! `busbw tiers` as a library: does each tier of the fabric deliver, and which node or link
//! does not?
//!
//! Every rank publishes its node's labels; all derive the same tier model and groups from
//! them ([`Topology`]). Then [`run`]: the collective over the whole job; per tier, closest
//! first, the collective in every group of the tier at once, each group on its own
//! sub-communicator ([`subcomm`]); a round robin of node pairs running sendrecv
//! ([`schedule`]); and on rank 0 the tier table, the link matrix and a verdict from robust
//! statistics over the links ([`analysis`]), which `--label-nodes` turns into node labels
//! ([`gate`]).
//!
//! The program lends what only it can do through [`Bench`]: time its collective's sweep on a
//! communicator and show it. Flags, joining the job, and exit codes stay with the program.

pub mod analysis;
mod conclude;
mod error;
pub mod gate;
mod pairwise;
mod run;
pub mod schedule;
pub mod subcomm;
mod topology;

pub use conclude::Conclusion;
pub use error::{Error, RunError};
pub use run::{run, Bench, Job, Options, Sweep};
pub use subcomm::{BuildError, Factory, MakeTransport};
pub use topology::Topology;
