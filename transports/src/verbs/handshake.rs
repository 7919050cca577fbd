//! What the two ends of a verbs connection tell each other, as bytes.
//!
//! The listener's [`ListenInfo`] is its transport [`Handle`](crate::Handle): it travels through
//! the rendezvous store like the TCP and shared-memory handles. It names the bootstrap socket
//! (where the queue-pair handshake happens, as NCCL's IB transport does it over its
//! out-of-band socket), the device and the port's addressing. A connector then sends a
//! [`Hello`] (job token, rank, channel and its queue pairs and FIFO) and the acceptor answers
//! with a [`Reply`] (its queue pairs), after which both move their queue pairs to RTS.
//!
//! Every message starts with a magic and a version, so that a stray connection, a TCP handle
//! given to verbs or a peer running another busbw is refused with a reason instead of being
//! misread.

use std::net::SocketAddr;

const MAGIC: &[u8; 4] = b"BBWV";
/// Bumped whenever a layout below changes (2: the handle carries the job-token challenge; 3:
/// the eager ring in hello and reply).
pub const VERSION: u16 = 3;
/// Most queue pairs per connection (NCCL allows 128).
pub const MAX_QPS: usize = 128;

const KIND_HANDLE: u8 = 1;
const KIND_HELLO: u8 = 2;
const KIND_REPLY: u8 = 3;

/// How a port is addressed: enough for the peer's RTR transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAddr {
    pub gid: [u8; 16],
    pub lid: u16,
    /// Active path MTU as `ibv_mtu` (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// Whether the link layer is Ethernet (RoCE: global routing with the GID).
    pub roce: bool,
}

/// The listener's handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenInfo {
    pub rank: u32,
    pub bootstrap: SocketAddr,
    /// `mlx5_0:1`, for messages.
    pub device: String,
    pub port: PortAddr,
    /// The listener's `NCCL_IB_QPS_PER_CONNECTION`; connections use the larger of both sides.
    pub qps: u8,
    /// The listener's job-token challenge: a connector proves the token over it and its hello
    /// (the proof follows the hello frame), as tcp and shm connectors do.
    pub challenge: [u8; crate::auth::NONCE_LEN],
}

/// Connector → acceptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub job: u64,
    pub rank: u32,
    pub channel: u32,
    pub port: PortAddr,
    pub qpns: Vec<u32>,
    /// The connector's FIFO of ready-to-receive entries (registered, remote-writable).
    pub fifo_addr: u64,
    pub fifo_rkey: u32,
    pub fifo_depth: u32,
    /// Largest payload the connector would send eagerly (0: never); the acceptor may lower it.
    pub eager: u32,
}

/// Acceptor → connector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub port: PortAddr,
    pub qpns: Vec<u32>,
    /// The acceptor's eager ring: `fifo_depth` slots of [`crate::verbs::proto::EAGER_HEADER`]
    /// plus `eager` bytes; `eager` 0 means messages always wait for a ready-to-receive entry.
    pub eager: u32,
    pub eager_addr: u64,
    pub eager_rkey: u32,
}

struct W(Vec<u8>);

impl W {
    fn new(kind: u8) -> W {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&VERSION.to_le_bytes());
        v.push(kind);
        W(v)
    }
    fn u8(&mut self, x: u8) -> &mut Self {
        self.0.push(x);
        self
    }
    fn u16(&mut self, x: u16) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u32(&mut self, x: u32) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(&mut self, x: u64) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u16(b.len() as u16);
        self.0.extend_from_slice(b);
        self
    }
    fn port(&mut self, p: &PortAddr) -> &mut Self {
        self.0.extend_from_slice(&p.gid);
        self.u16(p.lid).u8(p.mtu).u8(p.roce as u8)
    }
    fn qpns(&mut self, q: &[u32]) -> &mut Self {
        self.u8(q.len() as u8);
        for n in q {
            self.u32(*n);
        }
        self
    }
}

