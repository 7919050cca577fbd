//! The real binary on real verbs: SoftRoCE (`rdma_rxe`) in qemu guests booted by
//! `bench/scripts/rdma-vm.sh`, each guest a separate RDMA node with its own kernel, rxe device
//! and hostname, all running this very binary from the host's file system.
//!
//! Needs a build with the `verbs` feature, root, qemu, a kernel image with `rdma_rxe` and
//! rdma-core (`.ci/run` installs them); without any of them every test says on stderr why it
//! skips. `rdma-vm.sh check` names what is missing.

mod common;
use common::{shaped_rate, text, within, BUSBW};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::sync::{Mutex, OnceLock};

fn script() -> String {
    format!("{}/scripts/rdma-vm.sh", env!("CARGO_MANIFEST_DIR"))
}

/// Why this machine cannot run the guests, if it cannot.
fn unavailable() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        let out = Command::new(BUSBW).arg("doctor").output();
        match out {
            Ok(o) if text(&o.stdout).contains("built without the `verbs` feature") => {
                return Some("busbw was built without the `verbs` feature".into())
            }
            Ok(_) => {}
            Err(e) => return Some(format!("cannot run busbw ({e})")),
        }
        match Command::new("bash").args([&script(), "check"]).output() {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(text(&o.stderr).trim().replace('\n', " ")),
            Err(e) => Some(format!("cannot run {} ({e})", script())),
        }
    })
    .as_deref()
}

/// Every test starts with this: false (after saying so on stderr) when it cannot run here.
fn can_run(test: &str) -> bool {
    match unavailable() {
        None => true,
        Some(why) => {
            let _ = writeln!(std::io::stderr(), "skipping {test}: {why}");
            false
        }
    }
}

/// Guests share two cores: one boot at a time, so that no test measures another.
static GUESTS: Mutex<()> = Mutex::new(());

/// What one guest left behind.
struct Guest {
    dir: PathBuf,
    rc: Option<i32>,
    stdout: String,
    stderr: String,
    /// The run's folder lives as long as any of its guests' results.
    _scratch: Rc<common::Scratch>,
}

impl Guest {
    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }
}

/// `rdma-vm.sh run` of `cmd` on `guests` guests with `opts`, results under `out`.
fn bed(guests: usize, out: &Path, opts: &[&str], cmd: &str) -> std::process::Output {
    Command::new("bash")
        .arg(script())
        .args(["run", "--guests", &guests.to_string(), "--out"])
        .arg(out)
        .args(opts)
        .arg("--")
        .arg(cmd)
        .output()
        .expect("run rdma-vm.sh")
}

/// Boots `guests` guests with `opts` (rdma-vm.sh options), runs `cmd` in each, and returns
/// their results; panics with the test bed's own words when the bed (not the command) failed.
/// A run whose emulated NIC stalled (a qemu fault the bed names) is run once more, saying so:
/// what the command did on a dead link says nothing about busbw.
fn run_guests(tag: &str, guests: usize, opts: &[&str], cmd: &str) -> Vec<Guest> {
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut attempt = 0;
    let (scratch, out) = loop {
        let scratch = common::Scratch::new("rdma", &format!("{tag}-{attempt}"));
        let start = std::time::Instant::now();
        let out = bed(guests, scratch.path(), opts, cmd);
        let _ = writeln!(
            std::io::stderr(),
            "{tag}: {guests} guest(s) ran for {:.1} s",
            start.elapsed().as_secs_f64()
        );
        let said = text(&out.stdout);
        if attempt == 0 && out.status.code() == Some(3) && said.contains("emulated NIC stopped") {
            let _ = writeln!(std::io::stderr(), "{tag}: running again, {said}");
            attempt += 1;
            continue;
        }
        break (Rc::new(scratch), out);
    };
    let dir = scratch.path().to_path_buf();
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_ne!(
        out.status.code(),
        Some(3),
        "the test bed failed:\n{said}\n{}",
        console_tails(&dir, guests)
    );
    (0..guests)
        .map(|i| {
            let d = dir.join(format!("vm{i}"));
            let read = |n: &str| std::fs::read_to_string(d.join(n)).unwrap_or_default();
            Guest {
                rc: read("rc").trim().parse().ok(),
                stdout: read("stdout"),
                stderr: read("stderr"),
                dir: d,
                _scratch: Rc::clone(&scratch),
            }
        })
        .collect()
}

