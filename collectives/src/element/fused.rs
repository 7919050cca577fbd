//! One pass that reduces several inputs and writes the result into several outputs.
//!
//! The direct AllReduce reduces its slice of every rank's input and writes it into every
//! rank's output. Reducing a 16 KiB chunk into a scratch buffer and then copying the chunk out
//! serialises the two halves of the work: while the core reads the inputs no store is in
//! flight, and while it streams the chunk out no read is. Beyond the caches that costs a
//! fifth: on a 2026 Xeon (family 6 model 167) busbw's out-of-place sum of 256 MiB on two
//! ranks took 30.3-31.6 ms chunked and 24.9-25.0 ms with loads and streaming stores
//! interleaved a few lines at a time (`bench/peer/reduce_pattern.c`, summing through a
//! scratch buffer then: 29.1-29.3 against 25.7-26.4 ms; BENCHMARKS.md, "The roofline"). Here the block reduced at once is four
//! cache lines: its values stay in registers, and each line goes to every output as soon as
//! it is summed.
//!
//! The arithmetic is the chunked path's, operation for operation and in rank order (the
//! premultiplication of `mulsum`, the final division of `avg`), so the bits are the same.
//! Only the native types (integers, `f32`, `f64`) are fused, in loops the compiler vectorises
//! inside the block. The narrow floats keep the chunked path: their explicit kernels are
//! calls, not loops to inline, and half chunked by 1 KiB (a line-aligned buffer) instead of
//! 16 KiB was no faster out of place (256 MiB: 29.8-31.1 ms against 30.3-30.5, 2026-12-05).

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::{max, min, premul, Element, Simd, LINE};
use crate::dtype::{DataType, ReduceOp};

/// Bytes reduced at a time: four lines, 256 bytes (the measured sweet spot of the pattern:
/// 1 KiB was as fast, 4 KiB already as slow as 16 KiB).
const BLOCK: usize = 256;
/// How far ahead a streaming pass asks for its inputs' lines into L2: out of place 3-9 %
/// faster at 256 MiB and 5-23 % at 64 MiB at 1 KiB than without (2 ranks, 2026-12-05, two
/// sessions of three rounds alternating; 2 KiB no better). In place it gained nothing, so only streaming passes prefetch.
const AHEAD: usize = 1024;

/// One rank's share of a fused pass: elements `lo..hi` of every input, reduced in input
/// order, go into the same elements of every output, with streaming stores when `stream`
/// (the lines are not read back soon; the caller fences before it publishes them) and
/// ordinary ones otherwise.
pub struct Pass<'a, T> {
    pub inputs: &'a [*const T],
    pub outputs: &'a [*mut T],
    pub lo: usize,
    pub hi: usize,
    pub stream: bool,
}

/// Runs `pass` with `op`. Returns false, having done nothing, where there is no fused
/// kernel: narrow floats, the portable tier (no streaming stores to fuse), fewer than two
/// inputs, or outputs that do not share their offset within a cache line. The caller then
/// runs the chunked path.
///
/// # Safety
/// Every pointer is valid for `hi` elements. An output may be an input only at the same
/// positions (in place): each block of the outputs is written after that block of every
/// input is read, and no output's `lo..hi` overlaps another input's `lo..hi` otherwise.
pub unsafe fn reduce_to_all<T: Element>(op: ReduceOp, pass: &Pass<T>) -> bool {
    reduce_to_all_simd(Simd::active(), op, pass)
}

