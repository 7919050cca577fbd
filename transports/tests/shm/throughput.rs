//! Not a check but a measurement, ignored by default: how shared memory compares with TCP.

use super::{host, pattern, shm, T};
use busbw_transports::tcp::{TcpConfig, TcpTransport};
use busbw_transports::{Identity, Transport};
use std::time::Instant;

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
