//! One rank's membership in a job: rendezvous, configuration agreement, transport and
//! communicator. Everything here that waits is bounded by `-T`.

use crate::gpu::GpuLine;
use crate::plan::Plan;
use anyhow::{Context, Result};
use busbw_collectives::{CommConfig, Communicator};
use busbw_launchers::store::all_gather;
use busbw_launchers::{
    never_registered, rank_info, rendezvous_with, token_digest, RankInfo, Rendezvous, Store,
    StoreError, World,
};
use busbw_reports::DeviceInfo;
use busbw_tiers::subcomm::BoxError;
use busbw_tiers::Factory;
use busbw_transports::inproc::InprocTransport;
use busbw_transports::multi::{Member, MultiTransport, NodeId, TransportKind};
use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::tcp::{TcpConfig, TcpTransport};
use busbw_transports::{Abort, Handle, Identity, Transport};
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

pub struct Session {
    pub comm: Communicator,
    pub rdv: Option<Rendezvous>,
    pub abort: Abort,
    /// Every rank's device line, on rank 0 only.
    pub devices: Vec<DeviceInfo>,
    /// `--transport` as given (`auto`, `tcp`, `shm`), or `inproc` for a one-rank job.
    pub transport_name: String,
    /// Every rank's host name, on every rank: an error about a peer names its host.
    pub hosts: Vec<String>,
}

fn device_info(
    rank: usize,
    pid: u32,
    hostname: &str,
    local_rank: usize,
    transport: &str,
) -> DeviceInfo {
    DeviceInfo {
        rank,
        group: 0,
        pid,
        hostname: hostname.to_string(),
        device: local_rank as i32,
        pci: "0000:00:00".into(),
        name: format!("host memory via {transport}"),
    }
}

/// Cluster options of a rank.
#[derive(Clone, Debug, Default)]
pub struct JoinOptions {
    /// `--job-token`: required of every store and data connection.
    pub token: Option<String>,
    /// `--socket-ifname` / `NCCL_SOCKET_IFNAME`.
    pub socket_ifname: Option<String>,
    /// `--ib-hca` / `NCCL_IB_HCA`.
    pub ib_hca: Option<String>,
    /// `--socket-nthreads` / `NCCL_SOCKET_NTHREADS`.
    pub socket_nthreads: usize,
    /// `--nsocks-perthread` / `NCCL_NSOCKS_PERTHREAD`.
    pub nsocks_perthread: usize,
}

impl JoinOptions {
    /// This rank's TCP set-up once its address is known.
    pub(crate) fn tcp(&self, (bind, advertise): (IpAddr, Option<IpAddr>)) -> TcpSetup {
        TcpSetup {
            bind,
            advertise,
            threads: self.socket_nthreads,
            socks_per_thread: self.nsocks_perthread,
        }
    }
}

/// Where this rank's TCP listens and how many sockets its connections use: one value for the
/// job's communicator and the groups' sub-communicators.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TcpSetup {
    pub bind: IpAddr,
    pub advertise: Option<IpAddr>,
    pub threads: usize,
    pub socks_per_thread: usize,
}

impl TcpSetup {
    fn config(&self) -> TcpConfig {
        TcpConfig {
            bind: self.bind,
            advertise: self.advertise,
            threads: self.threads,
            socks_per_thread: self.socks_per_thread,
            ..TcpConfig::default()
        }
    }
}

/// `--socket-nthreads` and `--nsocks-perthread` against NCCL's limits, checked before joining
/// so that a typo is a usage error on the host that has it.
pub(crate) fn check_socket_threads(threads: usize, socks_per_thread: usize) -> Result<(), String> {
    TcpConfig {
        threads,
        socks_per_thread,
        ..TcpConfig::default()
    }
    .validate()
}

/// The address peers should use to reach this host: the interface `--socket-ifname` names;
/// else loopback when the job is local; else the address of the interface that routes to the
/// store host (no packet is sent).
pub(crate) fn local_address(
    world: &World,
    ifname: Option<&str>,
) -> Result<(IpAddr, Option<IpAddr>)> {
    if let Some(spec) = ifname {
        let i = busbw_transports::iface::select(spec).map_err(anyhow::Error::msg)?;
        return Ok((i.addr, None));
    }
    let target = format!("{}:{}", world.master_addr, world.master_port.max(1));
    let addrs: Vec<_> = target
        .to_socket_addrs()
        .with_context(|| format!("resolving MASTER_ADDR {}", world.master_addr))?
        .collect();
    if addrs.iter().any(|a| a.ip().is_loopback()) {
        return Ok((IpAddr::V4(Ipv4Addr::LOCALHOST), None));
    }
    let first = addrs
        .first()
        .with_context(|| format!("MASTER_ADDR {} resolves to no address", world.master_addr))?;
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    sock.connect(first)
        .with_context(|| format!("finding the interface that routes to {first}"))?;
    let ip = sock.local_addr()?.ip();
    Ok((IpAddr::V4(Ipv4Addr::UNSPECIFIED), Some(ip)))
}

