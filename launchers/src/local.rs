//! Starting ranks on this host: `--np N` (a whole job on loopback) and `--nproc-per-node G`
//! (this pod's share of a job that spans hosts).

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::rendezvous::{ABORT_KEY, STORE_FD_ENV};
use crate::store::{Store, TcpStoreClient};
use crate::token::JOB_TOKEN_ENV;
use crate::world::{expand, World};

/// Set to 1 in every rank a busbw launcher starts. Those ranks already carry the expanded
/// torchrun variables; the cluster variables they inherit (Slurm's, MPI's, Volcano's) describe
/// their parent, so detection must not read them and the rank must not spawn ranks again.
pub const LAUNCHED_ENV: &str = "BUSBW_LAUNCHED";

/// How often the launcher checks on its children. Rank exits are rare events; 20 ms keeps
/// the reaction prompt without a measurable cost on a benchmark host.
const POLL: Duration = Duration::from_millis(20);
/// How long to wait for the output relays after the last rank exited. They normally end at
/// once; a rank's own child that kept the pipe open must not hold the launcher hostage.
const DRAIN: Duration = Duration::from_secs(1);
/// How long to try delivering the abort to rank 0's store.
const ABORT_POST_TIMEOUT: Duration = Duration::from_secs(2);

/// What to launch.
#[derive(Clone, Debug)]
pub struct LocalLaunch {
    pub np: usize,
    pub exe: PathBuf,
    pub args: Vec<OsString>,
    /// After a rank fails, how long the others get to notice the abort and exit by themselves
    /// before they are killed (`-T`).
    pub grace: Duration,
    /// What the ranks' exit codes mean to the launcher.
    pub codes: ExitCodes,
    /// Ranks each child hosts (busbw's `-t × -g`, 1 otherwise): with several, the launcher
    /// names a child by the ranks it hosts, the numbers the ranks' own messages use.
    pub ranks_per_process: usize,
}

/// The ranks' exit codes the launcher treats specially; any other non-zero code is a failure.
#[derive(Clone, Debug, Default)]
pub struct ExitCodes {
    /// A finished run's verdict rather than a failure (busbw's 7, "wrong results"): every
    /// rank reaches them together, so they neither abort the others nor get a line of their
    /// own on stderr.
    pub outcome: Vec<i32>,
    /// What a rank returns when it stopped because another failed (busbw's 3): an echo of the
    /// failure, not its cause, so it is the job's code only when no rank gave a cause.
    pub echo: Vec<i32>,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("the number of ranks (--np) must be at least 1")]
    NoRanks,
    #[error("the number of processes per node (--nproc-per-node) must be at least 1")]
    NoLocalRanks,
    #[error(
        "this pod is rank {rank} of {size} but has no rank-0 address: a job of several pods \
         needs MASTER_ADDR (or --master-addr)"
    )]
    NoMaster { rank: usize, size: usize },
    #[error("cannot start rank {rank} as {exe}: {source}")]
    Spawn {
        rank: usize,
        exe: String,
        #[source]
        source: io::Error,
    },
    #[error("local launcher: {0}")]
    Io(#[from] io::Error),
}

struct RankProc {
    rank: usize,
    pid: u32,
    child: Child,
    status: Option<ExitStatus>,
    killed: bool,
}

/// Run `l.np` ranks of a job without a token; see [`run_with_token`].
pub fn run(l: &LocalLaunch) -> Result<i32, LaunchError> {
    run_with_token(l, None)
}

/// Run `l.np` ranks on loopback and return the job's exit code: 0 if every rank succeeded,
/// else the code of the first rank that failed of its own accord (death by signal N counting
/// as 128+N, as shells report it), else the worst outcome. Ranks the launcher itself killed
/// after the grace period do not count: their death is a consequence of the failure already
/// being reported.
///
/// The launcher binds the store's port before any rank starts and hands the listening socket
/// to rank 0, so the port cannot be taken in between and early clients queue in the kernel
/// rather than being refused. With a `token`, the ranks get it in `BUSBW_JOB_TOKEN` and the
/// launcher presents it when it posts a failure to the store.
pub fn run_with_token(l: &LocalLaunch, token: Option<&str>) -> Result<i32, LaunchError> {
    if l.np == 0 {
        return Err(LaunchError::NoRanks);
    }
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    // One "pod" (this host) running all np ranks.
    let host = loopback_pod(listener.local_addr()?.port());
    let ranks = (0..l.np).map(|i| expand(&host, l.np, i)).collect();
    supervise(
        ranks,
        Some(listener),
        &l.exe,
        &l.args,
        l.grace,
        &l.codes,
        token,
        l.ranks_per_process,
    )
}

