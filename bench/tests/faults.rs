//! Faults on one host, end to end through the real binary: SIGTERM to a rank and to the
//! launcher, a rank killed while reports are written, a full disk under the reports, and
//! strangers hammering the store and the data listeners of a running job. Each asserts the
//! exit code, the time to exit and the message. (Node loss, link loss and late nodes need
//! hosts: `tests/cluster.rs`.)

mod common;
use common::busbw;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

fn scratch(name: &str) -> common::Scratch {
    common::Scratch::new("faults", name)
}

/// A running local job: stdout read up to the first data row (collecting each rank's pid
/// from the device table), stderr collected on a thread.
struct Running {
    child: Child,
    pids: Vec<i32>,
    /// Stdout so far, growing while the job runs.
    seen: Arc<Mutex<String>>,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

/// A sweep that runs until it is stopped (-N 0: cycles forever), to be interrupted after its
/// first row.
const LONG: &[&str] = &["-b", "64K", "-e", "4M", "-f", "2", "-n", "200", "-N", "0"];

fn start(np: usize, sweep: &[&str], extra: &[&str]) -> Running {
    let np_s = np.to_string();
    let mut args = vec!["all_reduce_perf", "--np", &np_s];
    args.extend_from_slice(sweep);
    args.extend_from_slice(extra);
    let mut child = busbw()
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut pids = vec![0; np];
    let mut lines = BufReader::new(out).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen += &line;
        seen.push('\n');
        if let Some(rest) = line.strip_prefix("#  Rank ") {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let (r, pid) = (f[0].parse::<usize>().unwrap(), f[4].parse::<i32>().unwrap());
            pids[r] = pid;
        }
        if !line.starts_with('#') && !line.is_empty() {
            break;
        }
    }
    assert!(pids.iter().all(|&p| p > 0), "no device table:\n{seen}");
    let seen = Arc::new(Mutex::new(seen));
    let shared = seen.clone();
    let stdout = std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
            *s += &l;
            s.push('\n');
        }
        let s = shared.lock().unwrap_or_else(|e| e.into_inner());
        s.clone()
    });
    Running {
        child,
        pids,
        seen,
        stdout,
        stderr,
    }
}

