//! RDMA verbs (RoCE v2 and InfiniBand): device, port and GID selection, the queue-pair
//! handshake, the receiver-driven WRITE-with-immediate protocol and `busbw doctor`.
//!
//! Everything that can be decided without libibverbs lives in always-compiled modules, so the
//! default build (no RDMA libraries) still parses `NCCL_IB_*`, reads sysfs for `doctor`, and
//! tests the protocol against a fake completion source: [`hca`] (`NCCL_IB_HCA`), [`sysfs`],
//! [`gid`] (NCCL's GID choice), [`gpudirect`] (may device memory be registered, and how),
//! [`handshake`] (handle, hello and reply bytes), [`proto`] (the
//! state machines), [`wc`] (completion errors in words) and [`doctor`]. The transport itself
//! ([`VerbsTransport`], feature `verbs`) is the only code that calls verbs.

pub mod doctor;
pub mod gid;
pub mod gpudirect;
pub mod handshake;
pub mod hca;
pub mod proto;
pub mod sysfs;
pub mod wc;

#[cfg(feature = "verbs")]
mod ib;
#[cfg(feature = "verbs")]
mod transport;
#[cfg(feature = "verbs")]
pub use transport::{library_devices, VerbsTransport};

use gid::GidPolicy;
use hca::HcaFilter;
use std::path::PathBuf;
use std::time::Duration;
use sysfs::Sysfs;

/// Whether this build contains the verbs transport.
pub const BUILT: bool = cfg!(feature = "verbs");

/// What libibverbs says: how many devices it sees, or why it sees none. `None` when the build
/// has no verbs (callers need no feature checks of their own).
pub fn library_status() -> Option<Result<usize, String>> {
    #[cfg(feature = "verbs")]
    return Some(library_devices().map(|d| d.len()));
    #[cfg(not(feature = "verbs"))]
    None
}

/// Opens this rank's verbs transport and describes its port and GID (`mlx5_0:1 GID 3 ...`)
/// for the device block. An error says why verbs cannot be used here, including "built
/// without verbs".
pub fn open(
    identity: crate::Identity,
    cfg: VerbsConfig,
    bind: std::net::IpAddr,
    advertise: Option<std::net::IpAddr>,
) -> crate::Result<(Box<dyn crate::Transport>, String)> {
    #[cfg(feature = "verbs")]
    {
        library_devices().map_err(crate::TransportError::Unsupported)?;
        let t = VerbsTransport::new(identity, cfg, bind, advertise)?;
        let d = t.describe();
        Ok((Box::new(t), d))
    }
    #[cfg(not(feature = "verbs"))]
    {
        let _ = (identity, cfg, bind, advertise);
        Err(crate::TransportError::Unsupported(
            "this busbw was built without the `verbs` feature".into(),
        ))
    }
}

/// Settings of the verbs transport, from NCCL's variables (so a cluster's NCCL environment
/// configures busbw the same way) and `--ib-hca`.
#[derive(Clone, Debug)]
pub struct VerbsConfig {
    /// `NCCL_IB_HCA` / `--ib-hca`.
    pub hca: HcaFilter,
    /// `NCCL_IB_GID_INDEX`, `NCCL_IB_ADDR_FAMILY`, `NCCL_IB_ADDR_RANGE`,
    /// `NCCL_IB_ROCE_VERSION_NUM`.
    pub gid: GidPolicy,
    /// `NCCL_IB_TC`: traffic class of RoCE packets (DSCP << 2), 0..255.
    pub traffic_class: u8,
    /// `NCCL_IB_SL`: service level, 0..15.
    pub service_level: u8,
    /// `NCCL_IB_TIMEOUT`: ack timeout exponent, 4.096 µs × 2^n, 1..31 (default 20 ≈ 4.3 s).
    pub ack_timeout: u8,
    /// `NCCL_IB_RETRY_CNT`: retransmissions before `IBV_WC_RETRY_EXC_ERR`, 0..7.
    pub retry_cnt: u8,
    /// `NCCL_IB_QPS_PER_CONNECTION`: queue pairs per connection, 1..128; messages
    /// round-robin over them.
    pub qps: u8,
    /// Messages in flight per connection (FIFO slots); a power of two.
    pub depth: usize,
    /// `BUSBW_IB_EAGER`: largest message (bytes) sent without waiting for the receiver's
    /// ready-to-receive entry; 0 turns the eager path off. Jobs on device buffers turn it
    /// off (the eager ring is host memory).
    pub eager: usize,
    /// How long a message may wait for its next step (the job's `-T`).
    pub stall_timeout: Duration,
    pub sysfs: Sysfs,
    /// Rank within the node: which HCA this rank takes.
    pub local_rank: usize,
    /// The GPU's PCI sysfs path when known (NIC chosen by PCI distance).
    pub gpu_pci_path: Option<PathBuf>,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            hca: HcaFilter::default(),
            gid: GidPolicy::default(),
            traffic_class: 0,
            service_level: 0,
            ack_timeout: 20,
            retry_cnt: 7,
            qps: 1,
            depth: 64,
            eager: proto::DEFAULT_EAGER,
            stall_timeout: Duration::from_secs(300),
            sysfs: Sysfs::default(),
            local_rank: 0,
            gpu_pci_path: None,
        }
    }
}