/// `--nproc-per-node g`: run this pod's `g` ranks of a job whose pods `pod` describes (one
/// entry per pod, as a cluster launcher sees it) and return the job's exit code, like
/// [`run`].
///
/// Each child gets the torchrun variables of [`expand`]`(pod, g, i)`, `BUSBW_LAUNCHED=1` and,
/// with a `token`, `BUSBW_JOB_TOKEN`. No socket is handed down: the child that is global
/// rank 0 binds `MASTER_PORT` itself, because the other pods reach it by address, not through
/// this launcher. A pod with no rank-0 address (a one-pod job run without one) is served on
/// loopback like [`run`].
///
/// When a child fails, the launcher posts the failure to the job's store (unless the child
/// was rank 0, which serves it), so ranks on other pods stop too, and kills its own other
/// children after `grace`. Each child hosts `ranks_per_process` ranks (see
/// [`LocalLaunch::ranks_per_process`]).
#[allow(clippy::too_many_arguments)]
pub fn run_pod(
    pod: &World,
    g: usize,
    exe: &Path,
    args: &[OsString],
    grace: Duration,
    codes: &ExitCodes,
    token: Option<&str>,
    ranks_per_process: usize,
) -> Result<i32, LaunchError> {
    if g == 0 {
        return Err(LaunchError::NoLocalRanks);
    }
    let (pod, listener) = if pod.store_addr().is_some() {
        (pod.clone(), None)
    } else if pod.size != 1 {
        return Err(LaunchError::NoMaster {
            rank: pod.rank,
            size: pod.size,
        });
    } else {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let mut one = loopback_pod(listener.local_addr()?.port());
        one.hostname.clone_from(&pod.hostname);
        (one, Some(listener))
    };
    let ranks = (0..g).map(|i| expand(&pod, g, i)).collect();
    supervise(
        ranks,
        listener,
        exe,
        args,
        grace,
        codes,
        token,
        ranks_per_process,
    )
}

/// A job of one pod whose store is on loopback, to be expanded into its processes.
fn loopback_pod(port: u16) -> World {
    let mut w = World::single();
    w.master_addr = Ipv4Addr::LOCALHOST.to_string();
    w.master_port = port;
    w
}

/// How the launcher names the child that is rank `rank` of its launcher: by that rank, or by
/// the ranks it hosts when it hosts several.
fn child_name(rank: usize, ranks_per_process: usize) -> String {
    match ranks_per_process {
        0 | 1 => format!("rank {rank}"),
        k => format!("ranks {}-{}", rank * k, rank * k + k - 1),
    }
}

