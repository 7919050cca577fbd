//! `busbw doctor`: what RDMA this host has, what busbw would use, and what to fix.
//!
//! Read from sysfs only (works in the default build and in containers that forbid verbs
//! calls); the binary adds what libibverbs itself says when built with `verbs`.

use super::gid::{self, show};
use super::gpudirect::{peermem_module, PEERMEM_MODULES};
use super::{hca, usable_ports, VerbsConfig};
use std::fmt::Write;

/// The report, and whether at least one port is usable.
pub struct Report {
    pub text: String,
    pub usable: bool,
}

/// Builds the report for `cfg` (its sysfs root, `NCCL_IB_*` settings and local rank).
/// `library` is what libibverbs said (`None`: not asked, the build has no verbs).
pub fn report(cfg: &VerbsConfig, library: Option<Result<usize, String>>) -> Report {
    let mut t = String::new();
    let mut advice: Vec<String> = Vec::new();
    let ib = cfg.sysfs.root().join("class/infiniband");
    let devices = match cfg.sysfs.devices() {
        Ok(d) => d,
        Err(e) => {
            advice.push(e);
            Vec::new()
        }
    };
    if devices.is_empty() {
        let _ = writeln!(
            t,
            "no RDMA devices: {} is missing or empty (no RDMA NIC, its driver not loaded, or a \
             container without /sys/class/infiniband and /dev/infiniband; Kubernetes pods need \
             the RDMA device plugin's resource)",
            ib.display()
        );
    } else {
        let _ = writeln!(t, "RDMA devices ({}):", ib.display());
    }
    for d in &devices {
        let _ = writeln!(
            t,
            "{}  node {}  fw {}  pci {}",
            d.name,
            d.node_type.as_deref().unwrap_or("?"),
            d.fw_ver.as_deref().unwrap_or("?"),
            d.pci_address().unwrap_or_else(|| "-".into())
        );
        if d.ports.is_empty() {
            advice.push(format!("{} has no ports in sysfs", d.name));
        }
        for p in &d.ports {
            let name = format!("{}:{}", d.name, p.num);
            let mtu = match (p.netdev(), p.netdev_mtu, p.roce_mtu()) {
                (Some(n), Some(m), Some(r)) => format!("netdev {n} mtu {m} (RoCE MTU {r})"),
                (Some(n), _, _) => format!("netdev {n} mtu ?"),
                _ => "MTU from the subnet manager".into(),
            };
            let _ = writeln!(
                t,
                "  port {}: {} ({}), link layer {}, {}, {}",
                p.num,
                p.state,
                p.phys_state,
                p.link_layer,
                p.rate.as_deref().unwrap_or("rate ?"),
                mtu
            );
            let choice = gid::select(p, &cfg.gid);
            let chosen = choice.as_ref().ok().map(|c| c.index);
            if p.gids.is_empty() {
                let _ = writeln!(t, "    (no GID table)");
            } else {
                let _ = writeln!(t, "    GID  type        address");
            }
            let mut unreadable = 0;
            for g in &p.gids {
                let zero = g.gid.is_some_and(|x| x.iter().all(|b| *b == 0));
                if zero && chosen != Some(g.index) {
                    continue;
                }
                let kind = match &g.kind {
                    Ok(k) => k.label().to_string(),
                    Err(_) => {
                        unreadable += 1;
                        "unreadable".into()
                    }
                };
                let addr = g.addr().map(|a| show(&a)).unwrap_or_else(|| "?".into());
                let mark = if chosen == Some(g.index) {
                    "  <- chosen"
                } else {
                    ""
                };
                let ndev = g
                    .ndev
                    .as_deref()
                    .map(|n| format!("  {n}"))
                    .unwrap_or_default();
                let _ = writeln!(t, "    {:>3}  {:<10}  {addr}{ndev}{mark}", g.index, kind);
            }
            if !cfg.hca.allows(&d.name, p.num) {
                advice.push(format!("{name} is excluded by NCCL_IB_HCA / --ib-hca"));
            }
            if !p.is_active() {
                advice.push(format!(
                    "{name} is {} ({}): check the cable and the switch port{}",
                    p.state,
                    p.phys_state,
                    p.netdev()
                        .map(|n| format!(" (`ip link show {n}`)"))
                        .unwrap_or_default()
                ));
                continue;
            }
            match &choice {
                Ok(c) => {
                    let _ = writeln!(t, "    busbw would use {}", c.how);
                    if p.is_ethernet() && !c.good {
                        advice.push(format!(
                            "no RoCE v{} GID with an {} address on {name}{}: give {} an address, or \
                             set NCCL_IB_GID_INDEX (or NCCL_IB_ADDR_FAMILY / NCCL_IB_ROCE_VERSION_NUM)",
                            cfg.gid.roce_version,
                            if cfg.gid.family == gid::Family::V4 { "IPv4" } else { "IPv6" },
                            cfg.gid
                                .range
                                .map(|(a, l)| format!(" inside {a}/{l}"))
                                .unwrap_or_default(),
                            p.netdev().unwrap_or("its netdev")
                        ));
                    }
                }
                Err(e) => advice.push(format!("{name}: {e}")),
            }
            if unreadable > 0 {
                advice.push(format!(
                    "{unreadable} GID type(s) of {name} are unreadable (containers often hide \
                     them); those GIDs are skipped: set NCCL_IB_GID_INDEX if the right one is among them"
                ));
            }
            if let Some(r) = p.roce_mtu().filter(|r| *r < 4096) {
                advice.push(format!(
                    "{name}: RoCE MTU {r} from netdev MTU {}: jumbo frames (MTU 9000 on the NIC \
                     and the switch) give RDMA its full bandwidth",
                    p.netdev_mtu.unwrap_or(0)
                ));
            }
        }
    }
    let (usable, _) = usable_ports(cfg);
    if !usable.is_empty() {
        let _ = writeln!(
            t,
            "usable ports: {}",
            usable
                .iter()
                .map(|p| format!("{}:{}", p.device, p.port))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let per_rank: Vec<String> = (0..usable.len().max(1))
            .filter_map(|lr| {
                hca::pick_for_local_rank(&usable, lr, cfg.gpu_pci_path.as_deref(), |p| {
                    p.pci_path.as_deref()
                })
                .map(|i| format!("local rank {lr} -> {}:{}", usable[i].device, usable[i].port))
            })
            .collect();
        let _ = writeln!(t, "rail per local rank: {}", per_rank.join(", "));
    }
    if !devices.is_empty() {
        let _ = writeln!(t, "{}", gpudirect_line(cfg.sysfs.root()));
    }
    match &library {
        None => {
            let _ = writeln!(
                t,
                "this busbw was built without the `verbs` feature: --transport verbs is unavailable \
                 (build with `cargo build --release -p busbw --features verbs`, see docs/rdma.md)"
            );
        }
        Some(Ok(n)) => {
            let _ = writeln!(t, "libibverbs: {n} device(s)");
        }
        Some(Err(e)) => {
            let _ = writeln!(t, "libibverbs: {e}");
            advice.push(format!("libibverbs cannot list devices: {e}"));
        }
    }
    for a in &advice {
        let _ = writeln!(t, "advice: {a}");
    }
    let ok = !usable.is_empty() && !matches!(library, None | Some(Err(_)));
    Report {
        text: t,
        usable: ok,
    }
}

/// What GPU buffers would do on this host's NICs, as far as sysfs tells: the peer-memory
/// module is visible here; dma-buf support is only known once a run opens a NIC.
fn gpudirect_line(sysfs: &std::path::Path) -> String {
    match peermem_module(sysfs) {
        Some(m) => format!(
            "GPUDirect RDMA: {m} is loaded: the verbs transport registers GPU buffers with the NIC"
        ),
        None => format!(
            "GPUDirect RDMA: no peer-memory module ({}) is loaded; GPU buffers use dma-buf where \
             the kernel (5.12+), rdma-core (34+) and the GPU driver allow it, else they are staged \
             through host memory",
            PEERMEM_MODULES.join(" or ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::sysfs::{fake, Sysfs};
    use super::*;

    #[test]
    fn fake_host_with_a_good_and_a_bad_port() {
        let root = fake::tempdir("doctor");
        fake::roce_port(&root, "mlx5_0", "ens1f0", [10, 1, 2, 3]);
        // mlx5_3: RoCE, link-local GIDs only (no IPv4 address on the netdev).
        fake::port(
            &root,
            "mlx5_3",
            1,
            "Ethernet",
            "4: ACTIVE",
            &[
                fake::FakeGid {
                    index: 0,
                    gid: "fe80:0000:0000:0000:0264:9bff:fe1a:2b3c",
                    kind: Some("IB/RoCE v1"),
                    ndev: Some("ens3"),
                },
                fake::FakeGid {
                    index: 1,
                    gid: "fe80:0000:0000:0000:0264:9bff:fe1a:2b3c",
                    kind: Some("RoCE v2"),
                    ndev: Some("ens3"),
                },
                fake::FakeGid {
                    index: 2,
                    gid: "0000:0000:0000:0000:0000:0000:0000:0000",
                    kind: None,
                    ndev: None,
                },
            ],
        );
        fake::netdev_mtu(&root, "ens3", 1500);
        fake::port(&root, "mlx5_4", 1, "Ethernet", "1: DOWN", &[]);
        let cfg = VerbsConfig {
            sysfs: Sysfs::new(&root),
            ..VerbsConfig::default()
        };
        let r = report(&cfg, None);
        let t = &r.text;
        for want in [
            "mlx5_0  node 1: CA  fw 28.39.1002",
            "port 1: ACTIVE (LinkUp), link layer Ethernet, 400 Gb/sec (4X NDR), netdev ens1f0 mtu 9000 (RoCE MTU 4096)",
            "3  RoCE v2     ::ffff:10.1.2.3  ens1f0  <- chosen",
            "busbw would use GID 3 ::ffff:10.1.2.3 (RoCE v2) (auto)",
            "advice: no RoCE v2 GID with an IPv4 address on mlx5_3:1: give ens3 an address",
            "advice: mlx5_3:1: RoCE MTU 1024 from netdev MTU 1500",
            "advice: mlx5_4:1 is DOWN",
            "usable ports: mlx5_0:1",
            "rail per local rank: local rank 0 -> mlx5_0:1",
            "built without the `verbs` feature",
            "GPUDirect RDMA: no peer-memory module (nvidia_peermem or nv_peer_mem) is loaded",
        ] {
            assert!(t.contains(want), "missing {want:?} in:\n{t}");
        }
        assert!(!t.contains("mlx5_3:1,"), "mlx5_3 has no routable GID:\n{t}");
        assert!(!r.usable, "a build without verbs cannot use them");
        let r = report(&cfg, Some(Ok(2)));
        assert!(
            r.usable && r.text.contains("libibverbs: 2 device(s)"),
            "{}",
            r.text
        );
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        let t = report(&cfg, None).text;
        assert!(
            t.contains("GPUDirect RDMA: nvidia_peermem is loaded: the verbs transport registers GPU buffers"),
            "{t}"
        );
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn no_devices_says_so() {
        let root = fake::tempdir("doctor-none");
        let cfg = VerbsConfig {
            sysfs: Sysfs::new(&root),
            ..VerbsConfig::default()
        };
        let r = report(
            &cfg,
            Some(Err(
                "ibv_get_device_list: Function not implemented (os error 38)".into(),
            )),
        );
        assert!(r.text.starts_with("no RDMA devices"), "{}", r.text);
        assert!(
            !r.text.contains("GPUDirect"),
            "no NIC, nothing to say: {}",
            r.text
        );
        assert!(
            r.text.contains("advice: libibverbs cannot list devices"),
            "{}",
            r.text
        );
        assert!(!r.usable);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn unreadable_gid_types_get_advice() {
        let root = fake::tempdir("doctor-ro");
        fake::port(
            &root,
            "mlx5_0",
            1,
            "Ethernet",
            "4: ACTIVE",
            &[
                fake::FakeGid {
                    index: 0,
                    gid: "fe80:0000:0000:0000:0264:9bff:fe1a:2b3c",
                    kind: None,
                    ndev: Some("eth0"),
                },
                fake::FakeGid {
                    index: 1,
                    gid: "0000:0000:0000:0000:0000:ffff:0a00:0001",
                    kind: None,
                    ndev: Some("eth0"),
                },
            ],
        );
        let cfg = VerbsConfig {
            sysfs: Sysfs::new(&root),
            ..VerbsConfig::default()
        };
        let t = report(&cfg, None).text;
        assert!(
            t.contains("2 GID type(s) of mlx5_0:1 are unreadable"),
            "{t}"
        );
        assert!(t.contains("unreadable  ::ffff:10.0.0.1"), "{t}");
        let _ = std::fs::remove_dir_all(root);
    }
}
