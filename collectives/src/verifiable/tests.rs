//! The generators' promises: exact in any order, not trivial, per rank, per type.

use super::*;
use crate::element::premul_scalar;

const NS: [usize; 7] = [1, 2, 3, 7, 8, 64, 1000];

fn fold<T: Element>(op: ReduceOp, it: impl Iterator<Item = T>) -> T {
    it.reduce(|a, b| combine(op, a, b)).unwrap()
}

/// The property the whole scheme rests on: any reduction order gives the same bits, and
/// those bits are the exact (infinitely precise) result.
fn check_order_independence<T: Verifiable + FloatLayout + std::fmt::Debug>() {
    let name = T::DTYPE;
    for n in NS {
        for op in ReduceOp::ALL {
            for idx in 0..200u64 {
                let vals: Vec<T> = (0..n)
                    .map(|r| {
                        let x = T::input(op, 5, idx, r, n);
                        let b = x.to_bits_u64();
                        let bits = 1 + T::MANT + T::EXP_BITS;
                        assert_ne!(b, 1 << (bits - 1), "{name} {op} n={n}: -0 generated");
                        assert!(x.to_f64().is_finite(), "{name} {op} n={n}: {x:?}");
                        if op == ReduceOp::MulSum {
                            premul(x, r)
                        } else {
                            x
                        }
                    })
                    .collect();
                let fwd = fold(op, vals.iter().copied());
                let rev = fold(op, vals.iter().rev().copied());
                // Pairwise (tree-like) order.
                let mut layer = vals.clone();
                while layer.len() > 1 {
                    layer = layer
                        .chunks(2)
                        .map(|c| {
                            if c.len() == 2 {
                                combine(op, c[0], c[1])
                            } else {
                                c[0]
                            }
                        })
                        .collect();
                }
                let ctx = format!("{name} n={n} op={op} idx={idx}: {fwd:?}");
                assert_eq!(fwd.to_bits_u64(), rev.to_bits_u64(), "{ctx} vs {rev:?}");
                assert_eq!(fwd.to_bits_u64(), layer[0].to_bits_u64(), "{ctx}");
                assert!(fwd.to_f64().is_finite(), "{ctx}");
                // Exactness: the type's result equals the exact result, which f64
                // arithmetic gives for these values.
                let exact = match op {
                    ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum => {
                        vals.iter().map(|v| v.to_f64()).sum::<f64>()
                    }
                    ReduceOp::Prod => vals.iter().map(|v| v.to_f64()).product::<f64>(),
                    _ => fwd.to_f64(),
                };
                assert_eq!(fwd.to_f64(), exact, "{ctx}");
                let mut want = [fwd];
                fill_expected_typed(&mut want, op, 5, idx, n);
                let fwd = if op == ReduceOp::Avg {
                    fwd.div_n(n)
                } else {
                    fwd
                };
                assert_eq!(want[0].to_bits_u64(), fwd.to_bits_u64(), "{ctx}");
            }
        }
    }
}

#[test]
fn float_reductions_are_order_independent() {
    check_order_independence::<f16>();
    check_order_independence::<f32>();
    check_order_independence::<f64>();
    check_order_independence::<bf16>();
    check_order_independence::<F8E4M3>();
    check_order_independence::<F8E5M2>();
}

/// Inputs must exercise the data path: mostly nonzero where the scheme allows, different
/// per rank, and every rank contributing to some elements.
fn check_not_trivial<T: Verifiable + FloatLayout>() {
    for op in ReduceOp::ALL {
        for n in [2usize, 4, 1000] {
            let count = 4096u64;
            let mut nonzero = vec![0u64; n];
            let mut distinct = 0;
            for i in 0..count {
                let v: Vec<T> = (0..n).map(|r| T::input(op, 1, i, r, n)).collect();
                for (r, x) in v.iter().enumerate() {
                    nonzero[r] += (x.to_f64() != 0.0) as u64;
                }
                distinct += (v[0].to_bits_u64() != v[1].to_bits_u64()) as u64;
            }
            let ctx = format!("{} {op} n={n}", T::DTYPE);
            let sum_like = matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::MulSum);
            if sum_like && n > 4 {
                // Only a window of ranks contributes to each element, but every rank
                // somewhere.
                assert!(
                    nonzero.iter().all(|z| *z > 0),
                    "{ctx}: a rank never contributes"
                );
                continue;
            }
            assert!(distinct > count / 4, "{ctx}: ranks 0 and 1 too alike");
            // Sum-like ops on fp8 let only one or two ranks per element contribute.
            let min = if sum_like && T::MANT <= 3 {
                count / 8
            } else {
                count / 3
            };
            for (r, z) in nonzero.iter().enumerate() {
                assert!(*z > min, "{ctx}: rank {r} nonzero {z}");
            }
        }
    }
}

