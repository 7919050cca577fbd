//! Several transports behind one: each connection uses the first transport, in priority
//! order, that can reach the peer (NCCL's `canConnect` walk: shared memory for a rank on the
//! same host, the network otherwise).
//!
//! The handle carries the listener's node identity (host name and boot id, as NCCL's host
//! hash does) and every member transport's own handle under the member's name, so the
//! connecting side decides alone, and ranks whose member lists differ (one host has a usable
//! RDMA port, the other not) still agree: a member is used only when both ends have it. The
//! listener accepts on all members.

use crate::{
    Handle, Identity, Listener, Properties, RecvComm, Registration, Result, SendComm, Transport,
    TransportError,
};
use std::fmt;

mod route;
pub use route::Router;
use std::time::{Duration, Instant};

/// Where a rank runs: its host name and the kernel's boot id, written `host/boot` in handles
/// and in the rendezvous store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeId {
    pub host: String,
    pub boot: String,
}

impl NodeId {
    pub fn new(host: impl Into<String>, boot: impl Into<String>) -> NodeId {
        NodeId {
            host: host.into(),
            boot: boot.into(),
        }
    }

    /// This process's node, under the host name the launcher gave it. Where the platform
    /// knows no boot id the host name alone tells nodes apart (the boot id is then empty).
    pub fn here(hostname: &str) -> NodeId {
        let boot = crate::platform::Platform::active()
            .boot_id()
            .unwrap_or_default();
        NodeId::new(hostname, boot)
    }

    /// Ranks that may share memory (and reach each other's abstract unix sockets): the same
    /// host name on the same running kernel.
    pub fn same_node(&self, other: &NodeId) -> bool {
        self == other
    }

    /// Ranks that share this machine's cores: the same running kernel, which network
    /// namespaces and containers on one machine share even where their host names differ (a
    /// simulated cluster).
    pub fn same_machine(&self, other: &NodeId) -> bool {
        // No boot id (a platform without one): hosts of different names are different
        // machines, as far as anyone can tell.
        if self.boot.is_empty() || other.boot.is_empty() {
            return self == other;
        }
        self.boot == other.boot
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.host, self.boot)
    }
}

impl std::str::FromStr for NodeId {
    type Err = String;
    /// The boot id has no `/`; a host name might (it is whatever the launcher said).
    fn from_str(s: &str) -> std::result::Result<NodeId, String> {
        let (host, boot) = s
            .rsplit_once('/')
            .ok_or_else(|| format!("{s:?} is not a node id (host/boot)"))?;
        Ok(NodeId::new(host, boot))
    }
}

/// Which transports a job may use (`--transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Every transport this build has, each peer reached by the first that can, in
    /// [`TransportKind::PRIORITY`] order.
    Auto,
    Tcp,
    Shm,
    Verbs,
}

impl TransportKind {
    /// Every value, as `--transport` spells it.
    pub const NAMES: [&'static str; 4] = ["auto", "tcp", "shm", "verbs"];
    /// NCCL's order of preference: shared memory, then RDMA, then sockets.
    pub const PRIORITY: [TransportKind; 3] =
        [TransportKind::Shm, TransportKind::Verbs, TransportKind::Tcp];

    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Verbs => "verbs",
        }
    }

    /// Where the transport named `name` (a [`Properties::name`]) stands in
    /// [`TransportKind::PRIORITY`]; names outside it sort last.
    pub fn rank_of(name: &str) -> usize {
        Self::PRIORITY
            .iter()
            .position(|k| k.name() == name)
            .unwrap_or(Self::PRIORITY.len())
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<TransportKind, String> {
        [
            TransportKind::Auto,
            TransportKind::Tcp,
            TransportKind::Shm,
            TransportKind::Verbs,
        ]
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| {
            format!(
                "unknown transport {s:?} (one of {})",
                Self::NAMES.join(", ")
            )
        })
    }
}

/// A member transport and the locality it needs.
pub struct Member {
    pub transport: Box<dyn Transport>,
    /// Only for peers on the same node (shared memory).
    pub same_node_only: bool,
}

