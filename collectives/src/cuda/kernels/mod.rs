//! NVRTC sources for the device kernels, and their names.
//!
//! One module per element type holds every kernel of that type: verifiable input and
//! expected output generators, the `#wrong` comparison, the reduction, the `avg` division and
//! the `mulsum` premultiplication. `kernels.cu` is a port of `verifiable.rs`, `element.rs`
//! and `element/narrow.rs` in the C++ subset NVRTC and a host compiler share, so the tests
//! here build it on the host and compare its output with the Rust generators bit for bit:
//! the arithmetic is checked on every machine, the NVRTC compile only on a GPU host.

use crate::dtype::{DataType, ReduceOp};

/// The shared body of every module.
pub const PRELUDE: &str = include_str!("../kernels.cu");

/// Options for NVRTC. `--fmad=false`: a fused multiply-add rounds once where the host rounds
/// twice, and the expected output must be the host's bits.
pub const NVRTC_OPTIONS: [&str; 3] = ["--fmad=false", "--std=c++14", "-default-device"];

/// What a kernel does; part of its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `(out, count, seed, first_index, rank, nranks)`
    FillInput,
    /// `(out, count, seed, first_index, nranks)`
    FillExpected,
    /// `(got, expected, count, *wrong)`; adds to `*wrong`.
    CountWrong,
    /// `(dst, a, b, count)`: `dst = a op b`, `dst` may be `a`.
    Reduce,
    /// `(dst, count, nranks)`: per type, not per op.
    FinishAvg,
    /// `(dst, src, count, rank)`: per type, not per op.
    Premultiply,
}

impl Kernel {
    pub const PER_OP: [Kernel; 4] = [
        Kernel::FillInput,
        Kernel::FillExpected,
        Kernel::CountWrong,
        Kernel::Reduce,
    ];

    fn stem(self) -> &'static str {
        match self {
            Kernel::FillInput => "fill_input",
            Kernel::FillExpected => "fill_expected",
            Kernel::CountWrong => "count_wrong",
            Kernel::Reduce => "reduce",
            Kernel::FinishAvg => "finish_avg",
            Kernel::Premultiply => "premultiply",
        }
    }
}

/// The `T_<tag>` struct of a type in `kernels.cu`: nccl-tests' type names, which are valid
/// identifiers.
pub fn type_tag(d: DataType) -> &'static str {
    d.name()
}

/// The enum value of an op in `kernels.cu`.
fn op_value(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "OP_SUM",
        ReduceOp::Prod => "OP_PROD",
        ReduceOp::Max => "OP_MAX",
        ReduceOp::Min => "OP_MIN",
        ReduceOp::Avg => "OP_AVG",
        ReduceOp::MulSum => "OP_MULSUM",
    }
}

/// The exported (unmangled) name of a kernel. `op` is ignored for the per-type kernels.
pub fn kernel_name(k: Kernel, d: DataType, op: ReduceOp) -> String {
    match k {
        Kernel::FinishAvg | Kernel::Premultiply => format!("busbw_{}_{}", k.stem(), type_tag(d)),
        _ => format!("busbw_{}_{}_{}", k.stem(), type_tag(d), op.name()),
    }
}

/// Every kernel name a module for `d` exports.
pub fn kernel_names(d: DataType) -> Vec<String> {
    let mut v: Vec<String> = ReduceOp::ALL
        .iter()
        .flat_map(|&op| Kernel::PER_OP.iter().map(move |&k| kernel_name(k, d, op)))
        .collect();
    v.push(kernel_name(Kernel::FinishAvg, d, ReduceOp::Sum));
    v.push(kernel_name(Kernel::Premultiply, d, ReduceOp::Sum));
    v
}

/// The complete source of the module for `d`: the prelude and [`instances`].
pub fn module_source(d: DataType) -> String {
    format!("{PRELUDE}\n{}", instances(d))
}

/// The lines that instantiate `d`'s kernels, one per op and one for the per-type kernels.
pub fn instances(d: DataType) -> String {
    let mut s = String::new();
    for op in ReduceOp::ALL {
        s.push_str(&format!(
            "BUSBW_OP_INSTANCE({}, {}, {})\n",
            type_tag(d),
            op.name(),
            op_value(op)
        ));
    }
    s.push_str(&format!("BUSBW_TYPE_INSTANCE({})\n", type_tag(d)));
    s
}

/// Threads per block and blocks for `count` elements: grid-stride loops, so a capped grid of
/// a few waves per SM covers any count.
pub fn launch_dims(count: u64, sm_count: u32) -> (u32, u32) {
    const THREADS: u32 = 256;
    let want = count.div_ceil(THREADS as u64).max(1);
    let cap = (sm_count.max(1) as u64) * 8;
    (want.min(cap) as u32, THREADS)
}

#[cfg(test)]
mod tests;