fn job_token() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (std::process::id() as u64).rotate_left(32) ^ 0x6275_7362_7700_0000
}

fn parse_u64(bytes: &[u8], what: &str) -> Result<u64> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("malformed {what} in the rendezvous store"))
}

impl Session {
    /// A one-rank job in this process: no store, no sockets.
    pub fn single(world: World, plan: &Plan) -> Result<Session> {
        let abort = Abort::new();
        let t = InprocTransport::new(Identity::new(0, 0));
        let (h, l) = t.listen()?;
        let comm = Communicator::new(Box::new(t), l, vec![h], comm_config(plan, &abort, 1))?;
        let devices = vec![device_info(
            0,
            std::process::id(),
            &world.hostname,
            world.local_rank,
            "inproc",
        )];
        Ok(Session {
            comm,
            rdv: None,
            abort,
            devices,
            transport_name: "inproc".into(),
            hosts: vec![world.hostname.clone()],
        })
    }

    /// Join a multi-rank job. `rdv` is created by the caller so that it can post an abort
    /// if anything here fails.
    pub fn join(world: World, rdv: Rendezvous, plan: &Plan, opts: &JoinOptions) -> Result<Session> {
        match Self::join_inner(&world, &rdv, plan, opts) {
            Ok((comm, devices, abort, hosts)) => Ok(Session {
                comm,
                rdv: Some(rdv),
                abort,
                devices,
                transport_name: plan.transport.to_string(),
                hosts,
            }),
            Err(e) => {
                let _ = rdv.post_abort(&format!(
                    "rank {} on {} failed to join: {e:#}",
                    world.rank, world.hostname
                ));
                // Check out as a finished rank does: rank 0 serves the store and must not take
                // it away while the others still read what they need to fail with their own
                // reason (ranks with different flags each name the flags, exit 2, instead of
                // losing the store, exit 3); the abort bounds the wait to a short linger.
                let _ = rdv.finish();
                Err(e)
            }
        }
    }

    /// Joining in three steps: agree on the job (its id, the same flags everywhere), open
    /// this rank's end (transports, listener, what it tells the others), exchange ends through
    /// the store, and build the communicator from what came back.
    fn join_inner(
        world: &World,
        rdv: &Rendezvous,
        plan: &Plan,
        opts: &JoinOptions,
    ) -> Result<(Communicator, Vec<DeviceInfo>, Abort, Vec<String>)> {
        let job = agree(world, rdv, plan, opts)?;
        let end = End::open(world, plan, opts, job)?;
        let peers = exchange(world, rdv, plan, &end)?;
        build(world, rdv, plan, end, peers)
    }

    /// Puts every rank's GPU into the `Using devices` lines (rank 0's copy): a rendezvous
    /// gather of each rank's [`GpuLine`], since ranks on other hosts see other devices.
    pub fn publish_gpu(&mut self, line: &GpuLine, timeout: std::time::Duration) -> Result<()> {
        let (rank, size) = (self.comm.rank(), self.comm.size());
        let lines: Vec<Option<GpuLine>> = match &self.rdv {
            Some(r) => {
                let g = all_gather(
                    r.store.as_ref(),
                    "gpu",
                    rank,
                    size,
                    line.encode().as_bytes(),
                    timeout,
                )
                .map_err(|e| name_missing(e, "gpu"))?;
                g.iter()
                    .map(|b| GpuLine::decode(&String::from_utf8_lossy(b)))
                    .collect()
            }
            None => vec![Some(line.clone())],
        };
        for (d, l) in self.devices.iter_mut().zip(lines) {
            let l = l.with_context(|| format!("rank {} sent a malformed device line", d.rank))?;
            d.device = l.index as i32;
            d.pci = l.pci;
            d.name = format!(
                "{} via {}",
                l.name,
                d.name.trim_start_matches("host memory via ")
            );
        }
        Ok(())
    }

    /// Check out of the job (rank 0 keeps serving the store until everyone has).
    pub fn finish(&self) -> Result<()> {
        if let Some(r) = &self.rdv {
            r.finish()?;
        }
        Ok(())
    }
}