pub struct MultiTransport {
    members: Vec<Member>,
    router: Router,
}

impl MultiTransport {
    /// `members` in priority order; `node` is this rank's.
    pub fn new(members: Vec<Member>, node: &NodeId) -> Result<Self> {
        if members.is_empty() {
            return Err(TransportError::Unsupported(
                "no transport to choose from".into(),
            ));
        }
        let router = Router {
            members: members
                .iter()
                .map(|m| (m.transport.properties().name, m.same_node_only))
                .collect(),
            node: node.to_string(),
        };
        Ok(MultiTransport { members, router })
    }

    /// Name of the transport a connection to `handle` would use (for reports).
    pub fn route(&self, handle: &Handle) -> Result<&'static str> {
        self.router.route(handle)
    }

    /// Index (in priority order) of the member a connection to `handle` would use.
    pub fn route_index(&self, handle: &Handle) -> Result<usize> {
        self.router.route_index(handle)
    }

    /// The routing rule, to check peers this transport will connect to later.
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// The peer's handle for member `i`.
    /// The member that reaches the peer behind `handle`, and that member's handle of it.
    fn member_for(&self, handle: &Handle) -> Result<(&dyn Transport, Handle)> {
        let (node, subs) = decode(handle)?;
        let i = self.router.pick(&node, &subs)?;
        Ok((&*self.members[i].transport, self.sub(&subs, i)?.clone()))
    }

    fn sub<'a>(&self, subs: &'a [(String, Handle)], i: usize) -> Result<&'a Handle> {
        let name = self.router.members[i].0;
        subs.iter()
            .find(|(n, _)| n == name)
            .map(|(_, h)| h)
            .ok_or_else(|| TransportError::BadHandle(format!("missing {name} handle")))
    }
}

/// Handle layout: `busbw-multi/2\n<node>\n` then per member `<name> <len>\n<bytes>`.
fn encode(node: &str, subs: &[(&str, Handle)]) -> Handle {
    let mut v = format!("busbw-multi/2\n{node}\n").into_bytes();
    for (name, h) in subs {
        v.extend_from_slice(format!("{name} {}\n", h.0.len()).as_bytes());
        v.extend_from_slice(&h.0);
    }
    Handle(v)
}

fn decode(h: &Handle) -> Result<(String, Vec<(String, Handle)>)> {
    let bad = |why: &str| TransportError::BadHandle(format!("multi-transport handle: {why}"));
    let mut rest =
        h.0.strip_prefix(b"busbw-multi/2\n".as_slice())
            .ok_or_else(|| bad("wrong prefix (another busbw version?)"))?;
    let line = |rest: &mut &[u8]| -> Result<String> {
        let end = rest
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| bad("truncated"))?;
        let s = std::str::from_utf8(&rest[..end])
            .map_err(|_| bad("not UTF-8"))?
            .to_string();
        *rest = &rest[end + 1..];
        Ok(s)
    };
    let node = line(&mut rest)?;
    let mut subs = Vec::new();
    while !rest.is_empty() {
        let head = line(&mut rest)?;
        let (name, len) = head.split_once(' ').ok_or_else(|| bad("no member name"))?;
        let len: usize = len.parse().map_err(|_| bad("bad length"))?;
        if len > rest.len() {
            return Err(bad("length past the end"));
        }
        subs.push((name.to_string(), Handle(rest[..len].to_vec())));
        rest = &rest[len..];
    }
    Ok((node, subs))
}

impl Transport for MultiTransport {
    fn properties(&self) -> Properties {
        // The network member (the last) describes the job's reach; reports name the member
        // each connection used.
        let mut p = self.members[self.members.len() - 1].transport.properties();
        p.name = "multi";
        // One registration serves every member, so only what all of them can move directly
        // may skip staging (shared memory cannot take device memory even where verbs can).
        for m in &self.members {
            let q = m.transport.properties().ptr_support;
            p.ptr_support.host &= q.host;
            p.ptr_support.cuda &= q.cuda;
            p.ptr_support.dmabuf &= q.dmabuf;
        }
        p
    }

