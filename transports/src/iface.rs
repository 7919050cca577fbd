//! Network interface selection with NCCL's `NCCL_SOCKET_IFNAME` syntax, so a cluster already
//! configured for NCCL sends busbw's data over the same interfaces.
//!
//! Syntax: a comma-separated list of name prefixes (`eth,ens`); `^` before the list excludes
//! instead (`^docker,lo`); `=` before the list makes the names exact (`=eth0`, `^=eth0`).

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of an interface that is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub addr: IpAddr,
}

/// A parsed `NCCL_SOCKET_IFNAME` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

/// NCCL's list syntax shared by `NCCL_SOCKET_IFNAME` and `NCCL_IB_HCA`: an optional `^`
/// (exclude), an optional `=` (exact names), then comma-separated items, blanks dropped.
pub(crate) fn split_list(spec: &str) -> (bool, bool, Vec<&str>) {
    let mut s = spec.trim();
    let exclude = s.starts_with('^');
    if exclude {
        s = &s[1..];
    }
    let exact = s.starts_with('=');
    if exact {
        s = &s[1..];
    }
    let items = s
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    (exclude, exact, items)
}

impl IfaceFilter {
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (exclude, exact, items) = split_list(spec);
        let names: Vec<String> = items.into_iter().map(String::from).collect();
        if names.is_empty() {
            return Err(format!(
                "interface list '{spec}' names no interface (examples: eth0, ^docker,lo, =ens5)"
            ));
        }
        Ok(IfaceFilter {
            exclude,
            exact,
            names,
        })
    }

    pub fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

/// Every address of every interface that is up and running (IPv4 first, then IPv6 that are
/// not link-local), in the kernel's order.
pub fn interfaces() -> io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let flags = ifa.ifa_flags;
        let up = flags & libc::IFF_UP as u32 != 0 && flags & libc::IFF_RUNNING as u32 != 0;
        if !up || ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points at a sockaddr whose family says which struct it is.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if family == libc::AF_INET {
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            v4.push(Interface {
                name,
                addr: IpAddr::V4(addr),
            });
        } else if family == libc::AF_INET6 {
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            let addr = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            // Link-local addresses need a scope id that handles do not carry.
            if addr.segments()[0] & 0xffc0 != 0xfe80 {
                v6.push(Interface {
                    name,
                    addr: IpAddr::V6(addr),
                });
            }
        }
    }
    // SAFETY: head came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    v4.extend(v6);
    Ok(v4)
}

/// The first address on an interface that `spec` selects.
pub fn select(spec: &str) -> Result<Interface, String> {
    let filter = IfaceFilter::parse(spec)?;
    let all = interfaces().map_err(|e| format!("cannot list network interfaces: {e}"))?;
    let mut names: Vec<&str> = Vec::new();
    for i in &all {
        if !names.contains(&i.name.as_str()) {
            names.push(&i.name);
        }
    }
    all.iter()
        .find(|i| filter.matches(&i.name))
        .cloned()
        .ok_or_else(|| {
            format!(
                "no interface that is up matches '{spec}' (interfaces with addresses: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_syntax() {
        let f = IfaceFilter::parse("eth,ens").unwrap();
        assert!(f.matches("eth0") && f.matches("ens5") && !f.matches("lo"));
        let f = IfaceFilter::parse("^docker,lo").unwrap();
        assert!(f.matches("eth0") && !f.matches("docker0") && !f.matches("lo"));
        let f = IfaceFilter::parse("=eth0").unwrap();
        assert!(f.matches("eth0") && !f.matches("eth0.100") && !f.matches("eth1"));
        let f = IfaceFilter::parse("^=lo").unwrap();
        assert!(!f.matches("lo") && f.matches("lo0"));
        assert!(IfaceFilter::parse("^").is_err());
        assert!(IfaceFilter::parse(" , ").is_err());
    }

    #[test]
    fn loopback_is_found_and_absent_names_explained() {
        let lo = select("=lo").expect("every Linux host has lo");
        assert_eq!(lo.addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
        let e = select("=nonexistent0").unwrap_err();
        assert!(e.contains("nonexistent0") && e.contains("lo"), "{e}");
    }
}