fn console_tails(dir: &Path, guests: usize) -> String {
    (0..guests)
        .map(|i| {
            let c =
                std::fs::read_to_string(dir.join(format!("vm{i}/console.log"))).unwrap_or_default();
            let tail: Vec<&str> = c.lines().rev().take(15).collect();
            format!(
                "--- vm{i} console (last lines)\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect()
}

/// A shell script that runs each `(name, command)` in turn, keeping each one's stdout, stderr,
/// exit code and milliseconds taken as `$VM_OUT/<name>.{out,err,rc,ms}`, and never stops at a
/// failure.
fn batch(cases: &[(String, String)]) -> String {
    let mut s = String::from("set +e\n");
    for (name, cmd) in cases {
        s += &format!(
            "t0=$(date +%s%N); ( {cmd} ) >\"$VM_OUT/{name}.out\" 2>\"$VM_OUT/{name}.err\" </dev/null; \
             echo $? >\"$VM_OUT/{name}.rc\"; \
             echo $(( ($(date +%s%N) - t0) / 1000000 )) >\"$VM_OUT/{name}.ms\"\n"
        );
    }
    s
}

/// One case's results from a guest: (exit code, stdout, stderr).
fn case(g: &Guest, name: &str) -> (Option<i32>, String, String) {
    (
        g.file(&format!("{name}.rc")).trim().parse().ok(),
        g.file(&format!("{name}.out")),
        g.file(&format!("{name}.err")),
    )
}

fn data_rows(out: &str) -> Vec<Vec<&str>> {
    out.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// A validated table: rows, `#wrong` 0 in place and out of place, the OK footer.
fn assert_validated(name: &str, rc: Option<i32>, out: &str, err: &str) {
    assert_eq!(rc, Some(0), "{name}: exit {rc:?}\n{out}\n{err}");
    assert!(
        out.contains("# Out of bounds values : 0 OK"),
        "{name}: not validated\n{out}\n{err}"
    );
    let rows = data_rows(out);
    assert!(!rows.is_empty(), "{name}: no rows\n{out}");
    for r in &rows {
        // The row ends with out-of-place time algbw busbw #wrong, then the same in place (N/A
        // where nccl-tests has no in-place form: alltoall); hypercube has no redop column.
        let n = r.len();
        assert!(
            n >= 12 && r[n - 5] == "0" && (r[n - 1] == "0" || r[n - 1] == "N/A"),
            "{name}: wrong data in {r:?}\n{out}"
        );
    }
}

/// `busbw <coll>_perf` over verbs with `args`, as a shell command for a guest.
fn perf(coll: &str, args: &str) -> String {
    format!("{BUSBW} {coll}_perf --transport verbs -T 120 {args}")
}

/// Point 2 of the RDMA issue: every collective on real verbs in one guest (ranks share rxe0
/// in loopback through the NIC), in and out of place, several types and ops, 2 to 4 ranks
/// and thread-ranks, every AllReduce algorithm, one and four queue pairs per connection,
/// explicit and scanned GID, `--ib-hca` filters, sizes from 0 to 16 MiB (messages of
/// thousands of MTUs, each written straight into the receiver's buffer) and many messages in
/// flight (alltoall of 4 ranks).
#[test]
fn every_collective_on_softroce() {
    if !can_run("every_collective_on_softroce") {
        return;
    }
    let mut cases: Vec<(String, String)> = Vec::new();
    let mut add = |name: &str, cmd: String| cases.push((name.to_string(), cmd));
    for coll in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "alltoall",
        "alltoallv",
        "scatter",
        "gather",
        "sendrecv",
        "hypercube",
    ] {
        // An additive step, so that the sweep starts at 0 bytes (-f never grows 0); small
        // sizes are covered by the cases below.
        add(coll, perf(coll, "--np 2 -b 0 -e 192K -i 64K -n 2 -w 1"));
    }
    add(
        "types",
        perf("all_reduce", "--np 3 -b 1K -e 1K -n 1 -w 0 -d all -o sum"),
    );
    add(
        "ops",
        perf("all_reduce", "--np 3 -b 1K -e 1K -n 1 -w 0 -d float -o all"),
    );
    add(
        "np3_ring",
        perf(
            "all_reduce",
            "--np 3 -b 8 -e 1M -f 16 -n 2 -w 1 --algo ring",
        ),
    );
    add(
        "np4_tree",
        perf(
            "all_reduce",
            "--np 4 -b 8 -e 1M -f 16 -n 2 -w 1 --algo tree",
        ),
    );
    add(
        "np4_rd",
        perf("all_reduce", "--np 4 -b 8 -e 1M -f 16 -n 2 -w 1 --algo rd"),
    );
    add(
        "threads",
        perf("all_reduce", "--np 2 -t 2 -b 8 -e 256K -f 32 -n 2 -w 1"),
    );
    add(
        "qps4",
        format!(
            "NCCL_IB_QPS_PER_CONNECTION=4 {}",
            perf("all_reduce", "--np 2 -b 8 -e 1M -f 16 -n 2 -w 1")
        ),
    );
    add(
        "gid_explicit",
        format!(
            "NCCL_IB_GID_INDEX=1 {}",
            perf("sendrecv", "--np 2 -b 64K -e 64K -n 2 -w 1")
        ),
    );
    add(
        "hca_filter",
        perf(
            "sendrecv",
            "--np 2 -b 64K -e 64K -n 2 -w 1 --ib-hca =rxe0:1",
        ),
    );
    add(
        "hca_excluded",
        perf("sendrecv", "--np 2 -b 64K -e 64K -n 1 -w 0 --ib-hca ^rxe0"),
    );
    add(
        "large",
        perf("all_reduce", "--np 2 -b 16M -e 16M -n 1 -w 0"),
    );
    add(
        "alltoall_many",
        perf("alltoall", "--np 4 -b 4K -e 64K -f 4 -n 4 -w 1"),
    );
    // Registration pins memory: without CAP_IPC_LOCK and with a 64 KiB limit it must fail
    // with what to raise, not hang.
    add(
        "memlock",
        format!(
            "ulimit -l 64; setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock \
             {BUSBW} all_reduce_perf --transport verbs --np 2 -b 4M -e 4M -n 1 -w 0 -T 20"
        ),
    );
    let names: Vec<String> = cases.iter().map(|(n, _)| n.clone()).collect();
    let g = run_guests(
        "coll",
        1,
        &["--smp", "2", "--mem", "3072", "--timeout", "900"],
        &batch(&cases),
    );
    let g = &g[0];
    assert_eq!(g.rc, Some(0), "{}\n{}", g.stdout, g.stderr);
    // Where the guest's time went: CI's budget is mostly these guests.
    let took: Vec<String> = names
        .iter()
        .map(|n| format!("{n} {} ms", g.file(&format!("{n}.ms")).trim()))
        .collect();
    let _ = writeln!(std::io::stderr(), "coll cases: {}", took.join(", "));
    for name in &names {
        let (rc, out, err) = case(g, name);
        match name.as_str() {
            "hca_excluded" => {
                assert_eq!(rc, Some(2), "{name}: a usage error\n{out}\n{err}");
                assert!(err.contains("--transport verbs"), "{name}: {err}");
            }
            "memlock" => {
                assert_ne!(rc, Some(0), "{name}: ran with 64 KiB locked\n{out}\n{err}");
                assert!(
                    err.contains("ulimit -l") || err.contains("memlock"),
                    "{name}: the error should say what to raise\n{err}"
                );
            }
            _ => {
                assert_validated(name, rc, &out, &err);
                assert!(
                    out.contains("via verbs [rxe0:1"),
                    "{name}: device lines should name rxe0\n{out}"
                );
            }
        }
    }
    let (_, out, _) = case(g, "gid_explicit");
    assert!(out.contains("GID 1 "), "explicit GID index 1\n{out}");
    let (_, out, _) = case(g, "large");
    assert!(
        data_rows(&out).iter().any(|r| r[0] == "16777216"),
        "16 MiB row\n{out}"
    );
    let (_, out, _) = case(g, "types");
    for t in ["int8", "int32", "float", "double", "bfloat16", "half"] {
        assert!(
            data_rows(&out).iter().any(|r| r[2] == t),
            "type {t} missing\n{out}"
        );
    }
    let (_, out, _) = case(g, "ops");
    for o in ["sum", "prod", "max", "min", "avg", "mulsum"] {
        assert!(
            data_rows(&out).iter().any(|r| r[3] == o),
            "op {o} missing\n{out}"
        );
    }
}

/// The shell of one guest's part in a job of `guests` guests × 2 ranks started in `style`,
/// the store on vm0 at `port`; rank outputs go to `$VM_OUT/<name>.<local rank or pod>.*`.
fn launch(name: &str, style: &str, guests: usize, port: u16, busbw_args: &str) -> String {
    let world = guests * 2;
    let keep = |tag: &str| {
        format!(
            ">\"$VM_OUT/{name}.{tag}.out\" 2>\"$VM_OUT/{name}.{tag}.err\"; \
             echo $? >\"$VM_OUT/{name}.{tag}.rc\""
        )
    };
    let hosts: Vec<String> = (0..guests).map(|i| format!("vm{i}")).collect();
    match style {
        // One process per rank, torchrun's variables.
        "torchrun" => {
            (0..2)
                .map(|l| {
                    format!(
                        "( RANK=$((2 * VM_INDEX + {l})) WORLD_SIZE={world} LOCAL_RANK={l} \
                     LOCAL_WORLD_SIZE=2 MASTER_ADDR=vm0 MASTER_PORT={port} \
                     {BUSBW} {busbw_args} {k} ) &\n",
                        k = keep(&l.to_string())
                    )
                })
                .collect::<String>()
                + "wait\n"
        }
        // Volcano's env + svc plugins: one pod per node starting its ranks.
        "volcano" => format!(
            "VC_TASK_INDEX=$VM_INDEX VK_TASK_INDEX=$VM_INDEX VC_RANK_NUM={guests} \
             VC_RANK_HOSTS={h} {BUSBW} {busbw_args} --launcher volcano --nproc-per-node 2 \
             --port {port} {k}\n",
            h = hosts.join(","),
            k = keep("pod")
        ),
        // Volcano's pytorch plugin: pod-level RANK and WORLD_SIZE.
        "pytorch" => format!(
            "MASTER_ADDR=vm0 MASTER_PORT={port} WORLD_SIZE={guests} RANK=$VM_INDEX \
             {BUSBW} {busbw_args} --launcher env --nproc-per-node 2 {k}\n",
            k = keep("pod")
        ),
        other => panic!("no launch style {other}"),
    }
}

/// Point 3: three guests, two ranks each, started by each launcher style. `auto` moves data
/// over shared memory inside a guest and over verbs between guests, and the device lines say
/// so.
#[test]
fn several_nodes_on_softroce() {
    if !can_run("several_nodes_on_softroce") {
        return;
    }
    const K: usize = 3;
    // NCCL's default ack timeout (20: 4.3 s) on purpose: a short one (14: 67 ms) retransmits
    // spuriously when an emulated guest stalls or a shaped queue holds packets that long, and
    // rxe's responder then fails duplicate writes with IBV_WC_REM_INV_REQ_ERR (seen in CI).
    let cmd_env = "unset NCCL_IB_TIMEOUT\n";
    let job = "all_reduce_perf -b 8 -e 1M -f 32 -n 2 -w 1 -T 120";
    let styles = [("torchrun", 29500), ("volcano", 29510), ("pytorch", 29520)];
    let cmd: String = std::iter::once(cmd_env.to_string())
        .chain(
            styles
                .iter()
                .map(|(s, port)| launch(s, s, K, *port, job) + &barrier(s)),
        )
        .collect();
    let g = run_guests("nodes", K, &["--mem", "1536"], &cmd);
    for (i, guest) in g.iter().enumerate() {
        assert_eq!(
            guest.rc,
            Some(0),
            "vm{i}: {}\n{}",
            guest.stdout,
            guest.stderr
        );
    }
    for (style, _) in styles {
        let tag = if style == "torchrun" { "0" } else { "pod" };
        let (rc, out, err) = case(&g[0], &format!("{style}.{tag}"));
        assert_validated(style, rc, &out, &err);
        let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("#  Rank")).collect();
        assert_eq!(
            lines.len(),
            2 * K,
            "{style}: every rank has a device line\n{out}"
        );
        for l in &lines {
            assert!(
                l.contains("via shm+verbs [rxe0:1 GID 1 ::ffff:10.77.0."),
                "{style}: shared memory inside a guest, verbs between guests: {l}\n{out}"
            );
        }
        for i in 0..K {
            let host = format!("vm{i}");
            let on_host = lines
                .iter()
                .filter(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.windows(2).any(|p| p[0] == "on" && p[1] == host)
                })
                .count();
            assert_eq!(on_host, 2, "{style}: two ranks on {host}\n{out}");
        }
        // Every other process of the job ended well too.
        for (i, guest) in g.iter().enumerate() {
            for t in if style == "torchrun" {
                vec!["0", "1"]
            } else {
                vec!["pod"]
            } {
                let (rc, out, err) = case(guest, &format!("{style}.{t}"));
                assert_eq!(rc, Some(0), "{style} vm{i} {t}: {out}\n{err}");
            }
        }
    }
}

/// The guest half of `verbs_bootstrap_refuses_strangers`, run inside a guest by this very
/// test binary: a listener of job 77 with token `right`; strangers connect to its bootstrap
/// socket with a hello of the right job but no proof, a proof made with another token, and a
/// replay of a hello that was accepted once. The listener must accept the honest connection
/// only; its refusals go to stderr, which the host half reads.
#[test]
#[ignore = "runs inside a SoftRoCE guest, started by verbs_bootstrap_refuses_strangers"]
fn guest_verbs_bootstrap_strangers() {
    use busbw_transports::auth;
    use busbw_transports::verbs::handshake::{frame, Hello, ListenInfo};
    use busbw_transports::verbs::{self, VerbsConfig};
    use busbw_transports::Identity;
    use std::io::Read;
    use std::net::TcpStream;
    use std::time::Duration;

    let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let id = |rank| Identity::new(77, rank).with_token(Some("right"));
    let cfg = VerbsConfig {
        stall_timeout: Duration::from_secs(20),
        ..VerbsConfig::default()
    };
    let (listening, _) = verbs::open(id(0), cfg.clone(), local, None).expect("open rxe0");
    let (handle, mut listener) = listening.listen().expect("listen");
    let info = ListenInfo::decode(&handle.0).expect("own handle");
    let hello = Hello {
        job: 77,
        rank: 1,
        channel: 0,
        port: info.port,
        qpns: vec![0x11],
        fifo_addr: 0x1000,
        fifo_rkey: 1,
        fifo_depth: cfg.depth as u32,
        eager: 0,
    }
    .encode();
    let send = |bytes: &[u8]| {
        let mut s = TcpStream::connect(info.bootstrap).expect("connect to the bootstrap");
        s.write_all(bytes).expect("send");
        s
    };
    let answer = |mut s: TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
        b.len()
    };
    // 1. The right job id, no proof at all.
    let s1 = send(&frame(&hello));
    drop(s1.shutdown(std::net::Shutdown::Write));
    assert!(
        listener.accept(Duration::from_secs(3)).is_err(),
        "a hello without a proof was accepted"
    );
    assert_eq!(answer(s1), 0, "a stranger got a reply");
    // 2. A proof made with another token.
    let wrong = auth::data_tail(
        &auth::Key::from_token(Some("wrong")).for_job(77),
        &info.challenge,
        &hello,
    );
    let s2 = send(&[frame(&hello), wrong.to_vec()].concat());
    assert!(
        listener.accept(Duration::from_secs(3)).is_err(),
        "a hello proven with another token was accepted"
    );
    assert_eq!(answer(s2), 0, "a stranger got a reply");
    // 3. An honest hello is accepted once; the same bytes replayed are refused.
    let honest = [
        frame(&hello),
        auth::data_tail(&id(1).data_key(), &info.challenge, &hello).to_vec(),
    ]
    .concat();
    let _s3 = send(&honest);
    listener
        .accept(Duration::from_secs(10))
        .expect("the honest hello is accepted");
    let s4 = send(&honest);
    assert!(
        listener.accept(Duration::from_secs(3)).is_err(),
        "a replayed hello was accepted"
    );
    assert_eq!(answer(s4), 0, "a replay got a reply");
    // 4. A real connector of the same job with another token.
    let wrong_token = Identity::new(77, 1).with_token(Some("wrong"));
    let (other, _) = verbs::open(wrong_token, cfg.clone(), local, None).expect("open rxe0 again");
    let _conn = other.connect(&handle, 0, Duration::from_secs(5));
    assert!(
        listener.accept(Duration::from_secs(3)).is_err(),
        "a connector with another token was accepted"
    );
    // 5. The check every transport passes (tcp and shm in the host tests).
    busbw_transports::conformance::refuses_strangers(78, &|id| {
        verbs::open(id, cfg.clone(), local, None)
            .map(|(t, _)| t)
            .map_err(|e| format!("open rxe0: {e}"))
    })
    .unwrap_or_else(|why| panic!("verbs: {why}"));
    println!("guest_verbs_bootstrap_strangers: all refused");
}

