//! Rendezvous at scale: N simulated ranks (threads) against one TCP store, each connecting and
//! registering, then all-gathering a peer-info record of every rank with the session's
//! `all_gather`, as a job's start does.
//!
//! `cargo run --release -p busbw-launchers --example rendezvous_scale -- [N] [INFO_BYTES]`
//! (defaults 4096 ranks, 192 bytes, about a multi-transport handle plus host info). Prints
//! the time until every rank is connected and registered, and until every rank holds all N
//! records (the all-gather), with the bytes the store served.

use busbw_launchers::store::{all_gather, Store, TcpStoreClient, TcpStoreServer};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let info: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(192);
    let server = TcpStoreServer::bind("127.0.0.1:0".parse().expect("address")).expect("bind");
    let addr = server.local_addr().to_string();
    let timeout = Duration::from_secs(120);
    let start = Instant::now();
    let registered = Arc::new(Barrier::new(n + 1));
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let addr = addr.clone();
            let registered = registered.clone();
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    let c = TcpStoreClient::connect(&addr, timeout).expect("connect");
                    c.set(&format!("hello/{r}"), b"1").expect("set");
                    registered.wait();
                    // The session's exchange: every rank's record to every rank.
                    let value: Vec<u8> = (0..info).map(|i| (i + r) as u8).collect();
                    let all = all_gather(&c, "info", r, n, &value, timeout).expect("all-gather");
                    assert_eq!(all.len(), n);
                    assert!(all
                        .iter()
                        .enumerate()
                        .all(|(k, v)| v.len() == info && v[0] == k as u8));
                    c.close();
                })
                .expect("spawn")
        })
        .collect();
    registered.wait();
    let t_reg = start.elapsed();
    for t in threads {
        t.join().expect("rank thread");
    }
    let t_all = start.elapsed();
    println!(
        "rendezvous_scale: {n} ranks, {info}-byte records: registered in {:.3} s, all-gather done in {:.3} s ({:.2} GB served)",
        t_reg.as_secs_f64(),
        t_all.as_secs_f64(),
        (n * n * info) as f64 / 1e9
    );
}
