//! Data arrives intact, in order and no further than the message, whatever the sizes, the
//! ring's size, the number of channels and whether large messages go through the ring or are
//! read once from the sender.

use super::{host, pattern, shm, wait_both, wait_recv_err, T};
use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::{Identity, Transport, TransportError};
use std::time::{Duration, Instant};

/// The same checks as the TCP round trip: sizes far beyond the ring (partial copies on both
/// sides), zero bytes, one byte, then a tag mismatch.
#[test]
fn shm_round_trip_same_thread() {
    let a = shm(0, 42);
    let b = shm(1, 42);
    assert_eq!(a.properties().name, "shm");
    let (handle, mut listener) = b.listen().unwrap();
    let mut send = a.connect(&handle, 3, T).unwrap();
    let mut recv = listener.accept(T).unwrap();
    assert_eq!(recv.peer(), 0);
    assert_eq!(recv.channel(), 3, "the channel travels in the hello");
    assert_eq!(send.peer(), 1);

    let n = 24 << 20;
    let src = pattern(n, 3);
    let mut dst = vec![0u8; n + 64];
    let sreg = a.register(host(src.as_ptr(), n)).unwrap();
    let rreg = b.register(host(dst.as_ptr(), n + 64)).unwrap();
    for (tag, len) in [(5u32, n), (6, 0), (7, 1), (8, 1000), (9, (4 << 20) - 16)] {
        dst.iter_mut().for_each(|b| *b = 0);
        let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), n + 64, tag) }.unwrap();
        let sr = unsafe { send.isend(&sreg, src.as_ptr(), len, tag) }.unwrap();
        let (s, r) = wait_both(send.as_mut(), sr, recv.as_mut(), rr);
        assert_eq!((s, r), (len, len));
        assert_eq!(&dst[..len], &src[..len]);
        assert!(dst[len..].iter().all(|&b| b == 0), "wrote past the message");
    }

    let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), 16, 1) }.unwrap();
    let _ = unsafe { send.isend(&sreg, src.as_ptr(), 8, 2) }.unwrap();
    let err = wait_recv_err(recv.as_mut(), rr, || {});
    assert!(
        matches!(
            err,
            TransportError::TagMismatch {
                peer: 0,
                expected: 1,
                got: 2
            }
        ),
        "{err}"
    );
}

/// Sender and receiver on their own threads, many requests in flight on both sides, sizes
/// that are not multiples of anything, so the ring wraps at every possible offset.
#[test]
fn shm_streams_across_threads_in_order() {
    let a = shm(2, 7);
    let b = shm(3, 7);
    let (handle, mut listener) = b.listen().unwrap();
    let sizes: Vec<usize> = (0..200)
        .map(|i| match i % 5 {
            0 => 0,
            1 => 1 + i,
            2 => (24 << 20) / (1 + i % 7),
            3 => 4 << 20,
            _ => 65_537 * i,
        })
        .collect();
    let max = *sizes.iter().max().unwrap();
    let sizes2 = sizes.clone();
    let sender = std::thread::spawn(move || {
        let mut send = a.connect(&handle, 0, T).unwrap();
        let srcs: Vec<Vec<u8>> = (0..4).map(|k| pattern(max, k)).collect();
        let regs: Vec<_> = srcs
            .iter()
            .map(|s| a.register(host(s.as_ptr(), max)).unwrap())
            .collect();
        let mut pending = std::collections::VecDeque::new();
        for (i, &len) in sizes2.iter().enumerate() {
            let k = i % 4;
            if pending.len() == 4 {
                let r = pending.pop_front().unwrap();
                while send.test(r).unwrap().is_none() {}
            }
            let r = unsafe { send.isend(&regs[k], srcs[k].as_ptr(), len, i as u32) }.unwrap();
            pending.push_back(r);
        }
        for r in pending {
            while send.test(r).unwrap().is_none() {}
        }
        // Dropping at once must not lose data the receiver has not read yet.
    });
    let mut recv = listener.accept(T).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; max]).collect();
    let regs: Vec<_> = bufs
        .iter()
        .map(|d| b.register(host(d.as_ptr(), max)).unwrap())
        .collect();
    let mut pending = std::collections::VecDeque::new();
    let check = |i: usize, got: usize, buf: &[u8]| {
        assert_eq!(got, sizes[i], "message {i}");
        assert!(buf[..got] == pattern(got, i % 4)[..], "message {i} corrupt");
    };
    for i in 0..sizes.len() {
        if pending.len() == 3 {
            let (j, r) = pending.pop_front().unwrap();
            let got = loop {
                if let Some(n) = recv.test(r).unwrap() {
                    break n;
                }
            };
            check(j, got, &bufs[j % 3]);
        }
        let buf = &mut bufs[i % 3];
        let r = unsafe { recv.irecv(&regs[i % 3], buf.as_mut_ptr(), max, i as u32) }.unwrap();
        pending.push_back((i, r));
    }
    for (j, r) in pending {
        let got = loop {
            if let Some(n) = recv.test(r).unwrap() {
                break n;
            }
        };
        check(j, got, &bufs[j % 3]);
    }
    sender.join().unwrap();
}

