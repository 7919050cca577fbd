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

use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::{
    Identity, MemRegion, MemoryKind, RecvComm, RequestId, SendComm, TransportError,
};
use std::time::{Duration, Instant};

pub(crate) const T: Duration = Duration::from_secs(10);

pub(crate) fn shm(rank: u32, job: u64) -> ShmTransport {
    ShmTransport::new(Identity::new(job, rank), ShmConfig::default())
}

pub(crate) fn host(ptr: *const u8, len: usize) -> MemRegion {
    unsafe { MemRegion::new(ptr as *mut u8, len, MemoryKind::Host) }
}

pub(crate) fn wait_both(
    s: &mut dyn SendComm,
    sr: RequestId,
    r: &mut dyn RecvComm,
    rr: RequestId,
) -> (usize, usize) {
    let deadline = Instant::now() + T;
    let (mut a, mut b) = (None, None);
    while a.is_none() || b.is_none() {
        assert!(Instant::now() < deadline, "timed out");
        if a.is_none() {
            a = s.test(sr).unwrap();
        }
        if b.is_none() {
            b = r.test(rr).unwrap();
        }
    }
    (a.unwrap(), b.unwrap())
}

pub(crate) fn wait_recv_err(
    r: &mut dyn RecvComm,
    rr: RequestId,
    mut poke: impl FnMut(),
) -> TransportError {
    let deadline = Instant::now() + T;
    loop {
        assert!(Instant::now() < deadline, "timed out");
        match r.test(rr) {
            Ok(None) => {
                poke();
                std::thread::yield_now();
            }
            Ok(Some(n)) => panic!("request completed with {n} bytes"),
            Err(e) => break e,
        }
    }
}

pub(crate) fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + seed) as u8).collect()
}