struct R<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> R<'a> {
    fn open(b: &'a [u8], kind: u8, what: &'static str) -> Result<R<'a>, String> {
        if b.len() < 7 || &b[..4] != MAGIC {
            return Err(format!("{what}: not a busbw verbs message (bad magic)"));
        }
        let v = u16::from_le_bytes([b[4], b[5]]);
        if v != VERSION {
            return Err(format!(
                "{what}: busbw verbs protocol {v} where {VERSION} is spoken (mixed busbw versions?)"
            ));
        }
        if b[6] != kind {
            return Err(format!("{what}: wrong message kind {}", b[6]));
        }
        Ok(R { b: &b[7..], what })
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.b.len() < n {
            return Err(format!("{}: truncated", self.what));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn text(&mut self) -> Result<String, String> {
        let what = self.what;
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| format!("{what}: text not UTF-8"))
    }
    fn port(&mut self) -> Result<PortAddr, String> {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(self.take(16)?);
        let lid = self.u16()?;
        let mtu = self.u8()?;
        if !(1..=5).contains(&mtu) {
            return Err(format!("{}: path MTU code {mtu} is not 1..5", self.what));
        }
        let roce = match self.u8()? {
            0 => false,
            1 => true,
            x => return Err(format!("{}: bad link-layer flag {x}", self.what)),
        };
        Ok(PortAddr {
            gid,
            lid,
            mtu,
            roce,
        })
    }
    fn qpns(&mut self) -> Result<Vec<u32>, String> {
        let n = self.u8()? as usize;
        if n == 0 || n > MAX_QPS {
            return Err(format!("{}: {n} queue pairs (1..{MAX_QPS})", self.what));
        }
        (0..n).map(|_| self.u32()).collect()
    }
    fn end(&self) -> Result<(), String> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: {} trailing bytes", self.what, self.b.len()))
        }
    }
}

impl ListenInfo {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W::new(KIND_HANDLE);
        w.u32(self.rank)
            .bytes(self.bootstrap.to_string().as_bytes())
            .bytes(self.device.as_bytes())
            .port(&self.port)
            .u8(self.qps)
            .bytes(&self.challenge);
        w.0
    }
    pub fn decode(b: &[u8]) -> Result<ListenInfo, String> {
        let mut r = R::open(b, KIND_HANDLE, "verbs handle")?;
        let rank = r.u32()?;
        let bootstrap = r
            .text()?
            .parse()
            .map_err(|_| "verbs handle: bad bootstrap address".to_string())?;
        let device = r.text()?;
        let port = r.port()?;
        let qps = r.u8()?;
        if qps == 0 || qps as usize > MAX_QPS {
            return Err(format!("verbs handle: {qps} queue pairs per connection"));
        }
        let challenge = r.bytes()?.try_into().map_err(|_| {
            "verbs handle: the job-token challenge has the wrong length".to_string()
        })?;
        r.end()?;
        Ok(ListenInfo {
            rank,
            bootstrap,
            device,
            port,
            qps,
            challenge,
        })
    }
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W::new(KIND_HELLO);
        w.u64(self.job)
            .u32(self.rank)
            .u32(self.channel)
            .port(&self.port)
            .qpns(&self.qpns)
            .u64(self.fifo_addr)
            .u32(self.fifo_rkey)
            .u32(self.fifo_depth)
            .u32(self.eager);
        w.0
    }
    pub fn decode(b: &[u8]) -> Result<Hello, String> {
        let mut r = R::open(b, KIND_HELLO, "verbs hello")?;
        let h = Hello {
            job: r.u64()?,
            rank: r.u32()?,
            channel: r.u32()?,
            port: r.port()?,
            qpns: r.qpns()?,
            fifo_addr: r.u64()?,
            fifo_rkey: r.u32()?,
            fifo_depth: r.u32()?,
            eager: r.u32()?,
        };
        if !h.fifo_depth.is_power_of_two() {
            return Err(format!(
                "verbs hello: FIFO depth {} is not a power of two",
                h.fifo_depth
            ));
        }
        r.end()?;
        Ok(h)
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W::new(KIND_REPLY);
        w.port(&self.port)
            .qpns(&self.qpns)
            .u32(self.eager)
            .u64(self.eager_addr)
            .u32(self.eager_rkey);
        w.0
    }
    pub fn decode(b: &[u8]) -> Result<Reply, String> {
        let mut r = R::open(b, KIND_REPLY, "verbs reply")?;
        let rep = Reply {
            port: r.port()?,
            qpns: r.qpns()?,
            eager: r.u32()?,
            eager_addr: r.u64()?,
            eager_rkey: r.u32()?,
        };
        r.end()?;
        Ok(rep)
    }
}

