//! Both transports must behave alike: that is what lets algorithm tests run on `inproc` and
//! trust the result on TCP.

use busbw_transports::inproc::InprocTransport;
use busbw_transports::tcp::{TcpConfig, TcpTransport};
use busbw_transports::{Identity, MemRegion, MemoryKind, RequestId, Transport, TransportError};
use std::io::Write;
use std::time::{Duration, Instant};

mod common;

use common::{wait_both, T};

fn tcp(rank: u32, job: u64) -> Box<dyn Transport> {
    Box::new(TcpTransport::new(
        Identity::new(job, rank),
        TcpConfig::default(),
    ))
}

/// TCP with helper threads and several data sockets per connection (long messages split).
fn tcp_lanes(rank: u32, job: u64) -> Box<dyn Transport> {
    Box::new(TcpTransport::new(
        Identity::new(job, rank),
        TcpConfig {
            threads: 2,
            socks_per_thread: 2,
            ..TcpConfig::default()
        },
    ))
}

fn inproc(rank: u32, job: u64) -> Box<dyn Transport> {
    Box::new(InprocTransport::new(Identity::new(job, rank)))
}

fn round_trip(mk: fn(u32, u64) -> Box<dyn Transport>) {
    let a = mk(0, 42);
    let b = mk(1, 42);
    let (handle, mut listener) = b.listen().unwrap();
    let mut send = a.connect(&handle, 3, T).unwrap();
    let mut recv = listener.accept(T).unwrap();
    assert_eq!(recv.peer(), 0);
    assert_eq!(recv.channel(), 3, "the channel travels in the hello");
    assert_eq!(send.peer(), 1);

    // Large enough to exceed socket buffers, so partial reads and writes happen.
    let n = 24 << 20;
    let src: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; n + 64];
    let sreg = a
        .register(unsafe { MemRegion::new(src.as_ptr() as *mut u8, n, MemoryKind::Host) })
        .unwrap();
    let rreg = b
        .register(unsafe { MemRegion::new(dst.as_mut_ptr(), n + 64, MemoryKind::Host) })
        .unwrap();
    for (tag, len) in [(5u32, n), (6, 0), (7, 1), (8, 1000)] {
        let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), n + 64, tag) }.unwrap();
        let sr = unsafe { send.isend(&sreg, src.as_ptr(), len, tag) }.unwrap();
        let (s, r) = wait_both(send.as_mut(), sr, recv.as_mut(), rr);
        assert_eq!((s, r), (len, len));
        assert_eq!(&dst[..len], &src[..len]);
    }

    // A tag the receiver does not expect means the ranks are out of step.
    let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), 16, 1) }.unwrap();
    let _ = unsafe { send.isend(&sreg, src.as_ptr(), 8, 2) }.unwrap();
    let err = loop {
        match recv.test(rr) {
            Ok(None) => {
                let _ = send.test(RequestId(0));
            }
            Ok(Some(_)) => panic!("mismatched tag accepted"),
            Err(e) => break e,
        }
    };
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

#[test]
fn tcp_round_trip() {
    round_trip(tcp);
}

