//! Volcano Jobs with the `env` and `svc` plugins, no SSH and no MPI.
//!
//! The env plugin gives each pod its index within its task (VC_TASK_INDEX, legacy
//! VK_TASK_INDEX) and nothing else; the svc plugin gives every task's host list and size,
//! as variables `VC_<TASK>_HOSTS` (comma-separated) and `VC_<TASK>_NUM` (TASK upper-cased,
//! '-' → '_') and as files `<volcano_dir>/<task>.host` (one `<pod>.<job>` per line; '-' →
//! '_', case kept). Together they place this pod in the job.
//!
//! # Multi-task jobs
//!
//! Ranks are numbered task by task: a task named `master` first (Volcano's pytorch and mpi
//! plugins use that name for rank 0's task), then the others in alphabetical order of their
//! names with '-' read as '_'; within a task, by VC_TASK_INDEX. Rank 0's host is the first
//! host of the first task.
//!
//! This pod's task is the one whose host list holds this host's name (compared up to the
//! first '.'). With `hostNetwork: true` the host name is the node's, not the pod's; a
//! single-task job needs no match, a multi-task one needs the pod name in `POD_NAME`
//! (downward API `metadata.name`).

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use super::{Ctx, Found, Rank0};
use crate::world::{invalid, parse_count, Position, WorldError};

/// One task of the job as the svc plugin describes it.
#[derive(Debug)]
struct Task {
    /// Name as in the ConfigMap keys: '-' replaced by '_', lower case.
    key: String,
    hosts: Option<Vec<String>>,
    size: usize,
}

/// `Ok(None)` when neither VC_TASK_INDEX nor VK_TASK_INDEX is set.
pub(crate) fn detect(cx: &mut Ctx) -> Result<Option<Found>, WorldError> {
    let (index_var, index_s) = match (cx.get("VC_TASK_INDEX"), cx.get("VK_TASK_INDEX")) {
        (Some(v), _) => ("VC_TASK_INDEX", v),
        (None, Some(v)) => ("VK_TASK_INDEX", v),
        (None, None) => return Ok(None),
    };
    let index = parse_count(index_var, &index_s)?;
    let dir = cx.opts.volcano_dir.clone();
    let pod_names = pod_names(cx);

    let mut keys = BTreeSet::new();
    for name in list_dir(&dir)? {
        if let Some(stem) = name.strip_suffix(".host") {
            keys.insert(stem.to_ascii_lowercase());
        } else if let Some(k) = task_of_var(&name) {
            keys.insert(k);
        }
    }
    keys.extend(cx.env_names.iter().filter_map(|n| task_of_var(n)));
    let listed = !keys.is_empty();
    // Without a listing of the environment, the pod name still says which task this pod
    // belongs to: `<job>-<task>-<index>`, where job and task may themselves contain '-'.
    for pod in &pod_names {
        keys.extend(task_candidates(pod));
    }

    let mut tasks = Vec::new();
    for key in keys {
        if let Some(t) = load_task(cx, &dir, &key)? {
            tasks.push(t);
        }
    }
    if tasks.is_empty() {
        return Err(WorldError::Launcher(format!(
            "{index_var}={index_s} says this is a Volcano pod, but no task list was found (no \
             VC_<TASK>_NUM / VC_<TASK>_HOSTS variables, no {}/<task>.host files): enable the \
             svc plugin (plugins: {{env: [], svc: []}}) or set RANK, WORLD_SIZE and \
             MASTER_ADDR",
            dir.display()
        )));
    }
    if !listed {
        cx.note(format!(
            "no {} mount and no list of variables: tasks were found from the pod name alone, \
             so a task whose name it does not contain would be missed",
            dir.display()
        ));
    }
    // BTreeSet order is alphabetical already; only `master` moves.
    tasks.sort_by_key(|t| t.key != "master");
    let order: Vec<&str> = tasks.iter().map(|t| t.key.as_str()).collect();

    let ours = match find_ours(&tasks, &pod_names) {
        Some(i) => i,
        None if tasks.len() == 1 => {
            cx.note(format!(
                "host name {} is not in task {}'s host list; it is the only task, so this pod \
                 belongs to it (hostNetwork pods carry the node's name)",
                cx.opts.hostname, tasks[0].key
            ));
            0
        }
        None => {
            return Err(WorldError::Launcher(format!(
                "cannot tell which Volcano task this pod belongs to: host name {:?} is in none \
                 of the host lists of tasks {}; with hostNetwork the host name is the node's, \
                 so pass the pod name in POD_NAME (downward API metadata.name)",
                cx.opts.hostname,
                order.join(", ")
            )))
        }
    };
    let task = &tasks[ours];
    if index >= task.size {
        return Err(invalid(
            index_var,
            &index_s,
            &format!("task {} has {} pod(s)", task.key, task.size),
        ));
    }
    let offset: usize = tasks[..ours].iter().map(|t| t.size).sum();
    let size: usize = tasks.iter().map(|t| t.size).sum();
    cx.note(format!(
        "Volcano: {index_var}={index} in task {} (tasks in rank order: {}; this task starts at \
         rank {offset})",
        task.key,
        tasks
            .iter()
            .map(|t| format!("{} x{}", t.key, t.size))
            .collect::<Vec<_>>()
            .join(", ")
    ));

    let rank0 = match tasks.iter().find(|t| t.size > 0) {
        Some(Task {
            hosts: Some(h),
            key,
            ..
        }) if !h.is_empty() => Rank0::Derived {
            host: h[0].clone(),
            how: format!("first host of task {key}"),
        },
        Some(t) => Rank0::Unknown(format!(
            "the host list of task {} (rank 0's) is not available: mount the svc plugin's \
             ConfigMap at {} or set MASTER_ADDR",
            t.key,
            dir.display()
        )),
        None => Rank0::Unknown("every task is empty".into()),
    };
    Ok(Some(Found {
        pos: Position {
            rank: offset + index,
            size,
            local_rank: 0,
            local_size: 1,
        },
        rank0,
    }))
}

