//! The real binary as a cluster job: every "node" is a network namespace of a simulated
//! cluster (`tests/simcluster.sh`) with its own address, host name and name resolution, and
//! every process of a job runs inside one. Launch styles: torchrun variables (one process per
//! rank), Volcano (env + svc plugins, `--launcher volcano`), Volcano's pytorch plugin
//! (`--launcher env`), Slurm and Open MPI variables. Then the failures of a cluster: a node
//! that disappears mid-run, a node that starts late, and processes with the wrong job token.
//!
//! Needs root (network namespaces); without it every test says why it skips, on stderr.

mod common;
use common::{can_run_netns, simcluster, text, BUSBW};

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A store port for this test: different per test and per test process. (Each cluster has
/// its own network, so ports cannot collide across tests anyway.)
fn port(test_no: u16) -> u16 {
    20000 + (std::process::id() % 2000) as u16 * 16 + test_no
}

// ---------------------------------------------------------------------------------------
// The simulated cluster.

/// A simulated cluster, torn down (with every process still running in it) when dropped,
/// panic or not.
struct Cluster {
    name: String,
    k: usize,
}

impl Cluster {
    fn up(tag: &str, k: usize) -> Cluster {
        let name = format!("bw{}-{tag}", std::process::id());
        // A stale cluster of a recycled pid would make `up` refuse.
        let _ = Command::new("bash")
            .args([&simcluster(), "down", &name])
            .status();
        let out = Command::new("bash")
            .args([&simcluster(), "up", &name, &k.to_string()])
            .output()
            .expect("run simcluster.sh");
        assert!(
            out.status.success(),
            "simcluster.sh up {name} {k} failed:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        Cluster { name, k }
    }

    /// The `node<i>.<sub>` names of the svc plugin use the cluster name as subdomain.
    fn fqdn(&self, i: usize) -> String {
        format!("node{i}.{}", self.name)
    }

    /// `cmd` on node `i`, with an environment holding nothing but PATH and `env`.
    fn command(&self, i: usize, cmd: &[String], env: &[(String, String)]) -> Command {
        let mut c = Command::new("bash");
        c.arg(simcluster())
            .args(["exec", &self.name, &i.to_string()]);
        c.args(cmd);
        c.env_clear();
        c.env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    /// `simcluster.sh <what> <name> <i>`: kill-node, link-down, link-up.
    fn fault(&self, what: &str, i: usize) {
        self.sim(&[what, &self.name, &i.to_string()]);
    }

    /// Nodes `i` and `j` stop reaching each other; every other path stays.
    fn partition(&self, i: usize, j: usize) {
        self.sim(&["partition", &self.name, &i.to_string(), &j.to_string()]);
    }

    fn sim(&self, args: &[&str]) {
        let out = Command::new("bash")
            .arg(simcluster())
            .args(args)
            .output()
            .expect("run simcluster.sh");
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        match Command::new("bash")
            .args([&simcluster(), "down", &self.name])
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "simcluster.sh down {} failed: {}",
                self.name,
                text(&o.stderr)
            ),
            Err(e) => eprintln!("simcluster.sh down {}: {e}", self.name),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Processes of a job.

type Buf = Arc<Mutex<String>>;

fn collect(mut r: impl Read + Send + 'static) -> (Buf, JoinHandle<()>) {
    let buf: Buf = Arc::default();
    let b = buf.clone();
    let t = std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            b.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    (buf, t)
}

/// One process of a job (a rank, or a pod that starts its node's ranks).
struct Proc {
    label: String,
    node: usize,
    child: Child,
    out: Buf,
    err: Buf,
    readers: Vec<JoinHandle<()>>,
    status: Option<(ExitStatus, Instant)>,
}

impl Proc {
    fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }
    fn stderr(&self) -> String {
        self.err.lock().unwrap().clone()
    }
    fn poll(&mut self) -> bool {
        if self.status.is_none() {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                self.status = Some((s, Instant::now()));
            }
        }
        self.status.is_some()
    }
    fn code(&self) -> Option<i32> {
        self.status.and_then(|(s, _)| s.code())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How the processes of a job learn their place in it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Style {
    /// torchrun's variables, one process per rank (what busbw understood first).
    Torchrun,
    /// Volcano's env + svc plugins, one pod per node starting `--nproc-per-node` ranks.
    Volcano,
    /// Volcano's pytorch plugin (pod-level RANK/WORLD_SIZE) with `--launcher env`.
    PytorchPlugin,
    /// srun: one process per rank.
    Slurm,
    /// mpirun (Open MPI): one process per rank.
    Mpi,
}

/// What one process is started with.
struct Spec {
    label: String,
    node: usize,
    env: Vec<(String, String)>,
    args: Vec<String>,
}

fn kv(k: &str, v: impl ToString) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// The processes of a job of `c.k` nodes × `nproc` ranks in `style`, rank = nproc·node + local.
fn specs(c: &Cluster, style: Style, nproc: usize, port: u16) -> Vec<Spec> {
    let k = c.k;
    let world = k * nproc;
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let mut out = Vec::new();
    match style {
        Style::Volcano | Style::PytorchPlugin => {
            let hosts: Vec<String> = (0..k).map(|i| c.fqdn(i)).collect();
            for i in 0..k {
                let (env, launcher) = if style == Style::Volcano {
                    (
                        vec![
                            kv("VC_TASK_INDEX", i),
                            kv("VK_TASK_INDEX", i),
                            kv("VC_RANK_NUM", k),
                            kv("VC_RANK_HOSTS", hosts.join(",")),
                        ],
                        "volcano",
                    )
                } else {
                    (
                        vec![
                            kv("MASTER_ADDR", "node0"),
                            kv("MASTER_PORT", port),
                            kv("WORLD_SIZE", k),
                            kv("RANK", i),
                        ],
                        "env",
                    )
                };
                let mut args = s(&["--launcher", launcher, "--nproc-per-node"]);
                args.push(nproc.to_string());
                if style == Style::Volcano {
                    args.push("--port".into());
                    args.push(port.to_string());
                }
                out.push(Spec {
                    label: format!("pod {i} (node{i})"),
                    node: i,
                    env,
                    args,
                });
            }
        }
        Style::Torchrun | Style::Slurm | Style::Mpi => {
            for r in 0..world {
                let (i, l) = (r / nproc, r % nproc);
                let (env, args) = match style {
                    Style::Torchrun => (
                        vec![
                            kv("RANK", r),
                            kv("WORLD_SIZE", world),
                            kv("LOCAL_RANK", l),
                            kv("LOCAL_WORLD_SIZE", nproc),
                            kv("MASTER_ADDR", "node0"),
                            kv("MASTER_PORT", port),
                        ],
                        vec![],
                    ),
                    Style::Slurm => (
                        vec![
                            kv("SLURM_PROCID", r),
                            kv("SLURM_NTASKS", world),
                            kv("SLURM_LOCALID", l),
                            kv("SLURM_NTASKS_PER_NODE", nproc),
                            kv("SLURM_TASKS_PER_NODE", format!("{nproc}(x{k})")),
                            kv("SLURM_JOB_NODELIST", format!("node[0-{}]", k - 1)),
                            kv("SLURM_STEP_NODELIST", format!("node[0-{}]", k - 1)),
                            kv("SLURM_NODEID", i),
                            kv("SLURM_NNODES", k),
                            kv("SLURM_JOB_NUM_NODES", k),
                            kv("SLURMD_NODENAME", format!("node{i}")),
                            kv("SLURM_JOB_ID", 4242),
                        ],
                        vec!["--launcher".into(), "slurm".into()],
                    ),
                    _ => (
                        vec![
                            kv("OMPI_COMM_WORLD_RANK", r),
                            kv("OMPI_COMM_WORLD_SIZE", world),
                            kv("OMPI_COMM_WORLD_LOCAL_RANK", l),
                            kv("OMPI_COMM_WORLD_LOCAL_SIZE", nproc),
                            kv("OMPI_COMM_WORLD_NODE_RANK", i),
                            kv("MASTER_ADDR", "node0"),
                        ],
                        vec!["--launcher".into(), "mpi".into()],
                    ),
                };
                let mut args = args;
                if style != Style::Torchrun {
                    args.push("--port".into());
                    args.push(port.to_string());
                }
                out.push(Spec {
                    label: format!("rank {r} (node{i})"),
                    node: i,
                    env,
                    args,
                });
            }
        }
    }
    out
}

/// A running job: its processes, in the order of `specs` (rank 0's process first).
struct Job<'c> {
    cluster: &'c Cluster,
    coll: String,
    common: Vec<String>,
    procs: Vec<Proc>,
}

impl<'c> Job<'c> {
    fn new(cluster: &'c Cluster, coll: &str, common: &[&str]) -> Job<'c> {
        Job {
            cluster,
            coll: coll.to_string(),
            common: common.iter().map(|s| s.to_string()).collect(),
            procs: Vec::new(),
        }
    }

    /// Start one process; `extra_env`/`extra_args` come after the spec's.
    fn start(&mut self, spec: &Spec, extra_env: &[(String, String)], extra_args: &[String]) {
        let mut cmd = vec![BUSBW.to_string(), format!("{}_perf", self.coll)];
        cmd.extend(spec.args.iter().cloned());
        cmd.extend(self.common.iter().cloned());
        cmd.extend(extra_args.iter().cloned());
        let mut env = spec.env.clone();
        env.extend(extra_env.iter().cloned());
        let mut child = self
            .cluster
            .command(spec.node, &cmd, &env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn simcluster.sh exec");
        let (out, t1) = collect(child.stdout.take().unwrap());
        let (err, t2) = collect(child.stderr.take().unwrap());
        self.procs.push(Proc {
            label: spec.label.clone(),
            node: spec.node,
            child,
            out,
            err,
            readers: vec![t1, t2],
            status: None,
        });
    }

    fn start_all(&mut self, specs: &[Spec]) {
        for s in specs {
            self.start(s, &[], &[]);
        }
    }

    /// Everything the processes said, for failure messages.
    fn dump(&mut self) -> String {
        let mut s = String::new();
        for p in &mut self.procs {
            p.poll();
            let status = match p.status {
                Some((st, _)) => format!("{st}"),
                None => "still running".into(),
            };
            s += &format!(
                "==== {} [{status}]\n-- stdout:\n{}-- stderr:\n{}",
                p.label,
                p.stdout(),
                p.stderr()
            );
        }
        s
    }

    /// Wait until every process in `which` has exited, at most `limit`; on the deadline kill
    /// them all and fail with everything they said.
    fn wait_for(&mut self, which: &[usize], limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let mut done = true;
            for &i in which {
                done &= self.procs[i].poll();
            }
            if done {
                break;
            }
            if Instant::now() > deadline {
                for p in &mut self.procs {
                    let _ = p.child.kill();
                    p.poll();
                }
                panic!("processes still running after {limit:?}:\n{}", self.dump());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for &i in which {
            for t in self.procs[i].readers.drain(..) {
                let _ = t.join();
            }
        }
    }

    fn wait_all(&mut self, limit: Duration) {
        let all: Vec<usize> = (0..self.procs.len()).collect();
        self.wait_for(&all, limit);
    }

    /// Wait until process `i`'s stdout has a data row of the table.
    fn wait_for_first_row(&mut self, i: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while rows(&self.procs[i].stdout()).is_empty() {
            let exited = self.procs.iter_mut().any(|p| p.poll());
            if exited || Instant::now() > deadline {
                let label = self.procs[i].label.clone();
                let why = if exited {
                    "a process exited"
                } else {
                    "timeout"
                };
                panic!("no data row from {label} ({why}):\n{}", self.dump());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

// ---------------------------------------------------------------------------------------
// The table.

/// One parsed data row of the table.
#[derive(Debug)]
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    root: i64,
    oop_wrong: String,
    ip_wrong: String,
}

fn rows(stdout: &str) -> Vec<Row> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter(|l| l.split_whitespace().count() == 13)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Row {
                size: f[0].parse().unwrap(),
                count: f[1].parse().unwrap(),
                dtype: f[2].into(),
                redop: f[3].into(),
                root: f[4].parse().unwrap(),
                oop_wrong: f[8].into(),
                ip_wrong: f[12].into(),
            }
        })
        .collect()
}

/// Expected (size, count) columns for a requested size, straight from nccl-tests' rules.
fn geometry(coll: &str, bytes: u64, ts: u64, n: u64) -> (u64, u64) {
    let count = bytes / ts;
    let align = (16 / ts).max(1);
    let pr = count / n / align * align;
    match coll {
        "all_reduce" | "broadcast" | "reduce" | "sendrecv" => (count * ts, count),
        _ => (pr * n * ts, pr),
    }
}

/// Rank 0's table validates every size of `sizes` and lists the ranks where they run:
/// rank r on host node<r / nproc>, device r % nproc, full host names.
fn check_table(coll: &str, stdout: &str, world: usize, nproc: usize, sizes: &[u64], ctx: &str) {
    let devices: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("#  Rank "))
        .collect();
    assert_eq!(devices.len(), world, "one device line per rank\n{ctx}");
    for (r, line) in devices.iter().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 11, "{line}");
        let pid = f[6];
        let (host, dev) = (format!("node{}", r / nproc), r % nproc);
        // Shared memory to the ranks of the same node, TCP to the other nodes.
        let via = match (nproc > 1, world > nproc) {
            (true, true) => "shm+tcp",
            (true, false) => "shm",
            _ => "tcp",
        };
        let want = format!(
            "#  Rank {r:>2} Group  0 Pid {pid:>6} on {host:>10} device {dev:>2} [0000:00:00] host memory via {via}"
        );
        assert_eq!(*line, want, "device line of rank {r}\n{ctx}");
    }
    let rows = rows(stdout);
    let got: Vec<(u64, u64)> = rows.iter().map(|r| (r.size, r.count)).collect();
    let want: Vec<(u64, u64)> = sizes
        .iter()
        .map(|&b| geometry(coll, b, 4, world as u64))
        .collect();
    assert_eq!(got, want, "sizes and counts\n{ctx}");
    let redop = if coll == "all_reduce" { "sum" } else { "none" };
    for r in &rows {
        assert_eq!(
            (r.dtype.as_str(), r.redop.as_str(), r.root),
            ("float", redop, -1),
            "{ctx}"
        );
        assert_eq!(
            (r.oop_wrong.as_str(), r.ip_wrong.as_str()),
            ("0", "0"),
            "{ctx}"
        );
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK\n"), "{ctx}");
    assert!(
        stdout.ends_with(&format!("# Collective test concluded: {coll}_perf\n#\n\n")),
        "{ctx}"
    );
}

/// A sweep small enough for 8 ranks on 2 cores: 1K, 4K, 16K, 64K, 256K.
const SWEEP: [&str; 8] = ["-b", "1K", "-e", "256K", "-f", "4", "-n", "2"];
const SWEEP_SIZES: [u64; 5] = [1024, 4096, 16384, 65536, 262144];

/// A whole job of 4 nodes × 2 ranks in `style` runs `coll`, validates, and rank 0's table
/// lists the ranks on the nodes the environment put them on.
fn job_4x2(c: &Cluster, style: Style, coll: &str, port: u16) {
    let nproc = 2;
    let mut common: Vec<&str> = SWEEP.to_vec();
    common.extend(["-T", "60"]);
    let mut job = Job::new(c, coll, &common);
    job.start_all(&specs(c, style, nproc, port));
    job.wait_all(Duration::from_secs(120));
    let ctx = format!("{style:?} {coll}\n{}", job.dump());
    for p in &job.procs {
        assert_eq!(p.code(), Some(0), "{} failed\n{ctx}", p.label);
    }
    check_table(
        coll,
        &job.procs[0].stdout(),
        c.k * nproc,
        nproc,
        &SWEEP_SIZES,
        &ctx,
    );
    for p in &job.procs[1..] {
        assert!(
            !p.stdout().contains("# Using devices"),
            "only rank 0 prints the table; {} did too\n{ctx}",
            p.label
        );
    }
    if matches!(style, Style::Torchrun | Style::Slurm | Style::Mpi) {
        // One process per rank: the device block's pids are the processes started here.
        let pids: Vec<u32> = job.procs.iter().map(|p| p.child.id()).collect();
        let listed: Vec<u32> = job.procs[0]
            .stdout()
            .lines()
            .filter(|l| l.starts_with("#  Rank "))
            .map(|l| l.split_whitespace().nth(6).unwrap().parse().unwrap())
            .collect();
        assert_eq!(listed, pids, "{ctx}");
    }
}

// ---------------------------------------------------------------------------------------
// (a) Whole jobs in every launch style.

/// torchrun's variables (the contract busbw started with), 4 nodes × 2 processes.
#[test]
fn torchrun_4_nodes_x_2_ranks() {
    if !can_run_netns("torchrun_4_nodes_x_2_ranks") {
        return;
    }
    let c = Cluster::up("tr", 4);
    job_4x2(&c, Style::Torchrun, "all_reduce", port(1));
}

/// Volcano env + svc plugins: VC_TASK_INDEX, VC_RANK_NUM, VC_RANK_HOSTS; each pod starts its
/// 2 local ranks. AllReduce and AllGather.
#[test]
fn volcano_4_nodes_x_2_ranks() {
    if !can_run_netns("volcano_4_nodes_x_2_ranks") {
        return;
    }
    let c = Cluster::up("vc", 4);
    job_4x2(&c, Style::Volcano, "all_reduce", port(2));
    job_4x2(&c, Style::Volcano, "all_gather", port(3));
}

/// `-v` says what the launcher detection found.
#[test]
fn volcano_verbose_names_the_launcher() {
    if !can_run_netns("volcano_verbose_names_the_launcher") {
        return;
    }
    let c = Cluster::up("vv", 2);
    let mut job = Job::new(
        &c,
        "all_reduce",
        &["-b", "1K", "-e", "1K", "-n", "1", "-T", "60", "-v"],
    );
    job.start_all(&specs(&c, Style::Volcano, 2, port(4)));
    job.wait_all(Duration::from_secs(60));
    let ctx = job.dump();
    for p in &job.procs {
        assert_eq!(p.code(), Some(0), "{} failed\n{ctx}", p.label);
        assert!(
            p.stderr().to_lowercase().contains("volcano"),
            "{}: -v should report the Volcano environment\n{ctx}",
            p.label
        );
    }
    check_table("all_reduce", &job.procs[0].stdout(), 4, 2, &[1024], &ctx);
}

/// Volcano's pytorch plugin: MASTER_ADDR, MASTER_PORT, WORLD_SIZE (pods), RANK (pod index),
/// with `--launcher env --nproc-per-node 2`.
#[test]
fn pytorch_plugin_4_nodes_x_2_ranks() {
    if !can_run_netns("pytorch_plugin_4_nodes_x_2_ranks") {
        return;
    }
    let c = Cluster::up("pt", 4);
    job_4x2(&c, Style::PytorchPlugin, "all_reduce", port(5));
}

/// srun: SLURM_PROCID … SLURM_JOB_NODELIST=node[0-3], one process per rank.
#[test]
fn slurm_4_nodes_x_2_ranks() {
    if !can_run_netns("slurm_4_nodes_x_2_ranks") {
        return;
    }
    let c = Cluster::up("sl", 4);
    job_4x2(&c, Style::Slurm, "all_reduce", port(6));
}

/// mpirun: OMPI_COMM_WORLD_* and MASTER_ADDR, one process per rank.
#[test]
fn mpi_4_nodes_x_2_ranks() {
    if !can_run_netns("mpi_4_nodes_x_2_ranks") {
        return;
    }
    let c = Cluster::up("mp", 4);
    job_4x2(&c, Style::Mpi, "all_reduce", port(7));
}

// ---------------------------------------------------------------------------------------
// (b) A node disappears mid-run.

/// Node 2 of 4 (ranks 4 and 5) loses its network and its processes mid-run: every other
/// process stops within -T, naming a rank of node 2 or the node.
fn node_failure(style: Style, tag: &str, port: u16) {
    node_fault(style, tag, port, "kill-node");
}

/// Node 2's fault `what` (simcluster.sh kill-node: the host vanishes; link-down: its cable is
/// pulled, its processes live on) mid-run: every process on the other nodes stops within -T
/// with exit 3 or 4, naming a rank of node 2 or the node.
fn node_fault(style: Style, tag: &str, port: u16, what: &str) {
    const T: u64 = 10;
    // Detection is by -T (no progress), then the abort spreads and rank 0 lingers briefly so
    // the others hear it: allow that, and the scheduling noise of 2 cores, beyond -T.
    const SLACK: f64 = 8.0;
    let c = Cluster::up(tag, 4);
    let t = T.to_string();
    let common = [
        "-b", "64K", "-e", "1M", "-f", "2", "-n", "20", "-N", "0", "-T", &t,
    ];
    let mut job = Job::new(&c, "all_reduce", &common);
    let specs = specs(&c, style, 2, port);
    job.start_all(&specs);
    job.wait_for_first_row(0, Duration::from_secs(60));
    let victim = 2;
    c.fault(what, victim);
    let killed = Instant::now();
    let survivors: Vec<usize> = (0..job.procs.len())
        .filter(|&i| job.procs[i].node != victim)
        .collect();
    job.wait_for(&survivors, Duration::from_secs(3 * T + 20));
    let ctx = job.dump();
    let secs_of = |p: &Proc| p.status.unwrap().1.duration_since(killed).as_secs_f64();
    let slowest = survivors
        .iter()
        .map(|&i| secs_of(&job.procs[i]))
        .fold(0.0, f64::max);
    let each: Vec<String> = survivors
        .iter()
        .map(|&i| format!("{}: {:.1} s", job.procs[i].label, secs_of(&job.procs[i])))
        .collect();
    eprintln!(
        "{style:?}: survivors stopped {slowest:.1} s after {what} of node {victim} (-T {T}): {}",
        each.join(", ")
    );
    let names = ["rank 4", "rank 5", "node2"];
    for &i in &survivors {
        let p = &job.procs[i];
        let secs = secs_of(p);
        assert!(
            matches!(p.code(), Some(3) | Some(4)),
            "{}: exit {:?}, want 3 (peer failed) or 4 (timeout)\n{ctx}",
            p.label,
            p.status
        );
        assert!(
            secs <= T as f64 + SLACK,
            "{} took {secs:.1} s to stop, -T is {T}\n{ctx}",
            p.label
        );
        let err = p.stderr();
        assert!(
            names.iter().any(|n| err.contains(n)),
            "{}: the message should name rank 4, rank 5 or node2\n{ctx}",
            p.label
        );
    }
}

#[test]
fn node_failure_torchrun() {
    if !can_run_netns("node_failure_torchrun") {
        return;
    }
    node_failure(Style::Torchrun, "nft", port(8));
}

#[test]
fn node_failure_volcano() {
    if !can_run_netns("node_failure_volcano") {
        return;
    }
    node_failure(Style::Volcano, "nfv", port(9));
}

/// The link of node 2 goes down while its ranks live: they cannot say anything, the others
/// must notice the silence by -T and name them.
#[test]
fn link_down_torchrun() {
    if !can_run_netns("link_down_torchrun") {
        return;
    }
    node_fault(Style::Torchrun, "ldt", port(0), "link-down");
}

/// Node 2 loses its path to node 0 (rank 0 and the store) and nothing else. Every rank stops
/// within -T plus the time a failed rank gives the store to hear its last words: node 2's
/// ranks too, which can tell the store nothing. (They used to wait out a full store timeout on
/// each of those words, exiting two to three times -T after the cut.)
#[test]
fn partition_from_the_store_node() {
    if !can_run_netns("partition_from_the_store_node") {
        return;
    }
    const T: u64 = 10;
    // The store's 6 s for a failed rank's last words, the hang diagnosis and 2 cores' noise.
    const SLACK: f64 = 12.0;
    let c = Cluster::up("pst", 4);
    let t = T.to_string();
    let common = [
        "-b", "64K", "-e", "1M", "-f", "2", "-n", "20", "-N", "0", "-T", &t,
    ];
    let mut job = Job::new(&c, "all_reduce", &common);
    job.start_all(&specs(&c, Style::Torchrun, 2, port(14)));
    job.wait_for_first_row(0, Duration::from_secs(60));
    c.partition(2, 0);
    let cut = Instant::now();
    let all: Vec<usize> = (0..job.procs.len()).collect();
    job.wait_for(&all, Duration::from_secs(4 * T + 20));
    let ctx = job.dump();
    let each: Vec<String> = job
        .procs
        .iter()
        .map(|p| {
            let secs = p.status.unwrap().1.duration_since(cut).as_secs_f64();
            format!("{}: {:.1} s", p.label, secs)
        })
        .collect();
    eprintln!(
        "ranks stopped after node 2 lost node 0 (-T {T}): {}",
        each.join(", ")
    );
    for p in &job.procs {
        let secs = p.status.unwrap().1.duration_since(cut).as_secs_f64();
        assert!(
            matches!(p.code(), Some(3) | Some(4)),
            "{}: exit {:?}, want 3 (peer failed) or 4 (timeout)\n{ctx}",
            p.label,
            p.code()
        );
        assert!(
            secs <= T as f64 + SLACK,
            "{} took {secs:.1} s to stop, -T is {T}\n{ctx}",
            p.label
        );
    }
}

// ---------------------------------------------------------------------------------------
// (c) A node starts late.

/// Node `late` starts 10 s after the others; the job still forms and succeeds.
fn late_node(style: Style, tag: &str, port: u16, late: usize) {
    let c = Cluster::up(tag, 4);
    let mut common: Vec<&str> = SWEEP.to_vec();
    common.extend(["-T", "30"]);
    let mut job = Job::new(&c, "all_reduce", &common);
    let specs = specs(&c, style, 2, port);
    for s in specs.iter().filter(|s| s.node != late) {
        job.start(s, &[], &[]);
    }
    std::thread::sleep(Duration::from_secs(10));
    let early_exit: Vec<String> = job
        .procs
        .iter_mut()
        .filter_map(|p| p.poll().then(|| p.label.clone()))
        .collect();
    for s in specs.iter().filter(|s| s.node == late) {
        job.start(s, &[], &[]);
    }
    job.wait_all(Duration::from_secs(90));
    let ctx = job.dump();
    assert!(
        early_exit.is_empty(),
        "{early_exit:?} gave up before node{late} came\n{ctx}"
    );
    for p in &job.procs {
        assert_eq!(p.code(), Some(0), "{} failed\n{ctx}", p.label);
    }
    // The table comes from rank 0's process, wherever it was started.
    let p0 = job
        .procs
        .iter()
        .position(|p| p.label.starts_with("rank 0 ") || p.label.starts_with("pod 0 "))
        .unwrap();
    check_table(
        "all_reduce",
        &job.procs[p0].stdout(),
        8,
        2,
        &SWEEP_SIZES,
        &ctx,
    );
}

/// The last node comes late: the others wait for its ranks in the store.
#[test]
fn late_node_torchrun() {
    if !can_run_netns("late_node_torchrun") {
        return;
    }
    late_node(Style::Torchrun, "ltt", port(10), 3);
}

/// The store's node comes late: the others keep trying to reach it.
#[test]
fn late_store_node_torchrun() {
    if !can_run_netns("late_store_node_torchrun") {
        return;
    }
    late_node(Style::Torchrun, "lst", port(11), 0);
}

#[test]
fn late_node_volcano() {
    if !can_run_netns("late_node_volcano") {
        return;
    }
    late_node(Style::Volcano, "ltv", port(12), 3);
}

#[test]
fn late_store_node_volcano() {
    if !can_run_netns("late_store_node_volcano") {
        return;
    }
    late_node(Style::Volcano, "lsv", port(13), 0);
}

// ---------------------------------------------------------------------------------------
// (d) The job token.

fn mentions_token(s: &str) -> bool {
    let s = s.to_lowercase();
    s.contains("token")
}

/// While a job with token A forms, a stray process with token B on node3 tries to join
/// through rank 0's store: it is refused with a clear error, rank 0 logs the refusal, and the
/// job succeeds without it.
#[test]
fn stray_with_wrong_token_is_refused() {
    if !can_run_netns("stray_with_wrong_token_is_refused") {
        return;
    }
    let c = Cluster::up("tok", 4);
    let port = port(14);
    let mut common: Vec<&str> = SWEEP.to_vec();
    common.extend(["-T", "30"]);
    let mut job = Job::new(&c, "all_reduce", &common);
    let specs = specs(&c, Style::Volcano, 2, port);
    let good = vec!["--job-token".to_string(), "right-token-1234".to_string()];
    for s in specs.iter().filter(|s| s.node != 3) {
        job.start(s, &[], &good);
    }
    // The stray claims rank 1 of an 8-rank job at node0's store, with another token. The job
    // cannot finish before it tried: node3's pod is not started yet.
    let stray = Spec {
        label: "stray (node3, wrong token)".into(),
        node: 3,
        env: vec![
            kv("MASTER_ADDR", "node0"),
            kv("MASTER_PORT", port),
            kv("WORLD_SIZE", 8),
            kv("RANK", 1),
        ],
        args: vec!["--launcher".into(), "env".into()],
    };
    job.start(
        &stray,
        &[],
        &["--job-token".into(), "wrong-token-5678".into()],
    );
    let stray_i = job.procs.len() - 1;
    job.wait_for(&[stray_i], Duration::from_secs(40));
    for s in specs.iter().filter(|s| s.node == 3) {
        job.start(s, &[], &good);
    }
    job.wait_all(Duration::from_secs(90));
    let ctx = job.dump();
    let stray = &job.procs[stray_i];
    assert!(
        !matches!(stray.code(), Some(0) | None),
        "the stray must fail: {:?}\n{ctx}",
        stray.status
    );
    assert!(
        mentions_token(&stray.stderr()),
        "the stray's error should say its token was refused\n{ctx}"
    );
    for (i, p) in job.procs.iter().enumerate().filter(|(i, _)| *i != stray_i) {
        assert_eq!(p.code(), Some(0), "{} (#{i}) failed\n{ctx}", p.label);
    }
    let p0 = &job.procs[0];
    let e0 = p0.stderr().to_lowercase();
    assert!(
        e0.contains("refus") || e0.contains("token"),
        "rank 0 should log the refused connection\n{ctx}"
    );
    check_table("all_reduce", &p0.stdout(), 8, 2, &SWEEP_SIZES, &ctx);
}

/// A job whose node3 was given another token (the others take theirs from BUSBW_JOB_TOKEN)
/// fails with a message, bounded by -T, instead of hanging.
#[test]
fn job_with_one_wrong_token_fails() {
    if !can_run_netns("job_with_one_wrong_token_fails") {
        return;
    }
    const T: u64 = 10;
    let c = Cluster::up("tkf", 4);
    let t = T.to_string();
    let common = ["-b", "1K", "-e", "4K", "-f", "2", "-n", "1", "-T", &t];
    let mut job = Job::new(&c, "all_reduce", &common);
    let started = Instant::now();
    for s in specs(&c, Style::Volcano, 2, port(15)) {
        if s.node == 3 {
            job.start(&s, &[], &["--job-token".into(), "wrong-token-5678".into()]);
        } else {
            job.start(&s, &[kv("BUSBW_JOB_TOKEN", "right-token-1234")], &[]);
        }
    }
    job.wait_all(Duration::from_secs(4 * T + 20));
    let ctx = job.dump();
    for p in &job.procs {
        let secs = p.status.unwrap().1.duration_since(started).as_secs_f64();
        assert!(
            !matches!(p.code(), Some(0) | None),
            "{} must fail: {:?}\n{ctx}",
            p.label,
            p.status
        );
        assert!(
            secs <= 2.0 * T as f64 + 10.0,
            "{} took {secs:.1} s with -T {T}\n{ctx}",
            p.label
        );
        assert!(
            !p.stderr().trim().is_empty(),
            "{} failed without a message\n{ctx}",
            p.label
        );
    }
    assert!(
        mentions_token(&job.procs[3].stderr()),
        "node3's error should say its token was refused\n{ctx}"
    );
    let e0 = job.procs[0].stderr().to_lowercase();
    assert!(
        e0.contains("refus") || e0.contains("token"),
        "rank 0 should log the refused connections\n{ctx}"
    );
    assert!(
        !job.procs[0]
            .stdout()
            .contains("# Out of bounds values : 0 OK"),
        "no successful table\n{ctx}"
    );
}

/// `down` removes every namespace and file `up` made (shaped links and jumbo frames too), so
/// that test runs do not accumulate namespaces on the machine.
#[test]
fn teardown_leaves_nothing() {
    if !can_run_netns("teardown_leaves_nothing") {
        return;
    }
    let name = format!("bw{}-td", std::process::id());
    let up = Command::new("bash")
        .args([
            &simcluster(),
            "up",
            &name,
            "3",
            "--rate",
            "1gbit",
            "--mtu",
            "9000",
        ])
        .output()
        .expect("run simcluster.sh");
    assert!(up.status.success(), "up: {}", text(&up.stderr));
    let listed = |name: &str| {
        let out = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns");
        text(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(&format!("{name}-")))
            .count()
    };
    assert_eq!(listed(&name), 4, "3 nodes and the switch");
    let down = Command::new("bash")
        .args([&simcluster(), "down", &name])
        .output()
        .expect("run simcluster.sh");
    assert!(down.status.success(), "down: {}", text(&down.stderr));
    assert_eq!(listed(&name), 0, "namespaces left behind");
    for dir in ["/etc/netns", "/run/simcluster"] {
        let left: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|f| {
                        f.starts_with(&format!("{name}-")) || f.starts_with(&format!("{name}."))
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "{dir} still holds {left:?}");
    }
}
