//! `busbw gpu-bench`: the device's copy and reduction kernels timed alone, beside the
//! copy engine's bandwidth (the table is `busbw_measure::device`'s).

use busbw_measure::device;

/// `busbw gpu-bench`: exit 0, 2 (no CUDA in the build or on the host) or 1 (a CUDA error).
pub fn bench_main(a: &crate::cli::GpuBenchArgs) -> i32 {
    use crate::cli::Choice;
    use busbw_collectives::{DataType, ReduceOp};
    if !cfg!(feature = "cuda") {
        eprintln!("busbw: error: {}", device::NO_CUDA_BUILD);
        return crate::exit::USAGE;
    }
    if let Err(e) = busbw_collectives::cuda::probe() {
        eprintln!("busbw: error: {e}");
        return crate::exit::USAGE;
    }
    let dtypes = match &a.dtype {
        Choice::All => DataType::ALL.to_vec(),
        Choice::One(d) => vec![*d],
    };
    let op = match &a.op {
        Choice::All => ReduceOp::Sum,
        Choice::One(o) => *o,
    };
    match device::kernel_bench(a.device, a.bytes as usize, a.iters.max(1), &dtypes, op) {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            crate::exit::OK
        }
        Err(e) => {
            eprintln!("busbw: error: gpu-bench: {e:#}");
            crate::exit::INTERNAL
        }
    }
}
