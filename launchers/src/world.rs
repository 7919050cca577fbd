//! Who this process is in the job, read from the launcher's environment.

use std::ffi::CStr;

/// This rank's place in the job and where to find the rendezvous store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct World {
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    /// Host serving the store (rank 0's). Empty only for a single-rank job that was given no
    /// address, which then needs no store server at all.
    pub master_addr: String,
    /// 0 only together with an empty `master_addr`.
    pub master_port: u16,
    pub hostname: String,
}

/// A launcher variable is missing or malformed. The message names the variable and the value,
/// because the usual cause is a typo in a job spec that the user must find.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorldError {
    #[error("{var} is not set but {why}")]
    Missing { var: &'static str, why: String },
    #[error("{var}={value:?} is invalid: {why}")]
    Invalid {
        var: &'static str,
        value: String,
        why: String,
    },
    /// Like `Invalid`, for a variable or file whose name is only known at run time (Volcano's
    /// per-task `VC_<TASK>_NUM`, `/etc/volcano/<task>.host`).
    #[error("{var}={value:?} is invalid: {why}")]
    InvalidVar {
        var: String,
        value: String,
        why: String,
    },
    /// The launcher's description is incomplete or contradictory in a way no single variable
    /// explains; the message says what to change.
    #[error("{0}")]
    Launcher(String),
}

impl World {
    /// A one-rank job that needs no store server.
    pub fn single() -> Self {
        Self {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            master_addr: String::new(),
            master_port: 0,
            hostname: hostname(),
        }
    }

    /// Read torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    /// MASTER_ADDR, MASTER_PORT) from the process environment. `Ok(None)` means no launcher
    /// described a job (neither RANK nor WORLD_SIZE is set).
    pub fn from_env() -> Result<Option<Self>, WorldError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`Self::from_env`] over an arbitrary lookup, so tests and other launcher front-ends
    /// (which translate their own variables) need not touch the process environment.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, WorldError> {
        // Job specs often template variables to "" when a value is absent; treat that as unset.
        let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        let Some(Position {
            rank,
            size,
            local_rank,
            local_size,
        }) = torchrun_position(&get)?
        else {
            return Ok(None);
        };
        let need = |var: &'static str| WorldError::Missing {
            var,
            why: format!("WORLD_SIZE={size}: the ranks need rank 0's address to rendezvous"),
        };
        let master_addr = match get("MASTER_ADDR") {
            Some(a) => a.trim().to_string(),
            None if size > 1 => return Err(need("MASTER_ADDR")),
            None => String::new(),
        };
        let master_port = match get("MASTER_PORT") {
            Some(p) => parse_port("MASTER_PORT", &p)?,
            None if !master_addr.is_empty() => return Err(need("MASTER_PORT")),
            None => 0,
        };
        Ok(Some(Self {
            rank,
            size,
            local_rank,
            local_size,
            master_addr,
            master_port,
            hostname: hostname(),
        }))
    }

    /// `host:port` of the store, with IPv6 literals bracketed; `None` if there is none.
    pub fn store_addr(&self) -> Option<String> {
        if self.master_addr.is_empty() {
            return None;
        }
        let host = &self.master_addr;
        Some(if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{}", self.master_port)
        } else {
            format!("{host}:{}", self.master_port)
        })
    }
}

/// Process `local` of `g` started on the pod (or Slurm task) that `pod` describes, for
/// `--nproc-per-node g`: cluster launchers number pods, busbw numbers processes.
///
/// Global ranks are pod-major (`pod.rank * g + local`) so that a pod's processes are
/// consecutive, as torchrun numbers them: ring neighbours then mostly share a host and only
/// one ring link per pod crosses the network. Local numbering multiplies the same way, which
/// reduces to
/// `local` of `g` for the usual one pod per node and stays correct when a launcher already
/// put several tasks on one node.
pub fn expand(pod: &World, g: usize, local: usize) -> World {
    World {
        rank: pod.rank * g + local,
        size: pod.size * g,
        local_rank: pod.local_rank * g + local,
        local_size: pod.local_size * g,
        master_addr: pod.master_addr.clone(),
        master_port: pod.master_port,
        hostname: pod.hostname.clone(),
    }
}

