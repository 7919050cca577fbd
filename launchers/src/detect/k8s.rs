//! Kubernetes Indexed Jobs, alone or as the child Job of a JobSet.
//!
//! Kubernetes gives each pod only its index (JOB_COMPLETION_INDEX); the number of pods and
//! the pods' DNS names are in the spec, not in the pod. So the world size comes from
//! `--world-size` or BUSBW_WORLD_SIZE (set it to the Job's `completions`), and rank 0's host
//! from a pattern with `{index}` (`--host-pattern`, BUSBW_HOST_PATTERN), e.g.
//! `myjob-{index}.mysvc` for an Indexed Job whose pods set `subdomain: mysvc`.
//!
//! # JobSet
//!
//! JobSet sets no variables of its own, but its labels can be passed through the downward
//! API as JOBSET_NAME (`jobset.sigs.k8s.io/jobset-name`), REPLICATED_JOB_NAME
//! (`jobset.sigs.k8s.io/replicatedjob-name`) and JOB_INDEX (`jobset.sigs.k8s.io/job-index`).
//! With them the pattern defaults to `<jobset>-<rjob>-0-{index}.<jobset>`. That assumes one
//! child Job (`replicas: 1`, so pods are numbered by JOB_COMPLETION_INDEX alone) and the
//! default subdomain (the JobSet's name); a JobSet with `network.subdomain` set needs an
//! explicit pattern, and one with several child Jobs is refused rather than given clashing
//! ranks.

use super::{count, Ctx, Found, Rank0};
use crate::world::{invalid, parse_count, Position, WorldError};

/// `Ok(None)` when JOB_COMPLETION_INDEX is not set.
pub(crate) fn detect(cx: &mut Ctx) -> Result<Option<Found>, WorldError> {
    let Some(index) = count(cx, "JOB_COMPLETION_INDEX")? else {
        return Ok(None);
    };
    let size = match cx.opts.world_size {
        Some(n) => {
            cx.note(format!("Indexed Job: {n} pod(s) from --world-size"));
            n
        }
        None => match cx.get("BUSBW_WORLD_SIZE") {
            Some(v) => {
                let n = parse_count("BUSBW_WORLD_SIZE", &v)?;
                cx.note(format!("Indexed Job: {n} pod(s) from BUSBW_WORLD_SIZE"));
                n
            }
            None => {
                return Err(WorldError::Missing {
                    var: "BUSBW_WORLD_SIZE",
                    why: "JOB_COMPLETION_INDEX gives this pod's index but not the number of \
                          pods: set it to the Job's completions, or pass --world-size"
                        .into(),
                })
            }
        },
    };
    if size == 0 {
        return Err(invalid(
            "BUSBW_WORLD_SIZE",
            "0",
            "a job needs at least one pod",
        ));
    }
    if index >= size {
        return Err(invalid(
            "JOB_COMPLETION_INDEX",
            &index.to_string(),
            &format!("indices are 0..{size} with a world size of {size}"),
        ));
    }
    if let Some(j) = cx.get("JOB_INDEX") {
        if parse_count("JOB_INDEX", &j)? != 0 {
            return Err(invalid(
                "JOB_INDEX",
                &j,
                "busbw ranks pods by JOB_COMPLETION_INDEX alone, which supports one child Job \
                 per JobSet (replicatedJobs[].replicas: 1)",
            ));
        }
    }
    let pattern = if let Some(p) = cx
        .opts
        .host_pattern
        .clone()
        .filter(|p| !p.trim().is_empty())
    {
        Some((p.trim().to_string(), "--host-pattern".to_string()))
    } else if let Some(p) = cx.get("BUSBW_HOST_PATTERN") {
        Some((p, "BUSBW_HOST_PATTERN".to_string()))
    } else if let (Some(js), Some(rj)) = (cx.get("JOBSET_NAME"), cx.get("REPLICATED_JOB_NAME")) {
        Some((
            format!("{js}-{rj}-0-{{index}}.{js}"),
            "JOBSET_NAME and REPLICATED_JOB_NAME (one child Job, default subdomain)".to_string(),
        ))
    } else {
        None
    };
    cx.note(format!("Indexed Job: JOB_COMPLETION_INDEX={index}"));
    let rank0 = match pattern {
        Some((p, from)) => {
            check_pattern(&p, &from)?;
            Rank0::Derived {
                host: p.replace("{index}", "0"),
                how: format!("host pattern {p} from {from}, index 0"),
            }
        }
        None => Rank0::Unknown(
            "an Indexed Job does not say where rank 0 runs: pass --host-pattern (or \
             BUSBW_HOST_PATTERN) such as myjob-{index}.mysvc, or JOBSET_NAME and \
             REPLICATED_JOB_NAME under a JobSet"
                .into(),
        ),
    };
    Ok(Some(Found {
        pos: Position {
            rank: index,
            size,
            local_rank: 0,
            local_size: 1,
        },
        rank0,
    }))
}

/// Catch `{idx}`-style typos: they would otherwise become part of a host name that never
/// resolves, reported only after the whole rendezvous timeout.
fn check_pattern(p: &str, from: &str) -> Result<(), WorldError> {
    let rest = p.replace("{index}", "");
    if rest.contains('{') || rest.contains('}') {
        return Err(WorldError::InvalidVar {
            var: from.to_string(),
            value: p.to_string(),
            why: "the only placeholder is {index}".into(),
        });
    }
    if p.chars().any(char::is_whitespace) {
        return Err(WorldError::InvalidVar {
            var: from.to_string(),
            value: p.to_string(),
            why: "a host name has no spaces".into(),
        });
    }
    Ok(())
}
