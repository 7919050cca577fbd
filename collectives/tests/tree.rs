//! Double binary tree AllReduce against the reference reduction and against the ring, on one
//! node and on several, plus algorithm selection.

use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::verifiable::{count_wrong, fill_expected, fill_input};
use busbw_collectives::{
    all_reduce, all_reduce_with, calibrate, tree_all_reduce, Algo, CommConfig, CommError,
    Communicator, CostModel, Data, DataType, HostBuffer, ReduceOp,
};
use proptest::prelude::*;
use std::time::Duration;

fn config(segment_bytes: usize, window: usize) -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(20),
        segment_bytes,
        window,
        ..CommConfig::default()
    }
}

fn input(dtype: DataType, op: ReduceOp, buf: &mut [u8], seed: u64, rank: usize, n: usize) {
    fill_input(dtype, op, buf, seed, 0, rank, n);
}

#[derive(Clone, Copy)]
enum Which {
    Tree,
    Ring,
}

/// Runs one AllReduce on every rank and returns each rank's output.
fn run_outputs(
    comm: &mut Communicator,
    which: Which,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    seed: u64,
) -> HostBuffer {
    let (rank, n) = (comm.rank(), comm.size());
    let bytes = count * dtype.size();
    let mut send = HostBuffer::new(bytes).unwrap();
    let mut recv = HostBuffer::new(bytes).unwrap();
    input(dtype, op, send.as_mut_slice(), seed, rank, n);
    let f = match which {
        Which::Tree => tree_all_reduce,
        Which::Ring => all_reduce,
    };
    if in_place {
        recv.as_mut_slice().copy_from_slice(send.as_slice());
        f(comm, Data::in_place(recv.as_mut_slice()), count, dtype, op).unwrap();
    } else {
        f(
            comm,
            Data::out_of_place(send.as_slice(), recv.as_mut_slice()),
            count,
            dtype,
            op,
        )
        .unwrap();
        let mut again = HostBuffer::new(bytes).unwrap();
        input(dtype, op, again.as_mut_slice(), seed, rank, n);
        assert_eq!(send.as_slice(), again.as_slice(), "send buffer clobbered");
    }
    recv
}

/// Runs one tree AllReduce on `n` thread ranks laid out on `nodes` and returns each rank's
/// wrong-element count.
#[allow(clippy::too_many_arguments)]
fn run_case(
    n: usize,
    nodes: Option<Vec<usize>>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    cfg: CommConfig,
    transport: ThreadTransport,
) -> Vec<u64> {
    let mut comms = thread_world(n, transport, cfg).unwrap();
    if let Some(nodes) = nodes {
        for c in &mut comms {
            c.set_nodes(nodes.clone()).unwrap();
        }
    }
    run_threads(comms, |comm| {
        let seed = 4321 + count as u64;
        let got = run_outputs(comm, Which::Tree, count, dtype, op, in_place, seed);
        let mut want = HostBuffer::new(count * dtype.size()).unwrap();
        fill_expected(dtype, op, want.as_mut_slice(), seed, 0, n);
        count_wrong(dtype, op, got.as_slice(), want.as_slice())
    })
}

fn count_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        proptest::sample::select(vec![2usize, 3, 5, 7, 11, 13, 31, 97, 257, 1021, 4099]),
        0usize..3000,
    ]
}

/// Node layouts for `n` ranks: one host, one rank per host, blocks of three, and an uneven
/// interleaving with labels that are neither dense nor sorted.
fn layout(n: usize, kind: u8) -> Option<Vec<usize>> {
    match kind {
        0 => None,
        1 => Some((0..n).collect()),
        2 => Some((0..n).map(|r| r / 3).collect()),
        _ => Some((0..n).map(|r| [7, 7, 3, 9, 3][r % 5]).collect()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn tree_matches_reference(
        n in 1usize..=9,
        kind in 0u8..4,
        count in count_strategy(),
        dtype in proptest::sample::select(DataType::ALL.to_vec()),
        op in proptest::sample::select(ReduceOp::ALL.to_vec()),
        in_place in any::<bool>(),
        segment_bytes in prop_oneof![Just(1usize), 8usize..200, Just(1 << 20)],
        window in 1usize..5,
    ) {
        let wrong = run_case(n, layout(n, kind), count, dtype, op, in_place,
            config(segment_bytes, window), ThreadTransport::Inproc);
        prop_assert!(wrong.iter().all(|w| *w == 0), "wrong per rank: {wrong:?}");
    }
}

/// Messages large enough for both trees, with many chunks each, on several node layouts.
#[test]
fn both_trees_with_long_pipelines_and_multi_node_layouts() {
    let layouts: Vec<Vec<usize>> = vec![
        vec![0, 0, 0, 1, 1, 1, 2, 2, 2],
        vec![0, 0, 0, 0, 1, 2, 2],
        vec![5, 3, 5, 3, 7, 7, 7, 3],
        vec![0; 9],
        (0..9).collect(),
    ];
    for nodes in layouts {
        let n = nodes.len();
        for (dtype, op) in [
            (DataType::Float32, ReduceOp::Sum),
            (DataType::Float64, ReduceOp::Avg),
            (DataType::Int32, ReduceOp::Prod),
            (DataType::BFloat16, ReduceOp::Max),
            (DataType::Uint8, ReduceOp::MulSum),
        ] {
            for in_place in [false, true] {
                let wrong = run_case(
                    n,
                    Some(nodes.clone()),
                    40_009,
                    dtype,
                    op,
                    in_place,
                    config(512, 2),
                    ThreadTransport::Inproc,
                );
                assert!(
                    wrong.iter().all(|w| *w == 0),
                    "{nodes:?} {dtype} {op} in_place={in_place}: {wrong:?}"
                );
            }
        }
    }
}

/// Every dtype and op, both placements, on real sockets with pipelines of many chunks, on an
/// odd rank count (tree 1 shifted) and on two nodes of an even count (tree 1 mirrored).
#[test]
fn every_dtype_and_op_over_tcp() {
    for (n, nodes) in [(5, None), (6, Some(vec![0, 0, 0, 1, 1, 1]))] {
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                for in_place in [false, true] {
                    let wrong = run_case(
                        n,
                        nodes.clone(),
                        10_007,
                        dtype,
                        op,
                        in_place,
                        config(1024, 3),
                        ThreadTransport::Tcp,
                    );
                    assert!(
                        wrong.iter().all(|w| *w == 0),
                        "n={n} {dtype} {op} in_place={in_place}: {wrong:?}"
                    );
                }
            }
        }
    }
}