/// A small ring (4 KiB) and many channels between the same ranks: every channel is its own
/// ordered stream.
#[test]
fn shm_small_ring_and_channels() {
    let cfg = ShmConfig {
        ring_bytes: 4096,
        max_requests: 8,
        // The ring path, wrapping around many times per message.
        single_copy: false,
        ..ShmConfig::default()
    };
    let a = ShmTransport::new(Identity::new(5, 0), cfg.clone());
    let b = ShmTransport::new(Identity::new(5, 1), cfg);
    assert_eq!(a.properties().max_requests, 8);
    let (handle, mut listener) = b.listen().unwrap();
    let mut sends: Vec<_> = (0..3).map(|c| a.connect(&handle, c, T).unwrap()).collect();
    let mut recvs: Vec<_> = (0..3).map(|_| listener.accept(T).unwrap()).collect();
    recvs.sort_by_key(|r| r.channel());
    let n = 100_003;
    let src: Vec<Vec<u8>> = (0..3).map(|c| pattern(n, c)).collect();
    let mut dst: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; n]).collect();
    let sregs: Vec<_> = src
        .iter()
        .map(|s| a.register(host(s.as_ptr(), n)).unwrap())
        .collect();
    let rregs: Vec<_> = dst
        .iter()
        .map(|d| b.register(host(d.as_ptr(), n)).unwrap())
        .collect();
    let mut reqs = Vec::new();
    for c in 0..3 {
        let rr = unsafe { recvs[c].irecv(&rregs[c], dst[c].as_mut_ptr(), n, 11) }.unwrap();
        let sr = unsafe { sends[c].isend(&sregs[c], src[c].as_ptr(), n, 11) }.unwrap();
        reqs.push((sr, rr));
    }
    for c in (0..3).rev() {
        let (sr, rr) = reqs[c];
        let (s, r) = wait_both(sends[c].as_mut(), sr, recvs[c].as_mut(), rr);
        assert_eq!((s, r), (n, n));
    }
    assert_eq!(dst, src);
    // More requests than the table holds is an error naming the peer.
    let mut ids = Vec::new();
    let err = loop {
        match unsafe { recvs[0].irecv(&rregs[0], dst[0].as_mut_ptr(), 1, 0) } {
            Ok(id) => ids.push(id),
            Err(e) => break e,
        }
    };
    assert_eq!(ids.len(), 8);
    assert!(
        matches!(err, TransportError::TooManyRequests { peer: 0, max: 8 }),
        "{err}"
    );
}

/// Large messages are read once, from the sender's memory: the send completes only when the
/// receiver has copied it (with the ring it completes as soon as the bytes are in the ring),
/// and small and large messages interleave in order either way.
#[test]
fn shm_single_copy_large_messages() {
    use busbw_transports::shm::CMA_MIN;
    for single_copy in [true, false] {
        let cfg = ShmConfig {
            single_copy,
            ..ShmConfig::default()
        };
        let a = ShmTransport::new(Identity::new(8, 0), cfg.clone());
        let b = ShmTransport::new(Identity::new(8, 1), cfg.clone());
        let (handle, mut listener) = b.listen().unwrap();
        let mut send = a.connect(&handle, 0, T).unwrap();
        let mut recv = listener.accept(T).unwrap();
        let sizes = [CMA_MIN, 10, 1 << 20, CMA_MIN - 1, 3 << 20, 0];
        let total: usize = sizes.iter().sum();
        let src = pattern(total, 9);
        let mut dst = vec![0u8; total];
        let sreg = a.register(host(src.as_ptr(), total)).unwrap();
        let rreg = b.register(host(dst.as_ptr(), total)).unwrap();
        // The first (large) message alone, before the receiver does anything.
        let first = unsafe { send.isend(&sreg, src.as_ptr(), CMA_MIN, 1) }.unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let done_early = send.test(first).unwrap().is_some();
        // The portable platform has no cross-memory reads: whatever the configuration
        // asks, the bytes go through the ring.
        let once = single_copy && cfg.platform.cross_memory().is_some();
        assert_eq!(
            done_early, !once,
            "single_copy={single_copy} on {}: a send completes early only through the ring",
            cfg.platform
        );
        let mut off = 0;
        let mut ids = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let tag = 1 + i as u32;
            let sid = if i == 0 {
                first
            } else {
                unsafe { send.isend(&sreg, src.as_ptr().add(off), len, tag) }.unwrap()
            };
            let rid = unsafe { recv.irecv(&rreg, dst.as_mut_ptr().add(off), len, tag) }.unwrap();
            ids.push((sid, rid, len, i == 0 && done_early));
            off += len;
        }
        for (sid, rid, len, already) in ids {
            if already {
                let deadline = Instant::now() + T;
                while recv.test(rid).unwrap().is_none() {
                    assert!(Instant::now() < deadline, "timed out");
                }
            } else {
                assert_eq!(
                    wait_both(send.as_mut(), sid, recv.as_mut(), rid),
                    (len, len)
                );
            }
        }
        assert!(dst == src, "single_copy={single_copy}: bytes differ");
    }
}
