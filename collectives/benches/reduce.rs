//! CPU reduction kernels against memcpy, 64 MiB, same run (`cargo bench -p busbw-collectives
//! --bench reduce`).
//!
//! A reduction is memory-bound: `dst = dst op src` reads two buffers and writes one, so its
//! "bytes moved" are three times the buffer, a memcpy's two. The figure of merit is bytes
//! moved per second relative to memcpy's on the same core, measured in alternation (memcpy,
//! kernel, memcpy, kernel, ...) so that machine noise hits both alike; medians are reported.
//! The target is a ratio of at least 0.7 for f32 and bf16 sums.

use busbw_collectives::element::{
    bf16, reduce_inplace, reduce_inplace_par, reduce_into, reduce_into_par, Element,
};
use busbw_collectives::ReduceOp;
use std::hint::black_box;
use std::time::Instant;

const BYTES: usize = 64 << 20;
const REPS: usize = 9;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn buffers<T: Element>(make: impl Fn(usize) -> T) -> (Vec<T>, Vec<T>, Vec<T>) {
    let n = BYTES / std::mem::size_of::<T>();
    let a: Vec<T> = (0..n).map(&make).collect();
    let b: Vec<T> = (0..n).map(|i| make(i + 7)).collect();
    let c: Vec<T> = a.clone();
    (a, b, c)
}

/// GB/s of bytes moved: `moved` bytes per call.
fn rate(moved: usize, f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    f();
    moved as f64 / 1e9 / t.elapsed().as_secs_f64()
}

/// `pool`: split each reduction across its threads (the communicator's path when cores are
/// free); memcpy stays on one core, the physical reference.
fn case<T: Element>(name: &str, make: impl Fn(usize) -> T, pool: Option<&rayon::ThreadPool>) {
    let (mut a, b, mut c) = buffers(make);
    let mut src = vec![0u8; BYTES];
    let mut dst = vec![1u8; BYTES];
    src.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
    let (mut mc, mut inplace, mut into) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPS {
        mc.push(rate(2 * BYTES, &mut || {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        }));
        inplace.push(rate(3 * BYTES, &mut || match pool {
            Some(_) => reduce_inplace_par(ReduceOp::Sum, black_box(&mut a), black_box(&b), pool),
            None => reduce_inplace(ReduceOp::Sum, black_box(&mut a), black_box(&b)),
        }));
        mc.push(rate(2 * BYTES, &mut || {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        }));
        into.push(rate(3 * BYTES, &mut || {
            let (dst, x, y) = (black_box(&mut c), black_box(&a), black_box(&b));
            match pool {
                Some(_) => reduce_into_par(ReduceOp::Sum, dst, x, y, pool),
                None => reduce_into(ReduceOp::Sum, dst, x, y),
            }
        }));
    }
    let m = median(mc);
    let (i, o) = (median(inplace), median(into));
    let threads = pool.map_or(1, |p| p.current_num_threads());
    println!(
        "{name:>8} sum 64 MiB, {threads} thread(s) | memcpy {m:6.2} GB/s | in place {i:6.2} GB/s ({:.2}x memcpy) | out of place {o:6.2} GB/s ({:.2}x memcpy)",
        i / m,
        o / m
    );
}

fn main() {
    // `cargo test --benches` runs this binary with no arguments too: keep that quick.
    if std::env::args().any(|a| a == "--bench") {
        println!("# reduction kernels vs memcpy, one core, {REPS} alternating reps, medians; bytes moved = 3x buffer for a reduction, 2x for memcpy");
        case::<f32>("float", |i| (i % 1000) as f32, None);
        case::<bf16>("bfloat16", |i| bf16::from_f32((i % 100) as f32), None);
        case::<f64>("double", |i| (i % 1000) as f64, None);
        case::<i32>("int32", |i| i as i32, None);
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        if cores > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(cores)
                .build()
                .expect("thread pool");
            case::<f32>("float", |i| (i % 1000) as f32, Some(&pool));
            case::<bf16>(
                "bfloat16",
                |i| bf16::from_f32((i % 100) as f32),
                Some(&pool),
            );
        }
    }
}