/// Validation data makes every reduction order exact, so tree and ring must agree bit for
/// bit, not just within a tolerance (float `avg` included: both divide the exact sum once).
#[test]
fn tree_and_ring_give_identical_bits() {
    let n = 6;
    let count = 5_003;
    let comms = thread_world(n, ThreadTransport::Inproc, config(2048, 3)).unwrap();
    let mismatches = run_threads(comms, |comm| {
        let mut bad = Vec::new();
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                let seed = 99 + op as u64;
                let t = run_outputs(comm, Which::Tree, count, dtype, op, false, seed);
                let r = run_outputs(comm, Which::Ring, count, dtype, op, true, seed);
                if t.as_slice() != r.as_slice() {
                    bad.push(format!("{dtype} {op}"));
                }
            }
        }
        bad
    });
    for (rank, bad) in mismatches.iter().enumerate() {
        assert!(
            bad.is_empty(),
            "rank {rank}: tree and ring differ for {bad:?}"
        );
    }
}

/// Calibration is a collective that must leave every rank with the same model; otherwise
/// ranks would pick different algorithms for one call and wait for each other forever.
#[test]
fn calibration_gives_every_rank_the_same_choices() {
    for transport in [ThreadTransport::Inproc, ThreadTransport::Tcp] {
        let n = 8;
        let comms = thread_world(n, transport, CommConfig::default()).unwrap();
        let results = run_threads(comms, |comm| {
            let model = calibrate(comm).unwrap();
            // Auto then runs every size without deadlock and reports what it ran.
            let mut ran = Vec::new();
            let mut bytes = 8;
            while bytes <= 4 << 20 {
                let count = bytes / 4;
                let mut buf = HostBuffer::new(bytes).unwrap();
                input(
                    DataType::Float32,
                    ReduceOp::Sum,
                    buf.as_mut_slice(),
                    1,
                    comm.rank(),
                    n,
                );
                let algo = all_reduce_with(
                    comm,
                    Data::in_place(buf.as_mut_slice()),
                    count,
                    DataType::Float32,
                    ReduceOp::Sum,
                    Algo::Auto,
                    Some(&model),
                )
                .unwrap();
                let mut want = HostBuffer::new(bytes).unwrap();
                fill_expected(
                    DataType::Float32,
                    ReduceOp::Sum,
                    want.as_mut_slice(),
                    1,
                    0,
                    n,
                );
                assert_eq!(buf.as_slice(), want.as_slice(), "{bytes} B via {algo}");
                assert_ne!(algo, Algo::Auto);
                ran.push(algo);
                bytes *= 4;
            }
            (model, ran)
        });
        let (m0, ran0) = &results[0];
        assert!(m0.alpha_us > 0.0 && m0.beta_gbps > 0.0, "{m0:?}");
        for (rank, (m, ran)) in results.iter().enumerate() {
            assert_eq!(m.alpha_us.to_bits(), m0.alpha_us.to_bits(), "rank {rank}");
            assert_eq!(m.beta_gbps.to_bits(), m0.beta_gbps.to_bits(), "rank {rank}");
            assert_eq!(ran, ran0, "rank {rank} ran other algorithms");
        }
        let mut bytes = 1;
        while bytes <= 1 << 30 {
            assert_ne!(m0.choose(bytes, n), Algo::Auto);
            bytes *= 2;
        }
    }
}

