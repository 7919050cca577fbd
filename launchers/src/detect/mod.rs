//! Who this process is, read from whatever launched it: torchrun (or Volcano's pytorch
//! plugin), Volcano's env and svc plugins, Slurm, an MPI launcher (Open MPI, or any PMI
//! launcher such as MPICH's and Intel MPI's hydra), or a Kubernetes Indexed Job / JobSet.
//!
//! One binary then runs unchanged under any of them, and no launcher needs a wrapper script
//! that translates its variables into torchrun's. Every source yields a [`World`] for this
//! process plus notes that say which variables and files were used, so `-v` can show why a
//! rank believes what it believes: the usual failure is a job spec that gives two launchers'
//! variables, or a typo, and the user must be able to see which one won.
//!
//! # Where rank 0 is
//!
//! For every source, rank 0's address is, in this order: [`DetectOptions::master_addr`]
//! (`--master-addr`), the `MASTER_ADDR` variable, then what the source itself implies (first
//! host of the first Volcano task, first node of the Slurm step, the Indexed Job host pattern
//! with index 0). An MPI launcher implies nothing, so there one of the first two is required.
//! The port is `MASTER_PORT`, else [`DetectOptions::port`] (`--port`), else 29500, torchrun's
//! default.

mod k8s;
mod mpi;
mod slurm;
mod volcano;

pub use slurm::{expand_nodelist, first_node, NodelistError};

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::local::LAUNCHED_ENV;
use crate::world::{self, parse_port, Position, World, WorldError};

/// Store port when neither the environment nor the command line names one (torchrun's).
pub const DEFAULT_PORT: u16 = 29500;

/// Which launcher's variables to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// Whichever is present, in the order documented on [`detect`].
    Auto,
    /// Ignore every launcher variable: this process is the whole job (or spawns it).
    Local,
    /// torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
    Env,
    Volcano,
    Mpi,
    Slurm,
    K8s,
}

impl Launcher {
    pub const ALL: [Launcher; 7] = [
        Launcher::Auto,
        Launcher::Local,
        Launcher::Env,
        Launcher::Volcano,
        Launcher::Mpi,
        Launcher::Slurm,
        Launcher::K8s,
    ];

