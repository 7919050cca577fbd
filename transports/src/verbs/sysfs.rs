//! What the kernel says about RDMA devices under `/sys/class/infiniband`, read without
//! libibverbs so that `busbw doctor` and GID selection work in the default build, in
//! containers where verbs calls are not allowed, and against fake trees in tests.
//!
//! Layout read (per device `D`, port `P`, GID index `I`):
//! `D/node_type`, `D/fw_ver`, `D/device` (link to the PCI function),
//! `D/ports/P/{state,phys_state,link_layer,rate}`, `D/ports/P/gids/I`,
//! `D/ports/P/gid_attrs/types/I` (`IB/RoCE v1`, `RoCE v2`; reading it fails with EINVAL for
//! unused entries and in some containers), `D/ports/P/gid_attrs/ndevs/I` (the netdev), and
//! `class/net/<netdev>/mtu` for the Ethernet MTU.

use super::hca::natural_cmp;
use std::fs;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

/// A sysfs mount: `/sys` normally, a directory of fake files in tests.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::new("/sys")
    }
}

/// The RoCE version of a GID entry, from `gid_attrs/types`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GidType {
    /// `IB/RoCE v1`: InfiniBand, or RoCE v1 (Ethernet, not routable).
    IbRoceV1,
    /// `RoCE v2`: UDP/IP encapsulated, routable.
    RoceV2,
    Other(String),
}

impl GidType {
    /// NCCL's `NCCL_IB_ROCE_VERSION_NUM` numbering.
    pub fn roce_version(&self) -> Option<u8> {
        match self {
            GidType::IbRoceV1 => Some(1),
            GidType::RoceV2 => Some(2),
            GidType::Other(_) => None,
        }
    }
    pub fn label(&self) -> &str {
        match self {
            GidType::IbRoceV1 => "IB/RoCE v1",
            GidType::RoceV2 => "RoCE v2",
            GidType::Other(s) => s,
        }
    }
}

/// One GID table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    /// `None` when the file could not be read or parsed.
    pub gid: Option<[u8; 16]>,
    /// `Err(why)` when `gid_attrs/types/<index>` could not be read (containers, unused entry).
    pub kind: Result<GidType, String>,
    /// The netdev the entry belongs to (RoCE).
    pub ndev: Option<String>,
}

impl GidEntry {
    pub fn addr(&self) -> Option<Ipv6Addr> {
        self.gid.map(Ipv6Addr::from)
    }
}

/// One port of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub num: u8,
    /// `ACTIVE`, `DOWN`, `INIT`, ... (the text after `4: `).
    pub state: String,
    pub phys_state: String,
    /// `InfiniBand` or `Ethernet`.
    pub link_layer: String,
    pub rate: Option<String>,
    pub gids: Vec<GidEntry>,
    /// MTU of the port's netdev (Ethernet ports), from `class/net/<ndev>/mtu`.
    pub netdev_mtu: Option<u32>,
}

impl Port {
    pub fn is_ethernet(&self) -> bool {
        self.link_layer.eq_ignore_ascii_case("ethernet")
    }
    pub fn is_active(&self) -> bool {
        self.state.eq_ignore_ascii_case("active")
    }
    /// The netdev behind the port's GIDs.
    pub fn netdev(&self) -> Option<&str> {
        self.gids.iter().find_map(|g| g.ndev.as_deref())
    }
    /// The RoCE path MTU the netdev MTU allows (the kernel's `iboe_get_mtu`: the Ethernet MTU
    /// minus GRH, UDP, BTH, extended headers and ICRC, rounded down to an IB MTU).
    pub fn roce_mtu(&self) -> Option<u32> {
        let eth = self.netdev_mtu?;
        let room = eth.checked_sub(96)?;
        [4096, 2048, 1024, 512, 256]
            .into_iter()
            .find(|m| *m <= room)
    }
}

/// One RDMA device (`mlx5_0`, `rxe0`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub node_type: Option<String>,
    pub fw_ver: Option<String>,
    /// The PCI function's sysfs path (for NIC-to-GPU distance), when it is a PCI device.
    pub pci_path: Option<PathBuf>,
    pub ports: Vec<Port>,
}

impl Device {
    /// `0000:17:00.0`, the last component of the PCI path.
    pub fn pci_address(&self) -> Option<String> {
        self.pci_path
            .as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
    }
}

fn read_trim(p: &Path) -> Result<String, String> {
    fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .map_err(|e| e.to_string())
}

/// `4: ACTIVE` → `ACTIVE`.
fn after_colon(s: &str) -> String {
    match s.split_once(':') {
        Some((_, t)) => t.trim().to_string(),
        None => s.trim().to_string(),
    }
}

/// Parses sysfs' GID text (`fe80:0000:0000:0000:0264:9bff:fe1a:2b3c`).
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(out)
}