/// What one rank gathers from all: `prefix/<rank>` of every rank, in rank order (see
/// `all_gather`); a rank that never published is named.
fn gather(
    world: &World,
    rdv: &Rendezvous,
    plan: &Plan,
    prefix: &str,
    value: &[u8],
) -> Result<Vec<Vec<u8>>> {
    all_gather(
        rdv.store.as_ref(),
        prefix,
        world.rank,
        world.size,
        value,
        plan.timeout,
    )
    .map(|g| g.iter().map(<[u8]>::to_vec).collect())
    .map_err(|e| name_missing(e, prefix))
}

/// Agreement: the job id every data connection carries (rank 0 draws it, the token is mixed
/// in), and the same flags and the same busbw on every rank, or a usage error naming what
/// differs.
fn agree(world: &World, rdv: &Rendezvous, plan: &Plan, opts: &JoinOptions) -> Result<u64> {
    let store = &rdv.store;
    if world.rank == 0 {
        store.set("job", job_token().to_string().as_bytes())?;
    }
    let job = parse_u64(&store.wait(&["job"], plan.timeout)?[0], "job token")?
        ^ opts.token.as_deref().map(token_digest).unwrap_or(0);
    let mine = plan.fingerprint();
    let plans = gather(world, rdv, plan, "plan", mine.as_bytes())
        .context("waiting for every rank to publish its configuration")?;
    let differ: Vec<(usize, String)> = plans
        .iter()
        .enumerate()
        .filter(|(_, p)| *p != mine.as_bytes())
        .map(|(r, p)| (r, String::from_utf8_lossy(p).into_owned()))
        .collect();
    if !differ.is_empty() {
        return Err(FlagsDiffer::new(world.rank, &mine, &differ).into());
    }
    Ok(job)
}

/// This rank's end of the job: its transports, its listener, and what it tells the others.
struct End {
    /// `--transport tcp`'s transport, or the multi-transport of the others (kept unboxed
    /// until the routes are known: it says which member reaches each peer).
    transport: Transports,
    listener: Box<dyn busbw_transports::Listener>,
    handle: Handle,
    info: RankInfo,
    /// The RDMA port and GID, when this rank has a verbs member.
    verbs: Option<String>,
}

enum Transports {
    Tcp(Box<dyn Transport>),
    Multi(MultiTransport),
}

impl End {
    fn open(world: &World, plan: &Plan, opts: &JoinOptions, job: u64) -> Result<End> {
        let (bind, advertise) = local_address(world, opts.socket_ifname.as_deref())?;
        let tcp = opts.tcp((bind, advertise));
        // Every data connection (the job's, and through the factory the groups') proves the
        // token.
        let identity = Identity::new(job, world.rank as u32).with_token(opts.token.as_deref());
        let node = NodeId::here(&world.hostname);
        let verbs = crate::verbs::for_rank(
            plan.transport,
            plan.gpus > 0,
            opts.ib_hca.as_deref(),
            world.local_rank,
            plan.timeout,
            identity,
            bind,
            advertise,
        )?;
        let desc = verbs.as_ref().map(|(_, d)| d.clone());
        let transport =
            match multi_transport(plan.transport, identity, tcp, &node, verbs.map(|(m, _)| m))? {
                Some(m) => Transports::Multi(m),
                None => Transports::Tcp(tcp_transport(identity, tcp)),
            };
        let (handle, listener) = match &transport {
            Transports::Tcp(t) => t.listen(),
            Transports::Multi(m) => m.listen(),
        }
        .context("opening the data listener")?;
        Ok(End {
            transport,
            listener,
            handle,
            info: RankInfo {
                host: world.hostname.clone(),
                pid: std::process::id(),
                local_rank: world.local_rank,
                node,
            },
            verbs: desc,
        })
    }
}

/// What the ranks learn of each other, in rank order.
struct Peers {
    handles: Vec<Handle>,
    infos: Vec<RankInfo>,
    /// The transports each rank reaches its peers with (`shm+tcp`), for the device lines.
    routes: Vec<String>,
}

