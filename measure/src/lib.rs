//! busbw's measurement, as nccl-tests does it: a checked [`Plan`] (sizes, types, ops, roots,
//! iterations, checks), the table of collectives ([`specs`]: one descriptor each, nccl-tests'
//! `testColl`), and the [`harness`] that sweeps a plan on a communicator, times every cell on
//! the host clock (or a device's events), validates it bit for bit and hands each row to a
//! [`busbw_reports::Sink`] as soon as it exists.
//!
//! Everything here runs on a [`busbw_collectives::Communicator`] the caller built: joining a
//! job, choosing transports and exit codes are `busbw-job`'s and the program's. So a test
//! measures in-process on a thread world (`busbw_collectives::testing`).

pub mod device;
mod error;
pub mod harness;
pub mod plan;
pub mod report;
pub mod resident;
pub mod sizes;
pub mod specs;

pub use error::{chain, Error, Result};
pub use harness::{run, run_with, Summary};
pub use plan::Plan;
