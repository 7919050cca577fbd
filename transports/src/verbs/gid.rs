//! Which GID a port's queue pairs use, exactly as NCCL picks it (`ncclIbGetGidIndex`), so
//! that busbw and NCCL talk over the same address on the same fabric.
//!
//! InfiniBand ports use index 0. On RoCE, `NCCL_IB_GID_INDEX` wins when set; otherwise the
//! table is scanned from index 1 against index 0, preferring entries of the wanted address
//! family (`NCCL_IB_ADDR_FAMILY`, IPv4 by default, i.e. IPv4-mapped `::ffff:a.b.c.d`) inside
//! `NCCL_IB_ADDR_RANGE`, that are valid (not all-zero, not link-local `fe80::/10`) and of the
//! wanted RoCE version (`NCCL_IB_ROCE_VERSION_NUM`, 2). Entries whose type cannot be read
//! (EINVAL in containers) are skipped.

use super::sysfs::{GidEntry, Port};
use std::net::{IpAddr, Ipv6Addr};

/// Address family of a GID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// The user's GID preferences (NCCL's environment variables).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidPolicy {
    /// `NCCL_IB_GID_INDEX`: `None` (or -1) scans.
    pub index: Option<u32>,
    /// `NCCL_IB_ADDR_FAMILY`: `AF_INET` (default) or `AF_INET6`.
    pub family: Family,
    /// `NCCL_IB_ADDR_RANGE`: a CIDR the GID's address must lie in.
    pub range: Option<(IpAddr, u8)>,
    /// `NCCL_IB_ROCE_VERSION_NUM`: 2 (default) or 1.
    pub roce_version: u8,
}

impl Default for GidPolicy {
    fn default() -> Self {
        GidPolicy {
            index: None,
            family: Family::V4,
            range: None,
            roce_version: 2,
        }
    }
}

impl GidPolicy {
    /// Reads the NCCL variables through `get` (the process environment in production).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<GidPolicy, String> {
        let mut p = GidPolicy::default();
        if let Some(v) = get("NCCL_IB_GID_INDEX") {
            let i: i64 = v.trim().parse().map_err(|_| {
                format!("NCCL_IB_GID_INDEX={v}: not a number (a GID table index, or -1 to scan)")
            })?;
            p.index = match i {
                -1 => None,
                i if (0..=255).contains(&i) => Some(i as u32),
                _ => {
                    return Err(format!(
                        "NCCL_IB_GID_INDEX={v}: out of range (-1 or 0..255)"
                    ))
                }
            };
        }
        if let Some(v) = get("NCCL_IB_ADDR_FAMILY") {
            p.family = match v.trim() {
                "AF_INET" => Family::V4,
                "AF_INET6" => Family::V6,
                _ => {
                    return Err(format!(
                        "NCCL_IB_ADDR_FAMILY={v}: expected AF_INET or AF_INET6"
                    ))
                }
            };
        }
        if let Some(v) = get("NCCL_IB_ADDR_RANGE") {
            p.range = Some(parse_cidr(&v)?);
        }
        if let Some(v) = get("NCCL_IB_ROCE_VERSION_NUM") {
            p.roce_version = match v.trim() {
                "1" => 1,
                "2" => 2,
                _ => return Err(format!("NCCL_IB_ROCE_VERSION_NUM={v}: expected 1 or 2")),
            };
        }
        Ok(p)
    }
}

/// `10.0.0.0/8`, `fd00::/8`.
pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), String> {
    let bad = || format!("NCCL_IB_ADDR_RANGE={s}: expected a CIDR such as 10.0.0.0/8 or fd00::/8");
    let (a, l) = s.trim().split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = a.parse().map_err(|_| bad())?;
    let len: u8 = l.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(bad());
    }
    Ok((addr, len))
}

/// NCCL's `getGidAddrFamily`: IPv4-mapped (and IPv4-mapped multicast) GIDs are IPv4.
pub fn family(gid: &[u8; 16]) -> Family {
    let w =
        |i: usize| u32::from_be_bytes([gid[4 * i], gid[4 * i + 1], gid[4 * i + 2], gid[4 * i + 3]]);
    let mapped = w(0) == 0 && w(1) == 0 && w(2) == 0xffff;
    let mapped_mcast = w(0) == 0xff0e_0000 && w(1) == 0 && w(2) == 0xffff;
    if mapped || mapped_mcast {
        Family::V4
    } else {
        Family::V6
    }
}

