//! GPU to GPU between the ranks of one host (CUDA IPC, peer access) against the simulated
//! device's peer memory: every collective, type and op moved and reduced on device memory
//! alone, the mappings' lifetimes, and the staging that stays where a device cannot reach
//! its peers.

use crate::harness::{run_case_on, Dev};
use crate::reference::{device_kinds, Case, Kind};
use busbw_collectives::algorithms::peer;
use busbw_collectives::offload::sim::{Counts, SimDevice};
use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
use busbw_collectives::{
    all_reduce, alltoallv, barrier, gather, CommConfig, Communicator, Data, DataType, MemorySpace,
    Mirror, Offload, ReduceOp,
};
use std::time::Duration;

fn ipc(island: usize) -> Option<Dev> {
    Some(Dev {
        jitter: Duration::from_micros(5),
        direct: false,
        ipc: Some(island),
    })
}

fn sum(res: &[(u64, Counts)]) -> Counts {
    res.iter().fold(Counts::default(), |a, (_, k)| Counts {
        downloads: a.downloads + k.downloads,
        uploads: a.uploads + k.uploads,
        reduces: a.reduces + k.reduces,
        copies: a.copies + k.copies,
        premultiplies: a.premultiplies + k.premultiplies,
        refusals: a.refusals + k.refusals,
        peer_opens: a.peer_opens + k.peer_opens,
        device_copies: a.device_copies + k.device_copies,
    })
}

/// Every collective (the three AllReduce algorithms too), type and op on 2, 3 and 4 ranks,
/// in and out of place, bit for bit against the reference: nothing crosses a host twin,
/// every rank opens its peers' buffers, reductions run on the device.
#[test]
fn every_collective_type_and_op_runs_gpu_to_gpu() {
    for kind in device_kinds() {
        for n in [2usize, 3, 4] {
            if kind == Kind::HyperCube && !n.is_power_of_two() {
                continue;
            }
            for dtype in DataType::ALL {
                for &op in kind.ops() {
                    for in_place in [false, true] {
                        let c = Case {
                            kind,
                            n,
                            count: 37,
                            dtype,
                            op,
                            in_place,
                            root: n - 1,
                        };
                        let res = run_case_on(c, 1 << 20, 2, ThreadTransport::Inproc, ipc(n));
                        let wrong: Vec<u64> = res.iter().map(|r| r.0).collect();
                        assert!(
                            wrong.iter().all(|&w| w == 0),
                            "{c:?}: wrong per rank {wrong:?}"
                        );
                        let k = sum(&res);
                        assert_eq!(k.downloads + k.uploads, 0, "{c:?}: staged: {k:?}");
                        assert!(
                            res.iter().all(|r| r.1.peer_opens > 0),
                            "{c:?}: a rank opened no peer buffer: {res:?}"
                        );
                        if kind.reduces() {
                            assert!(k.reduces > 0, "{c:?}: nothing reduced on the device");
                        }
                        if op == ReduceOp::MulSum {
                            assert_eq!(k.premultiplies, n as u64, "{c:?}: one per rank");
                        }
                    }
                }
            }
        }
    }
}

/// A rank's buffers on a simulated device in IPC mode, the device, and the buffers' device
/// addresses; the twins start zeroed and are never read.
struct Rank {
    sim: SimDevice,
    send: Vec<u8>,
    recv: Vec<u8>,
    dev: [u64; 2],
}

fn rank_on(sim: SimDevice, bytes: usize, init: &[u8]) -> Rank {
    let mut r = Rank {
        sim,
        send: vec![0u8; bytes],
        recv: vec![0u8; bytes],
        dev: [0; 2],
    };
    for i in 0..2 {
        r.dev[i] = r.sim.alloc(bytes).unwrap();
        r.sim.write(r.dev[i], init).unwrap();
    }
    let mirrors = [(&mut r.send, r.dev[0]), (&mut r.recv, r.dev[1])].map(|(t, d)| Mirror {
        host: t.as_mut_ptr(),
        device: d,
        len: bytes,
    });
    r.sim.set_mirrors(mirrors.to_vec()).unwrap();
    r
}

