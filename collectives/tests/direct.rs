//! The direct AllReduce (ranks mapping each other's shared buffers) against the reference
//! reduction: every type and operator, in and out of place, any rank count; and the ring in
//! its place wherever a rank's buffers cannot be mapped.

use busbw_collectives::algorithms::direct::{direct_all_reduce, tally, Fallback};
use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::verifiable::{count_wrong, fill_expected, fill_input};
use busbw_collectives::{
    all_reduce_with, Algo, CommConfig, Communicator, Data, DataType, HostBuffer, ReduceOp,
};
use busbw_transports::platform::{Platform, PLATFORM_ENV};
use proptest::prelude::*;
use std::time::Duration;

fn config(map_peers: bool) -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(20),
        map_peers,
        ..CommConfig::default()
    }
}

/// Buffers as the harness makes them: shared memory, or heap memory where `shared` is false.
fn buffer(bytes: usize, shared: bool) -> HostBuffer {
    let b = if shared {
        HostBuffer::shared(bytes)
    } else {
        HostBuffer::new(bytes)
    };
    b.expect("allocating a test buffer")
}

struct Outcome {
    out: Vec<u8>,
    wrong: u64,
    direct: bool,
}

/// One direct AllReduce on every rank (`shared(rank)`: whether that rank's buffers are
/// shared), checked against the reference; out of place, the input must be left as it was.
fn run(
    comms: Vec<Communicator>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
    shared: impl Fn(usize) -> bool + Sync,
) -> Vec<Outcome> {
    let n = comms.len();
    run_threads(comms, |comm| {
        let bytes = count * dtype.size();
        let seed = 5 + count as u64;
        let sh = shared(comm.rank());
        let mut send = buffer(bytes, sh);
        let mut recv = buffer(bytes, sh);
        // Made by the platform this process runs (a memfd, or a named POSIX object under
        // BUSBW_PLATFORM=portable), which is what a direct call then maps.
        let made_by = (sh && bytes > 0).then(Platform::active);
        assert_eq!((send.sharing(), recv.sharing()), (made_by, made_by));
        let mut want = HostBuffer::new(bytes).unwrap();
        fill_input(dtype, op, send.as_mut_slice(), seed, 0, comm.rank(), n);
        fill_expected(dtype, op, want.as_mut_slice(), seed, 0, n);
        let direct = if in_place {
            recv.as_mut_slice().copy_from_slice(send.as_slice());
            direct_all_reduce(comm, Data::in_place(recv.as_mut_slice()), count, dtype, op).unwrap()
        } else {
            let d = direct_all_reduce(
                comm,
                Data::out_of_place(send.as_slice(), recv.as_mut_slice()),
                count,
                dtype,
                op,
            )
            .unwrap();
            let mut again = HostBuffer::new(bytes).unwrap();
            fill_input(dtype, op, again.as_mut_slice(), seed, 0, comm.rank(), n);
            assert_eq!(send.as_slice(), again.as_slice(), "send buffer clobbered");
            d
        };
        Outcome {
            wrong: count_wrong(dtype, op, recv.as_slice(), want.as_slice()),
            out: recv.as_slice().to_vec(),
            direct,
        }
    })
}

fn count_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        proptest::sample::select(vec![2usize, 3, 15, 16, 17, 97, 1021]),
        0usize..5000,
        // Several chunks and the streaming-store path (out of place, 256 KiB and more).
        proptest::sample::select(vec![70_000usize, 140_001]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    #[test]
    fn direct_matches_reference(
        n in 2usize..=5,
        count in count_strategy(),
        dtype in proptest::sample::select(DataType::ALL.to_vec()),
        op in proptest::sample::select(ReduceOp::ALL.to_vec()),
        in_place in any::<bool>(),
    ) {
        let comms = thread_world(n, ThreadTransport::Inproc, config(true)).unwrap();
        let out = run(comms, count, dtype, op, in_place, |_| true);
        let wrong: Vec<u64> = out.iter().map(|o| o.wrong).collect();
        prop_assert!(wrong.iter().all(|w| *w == 0), "wrong per rank: {wrong:?}");
        prop_assert!(out.iter().all(|o| o.out == out[0].out), "ranks disagree");
        // Empty calls have nothing to map and run the ring's no-op.
        prop_assert!(out.iter().all(|o| o.direct == (count > 0)), "did not run directly");
    }
}

