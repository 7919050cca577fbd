//! CPU reduction kernels against memcpy, per element type and instruction-set tier
//! (`cargo bench -p busbw-collectives --bench reduce [-- FILTER...]`; a filter keeps the lines
//! whose type name contains it).
//!
//! A reduction is memory-bound: `dst = dst op src` reads two buffers and writes one, so its
//! "bytes moved" are three times the buffer, a memcpy's two. The figure of merit is bytes
//! moved per second relative to memcpy's on the same core, measured in alternation (memcpy,
//! kernel, memcpy, kernel, ...) so that machine noise hits both alike; medians are reported.
//! The target is a ratio of at least 0.7 for the 16-bit floats.
//!
//! Two sizes: 64 MiB per buffer, beyond the private caches, and 256 KiB, which stays in L2 as
//! a collective's chunks often do; there one sample times a batch of calls. Every tier this
//! CPU runs is measured (`BUSBW_SIMD` only changes the default tier, used by the threaded
//! lines at the end).

use busbw_collectives::element::{
    bf16, f16, reduce_inplace_par, reduce_inplace_simd, reduce_into_par, reduce_into_simd, Element,
    Simd, F8E4M3,
};
use busbw_collectives::ReduceOp;
use std::hint::black_box;
use std::time::Instant;

/// Buffer size, alternating pairs sampled, and calls timed per sample.
struct Size {
    bytes: usize,
    reps: usize,
    batch: usize,
}

const LARGE: Size = Size {
    bytes: 64 << 20,
    reps: 9,
    batch: 1,
};
const SMALL: Size = Size {
    bytes: 256 << 10,
    reps: 31,
    batch: 200,
};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// GB/s of bytes moved: `moved` bytes per call, `batch` calls.
fn rate(moved: usize, batch: usize, f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..batch {
        f();
    }
    (moved * batch) as f64 / 1e9 / t.elapsed().as_secs_f64()
}

fn label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Where a reduction runs: one tier on this thread, or the default tier split across a pool.
#[derive(Clone, Copy)]
enum Run<'a> {
    Tier(Simd),
    Pool(&'a rayon::ThreadPool),
}

/// `make(i)` gives small values whose sums stay exact and bounded: in place, the source
/// alternates between `b` and its negation so repeated calls do not grow the destination
/// towards overflow (or subnormals, which would time a different path).
fn case<T: Element>(name: &str, size: &Size, run: Run<'_>, make: &dyn Fn(usize) -> T) {
    let n = size.bytes / std::mem::size_of::<T>();
    let mut a: Vec<T> = (0..n).map(make).collect();
    let b: Vec<T> = (0..n).map(|i| make(i + 7)).collect();
    let neg: Vec<T> = b.iter().map(|x| x.mul(T::from_f64(-1.0))).collect();
    let mut c: Vec<T> = a.clone();
    let src = vec![7u8; size.bytes];
    let mut dst = vec![1u8; size.bytes];
    let reduce_inplace = |d: &mut [T], s: &[T]| match run {
        Run::Tier(t) => reduce_inplace_simd(t, ReduceOp::Sum, d, s),
        Run::Pool(p) => reduce_inplace_par(ReduceOp::Sum, d, s, Some(p)),
    };
    let reduce_into = |d: &mut [T], x: &[T], y: &[T]| match run {
        Run::Tier(t) => reduce_into_simd(t, ReduceOp::Sum, d, x, y),
        Run::Pool(p) => reduce_into_par(ReduceOp::Sum, d, x, y, Some(p)),
    };
    let (mut mc, mut inplace, mut into) = (Vec::new(), Vec::new(), Vec::new());
    let mut memcpy = || {
        rate(2 * size.bytes, size.batch, &mut || {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    };
    let mut flip = false;
    for _ in 0..size.reps {
        mc.push(memcpy());
        inplace.push(rate(3 * size.bytes, size.batch, &mut || {
            flip = !flip;
            let s = if flip { &b } else { &neg };
            reduce_inplace(black_box(&mut a), black_box(s));
        }));
        mc.push(memcpy());
        into.push(rate(3 * size.bytes, size.batch, &mut || {
            reduce_into(black_box(&mut c), black_box(&a), black_box(&b))
        }));
    }
    let m = median(mc);
    let (i, o) = (median(inplace), median(into));
    let how = match run {
        Run::Tier(t) => format!("{t:>8}, 1 thread"),
        Run::Pool(p) => format!("{}, {} threads", Simd::active(), p.current_num_threads()),
    };
    println!(
        "{name:>8} sum {:>7} {how} | memcpy {m:6.2} GB/s | in place {i:6.2} GB/s ({:.2}x memcpy) | out of place {o:6.2} GB/s ({:.2}x memcpy)",
        label(size.bytes),
        i / m,
        o / m
    );
}

fn keep(name: &str, filters: &[String]) -> bool {
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

/// Every size and tier for one type, when the filters keep it.
fn sweep<T: Element>(name: &str, filters: &[String], make: &dyn Fn(usize) -> T) {
    if !keep(name, filters) {
        return;
    }
    for size in [&LARGE, &SMALL] {
        for tier in Simd::ALL.into_iter().filter(|t| t.supported()) {
            case::<T>(name, size, Run::Tier(tier), make);
        }
    }
}

fn main() {
    // `cargo test --benches` runs this binary with no arguments too: keep that quick.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let filters: Vec<String> = args.into_iter().filter(|a| !a.starts_with('-')).collect();
    println!(
        "# reduction kernels vs memcpy, one core unless stated, alternating reps, medians \
         ({} at {}, {} of {} calls at {}); bytes moved = 3x buffer for a reduction, 2x for \
         memcpy; best tier here: {}",
        LARGE.reps,
        label(LARGE.bytes),
        SMALL.reps,
        SMALL.batch,
        label(SMALL.bytes),
        Simd::best()
    );
    sweep::<f32>("float", &filters, &|i| (i % 1000) as f32);
    sweep::<f64>("double", &filters, &|i| (i % 1000) as f64);
    sweep::<bf16>("bfloat16", &filters, &|i| bf16::from_f32((i % 100) as f32));
    sweep::<f16>("half", &filters, &|i| f16::from_f32((i % 100) as f32));
    sweep::<F8E4M3>("f8e4m3", &filters, &|i| F8E4M3::from_f32((i % 8) as f32));
    sweep::<i32>("int32", &filters, &|i| i as i32);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if cores > 1 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cores)
            .build()
            .expect("thread pool");
        if keep("float", &filters) {
            case::<f32>("float", &LARGE, Run::Pool(&pool), &|i| (i % 1000) as f32);
        }
        if keep("bfloat16", &filters) {
            case::<bf16>("bfloat16", &LARGE, Run::Pool(&pool), &|i| {
                bf16::from_f32((i % 100) as f32)
            });
        }
    }
}