/// NCCL's `validGid`: not unspecified, not link-local.
pub fn is_valid(gid: &[u8; 16]) -> bool {
    let a = Ipv6Addr::from(*gid);
    !a.is_unspecified() && (a.segments()[0] & 0xffc0) != 0xfe80
}

fn in_range(policy: &GidPolicy, gid: &[u8; 16]) -> bool {
    let Some((net, len)) = policy.range else {
        return true;
    };
    let prefix_eq = |a: &[u8], b: &[u8], bits: u8| {
        let full = (bits / 8) as usize;
        let rest = bits % 8;
        a[..full] == b[..full]
            && (rest == 0 || {
                let m = 0xffu8 << (8 - rest);
                a[full] & m == b[full] & m
            })
    };
    match (policy.family, net) {
        (Family::V4, IpAddr::V4(n)) => prefix_eq(&gid[12..16], &n.octets(), len),
        (Family::V6, IpAddr::V6(n)) => prefix_eq(gid, &n.octets(), len),
        // A range of the other family matches nothing, as in NCCL.
        _ => false,
    }
}

/// The chosen GID and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub index: u32,
    pub gid: [u8; 16],
    /// Human-readable: what was chosen and how (for the device block and `doctor`).
    pub how: String,
    /// Whether the choice meets the policy (valid, wanted family and RoCE version); a port
    /// without one still gets a GID, and `doctor` says what is missing.
    pub good: bool,
}

fn entry(port: &Port, index: u32) -> Option<&GidEntry> {
    port.gids.iter().find(|g| g.index == index)
}

/// NCCL's `ncclUpdateGidIndex`: whether `cand` replaces `cur`.
fn better(policy: &GidPolicy, cur: &GidEntry, cand: &GidEntry) -> bool {
    let (Some(cg), Some(xg)) = (cur.gid, cand.gid) else {
        return false;
    };
    let (cur_fam, cand_fam) = (family(&cg), family(&xg));
    let cand_in_range = in_range(policy, &xg);
    if cand_fam != cur_fam && cand_fam == policy.family && cand_in_range {
        return true;
    }
    if cand_fam != policy.family || !is_valid(&xg) || !cand_in_range {
        return false;
    }
    // Unreadable types (containers) skip the candidate.
    let Ok(cand_kind) = &cand.kind else {
        return false;
    };
    let cur_ver = cur.kind.as_ref().ok().and_then(|k| k.roce_version());
    let cand_ver = cand_kind.roce_version();
    (cur_ver != cand_ver || !is_valid(&cg)) && cand_ver == Some(policy.roce_version)
}

/// Picks the GID of `port` under `policy`. `Err` only when the port has no GID at all or the
/// explicit index does not exist.
pub fn select(port: &Port, policy: &GidPolicy) -> Result<Choice, String> {
    let describe = |e: &GidEntry| {
        let kind = match &e.kind {
            Ok(k) => k.label().to_string(),
            Err(_) => "type unreadable".into(),
        };
        let addr = e.addr().map(|a| show(&a)).unwrap_or_else(|| "?".into());
        format!("{addr} ({kind})")
    };
    if !port.is_ethernet() {
        let e = entry(port, 0).ok_or("InfiniBand port without GID 0")?;
        return Ok(Choice {
            index: 0,
            gid: e.gid.unwrap_or([0; 16]),
            how: format!("GID 0 {} (InfiniBand link layer)", describe(e)),
            good: true,
        });
    }
    if let Some(i) = policy.index {
        let e = entry(port, i).ok_or_else(|| {
            format!(
                "NCCL_IB_GID_INDEX={i} but the port's GID table has indices 0..{}",
                port.gids.len().saturating_sub(1)
            )
        })?;
        let gid = e.gid.ok_or_else(|| format!("GID {i} is unreadable"))?;
        return Ok(Choice {
            index: i,
            gid,
            how: format!("GID {i} {} (NCCL_IB_GID_INDEX)", describe(e)),
            good: is_valid(&gid),
        });
    }
    let mut cur = entry(port, 0)
        .or_else(|| port.gids.first())
        .ok_or("the port has no GID table")?;
    for cand in &port.gids {
        if cand.index > cur.index && better(policy, cur, cand) {
            cur = cand;
        }
    }
    let gid = cur.gid.unwrap_or([0; 16]);
    let good = cur.gid.is_some()
        && is_valid(&gid)
        && family(&gid) == policy.family
        && in_range(policy, &gid)
        && cur.kind.as_ref().ok().and_then(|k| k.roce_version()) == Some(policy.roce_version);
    Ok(Choice {
        index: cur.index,
        gid,
        how: format!("GID {} {} (auto)", cur.index, describe(cur)),
        good,
    })
}

