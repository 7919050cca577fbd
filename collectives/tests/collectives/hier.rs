//! Device data across hosts: every collective, type and op on simulated hosts whose devices
//! reach each other only within a host, with each rank's node and rail communicators.

use crate::harness::{run_case_across_hosts, world_across_hosts};
use crate::ipc::{alltoallv_on, assert_blocks, v_size};
use crate::reference::{device_kinds, Case, Kind};
use busbw_collectives::algorithms::peer;
use busbw_collectives::algorithms::peer::Hierarchy;
use busbw_collectives::link::nodes::NodeMap;
use busbw_collectives::testing::run_threads;
use busbw_collectives::testing::{thread_world, ThreadTransport};
use busbw_collectives::{Communicator, DataType};
use std::time::Duration;

/// 2 hosts of 2 and of 3 ranks, 3 hosts of 2; a count the host's ranks divide, one they do
/// not (a tail) and one below them; every type and op, roots on several hosts; in and out of
/// place. Bit for bit against the reference; every call runs across hosts with every rank
/// opening its host's peers' buffers (Scatter and Gather: the root's host's ranks only).
#[test]
fn every_collective_type_and_op_runs_across_hosts() {
    for (hosts, per) in [(2usize, 2usize), (2, 3), (3, 2)] {
        let n = hosts * per;
        for kind in device_kinds() {
            if kind == Kind::HyperCube && !n.is_power_of_two() {
                continue;
            }
            for count in [1usize, 36, 37] {
                for dtype in DataType::ALL {
                    for &op in kind.ops() {
                        for in_place in [false, true] {
                            let c = Case {
                                kind,
                                n,
                                count,
                                dtype,
                                op,
                                in_place,
                                // A root off host 0 and off local rank 0 where there is one.
                                root: (count + 1) % n,
                            };
                            let res = run_case_across_hosts(c, hosts, Duration::from_micros(2));
                            let wrong: Vec<u64> = res.iter().map(|r| r.0).collect();
                            assert!(
                                wrong.iter().all(|&w| w == 0),
                                "{hosts} hosts of {per}, {c:?}: wrong per rank {wrong:?}"
                            );
                            for (r, (_, k, across)) in res.iter().enumerate() {
                                let at = format!("{hosts} hosts of {per}, {c:?}, rank {r}");
                                assert_eq!(*across, 1, "{at}: not run across hosts");
                                // Scatter and Gather move nothing inside the other hosts.
                                let inside = !matches!(kind, Kind::Scatter | Kind::Gather)
                                    || r / per == c.root / per;
                                assert_eq!(k.peer_opens > 0, inside, "{at}: {k:?}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Only ranks numbered host by host, as many on every host as the node communicator has,
/// each at its place in both communicators, get a hierarchy; the refusal says why.
#[test]
fn a_hierarchy_needs_ranks_numbered_host_by_host() {
    let world = |nodes: Vec<usize>| {
        let mut w = thread_world(nodes.len(), ThreadTransport::Inproc, Default::default()).unwrap();
        for c in &mut w {
            c.set_nodes(nodes.clone()).unwrap();
        }
        w
    };
    // Why `world` refuses a hierarchy of rank `node` of a node communicator of 2 and rank
    // `rail` of a rail communicator of 2 (`None`: it takes it).
    let refusal = |world: &Communicator, node: usize, rail: usize| {
        let two = || thread_world(2, ThreadTransport::Inproc, Default::default()).unwrap();
        let (mut nodes, mut rails) = (two(), two());
        Hierarchy::new(world, nodes.remove(node), rails.remove(rail))
            .err()
            .map(|e| e.to_string())
    };
    // Hosts interleaved: a host's blocks would not be one range.
    let w = world(vec![0, 1, 0, 1]);
    let e = refusal(&w[0], 0, 0).unwrap_or_default();
    assert!(
        e.contains("the 2 hosts' ranks are not numbered host by host"),
        "{e}"
    );
    // Right map, but rank 1 handed the node communicator's rank 0.
    let w = world(vec![0, 0, 1, 1]);
    let e = refusal(&w[1], 0, 0).unwrap_or_default();
    assert!(e.contains("rank 0 of its host's communicator"), "{e}");
    assert_eq!(refusal(&w[1], 1, 0), None);
}

/// AlltoAllv with irregular sizes (zeros included) on 2 hosts of 2 and of 3 ranks, in and
/// out of place: it runs across hosts (the host's blocks GPU to GPU), and every block lands
/// at its sender's offset.
#[test]
fn alltoallv_runs_across_hosts() {
    for (hosts, per) in [(2usize, 2usize), (2, 3)] {
        let n = hosts * per;
        for in_place in [false, true] {
            let res = run_threads(world_across_hosts(n, hosts), |comm| {
                let me = comm.rank();
                let sends: Vec<usize> = (0..n).map(|j| v_size(me, j)).collect();
                let recvs: Vec<usize> = (0..n).map(|j| v_size(j, me)).collect();
                let island = (me / per) as u64;
                let (res, got, k) = alltoallv_on(comm, island, (&sends, &recvs), in_place);
                (recvs, res, got, k, peer::across_hosts(comm))
            });
            for (me, (recvs, res, got, k, across)) in res.into_iter().enumerate() {
                let at = format!("{hosts} hosts of {per}, in place {in_place}, rank {me}");
                res.unwrap();
                assert_blocks(&got, &recvs, me, &at);
                assert_eq!(across, 1, "{at}");
                assert!(k.peer_opens > 0, "{at}: {k:?}");
            }
        }
    }
}

/// Which node maps split by host and rail, and the words for those that do not.
#[test]
fn only_equal_hosts_numbered_host_by_host_split() {
    let per = |labels: &[usize]| Hierarchy::ranks_per_host(&NodeMap::from_labels(labels));
    assert_eq!(Hierarchy::ranks_per_host(&NodeMap::uniform(8, 4)), Ok(4));
    let why = |labels: &[usize]| per(labels).unwrap_err();
    assert!(why(&[0, 0, 0]).contains("one host"));
    assert!(why(&[0, 1, 0, 1]).contains("not numbered host by host"));
    assert!(why(&[0, 0, 0, 1]).contains("not numbered host by host"));
    assert!(why(&[0, 1, 2]).contains("one rank"));
}
