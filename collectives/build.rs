//! Sets `busbw_avx512` when this compiler can build the AVX-512 reduction kernels.
//!
//! The workspace supports Rust 1.80, but AVX-512 target features and intrinsics are stable only
//! from 1.89. Probing the code itself (rather than the version number) keeps older compilers
//! building the crate, with the AVX2 tier as the best one, and lets newer ones add AVX-512.

fn main() {
    autocfg::emit_possibility("busbw_avx512");
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
    if ac.probe_raw(probe).is_ok() {
        autocfg::emit("busbw_avx512");
    }
}
