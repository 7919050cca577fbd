//! Recursive-doubling AllReduce against the reference reduction and against the ring, for
//! power-of-two and folded rank counts, over every transport.

use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::verifiable::{count_wrong, fill_expected, fill_input};
use busbw_collectives::{
    all_reduce, all_reduce_with, doubling_all_reduce, Algo, CommConfig, CommError, CostModel, Data,
    DataType, HostBuffer, ReduceOp,
};
use proptest::prelude::*;
use std::time::Duration;

fn config() -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(20),
        ..CommConfig::default()
    }
}

/// Runs one AllReduce with `f` on every rank of `comms` and returns each rank's output and
/// wrong-element count against the reference.
#[allow(clippy::type_complexity)]
fn run(
    comms: Vec<busbw_collectives::Communicator>,
    f: fn(
        &mut busbw_collectives::Communicator,
        Data<'_>,
        usize,
        DataType,
        ReduceOp,
    ) -> Result<(), CommError>,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    in_place: bool,
) -> Vec<(Vec<u8>, u64)> {
    let n = comms.len();
    run_threads(comms, |comm| {
        let bytes = count * dtype.size();
        let seed = 77 + count as u64;
        let mut send = HostBuffer::new(bytes).unwrap();
        let mut recv = HostBuffer::new(bytes).unwrap();
        let mut want = HostBuffer::new(bytes).unwrap();
        fill_input(dtype, op, send.as_mut_slice(), seed, 0, comm.rank(), n);
        fill_expected(dtype, op, want.as_mut_slice(), seed, 0, n);
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
            fill_input(dtype, op, again.as_mut_slice(), seed, 0, comm.rank(), n);
            assert_eq!(send.as_slice(), again.as_slice(), "send buffer clobbered");
        }
        let wrong = count_wrong(dtype, op, recv.as_slice(), want.as_slice());
        (recv.as_slice().to_vec(), wrong)
    })
}

fn count_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        proptest::sample::select(vec![2usize, 3, 5, 7, 13, 97, 1021]),
        0usize..3000,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    #[test]
    fn rd_matches_reference(
        n in 1usize..=9,
        count in count_strategy(),
        dtype in proptest::sample::select(DataType::ALL.to_vec()),
        op in proptest::sample::select(ReduceOp::ALL.to_vec()),
        in_place in any::<bool>(),
    ) {
        let comms = thread_world(n, ThreadTransport::Inproc, config()).unwrap();
        let out = run(comms, doubling_all_reduce, count, dtype, op, in_place);
        let wrong: Vec<u64> = out.iter().map(|o| o.1).collect();
        prop_assert!(wrong.iter().all(|w| *w == 0), "wrong per rank: {wrong:?}");
        // Every rank holds the same bits (pairs reduce in one order).
        prop_assert!(out.iter().all(|o| o.0 == out[0].0), "ranks disagree");
    }
}

/// Every dtype and op over real sockets and shared memory, for a power-of-two and a folded
/// rank count, and bit-identical to the ring.
#[test]
fn every_dtype_and_op_over_tcp_and_shm_matches_the_ring() {
    for (n, transport) in [
        (4, ThreadTransport::Tcp),
        (5, ThreadTransport::Tcp),
        (2, ThreadTransport::Shm),
        (6, ThreadTransport::Shm),
    ] {
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                let in_place = (op as usize).is_multiple_of(2);
                let comms = thread_world(n, transport, config()).unwrap();
                let rd = run(comms, doubling_all_reduce, 1003, dtype, op, in_place);
                let comms = thread_world(n, ThreadTransport::Inproc, config()).unwrap();
                let ring = run(comms, all_reduce, 1003, dtype, op, in_place);
                for (r, (a, b)) in rd.iter().zip(&ring).enumerate() {
                    assert_eq!(a.1, 0, "{transport:?} n={n} {dtype} {op}: rank {r} wrong");
                    assert!(
                        a.0 == b.0,
                        "{transport:?} n={n} {dtype} {op}: rank {r} differs from the ring"
                    );
                }
            }
        }
    }
}

/// The cost model sends short messages to recursive doubling and long ones to the ring.
#[test]
fn auto_picks_rd_for_short_messages() {
    let m = CostModel::new(20.0, 2.0);
    assert_eq!(m.choose(8, 2), Algo::Doubling);
    assert_eq!(m.choose(8, 8), Algo::Doubling);
    assert_eq!(m.choose(256 << 20, 8), Algo::Ring);
    let comms = thread_world(3, ThreadTransport::Inproc, config()).unwrap();
    let ran = run_threads(comms, |comm| {
        let mut buf = vec![0u8; 64];
        all_reduce_with(
            comm,
            Data::in_place(&mut buf),
            16,
            DataType::Float32,
            ReduceOp::Sum,
            Algo::Auto,
            Some(&m),
        )
        .unwrap()
    });
    assert!(ran.iter().all(|a| *a == Algo::Doubling), "{ran:?}");
}

