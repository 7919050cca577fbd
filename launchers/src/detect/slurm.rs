//! Slurm: `srun` starts every rank with its task id and the step's node list.
//!
//! Rank 0 runs on the first node of the step (Slurm's block and cyclic distributions both put
//! task 0 there; only `-m arbitrary` with a host file can move it, and then MASTER_ADDR must be
//! given). Node lists are compressed hostlist expressions, so they are expanded here rather
//! than by calling `scontrol show hostnames`, which may not exist inside a container.

use super::{check_rank, count, Ctx, Found, Rank0};
use crate::world::{invalid, Position, WorldError};

/// Largest node list [`expand_nodelist`] expands: far beyond any cluster, small enough that a
/// typo like `node[0-99999999999]` fails instead of exhausting memory.
pub const MAX_NODES: usize = 1 << 20;

/// `Ok(None)` when SLURM_PROCID is not set, or (unless `forced`) when SLURM_NTASKS is not:
/// an `sbatch` script without `--ntasks` has a task id but describes no job of ranks.
pub(crate) fn detect(cx: &mut Ctx, forced: bool) -> Result<Option<Found>, WorldError> {
    let Some(rank) = count(cx, "SLURM_PROCID")? else {
        return Ok(None);
    };
    let (size_var, size) = match count(cx, "SLURM_NTASKS")? {
        Some(n) => ("SLURM_NTASKS", n),
        None => match count(cx, "SLURM_NPROCS")? {
            Some(n) => ("SLURM_NPROCS", n),
            None if forced => {
                return Err(WorldError::Missing {
                    var: "SLURM_NTASKS",
                    why: "SLURM_PROCID is: run busbw under `srun` (or give sbatch --ntasks)".into(),
                })
            }
            None => {
                cx.note("SLURM_PROCID is set without SLURM_NTASKS: not a Slurm job step");
                return Ok(None);
            }
        },
    };
    check_rank("SLURM_PROCID", rank, size_var, size)?;
    let local_rank = count(cx, "SLURM_LOCALID")?.unwrap_or(0);
    let local_size = local_size(cx, local_rank)?;
    if local_rank >= local_size {
        return Err(invalid(
            "SLURM_LOCALID",
            &local_rank.to_string(),
            &format!("this node runs {local_size} task(s) of the step"),
        ));
    }
    cx.note(format!(
        "Slurm: SLURM_PROCID={rank} {size_var}={size} SLURM_LOCALID={local_rank}"
    ));
    let mut rank0 = Rank0::Unknown(
        "Slurm gave no node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST): \
         set MASTER_ADDR or pass --master-addr"
            .into(),
    );
    for var in [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ] {
        if let Some(list) = cx.get(var) {
            let host = first_node(&list).map_err(|e| invalid(var, &list, &e.why))?;
            rank0 = Rank0::Derived {
                host,
                how: format!("first node of {var}={list}"),
            };
            break;
        }
    }
    Ok(Some(Found {
        pos: Position {
            rank,
            size,
            local_rank,
            local_size,
        },
        rank0,
    }))
}

/// Tasks on this node. SLURM_NTASKS_PER_NODE exists only with `--ntasks-per-node`; the
/// step's and the job's per-node lists ("2(x3),1") always exist and are indexed by
/// SLURM_NODEID, since nodes of one step may run different numbers of tasks.
fn local_size(cx: &mut Ctx, local_rank: usize) -> Result<usize, WorldError> {
    for var in [
        "SLURM_NTASKS_PER_NODE",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
    ] {
        let Some(v) = cx.get(var) else { continue };
        let per_node = parse_tasks_per_node(&v).map_err(|why| invalid(var, &v, &why))?;
        let node = count(cx, "SLURM_NODEID")?;
        let n = match (node, per_node.as_slice()) {
            (_, [one]) => *one,
            (Some(i), list) => match list.get(i) {
                Some(n) => *n,
                None => {
                    return Err(invalid(
                        "SLURM_NODEID",
                        &i.to_string(),
                        &format!("{var}={v} lists only {} node(s)", list.len()),
                    ))
                }
            },
            (None, list) if list.iter().all(|n| *n == list[0]) => list[0],
            (None, _) => continue,
        };
        return Ok(n);
    }
    cx.note("Slurm gave no tasks-per-node count: the local size is a lower bound");
    Ok(local_rank + 1)
}

