//! `NCCL_IB_HCA` / `--ib-hca`: which RDMA devices and ports a rank may use, and which one each
//! local rank takes.
//!
//! The syntax is NCCL's so that a cluster's existing environment means the same here:
//! `mlx5_0:1,mlx5_1` (a list of `device[:port]`, prefixes: `mlx5_1` also matches `mlx5_10`),
//! `^mlx5_2` (everything but), `=mlx5_1` (exact names only), `^=mlx5_1:1` (both). NCCL also
//! accepts `:rail:plane` after the port; those fields are accepted and ignored.

use std::path::Path;

/// One `device[:port]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaEntry {
    pub name: String,
    pub port: Option<u8>,
}

/// A parsed `NCCL_IB_HCA` value.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HcaFilter {
    /// `^`: the entries name what to leave out.
    pub exclude: bool,
    /// `=`: names match exactly, not as prefixes.
    pub exact: bool,
    /// Empty: every device and port.
    pub entries: Vec<HcaEntry>,
}

impl HcaFilter {
    /// Parses `spec`; an empty string selects everything.
    pub fn parse(spec: &str) -> Result<HcaFilter, String> {
        let (exclude, exact, items) = crate::iface::split_list(spec);
        let mut entries = Vec::new();
        for item in items {
            let mut fields = item.split(':');
            let name = fields.next().unwrap_or_default().trim();
            if name.is_empty() {
                return Err(format!(
                    "'{item}' in '{spec}' has no device name (expected device[:port], e.g. mlx5_0:1)"
                ));
            }
            let port = match fields.next().map(str::trim) {
                None | Some("") => None,
                Some(p) => Some(p.parse::<u8>().ok().filter(|p| *p > 0).ok_or_else(|| {
                    format!("'{item}' in '{spec}': port '{p}' is not a port number (1, 2, ...)")
                })?),
            };
            if fields.count() > 2 {
                return Err(format!(
                    "'{item}' in '{spec}' has too many ':' fields (expected device[:port[:rail[:plane]]])"
                ));
            }
            entries.push(HcaEntry {
                name: name.to_string(),
                port,
            });
        }
        if (exclude || exact) && entries.is_empty() {
            return Err(format!("'{spec}' names no device after its ^ or ="));
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    fn entry_matches(&self, e: &HcaEntry, device: &str, port: u8) -> bool {
        let name_ok = if self.exact {
            device == e.name
        } else {
            device.starts_with(&e.name)
        };
        name_ok && e.port.is_none_or(|p| p == port)
    }

    /// Whether `device` port `port` may be used.
    pub fn allows(&self, device: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let any = self
            .entries
            .iter()
            .any(|e| self.entry_matches(e, device, port));
        any != self.exclude
    }
}

/// Orders device names as people read them: `mlx5_2` before `mlx5_10`.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (head, tail) = s.split_at(s.len() - digits);
        (
            head.to_string(),
            tail.parse::<u64>().unwrap_or(0),
            s.to_string(),
        )
    };
    split(a).cmp(&split(b))
}

