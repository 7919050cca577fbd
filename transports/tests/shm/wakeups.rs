//! Ranks that sleep instead of spinning must be woken by the peer's doorbell, or a
//! collective hangs.

use super::{host, pattern, shm, T};
use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::{Identity, Transport};
use std::time::{Duration, Instant};

/// Sleeps in poll(2) on what `sleep_on` names (far longer than the test's patience) until the
/// request completes: only a doorbell from the peer can end each sleep in time. Evaluates to
/// (bytes, sleeps).
macro_rules! sleep_until_done {
    ($comm:expr, $id:expr) => {{
        use busbw_transports::Sleep;
        let deadline = Instant::now() + T;
        let mut sleeps = 0u32;
        loop {
            if let Some(n) = $comm.test($id).unwrap() {
                break (n, sleeps);
            }
            assert!(Instant::now() < deadline, "a wake-up was lost");
            match $comm.sleep_on() {
                Sleep::Ready => {}
                Sleep::Readable(fd) => {
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // 60 s: the test fails on its own deadline long before a lost doorbell
                    // would let this return.
                    let rc = unsafe { libc::poll(&mut p, 1, 60_000) };
                    assert_eq!(rc, 1, "poll woke without an event");
                    sleeps += 1;
                }
                other => panic!("shared memory should sleep on its socket, not {other:?}"),
            }
            $comm.woke();
        }
    }};
}

/// A receiver asleep on its socket is woken by the sender's doorbell as soon as data is
/// published, and a sender asleep on a full ring is woken when the receiver frees space.
#[test]
fn shm_sleepers_are_woken_by_the_peer() {
    let a = ShmTransport::new(
        Identity::new(9, 0),
        ShmConfig {
            ring_bytes: 4096,
            ..ShmConfig::default()
        },
    );
    let b = shm(1, 9);
    let (handle, mut listener) = b.listen().unwrap();
    let mut send = a.connect(&handle, 0, T).unwrap();
    let mut recv = listener.accept(T).unwrap();

    // Receiver sleeps first; the sender publishes 200 ms later.
    let src = pattern(64, 5);
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let reg = a.register(host(src.as_ptr(), src.len())).unwrap();
        let id = unsafe { send.isend(&reg, src.as_ptr(), src.len(), 1) }.unwrap();
        while send.test(id).unwrap().is_none() {}
        // Now a message four times the ring: the sender must sleep until the receiver,
        // which starts late, frees space.
        let big = pattern(16 << 10, 6);
        let reg = a.register(host(big.as_ptr(), big.len())).unwrap();
        let id = unsafe { send.isend(&reg, big.as_ptr(), big.len(), 2) }.unwrap();
        let (n, sleeps) = sleep_until_done!(send, id);
        assert_eq!(n, big.len());
        (sleeps, send)
    });
    let mut dst = vec![0u8; 64];
    let reg = b.register(host(dst.as_ptr(), dst.len())).unwrap();
    let id = unsafe { recv.irecv(&reg, dst.as_mut_ptr(), 64, 1) }.unwrap();
    let t0 = Instant::now();
    let (n, sleeps) = sleep_until_done!(recv, id);
    assert_eq!(n, 64);
    assert_eq!(dst, pattern(64, 5));
    assert!(sleeps >= 1, "the receiver never slept");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "woken late: {:?}",
        t0.elapsed()
    );

    std::thread::sleep(Duration::from_millis(200));
    let mut big = vec![0u8; 16 << 10];
    let reg = b.register(host(big.as_ptr(), big.len())).unwrap();
    let id = unsafe { recv.irecv(&reg, big.as_mut_ptr(), big.len(), 2) }.unwrap();
    let (n, _) = sleep_until_done!(recv, id);
    assert_eq!(n, big.len());
    assert_eq!(big, pattern(16 << 10, 6));
    let (sender_sleeps, _send) = sender.join().unwrap();
    assert!(
        sender_sleeps >= 1,
        "the sender never slept on the full ring"
    );
}