/// Frames on the bootstrap socket: a 4-byte length, then the message.
pub fn frame(msg: &[u8]) -> Vec<u8> {
    let mut v = (msg.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(msg);
    v
}

/// Largest bootstrap frame accepted (a hello with 128 queue pairs is ~600 bytes).
pub const MAX_FRAME: usize = 4096;

/// The path MTU both ends can use (the smaller one).
pub fn path_mtu(a: &PortAddr, b: &PortAddr) -> u8 {
    a.mtu.min(b.mtu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port() -> PortAddr {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, 7]);
        PortAddr {
            gid,
            lid: 0,
            mtu: 5,
            roce: true,
        }
    }

    #[test]
    fn round_trips() {
        let h = ListenInfo {
            rank: 7,
            bootstrap: "10.0.0.7:45123".parse().unwrap(),
            device: "mlx5_3:1".into(),
            port: port(),
            qps: 2,
            challenge: [5; crate::auth::NONCE_LEN],
        };
        assert_eq!(ListenInfo::decode(&h.encode()).unwrap(), h);
        let hello = Hello {
            job: 0xfeed_beef_0123,
            rank: 3,
            channel: 2,
            port: PortAddr { mtu: 3, ..port() },
            qpns: vec![0x11, 0x22, 0x33],
            fifo_addr: 0x7fff_0000_1000,
            fifo_rkey: 0xabcd,
            fifo_depth: 64,
            eager: 4096,
        };
        assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
        let rep = Reply {
            port: port(),
            qpns: vec![9; 128],
            eager: 1024,
            eager_addr: 0x7fff_2000_0000,
            eager_rkey: 0x77,
        };
        assert_eq!(Reply::decode(&rep.encode()).unwrap(), rep);
        assert_eq!(
            path_mtu(&hello.port, &rep.port),
            3,
            "the smaller MTU of both sides"
        );
        assert_eq!(&frame(b"abc")[..], &[3, 0, 0, 0, b'a', b'b', b'c']);
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let h = ListenInfo {
            rank: 1,
            bootstrap: "[::1]:9".parse().unwrap(),
            device: "rxe0:1".into(),
            port: port(),
            qps: 1,
            challenge: [6; crate::auth::NONCE_LEN],
        }
        .encode();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                b"busbw-tcp/1 rank=3 addr=127.0.0.1:4242".to_vec(),
                "bad magic",
            ),
            (vec![], "bad magic"),
            (h[..h.len() - 3].to_vec(), "truncated"),
            ([&h[..], &[0u8][..]].concat(), "trailing"),
            (
                {
                    let mut v = h.clone();
                    v[4] = 9;
                    v
                },
                "protocol 9",
            ),
            (
                {
                    let mut v = h.clone();
                    v[6] = KIND_REPLY;
                    v
                },
                "wrong message kind",
            ),
            (
                {
                    // The handle ends with the queue-pair count, then the challenge (a
                    // 2-byte length and its bytes).
                    let mut v = h.clone();
                    let n = v.len() - 2 - crate::auth::NONCE_LEN;
                    v[n - 1] = 0;
                    v
                },
                "queue pairs",
            ),
            (
                {
                    let mut v = h.clone();
                    let n = v.len() - 2 - crate::auth::NONCE_LEN;
                    v[n - 3] = 9;
                    v
                },
                "MTU code 9",
            ),
            (
                {
                    let mut v = h.clone();
                    v.pop();
                    v
                },
                "verbs handle",
            ),
        ];
        for (bytes, want) in cases {
            let e = ListenInfo::decode(&bytes).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        let mut hello = Hello {
            job: 1,
            rank: 0,
            channel: 0,
            port: port(),
            qpns: vec![1],
            fifo_addr: 0,
            fifo_rkey: 0,
            fifo_depth: 48,
            eager: 0,
        };
        assert!(Hello::decode(&hello.encode())
            .unwrap_err()
            .contains("power of two"));
        hello.fifo_depth = 64;
        hello.qpns.clear();
        assert!(Hello::decode(&hello.encode())
            .unwrap_err()
            .contains("0 queue pairs"));
        assert!(Reply::decode(&hello.encode())
            .unwrap_err()
            .contains("wrong message kind"));
    }
}