/// Point 5, the last bullet: the verbs bootstrap socket refuses whoever cannot prove the
/// job token, and refuses a replayed hello, saying so on stderr as tcp and shm do.
#[test]
fn verbs_bootstrap_refuses_strangers() {
    if !can_run("verbs_bootstrap_refuses_strangers") {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let cmd = format!(
        "{} --ignored --exact guest_verbs_bootstrap_strangers --nocapture --test-threads 1",
        exe.display()
    );
    let g = run_guests("strangers", 1, &["--mem", "1024"], &cmd);
    let g = &g[0];
    assert_eq!(g.rc, Some(0), "{}\n{}", g.stdout, g.stderr);
    assert!(
        g.stdout.contains("all refused") && g.stdout.contains("1 passed"),
        "{}",
        g.stdout
    );
    let refusals: Vec<&str> = g
        .stderr
        .lines()
        .filter(|l| l.contains("refused a verbs bootstrap connection"))
        .collect();
    for why in [
        "no authentication after the hello",
        "wrong job token",
        "replayed hello",
    ] {
        assert!(
            refusals.iter().any(|l| l.contains(why)),
            "no refusal for {why:?}:\n{}",
            g.stderr
        );
    }
    assert!(refusals.len() >= 4, "four strangers: {refusals:?}");
}

/// One guest's part in fault `name`: a torchrun-style job of 2 ranks per guest (no launcher
/// that could relay a failure: survivors learn it from the data path or the store), each
/// rank's exit code and end time (`date +%s.%N`) kept as `$VM_OUT/<name>.<l>.{rc,end}`.
/// `during` runs in the guest while the job does; `$VM_DIR/<name>.t` is the fault's time.
/// `cycles` is `-N` (0: until a fault stops it).
///
/// The algorithm is left to auto, as a user leaves it: which ranks learn of the fault from a
/// completion and which only from their timeout then depends on each run's calibration, and
/// every mix must end in time. (A rank on the cut-off guest once took 90 s: cut off from the
/// store too, it waited a full store timeout on each of its last words; a failed rank now
/// gives the store a few seconds in all.)
fn fault_job(name: &str, port: u16, cycles: u32, during: &str) -> String {
    let mut s = String::new();
    for l in 0..2 {
        s += &format!(
            "sh -c 'RANK=$((2 * VM_INDEX + {l})) WORLD_SIZE=6 LOCAL_RANK={l} LOCAL_WORLD_SIZE=2 \
             MASTER_ADDR=vm0 MASTER_PORT={port} NCCL_IB_TIMEOUT=16 NCCL_IB_RETRY_CNT=3 \
             {BUSBW} all_reduce_perf -b 64K -e 256K -f 2 -n 20 -w 1 -N {cycles} -T {FAULT_T} \
             --export-json \"$VM_OUT/{name}.{l}.json\" >\"$VM_OUT/{name}.{l}.out\" 2>\"$VM_OUT/{name}.{l}.err\"; \
             echo $? >\"$VM_OUT/{name}.{l}.rc\"; date +%s.%N >\"$VM_OUT/{name}.{l}.end\"' &\n\
             sub{l}=$!\n"
        );
    }
    s += during;
    s += "\nwait\n";
    s
}

/// `-T` of the fault jobs.
const FAULT_T: u64 = 30;

/// Shell that waits (up to 300 s) until rank 0 on vm0 has printed a data row of job `name`.
fn until_running(name: &str) -> String {
    format!(
        "n=0; until grep -q '^ *[0-9]' \"$VM_DIR/vm0/{name}.0.out\" 2>/dev/null; do \
         n=$((n + 1)); [ $n -lt 1500 ] || break; sleep 0.2; done\n"
    )
}

/// Shell that waits (up to 300 s) until every guest has reached barrier `name`: the phases
/// of a test start together even where one guest's part ended later.
fn barrier(name: &str) -> String {
    format!(
        "touch \"$VM_DIR/{name}.done.$VM_INDEX\"; n=0; \
         until [ $(ls \"$VM_DIR\" | grep -c '^{name}\\.done\\.') -ge $VM_COUNT ]; do \
         n=$((n + 1)); [ $n -lt 1500 ] || break; sleep 0.2; done\n"
    )
}

/// Rank 0's JSON report of fault job `name` (on vm0) survived the fault: marked incomplete,
/// with the error (naming `names` when given) and, when the job had printed rows, those rows.
fn reports_kept(vm0: &Guest, name: &str, rows: bool, names: &str) {
    let text = vm0.file(&format!("{name}.0.json"));
    let rec: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{name}: rank 0's report is not JSON ({e}):\n{text}"));
    assert_eq!(rec["complete"], false, "{name}: {rec}");
    let error = rec["summary"]["error"].as_str().unwrap_or_default();
    assert!(
        !error.is_empty() && error.contains(names),
        "{name}: the report says why ({names}): {rec}"
    );
    let n = rec["rows"].as_array().map_or(0, Vec::len);
    assert!(
        !rows || n > 0,
        "{name}: the rows before the fault are kept: {rec}"
    );
}

fn secs(s: &str) -> Option<f64> {
    s.trim().parse().ok()
}

/// Point 5: a rank killed with SIGKILL, a guest's link going down mid-run, and a GID no peer
/// can reach: every rank ends within `-T` (no hang), with exit 3 or 4 and a message that
/// names the failed rank or node, learnt from the verbs completions or the bootstrap socket.
#[test]
fn faults_on_softroce() {
    if !can_run("faults_on_softroce") {
        return;
    }
    // 1. kill -9 of rank 3 (local rank 1 on vm1) once rank 0 prints rows.
    let kill = format!(
        "if [ $VM_INDEX = 1 ]; then {}date +%s.%N >\"$VM_DIR/kill9.t\"; \
         kill -9 $(pgrep -P $sub1); fi",
        until_running("kill9")
    );
    // 2. vm2's link goes down mid-run, and comes back once its ranks have ended.
    let down = format!(
        "if [ $VM_INDEX = 2 ]; then {}date +%s.%N >\"$VM_DIR/linkdown.t\"; \
         ip link set eth0 down; wait; ip link set eth0 up; fi",
        until_running("linkdown")
    );
    // 3. vm1's ranks take rxe1, whose GID is an address on a netdev that reaches nobody.
    let gid_setup = "if [ $VM_INDEX = 1 ]; then ip link add dummy0 type dummy; \
                     ip addr add 10.99.0.2/24 dev dummy0; ip link set dummy0 up; \
                     rdma link add rxe1 type rxe netdev dummy0; sleep 1; \
                     export NCCL_IB_HCA==rxe1; fi; date +%s.%N >\"$VM_OUT/gid.t\"\n";
    let cmd = [
        fault_job("kill9", 29600, 0, &kill),
        barrier("kill9"),
        fault_job("linkdown", 29610, 0, &down),
        barrier("linkdown"),
        gid_setup.to_string(),
        fault_job("gid", 29620, 1, ""),
    ]
    .concat();
    let g = run_guests("faults", 3, &["--mem", "1536", "--timeout", "900"], &cmd);
    let dir = g[0].dir.parent().unwrap().to_path_buf();
    let t = |f: &str| secs(&std::fs::read_to_string(dir.join(f)).unwrap_or_default());
    let rank = |name: &str, r: usize| {
        let gg = &g[r / 2];
        let l = r % 2;
        let (rc, out, err) = case(gg, &format!("{name}.{l}"));
        let end = secs(&gg.file(&format!("{name}.{l}.end")));
        (rc, out, err, end)
    };
    let all_err = |name: &str| {
        (0..6)
            .map(|r| format!("--- rank {r}\n{}", rank(name, r).2))
            .collect::<String>()
    };

    let killed = t("kill9.t").expect("vm1 killed rank 3");
    for r in [0, 1, 2, 4, 5] {
        let (rc, _, err, end) = rank("kill9", r);
        let after = end.expect("ended") - killed;
        eprintln!("kill9: rank {r} exit {rc:?} {after:.1} s after the kill");
        assert!(matches!(rc, Some(3) | Some(4)), "rank {r}: {rc:?}\n{err}");
        assert!(after < FAULT_T as f64, "rank {r} took {after:.1} s\n{err}");
        assert!(err.contains("rank 3"), "rank {r} names rank 3\n{err}");
    }
    let errs = all_err("kill9");
    reports_kept(&g[0], "kill9", true, "rank 3");
    assert!(
        errs.contains("IBV_WC_")
            || errs.contains("flush")
            || errs.contains("RDMA")
            || errs.contains("peer rank 3 closed the connection"),
        "some survivor learnt it from a verbs completion\n{errs}"
    );

    let down = t("linkdown.t").expect("vm2 took its link down");
    for r in 0..6 {
        let (rc, _, err, end) = rank("linkdown", r);
        let after = end.expect("ended") - down;
        eprintln!("linkdown: rank {r} exit {rc:?} {after:.1} s after the link went down");
        assert!(matches!(rc, Some(3) | Some(4)), "rank {r}: {rc:?}\n{err}");
        let limit = if r >= 4 { 2 * FAULT_T } else { FAULT_T } as f64;
        assert!(after < limit, "rank {r} took {after:.1} s\n{err}");
        if r < 4 {
            assert!(err.contains("vm2"), "rank {r} names vm2\n{err}");
        }
    }
    let errs = all_err("linkdown");
    reports_kept(&g[0], "linkdown", true, "");
    // Which signal arrives first depends on what each rank had in flight when the link went
    // and on when vm2's ranks gave up: an RDMA write toward vm2 ends in RETRY_EXC (~1 s at
    // NCCL_IB_TIMEOUT=16, 3 retries); a rank waiting for vm2's clear-to-send or data has
    // posted nothing that can fail and learns it from the bootstrap socket's keepalives
    // (~17 s), or from vm2's kernel resetting the connection once vm2's ranks have exited
    // (losing the store first) and the link is back; vm2's own ranks see their sends fail
    // locally. Each is the right detection, and each must arrive decoded (every completion
    // status's message is unit-tested in transports' verbs::wc).
    let paths = [
        (
            "RETRY_EXC",
            errs.contains("IBV_WC_RETRY_EXC_ERR")
                && errs.contains("the peer stopped acknowledging"),
        ),
        ("keepalives", errs.contains("stopped answering keepalives")),
        (
            "connection reset",
            errs.contains("peer rank 4 closed the connection"),
        ),
        (
            "local send failure",
            errs.contains("IBV_WC_LOC_QP_OP_ERR") && errs.contains("this host could not send"),
        ),
    ];
    eprintln!("linkdown: learnt from {paths:?}");
    assert!(
        paths.iter().any(|p| p.1),
        "the cut-off link was learnt from a decoded verbs completion or the bootstrap socket\n{errs}"
    );

    // The unreachable GID shows at the first transfer, once the job has assembled: timed
    // from the job's start (rank 0's report), not from the launch, whose start-up in an
    // emulated guest takes 20 s on a quiet machine and twice that under load. Slack: the
    // report's start is whole seconds, guests' clocks differ by up to a second, exiting
    // takes a couple more under load.
    let report: serde_json::Value =
        serde_json::from_str(&g[0].file("gid.0.json")).expect("gid: rank 0's report");
    let job_start = report["start_time"]
        .as_str()
        .and_then(busbw_reports::clock::parse_rfc3339)
        .expect("gid: the report's start_time");
    for r in 0..6 {
        let (rc, _, err, end) = rank("gid", r);
        let launched = secs(&g[r / 2].file("gid.t")).expect("gid start");
        let end = end.expect("ended");
        let took = end - job_start;
        eprintln!(
            "gid: rank {r} exit {rc:?} {took:.1} s after the job started ({:.1} s after launch)",
            end - launched
        );
        assert!(matches!(rc, Some(3) | Some(4)), "rank {r}: {rc:?}\n{err}");
        assert!(
            took < FAULT_T as f64 + 5.0,
            "rank {r} took {took:.1} s after the job started\n{err}"
        );
    }
    let errs = all_err("gid");
    reports_kept(&g[0], "gid", false, "");
    assert!(
        errs.contains("peer unreachable or wrong GID") && errs.contains("is on vm1"),
        "the message says unreachable peer or wrong GID, and whose\n{errs}"
    );
}

/// The bed tells its own faults from the command's: a guest whose kernel reports its emulated
/// NIC's transmit queue stuck (here, written to the kernel log by the command itself) makes the
/// run a bed failure that names the guest, even though the command exited 0.
#[test]
fn a_stalled_emulated_nic_is_the_beds_failure() {
    if !can_run("a_stalled_emulated_nic_is_the_beds_failure") {
        return;
    }
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = common::Scratch::new("rdma", "stall");
    let out = bed(
        1,
        dir.path(),
        &[],
        "echo '<3>virtio_net virtio2 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 5372 ms' >/dev/kmsg; sleep 1",
    );
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{said}{}", text(&out.stderr));
    assert!(
        said.contains("vm0: exit 0")
            && said.contains(
                "vm0: the test bed failed: the guest's emulated NIC stopped transmitting"
            ),
        "{said}"
    );
}

/// Point 7: `busbw doctor` on the guest's real sysfs agrees with `ibv_devinfo -v`, `rdma link`
/// and the kernel's GID table (index, type, address, netdev), with IPv4, a second IPv4 and a
/// global IPv6 address on the rxe netdev.
#[test]
fn doctor_agrees_with_ibv_devinfo() {
    if !can_run("doctor_agrees_with_ibv_devinfo") {
        return;
    }
    let cmd = format!(
        "ip addr add 10.77.1.1/24 dev eth0; ip -6 addr add fd00:77::1/64 dev eth0 nodad; \
         sleep 2; {BUSBW} doctor >\"$VM_OUT/doctor.out\"; echo $? >\"$VM_OUT/doctor.rc\"; \
         ibv_devinfo -v >\"$VM_OUT/devinfo.out\"; rdma link show >\"$VM_OUT/link.out\"; \
         p=/sys/class/infiniband/rxe0/ports/1; for f in $p/gids/*; do n=${{f##*/}}; \
         read -r a <$f; [ $a = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue; \
         read -r t <$p/gid_attrs/types/$n; read -r d <$p/gid_attrs/ndevs/$n; \
         echo \"$n $a ${{t// /_}} $d\"; done >\"$VM_OUT/gids.txt\""
    );
    let g = run_guests("doctor", 1, &[], &cmd);
    let g = &g[0];
    assert_eq!(g.rc, Some(0), "{}\n{}", g.stdout, g.stderr);
    let doctor = g.file("doctor.out");
    let devinfo = g.file("devinfo.out");
    let link = g.file("link.out");
    assert_eq!(
        g.file("doctor.rc").trim(),
        "0",
        "a usable port: exit 0\n{doctor}"
    );
    // rdma link: state, physical state and netdev.
    let l = link
        .lines()
        .find(|l| l.starts_with("link rxe0/1 "))
        .unwrap_or_else(|| panic!("no rxe0/1 in rdma link:\n{link}"));
    let w: Vec<&str> = l.split_whitespace().collect();
    let field = |k: &str| w.iter().position(|x| *x == k).map(|i| w[i + 1]);
    assert_eq!(field("state"), Some("ACTIVE"), "{l}");
    assert!(doctor.contains("port 1: ACTIVE (LinkUp)"), "{doctor}");
    assert!(
        doctor.contains(&format!("netdev {}", field("netdev").unwrap())),
        "{doctor}"
    );
    // ibv_devinfo: port state, link layer, active MTU.
    assert!(devinfo.contains("PORT_ACTIVE"), "{devinfo}");
    let mtu = devinfo
        .lines()
        .find_map(|l| l.trim().strip_prefix("active_mtu:"))
        .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
        .expect("active_mtu");
    assert!(
        doctor.contains(&format!("(RoCE MTU {mtu})")),
        "MTU {mtu}\n{doctor}"
    );
    let layer = devinfo
        .lines()
        .find_map(|l| l.trim().strip_prefix("link_layer:"))
        .map(|v| v.trim().to_string())
        .expect("link_layer");
    assert!(doctor.contains(&format!("link layer {layer}")), "{doctor}");
    // Every GID ibv_devinfo shows (GID[  n]:  addr, RoCE v2) is in the doctor's table.
    let mut seen = 0;
    for l in devinfo
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("GID["))
    {
        let (idx, rest) = l[4..].split_once("]:").unwrap();
        let idx: usize = idx.trim().parse().unwrap();
        let (addr, kind) = rest.trim().split_once(',').unwrap();
        let addr: std::net::Ipv6Addr = addr.trim().parse().unwrap_or_else(|_| {
            let hex: String = addr.trim().replace(':', "");
            let b: Vec<u8> = (0..16)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            std::net::Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap())
        });
        let row = doctor
            .lines()
            .map(str::split_whitespace)
            .map(|w| w.collect::<Vec<_>>())
            .find(|w| w.first() == Some(&idx.to_string().as_str()) && w.len() >= 5)
            .unwrap_or_else(|| panic!("GID {idx} missing from the doctor\n{doctor}"));
        assert_eq!(
            format!("{} {}", row[1], row[2]),
            kind.trim(),
            "{l}\n{doctor}"
        );
        assert_eq!(
            row[3].parse::<std::net::Ipv6Addr>().ok(),
            Some(addr),
            "{l}\n{doctor}"
        );
        seen += 1;
    }
    assert!(
        seen >= 4,
        "link-local, two IPv4 and one IPv6 GID:\n{devinfo}"
    );
    // The kernel's table (the shell skips empty entries without forking: a fork costs tens of
    // milliseconds in an emulated guest, and rxe's table has hundreds of entries): every valid
    // entry's type, address and netdev.
    for l in g.file("gids.txt").lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() < 4 || w[1] == "0000:0000:0000:0000:0000:0000:0000:0000" {
            continue;
        }
        let row = doctor
            .lines()
            .map(|d| d.split_whitespace().collect::<Vec<_>>())
            .find(|d| d.first() == Some(&w[0]) && d.len() >= 5)
            .unwrap_or_else(|| panic!("sysfs GID {} missing\n{doctor}", w[0]));
        assert_eq!(format!("{}_{}", row[1], row[2]), w[2], "{l}\n{doctor}");
        assert_eq!(
            row[3].parse::<std::net::Ipv6Addr>().ok(),
            w[1].parse::<std::net::Ipv6Addr>().ok(),
            "address of GID {}\n{doctor}",
            w[0]
        );
        assert_eq!(row[4], w[3], "netdev of GID {}\n{doctor}", w[0]);
    }
    assert!(
        doctor.lines().any(|l| l.contains("RoCE v2")
            && l.contains("::ffff:10.77.")
            && l.ends_with("<- chosen")),
        "a RoCE v2 IPv4 GID is chosen\n{doctor}"
    );
}

