//! The shared-memory transport must behave like TCP (same errors, same ordering), within one
//! process across threads and across two real processes.

use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::tcp::{TcpConfig, TcpTransport};
use busbw_transports::{
    Handle, Identity, MemRegion, MemoryKind, RecvComm, RequestId, SendComm, Transport,
    TransportError,
};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
/// Set in a child process started by the two-process tests: the parent's handle.
const CHILD_ENV: &str = "BUSBW_SHM_TEST_CHILD";

fn shm(rank: u32, job: u64) -> ShmTransport {
    ShmTransport::new(Identity::new(job, rank), ShmConfig::default())
}

fn host(ptr: *const u8, len: usize) -> MemRegion {
    unsafe { MemRegion::new(ptr as *mut u8, len, MemoryKind::Host) }
}

fn wait_both(
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

fn wait_recv_err(r: &mut dyn RecvComm, rr: RequestId, mut poke: impl FnMut()) -> TransportError {
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

fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + seed) as u8).collect()
}

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

#[test]
fn shm_truncation_is_an_error() {
    let a = shm(3, 1);
    let b = shm(4, 1);
    let (handle, mut listener) = b.listen().unwrap();
    let mut send = a.connect(&handle, 0, T).unwrap();
    let mut recv = listener.accept(T).unwrap();
    let src = [1u8; 100];
    let mut dst = vec![0u8; 100];
    let sreg = a.register(host(src.as_ptr(), 100)).unwrap();
    let rreg = b.register(host(dst.as_ptr(), 100)).unwrap();
    let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), 10, 0) }.unwrap();
    let _sr = unsafe { send.isend(&sreg, src.as_ptr(), 100, 0) }.unwrap();
    let err = wait_recv_err(recv.as_mut(), rr, || {});
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
    assert!(dst[10..].iter().all(|&b| b == 0), "wrote past the buffer");
}

#[test]
fn shm_peer_closed_names_the_peer() {
    let a = shm(2, 9);
    let b = shm(5, 9);
    let (handle, mut listener) = b.listen().unwrap();
    let send = a.connect(&handle, 0, T).unwrap();
    let mut recv = listener.accept(T).unwrap();
    drop(send);
    let mut dst = vec![0u8; 8];
    let rreg = b.register(host(dst.as_ptr(), 8)).unwrap();
    let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), 8, 0) }.unwrap();
    let err = wait_recv_err(recv.as_mut(), rr, || {});
    assert!(
        matches!(err, TransportError::PeerClosed { peer: 2 }),
        "{err}"
    );
}

/// Messages already in the ring are delivered before the close is reported.
#[test]
fn shm_data_sent_before_close_arrives() {
    let a = shm(0, 9);
    let b = shm(1, 9);
    let (handle, mut listener) = b.listen().unwrap();
    let mut send = a.connect(&handle, 0, T).unwrap();
    let mut recv = listener.accept(T).unwrap();
    let src = pattern(1000, 1);
    let mut dst = vec![0u8; 1000];
    let sreg = a.register(host(src.as_ptr(), 1000)).unwrap();
    let rreg = b.register(host(dst.as_ptr(), 1000)).unwrap();
    let sr = unsafe { send.isend(&sreg, src.as_ptr(), 1000, 4) }.unwrap();
    assert_eq!(send.test(sr).unwrap(), Some(1000), "fits the ring at once");
    drop(send);
    let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), 1000, 4) }.unwrap();
    assert_eq!(recv.test(rr).unwrap(), Some(1000));
    assert_eq!(dst, src);
    let rr = unsafe { recv.irecv(&rreg, dst.as_mut_ptr(), 1000, 5) }.unwrap();
    let err = wait_recv_err(recv.as_mut(), rr, || {});
    assert!(
        matches!(err, TransportError::PeerClosed { peer: 0 }),
        "{err}"
    );
}

/// A sender whose receiver went away gets an error, not a hang on a full ring.
#[test]
fn shm_send_to_closed_receiver_fails() {
    let a = shm(6, 9);
    let b = shm(7, 9);
    let (handle, mut listener) = b.listen().unwrap();
    let mut send = a.connect(&handle, 0, T).unwrap();
    let recv = listener.accept(T).unwrap();
    drop(recv);
    let n = 8 << 20;
    let src = vec![0u8; n];
    let sreg = a.register(host(src.as_ptr(), n)).unwrap();
    let deadline = Instant::now() + T;
    let err = loop {
        assert!(Instant::now() < deadline, "timed out");
        let r = unsafe { send.isend(&sreg, src.as_ptr(), n, 0) };
        match r.and_then(|r| send.test(r)) {
            Ok(_) => std::thread::yield_now(),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, TransportError::PeerClosed { peer: 7 }),
        "{err}"
    );
}

