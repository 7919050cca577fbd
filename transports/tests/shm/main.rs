//! The shared-memory transport must behave like TCP (same errors, same ordering), within one
//! process across threads and across two real processes.
//!
//! One test binary with a module per topic, so that CI links it once; the helpers every
//! module shares live here.

mod delivery;
mod errors;
mod processes;
mod throughput;
mod wakeups;

#[path = "../common/mod.rs"]
mod common;

use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::Identity;

pub(crate) use common::{host, pattern, wait_both, wait_recv_err, T};

pub(crate) fn shm(rank: u32, job: u64) -> ShmTransport {
    ShmTransport::new(Identity::new(job, rank), ShmConfig::default())
}