/// One connection for both directions: the connector gets both halves, the acceptor finds
/// its sending half in the receiving one (once), and the two directions are independent
/// streams: long messages both ways at once, each side's tags and bytes its own.
#[test]
fn tcp_duplex_carries_both_directions() {
    let a = tcp(0, 43);
    let b = tcp(1, 43);
    let (handle, mut listener) = b.listen().unwrap();
    assert!(
        a.duplex(&handle),
        "tcp without lanes offers two-way connections"
    );
    let (mut a_send, mut a_recv) = a.connect_duplex(&handle, 2, T).unwrap();
    let mut b_recv = listener.accept(T).unwrap();
    assert_eq!((b_recv.peer(), b_recv.channel()), (0, 2));
    let mut b_send = b_recv.take_reverse().expect("the acceptor's sending half");
    assert!(b_recv.take_reverse().is_none(), "taken once");
    assert_eq!((a_recv.peer(), a_recv.channel(), b_send.peer()), (1, 2, 0));

    let n = 8 << 20;
    let ab: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let ba: Vec<u8> = (0..n).map(|i| (i * 13 + 1) as u8).collect();
    let (mut at_b, mut at_a) = (vec![0u8; n], vec![0u8; n]);
    let reg = |t: &dyn Transport, p: *const u8| {
        t.register(unsafe { MemRegion::new(p as *mut u8, n, MemoryKind::Host) })
            .unwrap()
    };
    let (ra_out, ra_in) = (reg(&*a, ab.as_ptr()), reg(&*a, at_a.as_ptr()));
    let (rb_out, rb_in) = (reg(&*b, ba.as_ptr()), reg(&*b, at_b.as_ptr()));
    for (tag_ab, tag_ba, len) in [(5u32, 6u32, n), (7, 8, 8), (9, 10, 0), (11, 12, 4096)] {
        // Both directions in flight at once, progressed by one thread: non-blocking halves
        // on one socket must not wait for each other.
        let r1 = unsafe { b_recv.irecv(&rb_in, at_b.as_mut_ptr(), n, tag_ab) }.unwrap();
        let r2 = unsafe { a_recv.irecv(&ra_in, at_a.as_mut_ptr(), n, tag_ba) }.unwrap();
        let s1 = unsafe { a_send.isend(&ra_out, ab.as_ptr(), len, tag_ab) }.unwrap();
        let s2 = unsafe { b_send.isend(&rb_out, ba.as_ptr(), len, tag_ba) }.unwrap();
        let deadline = Instant::now() + T;
        let mut done = [None; 4];
        while done.iter().any(Option::is_none) {
            assert!(Instant::now() < deadline, "timed out");
            done[0] = done[0].or(a_send.test(s1).unwrap());
            done[1] = done[1].or(b_send.test(s2).unwrap());
            done[2] = done[2].or(b_recv.test(r1).unwrap());
            done[3] = done[3].or(a_recv.test(r2).unwrap());
        }
        assert_eq!(done, [Some(len); 4]);
        assert!(at_b[..len] == ab[..len] && at_a[..len] == ba[..len]);
    }

    // A one-way connection has no sending half to give; with helper lanes there are no
    // two-way connections at all.
    let _one_way = a.connect(&handle, 3, T).unwrap();
    assert!(listener.accept(T).unwrap().take_reverse().is_none());
    let lanes = tcp_lanes(2, 43);
    assert!(!lanes.duplex(&handle));
    assert!(lanes.connect_duplex(&handle, 0, T).is_err());
}

#[test]
fn tcp_lanes_round_trip() {
    round_trip(tcp_lanes);
}

#[test]
fn inproc_round_trip() {
    round_trip(inproc);
}

fn truncation(mk: fn(u32, u64) -> Box<dyn Transport>) {
    let a = mk(3, 1);
    let b = mk(4, 1);
    let (handle, mut listener) = b.listen().unwrap();
    let mut send = a.connect(&handle, 0, T).unwrap();
    let mut recv = listener.accept(T).unwrap();
    let src = [1u8; 100];
    let mut dst = vec![0u8; 100];
    let sreg = a
        .register(unsafe { MemRegion::new(src.as_ptr() as *mut u8, 100, MemoryKind::Host) })
        .unwrap();
    let rreg = b
        .register(unsafe { MemRegion::new(dst.as_mut_ptr(), 100, MemoryKind::Host) })
        .unwrap();
    let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), 10, 0) }.unwrap();
    let _sr = unsafe { send.isend(&sreg, src.as_ptr(), 100, 0) }.unwrap();
    let deadline = Instant::now() + T;
    let err = loop {
        assert!(Instant::now() < deadline);
        match recv.test(rr) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("oversized message accepted"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err,
            TransportError::Truncated {
                peer: 3,
                sent: 100,
                posted: 10
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("rank 3"), "{err}");
}

#[test]
fn tcp_truncation_is_an_error() {
    truncation(tcp);
}

#[test]
fn tcp_lanes_truncation_is_an_error() {
    truncation(tcp_lanes);
}

#[test]
fn inproc_truncation_is_an_error() {
    truncation(inproc);
}

fn peer_closed(mk: fn(u32, u64) -> Box<dyn Transport>) {
    let a = mk(2, 9);
    let b = mk(5, 9);
    let (handle, mut listener) = b.listen().unwrap();
    let send = a.connect(&handle, 0, T).unwrap();
    let mut recv = listener.accept(T).unwrap();
    drop(send);
    let mut dst = vec![0u8; 8];
    let rreg = b
        .register(unsafe { MemRegion::new(dst.as_mut_ptr(), 8, MemoryKind::Host) })
        .unwrap();
    let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), 8, 0) }.unwrap();
    let deadline = Instant::now() + T;
    let err = loop {
        assert!(Instant::now() < deadline);
        match recv.test(rr) {
            Ok(None) => std::thread::yield_now(),
            Ok(Some(_)) => panic!("received from a closed peer"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, TransportError::PeerClosed { peer: 2 }),
        "{err}"
    );
}

