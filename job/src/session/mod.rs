//! One rank's membership in a job: rendezvous, configuration agreement, transport and
//! communicator. Everything here that waits is bounded by `-T`.

use crate::error::{Context, Error, OrSetup, Result};
use crate::transport::{local_address, multi_transport, tcp_transport, TcpSetup};
use book::StoreBook;
use busbw_collectives::{CommConfig, Communicator};
use busbw_launchers::bootstrap::{self, Bootstrap, BootstrapError, Joined, Layout, Record};
use busbw_launchers::{rendezvous_with, token_digest, RankInfo, Rendezvous, World};
use busbw_measure::device::GpuLine;
use busbw_measure::Plan;
use busbw_reports::DeviceInfo;
use busbw_transports::inproc::InprocTransport;
use busbw_transports::multi::{MultiTransport, NodeId, TransportKind};
use busbw_transports::{Abort, Handle, Identity, Transport};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

mod book;
mod flags;

pub use flags::FlagsDiffer;

/// What a failed rank gives the store for everything it still says there (the hang diagnosis,
/// the abort, checking out, rank 0's linger) before it exits anyway: enough for a reachable
/// store (the diagnosis window of 1.5 s and rank 0's 2 s linger), short beside `-T` for a rank
/// cut off from rank 0.
pub const LEAVING: Duration = Duration::from_secs(6);