/// Exchange through the store: every rank's handle and description (the tree chains the
/// ranks of one host, so all must agree on the node map), then the transports each rank
/// reaches its peers with, worked out from the handles.
fn exchange(world: &World, rdv: &Rendezvous, plan: &Plan, end: &End) -> Result<Peers> {
    let handles: Vec<Handle> = gather(world, rdv, plan, "handle", &end.handle.0)
        .context("waiting for every rank's connection handle")?
        .into_iter()
        .map(Handle)
        .collect();
    let infos = gather(
        world,
        rdv,
        plan,
        rank_info::PREFIX,
        end.info.encode().as_bytes(),
    )?
    .iter()
    .enumerate()
    .map(|(r, raw)| {
        RankInfo::decode(raw)
            .map_err(|e| anyhow::anyhow!("rank {r} published a malformed description: {e}"))
    })
    .collect::<Result<Vec<_>>>()?;
    let mut routes: Vec<&str> = Vec::new();
    for (r, h) in handles.iter().enumerate() {
        if r == world.rank {
            continue;
        }
        let name = match &end.transport {
            Transports::Multi(m) => m.route(h).with_context(|| {
                format!(
                    "rank {r} cannot be reached with --transport {}",
                    plan.transport
                )
            })?,
            Transports::Tcp(_) => "tcp",
        };
        if !routes.contains(&name) {
            routes.push(name);
        }
    }
    // In priority order (shared memory first), whatever order the peers came in.
    routes.sort_by_key(|n| TransportKind::rank_of(n));
    let mut route = routes.join("+");
    if let (true, Some(d)) = (routes.contains(&"verbs"), &end.verbs) {
        // The device block names the RDMA port and GID each rank uses.
        route = format!("{route} [{d}]");
    }
    let routes = gather(world, rdv, plan, "route", route.as_bytes())?
        .into_iter()
        .map(|r| String::from_utf8_lossy(&r).into_owned())
        .collect();
    Ok(Peers {
        handles,
        infos,
        routes,
    })
}

/// The communicator, connected around the ring, and rank 0's device lines.
fn build(
    world: &World,
    rdv: &Rendezvous,
    plan: &Plan,
    end: End,
    peers: Peers,
) -> Result<(Communicator, Vec<DeviceInfo>, Abort, Vec<String>)> {
    let rank = world.rank;
    let mut devices = Vec::new();
    if rank == 0 {
        for (r, (info, via)) in peers.infos.iter().zip(&peers.routes).enumerate() {
            let via = if via.is_empty() { "tcp" } else { via };
            devices.push(device_info(r, info.pid, &info.host, info.local_rank, via));
        }
    }
    let hosts = peers.infos.iter().map(|i| i.host.clone()).collect();
    let nodes = node_map(peers.infos.iter().map(|i| &i.node));
    let abort = Abort::new();
    rdv.watch_abort(abort.clone())?;
    // Ranks that share this machine's cores decide how a waiting rank may use its core.
    let local_ranks = peers
        .infos
        .iter()
        .filter(|i| i.node.same_machine(&end.info.node))
        .count();
    let transport: Box<dyn Transport> = match end.transport {
        Transports::Multi(m) => Box::new(m),
        Transports::Tcp(t) => t,
    };
    let mut comm = Communicator::new(
        transport,
        end.listener,
        peers.handles,
        comm_config(plan, &abort, local_ranks),
    )?;
    comm.set_nodes(nodes)?;
    comm.connect_ring()?;
    Ok((comm, devices, abort, hosts))
}

/// Node index per rank: ranks on the same host share one, numbered in order of first
/// appearance (so rank 0's host is node 0).
fn node_map<T: PartialEq>(hosts: impl Iterator<Item = T>) -> Vec<usize> {
    let mut seen: Vec<T> = Vec::new();
    hosts
        .map(|h| match seen.iter().position(|s| *s == h) {
            Some(i) => i,
            None => {
                seen.push(h);
                seen.len() - 1
            }
        })
        .collect()
}

/// A store timeout on per-rank keys becomes "rank 5 never registered".
fn name_missing(e: StoreError, prefix: &str) -> anyhow::Error {
    match &e {
        StoreError::Timeout { missing, .. } => match never_registered(missing, prefix) {
            Some(who) => anyhow::Error::new(e).context(who),
            None => e.into(),
        },
        _ => e.into(),
    }
}

/// TCP alone (`--transport tcp`), and the network member of the others.
pub(crate) fn tcp_transport(identity: Identity, setup: TcpSetup) -> Box<dyn Transport> {
    Box::new(TcpTransport::new(identity, setup.config()))
}