#[test]
fn tcp_peer_closed_names_the_peer() {
    peer_closed(tcp);
}

#[test]
fn tcp_lanes_peer_closed_names_the_peer() {
    peer_closed(tcp_lanes);
}

#[test]
fn inproc_peer_closed_names_the_peer() {
    peer_closed(inproc);
}

/// Strangers (garbage, another job's token) are dropped; the real peer still gets through.
#[test]
fn tcp_refuses_stray_connections() {
    let b = tcp(1, 77);
    let (handle, mut listener) = b.listen().unwrap();
    let text = String::from_utf8(handle.0.clone()).unwrap();
    let addr = text.split("addr=").nth(1).unwrap();
    let addr = addr.split_whitespace().next().unwrap().to_string();

    let mut garbage = std::net::TcpStream::connect(&addr).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxx")
        .unwrap();
    let other_job = tcp(0, 78);
    let _wrong = other_job.connect(&handle, 0, T).unwrap();
    let right = tcp(6, 77);
    let _ok = right.connect(&handle, 0, T).unwrap();

    let recv = listener.accept(T).unwrap();
    assert_eq!(
        recv.peer(),
        6,
        "only the connection from our job is accepted"
    );
    let err = match listener.accept(Duration::from_millis(300)) {
        Err(e) => e,
        Ok(_) => panic!("a stray connection was accepted"),
    };
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
}

/// Whoever cannot prove the job token is refused, by tcp (with and without helper sockets) and
/// shm here, and by verbs in `bench/tests/rdma.rs` (`verbs_bootstrap_refuses_strangers`, in a
/// SoftRoCE guest), through the same check.
#[test]
fn every_transport_refuses_connectors_without_the_token() {
    use busbw_transports::shm::{ShmConfig, ShmTransport};
    type Make = fn(Identity) -> Result<Box<dyn Transport>, String>;
    let transports: [(&str, Make); 3] = [
        ("tcp", |id| {
            Ok(Box::new(TcpTransport::new(id, TcpConfig::default())))
        }),
        ("tcp with helper sockets", |id| {
            let cfg = TcpConfig {
                threads: 2,
                socks_per_thread: 2,
                ..TcpConfig::default()
            };
            Ok(Box::new(TcpTransport::new(id, cfg)))
        }),
        ("shm", |id| {
            Ok(Box::new(ShmTransport::new(id, ShmConfig::default())))
        }),
    ];
    for (i, (name, make)) in transports.into_iter().enumerate() {
        busbw_transports::conformance::refuses_strangers(700 + i as u64, &make)
            .unwrap_or_else(|why| panic!("{name}: {why}"));
    }
    println!("inproc: not checked (its ranks share one process, nothing to authenticate)");
}

/// A TCP hello (protocol 3, 52 bytes: no extra sockets, one direction) as a stranger would
/// forge it: right magic, version and job id.
fn forged_hello(rank: u32, job: u64) -> [u8; 52] {
    let mut h = [0u8; 52];
    h[0..8].copy_from_slice(&0x6275_7362_775f_7463u64.to_le_bytes());
    h[8..12].copy_from_slice(&3u32.to_le_bytes());
    h[12..16].copy_from_slice(&rank.to_le_bytes());
    h[16..24].copy_from_slice(&job.to_le_bytes());
    h
}

/// Someone who knows the job id (it is not a secret) but not the token, a recorded genuine
/// hello sent again, a cut-off hello and an oversized one: all refused, and the real peer is
/// accepted after them.
#[test]
fn tcp_refuses_forged_replayed_and_truncated_hellos() {
    let b = tcp(1, 91);
    let (handle, mut listener) = b.listen().unwrap();
    let text = String::from_utf8(handle.0.clone()).unwrap();
    let addr = text.split("addr=").nth(1).unwrap();
    let addr = addr.split_whitespace().next().unwrap().to_string();
    let send = |bytes: &[u8]| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        let _ = s.write_all(bytes);
        s
    };

    let hello = forged_hello(3, 91);
    // The right shape, a proof made with another token's key.
    let wrong = busbw_transports::auth::data_tail(
        &busbw_transports::auth::Key::from_token(Some("guess")).for_job(91),
        &busbw_transports::auth::challenge_in(&handle.0).unwrap(),
        &hello,
    );
    let _forged = send(&[&hello[..], &wrong[..]].concat());
    // A genuine hello and proof (what a sniffer records), then the same bytes again.
    let genuine =
        busbw_transports::auth::tail_for(&handle.0, &Identity::new(91, 3), &hello).unwrap();
    let recorded = [&hello[..], &genuine[..]].concat();
    let _first = send(&recorded);
    let _replayed = send(&recorded);
    let _cut = send(&recorded[..40]);
    let _huge = send(&vec![0xa5; 1 << 20]);

    let first = listener.accept(T).unwrap();
    assert_eq!(first.peer(), 3, "the first, genuine hello is accepted");
    let right = tcp(6, 91);
    let _ok = right.connect(&handle, 0, T).unwrap();
    // The cut-off hello costs its wait (it never completes), then the real peer gets in.
    let recv = listener.accept(T).unwrap();
    assert_eq!(recv.peer(), 6, "forgery, replay and junk are refused");
    let err = match listener.accept(Duration::from_millis(300)) {
        Err(e) => e,
        Ok(_) => panic!("a stray connection was accepted"),
    };
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
}