    fn identity(&self) -> Identity {
        self.members[0].transport.identity()
    }

    fn listen(&self) -> Result<(Handle, Box<dyn Listener>)> {
        let mut subs = Vec::with_capacity(self.members.len());
        let mut listeners = Vec::with_capacity(self.members.len());
        for m in &self.members {
            let (h, l) = m.transport.listen()?;
            subs.push((m.transport.properties().name, h));
            listeners.push(l);
        }
        Ok((
            encode(&self.router.node, &subs),
            Box::new(MultiListener { listeners, next: 0 }),
        ))
    }

    fn connect(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
    ) -> Result<Box<dyn SendComm>> {
        let (member, sub) = self.member_for(handle)?;
        member.connect(&sub, channel, timeout)
    }

    fn duplex(&self, handle: &Handle) -> bool {
        self.member_for(handle)
            .is_ok_and(|(member, sub)| member.duplex(&sub))
    }

    fn connect_duplex(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
    ) -> Result<(Box<dyn SendComm>, Box<dyn RecvComm>)> {
        let (member, sub) = self.member_for(handle)?;
        member.connect_duplex(&sub, channel, timeout)
    }

    fn register(&self, region: crate::MemRegion) -> Result<Registration> {
        // Every member registers; at most one (verbs) uses keys, TCP and shared memory return
        // 0, so the key that is not 0 is the one the connections that need one will read.
        let mut key = 0;
        for (i, m) in self.members.iter().enumerate() {
            let r = match m.transport.register(region) {
                Ok(r) => r,
                Err(e) => {
                    // Device memory one member refuses must not stay registered (pinned) on
                    // the members before it: the caller stages instead and never releases it.
                    for done in &self.members[..i] {
                        let _ = done.transport.deregister(Registration { region, key });
                    }
                    return Err(e);
                }
            };
            if r.key != 0 {
                key = r.key;
            }
        }
        Ok(Registration { region, key })
    }

    fn deregister(&self, registration: Registration) -> Result<()> {
        for m in &self.members {
            m.transport.deregister(Registration {
                region: registration.region,
                key: registration.key,
            })?;
        }
        Ok(())
    }
}

struct MultiListener {
    listeners: Vec<Box<dyn Listener>>,
    next: usize,
}

/// Slice each member listener gets before the next one is tried.
const SLICE: Duration = Duration::from_millis(5);