/// "2", "2(x4)", "2(x3),1" → one count per node.
fn parse_tasks_per_node(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (n, times) = match part.split_once('(') {
            None => (part, 1usize),
            Some((n, rest)) => {
                let times = rest
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .and_then(|r| r.parse().ok())
                    .ok_or_else(|| format!("{part:?} is not N or N(xM)"))?;
                (n, times)
            }
        };
        let n: usize = n
            .parse()
            .map_err(|_| format!("{part:?} is not N or N(xM)"))?;
        if out.len().saturating_add(times) > MAX_NODES {
            return Err(format!("describes more than {MAX_NODES} nodes"));
        }
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

/// A Slurm node list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read Slurm node list {list:?}: {why}")]
pub struct NodelistError {
    pub list: String,
    pub why: String,
}

/// One piece of a host expression: literal text or a bracketed set of numeric ranges.
#[derive(Debug)]
enum Part {
    Lit(String),
    /// `(lo, hi, width)`: numbers lo..=hi, zero-padded to `width` digits.
    Ranges(Vec<(u64, u64, usize)>),
}

/// Expand a Slurm hostlist expression: `node[01-04,07],gpu-a[1-2]` → node01 … node04,
/// node07, gpu-a1, gpu-a2. Commas inside brackets separate ranges, outside them hosts;
/// zero padding follows the lower bound's digits (`[08-11]` → 08, 09, 10, 11); several
/// bracket groups in one host expand as a product, last group fastest
/// (`r[1-2]n[1-2]` → r1n1, r1n2, r2n1, r2n2); a prefix may hold digits and dashes
/// (`rack1-node[1-2]`).
pub fn expand_nodelist(list: &str) -> Result<Vec<String>, NodelistError> {
    let items = parse(list)?;
    let mut out = Vec::new();
    for parts in &items {
        let mut hosts = vec![String::new()];
        for part in parts {
            match part {
                Part::Lit(s) => hosts.iter_mut().for_each(|h| h.push_str(s)),
                Part::Ranges(ranges) => {
                    let n: u64 = ranges.iter().map(|(lo, hi, _)| hi - lo + 1).sum();
                    let total = (hosts.len() as u64)
                        .saturating_mul(n)
                        .saturating_add(out.len() as u64);
                    if total > MAX_NODES as u64 {
                        return Err(err(list, format!("expands to more than {MAX_NODES} hosts")));
                    }
                    let mut next = Vec::with_capacity(hosts.len() * n as usize);
                    for h in &hosts {
                        for &(lo, hi, width) in ranges {
                            for i in lo..=hi {
                                next.push(format!("{h}{i:0width$}"));
                            }
                        }
                    }
                    hosts = next;
                }
            }
        }
        out.extend(hosts);
    }
    Ok(out)
}

/// The first host of a node list, without expanding the rest.
pub fn first_node(list: &str) -> Result<String, NodelistError> {
    let items = parse(list)?;
    let mut host = String::new();
    // parse() guarantees at least one item, and every range set at least one range.
    if let Some(parts) = items.first() {
        for part in parts {
            match part {
                Part::Lit(s) => host.push_str(s),
                Part::Ranges(r) => {
                    if let Some(&(lo, _, width)) = r.first() {
                        host.push_str(&format!("{lo:0width$}"));
                    }
                }
            }
        }
    }
    Ok(host)
}

fn err(list: &str, why: impl Into<String>) -> NodelistError {
    NodelistError {
        list: list.to_string(),
        why: why.into(),
    }
}

fn parse(list: &str) -> Result<Vec<Vec<Part>>, NodelistError> {
    let s = list.trim();
    if s.is_empty() {
        return Err(err(list, "it is empty"));
    }
    let mut items: Vec<Vec<Part>> = Vec::new();
    let mut parts: Vec<Part> = Vec::new();
    let mut lit = String::new();
    let mut chars = s.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            ',' => {
                if !lit.is_empty() {
                    parts.push(Part::Lit(std::mem::take(&mut lit)));
                }
                if parts.is_empty() {
                    return Err(err(list, format!("empty host name before ',' at {at}")));
                }
                items.push(std::mem::take(&mut parts));
            }
            '[' => {
                let mut inner = String::new();
                let mut closed = false;
                for (_, c) in chars.by_ref() {
                    match c {
                        ']' => {
                            closed = true;
                            break;
                        }
                        '[' => return Err(err(list, format!("nested '[' in the group at {at}"))),
                        c => inner.push(c),
                    }
                }
                if !closed {
                    return Err(err(list, format!("'[' at {at} is never closed")));
                }
                if !lit.is_empty() {
                    parts.push(Part::Lit(std::mem::take(&mut lit)));
                }
                parts.push(Part::Ranges(parse_ranges(&inner).map_err(|why| {
                    err(list, format!("in [{inner}] at {at}: {why}"))
                })?));
            }
            ']' => return Err(err(list, format!("']' at {at} has no matching '['"))),
            c if c.is_whitespace() || c.is_control() => {
                return Err(err(list, format!("unexpected {c:?} at {at}")))
            }
            c => lit.push(c),
        }
    }
    if !lit.is_empty() {
        parts.push(Part::Lit(lit));
    }
    if parts.is_empty() {
        return Err(err(list, "it ends with ','"));
    }
    items.push(parts);
    Ok(items)
}

