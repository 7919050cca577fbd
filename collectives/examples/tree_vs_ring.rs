//! Ring against double binary tree AllReduce, and what `auto` makes of them.
//!
//! Eight thread ranks over TCP loopback, float sum, out of place. Per size the three
//! algorithms alternate within every repetition (ring, tree, auto, ring, ...) so that drift in
//! the machine's load hits all three alike; a repetition's time is the slowest rank's (as
//! nccl-tests reports), and the table shows medians.
//!
//! `cargo run --release -p busbw-collectives --example tree_vs_ring [-- max_bytes]`

use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::{
    all_reduce_values, all_reduce_with, barrier, calibrate, Algo, CommConfig, CommError, Data,
    DataType, HostBuffer, ReduceOp,
};
use std::time::Instant;

const RANKS: usize = 8;

/// 8 B, then 16 B · 4^k: the sizes the targets name (8 B, 64 KiB, 64 MiB, 256 MiB) are all on
/// the list.
fn sizes(max: usize) -> Vec<usize> {
    let mut v = vec![8];
    let mut s = 16;
    while s <= max {
        v.push(s);
        s *= 4;
    }
    v
}

/// Fewer repetitions for large sizes keep the run within a few minutes on two cores.
fn reps(bytes: usize) -> usize {
    match bytes {
        b if b <= 64 << 10 => 41,
        b if b <= 1 << 20 => 15,
        b if b <= 16 << 20 => 7,
        _ => 3,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn alloc(bytes: usize) -> Result<HostBuffer, CommError> {
    HostBuffer::new(bytes).ok_or(CommError::OutOfMemory {
        rank: 0,
        bytes,
        what: "benchmark buffers",
    })
}

type Row = (usize, [f64; 3], Algo);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let max = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 256 << 20,
    };
    let comms = thread_world(RANKS, ThreadTransport::Tcp, CommConfig::default())?;
    let t0 = Instant::now();
    let results = run_threads(comms, |comm| -> Result<_, CommError> {
        let c0 = Instant::now();
        let model = calibrate(comm)?;
        let calib = c0.elapsed();
        let mut rows: Vec<Row> = Vec::new();
        for bytes in sizes(max) {
            let count = bytes / 4;
            let mut send = alloc(bytes)?;
            let mut recv = alloc(bytes)?;
            for (i, x) in send.as_mut_slice().chunks_exact_mut(4).enumerate() {
                x.copy_from_slice(&((i % 7) as f32).to_le_bytes());
            }
            let mut times: [Vec<f64>; 3] = Default::default();
            let mut auto_ran = Algo::Auto;
            // Repetition 0 is untimed: connections, page faults.
            for rep in 0..=reps(bytes) {
                for (i, algo) in [Algo::Ring, Algo::Tree, Algo::Auto].into_iter().enumerate() {
                    barrier(comm)?;
                    let t = Instant::now();
                    let ran = all_reduce_with(
                        comm,
                        Data::out_of_place(send.as_slice(), recv.as_mut_slice()),
                        count,
                        DataType::Float32,
                        ReduceOp::Sum,
                        algo,
                        Some(&model),
                    )?;
                    let mut dt = [t.elapsed().as_secs_f64()];
                    all_reduce_values(comm, &mut dt, ReduceOp::Max)?;
                    if rep > 0 {
                        times[i].push(dt[0]);
                    }
                    if algo == Algo::Auto {
                        auto_ran = ran;
                    }
                }
            }
            rows.push((bytes, times.map(median), auto_ran));
        }
        Ok((model, calib, rows))
    });
    let total = t0.elapsed();
    let mut it = results.into_iter();
    let (model, calib, rows) = it.next().ok_or("no ranks")??;
    for r in it {
        r?;
    }
    println!(
        "# {RANKS} thread ranks, TCP loopback, float sum, out of place; {} CPUs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "# calibration took {:.0} ms: {model:?}; tree chosen up to {}",
        calib.as_secs_f64() * 1e3,
        human(model.crossover_bytes(RANKS))
    );
    println!(
        "{:>10} {:>12} {:>12} {:>12} {:>5} {:>10} {:>10}",
        "size", "ring us", "tree us", "auto us", "auto", "tree/ring", "auto/best"
    );
    for (bytes, [ring, tree, auto], ran) in rows {
        println!(
            "{:>10} {:>12.1} {:>12.1} {:>12.1} {:>5} {:>10.2} {:>10.2}",
            human(bytes),
            ring * 1e6,
            tree * 1e6,
            auto * 1e6,
            ran.name(),
            tree / ring,
            auto / ring.min(tree)
        );
    }
    println!("# total {:.1} s", total.as_secs_f64());
    Ok(())
}