/// The transports `--transport` names, in NCCL's priority order (shared memory, then RDMA,
/// then TCP), behind one multi-transport; `None` for `tcp`, which needs no routing. `verbs`
/// is this rank's RDMA member when it has one. One definition for the job's communicator and
/// the groups' sub-communicators, so both always choose alike.
pub(crate) fn multi_transport(
    kind: TransportKind,
    identity: Identity,
    tcp: TcpSetup,
    node: &NodeId,
    verbs: Option<Member>,
) -> Result<Option<MultiTransport>> {
    let shm = || Member {
        transport: Box::new(ShmTransport::new(identity, ShmConfig::default())),
        same_node_only: true,
    };
    let members: Vec<Member> = match kind {
        TransportKind::Tcp => return Ok(None),
        TransportKind::Shm => vec![shm()],
        TransportKind::Verbs => verbs.into_iter().collect(),
        // In TransportKind::PRIORITY order.
        TransportKind::Auto => std::iter::once(shm())
            .chain(verbs)
            .chain(std::iter::once(Member {
                transport: tcp_transport(identity, tcp),
                same_node_only: false,
            }))
            .collect(),
    };
    Ok(Some(MultiTransport::new(members, node)?))
}

/// The groups' communicators of this rank (tier groups, `NCCL_TESTS_SPLIT`): their
/// transports are chosen as the job's were (the same `--transport`, the same RDMA port), but
/// instances of their own, so a group's queue pairs, slots and memory registrations live and
/// die with its communicator and are never seen by another group. `device_buffers` (`-g`):
/// the groups' verbs transports keep off their eager path (see `verbs::for_rank`).
pub(crate) fn group_factory(
    world: &World,
    store: Arc<dyn Store>,
    opts: &JoinOptions,
    kind: TransportKind,
    timeout: Duration,
    abort: Abort,
    device_buffers: bool,
) -> Result<Factory> {
    let tcp = opts.tcp(local_address(world, opts.socket_ifname.as_deref())?);
    let node = NodeId::here(&world.hostname);
    let ib_hca = opts.ib_hca.clone();
    let local_rank = world.local_rank;
    let transports = move |identity: Identity| -> Result<Box<dyn Transport>, BoxError> {
        let verbs = crate::verbs::for_rank(
            kind,
            device_buffers,
            ib_hca.as_deref(),
            local_rank,
            timeout,
            identity,
            tcp.bind,
            tcp.advertise,
        )?
        .map(|(member, _)| member);
        Ok(match multi_transport(kind, identity, tcp, &node, verbs)? {
            Some(m) => Box::new(m),
            None => tcp_transport(identity, tcp),
        })
    };
    let token = opts.token.clone();
    Ok(Factory::new(
        store,
        token,
        world.rank,
        timeout,
        abort,
        Box::new(transports),
    )?)
}

/// Join a multi-rank job's rendezvous.
pub fn join_rendezvous(world: &World, plan: &Plan, opts: &JoinOptions) -> Result<Rendezvous> {
    rendezvous_with(world, plan.timeout, opts.token.as_deref()).with_context(|| {
        format!(
            "joining the rendezvous store served by rank 0 at {}:{}",
            world.master_addr, world.master_port
        )
    })
}

/// `local_ranks`: ranks on this machine, which decides how a waiting rank may use its core.
fn comm_config(plan: &Plan, abort: &Abort, local_ranks: usize) -> CommConfig {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    CommConfig {
        timeout: plan.timeout,
        abort: abort.clone(),
        ..CommConfig::default()
    }
    .for_cores(local_ranks, cores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_follow_hostnames() {
        let hosts = ["b.example", "a", "b.example", "c", "a"];
        assert_eq!(node_map(hosts.into_iter()), vec![0, 1, 0, 2, 1]);
        assert_eq!(node_map(["x"; 3].into_iter()), vec![0, 0, 0]);
    }
}

/// Ranks started with different flags or binaries: a usage error (exit 2) that names each
/// flag that differs and its value on both sides.
#[derive(Debug)]
pub struct FlagsDiffer(String);

impl FlagsDiffer {
    fn new(rank: usize, mine: &str, others: &[(usize, String)]) -> FlagsDiffer {
        let ranks: Vec<usize> = others.iter().map(|(r, _)| *r).collect();
        let mut msg = format!(
            "ranks {ranks:?} run with different flags or another busbw version than rank {rank}:"
        );
        // The first few ranks are enough to see the pattern.
        for (r, theirs) in others.iter().take(4) {
            for (flag, here, there) in crate::plan::fingerprint_diff(mine, theirs) {
                msg += &format!("\n  {flag}: {here} on rank {rank}, {there} on rank {r}");
            }
        }
        if others.len() > 4 {
            msg += &format!("\n  ... and {} more ranks", others.len() - 4);
        }
        msg += "\nstart every rank with the same command line and binary";
        FlagsDiffer(msg)
    }
}

impl std::fmt::Display for FlagsDiffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FlagsDiffer {}
