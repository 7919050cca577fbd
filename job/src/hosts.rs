//! Device data across hosts: the node and rail communicators a job of several hosts gives
//! its communicator, so that its collectives move a host's device bytes GPU to GPU and only
//! each rank's share over the network (`busbw_collectives::algorithms::peer::Hierarchy`).

use crate::error::Result;
use crate::subcomm::BuildError;
use crate::{JoinOptions, Session};
use busbw_collectives::algorithms::peer::{self, Hierarchy};
use busbw_collectives::Communicator;
use busbw_launchers::World;
use busbw_measure::Plan;

/// Gives the session's communicator its node and rail communicators (every rank calls it,
/// like a collective): see [`split`]. `None` also for a job on one host.
pub fn give_hierarchy(
    session: &mut Session,
    world: &World,
    opts: &JoinOptions,
    plan: &Plan,
) -> Result<Option<String>> {
    if session.comm.node_map().node_count() < 2 {
        return Ok(None);
    }
    let factory = crate::transport::session_factory(session, world, opts, plan)?;
    let ranks: Vec<usize> = (0..session.comm.size()).collect();
    Ok(split(&mut session.comm, &factory, "hier", &ranks)?)
}

/// Gives `comm` (whose rank i is job rank `ranks[i]`: the job's, or a group's) its node and
/// rail communicators, named under `name`, when its ranks are on several hosts, its device
/// buffers may go GPU to GPU (`map_peers`: `--transport shm` or `auto`) and its ranks split
/// by host ([`Hierarchy::ranks_per_host`]). Every member calls it, like a collective. Returns why not when
/// the ranks are on several hosts and cannot be split; `None` when split, or on one host.
pub fn split(
    comm: &mut Communicator,
    factory: &crate::Factory,
    name: &str,
    ranks: &[usize],
) -> Result<Option<String>, BuildError> {
    let map = comm.node_map();
    if map.node_count() < 2 {
        return Ok(None);
    }
    if !comm.config().map_peers {
        return Ok(Some(
            "a transport was asked for by name, so local ranks do not map each other's memory"
                .into(),
        ));
    }
    let per = match Hierarchy::ranks_per_host(map) {
        Ok(per) => per,
        Err(why) => return Ok(Some(why)),
    };
    let (n, me) = (comm.size(), comm.rank());
    let (host, l) = (me / per, me % per);
    let group = |what: String, members: Vec<usize>| {
        let nodes: Vec<usize> = members.iter().map(|&i| comm.nodes()[i]).collect();
        let global: Vec<usize> = members.iter().map(|&i| ranks[i]).collect();
        factory.build(&format!("{name}/{what}"), &global, &nodes)
    };
    let node = group(
        format!("node/{host}"),
        (host * per..(host + 1) * per).collect(),
    )?;
    let rail = group(
        format!("rail/{l}"),
        (0..n / per).map(|x| x * per + l).collect(),
    )?;
    let h = Hierarchy::new(comm, node, rail)?;
    peer::set_hierarchy(comm, h);
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subcomm::tests::loopback_factory;
    use busbw_collectives::offload::sim::SimDevice;
    use busbw_collectives::testing::{run_threads, thread_world, ThreadTransport};
    use busbw_collectives::{
        all_reduce, CommConfig, Data, DataType, MemorySpace, Mirror, ReduceOp,
    };
    use busbw_launchers::MemoryStore;
    use std::sync::Arc;
    use std::time::Duration;

    /// The groups built through the store are each rank's host and rail, in the places the
    /// hierarchy wants them: a group of job ranks 10-13 on 2 hosts of 2, device data on
    /// simulated devices that reach each other within a host, an AllReduce that runs across
    /// hosts and sums right.
    #[test]
    fn the_groups_built_are_each_ranks_host_and_rail() {
        let (n, count) = (4usize, 1000usize);
        let ranks: Vec<usize> = (10..14).collect();
        let store = Arc::new(MemoryStore::new());
        let cfg = CommConfig {
            timeout: Duration::from_secs(20),
            map_peers: true,
            ..CommConfig::default()
        };
        let mut world = thread_world(n, ThreadTransport::Inproc, cfg).unwrap();
        for c in &mut world {
            c.set_nodes(vec![0, 0, 1, 1]).unwrap();
        }
        let res = run_threads(world, |comm| {
            let g = comm.rank();
            let factory =
                loopback_factory(store.clone(), ranks[g], Duration::from_secs(20)).map_peers(true);
            assert_eq!(split(comm, &factory, "t2/g0", &ranks).unwrap(), None);
            let mut sim = SimDevice::new(Duration::ZERO, g as u64).ipc((g / 2) as u64);
            let bytes = count * 4;
            let (mut send, mut recv) = (vec![0u8; bytes], vec![0u8; bytes]);
            let (ds, dr) = (sim.alloc(bytes).unwrap(), sim.alloc(bytes).unwrap());
            let one: Vec<u8> = (0..count)
                .flat_map(|_| (g as f32 + 1.0).to_le_bytes())
                .collect();
            sim.write(ds, &one).unwrap();
            let mirrors = [(&mut send, ds), (&mut recv, dr)].map(|(t, d)| Mirror {
                host: t.as_mut_ptr(),
                device: d,
                len: bytes,
            });
            sim.set_mirrors(mirrors.to_vec()).unwrap();
            let d = Data::out_of_place(&send, &mut recv).on(MemorySpace::Device(&mut sim));
            all_reduce(comm, d, count, DataType::Float32, ReduceOp::Sum).unwrap();
            let got = sim.read(dr, bytes).unwrap();
            let sums: Vec<f32> = got
                .chunks(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (sums, peer::across_hosts(comm), sim.counts().peer_opens)
        });
        for (r, (sums, across, opens)) in res.into_iter().enumerate() {
            assert!(
                sums.iter().all(|&x| x == 10.0),
                "rank {r}: {:?}",
                &sums[..4]
            );
            assert_eq!(across, 1, "rank {r}");
            assert!(opens > 0, "rank {r}: its host's peer was never opened");
        }
    }
}