fn numbered(dir: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

impl Sysfs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn ib_dir(&self) -> PathBuf {
        self.root.join("class/infiniband")
    }

    /// Every RDMA device in name order (`mlx5_2` before `mlx5_10`). `Err` only when the
    /// directory exists but cannot be listed; no directory means no devices.
    pub fn devices(&self) -> Result<Vec<Device>, String> {
        let dir = self.ib_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
        };
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort_by(|a, b| natural_cmp(a, b));
        Ok(names.iter().map(|n| self.device(n)).collect())
    }

    /// Reads one device; missing files become `None`s rather than errors.
    pub fn device(&self, name: &str) -> Device {
        let d = self.ib_dir().join(name);
        let pci_path = fs::canonicalize(d.join("device"))
            .ok()
            .filter(|p| p.to_string_lossy().contains("/pci"));
        let ports = numbered(&d.join("ports"))
            .into_iter()
            .filter_map(|p| u8::try_from(p).ok())
            .map(|p| self.port(&d.join("ports").join(p.to_string()), p))
            .collect();
        Device {
            name: name.to_string(),
            node_type: read_trim(&d.join("node_type")).ok(),
            fw_ver: read_trim(&d.join("fw_ver")).ok(),
            pci_path,
            ports,
        }
    }

    fn port(&self, p: &Path, num: u8) -> Port {
        let gids: Vec<GidEntry> = numbered(&p.join("gids"))
            .into_iter()
            .map(|i| {
                let name = i.to_string();
                let gid = read_trim(&p.join("gids").join(&name))
                    .ok()
                    .and_then(|s| parse_gid(&s));
                // Unused entries are all zeros and most of the table (rxe has 1024 of them,
                // a ConnectX 256), and their attributes are unreadable anyway: skipping them
                // saves two thirds of the reads every process makes at start-up.
                let unused = gid.is_some_and(|g| g.iter().all(|b| *b == 0));
                let attr = |dir: &str| {
                    if unused {
                        Err("unused entry".to_string())
                    } else {
                        read_trim(&p.join("gid_attrs").join(dir).join(&name))
                    }
                };
                GidEntry {
                    index: i,
                    gid,
                    kind: attr("types").and_then(|t| match t.as_str() {
                        "" => Err("empty".into()),
                        "IB/RoCE v1" => Ok(GidType::IbRoceV1),
                        "RoCE v2" => Ok(GidType::RoceV2),
                        other => Ok(GidType::Other(other.into())),
                    }),
                    ndev: attr("ndevs").ok().filter(|s| !s.is_empty()),
                }
            })
            .collect();
        let netdev_mtu = gids
            .iter()
            .find_map(|g| g.ndev.as_deref())
            .and_then(|n| read_trim(&self.root.join("class/net").join(n).join("mtu")).ok())
            .and_then(|s| s.parse().ok());
        Port {
            num,
            state: read_trim(&p.join("state"))
                .map(|s| after_colon(&s))
                .unwrap_or_else(|_| "unknown".into()),
            phys_state: read_trim(&p.join("phys_state"))
                .map(|s| after_colon(&s))
                .unwrap_or_else(|_| "unknown".into()),
            link_layer: read_trim(&p.join("link_layer")).unwrap_or_else(|_| "unknown".into()),
            rate: read_trim(&p.join("rate")).ok(),
            gids,
            netdev_mtu,
        }
    }
}

/// Writing fake sysfs trees, for this crate's tests and the binary's.
pub mod fake {
    use std::fs;
    use std::path::{Path, PathBuf};