#[test]
fn tcp_connect_to_nothing_times_out_naming_the_peer() {
    let a = tcp(0, 1);
    // Grab a free port and close it so nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let h =
        busbw_transports::Handle(format!("busbw-tcp/1 rank=9 addr=127.0.0.1:{port}").into_bytes());
    let err = match a.connect(&h, 0, Duration::from_millis(300)) {
        Err(e) => e,
        Ok(_) => panic!("connected to nothing"),
    };
    assert!(err.to_string().contains("rank 9"), "{err}");
}

/// Many messages in flight at once, of sizes on both sides of the TCP receive buffer's
/// read-ahead threshold, some received into buffers larger than the message: each arrives
/// whole, in order, with its own bytes.
fn mixed_stream(mk: fn(u32, u64) -> Box<dyn Transport>) {
    let a = mk(0, 42);
    let b = mk(1, 42);
    let (handle, mut listener) = b.listen().unwrap();
    let mut send = a.connect(&handle, 0, T).unwrap();
    let mut recv = listener.accept(T).unwrap();
    let sizes = [
        8usize,
        0,
        1,
        16 << 10,
        (16 << 10) + 1,
        3,
        64 << 10,
        (64 << 10) + 17,
        5,
        1 << 20,
        2,
        100_000,
        7,
    ];
    let total: usize = sizes.iter().sum();
    let src: Vec<u8> = (0..total).map(|i| (i * 13 + 1) as u8).collect();
    // Odd messages get 100 bytes of slack, as a receive posted for more than arrives.
    let slack = |i: usize| if i % 2 == 1 { 100 } else { 0 };
    let room: usize = sizes.iter().enumerate().map(|(i, s)| s + slack(i)).sum();
    let mut dst = vec![0u8; room];
    let sreg = a
        .register(unsafe { MemRegion::new(src.as_ptr() as *mut u8, total, MemoryKind::Host) })
        .unwrap();
    let rreg = b
        .register(unsafe { MemRegion::new(dst.as_mut_ptr(), room, MemoryKind::Host) })
        .unwrap();
    let (mut soff, mut roff) = (0, 0);
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let tag = 100 + i as u32;
        let post = len + slack(i);
        recvs.push((
            unsafe { recv.irecv(&rreg, dst.as_mut_ptr().add(roff), post, tag) }.unwrap(),
            roff,
            len,
        ));
        sends.push(unsafe { send.isend(&sreg, src.as_ptr().add(soff), len, tag) }.unwrap());
        soff += len;
        roff += post;
    }
    let deadline = Instant::now() + T;
    let mut sdone = vec![false; sizes.len()];
    let mut rdone = vec![None; sizes.len()];
    while sdone.iter().any(|d| !d) || rdone.iter().any(Option::is_none) {
        assert!(Instant::now() < deadline, "timed out");
        for (i, id) in sends.iter().enumerate() {
            if !sdone[i] {
                sdone[i] = send.test(*id).unwrap().is_some();
            }
        }
        for (i, (id, _, _)) in recvs.iter().enumerate() {
            if rdone[i].is_none() {
                rdone[i] = recv.test(*id).unwrap();
            }
        }
    }
    let mut soff = 0;
    for (i, (_, roff, len)) in recvs.iter().enumerate() {
        assert_eq!(rdone[i], Some(*len), "message {i}");
        assert_eq!(
            &dst[*roff..roff + len],
            &src[soff..soff + len],
            "message {i}"
        );
        soff += len;
    }
}

#[test]
fn tcp_mixed_stream() {
    mixed_stream(tcp);
}

#[test]
fn tcp_lanes_mixed_stream() {
    mixed_stream(tcp_lanes);
}

