//! The same collectives over real sockets, where messages are split and arrive in their own
//! time.

use crate::harness::{dev, run_case_on};
use crate::reference::{device_kinds, Case, Kind, KINDS};
use busbw_collectives::testing::ThreadTransport;
use busbw_collectives::{DataType, ReduceOp};

/// Each collective over real sockets, in and out of place, with several segments in flight,
/// on host memory and on device buffers.
#[test]
fn every_collective_over_tcp() {
    for (kinds, device) in [(KINDS.to_vec(), None), (device_kinds(), dev(20))] {
        for kind in kinds {
            for in_place in [false, true] {
                let n = if kind == Kind::HyperCube { 4 } else { 3 };
                let c = Case {
                    kind,
                    n,
                    count: 1001,
                    dtype: DataType::Float32,
                    op: ReduceOp::Sum,
                    in_place,
                    root: 1,
                };
                let res = run_case_on(c, 1024, 3, ThreadTransport::Tcp, device);
                assert!(
                    res.iter().all(|r| r.0 == 0),
                    "{c:?} device {device:?}: {res:?}"
                );
            }
        }
    }
}