/// Shaped rate of every guest's link in the tiers test (the throttled guest gets half).
const TIER_MBIT: f64 = 16.0;

/// GB/s that RDMA WRITEs get from a tbf of `mbit` on Ethernet at RoCE MTU 1024: per packet,
/// 1024 bytes of payload in 1082 on the wire (Ethernet 14, IPv4 20, UDP 8, BTH 12, ICRC 4).
fn roce_goodput(mbit: f64) -> f64 {
    mbit * 1e6 / 8.0 / 1e9 * 1024.0 / 1082.0
}

/// Point 4: `busbw tiers` over verbs. Six guests, one rank each, in three local blocks of one
/// network block (OCI's rdma.* labels), every link shaped by tbf inside its guest, vm5's at
/// half rate, and the link between vm1 and vm3 at half rate both ways (issue 39): the
/// groups' sub-communicators run on verbs, the groups that do not hold vm5 measure the
/// shaping, and the verdict names vm5 as a slow node and vm1 - vm3 as a slow link, nobody
/// else. (Six, not four: with four nodes the throttled one holds half the links, and no
/// median-based verdict can tell which half is slow.)
#[test]
fn tiers_over_verbs_name_the_throttled_guest() {
    if !can_run("tiers_over_verbs_name_the_throttled_guest") {
        return;
    }
    const K: usize = 6;
    let cmd = format!(
        "RANK=$VM_INDEX WORLD_SIZE={K} MASTER_ADDR=vm0 MASTER_PORT=29700 {BUSBW} tiers \
         -b 1M -e 1M -n 4 -w 1 -c 0 -T 180 --transport verbs --topology-preset oci \
         --topology-file \"$VM_DIR/labels.json\" --pairwise-size 512K --pairwise-iters 3 --pairwise full \
         --export-json \"$VM_OUT/tiers.json\"; rc=$?; \
         for c in completer_retry_err rcvd_seq_err out_of_seq_request; do \
         echo \"rxe0 $c $(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/$c)\" >&2; done; \
         exit $rc"
    );
    let rate = format!("{}mbit", TIER_MBIT as u32);
    let g = run_guests(
        "tiers",
        K,
        &[
            "--rate",
            &rate,
            "--throttle",
            "5",
            "--throttle-link",
            "1,3",
            "--labels",
            "--blocks",
            "2,6",
            "--mem",
            "1024",
        ],
        &cmd,
    );
    let stdout = &g[0].stdout;
    let all: String = g
        .iter()
        .enumerate()
        .map(|(i, x)| format!("--- vm{i} ({:?})\n{}{}", x.rc, x.stdout, x.stderr))
        .collect();
    eprintln!("{stdout}");
    // Lost packets (the shaped queue is deep enough that there should be none) show here.
    if let Some(bed) = g[0].dir.parent() {
        let l2 = std::fs::read_to_string(bed.join("l2.txt")).unwrap_or_default();
        eprintln!("virtual network: {}", l2.replace('\n', "; "));
    }
    for (i, x) in g.iter().enumerate() {
        for l in x.stderr.lines().filter(|l| l.starts_with("rxe0 ")) {
            eprintln!("vm{i}: {l}");
        }
    }
    let codes: Vec<Option<i32>> = g.iter().map(|x| x.rc).collect();
    assert!(codes.iter().all(|c| *c == codes[0]), "{codes:?}\n{all}");
    assert_eq!(codes[0], Some(7), "the verdict fails the job\n{all}");
    for l in stdout.lines().filter(|l| l.starts_with("#  Rank")) {
        assert!(l.contains("via verbs [rxe0:1"), "{l}\n{stdout}");
    }
    let text = std::fs::read_to_string(g[0].dir.join("tiers.json")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    let t = &report["tier_report"];
    let v = &t["verdict"];
    let suspects: Vec<&str> = v["suspect_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap())
        .collect();
    assert_eq!(suspects, ["vm5"], "{stdout}");
    let links: Vec<String> = v["slow_links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            format!(
                "{} - {}",
                l["a"].as_str().unwrap(),
                l["b"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        links == ["vm1 - vm3"] || links == ["vm3 - vm1"],
        "{links:?}\n{stdout}"
    );
    assert!(stdout.contains("# Verdict: FAIL"), "{stdout}");
    // Links: the median of the healthy pairs at the shaping, of vm5's at half of theirs.
    // (Medians, not every link: one pairwise round is three iterations, and a loaded host can
    // slow one of them by more than the tolerance; the verdict above already judged each link.)
    let want = roce_goodput(TIER_MBIT);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (slow, healthy): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) = t["matrix"]["links"]
        .as_array()
        .unwrap()
        .iter()
        .partition(|l| {
            let (a, b) = (&l["a"], &l["b"]);
            a == "vm5" || b == "vm5" || (a == "vm1" && b == "vm3") || (a == "vm3" && b == "vm1")
        });
    let bw = |v: Vec<&serde_json::Value>| v.iter().map(|l| l["busbw"].as_f64().unwrap()).collect();
    let (h, s) = (median(bw(healthy)), median(bw(slow)));
    // Never above the shaping; below it only as far as a loaded host slows the whole run
    // (the groups below then agree with these links, not with the shaping).
    assert!(h <= want * 1.10, "healthy links {h}, shaped {want}\n{all}");
    assert!(
        (s / (h / 2.0) - 1.0).abs() <= 0.15,
        "vm5's links {s}, half of the healthy ones' {h}\n{all}"
    );
    // The local blocks without vm5 measure the shaped link.
    let lb = t["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["tier"] == "local_block")
        .unwrap_or_else(|| panic!("no local_block tier\n{stdout}"));
    let mut checked = 0;
    for grp in lb["group_results"].as_array().unwrap() {
        let nodes: Vec<&str> = grp["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        if nodes.contains(&"vm5") {
            continue;
        }
        let bw = grp["busbw"][0].as_f64().unwrap();
        assert!(
            shaped_rate(bw, want, h),
            "local block {nodes:?}: {bw} GB/s, shaped {want} GB/s, this run's healthy links \
             {h} GB/s\n{all}"
        );
        if !within(bw, want, 0.10) {
            println!(
                "local block {nodes:?} at {bw} GB/s, off its shaping ({want}) by more than 10 % \
                 but within 20 % of this run's links ({h}): a loaded host"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "{stdout}");
}
