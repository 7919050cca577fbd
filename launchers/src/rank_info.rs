//! What a rank tells the others about itself when it joins: the first line of its `info/<rank>`
//! record in the rendezvous store (the connection handle follows, see
//! [`crate::bootstrap::Record`]), read by rank 0 (for the node map and the device lines), by
//! the peers that connect to the rank, and by a timed-out rank that names the peers that went
//! silent.

use busbw_transports::multi::NodeId;

/// The store prefix the values live under (`info/<rank>`).
pub const PREFIX: &str = "info";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// The host name the launcher gave the rank (what reports and errors print).
    pub host: String,
    pub pid: u32,
    /// The rank's index on its node (its GPU, its RDMA rail).
    pub local_rank: usize,
    pub node: NodeId,
}

impl RankInfo {
    /// `host \t pid \t local rank \t node`: text, so a store dump is readable.
    pub fn encode(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}",
            self.host, self.pid, self.local_rank, self.node
        )
    }

    /// The inverse of [`RankInfo::encode`], or what is wrong with `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<RankInfo, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
        let f: Vec<&str> = text.split('\t').collect();
        let [host, pid, local, node] = f[..] else {
            return Err(format!("{text:?} has {} fields, not 4", f.len()));
        };
        let num = |v: &str, what: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{text:?}: {what} {v:?} is not a number"))
        };
        Ok(RankInfo {
            host: host.to_string(),
            pid: num(pid, "pid")? as u32,
            local_rank: num(local, "local rank")?,
            node: node.parse().map_err(|e| format!("{text:?}: {e}"))?,
        })
    }

    /// Just the host of an `info/<rank>` record, for messages about a rank whose record may be
    /// damaged.
    pub fn host_of(bytes: &[u8]) -> Option<String> {
        let text = String::from_utf8_lossy(bytes);
        text.split('\t')
            .next()
            .filter(|h| !h.is_empty())
            .map(String::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_says_what_is_wrong() {
        let i = RankInfo {
            host: "gpu-7".into(),
            pid: 4242,
            local_rank: 3,
            node: NodeId::new("gpu-7", "6f1e"),
        };
        assert_eq!(i.encode(), "gpu-7\t4242\t3\tgpu-7/6f1e");
        assert_eq!(RankInfo::decode(i.encode().as_bytes()), Ok(i));
        let e = |s: &str| RankInfo::decode(s.as_bytes()).unwrap_err();
        assert!(e("a\t1\t2").contains("3 fields, not 4"));
        assert!(e("a\tx\t2\ta/b").contains("pid \"x\" is not a number"));
        assert!(e("a\t1\t2\tnoslash").contains("not a node id"));
        assert_eq!(RankInfo::host_of(b"h\t1"), Some("h".into()));
        assert_eq!(RankInfo::host_of(b""), None);
    }
}