/// Several peers connect with lanes at once, so their sockets reach the listener
/// interleaved: each connection is still put together from its own sockets.
#[test]
fn tcp_lanes_interleaved_connectors_are_kept_apart() {
    let b = tcp_lanes(9, 5);
    let (handle, mut listener) = b.listen().unwrap();
    let n = 3u32;
    let len = 3 << 20;
    let senders: Vec<_> = (0..n)
        .map(|r| {
            let handle = handle.clone();
            std::thread::spawn(move || {
                let a = tcp_lanes(r, 5);
                let mut send = a.connect(&handle, r, T).unwrap();
                let src: Vec<u8> = (0..len).map(|i| (i as u32 * (r + 3)) as u8).collect();
                let reg = a
                    .register(unsafe {
                        MemRegion::new(src.as_ptr() as *mut u8, len, MemoryKind::Host)
                    })
                    .unwrap();
                let id = unsafe { send.isend(&reg, src.as_ptr(), len, r) }.unwrap();
                let deadline = Instant::now() + T;
                while send.test(id).unwrap().is_none() {
                    assert!(Instant::now() < deadline, "send timed out");
                }
                send
            })
        })
        .collect();
    let mut recvs: Vec<_> = (0..n).map(|_| listener.accept(T).unwrap()).collect();
    recvs.sort_by_key(|c| c.peer());
    for (r, recv) in recvs.iter_mut().enumerate() {
        let r = r as u32;
        assert_eq!((recv.peer(), recv.channel()), (r, r));
        let mut dst = vec![0u8; len];
        let reg = b
            .register(unsafe { MemRegion::new(dst.as_mut_ptr(), len, MemoryKind::Host) })
            .unwrap();
        let id = unsafe { recv.irecv(&reg, dst.as_mut_ptr(), len, r) }.unwrap();
        let deadline = Instant::now() + T;
        while recv.test(id).unwrap().is_none() {
            assert!(Instant::now() < deadline, "receive timed out");
        }
        assert!(
            dst.iter()
                .enumerate()
                .all(|(i, &v)| v == (i as u32 * (r + 3)) as u8),
            "connection of rank {r} got another's bytes"
        );
    }
    for s in senders {
        drop(s.join().unwrap());
    }
}

#[test]
fn tcp_config_limits_follow_nccl() {
    let ok = TcpConfig {
        threads: 16,
        socks_per_thread: 4,
        ..TcpConfig::default()
    };
    assert_eq!(ok.lanes(), 64);
    assert!(ok.validate().is_ok());
    let too_many = TcpConfig {
        threads: 16,
        socks_per_thread: 5,
        ..TcpConfig::default()
    };
    let err = too_many.validate().unwrap_err();
    assert!(err.contains("80 data sockets"), "{err}");
    let threads = TcpConfig {
        threads: 17,
        ..TcpConfig::default()
    };
    assert!(threads.validate().unwrap_err().contains("at most 16"));
    assert_eq!(TcpConfig::default().lanes(), 0, "no helpers unless asked");
}

#[test]
fn inproc_mixed_stream() {
    mixed_stream(inproc);
}

/// Transports that move bytes with the CPU refuse device memory with the typed error that
/// tells the caller to stage, naming themselves, rather than registering a pointer they would
/// fault on; host memory registers as before.
#[test]
fn cpu_transports_refuse_device_memory_and_say_to_stage() {
    use busbw_transports::shm::{ShmConfig, ShmTransport};
    let shm = |rank, job| -> Box<dyn Transport> {
        Box::new(ShmTransport::new(
            Identity::new(job, rank),
            ShmConfig::default(),
        ))
    };
    let mut host = [0u8; 64];
    for (name, t) in [
        ("tcp", tcp(0, 7)),
        ("inproc", inproc(0, 7)),
        ("shm", shm(0, 7)),
    ] {
        // SAFETY: refused before any use; never dereferenced.
        let dev =
            unsafe { MemRegion::new(0x1000 as *mut u8, 4096, MemoryKind::Cuda { device: 0 }) };
        match t.register(dev) {
            Err(TransportError::DeviceMemory { transport, missing }) => {
                assert_eq!(transport, name);
                assert!(
                    missing.contains("CPU") && missing.contains("verbs"),
                    "{missing}"
                );
            }
            other => panic!("{name}: device memory registered: {other:?}"),
        }
        let e = t.register(dev).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains("pinned host memory"), "{e}");
        let r = t
            .register(unsafe { MemRegion::new(host.as_mut_ptr(), host.len(), MemoryKind::Host) })
            .unwrap();
        assert_eq!(r.region.len(), 64);
        t.deregister(r).unwrap();
    }
}