/// [`reduce_to_all`] at tier `simd`, or the best tier below it that this CPU runs, so that
/// tests and benchmarks can run each tier in one process.
///
/// # Safety
/// As [`reduce_to_all`].
pub unsafe fn reduce_to_all_simd<T: Element>(simd: Simd, op: ReduceOp, pass: &Pass<T>) -> bool {
    if pass.lo >= pass.hi {
        return true;
    }
    if !native::<T>() || pass.inputs.len() < 2 {
        return false;
    }
    let offset = |p: *mut T| (p as usize + pass.lo * std::mem::size_of::<T>()) % LINE;
    let Some(&first) = pass.outputs.first() else {
        return false;
    };
    if pass.outputs.iter().any(|&o| offset(o) != offset(first)) {
        return false;
    }
    match simd.min(Simd::best()) {
        #[cfg(all(target_arch = "x86_64", busbw_avx512))]
        Simd::Avx512 | Simd::Avx512Fp16 => {
            // SAFETY: the tier is active, so the CPU has AVX-512 F; the rest is the caller's.
            unsafe { run_avx512(op, pass) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => {
            // SAFETY: as above, for AVX2.
            unsafe { run_avx2(op, pass) };
            true
        }
        _ => false,
    }
}

/// Whether `T` computes in its own arithmetic (the narrow floats widen and round).
fn native<T: Element>() -> bool {
    !matches!(
        T::DTYPE,
        DataType::Float16 | DataType::BFloat16 | DataType::F8E4M3 | DataType::F8E5M2
    )
}

/// How one line leaves at a tier: a streaming store of 64 bytes.
trait Store {
    /// # Safety
    /// `dst` is 64-byte aligned and valid for 64 bytes; `src` is valid for 64 bytes.
    unsafe fn line(dst: *mut u8, src: *const u8);
}

#[cfg(all(target_arch = "x86_64", busbw_avx512))]
struct Avx512Line;

#[cfg(all(target_arch = "x86_64", busbw_avx512))]
impl Store for Avx512Line {
    #[inline(always)]
    unsafe fn line(dst: *mut u8, src: *const u8) {
        use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_stream_si512};
        _mm512_stream_si512(
            dst as *mut __m512i,
            _mm512_loadu_si512(src as *const __m512i),
        );
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx2Line;

#[cfg(target_arch = "x86_64")]
impl Store for Avx2Line {
    #[inline(always)]
    unsafe fn line(dst: *mut u8, src: *const u8) {
        use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
        for k in [0, 32] {
            let v = _mm256_loadu_si256(src.add(k) as *const __m256i);
            _mm256_stream_si256(dst.add(k) as *mut __m256i, v);
        }
    }
}

/// Asks for the line at `p` into L2: a hint, so any address will do and nothing is read.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64, and a prefetch never faults.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The loop built for one tier: its features enabled, so that the block's plain loops
/// vectorise at its width, with its streaming store.
macro_rules! tier {
    ($(#[$cfg:meta])* $name:ident, $features:literal, $store:ty) => {
        $(#[$cfg])*
        #[target_feature(enable = $features)]
        unsafe fn $name<T: Element>(op: ReduceOp, pass: &Pass<T>) {
            by_op::<T, $store>(op, pass)
        }
    };
}

tier!(
    #[cfg(all(target_arch = "x86_64", busbw_avx512))]
    run_avx512,
    "avx512f,avx512bw,avx512vl",
    Avx512Line
);
tier!(
    #[cfg(target_arch = "x86_64")]
    run_avx2,
    "avx2",
    Avx2Line
);

/// Chooses the operation once, outside the loop, so that each loop body is a plain map the
/// compiler vectorises at the caller's tier. `mulsum` premultiplies each input by its rank's
/// factor ([`premul`]), `avg` divides the sum, as the chunked path does.
#[inline(always)]
unsafe fn by_op<T: Element, S: Store>(op: ReduceOp, pass: &Pass<T>) {
    let n = pass.inputs.len();
    let same = |x, _| x;
    let done = |x| x;
    match op {
        ReduceOp::Sum => blocks::<T, S>(pass, T::add, same, done),
        ReduceOp::Prod => blocks::<T, S>(pass, T::mul, same, done),
        ReduceOp::Min => blocks::<T, S>(pass, min, same, done),
        ReduceOp::Max => blocks::<T, S>(pass, max, same, done),
        ReduceOp::Avg => blocks::<T, S>(pass, T::add, same, |x| x.div_n(n)),
        ReduceOp::MulSum => blocks::<T, S>(pass, T::add, premul, done),
    }
}

/// The loop: `pre` each input's value (by input index), combine them with `f` in input order,
/// `post` the result, and write it to every output, a block at a time between a scalar head
/// (up to the outputs' first line boundary) and tail.
#[inline(always)]
unsafe fn blocks<T: Element, S: Store>(
    pass: &Pass<T>,
    f: impl Fn(T, T) -> T + Copy,
    pre: impl Fn(T, usize) -> T + Copy,
    post: impl Fn(T) -> T + Copy,
) {
    let &Pass {
        inputs,
        outputs,
        lo,
        hi,
        stream,
    } = pass;
    let esize = std::mem::size_of::<T>();
    let per = BLOCK / esize;
    let ahead = AHEAD / esize;
    let scalar = |range: std::ops::Range<usize>| {
        for i in range {
            let mut v = f(pre(*inputs[0].add(i), 0), pre(*inputs[1].add(i), 1));
            for (p, input) in inputs.iter().enumerate().skip(2) {
                v = f(v, pre(*input.add(i), p));
            }
            let v = post(v);
            for &o in outputs {
                *o.add(i) = v;
            }
        }
    };
    let head = (outputs[0].add(lo) as *const u8).align_offset(LINE) / esize;
    let body = lo + head.min(hi - lo);
    let end = body + (hi - body) / per * per;
    scalar(lo..body);
    // A block's values, 64-byte aligned so that each line leaves with one load.
    #[repr(C, align(64))]
    struct Block([u8; BLOCK]);
    let mut block = Block([0; BLOCK]);
    let acc = block.0.as_mut_ptr() as *mut T;
    let mut at = body;
    while at < end {
        let acc = std::slice::from_raw_parts_mut(acc, per);
        let input = |p: usize| std::slice::from_raw_parts(inputs[p].add(at), per);
        if stream && at + ahead < end {
            for &i in inputs {
                let next = i.add(at + ahead) as *const u8;
                for l in (0..BLOCK).step_by(LINE) {
                    prefetch(next.wrapping_add(l));
                }
            }
        }
        for ((a, &x), &y) in acc.iter_mut().zip(input(0)).zip(input(1)) {
            *a = f(pre(x, 0), pre(y, 1));
        }
        for p in 2..inputs.len() {
            for (a, &x) in acc.iter_mut().zip(input(p)) {
                *a = f(*a, pre(x, p));
            }
        }
        for a in acc.iter_mut() {
            *a = post(*a);
        }
        for &o in outputs {
            let dst = o.add(at) as *mut u8;
            if stream {
                for l in (0..BLOCK).step_by(LINE) {
                    S::line(dst.add(l), block.0.as_ptr().add(l));
                }
            } else {
                std::ptr::copy_nonoverlapping(block.0.as_ptr(), dst, BLOCK);
            }
        }
        at += per;
    }
    scalar(end..hi);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::direct::reduce_all;

    /// xorshift: reproducible values without a generator crate in the library's tests.
    fn bits(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// Runs the fused kernel over `n` inputs into `n` outputs at every tier, in and out of
    /// place, streaming and not, over ranges that start on and off the outputs' lines and end
    /// inside a block, and compares every output bit for bit with the chunked path's
    /// `reduce_all`; elements outside the range must stay untouched.
    fn matches_chunked<T: Element>(value: impl Fn(u64) -> T) {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        let esize = std::mem::size_of::<T>();
        let len = (AHEAD + 3 * BLOCK) / esize + 37;
        let spare = LINE / esize;
        for simd in Simd::ALL.into_iter().filter(|s| s.supported()) {
            for op in ReduceOp::ALL {
                for n in [2, 3, 5] {
                    for (lo, hi) in [(0, len), (3, len - 5), (7, 9), (1, len)] {
                        for (stream, in_place) in
                            [(false, false), (true, false), (false, true), (true, true)]
                        {
                            let inputs: Vec<Vec<T>> = (0..n)
                                .map(|_| (0..len).map(|_| value(bits(&mut seed))).collect())
                                .collect();
                            let mut want = vec![value(0); hi - lo];
                            let mut tmp = vec![value(0); hi - lo];
                            reduce_all(op, n, &mut want, &mut tmp, |p| &inputs[p][lo..hi]);
                            // Outputs that start on a line, as the direct AllReduce's buffers
                            // do (pages): `spare` elements of room to get there.
                            let fill = value(bits(&mut seed));
                            let mut store = vec![vec![fill; len + spare]; n];
                            let at: Vec<usize> = store
                                .iter()
                                .map(|s| (s.as_ptr() as *const u8).align_offset(LINE) / esize)
                                .collect();
                            if in_place {
                                for p in 0..n {
                                    store[p][at[p]..at[p] + len].copy_from_slice(&inputs[p]);
                                }
                            }
                            let before: Vec<Vec<T>> = (0..n)
                                .map(|p| store[p][at[p]..at[p] + len].to_vec())
                                .collect();
                            let outs: Vec<*mut T> = store
                                .iter_mut()
                                .zip(&at)
                                .map(|(s, &a)| s[a..].as_mut_ptr())
                                .collect();
                            let ins: Vec<*const T> = if in_place {
                                outs.iter().map(|&o| o as *const T).collect()
                            } else {
                                inputs.iter().map(|i| i.as_ptr()).collect()
                            };
                            // SAFETY: every pointer holds `len` >= `hi` elements.
                            let pass = Pass {
                                inputs: &ins,
                                outputs: &outs,
                                lo,
                                hi,
                                stream,
                            };
                            let ran = unsafe { reduce_to_all_simd(simd, op, &pass) };
                            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                            let what = format!(
                                "{} {simd} {op} n={n} {lo}..{hi} stream={stream} in_place={in_place}",
                                T::DTYPE
                            );
                            assert_eq!(ran, simd > Simd::Portable, "{what}");
                            for p in 0..n {
                                let out = &store[p][at[p]..at[p] + len];
                                for i in 0..len {
                                    let expect = if ran && (lo..hi).contains(&i) {
                                        want[i - lo]
                                    } else {
                                        before[p][i]
                                    };
                                    assert_eq!(
                                        out[i].to_bits_u64(),
                                        expect.to_bits_u64(),
                                        "{what}: output {p} element {i}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_native_type_and_op_gives_the_chunked_paths_bits() {
        matches_chunked(|b| b as i8);
        matches_chunked(|b| b as u8);
        matches_chunked(|b| b as i32);
        matches_chunked(|b| b as u32);
        matches_chunked(|b| b as i64);
        matches_chunked(|b: u64| b);
        // Finite values of every magnitude, zeros of both signs and infinities: NaN payloads
        // are the one thing IEEE leaves open (see `simd`).
        matches_chunked(|b| match b % 16 {
            0 => -0.0f32,
            1 => f32::INFINITY,
            _ => (b as i32 as f32) * 2f32.powi((b >> 40) as i32 % 60 - 30),
        });
        matches_chunked(|b| match b % 16 {
            0 => -0.0f64,
            1 => f64::NEG_INFINITY,
            _ => (b as i64 as f64) * 2f64.powi((b >> 40) as i32 % 200 - 100),
        });
    }

    #[test]
    fn outputs_on_different_line_offsets_and_narrow_floats_are_left_to_the_chunked_path() {
        let inputs = [vec![1.0f32; 300], vec![2.0f32; 300]];
        let mut outs = [vec![0.0f32; 320], vec![0.0f32; 320]];
        let ins: Vec<*const f32> = inputs.iter().map(|i| i.as_ptr()).collect();
        let o0 = outs[0].as_mut_ptr();
        let base = (o0 as usize) % LINE / 4;
        // The second output one element further into its line than the first.
        // SAFETY: at most 15 elements into a vector of 320.
        let o1 = unsafe {
            outs[1]
                .as_mut_ptr()
                .add((base + 1 + 16 - (outs[1].as_ptr() as usize) % LINE / 4) % 16)
        };
        // SAFETY: every pointer holds at least 300 elements.
        let pass = Pass {
            inputs: &ins,
            outputs: &[o0, o1],
            lo: 0,
            hi: 300,
            stream: true,
        };
        let ran = unsafe { reduce_to_all(ReduceOp::Sum, &pass) };
        assert!(!ran);
        assert!(
            outs.iter().all(|o| o.iter().all(|&x| x == 0.0)),
            "nothing written"
        );

        let a = vec![crate::element::bf16::from_f32(1.0); 300];
        let mut o = vec![crate::element::bf16::from_f32(0.0); 300];
        let o_ptr = o.as_mut_ptr();
        // SAFETY: as above.
        let pass = Pass {
            inputs: &[a.as_ptr(), a.as_ptr()],
            outputs: &[o_ptr],
            lo: 0,
            hi: 300,
            stream: false,
        };
        let ran = unsafe { reduce_to_all(ReduceOp::Sum, &pass) };
        assert!(!ran, "bfloat16 has no fused kernel");
        assert!(o.iter().all(|x| x.to_f32() == 0.0));
    }
}