/// Names this pod may go by: its host name, and POD_NAME when the job spec passes it.
fn pod_names(cx: &Ctx) -> Vec<String> {
    let mut v = vec![short(&cx.opts.hostname).to_string()];
    if let Some(p) = cx.get("POD_NAME") {
        v.push(short(&p).to_string());
    }
    v.retain(|n| !n.is_empty());
    v
}

fn short(host: &str) -> &str {
    host.split('.').next().unwrap_or(host)
}

/// `VC_MY_TASK_NUM` / `VC_MY_TASK_HOSTS` → `my_task`.
fn task_of_var(name: &str) -> Option<String> {
    let rest = name.strip_prefix("VC_")?;
    let key = rest
        .strip_suffix("_NUM")
        .or_else(|| rest.strip_suffix("_HOSTS"))?;
    (!key.is_empty()).then(|| key.to_ascii_lowercase())
}

/// `ccl-job-rank-3` → `rank`, `job_rank`, `ccl_job_rank`.
fn task_candidates(pod: &str) -> Vec<String> {
    let Some((stem, idx)) = pod.rsplit_once('-') else {
        return Vec::new();
    };
    if idx.is_empty() || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return Vec::new();
    }
    let fields: Vec<&str> = stem.split('-').collect();
    (0..fields.len())
        .rev()
        .map(|i| fields[i..].join("_").to_ascii_lowercase())
        .collect()
}

fn list_dir(dir: &Path) -> Result<Vec<String>, WorldError> {
    match std::fs::read_dir(dir) {
        Ok(rd) => Ok(rd
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(WorldError::Launcher(format!(
            "cannot list {}: {e}",
            dir.display()
        ))),
    }
}

fn read_opt(path: &Path) -> Result<Option<String>, WorldError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(WorldError::Launcher(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

fn split_hosts(s: &str, sep: char) -> Vec<String> {
    s.split(sep)
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect()
}

/// A task's host list and size from the variables (first: they are what the svc plugin
/// injects by default) or the mounted files; `None` if the task has neither.
fn load_task(cx: &mut Ctx, dir: &Path, key: &str) -> Result<Option<Task>, WorldError> {
    let upper = key.to_ascii_uppercase();
    let hosts_var = format!("VC_{upper}_HOSTS");
    let num_var = format!("VC_{upper}_NUM");
    let host_file: PathBuf = dir.join(format!("{key}.host"));

    let hosts = if let Some(v) = cx.get(&hosts_var) {
        Some((split_hosts(&v, ','), hosts_var.clone()))
    } else if let Some(s) = read_opt(&host_file)? {
        Some((split_hosts(&s, '\n'), host_file.display().to_string()))
    } else {
        read_opt(&dir.join(&hosts_var))?.map(|s| {
            (
                split_hosts(&s, ','),
                dir.join(&hosts_var).display().to_string(),
            )
        })
    };
    let num = match cx.get(&num_var) {
        Some(v) => Some((v, num_var.clone())),
        None => read_opt(&dir.join(&num_var))?.map(|s| {
            (
                s.trim().to_string(),
                dir.join(&num_var).display().to_string(),
            )
        }),
    };
    let num = match num {
        None => None,
        Some((v, from)) => match v.parse::<usize>() {
            Ok(n) => Some((n, from)),
            Err(_) => {
                return Err(WorldError::InvalidVar {
                    var: from,
                    value: v,
                    why: "expected a non-negative integer".into(),
                })
            }
        },
    };
    let size = match (&hosts, &num) {
        (None, None) => return Ok(None),
        (Some((h, from_h)), Some((n, from_n))) if h.len() != *n => {
            return Err(WorldError::InvalidVar {
                var: from_n.clone(),
                value: n.to_string(),
                why: format!("{from_h} lists {} host(s)", h.len()),
            })
        }
        (_, Some((n, _))) => *n,
        (Some((h, _)), None) => h.len(),
    };
    let from: Vec<&str> = [
        hosts.as_ref().map(|(_, f)| f.as_str()),
        num.as_ref().map(|(_, f)| f.as_str()),
    ]
    .into_iter()
    .flatten()
    .collect();
    cx.note(format!(
        "Volcano task {key}: {size} pod(s) from {}",
        from.join(" and ")
    ));
    Ok(Some(Task {
        key: key.to_string(),
        hosts: hosts.map(|(h, _)| h),
        size,
    }))
}

fn find_ours(tasks: &[Task], pod_names: &[String]) -> Option<usize> {
    pod_names.iter().find_map(|name| {
        tasks.iter().position(|t| {
            t.hosts
                .as_ref()
                .is_some_and(|h| h.iter().any(|e| short(e) == name))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            task_of_var("VC_MPI_WORKER_HOSTS").as_deref(),
            Some("mpi_worker")
        );
        assert_eq!(task_of_var("VC_RANK_NUM").as_deref(), Some("rank"));
        assert_eq!(task_of_var("VC_TASK_INDEX"), None);
        assert_eq!(task_of_var("VC__NUM"), None);
        assert_eq!(
            task_candidates("ccl-job-rank-3"),
            ["rank", "job_rank", "ccl_job_rank"]
        );
        assert!(task_candidates("node17").is_empty());
        assert!(task_candidates("gpu-node-a").is_empty());
    }
}