/// Over real shared-memory connections, every type and operator, bit for bit what the ring
/// gives.
#[test]
fn over_shm_every_dtype_and_op_matches_the_ring() {
    for n in [2, 3] {
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                let in_place = op as usize % 2 == 1;
                let comms = thread_world(n, ThreadTransport::Shm, config(true)).unwrap();
                let direct = run(comms, 4099, dtype, op, in_place, |_| true);
                let comms = thread_world(n, ThreadTransport::Shm, config(false)).unwrap();
                let ring = run(comms, 4099, dtype, op, in_place, |_| true);
                for (r, (d, g)) in direct.iter().zip(&ring).enumerate() {
                    assert!(d.direct && !g.direct, "n={n} {dtype} {op}: rank {r}");
                    assert_eq!(d.wrong, 0, "n={n} {dtype} {op}: rank {r} wrong");
                    assert!(d.out == g.out, "n={n} {dtype} {op}: rank {r} differs");
                }
            }
        }
    }
}

/// One rank's buffers on the heap: every rank runs the ring instead, and says why.
#[test]
fn heap_buffers_on_one_rank_run_the_ring_everywhere() {
    let comms = thread_world(3, ThreadTransport::Inproc, config(true)).unwrap();
    let n = comms.len();
    let out = run_threads(comms, |comm| {
        // Beyond the mailbox (small calls copy through it, whatever the buffers).
        let (count, dtype, op) = (10_000, DataType::Float32, ReduceOp::Sum);
        let mut buf = buffer(count * 4, comm.rank() != 1);
        let mut want = HostBuffer::new(count * 4).unwrap();
        fill_input(dtype, op, buf.as_mut_slice(), 9, 0, comm.rank(), n);
        fill_expected(dtype, op, want.as_mut_slice(), 9, 0, n);
        let d = direct_all_reduce(comm, Data::in_place(buf.as_mut_slice()), count, dtype, op);
        let wrong = count_wrong(dtype, op, buf.as_slice(), want.as_slice());
        (d.unwrap(), wrong, tally(comm))
    });
    for (r, (direct, wrong, t)) in out.iter().enumerate() {
        assert!(!direct, "rank {r} ran directly");
        assert_eq!(*wrong, 0, "rank {r}");
        assert_eq!(*t, (0, 1, Some(Fallback::NotShared)), "rank {r}");
    }
}

/// Not allowed by the configuration (a transport measured by name): the ring, without any
/// exchange, and `Algo::Direct` reports the ring as what ran.
#[test]
fn disabled_by_configuration_runs_the_ring() {
    let comms = thread_world(2, ThreadTransport::Inproc, config(false)).unwrap();
    let out = run_threads(comms, |comm| {
        let mut buf = buffer(64, true);
        let ran = all_reduce_with(
            comm,
            Data::in_place(buf.as_mut_slice()),
            16,
            DataType::Float32,
            ReduceOp::Sum,
            Algo::Direct,
            None,
        )
        .unwrap();
        (ran, tally(comm))
    });
    for (ran, t) in out {
        assert_eq!(ran, Algo::Ring);
        assert_eq!(t, (0, 1, Some(Fallback::NotLocal)));
    }
}

/// A sweep's worth of buffers, more than a communicator keeps mapped per peer: older
/// mappings are dropped and remapped when used again, and every call stays right.
#[test]
fn many_buffers_and_repeated_calls_stay_right() {
    let comms = thread_world(3, ThreadTransport::Inproc, config(true)).unwrap();
    let n = comms.len();
    let out = run_threads(comms, |comm| {
        let (dtype, op) = (DataType::Int32, ReduceOp::Sum);
        let mut bufs: Vec<HostBuffer> = (0..7).map(|i| buffer(4096 * (i + 1), true)).collect();
        let mut bad = 0;
        for round in 0..3 {
            for (i, b) in bufs.iter_mut().enumerate() {
                let count = 1024 * (i + 1) - round;
                let seed = (round * 10 + i) as u64;
                let mut want = HostBuffer::new(count * 4).unwrap();
                fill_input(
                    dtype,
                    op,
                    &mut b.as_mut_slice()[..count * 4],
                    seed,
                    0,
                    comm.rank(),
                    n,
                );
                fill_expected(dtype, op, want.as_mut_slice(), seed, 0, n);
                let slice = &mut b.as_mut_slice()[..count * 4];
                assert!(direct_all_reduce(comm, Data::in_place(slice), count, dtype, op).unwrap());
                bad += count_wrong(dtype, op, &b.as_slice()[..count * 4], want.as_slice());
            }
        }
        bad
    });
    assert_eq!(out, vec![0; 3]);
}