/// Strangers (garbage on the socket, another job's token) are dropped; the real peer still
/// gets through.
#[test]
fn shm_refuses_stray_connections() {
    let b = shm(1, 77);
    let (handle, mut listener) = b.listen().unwrap();
    let text = String::from_utf8(handle.0.clone()).unwrap();
    let name = text.split("sock=@").nth(1).unwrap();
    let name = name.split_whitespace().next().unwrap().to_string();

    use std::io::Write;
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let mut garbage = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxx")
        .unwrap();
    let other_job = shm(0, 78);
    let _wrong = other_job.connect(&handle, 0, T).unwrap();
    let right = shm(6, 77);
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

#[test]
fn shm_connect_to_nothing_times_out_naming_the_peer() {
    let a = shm(0, 1);
    let h = Handle(b"busbw-shm/1 rank=9 pid=1 sock=@busbw-shm.nobody.listens".to_vec());
    let err = match a.connect(&h, 0, Duration::from_millis(200)) {
        Err(e) => e,
        Ok(_) => panic!("connected to nothing"),
    };
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("rank 9"), "{err}");
    let tcp_handle = Handle(b"busbw-tcp/1 rank=9 addr=127.0.0.1:1".to_vec());
    assert!(matches!(
        a.connect(&tcp_handle, 0, T),
        Err(TransportError::BadHandle(_))
    ));
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

fn child_command(test: &str, handle: &Handle) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, String::from_utf8(handle.0.clone()).unwrap())
        .stdin(Stdio::null());
    cmd
}

/// Child side of [`shm_two_processes`]: connects to the parent's handle and sends.
#[test]
fn shm_child_sender() {
    let Ok(text) = std::env::var(CHILD_ENV) else {
        return; // only meaningful when started by the parent test
    };
    let a = shm(1, 1234);
    let mut send = a.connect(&Handle(text.into_bytes()), 2, T).unwrap();
    let n = 24 << 20;
    let src = pattern(n, 5);
    let reg = a.register(host(src.as_ptr(), n)).unwrap();
    for (tag, len) in [(1u32, n), (2, 0), (3, 12345)] {
        let r = unsafe { send.isend(&reg, src.as_ptr(), len, tag) }.unwrap();
        let deadline = Instant::now() + T;
        while send.test(r).unwrap().is_none() {
            assert!(Instant::now() < deadline, "child timed out");
        }
    }
    if std::env::var("BUSBW_SHM_TEST_HANG").is_ok() {
        // Wait to be killed: the parent checks that a dead process is noticed.
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Two real processes: the segment crosses the process boundary through SCM_RIGHTS, data
/// arrives intact, a normal exit after the last send loses nothing, and a killed process is
/// reported as a closed peer rather than waited for forever.
#[test]
fn shm_two_processes() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let b = shm(0, 1234);
    let n = 24 << 20;
    let expect = pattern(n, 5);
    let mut dst = vec![0u8; n];
    let reg = b.register(host(dst.as_ptr(), n)).unwrap();
    for kill in [false, true] {
        let (handle, mut listener) = b.listen().unwrap();
        let mut cmd = child_command("shm_child_sender", &handle);
        if kill {
            cmd.env("BUSBW_SHM_TEST_HANG", "1");
        }
        let mut child = cmd.stdout(Stdio::null()).spawn().unwrap();
        let mut recv = listener.accept(T).unwrap();
        assert_eq!((recv.peer(), recv.channel()), (1, 2));
        for (tag, len) in [(1u32, n), (2, 0), (3, 12345)] {
            dst.iter_mut().for_each(|b| *b = 0);
            let r = unsafe { recv.irecv(&reg, dst.as_mut_ptr(), n, tag) }.unwrap();
            let deadline = Instant::now() + T;
            let got = loop {
                assert!(
                    Instant::now() < deadline,
                    "timed out receiving from the child"
                );
                if let Some(g) = recv.test(r).unwrap() {
                    break g;
                }
            };
            assert_eq!(got, len);
            assert!(dst[..len] == expect[..len], "message {tag} corrupt");
        }
        if kill {
            // The child never drops its comm: only the dead socket can tell.
            child.kill().unwrap();
        }
        let status = child.wait().unwrap();
        assert_eq!(status.success(), !kill, "{status}");
        let r = unsafe { recv.irecv(&reg, dst.as_mut_ptr(), 8, 9) }.unwrap();
        let err = wait_recv_err(recv.as_mut(), r, || {});
        assert!(
            matches!(err, TransportError::PeerClosed { peer: 1 }),
            "{err}"
        );
    }
}

/// Child side of [`shm_leaves_nothing_behind`], alone in its process so that descriptor and
/// mapping counts are not disturbed by other tests.
#[test]
fn shm_child_leak_check() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let count = |what: &str| -> usize {
        match what {
            "fds" => std::fs::read_dir("/proc/self/fd").unwrap().count(),
            _ => std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .filter(|l| l.contains("busbw-shm"))
                .count(),
        }
    };
    let (fds, maps) = (count("fds"), count("maps"));
    {
        let a = shm(0, 3);
        let b = shm(1, 3);
        let (handle, mut listener) = b.listen().unwrap();
        let _s1 = a.connect(&handle, 0, T).unwrap();
        let _s2 = a.connect(&handle, 1, T).unwrap();
        let _r1 = listener.accept(T).unwrap();
        let _r2 = listener.accept(T).unwrap();
        assert_eq!(count("maps"), maps + 4, "two segments mapped on both sides");
    }
    assert_eq!(count("fds"), fds, "descriptors leaked");
    assert_eq!(count("maps"), maps, "segments still mapped");
    println!("LEAK-CHECK-OK");
}

