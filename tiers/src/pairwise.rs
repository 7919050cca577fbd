//! Every pair of nodes, measured alone on its link: a round robin of sendrecv between node
//! leaders, the disjoint pairs of a round at once, each pair on its own communicator.

use crate::adaptive::{Pairing, Settings};
use crate::analysis::Measured;
use crate::run::wait_all;
use crate::topology::Topology;
use crate::{schedule, Error, Job, Options};
use busbw_collectives::{
    all_reduce_values, barrier, sendrecv, Communicator, Data, DataType, HostBuffer, ReduceOp,
};
use busbw_job::Factory;
use busbw_reports::tiers::LinkMatrix;
use std::time::Instant;

/// Sendrecv between node leaders, round after round of disjoint pairs: the round robin
/// (every pair), or with `opts.adaptive` the rounds rank 0 chooses from the last one's
/// results ([`crate::adaptive`]: the widest tier first, then the nodes of slow pairs with
/// nodes measured good). On rank 0 the matrix (links not judged yet) and the measured pairs.
pub(crate) fn pairwise(
    comm: &Communicator,
    factory: Option<&Factory>,
    job: &Job,
    topo: &Topology,
    opts: &Options,
) -> Result<(LinkMatrix, Vec<Measured>), Error> {
    let nodes = &topo.nodes;
    let store = &*job.store;
    let rank = comm.rank();
    let timeout = comm.config().timeout;
    let bytes = (opts.pairwise_size as usize / 4) * 4;
    let leader = nodes.leaders[nodes.of_rank[rank]] == rank;
    let mut bufs = None;
    if leader {
        let alloc = |buffer: &'static str| {
            HostBuffer::new(bytes).ok_or(Error::Alloc {
                rank,
                bytes,
                buffer,
            })
        };
        bufs = Some((alloc("send")?, alloc("receive")?));
    }
    let mut rounds: Vec<Vec<(usize, usize)>> = Vec::new();
    let robin = (!opts.adaptive).then(|| schedule::round_robin(nodes.names.len()));
    let mut pairing =
        (opts.adaptive && rank == 0).then(|| Pairing::new(domains(topo), Settings::default()));
    for ri in 0.. {
        let round = if let Some(robin) = &robin {
            match robin.get(ri) {
                Some(r) => r.clone(),
                None => break,
            }
        } else {
            // Rank 0 decides each round from the last one's results; everyone reads it.
            let k = format!("tiers/adaptive/{ri}");
            if let Some(p) = pairing.as_mut() {
                let next = p.next_round().unwrap_or_default();
                store.set(&k, serde_json::to_string(&next)?.as_bytes())?;
                next
            } else {
                let v = store.wait(&[&k], timeout * 4)?;
                serde_json::from_slice(&v[0])?
            }
        };
        if round.is_empty() {
            break;
        }
        let values = measure_round(
            ri,
            &round,
            comm,
            factory,
            job,
            topo,
            opts,
            (bytes, leader, bufs.as_mut()),
        )?;
        if let Some(p) = pairing.as_mut() {
            let results: Vec<((usize, usize), f64)> = round
                .iter()
                .zip(&values)
                .map(|(&(a, b), v)| {
                    (
                        (a, b),
                        String::from_utf8_lossy(v).trim().parse().unwrap_or(0.0),
                    )
                })
                .collect();
            p.record(&results);
        }
        rounds.push(round);
    }
    let n = nodes.names.len();
    let mut m = LinkMatrix {
        size: bytes as u64,
        rounds: rounds.len(),
        nodes: nodes.names.clone(),
        busbw: vec![vec![None; n]; n],
        links: Vec::new(),
    };
    if rank != 0 {
        return Ok((m, Vec::new()));
    }
    let key = |a: usize, b: usize| format!("tiers/pair/{a}-{b}");
    let pairs: Vec<(usize, usize)> = rounds.iter().flatten().copied().collect();
    let keys: Vec<String> = pairs.iter().map(|&(a, b)| key(a, b)).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values = store.wait(&refs, timeout)?;
    let mut measured = Vec::new();
    for (&(a, b), v) in pairs.iter().zip(&values) {
        let bw: f64 = String::from_utf8_lossy(v).trim().parse().unwrap_or(0.0);
        m.busbw[a][b] = Some(bw);
        m.busbw[b][a] = Some(bw);
        measured.push(Measured {
            a,
            b,
            tier: topo.link_tier(a, b),
            busbw: bw,
        });
    }
    measured.sort_by_key(|x| (x.a, x.b));
    Ok((m, measured))
}