/// Which of `candidates` (usable ports, in device order) local rank `local_rank` takes, so that
/// on a node with eight rails the eight local ranks use eight different NICs.
///
/// With the GPU's PCI path known (`/sys/devices/pci0000:17/0000:17:00.0/...`), the NICs sharing
/// the longest PCI path prefix with it are the nearest (same switch beats same root complex
/// beats another socket); among equally near NICs, and when no GPU is known, local rank modulo
/// the count spreads the ranks evenly. `pci_path` gives a candidate's PCI path.
pub fn pick_for_local_rank<T>(
    candidates: &[T],
    local_rank: usize,
    gpu_pci_path: Option<&Path>,
    pci_path: impl Fn(&T) -> Option<&Path>,
) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    let nearest: Vec<usize> = match gpu_pci_path {
        Some(gpu) => {
            let shared = |p: Option<&Path>| {
                p.map(|p| {
                    p.components()
                        .zip(gpu.components())
                        .take_while(|(a, b)| a == b)
                        .count()
                })
                .unwrap_or(0)
            };
            let best = candidates
                .iter()
                .map(|c| shared(pci_path(c)))
                .max()
                .unwrap_or(0);
            (0..candidates.len())
                .filter(|&i| shared(pci_path(&candidates[i])) == best)
                .collect()
        }
        None => (0..candidates.len()).collect(),
    };
    Some(nearest[local_rank % nearest.len()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn prefix_port_list() {
        let f = HcaFilter::parse("mlx5_0:1,mlx5_1").unwrap();
        assert!(!f.exclude && !f.exact);
        assert_eq!(
            f.entries,
            vec![
                HcaEntry {
                    name: "mlx5_0".into(),
                    port: Some(1)
                },
                HcaEntry {
                    name: "mlx5_1".into(),
                    port: None
                },
            ]
        );
        assert!(f.allows("mlx5_0", 1));
        assert!(!f.allows("mlx5_0", 2), "port suffix restricts the port");
        assert!(f.allows("mlx5_1", 2));
        assert!(
            f.allows("mlx5_10", 1),
            "NCCL matches prefixes: mlx5_1 covers mlx5_10"
        );
        assert!(!f.allows("mlx5_2", 1));
    }

    #[test]
    fn exclude_and_exact() {
        let f = HcaFilter::parse("^mlx5_1").unwrap();
        assert!(f.exclude);
        assert!(!f.allows("mlx5_1", 1));
        assert!(!f.allows("mlx5_11", 1));
        assert!(f.allows("mlx5_0", 1));

        let f = HcaFilter::parse("=mlx5_1").unwrap();
        assert!(f.exact && !f.exclude);
        assert!(f.allows("mlx5_1", 1));
        assert!(!f.allows("mlx5_10", 1), "= makes names exact");

        let f = HcaFilter::parse("^=mlx5_1:2").unwrap();
        assert!(f.exact && f.exclude);
        assert!(!f.allows("mlx5_1", 2));
        assert!(f.allows("mlx5_1", 1));
        assert!(f.allows("mlx5_10", 2));
    }

    #[test]
    fn empty_allows_all_and_rail_fields_are_accepted() {
        let f = HcaFilter::parse("").unwrap();
        assert!(f.allows("anything", 3));
        let f = HcaFilter::parse(" mlx5_0:1:0:1 , ,mlx5_3 ").unwrap();
        assert_eq!(f.entries.len(), 2);
        assert_eq!(f.entries[0].port, Some(1));
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (spec, want) in [
            ("mlx5_0:x", "not a port number"),
            ("mlx5_0:0", "not a port number"),
            (":1", "no device name"),
            ("^", "names no device"),
            ("=", "names no device"),
            ("a:1:2:3:4", "too many"),
        ] {
            let e = HcaFilter::parse(spec).unwrap_err();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1", "irdma0", "mlx5_0"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["irdma0", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10"]);
    }

    #[test]
    fn local_ranks_spread_over_rails() {
        let nics: Vec<(usize, Option<PathBuf>)> = (0..8).map(|i| (i, None)).collect();
        let pick = |lr| pick_for_local_rank(&nics, lr, None, |n| n.1.as_deref());
        let picks: Vec<_> = (0..8).map(|lr| pick(lr).unwrap()).collect();
        assert_eq!(
            picks,
            (0..8).collect::<Vec<_>>(),
            "every rail carries a rank"
        );
        assert_eq!(pick(9), Some(1), "modulo the NIC count beyond it");
        let none: Vec<(usize, Option<PathBuf>)> = vec![];
        assert_eq!(
            pick_for_local_rank(&none, 0, None, |n| n.1.as_deref()),
            None
        );
    }

    #[test]
    fn gpu_pci_distance_wins() {
        let p = |s: &str| Some(PathBuf::from(s));
        let nics = vec![
            p("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
            p("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"),
            p("/sys/devices/pci0000:80/0000:80:02.0/0000:83:00.0"),
        ];
        let gpu = PathBuf::from("/sys/devices/pci0000:80/0000:80:02.0/0000:84:00.0");
        let pick = |lr| pick_for_local_rank(&nics, lr, Some(&gpu), |n| n.as_deref());
        assert_eq!(pick(0), Some(2), "the NIC behind the GPU's own bridge");
        assert_eq!(pick(5), Some(2));
        let gpu = PathBuf::from("/sys/devices/pci0000:80/0000:80:03.0/0000:85:00.0");
        let pick = |lr| pick_for_local_rank(&nics, lr, Some(&gpu), |n| n.as_deref());
        assert_eq!(
            (pick(0), pick(1)),
            (Some(1), Some(2)),
            "same root complex: the ranks share those NICs"
        );
    }
}