#[test]
fn shm_leaves_nothing_behind() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let out = child_command("shm_child_leak_check", &Handle(b"x".to_vec()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("LEAK-CHECK-OK"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Throughput of one connection between two threads, next to TCP over loopback. Run with
/// `cargo test --release -p busbw-transports --test shm -- --ignored --nocapture`.
#[test]
#[ignore]
fn shm_vs_tcp_throughput() {
    let tcp = |rank| -> Box<dyn Transport> {
        Box::new(TcpTransport::new(
            Identity::new(1, rank),
            TcpConfig::default(),
        ))
    };
    let mk_shm = |rank| -> Box<dyn Transport> { Box::new(shm(rank, 1)) };
    for (name, mk) in [
        ("shm", &mk_shm as &dyn Fn(u32) -> Box<dyn Transport>),
        ("tcp", &tcp),
    ] {
        for _ in 0..2 {
            let gbps = stream(mk(0), mk(1), 256 << 20, 4 << 20);
            println!("{name}: 256 MiB in 4 MiB messages: {gbps:.2} GB/s");
        }
    }
}

fn stream(a: Box<dyn Transport>, b: Box<dyn Transport>, total: usize, msg: usize) -> f64 {
    let window = 4;
    let count = total / msg;
    let (handle, mut listener) = b.listen().unwrap();
    let sender = std::thread::spawn(move || {
        let mut send = a.connect(&handle, 0, T).unwrap();
        let src = pattern(msg, 1);
        let reg = a.register(host(src.as_ptr(), msg)).unwrap();
        let mut pending = std::collections::VecDeque::new();
        for _ in 0..count {
            if pending.len() == window {
                let r = pending.pop_front().unwrap();
                while send.test(r).unwrap().is_none() {}
            }
            pending.push_back(unsafe { send.isend(&reg, src.as_ptr(), msg, 0) }.unwrap());
        }
        for r in pending {
            while send.test(r).unwrap().is_none() {}
        }
    });
    let mut recv = listener.accept(T).unwrap();
    let mut dst = vec![0u8; msg * window];
    let reg = b.register(host(dst.as_ptr(), dst.len())).unwrap();
    let start = Instant::now();
    let mut pending = std::collections::VecDeque::new();
    for i in 0..count {
        if pending.len() == window {
            let r = pending.pop_front().unwrap();
            while recv.test(r).unwrap().is_none() {}
        }
        let p = unsafe { dst.as_mut_ptr().add((i % window) * msg) };
        pending.push_back(unsafe { recv.irecv(&reg, p, msg, 0) }.unwrap());
    }
    for r in pending {
        while recv.test(r).unwrap().is_none() {}
    }
    let secs = start.elapsed().as_secs_f64();
    sender.join().unwrap();
    assert_eq!(dst[msg - 1], pattern(msg, 1)[msg - 1]);
    total as f64 / secs / 1e9
}

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
        let b = ShmTransport::new(Identity::new(8, 1), cfg);
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
        assert_eq!(
            done_early, !single_copy,
            "single_copy={single_copy}: a send completes early only through the ring"
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