/// One round: the leaders of each pair run sendrecv on their own communicator, rank 0 of the
/// pair publishes its busbw; every rank waits for every pair (the next round must not share
/// the wire with this one) and gets the values in `round`'s order.
#[allow(clippy::too_many_arguments)]
fn measure_round(
    ri: usize,
    round: &[(usize, usize)],
    comm: &Communicator,
    factory: Option<&Factory>,
    job: &Job,
    topo: &Topology,
    opts: &Options,
    (bytes, leader, bufs): (usize, bool, Option<&mut (HostBuffer, HostBuffer)>),
) -> Result<Vec<Vec<u8>>, Error> {
    let nodes = &topo.nodes;
    let store = &*job.store;
    let timeout = comm.config().timeout;
    let count = bytes / 4;
    let my_node = nodes.of_rank[comm.rank()];
    let key = |a: usize, b: usize| format!("tiers/pair/{a}-{b}");
    let pair = round.iter().find(|(a, b)| *a == my_node || *b == my_node);
    if let (true, Some(&(a, b)), Some(f), Some((send, recv))) = (leader, pair, factory, bufs) {
        let ranks = [nodes.leaders[a], nodes.leaders[b]];
        let mut c = f
            .build(&format!("pair/{a}-{b}"), &ranks, &[a, b])
            .map_err(|source| Error::Group {
                what: format!("pairing {} with {}", nodes.names[a], nodes.names[b]),
                source: Box::new(source),
            })?;
        let ctx = |source| Error::Pairwise {
            what: format!(
                "sendrecv between {} and {} (round {ri})",
                nodes.names[a], nodes.names[b]
            ),
            source,
        };
        let op = |c: &mut Communicator, s: &HostBuffer, r: &mut HostBuffer| {
            sendrecv(
                c,
                Data::out_of_place(s.as_slice(), r.as_mut_slice()),
                count,
                DataType::Float32,
            )
        };
        op(&mut c, send, recv).map_err(ctx)?;
        barrier(&mut c).map_err(ctx)?;
        let start = Instant::now();
        for _ in 0..opts.pairwise_iters {
            op(&mut c, send, recv).map_err(ctx)?;
        }
        let mut secs = [start.elapsed().as_secs_f64() / opts.pairwise_iters as f64];
        all_reduce_values(&mut c, &mut secs, ReduceOp::Max).map_err(ctx)?;
        if c.rank() == 0 {
            let bw = if secs[0] > 0.0 {
                bytes as f64 / secs[0] / 1e9
            } else {
                0.0
            };
            store.set(&key(a, b), bw.to_string().as_bytes())?;
        }
    }
    let keys: Vec<(String, String)> = round
        .iter()
        .map(|&(a, b)| {
            let who = format!("pair {} - {} (round {ri})", nodes.names[a], nodes.names[b]);
            (key(a, b), who)
        })
        .collect();
    wait_all(store, &keys, &job.abort, timeout * 4)
}

/// Each node's domain at every tier of the model, closest first, as the adaptive schedule
/// takes them: equal ids for one domain; a node whose label is unknown shares nobody's.
fn domains(topo: &Topology) -> Vec<Vec<u32>> {
    let (model, nodes) = (&topo.model, &topo.nodes);
    let levels = model.len();
    let mut ids: Vec<std::collections::HashMap<Vec<String>, u32>> =
        vec![Default::default(); levels];
    let mut fresh = 0u32;
    (0..nodes.names.len())
        .map(|n| {
            (0..levels)
                .map(|l| match model.domain(&nodes.labels[n], l) {
                    busbw_launchers::topology::Domain::Known(path) => {
                        let next = ids[l].len() as u32;
                        *ids[l].entry(path).or_insert(next)
                    }
                    busbw_launchers::topology::Domain::Unknown { .. } => {
                        fresh += 1;
                        u32::MAX - fresh
                    }
                })
                .collect()
        })
        .collect()
}
