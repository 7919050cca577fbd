//! Every collective against a reference computed without the engine: plain loops over every
//! rank's input (reductions: the fold of all inputs, exact in any order by construction).

use busbw_collectives::offload::sim::{Counts, SimDevice};
use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::verifiable::{count_wrong, fill_expected, fill_input};
use busbw_collectives::{
    all_gather, all_reduce, alltoall, broadcast, gather, hypercube, rd_all_reduce, reduce,
    reduce_scatter, scatter, sendrecv, tree_all_reduce, CommConfig, CommError, Communicator, Data,
    DataType, MemorySpace, Mirror, ReduceOp,
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
    /// The AllReduce algorithms (their own files test them on host memory; here on a device).
    AllReduce,
    TreeAllReduce,
    RdAllReduce,
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

/// Every kind, for the device tests: the AllReduce algorithms too.
fn device_kinds() -> Vec<Kind> {
    let all_reduce = [Kind::AllReduce, Kind::TreeAllReduce, Kind::RdAllReduce];
    KINDS.iter().copied().chain(all_reduce).collect()
}

impl Kind {
    /// Whether the algorithm drives the device itself (reductions on the device, copies per
    /// segment) rather than being staged around.
    fn drives_device(self) -> bool {
        matches!(
            self,
            Kind::AllGather
                | Kind::ReduceScatter
                | Kind::Broadcast
                | Kind::Reduce
                | Kind::AllReduce
                | Kind::TreeAllReduce
        )
    }
    fn reduces(self) -> bool {
        matches!(
            self,
            Kind::ReduceScatter
                | Kind::Reduce
                | Kind::AllReduce
                | Kind::TreeAllReduce
                | Kind::RdAllReduce
        )
    }
}

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
        Kind::AllReduce | Kind::TreeAllReduce | Kind::RdAllReduce => (k, k, 0, 0),
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
        k if k.reduces() => fill_input(c.dtype, c.op, &mut v, 42, 0, r, c.n),
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
        Kind::AllReduce | Kind::TreeAllReduce | Kind::RdAllReduce => {
            fill_expected(c.dtype, c.op, &mut e[..kb], 42, 0, c.n)
        }
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
        Kind::AllReduce => all_reduce(comm, d, c.count, c.dtype, c.op),
        Kind::TreeAllReduce => tree_all_reduce(comm, d, c.count, c.dtype, c.op),
        Kind::RdAllReduce => rd_all_reduce(comm, d, c.count, c.dtype, c.op),
    }
}

/// Runs the case on thread ranks; returns wrong elements per rank.
fn run_case(c: Case, seg: usize, window: usize) -> Vec<u64> {
    let res = run_case_on(c, seg, window, ThreadTransport::Inproc, None);
    res.into_iter().map(|(w, _)| w).collect()
}

/// A simulated device for a case: how late its operations may complete, and whether it
/// offers its memory to transports (GPUDirect's direct path, taken where the transport
/// registers device memory, [`ThreadTransport::InprocDevice`]).
#[derive(Clone, Copy, Debug)]
struct Dev {
    jitter: Duration,
    direct: bool,
}

fn dev(us: u64) -> Option<Dev> {
    Some(Dev {
        jitter: Duration::from_micros(us),
        direct: false,
    })
}

/// Twins start as this, so a twin read before its download shows.
const POISON: u8 = 0xA5;