/// An f32 sum of `count` elements, each rank contributing rank+1.
fn sum_on(comm: &mut Communicator, r: &mut Rank, count: usize) -> Vec<f32> {
    let d = Data::out_of_place(&r.send, &mut r.recv).on(MemorySpace::Device(&mut r.sim));
    all_reduce(comm, d, count, DataType::Float32, ReduceOp::Sum).unwrap();
    let got = r.sim.read(r.dev[1], count * 4).unwrap();
    got.chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn ones(count: usize, v: f32) -> Vec<u8> {
    (0..count).flat_map(|_| v.to_le_bytes()).collect()
}

fn peer_world(n: usize, map_peers: bool) -> Vec<Communicator> {
    let cfg = CommConfig {
        timeout: Duration::from_secs(20),
        map_peers,
        ..CommConfig::default()
    };
    thread_world(n, ThreadTransport::Inproc, cfg).unwrap()
}

/// The path really runs: peers' buffers are opened once and kept open between calls on the
/// same buffers, the result is made by device reductions and copies, no twin is touched,
/// and the communicator counts the calls as GPU to GPU; the buffers can be freed once every
/// rank released its mappings.
#[test]
fn peers_buffers_are_opened_once_and_nothing_is_staged() {
    let (n, count) = (3, 1000);
    let res = run_threads(peer_world(n, true), |comm| {
        let me = comm.rank();
        let mut r = rank_on(
            SimDevice::new(Duration::from_micros(5), me as u64).ipc(7),
            count * 4,
            &ones(count, me as f32 + 1.0),
        );
        let first = sum_on(comm, &mut r, count);
        let second = sum_on(comm, &mut r, count);
        let (ran, staged, why) = peer::tally(comm);
        let tally = (ran, staged, why.map(str::to_string));
        // Peers still hold our buffers: freeing waits for every rank's release.
        assert!(r.sim.free(r.dev[0]).is_err());
        barrier(comm).unwrap();
        peer::release(comm, &mut r.sim).unwrap();
        r.sim.free(r.dev[0]).unwrap();
        (
            first,
            second,
            r.sim.counts(),
            tally,
            r.send.iter().chain(&r.recv).all(|&b| b == 0),
        )
    });
    for (first, second, k, tally, twins_untouched) in res {
        assert!(first.iter().chain(&second).all(|&x| x == 6.0), "{first:?}");
        assert_eq!(k.downloads + k.uploads + k.copies, 0, "{k:?}");
        assert_eq!(
            k.peer_opens,
            2 * (n as u64 - 1),
            "send and receive of each peer, once: {k:?}"
        );
        assert!(k.reduces > 0 && k.device_copies > 0, "{k:?}");
        assert_eq!(tally, (2, 0, None));
        assert!(twins_untouched, "a host twin was written");
    }
}

/// A handle is opened through the owner's allocation: once the owner has freed it, opening
/// fails with an error naming the handle; and an owner may not free an allocation a peer
/// still has open (CUDA leaves both undefined), only after the peer closed its mapping.
#[test]
fn a_handle_opened_after_its_owner_freed_the_buffer_fails_loudly() {
    let (to_peer, from_owner) = std::sync::mpsc::channel();
    let (to_owner, from_peer) = std::sync::mpsc::channel::<()>();
    let owner = std::thread::spawn(move || {
        let mut sim = SimDevice::new(Duration::ZERO, 1).ipc(0);
        let kept = sim.alloc(64).unwrap();
        sim.write(kept, &[9u8; 64]).unwrap();
        let freed = sim.alloc(64).unwrap();
        let handles = (
            sim.export_peer(kept, 64).unwrap(),
            sim.export_peer(freed + 8, 16).unwrap(),
        );
        to_peer.send(handles).unwrap();
        from_peer.recv().unwrap(); // the peer has opened `kept`
        sim.free(freed).unwrap();
        let e = sim.free(kept).unwrap_err().to_string();
        assert!(e.contains("still hold it") && e.contains("sim#"), "{e}");
        to_peer.send(handles).unwrap();
        from_peer.recv().unwrap(); // the peer has closed its mappings
        sim.free(kept).unwrap();
        assert!(sim.free(kept).is_err(), "freed twice");
        to_peer.send(handles).unwrap();
    });
    let mut peer = SimDevice::new(Duration::ZERO, 2).ipc(0);
    let (kept, _) = from_owner.recv().unwrap();
    let at = peer.open_peer(&kept).unwrap();
    let local = peer.alloc(64).unwrap();
    peer.copy_on_device(local, at, 64).unwrap();
    assert_eq!(peer.read(local, 64).unwrap(), vec![9u8; 64]);
    to_owner.send(()).unwrap();
    let (_, freed) = from_owner.recv().unwrap();
    let e = peer.open_peer(&freed).unwrap_err().to_string();
    assert!(
        e.contains("IPC handle sim#") && e.contains("+8 bytes") && e.contains("freed"),
        "{e}"
    );
    peer.close_peers();
    // Once closed, the address is no longer the peer's to touch.
    let e = peer.copy_on_device(local, at, 64).unwrap_err().to_string();
    assert!(e.contains("nor a peer's opened here"), "{e}");
    to_owner.send(()).unwrap();
    let (kept, _) = from_owner.recv().unwrap();
    owner.join().unwrap();
    let e = peer.open_peer(&kept).unwrap_err().to_string();
    assert!(e.contains("freed"), "{e}");
}

/// Where some device cannot reach another, or a device offers no peer memory, or the job
/// does not let ranks map each other's memory, every rank stages through the twins as
/// before, the result is the same, and the communicator says why in one line.
#[test]
fn without_peer_access_the_call_stages_and_says_why() {
    let count = 100;
    // (island size, whether rank 1 offers peer memory, map_peers, expected reason)
    let cases = [
        (1, true, true, "rank 0's device cannot access rank 1's"),
        (2, false, true, "rank 1's device offers no peer memory"),
        (
            2,
            true,
            false,
            "does not let local ranks map each other's memory",
        ),
    ];
    for (island, offers, map_peers, reason) in cases {
        let res = run_threads(peer_world(2, map_peers), |comm| {
            let me = comm.rank();
            let mut sim = SimDevice::new(Duration::from_micros(5), me as u64);
            if offers || me == 0 {
                sim = sim.ipc((me / island) as u64);
            }
            let mut r = rank_on(sim, count * 4, &ones(count, me as f32 + 1.0));
            let got = sum_on(comm, &mut r, count);
            let why = peer::why(comm).map(str::to_string);
            (got, r.sim.counts(), why, peer::tally(comm).1)
        });
        for (got, k, why, staged) in res {
            assert!(got.iter().all(|&x| x == 3.0), "{reason}: {got:?}");
            assert!(k.downloads > 0 && k.peer_opens == 0, "{reason}: {k:?}");
            let why = why.unwrap_or_default();
            assert!(why.contains(reason), "expected {reason:?}, got {why:?}");
            assert_eq!(staged, 1);
        }
    }
    // The same islands answered directly through `agree`, before any call.
    let res = run_threads(peer_world(2, true), |comm| {
        let mut sim = SimDevice::new(Duration::ZERO, 1).ipc(comm.rank() as u64);
        peer::agree(comm, &mut sim).unwrap()
    });
    for why in res {
        assert!(why.is_some_and(|w| w.contains("cannot access")));
    }
}

/// Ranks of one island among others: all of them or none take the path, decided together.
#[test]
fn ranks_decide_together() {
    let c = Case {
        kind: Kind::AllGather,
        n: 4,
        count: 10,
        dtype: DataType::Int32,
        op: ReduceOp::Sum,
        in_place: false,
        root: 0,
    };
    // Islands {0, 1} and {2, 3}: nobody can reach everybody.
    let res = run_case_on(c, 1 << 20, 2, ThreadTransport::Inproc, ipc(2));
    assert!(res.iter().all(|r| r.0 == 0), "{res:?}");
    let k = sum(&res);
    assert_eq!(k.peer_opens, 0, "{k:?}");
    assert!(k.downloads > 0, "{k:?}");
}

/// A non-root's unused side of Gather (its receive buffer) may be empty: nothing is
/// exported or opened for it, and the call still runs GPU to GPU.
#[test]
fn an_empty_side_of_a_rooted_call_is_not_exported() {
    let count = 16;
    let res = run_threads(peer_world(2, true), |comm| {
        let me = comm.rank();
        let mut sim = SimDevice::new(Duration::ZERO, me as u64).ipc(0);
        let (sb, rb) = (count * 4, if me == 0 { 2 * count * 4 } else { 0 });
        // Empty, but at an aligned address (Data checks alignment): a slice of nothing.
        let (mut send, mut recv) = (vec![0u8; sb], vec![0u8; rb.max(8)]);
        let ds = sim.alloc(sb).unwrap();
        sim.write(ds, &ones(count, me as f32 + 1.0)).unwrap();
        let mut mirrors = vec![Mirror {
            host: send.as_mut_ptr(),
            device: ds,
            len: sb,
        }];
        let dr = sim.alloc(rb).unwrap();
        if rb > 0 {
            mirrors.push(Mirror {
                host: recv.as_mut_ptr(),
                device: dr,
                len: rb,
            });
        }
        sim.set_mirrors(mirrors).unwrap();
        let d = Data::out_of_place(&send, &mut recv[..rb]).on(MemorySpace::Device(&mut sim));
        gather(comm, d, count, DataType::Float32, 0).unwrap();
        let got = sim.read(dr, rb).unwrap();
        (got, sim.counts(), peer::tally(comm).0)
    });
    let mut want = ones(count, 1.0);
    want.extend(ones(count, 2.0));
    assert_eq!(res[0].0, want);
    for (_, k, ran) in &res {
        assert_eq!((k.downloads, k.uploads, *ran), (0, 0, 1), "{k:?}");
    }
}

/// A rank whose peer open fails says so, naming the peer whose buffer it could not open;
/// the others finish the call's exchanges with it and fail naming that rank, at once rather
/// than at the timeout.
#[test]
fn a_failed_open_fails_every_rank_at_once_naming_who() {
    let count = 64;
    let started = std::time::Instant::now();
    let res = run_threads(peer_world(3, true), |comm| {
        let me = comm.rank();
        let mut sim = SimDevice::new(Duration::ZERO, me as u64).ipc(0);
        if me == 1 {
            sim = sim.refusing_opens();
        }
        let mut r = rank_on(sim, count * 4, &ones(count, 1.0));
        let d = Data::out_of_place(&r.send, &mut r.recv).on(MemorySpace::Device(&mut r.sim));
        let e = all_reduce(comm, d, count, DataType::Float32, ReduceOp::Sum);
        e.unwrap_err().to_string()
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for a timeout"
    );
    assert!(
        res[1].contains("opening rank 0's buffer") && res[1].contains("refuses peer handles"),
        "{}",
        res[1]
    );
    for e in [&res[0], &res[2]] {
        assert!(e.contains("rank 1 failed on peer memory"), "{e}");
    }
}

/// Bytes rank `i` sends rank `j` in the AlltoAllv tests: irregular, zeros included.
pub(crate) fn v_size(i: usize, j: usize) -> usize {
    ((i * 3 + j * 5) % 7) * 24
}

pub(crate) fn v_byte(i: usize, j: usize, k: usize) -> u8 {
    (i * 64 + j * 16 + k % 13) as u8
}

/// Fails unless rank `me`'s AlltoAllv output `got` holds, back to back, the block each rank
/// `j` sent it (`recvs[j]` bytes of `v_byte(j, me, _)`).
pub(crate) fn assert_blocks(got: &[u8], recvs: &[usize], me: usize, what: &str) {
    let mut at = 0;
    for (j, &len) in recvs.iter().enumerate() {
        let want: Vec<u8> = (0..len).map(|b| v_byte(j, me, b)).collect();
        assert_eq!(got[at..at + len], want[..], "{what}: block from {j}");
        at += len;
    }
}

/// One rank's AlltoAllv on a simulated device in IPC mode (in `island`), sending `sends`
/// and expecting `recvs`: what its device's output holds after the call, its counts, and
/// the call's result.
pub(crate) fn alltoallv_on(
    comm: &mut Communicator,
    island: u64,
    (sends, recvs): (&[usize], &[usize]),
    in_place: bool,
) -> (Result<(), String>, Vec<u8>, Counts) {
    let me = comm.rank();
    let mut sim = SimDevice::new(Duration::from_micros(5), me as u64).ipc(island);
    let mut input = Vec::new();
    for (j, &s) in sends.iter().enumerate() {
        input.extend((0..s).map(|k| v_byte(me, j, k)));
    }
    let (stotal, rtotal) = (input.len(), recvs.iter().sum::<usize>());
    let bytes = stotal.max(rtotal).max(8);
    let (mut send, mut recv) = (vec![0u8; bytes], vec![0u8; bytes]);
    let (ds, dr) = (sim.alloc(bytes).unwrap(), sim.alloc(bytes).unwrap());
    sim.write(ds, &input).unwrap();
    sim.write(dr, &vec![0xee; bytes]).unwrap();
    if in_place {
        sim.write(dr, &input).unwrap();
    }
    let mirrors = [(&mut send, ds), (&mut recv, dr)].map(|(t, d)| Mirror {
        host: t.as_mut_ptr(),
        device: d,
        len: bytes,
    });
    sim.set_mirrors(mirrors.to_vec()).unwrap();
    let d = if in_place {
        Data::in_place(&mut recv)
    } else {
        Data::out_of_place(&send, &mut recv)
    };
    let res = alltoallv(comm, d.on(MemorySpace::Device(&mut sim)), sends, recvs);
    let got = sim.read(dr, rtotal).unwrap();
    (res.map_err(|e| e.to_string()), got, sim.counts())
}

/// AlltoAllv with irregular sizes (zeros included) on 2, 3 and 4 ranks, in and out of place,
/// runs GPU to GPU: every block lands at its sender's offset, nothing is staged.
#[test]
fn alltoallv_runs_gpu_to_gpu_with_irregular_sizes() {
    for n in [2usize, 3, 4] {
        for in_place in [false, true] {
            let res = run_threads(peer_world(n, true), |comm| {
                let me = comm.rank();
                let sends: Vec<usize> = (0..n).map(|j| v_size(me, j)).collect();
                let recvs: Vec<usize> = (0..n).map(|j| v_size(j, me)).collect();
                let (res, got, k) = alltoallv_on(comm, 0, (&sends, &recvs), in_place);
                let (ran, staged, _) = peer::tally(comm);
                (me, recvs, res, got, k, (ran, staged))
            });
            for (me, recvs, res, got, k, tally) in res {
                let case = format!("n={n} in place {in_place} rank {me}");
                res.unwrap();
                assert_blocks(&got, &recvs, me, &case);
                assert_eq!((k.downloads, k.uploads), (0, 0), "{case}: staged: {k:?}");
                assert!(k.peer_opens > 0 && k.device_copies > 0, "{case}: {k:?}");
                assert_eq!((tally.0, tally.1), (1, 0), "{case}: not counted GPU to GPU");
            }
        }
    }
}

/// Sizes that disagree (rank 2 expects fewer bytes from rank 0 than rank 0 sends it) fail
/// on every rank at once: the rank that found it names the sender and both sizes, the
/// others name that rank.
#[test]
fn alltoallv_sizes_that_disagree_fail_every_rank_naming_who() {
    let n = 3;
    let started = std::time::Instant::now();
    let res = run_threads(peer_world(n, true), |comm| {
        let me = comm.rank();
        let sends: Vec<usize> = (0..n).map(|j| v_size(me, j)).collect();
        let mut recvs: Vec<usize> = (0..n).map(|j| v_size(j, me)).collect();
        if me == 2 {
            recvs[0] -= 8;
        }
        alltoallv_on(comm, 0, (&sends, &recvs), false)
            .0
            .unwrap_err()
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for a timeout"
    );
    let want = format!(
        "rank 0 sends {} bytes to rank 2, which expects {}",
        v_size(0, 2),
        v_size(0, 2) - 8
    );
    assert!(res[2].contains(&want), "{}", res[2]);
    for e in [&res[0], &res[1]] {
        assert!(e.contains("rank 2 failed on peer memory"), "{e}");
    }
}