/// An explicit algorithm needs no model; `auto` does, and says so.
#[test]
fn explicit_algorithms_and_auto_without_a_model() {
    let n = 3;
    let comms = thread_world(n, ThreadTransport::Inproc, config(64, 2)).unwrap();
    let out = run_threads(comms, |comm| {
        let mut buf = vec![0u8; 400];
        let mut ran = Vec::new();
        for algo in [Algo::Ring, Algo::Tree] {
            ran.push(
                all_reduce_with(
                    comm,
                    Data::in_place(&mut buf),
                    100,
                    DataType::Int32,
                    ReduceOp::Sum,
                    algo,
                    None,
                )
                .unwrap(),
            );
        }
        let err = all_reduce_with(
            comm,
            Data::in_place(&mut buf),
            100,
            DataType::Int32,
            ReduceOp::Sum,
            Algo::Auto,
            None,
        )
        .unwrap_err();
        (ran, err.to_string())
    });
    for (ran, err) in out {
        assert_eq!(ran, vec![Algo::Ring, Algo::Tree]);
        assert!(err.contains("cost model"), "{err}");
    }
    let m = CostModel::new(10.0, 1.0);
    assert!(m.predict(Algo::Tree, 8, 8) < m.predict(Algo::Ring, 8, 8));
}

/// A rank that never shows up must not hang the others: they time out and name it.
#[test]
fn missing_peer_times_out_naming_it() {
    let cfg = CommConfig {
        timeout: Duration::from_millis(500),
        ..CommConfig::default()
    };
    // n = 3: tree 0 is 0 -> 2 -> 1 and tree 1 is 1 -> 0 -> 2, so every live rank has the
    // absent rank 2 as a parent or child.
    let mut comms = thread_world(3, ThreadTransport::Tcp, cfg).unwrap();
    let absent = comms.pop().unwrap();
    let errs = run_threads(comms, |comm| {
        let mut buf = vec![0u8; 1 << 16];
        tree_all_reduce(
            comm,
            Data::in_place(&mut buf),
            1 << 14,
            DataType::Float32,
            ReduceOp::Sum,
        )
        .unwrap_err()
    });
    drop(absent);
    for e in &errs {
        assert!(
            matches!(e, CommError::Timeout { .. } | CommError::Transport { .. }),
            "{e}"
        );
        assert_eq!(e.peer(), Some(2), "{e}");
        assert!(e.to_string().contains("rank 2"), "{e}");
    }
}

/// A peer that connected and then stalls mid-call: the no-progress timeout names it.
#[test]
fn stalled_peer_times_out_naming_it() {
    let cfg = CommConfig {
        timeout: Duration::from_millis(400),
        ..config(256, 2)
    };
    let comms = thread_world(4, ThreadTransport::Tcp, cfg).unwrap();
    // Nobody drops its connections before everyone has failed: a closed connection would be
    // reported instead of the stall.
    let all_done = std::sync::Barrier::new(4);
    let errs = run_threads(comms, |comm| {
        let mut buf = vec![0u8; 64 << 10];
        // One good call connects everything; then rank 3 stops taking part.
        tree_all_reduce(
            comm,
            Data::in_place(&mut buf),
            16 << 10,
            DataType::Float32,
            ReduceOp::Sum,
        )
        .unwrap();
        let e = if comm.rank() == 3 {
            std::thread::sleep(Duration::from_millis(1500));
            None
        } else {
            Some(
                tree_all_reduce(
                    comm,
                    Data::in_place(&mut buf),
                    16 << 10,
                    DataType::Float32,
                    ReduceOp::Sum,
                )
                .unwrap_err(),
            )
        };
        all_done.wait();
        e
    });
    // n = 4, tree 0: 0 -> 2 -> {1, 3}; tree 1 (mirror): 3 -> 1 -> {2, 0}. Rank 2 waits for
    // its child 3's data and must name it; ranks 0 and 1 may be stuck behind rank 2 (they
    // wait for broadcasts from both their parents and cannot tell which one is the cause).
    for (rank, e) in errs.iter().enumerate().take(3) {
        let e = e.as_ref().unwrap();
        assert!(matches!(e, CommError::Timeout { .. }), "rank {rank}: {e}");
        assert!(e.peer().is_some(), "rank {rank}: {e}");
    }
    let e2 = errs[2].as_ref().unwrap();
    assert_eq!(e2.peer(), Some(3), "{e2}");
    assert!(
        e2.to_string().contains("waiting for data from rank 3"),
        "{e2}"
    );
}

/// Raising the abort flag stops a rank waiting inside the tree.
#[test]
fn abort_flag_stops_waiting_ranks() {
    let cfg = config(1 << 20, 4);
    let abort = cfg.abort.clone();
    let mut comms = thread_world(2, ThreadTransport::Inproc, cfg).unwrap();
    let _silent = comms.pop().unwrap();
    let mut c0 = comms.pop().unwrap();
    let t = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64];
        tree_all_reduce(
            &mut c0,
            Data::in_place(&mut buf),
            16,
            DataType::Float32,
            ReduceOp::Sum,
        )
    });
    std::thread::sleep(Duration::from_millis(100));
    abort.raise("rank 1 failed: test");
    let err = t.join().unwrap().unwrap_err();
    assert!(matches!(err, CommError::Aborted { .. }), "{err}");
    assert!(err.to_string().contains("rank 1 failed: test"), "{err}");
}