/// The case with every rank's buffers on a [`SimDevice`] whose operations each wait up to
/// `jitter`: the collectives see only poisoned host twins, and the result is read back from
/// the device. Returns wrong elements per rank, with the device's operation counts.
fn run_on_device(comm: &mut Communicator, c: &Case, input: &[u8], device: Dev) -> (Bytes, Counts) {
    let r = comm.rank();
    let ts = c.dtype.size();
    let (inp, out, in_off, _) = layout(c, r);
    let mut sim = SimDevice::new(device.jitter, 7 + r as u64);
    if device.direct {
        sim = sim.direct();
    }
    let mirror = |sim: &mut SimDevice, twin: &mut Bytes, init: &[u8]| {
        let dev = sim.alloc(twin.len()).unwrap();
        sim.write(dev, init).unwrap();
        twin.fill(POISON);
        Mirror {
            host: twin.as_mut_ptr(),
            device: dev,
            len: twin.len(),
        }
    };
    if c.in_place {
        let mut init = Bytes::zeroed(inp.max(out) * ts);
        init[in_off * ts..(in_off + inp) * ts].copy_from_slice(input);
        let mut buf = init.clone();
        let m = mirror(&mut sim, &mut buf, &init);
        sim.set_mirrors(vec![m]).unwrap();
        let d = Data::in_place(&mut buf).on(MemorySpace::Device(&mut sim));
        call(comm, c, d).unwrap();
        let mut got = Bytes::zeroed(m.len);
        got.copy_from_slice(&sim.read(m.device, m.len).unwrap());
        (got, sim.counts())
    } else {
        let (mut send, mut recv) = (Bytes::zeroed(inp * ts), Bytes::zeroed(out * ts));
        let ms = mirror(&mut sim, &mut send, input);
        let mr = mirror(&mut sim, &mut recv, &Bytes::zeroed(out * ts));
        sim.set_mirrors(vec![ms, mr]).unwrap();
        let d = Data::out_of_place(&send, &mut recv).on(MemorySpace::Device(&mut sim));
        call(comm, c, d).unwrap();
        assert_eq!(
            sim.read(ms.device, ms.len).unwrap(),
            input,
            "{c:?}: rank {r}'s device input clobbered"
        );
        let mut got = Bytes::zeroed(mr.len);
        got.copy_from_slice(&sim.read(mr.device, mr.len).unwrap());
        (got, sim.counts())
    }
}

fn run_case_on(
    c: Case,
    seg: usize,
    window: usize,
    transport: ThreadTransport,
    device: Option<Dev>,
) -> Vec<(u64, Counts)> {
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
        if let Some(d) = device {
            let (got, counts) = run_on_device(comm, &c, &inputs[r], d);
            let wrong = count_wrong(c.dtype, c.op, &got[..expected.len()], &expected);
            return (wrong, counts);
        }
        let got = if c.in_place {
            let mut buf = Bytes::zeroed(inp.max(out) * ts);
            buf[in_off * ts..(in_off + inp) * ts].copy_from_slice(&inputs[r]);
            call(comm, &c, Data::in_place(&mut buf)).unwrap();
            buf
        } else {
            let mut send = Bytes::zeroed(inp * ts);
            send.copy_from_slice(&inputs[r]);
            let mut recv = Bytes::zeroed(out * ts);
            call(comm, &c, Data::out_of_place(&send, &mut recv)).unwrap();
            assert_eq!(
                &send[..],
                &inputs[r][..],
                "{c:?}: rank {r}'s input clobbered"
            );
            recv
        };
        let wrong = count_wrong(c.dtype, c.op, &got[..expected.len()], &expected);
        (wrong, Counts::default())
    })
}