/// Start one child per entry of `ranks`, relay their output, and reap them. `listener`, if
/// any, goes to the child that is global rank 0.
#[allow(clippy::too_many_arguments)]
fn supervise(
    ranks: Vec<World>,
    listener: Option<TcpListener>,
    exe: &Path,
    args: &[OsString],
    grace: Duration,
    codes: &ExitCodes,
    token: Option<&str>,
    ranks_per_process: usize,
) -> Result<i32, LaunchError> {
    let name = |rank| child_name(rank, ranks_per_process);
    let token = token.filter(|t| !t.is_empty());
    let store_addr = ranks.first().and_then(World::store_addr);
    let mut listener = listener;
    let (relay_done, relays_finished) = mpsc::channel::<()>();
    let mut relays = 0usize;
    let mut procs: Vec<RankProc> = Vec::with_capacity(ranks.len());

    for w in &ranks {
        let rank = w.rank;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", w.size.to_string())
            .env("LOCAL_RANK", w.local_rank.to_string())
            .env("LOCAL_WORLD_SIZE", w.local_size.to_string())
            .env("MASTER_ADDR", &w.master_addr)
            .env("MASTER_PORT", w.master_port.to_string())
            .env(LAUNCHED_ENV, "1")
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        // On a terminal, rank 0 writes stderr directly so that its progress bar can redraw in
        // place (a line relay would hold it back until a newline); piped, it is prefixed too.
        if rank == 0 && io::stderr().is_terminal() {
            cmd.stderr(Stdio::inherit());
        }
        if let Some(t) = token {
            cmd.env(JOB_TOKEN_ENV, t);
        }
        // The table comes from rank 0 alone; every other stream is prefixed onto stderr.
        if rank == 0 {
            cmd.stdout(Stdio::inherit());
        } else {
            cmd.stdout(Stdio::piped());
        }
        match listener.as_ref().filter(|_| rank == 0) {
            Some(sock) => {
                let fd = sock.as_raw_fd();
                cmd.env(STORE_FD_ENV, fd.to_string());
                // Clear close-on-exec in the child only, between fork and exec: no other
                // process this launcher (or a thread of its host) spawns can inherit it.
                // SAFETY: fcntl is async-signal-safe and touches only the child's descriptor.
                unsafe {
                    cmd.pre_exec(move || {
                        let flags = libc::fcntl(fd, libc::F_GETFD);
                        if flags < 0
                            || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
                        {
                            return Err(io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            None => {
                cmd.env_remove(STORE_FD_ENV);
            }
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(source) => {
                for p in &mut procs {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                }
                return Err(LaunchError::Spawn {
                    rank,
                    exe: exe.display().to_string(),
                    source,
                });
            }
        };
        // Rank 0 owns the socket now; the launcher's copy would only keep the port open
        // after rank 0 is gone.
        if rank == 0 {
            listener = None;
        }
        let prefix = format!("[{}] ", name(rank));
        if let Some(out) = child.stdout.take() {
            relays += spawn_relay(out, prefix.clone(), relay_done.clone());
        }
        if let Some(err) = child.stderr.take() {
            relays += spawn_relay(err, prefix, relay_done.clone());
        }
        procs.push(RankProc {
            rank,
            pid: child.id(),
            child,
            status: None,
            killed: false,
        });
    }
    drop(relay_done);
    drop(listener);

    let mut kill_at: Option<(Instant, usize)> = None;
    let mut forwarded = None;
    // The failures' codes in the order the launcher saw them: the first is the culprit's.
    let mut failures: Vec<i32> = Vec::new();
    loop {
        if let (Some(sig), None) = (crate::signal::received(), forwarded) {
            // An eviction reaches the launcher (PID 1 of the pod) only: pass it on so each
            // rank writes its reports and says it was stopped, then give them the grace.
            eprintln!(
                "busbw: {} received: stopping {} rank(s)",
                crate::signal::name(sig),
                procs.iter().filter(|p| p.status.is_none()).count()
            );
            for p in procs.iter().filter(|p| p.status.is_none()) {
                // SAFETY: kill on a child we spawned and have not reaped.
                unsafe { libc::kill(p.pid as libc::pid_t, sig) };
            }
            forwarded = Some(sig);
            kill_at.get_or_insert((Instant::now() + grace, procs[0].rank));
        }
        for p in procs.iter_mut().filter(|p| p.status.is_none()) {
            let Some(status) = p.child.try_wait()? else {
                continue;
            };
            p.status = Some(status);
            if status.success() || status.code().is_some_and(|c| codes.outcome.contains(&c)) {
                continue;
            }
            if forwarded.is_some() {
                continue; // stopping on our signal, as asked: not a failure to report
            }
            failures.push(exit_code(status));
            let what = describe(&name(p.rank), p.pid, status);
            eprintln!("busbw: {what}");
            if kill_at.is_none() {
                // Rank 0 serves the store: if it is the one that died there is nobody to tell,
                // and the others notice the lost store by themselves.
                // Posting runs beside the grace clock: a rank 0 that is alive but not serving
                // must not stall the launcher.
                if let Some(addr) = store_addr.clone().filter(|_| p.rank != 0) {
                    let what = what.clone();
                    let token = token.map(str::to_string);
                    let _ = std::thread::Builder::new()
                        .name("busbw-post-abort".into())
                        .spawn(move || post_abort(&addr, token.as_deref(), &what));
                }
                kill_at = Some((Instant::now() + grace, p.rank));
            }
        }
        let alive: Vec<usize> = (0..procs.len())
            .filter(|&i| procs[i].status.is_none())
            .collect();
        if alive.is_empty() {
            break;
        }
        if let Some((deadline, culprit)) = kill_at {
            if Instant::now() >= deadline {
                let names: Vec<String> = alive
                    .iter()
                    .map(|&i| match ranks_per_process {
                        0 | 1 => procs[i].rank.to_string(),
                        _ => name(procs[i].rank),
                    })
                    .collect();
                eprintln!(
                    "busbw: killing rank(s) {} still running {:.1}s after {} failed",
                    names.join(", "),
                    grace.as_secs_f64(),
                    name(culprit)
                );
                for &i in &alive {
                    let p = &mut procs[i];
                    let _ = p.child.kill();
                    p.killed = true;
                    p.status = Some(p.child.wait()?);
                }
                break;
            }
        }
        std::thread::sleep(POLL);
    }

    let drain_until = Instant::now() + DRAIN;
    for _ in 0..relays {
        let left = drain_until.saturating_duration_since(Instant::now());
        if relays_finished.recv_timeout(left).is_err() {
            break;
        }
    }

    if let Some(sig) = forwarded {
        return Ok(crate::signal::exit_code(sig));
    }
    let finished: Vec<i32> = procs
        .iter()
        .filter(|p| !p.killed)
        .filter_map(|p| p.status.map(exit_code))
        .collect();
    Ok(job_code(&failures, &finished, &codes.echo))
}

/// The job's exit code: the first failure that is a cause, not an echo (a rank that stopped
/// because another failed exits 3 while the culprit's own code says what happened: 2 for a
/// usage error, 1, 137, ...); else the first echo; else the worst of the finished ranks'
/// codes (0, or an outcome such as 7).
fn job_code(failures: &[i32], finished: &[i32], echo: &[i32]) -> i32 {
    failures
        .iter()
        .find(|c| !echo.contains(c))
        .or_else(|| failures.first())
        .copied()
        .unwrap_or_else(|| finished.iter().copied().max().unwrap_or(0))
}

/// Deliver the failure to the surviving ranks through the store. Best effort: if it cannot be
/// delivered, the grace-period kill still ends the job.
fn post_abort(addr: &str, token: Option<&str>, what: &str) {
    let result =
        TcpStoreClient::connect_with_token(addr, ABORT_POST_TIMEOUT, token).and_then(|c| {
            // A rank that failed on its own usually posted a better reason already.
            if c.get(ABORT_KEY)?.is_none() {
                c.set(ABORT_KEY, what.as_bytes())?;
            }
            Ok(())
        });
    if let Err(e) = result {
        eprintln!("busbw: could not tell the other ranks to stop: {e}");
    }
}

fn spawn_relay(src: impl Read + Send + 'static, prefix: String, done: mpsc::Sender<()>) -> usize {
    let spawned = std::thread::Builder::new()
        .name("busbw-relay".into())
        .spawn(move || {
            let _ = prefix_lines(src, &prefix, io::stderr());
            let _ = done.send(());
        });
    usize::from(spawned.is_ok())
}

/// Copy `src` to `out` line by line, each line prefixed. Each line goes out in one write so
/// lines of different ranks never interleave mid-line; bytes are copied as-is because rank
/// output need not be UTF-8. A final line without a newline gets one.
pub fn prefix_lines<R: Read, W: Write>(src: R, prefix: &str, mut out: W) -> io::Result<()> {
    let mut reader = BufReader::new(src);
    let mut line = Vec::new();
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        if reader.read_until(b'\n', &mut line)? == 0 {
            return out.flush();
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        out.write_all(&line)?;
    }
}

/// The shell's convention, so the launcher's exit code reads the same as running one rank.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

fn describe(name: &str, pid: u32, status: ExitStatus) -> String {
    describe_on(name, pid, &crate::hostname(), status)
}

/// The one line that names a child that ended abnormally: its rank(s), pid, host, what
/// happened.
fn describe_on(name: &str, pid: u32, host: &str, status: ExitStatus) -> String {
    let who = format!("{name} (pid {pid} on {host})");
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("{who} exited with code {c}"),
        (None, Some(sig)) => match signal_name(sig) {
            Some(name) => format!("{who} was killed by signal {sig} ({name})"),
            None => format!("{who} was killed by signal {sig}"),
        },
        (None, None) => format!("{who} ended abnormally ({status})"),
    }
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_every_line() {
        let input: &[u8] = b"hello\nworld\n\xff raw\nno newline";
        let mut out = Vec::new();
        prefix_lines(input, "[rank 3] ", &mut out).unwrap();
        assert_eq!(
            out,
            b"[rank 3] hello\n[rank 3] world\n[rank 3] \xff raw\n[rank 3] no newline\n"
        );
        let mut out = Vec::new();
        prefix_lines(&b""[..], "[rank 0] ", &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn the_first_cause_is_the_jobs_code() {
        let echo = [3];
        assert_eq!(job_code(&[3, 2, 3], &[3, 2, 3], &echo), 2);
        assert_eq!(job_code(&[137, 3], &[137, 3, 3], &echo), 137);
        assert_eq!(job_code(&[1, 4], &[1, 4], &echo), 1);
        assert_eq!(job_code(&[3, 3], &[3, 3], &echo), 3);
        assert_eq!(job_code(&[], &[0, 7, 7], &echo), 7);
        assert_eq!(job_code(&[], &[], &echo), 0);
        // Without echoes declared, the first failure seen.
        assert_eq!(job_code(&[3, 2], &[3, 2], &[]), 3);
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(
            describe_on("rank 2", 1234, "n1", ExitStatus::from_raw(libc::SIGKILL)),
            "rank 2 (pid 1234 on n1) was killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            describe_on("rank 2", 1234, "n1", ExitStatus::from_raw(3 << 8)),
            "rank 2 (pid 1234 on n1) exited with code 3"
        );
    }

    #[test]
    fn a_child_of_several_ranks_is_named_by_them() {
        assert_eq!(child_name(3, 1), "rank 3");
        assert_eq!(child_name(1, 2), "ranks 2-3");
        assert_eq!(child_name(2, 3), "ranks 6-8");
        assert_eq!(
            describe_on(&child_name(1, 2), 7, "n1", ExitStatus::from_raw(1 << 8)),
            "ranks 2-3 (pid 7 on n1) exited with code 1"
        );
    }
}