#[test]
fn inputs_differ_by_rank_and_are_not_trivial() {
    check_not_trivial::<f16>();
    check_not_trivial::<f32>();
    check_not_trivial::<f64>();
    check_not_trivial::<bf16>();
    check_not_trivial::<F8E4M3>();
    check_not_trivial::<F8E5M2>();
    let p: Vec<i8> = (0..64)
        .map(|i| i8::input(ReduceOp::Prod, 1, i, 0, 4))
        .collect();
    assert!(p.iter().all(|v| v & 1 == 1));
}

#[test]
fn integer_mulsum_expects_the_premultiplied_wrapping_sum() {
    let n = 5;
    let mut got = [0u8; 300];
    fill_expected_typed(&mut got, ReduceOp::MulSum, 9, 100, n);
    for (i, g) in got.iter().enumerate() {
        let idx = 100 + i as u64;
        let want = (0..n).fold(0u8, |acc, r| {
            let s = premul_scalar(r) as u8;
            acc.wrapping_add(u8::input(ReduceOp::MulSum, 9, idx, r, n).wrapping_mul(s))
        });
        assert_eq!(*g, want);
    }
    let mut sum = [0u8; 300];
    fill_expected_typed(&mut sum, ReduceOp::Sum, 9, 100, n);
    assert_ne!(got, sum, "mulsum must not validate as a plain sum");
}

#[test]
fn float_mulsum_differs_from_sum_where_odd_ranks_contribute() {
    let n = 4;
    let mut mulsum = [0f32; 256];
    fill_expected_typed(&mut mulsum, ReduceOp::MulSum, 3, 0, n);
    let mut plain = [0f32; 256];
    for (i, o) in plain.iter_mut().enumerate() {
        *o = (0..n)
            .map(|r| f32::input(ReduceOp::MulSum, 3, i as u64, r, n))
            .sum();
    }
    assert!(mulsum.iter().zip(&plain).filter(|(a, b)| a != b).count() > 100);
}

#[test]
fn byte_level_helpers_cover_every_dtype() {
    for d in DataType::ALL {
        with_dtype!(d, T => {
            assert_eq!(std::mem::size_of::<T>(), d.size(), "{d}");
            assert_eq!(<T as Element>::DTYPE, d);
        });
        for op in ReduceOp::ALL {
            let n = 3;
            let count = 37;
            let mut want = vec![0u64; count]; // u64 storage keeps every type aligned
            let want = as_bytes_mut(&mut want, count * d.size());
            fill_expected(d, op, want, 11, 0, n);
            let mut got = vec![0u64; count];
            let got = as_bytes_mut(&mut got, count * d.size());
            got.copy_from_slice(want);
            assert_eq!(count_wrong(d, op, got, want), 0, "{d} {op}");
            // Flip the top bit of the last element: always a different value's bits.
            got[count * d.size() - 1] ^= 0x80;
            assert_eq!(count_wrong(d, op, got, want), 1, "{d} {op}");
            let mut input = vec![0u64; count];
            let input = as_bytes_mut(&mut input, count * d.size());
            fill_input(d, op, input, 11, 0, 1, n);
            assert!(input.iter().any(|b| *b != 0), "{d} {op}");
        }
    }
}

fn as_bytes_mut(v: &mut [u64], len: usize) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirements; `len` is within `v`.
    assert!(len <= v.len() * 8);
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, len) }
}

#[test]
fn count_wrong_is_bitwise_with_avg_tolerance() {
    let e = [1.0f32, 2.0, 3.0];
    let mut g = e;
    assert_eq!(count_wrong_typed(&g, &e, ReduceOp::Sum), 0);
    g[1] = f32::from_bits(2.0f32.to_bits() + 1);
    assert_eq!(count_wrong_typed(&g, &e, ReduceOp::Sum), 1);
    assert_eq!(count_wrong_typed(&g, &e, ReduceOp::MulSum), 1);
    assert_eq!(count_wrong_typed(&g, &e, ReduceOp::Avg), 0);
    g[2] = -3.0;
    assert_eq!(count_wrong_typed(&g, &e, ReduceOp::Avg), 1);
    assert_eq!(count_wrong_typed(&[0.0f32], &[-0.0f32], ReduceOp::Max), 1);
    let e8 = [F8E4M3(0x38)];
    assert_eq!(count_wrong_typed(&[F8E4M3(0x3a)], &e8, ReduceOp::Avg), 0);
    assert_eq!(count_wrong_typed(&[F8E4M3(0x3b)], &e8, ReduceOp::Avg), 1);
    assert_eq!(count_wrong_typed(&[F8E4M3(0x39)], &e8, ReduceOp::Sum), 1);
    // +0 and -0 compare equal as values but not as bits.
    assert_eq!(
        count_wrong_typed(&[F8E5M2(0x80)], &[F8E5M2(0)], ReduceOp::Sum),
        1
    );
    let h = [f16::from_f32(1.0)];
    assert_eq!(
        count_wrong_typed(&[f16::from_f32(1.0)], &h, ReduceOp::Sum),
        0
    );
    assert_eq!(
        count_wrong_typed(
            &[bf16::from_f32(-1.0)],
            &[bf16::from_f32(1.0)],
            ReduceOp::Min
        ),
        1
    );
}