impl Listener for MultiListener {
    fn accept(&mut self, timeout: Duration) -> Result<Box<dyn RecvComm>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TransportError::Timeout {
                    secs: timeout.as_secs_f64(),
                    what: "waiting for a peer to connect".into(),
                });
            }
            let i = self.next % self.listeners.len();
            self.next = self.next.wrapping_add(1);
            match self.listeners[i].accept(left.min(SLICE)) {
                Ok(c) => return Ok(c),
                Err(TransportError::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::{TcpConfig, TcpTransport};
    use crate::MemRegion;
    use std::sync::atomic::{AtomicIsize, Ordering};
    use std::sync::Arc;

    /// TCP under another name: a second network member, or (with `held`) one that takes
    /// device memory as verbs with GPUDirect does and counts what it holds registered.
    struct Wrapped {
        tcp: TcpTransport,
        name: &'static str,
        held: Option<Arc<AtomicIsize>>,
    }

    impl Wrapped {
        fn new(id: Identity, name: &'static str, held: Option<Arc<AtomicIsize>>) -> Self {
            let tcp = TcpTransport::new(id, TcpConfig::default());
            Wrapped { tcp, name, held }
        }
    }

    impl Transport for Wrapped {
        fn properties(&self) -> Properties {
            let mut p = self.tcp.properties();
            p.name = self.name;
            p.ptr_support.cuda = self.held.is_some();
            p
        }
        fn listen(&self) -> Result<(Handle, Box<dyn Listener>)> {
            self.tcp.listen()
        }
        fn identity(&self) -> Identity {
            self.tcp.identity()
        }
        fn connect(&self, h: &Handle, c: u32, t: Duration) -> Result<Box<dyn SendComm>> {
            self.tcp.connect(h, c, t)
        }
        fn register(&self, region: MemRegion) -> Result<Registration> {
            match &self.held {
                Some(h) => {
                    h.fetch_add(1, Ordering::Relaxed);
                    Ok(Registration { region, key: 7 })
                }
                None => self.tcp.register(region),
            }
        }
        fn deregister(&self, r: Registration) -> Result<()> {
            match &self.held {
                Some(h) => {
                    h.fetch_sub(1, Ordering::Relaxed);
                    Ok(())
                }
                None => self.tcp.deregister(r),
            }
        }
    }

    #[test]
    fn node_ids_and_transport_kinds_read_back_what_they_write() {
        let n: NodeId = "pod-3.ns/x/1b2c".parse().unwrap();
        assert_eq!(n, NodeId::new("pod-3.ns/x", "1b2c"));
        assert_eq!(n.to_string(), "pod-3.ns/x/1b2c");
        assert!("nohost".parse::<NodeId>().is_err());
        let ns = NodeId::new("other-name", "1b2c");
        assert!(n.same_machine(&ns) && !n.same_node(&ns));
        for name in TransportKind::NAMES {
            assert_eq!(name.parse::<TransportKind>().unwrap().to_string(), name);
        }
        assert!("ib"
            .parse::<TransportKind>()
            .unwrap_err()
            .contains("auto, tcp, shm, verbs"));
        let mut routes = vec!["tcp", "inproc", "shm", "verbs"];
        routes.sort_by_key(|n| TransportKind::rank_of(n));
        assert_eq!(routes, ["shm", "verbs", "tcp", "inproc"]);
    }

    #[test]
    fn handle_round_trip() {
        let subs = vec![
            ("shm", Handle(b"abc\n\x00".to_vec())),
            ("verbs", Handle(vec![])),
            ("tcp", Handle(vec![1; 300])),
        ];
        let h = encode("node7/boot", &subs);
        let (node, back) = decode(&h).unwrap();
        assert_eq!(node, "node7/boot");
        let want: Vec<(String, Handle)> =
            subs.into_iter().map(|(n, h)| (n.to_string(), h)).collect();
        assert_eq!(back, want);
        assert!(decode(&Handle(b"busbw-multi/2\nx\ntcp 99\nab".to_vec())).is_err());
        assert!(decode(&Handle(b"busbw-multi/2\nx\n5\nabcde".to_vec())).is_err());
        assert!(decode(&Handle(b"busbw-multi/1\nx\n".to_vec())).is_err());
        assert!(decode(&Handle(b"nope".to_vec())).is_err());
    }

    /// A network member only one side has (a usable RDMA port on one host only) is skipped:
    /// the pair falls back to the member both have.
    #[test]
    fn members_only_one_side_has_are_not_used() {
        let net = |rank, fancy: bool| {
            let id = Identity::new(5, rank);
            let mut m = vec![];
            if fancy {
                m.push(Member {
                    transport: Box::new(Wrapped::new(id, "fancy", None)),
                    same_node_only: false,
                });
            }
            m.push(Member {
                transport: Box::new(TcpTransport::new(id, TcpConfig::default())),
                same_node_only: false,
            });
            MultiTransport::new(m, &NodeId::new(format!("host-{rank}"), "b")).unwrap()
        };
        let (with, without) = (net(0, true), net(1, false));
        let (h_with, _l0) = with.listen().unwrap();
        let (h_without, _l1) = without.listen().unwrap();
        assert_eq!(without.route(&h_with).unwrap(), "tcp");
        assert_eq!(with.route(&h_without).unwrap(), "tcp");
        let (h_with2, _l2) = net(2, true).listen().unwrap();
        assert_eq!(
            with.route(&h_with2).unwrap(),
            "fancy",
            "both have it: first in priority"
        );
    }

    fn rank(node: &str, rank: u32) -> MultiTransport {
        use crate::inproc::InprocTransport;
        let id = Identity::new(5, rank);
        MultiTransport::new(
            vec![
                Member {
                    transport: Box::new(InprocTransport::new(id)),
                    same_node_only: true,
                },
                Member {
                    transport: Box::new(TcpTransport::new(id, TcpConfig::default())),
                    same_node_only: false,
                },
            ],
            &NodeId::new(node, "b"),
        )
        .unwrap()
    }

    /// Same node: the same-node member; another node: the network member; and the bytes
    /// arrive either way.
    #[test]
    fn routes_by_node_and_delivers() {
        use crate::MemoryKind;
        let a = rank("host-a", 0);
        let (h, mut l) = a.listen().unwrap();
        for (node, want) in [("host-a", "inproc"), ("host-b", "tcp")] {
            let b = rank(node, 1);
            assert_eq!(b.route(&h).unwrap(), want);
            let mut s = b.connect(&h, 0, Duration::from_secs(5)).unwrap();
            let mut r = l.accept(Duration::from_secs(5)).unwrap();
            assert_eq!(r.peer(), 1);
            let src = [7u8; 64];
            let mut dst = [0u8; 64];
            let sreg = b
                .register(unsafe { MemRegion::new(src.as_ptr() as *mut u8, 64, MemoryKind::Host) })
                .unwrap();
            let rreg = a
                .register(unsafe { MemRegion::new(dst.as_mut_ptr(), 64, MemoryKind::Host) })
                .unwrap();
            let rid = unsafe { r.irecv(&rreg, dst.as_mut_ptr(), 64, 9) }.unwrap();
            let sid = unsafe { s.isend(&sreg, src.as_ptr(), 64, 9) }.unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            let (mut sd, mut rd) = (false, false);
            while !(sd && rd) {
                assert!(Instant::now() < deadline, "{node}: transfer timed out");
                sd = sd || s.test(sid).unwrap().is_some();
                rd = rd || r.test(rid).unwrap().is_some();
            }
            assert_eq!(dst, src, "{node}");
        }
        let only_local = MultiTransport::new(
            vec![Member {
                transport: Box::new(crate::inproc::InprocTransport::new(Identity::new(5, 2))),
                same_node_only: true,
            }],
            &NodeId::new("host-c", "b"),
        )
        .unwrap();
        let e = only_local.route(&h).unwrap_err().to_string();
        assert!(e.contains("another host"), "{e}");
    }

    /// A member that takes device memory (as verbs with GPUDirect does) next to one that
    /// cannot: the multi transport advertises no device support, and a refused registration
    /// leaves nothing registered on the member that had accepted it.
    #[test]
    fn device_memory_needs_every_member_and_a_refusal_releases_the_others() {
        use crate::MemoryKind;
        let id = Identity::new(5, 0);
        let held = Arc::new(AtomicIsize::new(0));
        let m = MultiTransport::new(
            vec![
                Member {
                    transport: Box::new(Wrapped::new(id, "gpu", Some(held.clone()))),
                    same_node_only: true,
                },
                Member {
                    transport: Box::new(TcpTransport::new(id, TcpConfig::default())),
                    same_node_only: false,
                },
            ],
            &NodeId::new("host-a", "b"),
        )
        .unwrap();
        let p = m.properties().ptr_support;
        assert!(p.host && !p.cuda && !p.dmabuf, "{p:?}");
        // SAFETY: never dereferenced.
        let dev = unsafe { MemRegion::new(0x1000 as *mut u8, 64, MemoryKind::Cuda { device: 0 }) };
        match m.register(dev) {
            Err(TransportError::DeviceMemory {
                transport: "tcp", ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(
            held.load(Ordering::Relaxed),
            0,
            "the accepting member was released"
        );
        let mut host = [0u8; 64];
        let r = m
            .register(unsafe { MemRegion::new(host.as_mut_ptr(), 64, MemoryKind::Host) })
            .unwrap();
        assert_eq!((r.key, held.load(Ordering::Relaxed)), (7, 1));
        m.deregister(r).unwrap();
        assert_eq!(held.load(Ordering::Relaxed), 0);
    }
}
