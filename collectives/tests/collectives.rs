//! Every collective against a reference computed without the engine: plain loops over every
//! rank's input (reductions: the fold of all inputs, exact in any order by construction).

use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::verifiable::{count_wrong, fill_expected, fill_input};
use busbw_collectives::{
    all_gather, alltoall, broadcast, gather, hypercube, reduce, reduce_scatter, scatter, sendrecv,
    CommConfig, CommError, Communicator, Data, DataType, ReduceOp,
};
use proptest::prelude::*;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    Alltoall,
    Scatter,
    Gather,
    SendRecv,
    HyperCube,
}

const KINDS: [Kind; 9] = [
    Kind::AllGather,
    Kind::ReduceScatter,
    Kind::Broadcast,
    Kind::Reduce,
    Kind::Alltoall,
    Kind::Scatter,
    Kind::Gather,
    Kind::SendRecv,
    Kind::HyperCube,
];

#[derive(Clone, Copy, Debug)]
struct Case {
    kind: Kind,
    n: usize,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    root: usize,
}

/// (input elements, output elements, in-place input offset, in-place output offset), in
/// elements, for rank `r`.
fn layout(c: &Case, r: usize) -> (usize, usize, usize, usize) {
    let (n, k) = (c.n, c.count);
    match c.kind {
        Kind::AllGather | Kind::HyperCube => (k, n * k, r * k, 0),
        Kind::Gather => (k, n * k, r * k, 0),
        Kind::ReduceScatter | Kind::Scatter => (n * k, k, 0, r * k),
        Kind::Alltoall => (n * k, n * k, 0, 0),
        Kind::Broadcast | Kind::Reduce | Kind::SendRecv => (k, k, 0, 0),
    }
}

/// Bytes with 8-byte alignment, so any element type can be viewed in them.
#[derive(Clone)]
struct Bytes(Vec<u64>, usize);

impl Bytes {
    fn zeroed(len: usize) -> Self {
        Bytes(vec![0u64; len.div_ceil(8)], len)
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: u64 storage viewed as its first `self.1` bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.1) }
    }
}

impl std::ops::DerefMut for Bytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, self.1) }
    }
}

fn input_of(c: &Case, r: usize) -> Bytes {
    let (inp, ..) = layout(c, r);
    let mut v = Bytes::zeroed(inp * c.dtype.size());
    match c.kind {
        Kind::ReduceScatter | Kind::Reduce => fill_input(c.dtype, c.op, &mut v, 42, 0, r, c.n),
        // Data movement: any bits will do, as long as every rank's differ.
        _ => fill_input(c.dtype, ReduceOp::Sum, &mut v, 1000 + r as u64, 0, 0, 1),
    }
    v
}

/// What rank `r`'s output buffer (in place: the whole buffer) must hold afterwards.
fn expected_of(c: &Case, r: usize, inputs: &[Bytes]) -> Bytes {
    let ts = c.dtype.size();
    let kb = c.count * ts;
    let (inp, out, in_off, out_off) = layout(c, r);
    // Start from what the buffer held before: zeros, plus our input when in place.
    let len = if c.in_place { inp.max(out) } else { out } * ts;
    let mut e = Bytes::zeroed(len);
    if c.in_place {
        e[in_off * ts..in_off * ts + inp * ts].copy_from_slice(&inputs[r]);
    }
    let o = if c.in_place { out_off * ts } else { 0 };
    match c.kind {
        Kind::AllGather | Kind::HyperCube => {
            for (j, x) in inputs.iter().enumerate() {
                e[j * kb..(j + 1) * kb].copy_from_slice(x);
            }
        }
        Kind::Gather if r == c.root => {
            for (j, x) in inputs.iter().enumerate() {
                e[j * kb..(j + 1) * kb].copy_from_slice(x);
            }
        }
        Kind::Gather => {}
        Kind::ReduceScatter => {
            fill_expected(
                c.dtype,
                c.op,
                &mut e[o..o + kb],
                42,
                (r * c.count) as u64,
                c.n,
            );
        }
        Kind::Reduce if r == c.root => fill_expected(c.dtype, c.op, &mut e[..kb], 42, 0, c.n),
        Kind::Reduce => {}
        Kind::Broadcast => e[..kb].copy_from_slice(&inputs[c.root]),
        Kind::Scatter => e[o..o + kb].copy_from_slice(&inputs[c.root][r * kb..(r + 1) * kb]),
        Kind::Alltoall => {
            for (j, x) in inputs.iter().enumerate() {
                e[j * kb..(j + 1) * kb].copy_from_slice(&x[r * kb..(r + 1) * kb]);
            }
        }
        Kind::SendRecv => e[..kb].copy_from_slice(&inputs[(r + c.n - 1) % c.n]),
    }
    e
}