fn ranged(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    lo: u32,
    hi: u32,
    default: u32,
) -> Result<u32, String> {
    match get(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|x| (lo..=hi).contains(x))
            .ok_or_else(|| format!("{name}={v}: expected a whole number from {lo} to {hi}")),
    }
}

impl VerbsConfig {
    /// Reads `NCCL_IB_*` through `get` (the process environment in the binary).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<VerbsConfig, String> {
        let d = VerbsConfig::default();
        let hca = match get("NCCL_IB_HCA") {
            Some(s) => HcaFilter::parse(&s).map_err(|e| format!("NCCL_IB_HCA / --ib-hca: {e}"))?,
            None => HcaFilter::default(),
        };
        Ok(VerbsConfig {
            hca,
            gid: GidPolicy::from_env(&get)?,
            traffic_class: ranged(&get, "NCCL_IB_TC", 0, 255, 0)? as u8,
            service_level: ranged(&get, "NCCL_IB_SL", 0, 15, 0)? as u8,
            ack_timeout: ranged(&get, "NCCL_IB_TIMEOUT", 1, 31, d.ack_timeout as u32)? as u8,
            retry_cnt: ranged(&get, "NCCL_IB_RETRY_CNT", 0, 7, d.retry_cnt as u32)? as u8,
            qps: ranged(
                &get,
                "NCCL_IB_QPS_PER_CONNECTION",
                1,
                handshake::MAX_QPS as u32,
                1,
            )? as u8,
            eager: ranged(
                &get,
                "BUSBW_IB_EAGER",
                0,
                proto::MAX_EAGER as u32,
                d.eager as u32,
            )? as usize,
            ..d
        })
    }
}

/// A port this rank may use, with its GID.
#[derive(Clone, Debug)]
pub struct PortChoice {
    pub device: String,
    pub port: u8,
    pub gid: gid::Choice,
    pub link_layer: String,
    /// Path MTU from the netdev (RoCE), as bytes.
    pub mtu: Option<u32>,
    pub pci_path: Option<PathBuf>,
}

impl PortChoice {
    /// `mlx5_0:1 GID 3 ::ffff:10.0.0.7 (RoCE v2) (auto)`, for device lines.
    pub fn describe(&self) -> String {
        format!("{}:{} {}", self.device, self.port, self.gid.how)
    }
}

/// Every port `cfg` allows that can carry traffic, in device order, and why the others
/// cannot (for the error when none is left).
pub fn usable_ports(cfg: &VerbsConfig) -> (Vec<PortChoice>, Vec<String>) {
    let mut ok = Vec::new();
    let mut why = Vec::new();
    let devices = match cfg.sysfs.devices() {
        Ok(d) => d,
        Err(e) => return (ok, vec![e]),
    };
    if devices.is_empty() {
        why.push(format!(
            "no RDMA devices ({} is missing or empty)",
            cfg.sysfs.root().join("class/infiniband").display()
        ));
    }
    for d in &devices {
        for p in &d.ports {
            let name = format!("{}:{}", d.name, p.num);
            if !cfg.hca.allows(&d.name, p.num) {
                why.push(format!("{name} is excluded by NCCL_IB_HCA / --ib-hca"));
                continue;
            }
            if !p.is_active() {
                why.push(format!("{name} is {}", p.state));
                continue;
            }
            match gid::select(p, &cfg.gid) {
                Ok(g) if !p.is_ethernet() || gid::is_valid(&g.gid) => ok.push(PortChoice {
                    device: d.name.clone(),
                    port: p.num,
                    gid: g,
                    link_layer: p.link_layer.clone(),
                    mtu: p.roce_mtu(),
                    pci_path: d.pci_path.clone(),
                }),
                Ok(g) => why.push(format!("{name} has no routable GID ({})", g.how)),
                Err(e) => why.push(format!("{name}: {e}")),
            }
        }
    }
    (ok, why)
}

