//! Every pair of nodes, measured alone on its link: a round robin of sendrecv between node
//! leaders, the disjoint pairs of a round at once, each pair on its own communicator.

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

/// Round-robin sendrecv between node leaders; on rank 0 the matrix (links not judged yet)
/// and the measured pairs.
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
    let rounds = schedule::round_robin(nodes.names.len());
    let bytes = (opts.pairwise_size as usize / 4) * 4;
    let count = bytes / 4;
    let my_node = nodes.of_rank[rank];
    let leader = nodes.leaders[my_node] == rank;
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
    let key = |a: usize, b: usize| format!("tiers/pair/{a}-{b}");
    for (ri, round) in rounds.iter().enumerate() {
        let pair = round.iter().find(|(a, b)| *a == my_node || *b == my_node);
        if let (true, Some(&(a, b)), Some(f), Some((send, recv))) =
            (leader, pair, factory, bufs.as_mut())
        {
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
        wait_all(store, &keys, &job.abort, timeout * 4)?;
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