pub struct Session {
    pub comm: Communicator,
    pub rdv: Option<Rendezvous>,
    pub abort: Abort,
    /// Every rank's device line, on rank 0 only.
    pub devices: Vec<DeviceInfo>,
    /// `--transport` as given (`auto`, `tcp`, `shm`), or `inproc` for a one-rank job.
    pub transport_name: String,
    /// The host names of this rank and of the peers it looked up at start (its ring and tree
    /// neighbours): an error about a peer names its host ([`Session::host_of`]).
    hosts: HashMap<usize, String>,
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
    pub fn tcp(&self, (bind, advertise): (IpAddr, Option<IpAddr>)) -> TcpSetup {
        TcpSetup {
            bind,
            advertise,
            threads: self.socket_nthreads,
            socks_per_thread: self.nsocks_perthread,
        }
    }
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
        .or_setup(|| format!("malformed {what} in the rendezvous store"))
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
            hosts: HashMap::from([(0, world.hostname.clone())]),
        })
    }

    /// Join a multi-rank job. `rdv` is created by the caller so that it can post an abort
    /// if anything here fails.
    pub fn join(world: World, rdv: Rendezvous, plan: &Plan, opts: &JoinOptions) -> Result<Session> {
        match Self::join_inner(&world, &rdv, plan, opts) {
            Ok(b) => Ok(Session {
                comm: b.comm,
                rdv: Some(rdv),
                abort: b.abort,
                devices: b.devices,
                transport_name: plan.transport.to_string(),
                hosts: b.hosts,
            }),
            Err(e) => {
                rdv.hurry(LEAVING);
                let _ = rdv.post_abort(&format!(
                    "rank {} on {} failed to join: {}",
                    world.rank,
                    world.hostname,
                    busbw_measure::chain(&e)
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
    /// the store (`bootstrap`: each rank fetches the node map and its neighbours' records,
    /// rank 0 alone every rank's), and build the communicator from what came back.
    fn join_inner(
        world: &World,
        rdv: &Rendezvous,
        plan: &Plan,
        opts: &JoinOptions,
    ) -> Result<JoinedRank> {
        let boot = Bootstrap::new(rdv.store.clone(), world.rank, world.size, plan.timeout);
        let job = agree(world, rdv, &boot, plan, opts)?;
        let end = Endpoint::open(world, plan, opts, job)?;
        let peers = exchange(world, &boot, plan, &end)?;
        build(world, rdv, plan, end, peers)
    }

    /// The host rank `peer` runs on, for a message about it: known for the peers this rank
    /// looked up at start, else read from the peer's record (an error path: one fetch).
    pub fn host_of(&self, peer: usize) -> Option<String> {
        if let Some(h) = self.hosts.get(&peer) {
            return Some(h.clone());
        }
        let store = &self.rdv.as_ref()?.store;
        let record = store.get(&format!("{}/{peer}", bootstrap::INFO)).ok()??;
        RankInfo::host_of(&record)
    }

    /// Puts every rank's GPU into the `Using devices` lines (rank 0's copy): each rank's
    /// [`GpuLine`] gathered to rank 0, since ranks on other hosts see other devices and only
    /// rank 0 prints them.
    pub fn publish_gpu(&mut self, line: &GpuLine, timeout: std::time::Duration) -> Result<()> {
        let (rank, size) = (self.comm.rank(), self.comm.size());
        let lines: Vec<Option<GpuLine>> = match &self.rdv {
            Some(r) => {
                let boot = Bootstrap::new(r.store.clone(), rank, size, timeout);
                match boot.gather_root("gpu", line.encode().as_bytes())? {
                    Some(all) => all
                        .iter()
                        .map(|b| GpuLine::decode(&String::from_utf8_lossy(b)))
                        .collect(),
                    None => return Ok(()),
                }
            }
            None => vec![Some(line.clone())],
        };
        for (d, l) in self.devices.iter_mut().zip(lines) {
            let l = l.or_setup(|| format!("rank {} sent a malformed device line", d.rank))?;
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

    /// Every rank's objection to running the sweep (`mine` is this rank's), the same list on
    /// every rank: see [`Bootstrap::objections`]. Without a store, this rank's alone.
    pub fn objections(
        &self,
        mine: Option<&str>,
        timeout: std::time::Duration,
    ) -> Result<Vec<(usize, String)>> {
        let (rank, size) = (self.comm.rank(), self.comm.size());
        match &self.rdv {
            Some(r) => Ok(Bootstrap::new(r.store.clone(), rank, size, timeout)
                .objections("usage", mine)
                .context("agreeing whether every rank can run the sweep")?),
            None => Ok(mine.map(|m| (rank, m.to_string())).into_iter().collect()),
        }
    }

    /// Check out of the job (rank 0 keeps serving the store until everyone has).
    pub fn finish(&self) -> Result<()> {
        if let Some(r) = &self.rdv {
            r.finish()?;
        }
        Ok(())
    }
}

/// Agreement: the job id every data connection carries (rank 0 draws it, the token is mixed
/// in), and the same flags and the same busbw on every rank, or a usage error naming what
/// differs (rank 0 compares every rank's fingerprint with its own; the others read its
/// verdict).
fn agree(
    world: &World,
    rdv: &Rendezvous,
    boot: &Bootstrap,
    plan: &Plan,
    opts: &JoinOptions,
) -> Result<u64> {
    let store = &rdv.store;
    if world.rank == 0 {
        store.set("job", job_token().to_string().as_bytes())?;
    }
    let job = parse_u64(&store.wait(&["job"], plan.timeout)?[0], "job token")?
        ^ opts.token.as_deref().map(token_digest).unwrap_or(0);
    boot.agree(&plan.fingerprint()).map_err(|e| match e {
        BootstrapError::Disagree(d) => Error::Flags(FlagsDiffer::new(&d)),
        e => Error::Context {
            what: "waiting for every rank to publish its configuration".into(),
            source: Box::new(e.into()),
        },
    })?;
    Ok(job)
}

/// This rank's end of the job: its transports, its listener, and what it tells the others.
struct Endpoint {
    /// `--transport tcp`'s transport, or the multi-transport of the others (kept unboxed
    /// until the routes are known: it says which member reaches each peer).
    transport: RankTransports,
    listener: Box<dyn busbw_transports::Listener>,
    handle: Handle,
    info: RankInfo,
    /// The RDMA port and GID, when this rank has a verbs member.
    verbs: Option<String>,
}

impl Endpoint {
    /// The routing rule of this rank's multi-transport; `None` for TCP alone, which reaches
    /// every peer.
    fn router(&self) -> Option<busbw_transports::multi::Router> {
        match &self.transport {
            RankTransports::Multi(m) => Some(m.router()),
            RankTransports::Tcp(_) => None,
        }
    }
}

enum RankTransports {
    Tcp(Box<dyn Transport>),
    Multi(MultiTransport),
}

impl Endpoint {
    fn open(world: &World, plan: &Plan, opts: &JoinOptions, job: u64) -> Result<Endpoint> {
        let (bind, advertise) = local_address(world, opts.socket_ifname.as_deref())?;
        let tcp = opts.tcp((bind, advertise));
        // Every data connection (the job's, and through the factory the groups') proves the
        // token.
        let identity = Identity::new(job, world.rank as u32).with_token(opts.token.as_deref());
        let node = NodeId::here(&world.hostname);
        let verbs = crate::transport::for_rank(
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
                Some(m) => RankTransports::Multi(m),
                None => RankTransports::Tcp(tcp_transport(identity, tcp)),
            };
        let (handle, listener) = match &transport {
            RankTransports::Tcp(t) => t.listen(),
            RankTransports::Multi(m) => m.listen(),
        }
        .context("opening the data listener")?;
        Ok(Endpoint {
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

/// What a rank learns of the others.
struct PeerRecords {
    layout: Layout,
    /// The peers' records: those of the first peers, and every rank's on rank 0.
    book: StoreBook,
    /// Rank 0 only: the transports each rank reaches its peers with (`shm+tcp`), for the
    /// device lines.
    routes: Option<Vec<String>>,
    hosts: HashMap<usize, String>,
}

/// Exchange through the store: publish this rank's record, learn the node map (the tree
/// chains the ranks of a node, so all must agree on it), fetch the first peers' records
/// and check that this rank's transports reach them, and tell rank 0 which ones it uses.
fn exchange(world: &World, boot: &Bootstrap, plan: &Plan, end: &Endpoint) -> Result<PeerRecords> {
    let record = Record {
        info: end.info.clone(),
        handle: end.handle.clone(),
    };
    let Joined { layout, directory } = boot
        .join(&record)
        .context("waiting for every rank's connection handle")?;
    let mut book = StoreBook::new(directory, end.router(), plan.transport);
    let first = book::first_peers(&layout.nodes, world.rank);
    book.prefetch(&first)?;
    let mut hosts = HashMap::from([(world.rank, world.hostname.clone())]);
    let mut routes: Vec<&str> = Vec::new();
    for &r in &first {
        let name = book.route(r)?;
        if !routes.contains(&name) {
            routes.push(name);
        }
        hosts.extend(book.host(r).map(|h| (r, h)));
    }
    // In priority order (shared memory first), whatever order the peers came in.
    routes.sort_by_key(|n| TransportKind::rank_of(n));
    let mut route = routes.join("+");
    if let (true, Some(d)) = (routes.contains(&"verbs"), &end.verbs) {
        // The device block names the RDMA port and GID each rank uses.
        route = format!("{route} [{d}]");
    }
    let routes = boot.gather_root("route", route.as_bytes())?.map(|all| {
        all.into_iter()
            .map(|r| String::from_utf8_lossy(&r).into_owned())
            .collect()
    });
    Ok(PeerRecords {
        layout,
        book,
        routes,
        hosts,
    })
}

/// What joining builds: the communicator, connected around the ring, the abort its waits
/// watch, rank 0's device lines and the hosts of the peers this rank looked up.
struct JoinedRank {
    comm: Communicator,
    abort: Abort,
    devices: Vec<DeviceInfo>,
    hosts: HashMap<usize, String>,
}

fn build(
    world: &World,
    rdv: &Rendezvous,
    plan: &Plan,
    end: Endpoint,
    peers: PeerRecords,
) -> Result<JoinedRank> {
    let rank = world.rank;
    let mut devices = Vec::new();
    for (r, via) in peers.routes.iter().flatten().enumerate() {
        let info = peers
            .book
            .info(r)
            .or_setup(|| format!("rank 0 lost rank {r}'s record"))?;
        let via = if via.is_empty() { "tcp" } else { via };
        devices.push(device_info(r, info.pid, &info.host, info.local_rank, via));
    }
    let abort = Abort::new();
    rdv.watch_abort(abort.clone())?;
    // Ranks that share this machine's cores decide how a waiting rank may use its core.
    let local_ranks = peers.layout.local_ranks(rank);
    let transport: Box<dyn Transport> = match end.transport {
        RankTransports::Multi(m) => Box::new(m),
        RankTransports::Tcp(t) => t,
    };
    let mut comm = Communicator::new(
        transport,
        end.listener,
        peers.book,
        comm_config(plan, &abort, local_ranks),
    )?;
    comm.set_node_map(peers.layout.nodes)?;
    busbw_collectives::connect_ring(&mut comm)?;
    Ok(JoinedRank {
        comm,
        abort,
        devices,
        hosts: peers.hosts,
    })
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
        // Local ranks that talk through shared memory may as well map each other's buffers;
        // `--transport tcp` (or verbs) between local ranks asks for that transport measured.
        map_peers: matches!(plan.transport, TransportKind::Shm | TransportKind::Auto),
        ..CommConfig::default()
    }
    .for_cores(local_ranks, cores)
}
