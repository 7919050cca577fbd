//! Fixed cases on a simulated device that the random ones reach too rarely (every op), and
//! device data the call must refuse.

use crate::harness::{dev, run_case_on};
use crate::reference::{Case, Kind};
use busbw_collectives::offload::sim::{Counts, SimDevice};
use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::{
    all_reduce, sendrecv, CommConfig, Data, DataType, MemorySpace, Mirror, ReduceOp,
};
use std::time::Duration;

/// Every op (avg's division and mulsum's premultiplication run on the device too) for the
/// reducing collectives that drive the device, with several segments per chunk.
#[test]
fn every_op_reduces_on_the_device() {
    let kinds = [
        Kind::AllReduce,
        Kind::TreeAllReduce,
        Kind::ReduceScatter,
        Kind::Reduce,
    ];
    for kind in kinds {
        for op in ReduceOp::ALL {
            for dtype in [DataType::BFloat16, DataType::Float32, DataType::Int64] {
                let c = Case {
                    kind,
                    n: 4,
                    count: 1000,
                    dtype,
                    op,
                    in_place: op == ReduceOp::Avg,
                    root: 2,
                };
                let res = run_case_on(c, 256, 2, ThreadTransport::Inproc, dev(10));
                assert!(res.iter().all(|r| r.0 == 0), "{c:?}: {res:?}");
                let k: Counts = res.iter().fold(Counts::default(), |a, r| Counts {
                    reduces: a.reduces + r.1.reduces,
                    premultiplies: a.premultiplies + r.1.premultiplies,
                    ..a
                });
                assert!(k.reduces > 0, "{c:?}: nothing reduced on the device");
                if op == ReduceOp::MulSum {
                    assert_eq!(k.premultiplies, 4, "{c:?}: each rank premultiplies once");
                }
            }
        }
    }
}

/// Data said to be on a device must be the device's twins: a buffer outside its mirrors is
/// refused with a message that says so, by the executor's collectives and by the ones staged
/// around (the space is stated, never guessed from addresses), and nothing is moved.
#[test]
fn device_data_outside_the_mirrors_is_refused() {
    let comms = thread_world(2, ThreadTransport::Inproc, CommConfig::default()).unwrap();
    let errs = run_threads(comms, |comm| {
        let mut sim = SimDevice::new(Duration::ZERO, 1);
        let mut twin = vec![0u8; 64];
        let dev = sim.alloc(twin.len()).unwrap();
        sim.set_mirrors(vec![Mirror {
            host: twin.as_mut_ptr(),
            device: dev,
            len: twin.len(),
        }])
        .unwrap();
        let mut stray = vec![7u8; 64];
        let ring = all_reduce(
            comm,
            Data::in_place(&mut stray).on(MemorySpace::Device(&mut sim)),
            16,
            DataType::Float32,
            ReduceOp::Sum,
        );
        let p2p = sendrecv(
            comm,
            Data::in_place(&mut stray).on(MemorySpace::Device(&mut sim)),
            16,
            DataType::Float32,
        );
        let moved = sim.counts();
        (
            ring.unwrap_err().to_string(),
            p2p.unwrap_err().to_string(),
            stray.iter().all(|&b| b == 7),
            moved,
        )
    });
    for (ring, p2p, untouched, counts) in errs {
        for e in [&ring, &p2p] {
            assert!(
                e.contains("on a device") && e.contains("no device twin"),
                "{e}"
            );
        }
        assert!(
            ring.contains("all_reduce") && p2p.contains("sendrecv"),
            "{ring} / {p2p}"
        );
        assert!(untouched, "a refused call must not touch the buffer");
        assert_eq!(
            counts.downloads + counts.uploads + counts.copies,
            0,
            "nothing was staged: {counts:?}"
        );
    }
}