/// The port this rank uses: its own rail among the usable ones (see
/// [`hca::pick_for_local_rank`]).
pub fn pick_port(cfg: &VerbsConfig) -> Result<PortChoice, String> {
    let (ports, why) = usable_ports(cfg);
    let i = hca::pick_for_local_rank(&ports, cfg.local_rank, cfg.gpu_pci_path.as_deref(), |p| {
        p.pci_path.as_deref()
    })
    .ok_or_else(|| {
        format!(
            "no usable RDMA port: {}; run `busbw doctor` for details",
            why.join("; ")
        )
    })?;
    Ok(ports[i].clone())
}

#[cfg(test)]
mod tests {
    use super::sysfs::fake;
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn nccl_variables_configure_the_transport() {
        let c = VerbsConfig::from_env(env(&[
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_SL", "3"),
            ("NCCL_IB_TIMEOUT", "22"),
            ("NCCL_IB_RETRY_CNT", "5"),
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
            ("NCCL_IB_HCA", "=mlx5_1"),
            ("NCCL_IB_GID_INDEX", "3"),
        ]))
        .unwrap();
        assert_eq!(
            (
                c.traffic_class,
                c.service_level,
                c.ack_timeout,
                c.retry_cnt,
                c.qps
            ),
            (106, 3, 22, 5, 4)
        );
        assert!(c.hca.exact);
        assert_eq!(c.gid.index, Some(3));
        let d = VerbsConfig::from_env(env(&[])).unwrap();
        assert_eq!(
            (
                d.traffic_class,
                d.service_level,
                d.ack_timeout,
                d.retry_cnt,
                d.qps
            ),
            (0, 0, 20, 7, 1)
        );
        for (k, v) in [
            ("NCCL_IB_TC", "256"),
            ("NCCL_IB_SL", "16"),
            ("NCCL_IB_TIMEOUT", "0"),
            ("NCCL_IB_RETRY_CNT", "8"),
            ("NCCL_IB_QPS_PER_CONNECTION", "129"),
            ("NCCL_IB_TC", "abc"),
            ("NCCL_IB_HCA", "mlx5_0:x"),
        ] {
            let e = VerbsConfig::from_env(env(&[(k, v)])).unwrap_err();
            assert!(e.contains(k), "{k}={v}: {e}");
        }
    }

    #[test]
    fn ranks_take_their_own_rail_and_skip_unusable_ports() {
        let root = fake::tempdir("pick");
        for (i, ip) in [(0u8, 1u8), (1, 2), (2, 3)] {
            fake::roce_port(
                &root,
                &format!("mlx5_{i}"),
                &format!("eth{i}"),
                [10, 0, 0, ip],
            );
        }
        fake::port(&root, "mlx5_3", 1, "Ethernet", "1: DOWN", &[]);
        let cfg = |lr, hca: &str| VerbsConfig {
            sysfs: Sysfs::new(&root),
            local_rank: lr,
            hca: HcaFilter::parse(hca).unwrap(),
            ..VerbsConfig::default()
        };
        let picks: Vec<String> = (0..4)
            .map(|lr| pick_port(&cfg(lr, "")).unwrap().device)
            .collect();
        assert_eq!(picks, ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_0"]);
        let p = pick_port(&cfg(0, "")).unwrap();
        assert_eq!((p.gid.index, p.mtu), (3, Some(4096)));
        assert!(
            p.describe().starts_with("mlx5_0:1 GID 3 ::ffff:10.0.0.1"),
            "{}",
            p.describe()
        );
        assert_eq!(pick_port(&cfg(1, "^mlx5_0")).unwrap().device, "mlx5_2");
        let e = pick_port(&cfg(0, "mlx5_3")).unwrap_err();
        assert!(
            e.contains("mlx5_3:1 is DOWN") && e.contains("excluded"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(root);
        let empty = fake::tempdir("none");
        let e = pick_port(&VerbsConfig {
            sysfs: Sysfs::new(&empty),
            ..VerbsConfig::default()
        })
        .unwrap_err();
        assert!(e.contains("no RDMA devices"), "{e}");
        let _ = std::fs::remove_dir_all(empty);
    }
}