fn call(comm: &mut Communicator, c: &Case, d: Data<'_>) -> Result<(), CommError> {
    match c.kind {
        Kind::AllGather => all_gather(comm, d, c.count, c.dtype),
        Kind::ReduceScatter => reduce_scatter(comm, d, c.count, c.dtype, c.op),
        Kind::Broadcast => broadcast(comm, d, c.count, c.dtype, c.root),
        Kind::Reduce => reduce(comm, d, c.count, c.dtype, c.op, c.root),
        Kind::Alltoall => alltoall(comm, d, c.count, c.dtype),
        Kind::Scatter => scatter(comm, d, c.count, c.dtype, c.root),
        Kind::Gather => gather(comm, d, c.count, c.dtype, c.root),
        Kind::SendRecv => sendrecv(comm, d, c.count, c.dtype),
        Kind::HyperCube => hypercube(comm, d, c.count, c.dtype),
    }
}

/// Runs the case on thread ranks; returns wrong elements per rank.
fn run_case(c: Case, seg: usize, window: usize, transport: ThreadTransport) -> Vec<u64> {
    let cfg = CommConfig {
        timeout: Duration::from_secs(20),
        segment_bytes: seg,
        window,
        ..CommConfig::default()
    };
    let inputs: Vec<Bytes> = (0..c.n).map(|r| input_of(&c, r)).collect();
    let comms = thread_world(c.n, transport, cfg).unwrap();
    run_threads(comms, |comm| {
        let r = comm.rank();
        let ts = c.dtype.size();
        let (inp, out, in_off, _) = layout(&c, r);
        let expected = expected_of(&c, r, &inputs);
        let got = if c.in_place {
            let mut buf = Bytes::zeroed(inp.max(out) * ts);
            buf[in_off * ts..(in_off + inp) * ts].copy_from_slice(&inputs[r]);
            call(comm, &c, Data::InPlace(&mut buf)).unwrap();
            buf
        } else {
            let mut send = Bytes::zeroed(inp * ts);
            send.copy_from_slice(&inputs[r]);
            let mut recv = Bytes::zeroed(out * ts);
            call(
                comm,
                &c,
                Data::OutOfPlace {
                    send: &send,
                    recv: &mut recv,
                },
            )
            .unwrap();
            assert_eq!(
                &send[..],
                &inputs[r][..],
                "{c:?}: rank {r}'s input clobbered"
            );
            recv
        };
        count_wrong(c.dtype, c.op, &got[..expected.len()], &expected)
    })
}

fn case_strategy() -> impl Strategy<Value = (Case, usize, usize)> {
    (
        proptest::sample::select(KINDS.to_vec()),
        1usize..=9,
        prop_oneof![
            Just(0usize),
            Just(1),
            proptest::sample::select(vec![2usize, 3, 5, 7, 13, 31, 97, 257, 1021]),
            0usize..600
        ],
        proptest::sample::select(DataType::ALL.to_vec()),
        proptest::sample::select(ReduceOp::ALL.to_vec()),
        any::<bool>(),
        0usize..9,
        prop_oneof![Just(1usize), 8usize..300, Just(1 << 20)],
        1usize..5,
    )
        .prop_map(|(kind, n, count, dtype, op, in_place, root, seg, window)| {
            let n = if kind == Kind::HyperCube {
                [1, 2, 4, 8][n % 4]
            } else {
                n
            };
            (
                Case {
                    kind,
                    n,
                    count,
                    dtype,
                    op,
                    in_place,
                    root: root % n,
                },
                seg,
                window,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn every_collective_matches_reference((case, seg, window) in case_strategy()) {
        let wrong = run_case(case, seg, window, ThreadTransport::Inproc);
        prop_assert!(wrong.iter().all(|w| *w == 0), "{case:?} seg={seg} window={window}: wrong per rank {wrong:?}");
    }
}

/// Each collective over real sockets, in and out of place, with several segments in flight.
#[test]
fn every_collective_over_tcp() {
    for kind in KINDS {
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
            let wrong = run_case(c, 1024, 3, ThreadTransport::Tcp);
            assert!(wrong.iter().all(|w| *w == 0), "{c:?}: {wrong:?}");
        }
    }
}

/// Validation must notice a misplaced block, or the tests above prove nothing.
#[test]
fn reference_detects_a_wrong_block() {
    let c = Case {
        kind: Kind::AllGather,
        n: 3,
        count: 10,
        dtype: DataType::Int32,
        op: ReduceOp::Sum,
        in_place: false,
        root: 0,
    };
    let inputs: Vec<Bytes> = (0..3).map(|r| input_of(&c, r)).collect();
    let e = expected_of(&c, 0, &inputs);
    let mut swapped = e.clone();
    swapped[..40].copy_from_slice(&e[40..80]);
    assert_eq!(count_wrong(c.dtype, c.op, &swapped, &e), 10);
}

#[test]
fn hypercube_rejects_non_power_of_two() {
    let comms = thread_world(3, ThreadTransport::Inproc, CommConfig::default()).unwrap();
    let errs = run_threads(comms, |comm| {
        let mut b = vec![0u8; 12];
        hypercube(comm, Data::InPlace(&mut b), 1, DataType::Int32)
            .unwrap_err()
            .to_string()
    });
    assert!(errs[0].contains("power-of-two"), "{}", errs[0]);
}
