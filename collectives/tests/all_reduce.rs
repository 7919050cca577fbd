//! Ring AllReduce against a reference reduction, across rank counts, counts, types, ops,
//! placements and pipeline shapes.

use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::verifiable::{count_wrong, fill_expected, fill_input};
use busbw_collectives::{all_reduce, CommConfig, CommError, Data, DataType, HostBuffer, ReduceOp};
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

/// Runs one AllReduce on `n` thread ranks and returns each rank's wrong-element count.
fn run_case(
    n: usize,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    cfg: CommConfig,
    transport: ThreadTransport,
) -> Vec<u64> {
    let comms = thread_world(n, transport, cfg).unwrap();
    run_threads(comms, |comm| {
        let bytes = count * dtype.size();
        let rank = comm.rank();
        let mut send = HostBuffer::new(bytes).unwrap();
        let mut recv = HostBuffer::new(bytes).unwrap();
        let mut want = HostBuffer::new(bytes).unwrap();
        let seed = 1234 + count as u64;
        fill_input(dtype, op, send.as_mut_slice(), seed, 0, rank, n);
        fill_expected(dtype, op, want.as_mut_slice(), seed, 0, n);
        if in_place {
            recv.as_mut_slice().copy_from_slice(send.as_slice());
            all_reduce(comm, Data::in_place(recv.as_mut_slice()), count, dtype, op).unwrap();
        } else {
            all_reduce(
                comm,
                Data::out_of_place(send.as_slice(), recv.as_mut_slice()),
                count,
                dtype,
                op,
            )
            .unwrap();
            // Out-of-place must leave the input alone.
            let mut again = HostBuffer::new(bytes).unwrap();
            fill_input(dtype, op, again.as_mut_slice(), seed, 0, rank, n);
            assert_eq!(send.as_slice(), again.as_slice(), "send buffer clobbered");
        }
        count_wrong(dtype, op, recv.as_slice(), want.as_slice())
    })
}

fn dtype_strategy() -> impl Strategy<Value = DataType> {
    proptest::sample::select(DataType::ALL.to_vec())
}

fn op_strategy() -> impl Strategy<Value = ReduceOp> {
    proptest::sample::select(ReduceOp::ALL.to_vec())
}

fn count_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        proptest::sample::select(vec![2usize, 3, 5, 7, 11, 13, 31, 97, 257, 1021, 4099]),
        0usize..3000,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn ring_matches_reference(
        n in 1usize..=9,
        count in count_strategy(),
        dtype in dtype_strategy(),
        op in op_strategy(),
        in_place in any::<bool>(),
        segment_bytes in prop_oneof![Just(1usize), 8usize..200, Just(1 << 20)],
        window in 1usize..5,
    ) {
        let wrong = run_case(n, count, dtype, op, in_place, config(segment_bytes, window), ThreadTransport::Inproc);
        prop_assert!(wrong.iter().all(|w| *w == 0), "wrong per rank: {wrong:?}");
    }
}

/// Every dtype and op, both placements, on real sockets with a pipeline of several segments.
#[test]
fn every_dtype_and_op_over_tcp() {
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            for in_place in [false, true] {
                let wrong = run_case(
                    3,
                    10007,
                    dtype,
                    op,
                    in_place,
                    config(4096, 3),
                    ThreadTransport::Tcp,
                );
                assert!(
                    wrong.iter().all(|w| *w == 0),
                    "{dtype} {op} in_place={in_place}: {wrong:?}"
                );
            }
        }
    }
}

/// The validator must see a wrong element: otherwise every test above proves nothing.
#[test]
fn validation_catches_a_flipped_bit() {
    let count = 1000;
    let dtype = DataType::Float32;
    let op = ReduceOp::Sum;
    let comms = thread_world(4, ThreadTransport::Inproc, config(256, 2)).unwrap();
    let wrong = run_threads(comms, |comm| {
        let bytes = count * dtype.size();
        let mut send = HostBuffer::new(bytes).unwrap();
        let mut recv = HostBuffer::new(bytes).unwrap();
        let mut want = HostBuffer::new(bytes).unwrap();
        fill_input(dtype, op, send.as_mut_slice(), 7, 0, comm.rank(), 4);
        fill_expected(dtype, op, want.as_mut_slice(), 7, 0, 4);
        if comm.rank() == 2 {
            // An exponent bit: a low mantissa bit could vanish in the rounding of the sum.
            send.as_mut_slice()[43] ^= 0x20;
        }
        all_reduce(
            comm,
            Data::out_of_place(send.as_slice(), recv.as_mut_slice()),
            count,
            dtype,
            op,
        )
        .unwrap();
        count_wrong(dtype, op, recv.as_slice(), want.as_slice())
    });
    // The corrupted element is reduced into the result that every rank receives.
    assert_eq!(wrong, vec![1, 1, 1, 1]);
}

/// A rank that never shows up must not hang the others: they time out and name it.
#[test]
fn missing_peer_times_out_naming_it() {
    let cfg = CommConfig {
        timeout: Duration::from_millis(500),
        ..CommConfig::default()
    };
    let mut comms = thread_world(3, ThreadTransport::Tcp, cfg).unwrap();
    let absent = comms.pop().unwrap(); // rank 2 never runs
    let errs = run_threads(comms, |comm| {
        let mut buf = vec![0u8; 4096];
        all_reduce(
            comm,
            Data::in_place(&mut buf),
            1024,
            DataType::Float32,
            ReduceOp::Sum,
        )
        .unwrap_err()
    });
    drop(absent);
    // Rank 0 waits for data from rank 2 (its left); rank 1 for data from rank 0, which is stuck.
    let e0 = &errs[0];
    assert!(
        matches!(e0, CommError::Timeout { .. } | CommError::Transport { .. }),
        "{e0}"
    );
    assert_eq!(e0.peer(), Some(2), "{e0}");
    for e in &errs {
        assert!(e.to_string().contains("rank"), "{e}");
    }
}

/// Raising the abort flag stops a rank that is waiting, with the reason.
#[test]
fn abort_flag_stops_waiting_ranks() {
    let cfg = config(1 << 20, 4);
    let abort = cfg.abort.clone();
    let mut comms = thread_world(2, ThreadTransport::Inproc, cfg).unwrap();
    let _silent = comms.pop().unwrap();
    let mut c0 = comms.pop().unwrap();
    let t = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64];
        all_reduce(
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
