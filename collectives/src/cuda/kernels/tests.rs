//! `kernels.cu` built for the host (`-DBUSBW_HOST`) and run against the Rust generators and
//! kernels: same inputs, same expected outputs, same reductions and wrong counts, bit for bit,
//! for every type and op. Skips (saying why) where no C++ compiler is installed.

use super::*;
use crate::element::{self, Element};
use crate::verifiable::{self, Verifiable};
use crate::with_dtype;
use std::io::Write;
use std::process::{Command, Stdio};

fn cxx() -> Option<String> {
    let candidates = [
        std::env::var("CXX").ok(),
        Some("c++".into()),
        Some("g++".into()),
    ];
    candidates.into_iter().flatten().find(|c| {
        Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The prelude, every type's instances, and a driver that reads
/// `type op count seed first rank nranks` lines and writes, per line: the input, the
/// expected output, `reduce(input, next rank's input)`, `finish_avg(input)`,
/// `premultiply(input)` and two wrong counts (input vs expected, expected vs itself).
fn host_program() -> String {
    let mut s = String::from("#define BUSBW_HOST 1\n");
    s.push_str(PRELUDE);
    for d in DataType::ALL {
        s.push_str(&instances(d));
    }
    s.push_str(
        r#"
#include <stdio.h>
#include <stdlib.h>
template <class S>
static void emit(const S *p, uint64_t c) { fwrite(p, sizeof(S), c, stdout); }
// `conv`: every format's f32 and f64 rounding of f32 patterns around each rounding point,
// then its type's widening of every bit pattern.
static void conv() {
  const uint32_t lows[] = {0u, 1u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  Format fs[] = {FMT_F16, FMT_BF16, FMT_E4M3, FMT_E5M2};
  for (int k = 0; k < 4; k++) {
    for (uint32_t hi = 0; hi < 65536; hi++)
      for (int l = 0; l < 9; l++) {
        float x = u2f(hi << 16 | lows[l]);
        uint32_t r[2] = {encode_f32(x, fs[k]), encode_f64((double)x, fs[k])};
        fwrite(r, 4, 2, stdout);
      }
    uint32_t n = fs[k].sign_shift == 15 ? 65536 : 256;
    for (uint32_t b = 0; b < n; b++) {
      float w = k == 0 ? T_half::to_f32(b) : k == 1 ? T_bfloat16::to_f32(b)
              : k == 2 ? T_f8e4m3::to_f32(b) : T_f8e5m2::to_f32(b);
      uint32_t d = f2u(w);
      fwrite(&d, 4, 1, stdout);
    }
  }
  for (uint32_t hi = 0; hi < 65536; hi++)
    for (int l = 0; l < 9; l++) {
      uint16_t r = bf16_from_f32(u2f(hi << 16 | lows[l]));
      fwrite(&r, 2, 1, stdout);
    }
}
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "conv")) { conv(); return 0; }
  char ty[32], op[32];
  unsigned long long c, seed, first, rank, n;
  while (scanf("%31s %31s %llu %llu %llu %llu %llu", ty, op, &c, &seed, &first, &rank, &n) == 7) {
"#,
    );
    for d in DataType::ALL {
        for op in ReduceOp::ALL {
            let t = type_tag(d);
            let name = |k| kernel_name(k, d, op);
            s.push_str(&format!(
                r#"    if (!strcmp(ty, "{t}") && !strcmp(op, "{o}")) {{
      typedef T_{t}::Store S;
      S *in = (S *)calloc(c + 1, sizeof(S)), *next = (S *)calloc(c + 1, sizeof(S));
      S *exp = (S *)calloc(c + 1, sizeof(S)), *red = (S *)calloc(c + 1, sizeof(S));
      S *tmp = (S *)calloc(c + 1, sizeof(S));
      uint64_t w1 = 0, w2 = 0;
      {fi}(in, c, seed, first, rank, n);
      {fi}(next, c, seed, first, (rank + 1) % n, n);
      {fe}(exp, c, seed, first, n);
      {rd}(red, in, next, c);
      emit(in, c); emit(exp, c); emit(red, c);
      memcpy(tmp, in, c * sizeof(S)); {fa}(tmp, c, n); emit(tmp, c);
      {pm}(tmp, in, c, rank); emit(tmp, c);
      {cw}(in, exp, c, &w1); {cw}(exp, exp, c, &w2);
      emit(&w1, 1); emit(&w2, 1);
      free(in); free(next); free(exp); free(red); free(tmp);
    }}
"#,
                o = op.name(),
                fi = name(Kernel::FillInput),
                fe = name(Kernel::FillExpected),
                rd = name(Kernel::Reduce),
                fa = name(Kernel::FinishAvg),
                pm = name(Kernel::Premultiply),
                cw = name(Kernel::CountWrong),
            ));
        }
    }
    s.push_str("  }\n  return 0;\n}\n");
    s
}

/// Builds into a directory of its own per `tag`, so tests running at once do not share an
/// executable; the caller removes it.
fn build_host_program(tag: &str) -> Option<std::path::PathBuf> {
    let Some(cxx) = cxx() else {
        eprintln!("SKIP: no C++ compiler (c++, g++ or $CXX): kernels.cu not checked on the host");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("busbw-kernels-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("kernels_host.cpp");
    let exe = dir.join("kernels_host");
    std::fs::write(&src, host_program()).expect("write source");
    // -ffp-contract=off: the host twin of --fmad=false.
    let out = Command::new(&cxx)
        .args(["-O1", "-std=c++14", "-ffp-contract=off", "-w", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run the C++ compiler");
    assert!(
        out.status.success(),
        "kernels.cu does not build as host C++:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

struct Case {
    dtype: DataType,
    op: ReduceOp,
    count: usize,
    seed: u64,
    first: u64,
    rank: usize,
    n: usize,
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            for (n, rank) in [(1, 0), (2, 1), (3, 2), (5, 0), (8, 7), (64, 33), (300, 299)] {
                for (seed, first) in [(99u64, 0u64), (7, 123_456_789)] {
                    v.push(Case {
                        dtype,
                        op,
                        count: 193,
                        seed,
                        first,
                        rank,
                        n,
                    });
                }
            }
        }
    }
    v
}

fn bytes_of<T: Element>(v: &[T]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| {
            let b = x.to_bits_u64().to_le_bytes();
            b[..std::mem::size_of::<T>()].to_vec()
        })
        .collect()
}

/// What the host path gives for one case, in the driver's output order.
fn rust_side<T: Verifiable>(c: &Case) -> (Vec<Vec<u8>>, [u64; 2]) {
    let z = T::from_f64(0.0);
    let mut input = vec![z; c.count];
    let mut next = vec![z; c.count];
    let mut exp = vec![z; c.count];
    verifiable::fill_input_typed(&mut input, c.op, c.seed, c.first, c.rank, c.n);
    verifiable::fill_input_typed(&mut next, c.op, c.seed, c.first, (c.rank + 1) % c.n, c.n);
    verifiable::fill_expected_typed(&mut exp, c.op, c.seed, c.first, c.n);
    let mut red = vec![z; c.count];
    element::reduce_into(c.op, &mut red, &input, &next);
    let mut avg = input.clone();
    element::finish_avg(&mut avg, c.n);
    let mut pm = vec![z; c.count];
    element::scale_into(&mut pm, &input, c.rank);
    let w = [
        verifiable::count_wrong_typed(&input, &exp, c.op),
        verifiable::count_wrong_typed(&exp, &exp, c.op),
    ];
    (
        [input, exp, red, avg, pm]
            .iter()
            .map(|v| bytes_of(v))
            .collect(),
        w,
    )
}

#[test]
fn kernel_source_matches_the_host_generators_and_kernels_bit_for_bit() {
    let Some(exe) = build_host_program("gen") else {
        return;
    };
    let cases = cases();
    let mut script = String::new();
    for c in &cases {
        script.push_str(&format!(
            "{} {} {} {} {} {} {}\n",
            type_tag(c.dtype),
            c.op.name(),
            c.count,
            c.seed,
            c.first,
            c.rank,
            c.n
        ));
    }
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the host build of kernels.cu");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(script.as_bytes()));
    let out = child.wait_with_output().expect("host kernels output");
    writer.join().expect("writer").expect("write script");
    let _ = std::fs::remove_dir_all(exe.parent().expect("dir"));
    assert!(out.status.success());
    let mut at = 0;
    let names = ["input", "expected", "reduce", "finish_avg", "premultiply"];
    for c in &cases {
        let (want, wrong) = with_dtype!(c.dtype, T => rust_side::<T>(c));
        for (what, w) in names.iter().zip(&want) {
            let got = &out.stdout[at..at + w.len()];
            at += w.len();
            if let Some(i) = (0..w.len()).find(|&i| got[i] != w[i]) {
                panic!(
                    "{} {} n={} rank={} seed={} first={}: {what} differs at byte {i}: device source {:#04x}, host {:#04x}",
                    c.dtype, c.op, c.n, c.rank, c.seed, c.first, got[i], w[i]
                );
            }
        }
        for (k, w) in wrong.iter().enumerate() {
            let got = u64::from_le_bytes(out.stdout[at..at + 8].try_into().expect("8 bytes"));
            at += 8;
            assert_eq!(got, *w, "{} {} wrong count {k}", c.dtype, c.op);
        }
    }
    assert_eq!(at, out.stdout.len(), "driver wrote more than expected");
}

/// The rounding and widening functions of `kernels.cu` against the Rust element types (whose
/// own conversions `element/narrow.rs` tests against the `half` crate and exact arithmetic).
#[test]
fn kernel_conversions_match_the_host_element_types() {
    use crate::element::{bf16, f16, F8E4M3, F8E5M2};
    let Some(exe) = build_host_program("conv") else {
        return;
    };
    let out = Command::new(&exe).arg("conv").output().expect("run conv");
    let _ = std::fs::remove_dir_all(exe.parent().expect("dir"));
    assert!(out.status.success());
    let mut words = out
        .stdout
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")));
    let lows = [
        0u32, 1, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0xffff,
    ];
    type Enc = fn(f32) -> u32;
    type Enc64 = fn(f64) -> u32;
    type Dec = fn(u32) -> f32;
    let formats: [(&str, Enc, Enc64, Dec, u32); 4] = [
        (
            "half",
            |x| f16::from_f32(x).to_bits() as u32,
            |x| f16::from_f64_elem(x),
            |b| f16::from_bits(b as u16).to_f32(),
            65536,
        ),
        (
            "bfloat16",
            |x| bf16::from_f32(x).to_bits() as u32,
            |x| bf16::from_f64_elem(x),
            |b| bf16::from_bits(b as u16).to_f32(),
            65536,
        ),
        (
            "f8e4m3",
            |x| F8E4M3::from_f32(x).to_bits() as u32,
            |x| F8E4M3::from_f64(x).to_bits() as u32,
            |b| F8E4M3::from_bits(b as u8).to_f32(),
            256,
        ),
        (
            "f8e5m2",
            |x| F8E5M2::from_f32(x).to_bits() as u32,
            |x| F8E5M2::from_f64(x).to_bits() as u32,
            |b| F8E5M2::from_bits(b as u8).to_f32(),
            256,
        ),
    ];
    for (name, enc, enc64, dec, codes) in formats {
        for hi in 0..65536u32 {
            for low in lows {
                let x = f32::from_bits(hi << 16 | low);
                let (g32, g64) = (words.next().expect("f32"), words.next().expect("f64"));
                if !x.is_nan() || name.starts_with("f8") {
                    assert_eq!(g32, enc(x), "{name} encode_f32({:#010x})", x.to_bits());
                }
                assert_eq!(
                    g64,
                    enc64(x as f64),
                    "{name} encode_f64({:#010x})",
                    x.to_bits()
                );
            }
        }
        for b in 0..codes {
            let got = f32::from_bits(words.next().expect("decode"));
            let want = dec(b);
            if want.is_nan() {
                assert!(got.is_nan(), "{name} decode {b:#x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{name} decode {b:#x}");
            }
        }
    }
    let halves: Vec<u16> = out.stdout[out.stdout.len() - 65536 * lows.len() * 2..]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().expect("2 bytes")))
        .collect();
    let mut it = halves.iter();
    for hi in 0..65536u32 {
        for low in lows {
            let x = f32::from_bits(hi << 16 | low);
            assert_eq!(
                *it.next().expect("bf16"),
                bf16::from_f32(x).to_bits(),
                "bf16_from_f32({x:?})"
            );
        }
    }
}

/// `Element::from_f64` under a name that does not clash with the `half` crate's own (which
/// rounds bf16 differently; see `element/narrow.rs`).
trait FromF64Elem {
    fn from_f64_elem(x: f64) -> u32;
}
impl FromF64Elem for crate::element::f16 {
    fn from_f64_elem(x: f64) -> u32 {
        <Self as Element>::from_f64(x).to_bits() as u32
    }
}
impl FromF64Elem for crate::element::bf16 {
    fn from_f64_elem(x: f64) -> u32 {
        <Self as Element>::from_f64(x).to_bits() as u32
    }
}

#[test]
fn every_module_exports_every_kernel_it_names() {
    for d in DataType::ALL {
        let src = module_source(d);
        let names = kernel_names(d);
        assert_eq!(names.len(), ReduceOp::ALL.len() * Kernel::PER_OP.len() + 2);
        for op in ReduceOp::ALL {
            assert!(
                src.contains(&format!(
                    "BUSBW_OP_INSTANCE({}, {}, ",
                    type_tag(d),
                    op.name()
                )),
                "{d} {op}"
            );
        }
        assert!(names.contains(&format!("busbw_reduce_{}_sum", type_tag(d))));
        assert!(names.contains(&format!("busbw_finish_avg_{}", type_tag(d))));
        // The macro pastes `busbw_<stem>_##TY##_##OPNAME`: the names must be what it pastes.
        assert!(PRELUDE.contains("busbw_fill_input_##TY##_##OPNAME"));
        assert!(PRELUDE.contains("busbw_premultiply_##TY"));
    }
    assert_eq!(
        kernel_name(Kernel::CountWrong, DataType::F8E5M2, ReduceOp::MulSum),
        "busbw_count_wrong_f8e5m2_mulsum"
    );
}

#[test]
fn launch_dims_cover_the_count_with_a_capped_grid() {
    assert_eq!(launch_dims(0, 132), (1, 256));
    assert_eq!(launch_dims(1000, 132), (4, 256));
    assert_eq!(launch_dims(1 << 30, 132), (132 * 8, 256));
}