fn case_strategy(kinds: &[Kind]) -> impl Strategy<Value = (Case, usize, usize)> {
    (
        proptest::sample::select(kinds.to_vec()),
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
    fn every_collective_matches_reference((case, seg, window) in case_strategy(&KINDS)) {
        let wrong = run_case(case, seg, window);
        prop_assert!(wrong.iter().all(|w| *w == 0), "{case:?} seg={seg} window={window}: wrong per rank {wrong:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// Sends that read their memory only when they complete, as an RDMA NIC may: no
    /// algorithm writes memory an in-flight send still reads (recursive doubling once
    /// combined into its result buffer while that buffer's send was still in flight, which
    /// only the SoftRoCE guests showed).
    #[test]
    fn every_collective_with_sends_read_late(
        (case, seg, window) in case_strategy(&device_kinds()),
    ) {
        let res = run_case_on(case, seg, window, ThreadTransport::InprocLateReads, None);
        let wrong: Vec<u64> = res.iter().map(|r| r.0).collect();
        prop_assert!(wrong.iter().all(|w| *w == 0), "{case:?} seg={seg} window={window}: wrong per rank {wrong:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// Device buffers behind host twins: the engines' downloads, device reductions and
    /// uploads (or the staging around the other algorithms) must give the host result, with
    /// device operations completing late and in their own time.
    #[test]
    fn every_collective_on_a_device(
        (case, seg, window) in case_strategy(&device_kinds()),
        direct in any::<bool>(),
        nic_takes_device_memory in any::<bool>(),
    ) {
        let transport = if nic_takes_device_memory {
            ThreadTransport::InprocDevice
        } else {
            ThreadTransport::Inproc
        };
        let d = Dev { jitter: Duration::from_micros(30), direct };
        let res = run_case_on(case, seg, window, transport, Some(d));
        let wrong: Vec<u64> = res.iter().map(|r| r.0).collect();
        prop_assert!(wrong.iter().all(|w| *w == 0), "{case:?} seg={seg} window={window} {d:?} {transport:?}: wrong per rank {wrong:?}");
        let reduces: u64 = res.iter().map(|r| r.1.reduces).sum();
        let copies: u64 = res.iter().map(|r| r.1.downloads + r.1.uploads).sum();
        let moves = case.n > 1 && case.count > 0;
        if case.kind.drives_device() && moves {
            if direct && nic_takes_device_memory {
                prop_assert_eq!(copies, 0, "{:?}: the direct path copies nothing", case);
            } else {
                prop_assert!(copies > 0, "{:?}: staged through the twins", case);
            }
            // A refused direct path is given up once per rank, then not tried again.
            let refusals: Vec<u64> = res.iter().map(|r| r.1.refusals).collect();
            if direct && !nic_takes_device_memory {
                prop_assert!(refusals.iter().all(|&k| k == 1), "{:?}: refusals {:?}", case, refusals);
            } else {
                prop_assert!(refusals.iter().all(|&k| k == 0), "{:?}: refusals {:?}", case, refusals);
            }
        }
        if case.kind.drives_device() && case.kind.reduces() && case.n > 1 && case.count > 0 {
            prop_assert!(reduces > 0, "{case:?}: no reduction ran on the device");
        }
        if !case.kind.drives_device() {
            prop_assert_eq!(reduces, 0, "{:?}: staged around, so reduced on the host", case);
        }
    }
}

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

#[test]
fn hypercube_rejects_non_power_of_two() {
    let comms = thread_world(3, ThreadTransport::Inproc, CommConfig::default()).unwrap();
    let errs = run_threads(comms, |comm| {
        let mut b = vec![0u8; 12];
        hypercube(comm, Data::in_place(&mut b), 1, DataType::Int32)
            .unwrap_err()
            .to_string()
    });
    assert!(errs[0].contains("power-of-two"), "{}", errs[0]);
}

/// AlltoAllv with irregular sizes, zeros included, out of place and in place, over the
/// in-process and shared-memory transports: every block lands at its sender's offset.
#[test]
fn alltoallv_moves_every_irregular_block() {
    use busbw_collectives::alltoallv;
    let n = 4;
    // Bytes rank i sends to rank j.
    let m = |i: usize, j: usize| ((i * 3 + j * 5) % 7) * 24;
    let byte = |i: usize, j: usize, k: usize| (i * 64 + j * 16 + k % 13) as u8;
    for kind in [ThreadTransport::Inproc, ThreadTransport::Shm] {
        for in_place in [false, true] {
            let comms = thread_world(n, kind, Default::default()).unwrap();
            let got = run_threads(comms, |comm| {
                let r = comm.rank();
                let sends: Vec<usize> = (0..n).map(|j| m(r, j)).collect();
                let recvs: Vec<usize> = (0..n).map(|j| m(j, r)).collect();
                let mut send = Vec::new();
                for (j, &s) in sends.iter().enumerate() {
                    send.extend((0..s).map(|k| byte(r, j, k)));
                }
                let rtotal: usize = recvs.iter().sum();
                let mut recv = vec![0xeeu8; rtotal.max(send.len())];
                let res = if in_place {
                    recv[..send.len()].copy_from_slice(&send);
                    alltoallv(comm, Data::in_place(&mut recv), &sends, &recvs)
                } else {
                    let d = Data::out_of_place(&send, &mut recv);
                    alltoallv(comm, d, &sends, &recvs)
                };
                res.map(|()| (r, recvs, recv))
            });
            for g in got {
                let (r, recvs, recv) = g.unwrap();
                let mut at = 0;
                for (j, &len) in recvs.iter().enumerate() {
                    let want: Vec<u8> = (0..len).map(|k| byte(j, r, k)).collect();
                    assert_eq!(
                        recv[at..at + len],
                        want[..],
                        "rank {r} from {j}, in place {in_place}"
                    );
                    at += len;
                }
            }
        }
    }
}
