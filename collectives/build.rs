//! Sets `busbw_avx512` (and `busbw_avx512fp16`) when this compiler can build the AVX-512
//! reduction kernels (and the half/bfloat16 arithmetic ones).
//!
//! The workspace supports Rust 1.89, from which AVX-512 target features and intrinsics are
//! stable; the FP16 ones are stable only from 1.94. Probing the code itself (rather than the
//! version number) keeps older compilers building the crate, with a lower best tier, and lets
//! newer ones add the wider tiers.

fn main() {
    autocfg::emit_possibility("busbw_avx512");
    autocfg::emit_possibility("busbw_avx512fp16");
    autocfg::rerun_path("build.rs");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return;
    }
    // No probe (no rustc, no OUT_DIR): build without the tier rather than fail the build.
    let Ok(mut ac) = autocfg::AutoCfg::new() else {
        return;
    };
    ac.set_edition(Some("2021".to_string()));
    let probe = r#"
        use core::arch::x86_64::*;
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        pub unsafe fn probe(a: __m512, k: __mmask16, x: __m256i) -> __m256i {
            _mm256_mask_blend_epi16(k, x, _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
        }
    "#;
    if ac.probe_raw(probe).is_err() {
        return;
    }
    autocfg::emit("busbw_avx512");
    // Half arithmetic is stable from 1.94.
    let probe = r#"
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512fp16,avx512bf16")]
        pub unsafe fn probe(a: __m512i, f: __m512) -> __m512i {
            let h = _mm512_castsi512_ph(a);
            let k = _mm512_cmp_ph_mask(h, h, _CMP_UNORD_Q) | _mm512_fpclass_ps_mask(f, 0x20) as u32;
            let b: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(f, f));
            _mm512_mask_blend_epi16(k, _mm512_castph_si512(_mm512_add_ph(h, h)), b)
        }
        pub fn detect() -> bool {
            is_x86_feature_detected!("avx512fp16") && is_x86_feature_detected!("avx512bf16")
        }
    "#;
    if ac.probe_raw(probe).is_ok() {
        autocfg::emit("busbw_avx512fp16");
    }
}