    /// One GID of a fake port: index, text, type (`None`: the types file is a directory, which
    /// reads as an error, as EINVAL does in a container), netdev.
    pub struct FakeGid<'a> {
        pub index: u32,
        pub gid: &'a str,
        pub kind: Option<&'a str>,
        pub ndev: Option<&'a str>,
    }

    /// Writes device `dev` port `port` under `root` (a fake `/sys`).
    pub fn port(root: &Path, dev: &str, port: u8, link_layer: &str, state: &str, gids: &[FakeGid]) {
        let d: PathBuf = root.join("class/infiniband").join(dev);
        let p = d.join("ports").join(port.to_string());
        for sub in ["gids", "gid_attrs/types", "gid_attrs/ndevs"] {
            fs::create_dir_all(p.join(sub)).expect("fake sysfs");
        }
        let w = |path: PathBuf, text: &str| fs::write(path, text).expect("fake sysfs");
        w(d.join("node_type"), "1: CA\n");
        w(d.join("fw_ver"), "28.39.1002\n");
        w(p.join("state"), &format!("{state}\n"));
        w(p.join("phys_state"), "5: LinkUp\n");
        w(p.join("link_layer"), &format!("{link_layer}\n"));
        w(p.join("rate"), "400 Gb/sec (4X NDR)\n");
        for g in gids {
            w(
                p.join("gids").join(g.index.to_string()),
                &format!("{}\n", g.gid),
            );
            let t = p.join("gid_attrs/types").join(g.index.to_string());
            match g.kind {
                Some(k) => w(t, &format!("{k}\n")),
                None => fs::create_dir_all(t).expect("fake sysfs"),
            }
            if let Some(n) = g.ndev {
                w(
                    p.join("gid_attrs/ndevs").join(g.index.to_string()),
                    &format!("{n}\n"),
                );
            }
        }
    }

    /// Writes `class/net/<ndev>/mtu`.
    pub fn netdev_mtu(root: &Path, ndev: &str, mtu: u32) {
        let n = root.join("class/net").join(ndev);
        fs::create_dir_all(&n).expect("fake sysfs");
        fs::write(n.join("mtu"), format!("{mtu}\n")).expect("fake sysfs");
    }

    /// A fresh, empty directory for a fake tree.
    pub fn tempdir(tag: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "busbw-sysfs-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("temp dir");
        d
    }

    /// A typical RoCE port: link-local v1/v2 GIDs at 0/1, IPv4-mapped v1/v2 at 2/3.
    pub fn roce_port(root: &Path, dev: &str, ndev: &str, ipv4: [u8; 4]) {
        let v4 = format!(
            "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
            ipv4[0], ipv4[1], ipv4[2], ipv4[3]
        );
        let ll = "fe80:0000:0000:0000:0264:9bff:fe1a:2b3c";
        port(
            root,
            dev,
            1,
            "Ethernet",
            "4: ACTIVE",
            &[
                FakeGid {
                    index: 0,
                    gid: ll,
                    kind: Some("IB/RoCE v1"),
                    ndev: Some(ndev),
                },
                FakeGid {
                    index: 1,
                    gid: ll,
                    kind: Some("RoCE v2"),
                    ndev: Some(ndev),
                },
                FakeGid {
                    index: 2,
                    gid: &v4,
                    kind: Some("IB/RoCE v1"),
                    ndev: Some(ndev),
                },
                FakeGid {
                    index: 3,
                    gid: &v4,
                    kind: Some("RoCE v2"),
                    ndev: Some(ndev),
                },
            ],
        );
        netdev_mtu(root, ndev, 9000);
    }
}

#[cfg(test)]
mod tests {
    use super::fake::*;
    use super::*;

    #[test]
    fn reads_a_roce_port() {
        let root = tempdir("read");
        roce_port(&root, "mlx5_0", "ens1f0", [10, 0, 0, 7]);
        let devs = Sysfs::new(&root).devices().unwrap();
        assert_eq!(devs.len(), 1);
        let p = &devs[0].ports[0];
        assert_eq!((p.num, p.state.as_str()), (1, "ACTIVE"));
        assert!(p.is_ethernet() && p.is_active());
        assert_eq!(p.gids.len(), 4);
        assert_eq!(p.gids[3].kind, Ok(GidType::RoceV2));
        assert_eq!(
            p.gids[3].addr().unwrap().to_ipv4_mapped(),
            Some([10, 0, 0, 7].into())
        );
        assert_eq!(p.netdev(), Some("ens1f0"));
        assert_eq!((p.netdev_mtu, p.roce_mtu()), (Some(9000), Some(4096)));
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn unused_gid_entries_are_not_read_further() {
        let root = tempdir("unused");
        let zero = "0000:0000:0000:0000:0000:0000:0000:0000";
        let ll = "fe80:0000:0000:0000:0264:9bff:fe1a:2b3c";
        // Attributes written for the zero entry would be read if the scan looked at them.
        let gids = [
            FakeGid {
                index: 0,
                gid: ll,
                kind: Some("RoCE v2"),
                ndev: Some("eth0"),
            },
            FakeGid {
                index: 1,
                gid: zero,
                kind: Some("RoCE v2"),
                ndev: Some("eth0"),
            },
        ];
        port(&root, "rxe0", 1, "Ethernet", "4: ACTIVE", &gids);
        let p = &Sysfs::new(&root).devices().unwrap()[0].ports[0];
        assert_eq!(
            (p.gids[0].kind.clone(), p.gids[0].ndev.as_deref()),
            (Ok(GidType::RoceV2), Some("eth0"))
        );
        assert_eq!(p.gids[1].gid, Some([0; 16]));
        assert!(p.gids[1].kind.is_err() && p.gids[1].ndev.is_none());
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn no_tree_means_no_devices() {
        let root = tempdir("empty");
        assert_eq!(Sysfs::new(&root).devices().unwrap(), vec![]);
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn gid_text_and_mtu_rounding() {
        assert_eq!(
            parse_gid("0000:0000:0000:0000:0000:ffff:0a00:0001").unwrap()[10..],
            [0xff, 0xff, 10, 0, 0, 1]
        );
        assert!(parse_gid("fe80::1").is_none());
        assert!(parse_gid("zzzz:0000:0000:0000:0000:ffff:0a00:0001").is_none());
        let mtu = |eth| {
            Port {
                num: 1,
                state: String::new(),
                phys_state: String::new(),
                link_layer: "Ethernet".into(),
                rate: None,
                gids: vec![],
                netdev_mtu: Some(eth),
            }
            .roce_mtu()
        };
        assert_eq!(
            (mtu(1500), mtu(4200), mtu(9000), mtu(300)),
            (Some(1024), Some(4096), Some(4096), None)
        );
    }
}
