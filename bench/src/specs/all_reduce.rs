use super::{CollectiveSpec, Counts, DataCtx};
use busbw_collectives::verifiable::{fill_expected, fill_input};
use busbw_collectives::{all_reduce, CommError, Communicator, Data, DataType};

pub static SPEC: CollectiveSpec = CollectiveSpec {
    program: "all_reduce_perf",
    reduces: true,
    counts,
    alg_bytes: |c, _| c.size() as f64,
    // 2(n-1) transfers of every element over n links (nccl-tests PERFORMANCE.md).
    busbw_factor: |n| 2.0 * (n as f64 - 1.0) / n as f64,
    init,
    run,
};

fn counts(bytes: u64, dtype: DataType, _n: usize) -> Counts {
    let count = (bytes / dtype.size() as u64) as usize;
    let b = count * dtype.size();
    Counts {
        count,
        send_bytes: b,
        recv_bytes: b,
    }
}

fn init(ctx: &DataCtx, send: &mut [u8], recv: &mut [u8], expected: Option<&mut [u8]>) {
    let b = ctx.counts.send_bytes;
    let input = if ctx.in_place {
        &mut recv[..b]
    } else {
        &mut send[..b]
    };
    fill_input(ctx.dtype, ctx.op, input, ctx.seed, 0, ctx.rank, ctx.nranks);
    if let Some(e) = expected {
        fill_expected(ctx.dtype, ctx.op, &mut e[..b], ctx.seed, 0, ctx.nranks);
    }
}

fn run(
    comm: &mut Communicator,
    send: &[u8],
    recv: &mut [u8],
    ctx: &DataCtx,
) -> Result<(), CommError> {
    let b = ctx.counts.send_bytes;
    let data = if ctx.in_place {
        Data::InPlace(&mut recv[..b])
    } else {
        Data::OutOfPlace {
            send: &send[..b],
            recv: &mut recv[..b],
        }
    };
    all_reduce(comm, data, ctx.counts.count, ctx.dtype, ctx.op)
}
