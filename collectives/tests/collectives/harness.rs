//! Runs a [`Case`] on thread ranks, on host memory or on a simulated device, and counts what
//! differs from the reference; and the random cases the properties draw.

use crate::reference::{call, expected_of, input_of, layout, Bytes, Case, Kind};
use busbw_collectives::algorithms::peer;
use busbw_collectives::offload::sim::{Counts, SimDevice};
use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::verifiable::count_wrong;
use busbw_collectives::{CommConfig, Communicator, Data, DataType, MemorySpace, Mirror, ReduceOp};
use proptest::prelude::*;
use std::time::Duration;

/// Runs the case on thread ranks; returns wrong elements per rank.
pub(crate) fn run_case(c: Case, seg: usize, window: usize) -> Vec<u64> {
    let res = run_case_on(c, seg, window, ThreadTransport::Inproc, None);
    res.into_iter().map(|(w, _)| w).collect()
}

/// A simulated device for a case: how late its operations may complete, whether it
/// offers its memory to transports (GPUDirect's direct path, taken where the transport
/// registers device memory, [`ThreadTransport::InprocDevice`]), and whether it offers peer
/// memory to the other ranks (CUDA IPC): `Some(k)` puts rank r's device in island r / k,
/// whose devices reach each other and no others.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dev {
    pub(crate) jitter: Duration,
    pub(crate) direct: bool,
    pub(crate) ipc: Option<usize>,
}

pub(crate) fn dev(us: u64) -> Option<Dev> {
    Some(Dev {
        jitter: Duration::from_micros(us),
        direct: false,
        ipc: None,
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
    if let Some(k) = device.ipc {
        sim = sim.ipc((r / k) as u64);
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

pub(crate) fn run_case_on(
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
        // Local ranks may map each other's memory where the case asks for peer memory.
        map_peers: device.is_some_and(|d| d.ipc.is_some()),
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

/// `n` thread ranks on `hosts` simulated hosts of `n / hosts` ranks each, numbered host by
/// host, each rank's communicator given its node and rail communicators.
pub(crate) fn world_across_hosts(n: usize, hosts: usize) -> Vec<Communicator> {
    let per = n / hosts;
    assert_eq!(per * hosts, n, "{n} ranks on {hosts} hosts");
    let cfg = CommConfig {
        timeout: Duration::from_secs(20),
        map_peers: true,
        ..CommConfig::default()
    };
    let mut nodes: Vec<Vec<Communicator>> = (0..hosts)
        .map(|_| thread_world(per, ThreadTransport::Inproc, cfg.clone()).unwrap())
        .collect();
    let mut rails: Vec<Vec<Communicator>> = (0..per)
        .map(|_| {
            let mut rail = thread_world(hosts, ThreadTransport::Inproc, cfg.clone()).unwrap();
            for r in &mut rail {
                r.set_nodes((0..hosts).collect()).unwrap();
            }
            rail
        })
        .collect();
    let mut world = thread_world(n, ThreadTransport::Inproc, cfg).unwrap();
    // Taken from the back, so that each host's and each rail's communicators pop in order.
    for (g, comm) in world.iter_mut().enumerate().rev() {
        comm.set_nodes((0..n).map(|r| r / per).collect()).unwrap();
        let node = nodes[g / per].pop().unwrap();
        let rail = rails[g % per].pop().unwrap();
        let h = peer::Hierarchy::new(comm, node, rail).unwrap();
        peer::set_hierarchy(comm, h);
    }
    world
}

/// The case on `hosts` simulated hosts of `c.n / hosts` ranks each, numbered host by host:
/// each host's devices reach each other (one IPC island per host) and no other host's, and
/// every rank's communicator has its node and rail communicators. Returns per rank the wrong
/// elements, the device's counts and how many calls ran across hosts through them.
pub(crate) fn run_case_across_hosts(
    c: Case,
    hosts: usize,
    jitter: Duration,
) -> Vec<(u64, Counts, u64)> {
    let per = c.n / hosts;
    let world = world_across_hosts(c.n, hosts);
    let inputs: Vec<Bytes> = (0..c.n).map(|r| input_of(&c, r)).collect();
    let device = Dev {
        jitter,
        direct: false,
        ipc: Some(per),
    };
    run_threads(world, |comm| {
        let r = comm.rank();
        let expected = expected_of(&c, r, &inputs);
        let (got, counts) = run_on_device(comm, &c, &inputs[r], device);
        let wrong = count_wrong(c.dtype, c.op, &got[..expected.len()], &expected);
        (wrong, counts, peer::across_hosts(comm))
    })
}

pub(crate) fn case_strategy(kinds: &[Kind]) -> impl Strategy<Value = (Case, usize, usize)> {
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
