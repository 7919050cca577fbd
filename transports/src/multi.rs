//! Several transports behind one: each connection uses the first transport, in priority
//! order, that can reach the peer (NCCL's `canConnect` walk: shared memory for a rank on the
//! same host, the network otherwise).
//!
//! The handle carries the listener's node identity (host name and boot id, as NCCL's host
//! hash does) and every member transport's own handle, so the connecting side decides alone;
//! the listener accepts on all members.

use crate::{
    Handle, Identity, Listener, Properties, RecvComm, Registration, Result, SendComm, Transport,
    TransportError,
};
use std::time::{Duration, Instant};

/// Where a rank runs: ranks with equal node identities share memory.
pub fn node_identity(hostname: &str) -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{hostname}/{}", boot.trim())
}

/// A member transport and the locality it needs.
pub struct Member {
    pub transport: Box<dyn Transport>,
    /// Only for peers on the same node (shared memory).
    pub same_node_only: bool,
}

pub struct MultiTransport {
    members: Vec<Member>,
    node: String,
}

impl MultiTransport {
    /// `members` in priority order; `node` is this rank's [`node_identity`].
    pub fn new(members: Vec<Member>, node: String) -> Result<Self> {
        if members.is_empty() {
            return Err(TransportError::Unsupported(
                "no transport to choose from".into(),
            ));
        }
        Ok(MultiTransport { members, node })
    }

    /// Name of the transport a connection to `handle` would use (for reports).
    pub fn route(&self, handle: &Handle) -> Result<&'static str> {
        Ok(self.members[self.route_index(handle)?]
            .transport
            .properties()
            .name)
    }

    /// Index (in priority order) of the member a connection to `handle` would use.
    pub fn route_index(&self, handle: &Handle) -> Result<usize> {
        let (node, subs) = decode(handle)?;
        self.pick(&node, &subs, u32::MAX)
    }

    fn pick(&self, node: &str, subs: &[Option<Handle>], peer: u32) -> Result<usize> {
        let same = node == self.node;
        self.members
            .iter()
            .enumerate()
            .position(|(i, m)| {
                subs.get(i).is_some_and(Option::is_some) && (same || !m.same_node_only)
            })
            .ok_or_else(|| {
                TransportError::Unsupported(format!(
                    "no transport reaches rank {peer} (on {node}) from {}: {}",
                    self.node,
                    if same {
                        "the peer listens on none of ours"
                    } else {
                        "it is on another host and only same-host transports are enabled"
                    }
                ))
            })
    }
}

/// Handle layout: `busbw-multi/1\n<node>\n` then per member `<len>\n<bytes>` (len 0 = none).
fn encode(node: &str, subs: &[Option<Handle>]) -> Handle {
    let mut v = format!("busbw-multi/1\n{node}\n").into_bytes();
    for s in subs {
        let b: &[u8] = s.as_ref().map(|h| h.0.as_slice()).unwrap_or(&[]);
        v.extend_from_slice(format!("{}\n", b.len()).as_bytes());
        v.extend_from_slice(b);
    }
    Handle(v)
}

fn decode(h: &Handle) -> Result<(String, Vec<Option<Handle>>)> {
    let bad = |why: &str| TransportError::BadHandle(format!("multi-transport handle: {why}"));
    let mut rest =
        h.0.strip_prefix(b"busbw-multi/1\n".as_slice())
            .ok_or_else(|| bad("wrong prefix"))?;
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
        let len: usize = line(&mut rest)?.parse().map_err(|_| bad("bad length"))?;
        if len > rest.len() {
            return Err(bad("length past the end"));
        }
        subs.push((len > 0).then(|| Handle(rest[..len].to_vec())));
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
            subs.push(Some(h));
            listeners.push(l);
        }
        Ok((
            encode(&self.node, &subs),
            Box::new(MultiListener { listeners, next: 0 }),
        ))
    }

    fn connect(
        &self,
        handle: &Handle,
        channel: u32,
        timeout: Duration,
    ) -> Result<Box<dyn SendComm>> {
        let (node, subs) = decode(handle)?;
        let i = self.pick(&node, &subs, u32::MAX)?;
        let sub = subs[i]
            .as_ref()
            .ok_or_else(|| TransportError::BadHandle("missing member handle".into()))?;
        self.members[i].transport.connect(sub, channel, timeout)
    }

    fn register(&self, region: crate::MemRegion) -> Result<Registration> {
        // Host memory needs no registration on TCP or shared memory; device memory support
        // would register with every member and combine the keys.
        Ok(Registration { region, key: 0 })
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

    #[test]
    fn handle_round_trip() {
        let subs = vec![
            Some(Handle(b"abc\n\x00".to_vec())),
            None,
            Some(Handle(vec![1; 300])),
        ];
        let h = encode("node7/boot", &subs);
        let (node, back) = decode(&h).unwrap();
        assert_eq!(node, "node7/boot");
        assert_eq!(back, subs);
        assert!(decode(&Handle(b"busbw-multi/1\nx\n99\nab".to_vec())).is_err());
        assert!(decode(&Handle(b"nope".to_vec())).is_err());
    }

    fn rank(node: &str, rank: u32) -> MultiTransport {
        use crate::inproc::InprocTransport;
        use crate::tcp::{TcpConfig, TcpTransport};
        let id = Identity { job: 5, rank };
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
            node.into(),
        )
        .unwrap()
    }

    /// Same node: the same-node member; another node: the network member; and the bytes
    /// arrive either way.
    #[test]
    fn routes_by_node_and_delivers() {
        use crate::{MemRegion, MemoryKind};
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
                transport: Box::new(crate::inproc::InprocTransport::new(Identity {
                    job: 5,
                    rank: 2,
                })),
                same_node_only: true,
            }],
            "host-c".into(),
        )
        .unwrap();
        let e = only_local.route(&h).unwrap_err().to_string();
        assert!(e.contains("another host"), "{e}");
    }
}
