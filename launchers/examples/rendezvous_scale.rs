//! Rendezvous at scale: N simulated ranks (threads) against one TCP store, each registering
//! its peer info and then fetching everyone's, as a job's start does.
//!
//! `cargo run --release -p busbw-launchers --example rendezvous_scale -- [N] [INFO_BYTES]`
//! (defaults 4096 ranks, 192 bytes, about a multi-transport handle plus host info). Prints
//! the time until every rank is connected and registered, and until every rank holds all N
//! records (the all-gather), with the bytes the store served.

use busbw_launchers::store::{Store, TcpStoreClient, TcpStoreServer};
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
                    let value: Vec<u8> = (0..info).map(|i| (i + r) as u8).collect();
                    c.set(&format!("info/{r}"), &value).expect("set");
                    registered.wait();
                    let keys: Vec<String> = (0..n).map(|k| format!("info/{k}")).collect();
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    let all = c.wait(&refs, timeout).expect("wait");
                    assert_eq!(all.len(), n);
                    assert!(all.iter().all(|v| v.len() == info));
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