    /// The canonical spelling, accepted back by `from_str`.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Auto => "auto",
            Launcher::Local => "local",
            Launcher::Env => "env",
            Launcher::Volcano => "volcano",
            Launcher::Mpi => "mpi",
            Launcher::Slurm => "slurm",
            Launcher::K8s => "k8s",
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--launcher` value that names no launcher.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown launcher {0:?}: expected auto, local, env (or torchrun), volcano, mpi, slurm or \
     k8s (or kubernetes, jobset)"
)]
pub struct UnknownLauncher(pub String);

impl FromStr for Launcher {
    type Err = UnknownLauncher;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Launcher::Auto,
            "local" => Launcher::Local,
            "env" | "torchrun" => Launcher::Env,
            "volcano" => Launcher::Volcano,
            "mpi" => Launcher::Mpi,
            "slurm" => Launcher::Slurm,
            "k8s" | "kubernetes" | "jobset" => Launcher::K8s,
            _ => return Err(UnknownLauncher(s.to_string())),
        })
    }
}

/// What the command line adds to the environment.
#[derive(Clone, Debug)]
pub struct DetectOptions {
    pub launcher: Launcher,
    /// Store port when the environment gives none (`MASTER_PORT` wins); [`DEFAULT_PORT`] if
    /// `None`.
    pub port: Option<u16>,
    /// Rank 0's host; overrides everything else.
    pub master_addr: Option<String>,
    /// Indexed Job / JobSet: host name of the pod with index `{index}`, e.g.
    /// `myjob-{index}.myjob` (else `BUSBW_HOST_PATTERN`, else derived from JobSet variables).
    pub host_pattern: Option<String>,
    /// Indexed Job / JobSet: the number of pods (else `BUSBW_WORLD_SIZE`).
    pub world_size: Option<usize>,
    /// Where Volcano's svc plugin mounts its ConfigMap.
    pub volcano_dir: PathBuf,
    /// This host's name ([`world::hostname`]); Volcano detection finds this pod's task by it.
    pub hostname: String,
}

impl Default for DetectOptions {
    fn default() -> Self {
        Self {
            launcher: Launcher::Auto,
            port: None,
            master_addr: None,
            host_pattern: None,
            world_size: None,
            volcano_dir: PathBuf::from("/etc/volcano"),
            hostname: world::hostname(),
        }
    }
}

/// What [`detect`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    /// This process's place in the job (one entry per process: with `--nproc-per-node`, the
    /// caller expands it with [`crate::world::expand`] unless `launched` is set).
    pub world: World,
    /// The source that matched.
    pub source: Launcher,
    /// Human-readable account of the variables and files used, for `-v`.
    pub notes: Vec<String>,
    /// Set when a busbw launcher started this process (`BUSBW_LAUNCHED=1`): the world is
    /// already per process, so the caller must neither expand it nor spawn ranks again.
    pub launched: bool,
}

/// Work out this process's [`World`] from `env` (a variable lookup; tests pass closures, real
/// runs [`detect_from_env`]).
///
/// `Ok(None)` means no launcher described a job (or `--launcher local`): the caller runs the
/// job itself. A forced launcher whose variables are missing is an error naming them, and so
/// is any malformed value.
///
/// # Order under [`Launcher::Auto`]
///
/// 1. torchrun's variables (RANK and WORLD_SIZE both set), which also covers Volcano's
///    pytorch plugin and anything a user exported by hand: the most explicit statement wins.
/// 2. Volcano (VC_TASK_INDEX, or the legacy VK_TASK_INDEX).
/// 3. Slurm (SLURM_PROCID together with SLURM_NTASKS).
/// 4. Open MPI (OMPI_COMM_WORLD_RANK).
/// 5. PMI (PMI_RANK: MPICH, Intel MPI, `srun --mpi=pmi2`).
/// 6. Kubernetes Indexed Job / JobSet (JOB_COMPLETION_INDEX).
/// 7. None: the caller runs locally.
///
/// One refinement: an MPI launcher's variables (4, 5) are set only in the processes it
/// starts, while Slurm's and Volcano's are inherited by everything in the allocation or pod.
/// So `mpirun` inside an `sbatch` script (nccl-tests' classic setup) gives each rank both,
/// with Slurm's describing the batch step instead of the rank. When both are present and
/// give different ranks or sizes, the MPI launcher is the closer one and wins; when they
/// agree (srun started the ranks and also set PMI_RANK), Slurm or Volcano is used because it
/// also knows rank 0's host. The notes say which happened.
///
/// A process started by a busbw launcher (`BUSBW_LAUNCHED=1`) reads torchrun's variables
/// whatever `opts.launcher` says, because it inherited its parent's cluster variables too.
pub fn detect(
    opts: &DetectOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Detection>, WorldError> {
    detect_with_names(opts, env, &[])
}

/// [`detect`] over the process environment. Unlike a lookup closure, the real environment can
/// be listed, so Volcano tasks known only from their injected `VC_<TASK>_NUM` variables (no
/// ConfigMap mounted) are found too.
pub fn detect_from_env(opts: &DetectOptions) -> Result<Option<Detection>, WorldError> {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("VC_"))
        .collect();
    detect_with_names(opts, &|k| std::env::var(k).ok(), &names)
}

/// Whether a busbw launcher started this process (see [`crate::local::LAUNCHED_ENV`]).
pub fn launched_by_busbw(env: &dyn Fn(&str) -> Option<String>) -> bool {
    env(LAUNCHED_ENV).is_some_and(|v| v.trim() == "1")
}

/// `BUSBW_PLATFORM` is read by the transports, which have nobody to tell about a misspelt
/// value; every process asks who it is here first, so a typo stops the job before any rank
/// starts, naming the values this build accepts.
fn check_platform(env: &dyn Fn(&str) -> Option<String>) -> Result<(), WorldError> {
    use busbw_transports::platform::{Platform, PlatformError, PLATFORM_ENV};
    match env(PLATFORM_ENV) {
        Some(v) if !v.trim().is_empty() => match v.parse::<Platform>() {
            Ok(_) => Ok(()),
            Err(e) => Err(WorldError::Invalid {
                var: PLATFORM_ENV,
                value: v,
                why: match e {
                    PlatformError::Unavailable(_) => format!(
                        "not available on this operating system (expected {})",
                        Platform::EXPECTED
                    ),
                    PlatformError::Unknown(_) => format!("expected {}", Platform::EXPECTED),
                },
            }),
        },
        _ => Ok(()),
    }
}

/// `env_names`: names of variables known to exist, for the sources that need to enumerate
/// (Volcano's per-task variables).
pub(crate) fn detect_with_names(
    opts: &DetectOptions,
    env: &dyn Fn(&str) -> Option<String>,
    env_names: &[String],
) -> Result<Option<Detection>, WorldError> {
    check_platform(env)?;
    let mut cx = Ctx {
        opts,
        env,
        env_names,
        notes: Vec::new(),
    };
    if launched_by_busbw(env) {
        cx.note(format!(
            "{LAUNCHED_ENV}=1: started by a busbw launcher, reading its RANK/WORLD_SIZE and \
             ignoring other launcher variables"
        ));
        let found = env_source(&cx)?.ok_or_else(|| WorldError::Missing {
            var: "RANK",
            why: format!("{LAUNCHED_ENV}=1 says a busbw launcher started this process"),
        })?;
        return cx.finish(found, Launcher::Env, true).map(Some);
    }
    let forced = |found: Option<Found>, var: &'static str, l: Launcher| match found {
        Some(f) => Ok(f),
        None => Err(WorldError::Missing {
            var,
            why: format!("--launcher {l} was requested"),
        }),
    };
    let (found, source) = match opts.launcher {
        Launcher::Local => return Ok(None),
        Launcher::Env => (
            forced(env_source(&cx)?, "RANK", Launcher::Env)?,
            Launcher::Env,
        ),
        Launcher::Volcano => {
            let f = volcano::detect(&mut cx)?;
            (
                forced(f, "VC_TASK_INDEX", Launcher::Volcano)?,
                Launcher::Volcano,
            )
        }
        Launcher::Slurm => {
            let f = slurm::detect(&mut cx, true)?;
            (forced(f, "SLURM_PROCID", Launcher::Slurm)?, Launcher::Slurm)
        }
        Launcher::Mpi => {
            let f = mpi::detect(&mut cx)?;
            (
                forced(f, "OMPI_COMM_WORLD_RANK (or PMI_RANK)", Launcher::Mpi)?,
                Launcher::Mpi,
            )
        }
        Launcher::K8s => {
            let f = k8s::detect(&mut cx)?;
            (
                forced(f, "JOB_COMPLETION_INDEX", Launcher::K8s)?,
                Launcher::K8s,
            )
        }
        Launcher::Auto => match auto(&mut cx)? {
            Some(x) => x,
            None => return Ok(None),
        },
    };
    cx.finish(found, source, false).map(Some)
}

fn auto(cx: &mut Ctx) -> Result<Option<(Found, Launcher)>, WorldError> {
    cx.note(
        "auto: looking for torchrun (RANK, WORLD_SIZE), then Volcano (VC_TASK_INDEX), Slurm \
         (SLURM_PROCID), Open MPI (OMPI_COMM_WORLD_RANK), PMI (PMI_RANK), Indexed Job \
         (JOB_COMPLETION_INDEX)",
    );
    if let Some(f) = env_source(cx)? {
        cx.note("RANK and WORLD_SIZE are set: using torchrun's variables");
        return Ok(Some((f, Launcher::Env)));
    }
    // The outer, allocation- or pod-wide launcher.
    let outer = if cx.get("VC_TASK_INDEX").is_some() || cx.get("VK_TASK_INDEX").is_some() {
        volcano::detect(cx).map(|f| f.map(|f| (f, Launcher::Volcano)))
    } else {
        slurm::detect(cx, false).map(|f| f.map(|f| (f, Launcher::Slurm)))
    };
    let Some(m) = mpi::detect(cx)? else {
        return match outer? {
            Some(o) => Ok(Some(o)),
            None => Ok(k8s::detect(cx)?.map(|f| (f, Launcher::K8s))),
        };
    };
    match outer {
        // Rank and size only: MPI launchers often leave the local counts out (PMI under srun
        // gives no local size), which must not make an agreeing pair look different.
        Ok(Some((o, l))) if (o.pos.rank, o.pos.size) == (m.pos.rank, m.pos.size) => {
            cx.note(format!(
                "{l} and the MPI launcher agree on rank {} of {}: using {l}, which also knows \
                 rank 0's host",
                o.pos.rank, o.pos.size
            ));
            Ok(Some((o, l)))
        }
        Ok(Some((o, l))) => {
            cx.note(format!(
                "{l} says rank {} of {} but the MPI launcher says rank {} of {}: the MPI \
                 launcher started this process inside the {l} allocation, so it wins",
                o.pos.rank, o.pos.size, m.pos.rank, m.pos.size
            ));
            Ok(Some((m, Launcher::Mpi)))
        }
        Ok(None) => Ok(Some((m, Launcher::Mpi))),
        Err(e) => {
            cx.note(format!("ignoring the enclosing launcher's variables: {e}"));
            Ok(Some((m, Launcher::Mpi)))
        }
    }
}

/// torchrun's variables; the address is left to [`Ctx::finish`] (MASTER_ADDR).
fn env_source(cx: &Ctx) -> Result<Option<Found>, WorldError> {
    let get = |k: &str| cx.get(k);
    Ok(world::torchrun_position(&get)?.map(|pos| Found {
        pos,
        rank0: Rank0::Unknown(format!(
            "WORLD_SIZE={}: the ranks need rank 0's address to rendezvous",
            pos.size
        )),
    }))
}

/// A source's answer before the common address and port rules are applied.
pub(crate) struct Found {
    pub pos: Position,
    pub rank0: Rank0,
}

/// Rank 0's host as the source implies it.
pub(crate) enum Rank0 {
    /// The host and where it came from (for the notes).
    Derived { host: String, how: String },
    /// The source cannot know; the text says how to supply it.
    Unknown(String),
}

pub(crate) struct Ctx<'a> {
    pub opts: &'a DetectOptions,
    env: &'a dyn Fn(&str) -> Option<String>,
    pub env_names: &'a [String],
    pub notes: Vec<String>,
}

impl Ctx<'_> {
    /// A variable, trimmed; "" counts as unset because job specs template absent values so.
    pub fn get(&self, key: &str) -> Option<String> {
        (self.env)(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    pub fn note(&mut self, s: impl Into<String>) {
        self.notes.push(s.into());
    }

    /// Apply the address and port rules common to every source (see the module docs).
    fn finish(
        mut self,
        found: Found,
        source: Launcher,
        launched: bool,
    ) -> Result<Detection, WorldError> {
        let Found { pos, rank0 } = found;
        if pos.local_rank >= pos.local_size {
            return Err(WorldError::Launcher(format!(
                "{source}: local rank {} is not below the local size {}",
                pos.local_rank, pos.local_size
            )));
        }
        let explicit = self
            .opts
            .master_addr
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty());
        let master_addr = if let Some(a) = explicit {
            self.note(format!("rank 0's host {a} from --master-addr"));
            a.to_string()
        } else if let Some(a) = self.get("MASTER_ADDR") {
            self.note(format!("rank 0's host {a} from MASTER_ADDR"));
            a
        } else {
            match rank0 {
                Rank0::Derived { host, how } => {
                    self.note(format!("rank 0's host {host}: {how}"));
                    host
                }
                Rank0::Unknown(_) if pos.size == 1 => String::new(),
                Rank0::Unknown(why) => {
                    return Err(WorldError::Missing {
                        var: "MASTER_ADDR",
                        why,
                    })
                }
            }
        };
        let master_port = if master_addr.is_empty() {
            0
        } else if let Some(p) = self.get("MASTER_PORT") {
            self.note(format!("store port {p} from MASTER_PORT"));
            parse_port("MASTER_PORT", &p)?
        } else if let Some(p) = self.opts.port {
            if p == 0 {
                return Err(world::invalid(
                    "--port",
                    "0",
                    "port 0 would let rank 0 pick a port nobody else knows",
                ));
            }
            self.note(format!("store port {p} from --port"));
            p
        } else {
            self.note(format!(
                "store port {DEFAULT_PORT} (default; MASTER_PORT or --port change it)"
            ));
            DEFAULT_PORT
        };
        self.note(format!(
            "{source}: rank {} of {} (local {} of {})",
            pos.rank, pos.size, pos.local_rank, pos.local_size
        ));
        Ok(Detection {
            world: World {
                rank: pos.rank,
                size: pos.size,
                local_rank: pos.local_rank,
                local_size: pos.local_size,
                master_addr,
                master_port,
                hostname: self.opts.hostname.clone(),
            },
            source,
            notes: self.notes,
            launched,
        })
    }
}

/// A count from a launcher variable, with the variable named on error.
pub(crate) fn count(cx: &Ctx, var: &'static str) -> Result<Option<usize>, WorldError> {
    cx.get(var).map(|v| world::parse_count(var, &v)).transpose()
}

/// `rank < size` and `size > 0`, or an error naming the variables.
pub(crate) fn check_rank(
    rank_var: &'static str,
    rank: usize,
    size_var: &'static str,
    size: usize,
) -> Result<(), WorldError> {
    if size == 0 {
        return Err(world::invalid(
            size_var,
            "0",
            "a job needs at least one rank",
        ));
    }
    if rank >= size {
        return Err(world::invalid(
            rank_var,
            &rank.to_string(),
            &format!("ranks are 0..{size} with {size_var}={size}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::collections::HashMap;

    /// A lookup over fixed pairs.
    pub fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    pub fn opts(launcher: Launcher) -> DetectOptions {
        DetectOptions {
            launcher,
            volcano_dir: PathBuf::from("/nonexistent/busbw-test-volcano"),
            hostname: "test-host".into(),
            ..DetectOptions::default()
        }
    }

    pub fn run(o: &DetectOptions, vars: &[(&str, &str)]) -> Result<Option<Detection>, WorldError> {
        detect(o, &env(vars))
    }

    pub fn found(o: &DetectOptions, vars: &[(&str, &str)]) -> Detection {
        match run(o, vars) {
            Ok(Some(d)) => d,
            other => panic!("expected a detection, got {other:?}"),
        }
    }

    pub fn failed(o: &DetectOptions, vars: &[(&str, &str)]) -> String {
        match run(o, vars) {
            Err(e) => e.to_string(),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    pub fn pos(d: &Detection) -> (usize, usize, usize, usize) {
        let w = &d.world;
        (w.rank, w.size, w.local_rank, w.local_size)
    }

    /// A fresh directory under the system temp dir, removed on drop.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> Self {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "busbw-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        pub fn write(&self, name: &str, content: &str) {
            std::fs::write(self.0.join(name), content).unwrap();
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests;
