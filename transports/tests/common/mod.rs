//! Helpers the transports' test binaries share (`transports.rs` and `shm/`): a deadline for
//! every wait, host regions, and waiting for requests.
// Each binary uses its own subset.
#![allow(dead_code)]

use busbw_transports::{MemRegion, MemoryKind, RecvComm, RequestId, SendComm, TransportError};
use std::time::{Duration, Instant};

pub const T: Duration = Duration::from_secs(10);

pub fn host(ptr: *const u8, len: usize) -> MemRegion {
    unsafe { MemRegion::new(ptr as *mut u8, len, MemoryKind::Host) }
}

pub fn wait_both(
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

pub fn wait_recv_err(
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

pub fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + seed) as u8).collect()
}