/// A partner that never shows up is named in the timeout, not waited for forever.
#[test]
fn missing_partner_times_out_naming_it() {
    let cfg = CommConfig {
        timeout: Duration::from_millis(500),
        ..CommConfig::default()
    };
    let mut comms = thread_world(4, ThreadTransport::Tcp, cfg).unwrap();
    let _absent = comms.pop().unwrap(); // rank 3 never runs
    let errs = run_threads(comms, |comm| {
        let mut buf = vec![0u8; 64];
        doubling_all_reduce(
            comm,
            Data::in_place(&mut buf),
            16,
            DataType::Float32,
            ReduceOp::Sum,
        )
        .unwrap_err()
    });
    // Rank 2 pairs with 3 in the first step; rank 1 in the second.
    for r in [1, 2] {
        let e = errs[r].to_string();
        assert!(e.contains("rank 3"), "rank {r}: {e}");
    }
}

/// What a transport was asked to open, per channel: `true` for a two-way connection.
type Opened = std::sync::Arc<std::sync::Mutex<Vec<(u32, u32, bool)>>>;

/// TCP, recording each connection this rank opens as (rank, channel, two-way).
struct Recording {
    tcp: busbw_transports::tcp::TcpTransport,
    opened: Opened,
}

impl busbw_transports::Transport for Recording {
    fn properties(&self) -> busbw_transports::Properties {
        self.tcp.properties()
    }
    fn listen(
        &self,
    ) -> busbw_transports::Result<(
        busbw_transports::Handle,
        Box<dyn busbw_transports::Listener>,
    )> {
        self.tcp.listen()
    }
    fn identity(&self) -> busbw_transports::Identity {
        self.tcp.identity()
    }
    fn connect(
        &self,
        h: &busbw_transports::Handle,
        channel: u32,
        t: Duration,
    ) -> busbw_transports::Result<Box<dyn busbw_transports::SendComm>> {
        let rank = self.tcp.identity().rank;
        self.opened.lock().unwrap().push((rank, channel, false));
        self.tcp.connect(h, channel, t)
    }
    fn duplex(&self, h: &busbw_transports::Handle) -> bool {
        self.tcp.duplex(h)
    }
    #[allow(clippy::type_complexity)]
    fn connect_duplex(
        &self,
        h: &busbw_transports::Handle,
        channel: u32,
        t: Duration,
    ) -> busbw_transports::Result<(
        Box<dyn busbw_transports::SendComm>,
        Box<dyn busbw_transports::RecvComm>,
    )> {
        let rank = self.tcp.identity().rank;
        self.opened.lock().unwrap().push((rank, channel, true));
        self.tcp.connect_duplex(h, channel, t)
    }
}

/// Small calls exchange over one connection per pair (the lower rank opens it, the higher
/// one only accepts), on their own channel; larger ones keep the ring's one-way connections.
/// Folded rank counts included, and the results right either way.
#[test]
fn small_calls_share_one_tcp_connection_per_pair() {
    use busbw_collectives::{Communicator, SMALL_CHANNEL};
    use busbw_transports::tcp::{TcpConfig, TcpTransport};
    use busbw_transports::{Identity, Transport};
    for n in [2usize, 3, 4] {
        let opened: Opened = Default::default();
        let job = std::process::id() as u64 ^ 0xd0b1e;
        let parts: Vec<_> = (0..n)
            .map(|r| {
                let t = Recording {
                    tcp: TcpTransport::new(Identity::new(job, r as u32), TcpConfig::default()),
                    opened: opened.clone(),
                };
                let (h, l) = t.listen().unwrap();
                (t, l, h)
            })
            .collect();
        let handles: Vec<_> = parts.iter().map(|p| p.2.clone()).collect();
        let comms: Vec<Communicator> = parts
            .into_iter()
            .map(|(t, l, _)| Communicator::new(Box::new(t), l, handles.clone(), config()).unwrap())
            .collect();
        // 4 KiB, then 64 KiB (above the small channel's limit), on the same communicators.
        let results = run_threads(comms, |comm| {
            let mut out = Vec::new();
            for count in [1024usize, 16384] {
                let mut buf: Vec<f32> = vec![comm.rank() as f32 + 1.0; count];
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, count * 4)
                };
                doubling_all_reduce(
                    comm,
                    Data::in_place(bytes),
                    count,
                    DataType::Float32,
                    ReduceOp::Sum,
                )
                .unwrap();
                out.push(buf);
            }
            out
        });
        let want = (n * (n + 1) / 2) as f32;
        for (r, bufs) in results.iter().enumerate() {
            for b in bufs {
                assert!(b.iter().all(|&x| x == want), "n={n}: rank {r} got {}", b[0]);
            }
        }
        let opened = opened.lock().unwrap().clone();
        let small: Vec<_> = opened.iter().filter(|o| o.1 == SMALL_CHANNEL).collect();
        assert!(
            !small.is_empty(),
            "n={n}: no small-channel connection: {opened:?}"
        );
        assert!(
            small.iter().all(|o| o.2),
            "n={n}: one-way on the small channel: {opened:?}"
        );
        assert!(
            opened.iter().all(|o| o.1 == SMALL_CHANNEL || !o.2),
            "n={n}: two-way beyond the small channel: {opened:?}"
        );
        // One connection per pair: every rank opened at most as many as it has higher
        // partners, and rank n-1 (nobody above it) none at all.
        assert!(
            small.iter().all(|o| o.0 != n as u32 - 1),
            "n={n}: the highest rank opened a two-way connection: {opened:?}"
        );
        assert!(
            opened.iter().any(|o| o.1 == 0 && !o.2),
            "n={n}: 64 KiB ran on one-way connections: {opened:?}"
        );
    }
}