/// IPv4-mapped GIDs as `::ffff:10.0.0.7`, others in IPv6 text.
pub fn show(a: &Ipv6Addr) -> String {
    match a.to_ipv4_mapped() {
        Some(v4) => format!("::ffff:{v4}"),
        None => a.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::sysfs::fake::{self, FakeGid};
    use super::super::sysfs::Sysfs;
    use super::*;

    const LL: &str = "fe80:0000:0000:0000:0264:9bff:fe1a:2b3c";
    const V4: &str = "0000:0000:0000:0000:0000:ffff:0a00:0007";
    const V4B: &str = "0000:0000:0000:0000:0000:ffff:c0a8:0102";
    const V6: &str = "fd00:0000:0000:0000:0264:9bff:fe1a:2b3c";
    const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";

    fn port_of(link: &str, gids: &[FakeGid]) -> Port {
        let root = fake::tempdir("gid");
        fake::port(&root, "mlx5_0", 1, link, "4: ACTIVE", gids);
        let p = Sysfs::new(&root).device("mlx5_0").ports.remove(0);
        let _ = std::fs::remove_dir_all(root);
        p
    }

    fn g<'a>(index: u32, gid: &'a str, kind: Option<&'a str>) -> FakeGid<'a> {
        FakeGid {
            index,
            gid,
            kind,
            ndev: Some("eth0"),
        }
    }

    fn pick(p: &Port, env: &[(&str, &str)]) -> Choice {
        let pol = GidPolicy::from_env(|k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        select(p, &pol).unwrap()
    }

    #[test]
    fn roce_prefers_ipv4_v2() {
        let p = port_of(
            "Ethernet",
            &[
                g(0, LL, Some("IB/RoCE v1")),
                g(1, LL, Some("RoCE v2")),
                g(2, V4, Some("IB/RoCE v1")),
                g(3, V4, Some("RoCE v2")),
            ],
        );
        let c = pick(&p, &[]);
        assert_eq!(c.index, 3, "{}", c.how);
        assert!(c.good);
        assert!(
            c.how.contains("::ffff:10.0.0.7") && c.how.contains("RoCE v2"),
            "{}",
            c.how
        );
        assert_eq!(pick(&p, &[("NCCL_IB_ROCE_VERSION_NUM", "1")]).index, 2);
        let c = pick(&p, &[("NCCL_IB_GID_INDEX", "1")]);
        assert_eq!(c.index, 1, "an explicit index wins");
        assert!(!c.good, "link-local is flagged");
        assert_eq!(pick(&p, &[("NCCL_IB_GID_INDEX", "-1")]).index, 3);
    }

    #[test]
    fn roce_v1_only_port_is_not_good() {
        let p = port_of(
            "Ethernet",
            &[g(0, LL, Some("IB/RoCE v1")), g(1, V4, Some("IB/RoCE v1"))],
        );
        let c = pick(&p, &[]);
        assert_eq!(c.index, 1, "the IPv4 family still wins over link-local");
        assert!(!c.good, "but it is not RoCE v2: {}", c.how);
    }

    #[test]
    fn infiniband_uses_index_zero() {
        let p = port_of(
            "InfiniBand",
            &[g(0, LL, Some("IB/RoCE v1")), g(1, V4, Some("RoCE v2"))],
        );
        let c = pick(&p, &[("NCCL_IB_GID_INDEX", "1")]);
        assert_eq!(c.index, 0);
        assert!(c.how.contains("InfiniBand"));
    }

    #[test]
    fn ipv6_only_port() {
        let p = port_of(
            "Ethernet",
            &[
                g(0, LL, Some("IB/RoCE v1")),
                g(1, LL, Some("RoCE v2")),
                g(2, V6, Some("IB/RoCE v1")),
                g(3, V6, Some("RoCE v2")),
            ],
        );
        let c = pick(&p, &[]);
        assert!(!c.good, "no IPv4 GID: {}", c.how);
        assert_eq!(
            c.index, 0,
            "NCCL keeps index 0 when nothing matches the family"
        );
        let c = pick(&p, &[("NCCL_IB_ADDR_FAMILY", "AF_INET6")]);
        assert_eq!(c.index, 3, "{}", c.how);
        assert!(c.good);
        let c = pick(
            &p,
            &[
                ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
                ("NCCL_IB_ADDR_RANGE", "fd00::/8"),
            ],
        );
        assert_eq!(c.index, 3);
        let c = pick(
            &p,
            &[
                ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
                ("NCCL_IB_ADDR_RANGE", "fc00::/8"),
            ],
        );
        assert_ne!(c.index, 3, "outside the range");
    }

    #[test]
    fn link_local_and_zero_entries_are_never_chosen_over_a_real_one() {
        let p = port_of(
            "Ethernet",
            &[
                g(0, ZERO, Some("IB/RoCE v1")),
                g(1, LL, Some("RoCE v2")),
                g(2, V4, Some("RoCE v2")),
                g(3, LL, Some("RoCE v2")),
            ],
        );
        assert_eq!(pick(&p, &[]).index, 2);
    }

    #[test]
    fn address_range_selects_among_ipv4_gids() {
        let p = port_of(
            "Ethernet",
            &[
                g(0, LL, Some("IB/RoCE v1")),
                g(1, V4, Some("RoCE v2")),
                g(2, V4B, Some("RoCE v2")),
            ],
        );
        assert_eq!(pick(&p, &[]).index, 1, "the first IPv4 v2 GID");
        assert_eq!(
            pick(&p, &[("NCCL_IB_ADDR_RANGE", "192.168.0.0/16")]).index,
            2
        );
        assert_eq!(pick(&p, &[("NCCL_IB_ADDR_RANGE", "10.0.0.0/24")]).index, 1);
    }

    #[test]
    fn unreadable_types_are_skipped() {
        // Index 2's type file cannot be read (EINVAL in a container): it may win on family
        // (NCCL's first rule) but never on RoCE version, so the readable v2 entry 3 wins.
        let p = port_of(
            "Ethernet",
            &[
                g(0, LL, Some("IB/RoCE v1")),
                g(1, LL, Some("RoCE v2")),
                g(2, V4, None),
                g(3, V4B, Some("RoCE v2")),
            ],
        );
        let c = pick(&p, &[]);
        assert_eq!(c.index, 3, "{}", c.how);
        // Only unreadable candidates: the IPv4 family still wins (NCCL's first rule) but the
        // choice is flagged.
        let p = port_of("Ethernet", &[g(0, LL, Some("IB/RoCE v1")), g(1, V4, None)]);
        let c = pick(&p, &[]);
        assert_eq!(c.index, 1);
        assert!(!c.good && c.how.contains("type unreadable"), "{}", c.how);
    }

    #[test]
    fn bad_environment_is_explained() {
        let env = |k: &'static str, v: &'static str| move |n: &str| (n == k).then(|| v.to_string());
        for (k, v, want) in [
            ("NCCL_IB_GID_INDEX", "x", "not a number"),
            ("NCCL_IB_GID_INDEX", "300", "out of range"),
            ("NCCL_IB_ADDR_FAMILY", "inet", "AF_INET"),
            ("NCCL_IB_ADDR_RANGE", "10.0.0.0", "CIDR"),
            ("NCCL_IB_ADDR_RANGE", "10.0.0.0/33", "CIDR"),
            ("NCCL_IB_ROCE_VERSION_NUM", "3", "1 or 2"),
        ] {
            let e = GidPolicy::from_env(env(k, v)).unwrap_err();
            assert!(e.contains(want) && e.contains(k), "{k}={v}: {e}");
        }
        let p = port_of("Ethernet", &[g(0, LL, Some("IB/RoCE v1"))]);
        let pol = GidPolicy {
            index: Some(5),
            ..GidPolicy::default()
        };
        assert!(select(&p, &pol).unwrap_err().contains("indices 0..0"));
    }
}
