//! A rank's transports, chosen from `--transport` as NCCL chooses (shared memory, then RDMA,
//! then TCP, the first that reaches a peer): one definition for the job's communicator and
//! the groups' sub-communicators, so both always choose alike.

use crate::error::{Context, Error, OrSetup, Result};
use crate::subcomm::{BoxError, Factory};
use crate::JoinOptions;
use busbw_launchers::{Store, World};
use busbw_transports::multi::{Member, MultiTransport, NodeId, TransportKind};
use busbw_transports::shm::{ShmConfig, ShmTransport};
use busbw_transports::tcp::{TcpConfig, TcpTransport};
use busbw_transports::verbs::{self, VerbsConfig};
use busbw_transports::{Abort, Identity, Transport};
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

/// Where this rank's TCP listens and how many sockets its connections use: one value for the
/// job's communicator and the groups' sub-communicators.
#[derive(Clone, Copy, Debug)]
pub struct TcpSetup {
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
pub fn check_socket_threads(threads: usize, socks_per_thread: usize) -> Result<(), String> {
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
pub fn local_address(world: &World, ifname: Option<&str>) -> Result<(IpAddr, Option<IpAddr>)> {
    if let Some(spec) = ifname {
        let i = busbw_transports::iface::select(spec).map_err(Error::Setup)?;
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
        .or_setup(|| format!("MASTER_ADDR {} resolves to no address", world.master_addr))?;
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    sock.connect(first)
        .with_context(|| format!("finding the interface that routes to {first}"))?;
    let ip = sock.local_addr()?.ip();
    Ok((IpAddr::V4(Ipv4Addr::UNSPECIFIED), Some(ip)))
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
pub fn group_factory(
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
        let verbs = for_rank(
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
    // Device buffers of one host's ranks go GPU to GPU in a group as in the job (the
    // session's rule for the job's communicator).
    let map_peers = device_buffers && matches!(kind, TransportKind::Shm | TransportKind::Auto);
    Ok(Factory::new(
        store,
        token,
        world.rank,
        timeout,
        abort,
        Box::new(transports),
    )?
    .map_peers(map_peers))
}

/// [`group_factory`] for a joined session's plan: the session's store (a store of its own
/// for a job without one), its abort, the plan's transport, timeout and buffers.
pub fn session_factory(
    session: &crate::Session,
    world: &World,
    opts: &JoinOptions,
    plan: &busbw_measure::Plan,
) -> Result<Factory> {
    let store: Arc<dyn Store> = match &session.rdv {
        Some(r) => r.store.clone(),
        None => Arc::new(busbw_launchers::MemoryStore::new()),
    };
    group_factory(
        world,
        store,
        opts,
        plan.transport,
        plan.timeout,
        session.abort.clone(),
        plan.gpus > 0,
    )
}

/// `NCCL_IB_*` from the environment, `--ib-hca` (which clap also fills from `NCCL_IB_HCA`).
pub fn config(
    ib_hca: Option<&str>,
    local_rank: usize,
    timeout: Duration,
) -> Result<VerbsConfig, String> {
    let mut cfg = VerbsConfig::from_env(|k| {
        if k == "NCCL_IB_HCA" {
            ib_hca.map(str::to_string)
        } else {
            std::env::var(k).ok()
        }
    })?;
    cfg.local_rank = local_rank;
    cfg.stall_timeout = timeout;
    Ok(cfg)
}

/// The verbs member of a rank's transports for `--transport` `mode` (`auto`: when usable,
/// `verbs`: required; otherwise none), with its device-line description. `device_buffers`
/// (`-g`): the eager path is turned off, since its ring is host memory and a receive into
/// device memory cannot be served from it; every rank has the same flags, so all agree.
#[allow(clippy::too_many_arguments)]
pub fn for_rank(
    mode: TransportKind,
    device_buffers: bool,
    ib_hca: Option<&str>,
    local_rank: usize,
    timeout: Duration,
    identity: busbw_transports::Identity,
    bind: std::net::IpAddr,
    advertise: Option<std::net::IpAddr>,
) -> Result<Option<(Member, String)>> {
    let required = mode == TransportKind::Verbs;
    // NCCL_IB_DISABLE=1 keeps NCCL off RDMA; it keeps `auto` off it too.
    let disabled = std::env::var("NCCL_IB_DISABLE").is_ok_and(|v| v.trim() == "1");
    if !(required || (mode == TransportKind::Auto && verbs::BUILT && !disabled)) {
        return Ok(None);
    }
    let mut cfg = config(ib_hca, local_rank, timeout).map_err(Error::Setup)?;
    if device_buffers {
        cfg.eager = 0;
    }
    match verbs::open(identity, cfg, bind, advertise) {
        Ok((transport, desc)) => Ok(Some((
            Member {
                transport,
                same_node_only: false,
            },
            desc,
        ))),
        Err(e) if required => {
            Err(Error::from(e)).context("--transport verbs: opening this rank's RDMA port")
        }
        Err(e) => {
            // Silence on hosts without RDMA; a host that has devices but cannot use them
            // should say why its traffic goes over TCP.
            let has_devices = verbs::sysfs::Sysfs::default()
                .devices()
                .is_ok_and(|d| !d.is_empty());
            if has_devices {
                eprintln!(
                    "busbw: rank {}: RDMA devices present but not used ({e}); TCP carries the \
                     traffic between hosts (see `busbw doctor`)",
                    identity.rank
                );
            }
            Ok(None)
        }
    }
}