impl Running {
    /// The data rows printed so far.
    fn rows(&self) -> Vec<String> {
        let s = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        s.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Waits until at least `n` data rows are out, or the job ends, or `limit` passes.
    fn wait_rows(&mut self, n: usize, limit: Duration) -> usize {
        let start = Instant::now();
        loop {
            let have = self.rows().len();
            if have >= n || start.elapsed() > limit || self.child.try_wait().unwrap().is_some() {
                return have;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the job to end (failing the test after `limit`): (exit code, stdout, stderr,
    /// seconds waited).
    fn finish(mut self, limit: Duration) -> (Option<i32>, String, String, f64) {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > limit {
                // Kill the whole job (ranks included) so the pipes close and we can say more.
                for &p in &self.pids {
                    // SAFETY: kill on rank processes of our job.
                    unsafe { libc_kill(p, SIGKILL) };
                }
                let _ = self.child.kill();
                let err = self.stderr.join().unwrap_or_default();
                let out = self.stdout.join().unwrap_or_default();
                panic!("job still running {limit:?} after the fault\n{err}\n{out}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let secs = start.elapsed().as_secs_f64();
        (
            status.code(),
            self.stdout.join().unwrap(),
            self.stderr.join().unwrap(),
            secs,
        )
    }
}

fn record(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?} is not JSON ({e}):\n{text}"))
}

/// SIGTERM to one rank (a pod eviction): it stops with 143 and its own line; the others stop
/// well within -T because the abort is broadcast, naming the rank, its host and the signal;
/// rank 0's report keeps the rows and says the run is incomplete, and why.
#[test]
fn sigterm_to_a_rank_is_broadcast_and_reports_are_kept() {
    const T: u64 = 20;
    let dir = scratch("term-rank");
    let json = dir.join("run.json");
    let t = T.to_string();
    let job = start(
        4,
        LONG,
        &["-T", &t, "--export-json", json.to_str().unwrap()],
    );
    // SAFETY: kill on a rank process of our job.
    unsafe { libc_kill(job.pids[2], SIGTERM) };
    let (code, _out, err, secs) = job.finish(Duration::from_secs(3 * T));
    eprintln!("sigterm to rank 2: job ended after {secs:.2} s, exit {code:?}");
    assert!(
        secs < T as f64 / 2.0,
        "took {secs:.1} s: the others waited for their timeout\n{err}"
    );
    assert_eq!(code, Some(143), "{err}");
    for r in [0, 1, 2, 3] {
        assert!(
            err.lines().any(|l| l.starts_with(&format!("[rank {r}]"))
                && l.contains("rank 2 on ")
                && l.contains("received SIGTERM")),
            "rank {r} should name rank 2, its host and the signal\n{err}"
        );
    }
    let rec = record(&json);
    assert_eq!(rec["complete"], false, "{rec}");
    assert!(
        rec["summary"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("SIGTERM")),
        "{rec}"
    );
    assert!(
        !rec["rows"].as_array().unwrap().is_empty(),
        "rows so far kept"
    );
}

/// SIGTERM to the launcher (PID 1 of a pod): passed to every rank, all stop in order, the
/// launcher exits 143, the report is kept and marked incomplete.
#[test]
fn sigterm_to_the_launcher_stops_every_rank_in_order() {
    let dir = scratch("term-launcher");
    let json = dir.join("run.json");
    let job = start(
        3,
        LONG,
        &["-T", "20", "--export-json", json.to_str().unwrap()],
    );
    let launcher = job.child.id() as i32;
    let pids = job.pids.clone();
    // SAFETY: kill on the launcher process we started.
    unsafe { libc_kill(launcher, SIGTERM) };
    let (code, _out, err, secs) = job.finish(Duration::from_secs(60));
    eprintln!("sigterm to the launcher: job ended after {secs:.2} s, exit {code:?}");
    assert_eq!(code, Some(143), "{err}");
    assert!(secs < 10.0, "took {secs:.1} s\n{err}");
    assert!(
        err.contains("busbw: SIGTERM received: stopping 3 rank(s)"),
        "{err}"
    );
    assert!(err.contains("received SIGTERM"), "{err}");
    // No rank is left behind.
    for pid in pids {
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc_kill(pid, 0) } == 0
            && std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "rank pid {pid} outlived the launcher");
    }
    let rec = record(&json);
    assert_eq!(rec["complete"], false, "{rec}");
}

/// A rank killed outright (no chance to say anything): the launcher names it and its signal,
/// the others stop within -T naming it, and rank 0's report holds the rows measured so far,
/// marked incomplete with the reason.
#[test]
fn killed_rank_leaves_an_incomplete_report_naming_it() {
    const T: u64 = 10;
    let dir = scratch("kill9");
    let json = dir.join("run.json");
    let csv = dir.join("run.csv");
    let t = T.to_string();
    let job = start(
        3,
        LONG,
        &[
            "-T",
            &t,
            "--export-json",
            json.to_str().unwrap(),
            "--export-csv",
            csv.to_str().unwrap(),
        ],
    );
    // SAFETY: kill on a rank process of our job.
    unsafe { libc_kill(job.pids[1], SIGKILL) };
    let (code, _out, err, secs) = job.finish(Duration::from_secs(3 * T + 20));
    eprintln!("kill -9 of rank 1: job ended after {secs:.2} s, exit {code:?}");
    // The launcher's code is the killed rank's, as a shell reports it (128 + 9).
    assert_eq!(code, Some(137), "{err}");
    assert!(secs < T as f64, "took {secs:.1} s\n{err}");
    assert!(
        err.contains("rank 1 (pid") && err.contains("killed by signal 9"),
        "{err}"
    );
    let rec = record(&json);
    assert_eq!(rec["complete"], false, "{rec}");
    let why = rec["summary"]["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("rank 1"),
        "the report should name rank 1: {why}"
    );
    assert!(!rec["rows"].as_array().unwrap().is_empty());
    // The CSV is whole too: a header and at least one row, each line complete.
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(csv.lines().count() >= 2 && csv.ends_with('\n'), "{csv}");
}

/// The reports' disk fills up mid-run (a 32 KiB tmpfs): rank 0 says which file and why, the
/// others stop at once naming rank 0, and the report file keeps its last whole version.
#[test]
fn full_disk_for_reports_is_a_named_failure() {
    if common::euid() != 0 {
        let _ = writeln!(
            std::io::stderr(),
            "skipping full_disk_for_reports_is_a_named_failure: needs root to mount a tmpfs"
        );
        return;
    }
    let dir = scratch("full");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=32k", "tmpfs"])
        .arg(dir.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        let _ = writeln!(
            std::io::stderr(),
            "skipping full_disk_for_reports_is_a_named_failure: cannot mount a tmpfs here"
        );
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(dir.path().to_path_buf());
    let json = dir.join("run.json");
    let start_t = Instant::now();
    // 4 KiB rows of JSON per size with -n 200 iteration stats: the disk fills within the sweep.
    let out = busbw()
        .args([
            "all_reduce_perf",
            "--np",
            "3",
            "-b",
            "1K",
            "-e",
            "64M",
            "-f",
            "2",
            "-n",
            "5",
            "-w",
            "1",
            "-T",
            "10",
            "--export-json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let secs = start_t.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "full disk: job ended after {secs:.2} s, exit {:?}",
        out.status.code()
    );
    // The job's code is rank 0's own (1: an I/O error), not the 3 of the ranks it stopped.
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(secs < 30.0, "took {secs:.1} s\n{err}");
    let own = err
        .lines()
        .find(|l| l.starts_with("[rank 0]") && l.contains("error"))
        .unwrap_or_else(|| panic!("rank 0 said nothing\n{err}"));
    assert!(
        own.contains("run.json") && own.contains("No space left on device"),
        "{own}"
    );
    for r in [1, 2] {
        assert!(
            err.lines().any(|l| l.starts_with(&format!("[rank {r}]"))
                && l.contains("rank 0 on ")
                && l.contains("No space left")),
            "rank {r} should name rank 0 and the cause\n{err}"
        );
    }
    // Atomic rewrites: what is on disk is the last whole version, still a valid record.
    let rec = record(&json);
    assert_eq!(rec["complete"], false, "{rec}");
}

/// The listening TCP ports of process `pid` (its store and data listeners).
fn listening_ports(pid: i32) -> Vec<u16> {
    let mut inodes = Vec::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy().into_owned();
                if let Some(i) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.push(i.to_string());
                }
            }
        }
    }
    let tcp = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let listening = f.get(3) == Some(&"0A");
            let ours = f.get(9).is_some_and(|i| inodes.iter().any(|x| x == i));
            let port = f.get(1)?.rsplit(':').next()?;
            (listening && ours)
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// The `MASTER_PORT` the launcher gave rank process `pid`: the job's store.
fn master_port(pid: i32) -> Option<u16> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"MASTER_PORT="))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}

