//! What goes wrong is reported as TCP reports it, naming the peer: truncation, a closed peer
//! on either side (after the data it did send), strangers on the socket, nobody listening.

use super::{host, pattern, shm, wait_recv_err, T};
use busbw_transports::{Handle, Transport, TransportError};
use std::time::{Duration, Instant};

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
    // An abstract name or a socket file, whichever the platform listens on.
    let addr = text.split(" sock=").nth(1).unwrap();
    let addr = addr.split_whitespace().next().unwrap();

    use std::io::Write;
    let fd = busbw_transports::platform::connect_local(addr)
        .unwrap()
        .expect("the listener is there");
    let mut garbage = std::os::unix::net::UnixStream::from(fd);
    garbage.set_nonblocking(false).unwrap();
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