/// Out of place from 256 KiB a call streams its outputs past the cache, except where it
/// writes the output the last call wrote and that still fits the core's L2: calls into one
/// output, then into two in turn, with new inputs each time, are all right.
#[test]
fn repeated_out_of_place_calls_into_the_same_output_stay_right() {
    let comms = thread_world(2, ThreadTransport::Inproc, config(true)).unwrap();
    let n = comms.len();
    let out = run_threads(comms, |comm| {
        let (dtype, op) = (DataType::Float32, ReduceOp::Sum);
        let count = 70_000;
        let bytes = count * 4;
        let rank = comm.rank();
        let mut outs = [buffer(bytes, true), buffer(bytes, true)];
        let mut want = HostBuffer::new(bytes).unwrap();
        let mut bad = 0;
        for call in 0..6u64 {
            let mut input = buffer(bytes, true);
            fill_input(dtype, op, input.as_mut_slice(), call, 0, rank, n);
            fill_expected(dtype, op, want.as_mut_slice(), call, 0, n);
            // Three calls into the first output, then the two outputs in turn.
            let o = &mut outs[if call < 3 { 0 } else { (call % 2) as usize }];
            let data = Data::out_of_place(input.as_slice(), o.as_mut_slice());
            assert!(direct_all_reduce(comm, data, count, dtype, op).unwrap());
            bad += count_wrong(dtype, op, o.as_slice(), want.as_slice());
        }
        bad
    });
    assert_eq!(out, vec![0; 2]);
}

/// Small calls of changing sizes through the same mailboxes: a message shares the sequence
/// word's line up to 56 bytes and starts on the next line beyond, so calls alternate between
/// the two layouts in the same slots, up to the largest message a slot takes.
#[test]
fn mailbox_calls_across_its_layouts_stay_right() {
    const SIZES: [usize; 9] = [56, 57, 1, 64, 8192, 55, 512, 8191, 63];
    for n in [2, 3] {
        let comms = thread_world(n, ThreadTransport::Inproc, config(true)).unwrap();
        let out = run_threads(comms, |comm| {
            let (dtype, op) = (DataType::Uint8, ReduceOp::Sum);
            let mut send = buffer(8192, true);
            let mut recv = buffer(8192, true);
            let (mut wrong, mut ring) = (0, 0);
            for round in 0..3 {
                for (i, &count) in SIZES.iter().enumerate() {
                    let seed = (100 * round + i) as u64;
                    let mut want = HostBuffer::new(count).unwrap();
                    let src = &mut send.as_mut_slice()[..count];
                    fill_input(dtype, op, src, seed, 0, comm.rank(), n);
                    fill_expected(dtype, op, want.as_mut_slice(), seed, 0, n);
                    let dst = &mut recv.as_mut_slice()[..count];
                    let data = if i % 2 == 0 {
                        dst.copy_from_slice(&send.as_slice()[..count]);
                        Data::in_place(dst)
                    } else {
                        Data::out_of_place(&send.as_slice()[..count], dst)
                    };
                    if !direct_all_reduce(comm, data, count, dtype, op).unwrap() {
                        ring += 1;
                    }
                    wrong += count_wrong(dtype, op, &recv.as_slice()[..count], want.as_slice());
                }
            }
            (wrong, ring)
        });
        for (r, (wrong, ring)) in out.iter().enumerate() {
            assert_eq!(
                (*wrong, *ring),
                (0, 0),
                "n={n} rank {r}: (wrong, ring calls)"
            );
        }
    }
}

/// Ranks that disagree about the count get an error naming the peer, not a hang, on both
/// paths (through the mailboxes and through mapped buffers).
#[test]
fn disagreeing_counts_fail_with_the_peer_named() {
    // (14 and 16 floats: 56 and 64 bytes, the two layouts of a mailbox's slot.)
    for (a, b) in [(100, 200), (5000, 6000), (14, 16)] {
        let comms = thread_world(2, ThreadTransport::Inproc, config(true)).unwrap();
        let out = run_threads(comms, |comm| {
            let count = if comm.rank() == 0 { a } else { b };
            let mut buf = buffer(b * 4, true);
            direct_all_reduce(
                comm,
                Data::in_place(&mut buf.as_mut_slice()[..count * 4]),
                count,
                DataType::Float32,
                ReduceOp::Sum,
            )
            .map_err(|e| e.to_string())
        });
        for (r, res) in out.iter().enumerate() {
            let e = res.as_ref().expect_err("a count mismatch must fail");
            let peer = 1 - r;
            assert!(e.contains(&format!("rank {peer} sent")), "rank {r}: {e}");
        }
    }
}

/// Every test of this binary once more under the portable platform, in a child process (the
/// switch is read once per process): buffers are named POSIX objects mapped by name, the
/// shared-memory transport streams through its ring, and `run` asserts which buffers the
/// direct calls mapped.
#[test]
fn direct_suite_under_the_portable_platform() {
    if Platform::active() == Platform::Portable {
        return; // this is that run (or the only platform there is)
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--skip", "direct_suite_under_the_portable_platform"])
        .env(PLATFORM_ENV, "portable")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("test result: ok"),
        "under {PLATFORM_ENV}=portable:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