fn parse_ranges(inner: &str) -> Result<Vec<(u64, u64, usize)>, String> {
    let mut out = Vec::new();
    for r in inner.split(',') {
        let r = r.trim();
        let (lo_s, hi_s) = r.split_once('-').unwrap_or((r, r));
        let num = |t: &str| -> Result<u64, String> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{r:?} is not N or N-M"));
            }
            t.parse().map_err(|_| format!("{t:?} is too large"))
        };
        let (lo, hi) = (num(lo_s)?, num(hi_s)?);
        if lo > hi {
            return Err(format!("{r:?} runs backwards"));
        }
        if hi - lo >= MAX_NODES as u64 {
            return Err(format!("{r:?} spans more than {MAX_NODES} hosts"));
        }
        out.push((lo, hi, lo_s.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> Vec<String> {
        expand_nodelist(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn expands_slurm_hostlists() {
        assert_eq!(ex("node01"), ["node01"]);
        assert_eq!(
            ex("node[01-04,07],gpu-a[1-2]"),
            ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"]
        );
        assert_eq!(ex("a1,b[2-3]"), ["a1", "b2", "b3"]);
        assert_eq!(ex("rack1-node[1-2]"), ["rack1-node1", "rack1-node2"]);
        assert_eq!(ex("n[08-11]"), ["n08", "n09", "n10", "n11"]);
        assert_eq!(ex("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(ex("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(ex("n[0-0]"), ["n0"]);
        assert_eq!(ex("[1-2]x"), ["1x", "2x"]);
        assert_eq!(ex("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
        assert_eq!(ex("r[1-2]-n[07]"), ["r1-n07", "r2-n07"]);
        assert_eq!(
            ex(" ip-10-0-1-[5,17],host.example.com "),
            ["ip-10-0-1-5", "ip-10-0-1-17", "host.example.com"]
        );
        assert_eq!(ex("n[1-3, 5]"), ["n1", "n2", "n3", "n5"]);
    }

    #[test]
    fn first_node_matches_expansion() {
        for s in [
            "node[01-04,07],gpu-a[1-2]",
            "a1,b[2-3]",
            "rack1-node[1-2]",
            "r[3-4]n[007-9]",
            "[5]",
            "x",
        ] {
            assert_eq!(first_node(s).unwrap(), ex(s)[0], "{s}");
        }
        assert_eq!(first_node("node[01-04,07],gpu-a[1-2]").unwrap(), "node01");
        assert_eq!(first_node("a1,b[2-3]").unwrap(), "a1");
        // Huge lists are fine when only the first host is needed.
        assert_eq!(first_node("n[0-999999],m[0-999999]").unwrap(), "n0");
    }

    #[test]
    fn malformed_lists_say_why() {
        for (s, why) in [
            ("", "empty"),
            ("n[1-2", "never closed"),
            ("n1-2]", "no matching"),
            ("n[[1]]", "nested"),
            ("n[]", "not N or N-M"),
            ("n[a-b]", "not N or N-M"),
            ("n[3-1]", "backwards"),
            ("n[1-]", "not N or N-M"),
            ("a,,b", "empty host name"),
            (",a", "empty host name"),
            ("a,", "ends with"),
            ("a b", "unexpected ' '"),
            ("n[1-99999999999999999999]", "too large"),
            ("n[0-9999999]", "spans more than"),
        ] {
            let e = expand_nodelist(s).unwrap_err();
            assert!(e.why.contains(why), "{s:?}: {e}");
            assert!(e.to_string().contains(&format!("{s:?}")), "{e}");
        }
        let e = expand_nodelist("a[0-999999],b[0-999999]").unwrap_err();
        assert!(e.why.contains("more than"), "{e}");
        let e = expand_nodelist("a[0-1023]b[0-1024]").unwrap_err();
        assert!(e.why.contains("more than"), "{e}");
    }

    #[test]
    fn tasks_per_node_lists() {
        assert_eq!(parse_tasks_per_node("2").unwrap(), [2]);
        assert_eq!(parse_tasks_per_node("2(x4)").unwrap(), [2, 2, 2, 2]);
        assert_eq!(parse_tasks_per_node("2(x2),1").unwrap(), [2, 2, 1]);
        for bad in ["", "x", "2(4)", "2(x)", "2(x4", "-1"] {
            assert!(parse_tasks_per_node(bad).is_err(), "{bad}");
        }
        assert!(parse_tasks_per_node("1(x99999999)").is_err());
    }
}