pub(crate) fn invalid(var: &'static str, value: &str, why: &str) -> WorldError {
    WorldError::Invalid {
        var,
        value: value.to_string(),
        why: why.to_string(),
    }
}

/// Where a process sits in the job, before anyone has said where rank 0 is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: usize,
}

/// RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE through `get` (which already treats ""
/// as unset); `None` when neither RANK nor WORLD_SIZE is set.
pub(crate) fn torchrun_position(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Position>, WorldError> {
    let rank_s = get("RANK");
    let size_s = get("WORLD_SIZE");
    let (rank_s, size_s) = match (rank_s, size_s) {
        (None, None) => return Ok(None),
        (Some(_), None) => {
            return Err(WorldError::Missing {
                var: "WORLD_SIZE",
                why: "RANK is, so the launcher described only half a job".into(),
            })
        }
        (None, Some(_)) => {
            return Err(WorldError::Missing {
                var: "RANK",
                why: "WORLD_SIZE is, so the launcher described only half a job".into(),
            })
        }
        (Some(r), Some(s)) => (r, s),
    };
    let size = parse_count("WORLD_SIZE", &size_s)?;
    if size == 0 {
        return Err(invalid(
            "WORLD_SIZE",
            &size_s,
            "a job needs at least one rank",
        ));
    }
    let rank = parse_count("RANK", &rank_s)?;
    if rank >= size {
        return Err(invalid(
            "RANK",
            &rank_s,
            &format!("ranks are 0..{size} with WORLD_SIZE={size}"),
        ));
    }
    let local_size = match get("LOCAL_WORLD_SIZE") {
        None => 1,
        Some(v) => {
            let n = parse_count("LOCAL_WORLD_SIZE", &v)?;
            if n == 0 || n > size {
                return Err(invalid(
                    "LOCAL_WORLD_SIZE",
                    &v,
                    &format!("must be between 1 and WORLD_SIZE={size}"),
                ));
            }
            n
        }
    };
    let local_rank = match get("LOCAL_RANK") {
        None => 0,
        Some(v) => {
            let n = parse_count("LOCAL_RANK", &v)?;
            if n >= local_size {
                return Err(invalid(
                    "LOCAL_RANK",
                    &v,
                    &format!("local ranks are 0..{local_size} with LOCAL_WORLD_SIZE={local_size}"),
                ));
            }
            n
        }
    };
    Ok(Some(Position {
        rank,
        size,
        local_rank,
        local_size,
    }))
}

/// A store port from a variable: rank 0 binds it and everyone else dials it, so it must be a
/// real port number that all ranks can know in advance.
pub(crate) fn parse_port(var: &'static str, value: &str) -> Result<u16, WorldError> {
    let port: u16 = value
        .trim()
        .parse()
        .map_err(|_| invalid(var, value, "expected a TCP port number (1-65535)"))?;
    if port == 0 {
        return Err(invalid(
            var,
            value,
            "port 0 would let rank 0 pick a port nobody else knows",
        ));
    }
    Ok(port)
}

pub(crate) fn parse_count(var: &'static str, value: &str) -> Result<usize, WorldError> {
    value
        .trim()
        .parse()
        .map_err(|_| invalid(var, value, "expected a non-negative integer"))
}

/// This host's name in full. Node identity in reports and shm-transport eligibility both key
/// on it, so a silently truncated name (what a fixed-size buffer gives on long FQDNs) would
/// merge or split nodes.
pub fn hostname() -> String {
    let mut cap = 256usize;
    while cap <= 64 * 1024 {
        let mut buf = vec![0u8; cap];
        // SAFETY: the buffer is valid for `cap` bytes and gethostname writes at most that many.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), cap) };
        // POSIX leaves it unspecified whether a truncated name is NUL-terminated or reported
        // as an error, so accept the result only if the NUL lies strictly inside the buffer.
        if rc == 0 {
            if let Some(nul) = buf[..cap - 1].iter().position(|&b| b == 0) {
                if let Ok(c) = CStr::from_bytes_with_nul(&buf[..=nul]) {
                    return c.to_string_lossy().into_owned();
                }
            }
        }
        cap *= 4;
    }
    busbw_transports::platform::Platform::active()
        .kernel_hostname()
        .unwrap_or_else(|| "unknown-host".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn world(vars: &[(&str, &str)]) -> Result<Option<World>, WorldError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        World::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn happy_path() {
        let w = world(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node-0.svc"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((w.rank, w.size, w.local_rank, w.local_size), (5, 8, 1, 4));
        assert_eq!(w.master_addr, "node-0.svc");
        assert_eq!(w.master_port, 29500);
        assert_eq!(w.store_addr().unwrap(), "node-0.svc:29500");
        assert_eq!(w.hostname, hostname());
    }

    #[test]
    fn defaults_and_absent() {
        assert_eq!(world(&[]).unwrap(), None);
        let w = world(&[("RANK", "0"), ("WORLD_SIZE", "1")])
            .unwrap()
            .unwrap();
        assert_eq!((w.local_rank, w.local_size), (0, 1));
        assert_eq!(w.store_addr(), None);
        let w = world(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "fd00::1"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(w.store_addr().unwrap(), "[fd00::1]:1234");
    }

    #[test]
    fn errors_name_variable_and_value() {
        let e = world(&[("RANK", "4"), ("WORLD_SIZE", "4")]).unwrap_err();
        assert!(matches!(e, WorldError::Invalid { var: "RANK", ref value, .. } if value == "4"));
        assert!(e.to_string().contains("RANK=\"4\""), "{e}");

        let e = world(&[("RANK", "x1"), ("WORLD_SIZE", "4")]).unwrap_err();
        assert!(e.to_string().contains("RANK=\"x1\""), "{e}");

        let e = world(&[("RANK", "1")]).unwrap_err();
        assert!(matches!(
            e,
            WorldError::Missing {
                var: "WORLD_SIZE",
                ..
            }
        ));

        let e = world(&[("RANK", "1"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(
            matches!(
                e,
                WorldError::Missing {
                    var: "MASTER_ADDR",
                    ..
                }
            ),
            "{e}"
        );

        let e = world(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err();
        assert!(
            matches!(
                e,
                WorldError::Missing {
                    var: "MASTER_PORT",
                    ..
                }
            ),
            "{e}"
        );

        let base = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];
        let e = world(&[base[0], base[1], base[2], ("MASTER_PORT", "70000")]).unwrap_err();
        assert!(e.to_string().contains("MASTER_PORT=\"70000\""), "{e}");

        let e = world(&[("RANK", "0"), ("WORLD_SIZE", "0")]).unwrap_err();
        assert!(matches!(
            e,
            WorldError::Invalid {
                var: "WORLD_SIZE",
                ..
            }
        ));

        let e = world(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "1"),
        ])
        .unwrap_err();
        assert!(matches!(
            e,
            WorldError::Invalid {
                var: "LOCAL_RANK",
                ..
            }
        ));
    }

    #[test]
    fn expand_numbers_processes_pod_major() {
        let pod = World {
            rank: 2,
            size: 4,
            local_rank: 0,
            local_size: 1,
            master_addr: "job-rank-0.job".into(),
            master_port: 29500,
            hostname: "job-rank-2".into(),
        };
        let w = expand(&pod, 8, 3);
        assert_eq!((w.rank, w.size, w.local_rank, w.local_size), (19, 32, 3, 8));
        assert_eq!(
            (w.master_addr.as_str(), w.master_port),
            ("job-rank-0.job", 29500)
        );
        assert_eq!(w.hostname, "job-rank-2");
        assert_eq!(expand(&pod, 1, 0), pod);
        // Two Slurm tasks per node, each starting 2 processes: 4 local ranks per node.
        let task = World {
            rank: 3,
            size: 4,
            local_rank: 1,
            local_size: 2,
            ..pod
        };
        let w = expand(&task, 2, 1);
        assert_eq!((w.rank, w.size, w.local_rank, w.local_size), (7, 8, 3, 4));
    }

    #[test]
    fn hostname_matches_kernel() {
        let h = hostname();
        assert!(!h.is_empty());
        if let Ok(k) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            assert_eq!(h, k.trim());
        }
    }
}