/// Whether every data row says `#wrong` 0, in place and out of place.
fn all_rows_valid(rows: &[String]) -> bool {
    rows.iter().all(|r| {
        let f: Vec<&str> = r.split_whitespace().collect();
        f.len() >= 13 && f[8] == "0" && f[12] == "0"
    })
}

/// While a job runs, strangers hit its store and every data listener with garbage,
/// oversized and truncated frames, wrong tokens and replayed greetings, and some hold
/// connections open without a word: the job runs on, validating, and stops cleanly.
///
/// The job cycles its sweep until it is stopped (`-N 0`), so it outlasts the attacks on a
/// machine of any speed: a finite sweep ended before the store was reached on a fast one.
#[test]
fn strangers_do_not_disturb_a_running_job() {
    let sweep = ["-b", "64K", "-e", "1M", "-f", "2", "-n", "50", "-N", "0"];
    let mut job = start(3, &sweep, &["-T", "30", "--transport", "tcp"]);
    let store = master_port(job.pids[1]).expect("rank 1 has MASTER_PORT");
    let mut ports: Vec<u16> = job.pids.iter().flat_map(|&p| listening_ports(p)).collect();
    ports.sort_unstable();
    ports.dedup();
    assert!(
        ports.len() >= 4 && ports.contains(&store),
        "store {store} + 3 data listeners, found {ports:?}"
    );
    let mut silent = Vec::new();
    for &port in &ports {
        let addr = format!("127.0.0.1:{port}");
        // The store must answer, however loaded the machine; a data listener never does
        // (its job's connections exist), so it only gets a short wait.
        let wait = if port == store { 20_000 } else { 300 };
        match busbw_launchers::TcpStoreClient::connect_with_token(
            &addr,
            Duration::from_millis(wait),
            Some("not-this-job"),
        ) {
            Err(busbw_launchers::StoreError::WrongToken { .. }) => {}
            Err(e) => assert!(port != store, "the store at {addr} did not refuse: {e}"),
            Ok(_) => panic!("a wrong token got into {addr}"),
        }
        let send = |bytes: &[u8]| {
            if let Ok(mut s) = TcpStream::connect(&addr) {
                let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                let _ = s.write_all(bytes);
                let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
                let mut sink = [0u8; 128];
                let _ = s.read(&mut sink);
            }
        };
        send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        send(&vec![0xa5; 1 << 20]);
        send(b"BUSBWKV\0");
        send(b"BUSBWKV\0\0\0\0\x03\x01\x02");
        send(&[0xff; 3]);
        // A greeting replayed from a "recording": the right shape, a stale proof.
        let mut replay = b"BUSBWKV\0\0\0\0\x03".to_vec();
        replay.extend_from_slice(&[7u8; 16]);
        replay.extend_from_slice(&[9u8; 32]);
        send(&replay);
        if let Ok(s) = TcpStream::connect(&addr) {
            silent.push(s); // held open, silent, until the job ends
        }
    }
    // Still running, and two more whole cycles (5 sizes each) come out after the attacks.
    assert!(
        job.child.try_wait().unwrap().is_none(),
        "the job ended during the attacks"
    );
    let after = job.rows().len();
    let have = job.wait_rows(after + 10, Duration::from_secs(60));
    assert!(
        have >= after + 10,
        "only {} rows after the attacks",
        have - after
    );
    let launcher = job.child.id() as i32;
    // SAFETY: kill on the launcher process we started.
    unsafe { libc_kill(launcher, SIGTERM) };
    let (code, out, err, _) = job.finish(Duration::from_secs(60));
    drop(silent);
    assert_eq!(code, Some(143), "stopped by SIGTERM\n{err}\n{out}");
    let rows: Vec<String> = out
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    assert!(rows.len() >= after + 10 && all_rows_valid(&rows), "{out}");
    assert!(
        err.contains("refused a rendezvous connection") && err.contains("wrong job token"),
        "the store logs its refusals\n{err}"
    );
    // (A running job's data listeners accept nothing more once its connections exist, so
    // strangers there wait unanswered in the backlog; the listeners' own refusals of forged,
    // replayed and truncated hellos are tested in transports/tests.)
}
