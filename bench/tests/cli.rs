//! The real binary, end to end: local ranks over TCP loopback, the table, exit codes, bad
//! input, and failures of a rank.

mod common;
use common::{busbw, run, text, BUSBW};

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One parsed data row of the table.
#[derive(Debug)]
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    root: i64,
    oop: [f64; 3],
    oop_wrong: String,
    ip: [f64; 3],
    ip_wrong: String,
}

fn rows(stdout: &str) -> Vec<Row> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "data row with 13 fields: {l:?}");
            let num = |s: &str| {
                s.parse::<f64>()
                    .unwrap_or_else(|_| panic!("number in {l:?}"))
            };
            Row {
                size: f[0].parse().unwrap(),
                count: f[1].parse().unwrap(),
                dtype: f[2].into(),
                redop: f[3].into(),
                root: f[4].parse().unwrap(),
                oop: [num(f[5]), num(f[6]), num(f[7])],
                oop_wrong: f[8].into(),
                ip: [num(f[9]), num(f[10]), num(f[11])],
                ip_wrong: f[12].into(),
            }
        })
        .collect()
}

/// The sweep on `np` ranks validates and reports what nccl-tests would.
fn sweep(np: usize, extra: &[&str]) {
    let npa = np.to_string();
    let mut args = vec![
        "all_reduce_perf",
        "--np",
        &npa,
        "-b",
        "8",
        "-e",
        "256K",
        "-f",
        "8",
        "-n",
        "3",
        "-T",
        "60",
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "np={np}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let devices = stdout.lines().filter(|l| l.starts_with("#  Rank ")).count();
    assert_eq!(devices, np, "one device line per rank:\n{stdout}");
    let rows = rows(&stdout);
    let sizes: Vec<u64> = rows.iter().map(|r| r.size).collect();
    assert_eq!(sizes, vec![8, 64, 512, 4096, 32768, 262144], "{stdout}");
    for r in &rows {
        assert_eq!(r.count, r.size / 4);
        assert_eq!(
            (r.dtype.as_str(), r.redop.as_str(), r.root),
            ("float", "sum", -1)
        );
        assert_eq!(
            (r.oop_wrong.as_str(), r.ip_wrong.as_str()),
            ("0", "0"),
            "{stdout}"
        );
        for cell in [r.oop, r.ip] {
            let [time, algbw, busbw] = cell;
            assert!(time > 0.0, "{r:?}");
            // busbw = algbw * 2(n-1)/n, within the rounding of the printed values.
            let factor = 2.0 * (np as f64 - 1.0) / np as f64;
            // Both printed values are rounded to 2 decimals (and ~3 significant digits).
            let slack = 0.005 * factor + 0.005 + 0.01 * busbw;
            assert!((busbw - algbw * factor).abs() <= slack, "{r:?}");
        }
    }
    assert!(
        stdout.contains("# Out of bounds values : 0 OK\n"),
        "{stdout}"
    );
    assert!(stdout.contains("\n# Avg bus bandwidth    : "), "{stdout}");
    assert!(
        stdout.ends_with("# Collective test concluded: all_reduce_perf\n#\n\n"),
        "{stdout:?}"
    );
}

#[test]
fn one_rank_in_process() {
    sweep(1, &[]);
}

#[test]
fn two_ranks() {
    sweep(2, &[]);
}

#[test]
fn three_ranks() {
    sweep(3, &[]);
}

#[test]
fn four_ranks() {
    sweep(4, &[]);
}

#[test]
fn eight_ranks() {
    sweep(8, &[]);
}

/// Header and footer lines to the byte (timings aside).
#[test]
fn table_format_is_nccl_tests() {
    let out = run(&[
        "all_reduce_perf",
        "--np",
        "2",
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "2",
        "-n",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.split('\n').collect();
    assert!(
        lines[0].starts_with("# nccl-tests version 2.19.6 busbw-version="),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1], "# Collective test starting: all_reduce_perf");
    assert_eq!(
        lines[2],
        "# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 1 iters: 2 agg iters: 1 validation: 1 graph: 0 unalign: 0"
    );
    assert_eq!(lines[3], "#");
    assert_eq!(lines[4], "# Using devices");
    let host = busbw_host();
    for (r, line) in lines[5..7].iter().enumerate() {
        let prefix = format!("#  Rank {r:>2} Group  0 Pid ");
        assert!(line.starts_with(&prefix), "{line}");
        assert!(
            line.contains(&format!(
                " on {host:>10} device {r:>2} [0000:00:00] host memory via shm"
            )),
            "{line}"
        );
    }
    assert_eq!(lines[7], "#");
    assert_eq!(lines[8], "#                                                              out-of-place                       in-place          ");
    assert_eq!(lines[9], "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ");
    assert_eq!(lines[10], "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ");
    for (i, size) in [1024, 2048, 4096].iter().enumerate() {
        let l = lines[11 + i];
        assert_eq!(l.len(), 118, "data rows are fixed width: {l:?}");
        assert_eq!(
            &l[..52],
            format!(
                "{size:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
                size / 4,
                "float",
                "sum",
                -1
            )
        );
        assert_eq!(&l[l.len() - 8..], "       0");
    }
    assert_eq!(lines[14], "# Out of bounds values : 0 OK");
    assert!(
        lines[15].starts_with("# Avg bus bandwidth    : ") && lines[15].ends_with(' '),
        "{:?}",
        lines[15]
    );
    assert_eq!(
        &lines[16..],
        &[
            "#",
            "# Collective test concluded: all_reduce_perf",
            "#",
            "",
            ""
        ]
    );
}

fn busbw_host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length.
    let rc = unsafe { libc_gethostname(buf.as_mut_ptr(), buf.len()) };
    assert_eq!(rc, 0);
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

extern "C" {
    #[link_name = "gethostname"]
    fn libc_gethostname(name: *mut u8, len: usize) -> i32;
}

#[test]
fn every_dtype_and_op() {
    let out = run(&[
        "all_reduce_perf",
        "--np",
        "3",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "-d",
        "all",
        "-o",
        "all",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let rows = rows(&stdout);
    // nccl-tests' orders for -d all and -o all.
    let types = [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
        "bfloat16", "f8e4m3", "f8e5m2",
    ];
    let ops = ["sum", "prod", "max", "min", "avg", "mulsum"];
    let want: Vec<(String, String)> = types
        .iter()
        .flat_map(|t| ops.iter().map(move |o| (t.to_string(), o.to_string())))
        .collect();
    let combos: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.dtype.clone(), r.redop.clone()))
        .collect();
    assert_eq!(combos, want, "{stdout}");
    assert!(
        rows.iter().all(|r| r.oop_wrong == "0" && r.ip_wrong == "0"),
        "{stdout}"
    );
}

#[test]
fn check_zero_prints_na() {
    let out = run(&[
        "all_reduce_perf",
        "--np",
        "2",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "-c",
        "0",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    let r = &rows(&stdout)[0];
    assert_eq!((r.oop_wrong.as_str(), r.ip_wrong.as_str()), ("N/A", "N/A"));
}

/// The corruption hook must be caught: #wrong > 0, FAILED footer, exit code 7.
#[test]
fn corrupted_element_fails_with_exit_7() {
    let out = run(&[
        "all_reduce_perf",
        "--np",
        "3",
        "-b",
        "64",
        "-e",
        "4K",
        "-f",
        "4",
        "-n",
        "1",
        "--debug-corrupt-rank",
        "1",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let rows = rows(&stdout);
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(
            (r.oop_wrong.as_str(), r.ip_wrong.as_str()),
            ("1", "1"),
            "{stdout}"
        );
    }
    let cells = rows.len() * 2;
    assert!(
        stdout.contains(&format!("# Out of bounds values : {cells} FAILED\n")),
        "{stdout}"
    );
}

#[test]
fn min_busbw_gate_fails_with_exit_7() {
    let out = busbw()
        .args([
            "all_reduce_perf",
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "1",
        ])
        .env("NCCL_TESTS_MIN_BW", "100000")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{stdout}");
    assert!(stdout.contains("# Out of bounds values : 0 OK\n"));
    let avg = stdout
        .lines()
        .find(|l| l.starts_with("# Avg bus bandwidth"))
        .unwrap();
    assert!(avg.ends_with(" FAILED"), "{avg}");
    let ok = run(&[
        "all_reduce_perf",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "--min-busbw",
        "0",
    ]);
    assert_eq!(ok.status.code(), Some(0));
    assert!(text(&ok.stdout)
        .lines()
        .any(|l| l.starts_with("# Avg bus bandwidth") && l.ends_with(" OK")));
}

fn usage_error(args: &[&str], needle: &str) {
    let out = run(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?} should mention {needle:?}: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "no table on a usage error: {}",
        text(&out.stdout)
    );
}

#[test]
fn bad_flags_are_usage_errors() {
    usage_error(
        &["all_reduce_perf", "-b", "2G", "-e", "1K"],
        "-b 2147483648 is larger than -e 1024",
    );
    usage_error(&["all_reduce_perf", "-d", "float7"], "float7");
    usage_error(&["all_reduce_perf", "-o", "mul"], "mul");
    usage_error(&["all_reduce_perf", "--np", "0"], "--np 0");
    usage_error(&["all_reduce_perf", "-i", "0"], "-i 0");
    usage_error(&["all_reduce_perf", "-b", "1X"], "suffix");
    usage_error(&["all_reduce_perf", "-n", "0"], "-n 0");
    usage_error(&["all_reduce_perf", "--bogus"], "--bogus");
    usage_error(&["all_reduce_perf", "--rotate", "lots"], "`max`");
    usage_error(
        &["all_reduce_perf", "--socket-nthreads", "17"],
        "at most 16 (NCCL_SOCKET_NTHREADS' limit)",
    );
    usage_error(
        &[
            "all_reduce_perf",
            "--socket-nthreads",
            "16",
            "--nsocks-perthread",
            "8",
        ],
        "128 data sockets; at most 64",
    );
}

/// `-g 1` needs the `cuda` build and a driver; where both exist the device path is
/// scripts/gpu-check.sh's to test, on a GPU.
#[test]
fn gpus_need_the_cuda_build_and_a_driver() {
    usage_error(&["tiers", "-g", "2"], "-g 1 at most");
    let ok = run(&["all_reduce_perf", "-b", "8", "-e", "8", "-g", "0"]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "-g 0 is host memory: {}",
        text(&ok.stderr)
    );
    if !cfg!(feature = "cuda") {
        usage_error(&["tiers", "-g", "1"], "--features cuda");
        usage_error(&["all_reduce_perf", "-g", "1"], "--features cuda");
        usage_error(&["all_reduce_perf", "-g", "2"], "--features cuda");
        usage_error(&["gpu-bench"], "--features cuda");
    } else if let Err(e) = busbw_collectives::cuda::probe() {
        eprintln!("SKIP the -g 1 run: {e}");
        for args in [
            &["all_reduce_perf", "-g", "1"][..],
            &["tiers", "-g", "1"][..],
            &["gpu-bench"][..],
        ] {
            usage_error(args, "no CUDA driver: libcuda.so.1 not found");
            usage_error(args, "install the NVIDIA driver or run without -g");
        }
    } else {
        eprintln!("SKIP: this host has a CUDA driver; scripts/gpu-check.sh tests -g 1 on it");
    }
}

/// The NCCL library a test may use: `NCCL_LIBRARY`, else the wheel `.ci/run` unpacks.
fn nccl_library() -> Option<String> {
    if let Ok(p) = std::env::var("NCCL_LIBRARY") {
        return Some(p);
    }
    let wheel = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/nccl/nvidia/nccl/lib/libnccl.so.2");
    wheel.exists().then(|| wheel.to_string_lossy().into_owned())
}

/// `program --engine nccl` on `np` local ranks with NCCL from `lib`, on a host where joining
/// fails: its stderr, once the exit code says usage.
fn joining(lib: &str, program: &str, np: usize) -> String {
    let np = np.to_string();
    let out = busbw()
        .args([
            program, "--engine", "nccl", "--np", &np, "-b", "8", "-e", "1K", "-T", "60",
        ])
        .env("NCCL_LIBRARY", lib)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{program}: usage class: {err}");
    err
}

/// `--engine nccl`: the build, the library and the host are each named when missing. With
/// the real library on a host without a GPU, every rank gets rank 0's unique id through the
/// store (the same fingerprint in each rank's words), tries to join, and the job ends with a
/// usage-class exit naming NCCL's own last error and what to install.
#[test]
fn the_nccl_engine_names_what_it_lacks() {
    usage_error(
        &["all_reduce_perf", "--engine", "mpi"],
        "expected own or nccl",
    );
    if !cfg!(feature = "cuda") {
        usage_error(&["all_reduce_perf", "--engine", "nccl"], "--features cuda");
        usage_error(&["tiers", "--engine", "nccl"], "--features cuda");
        return;
    }
    usage_error(
        &["all_reduce_perf", "--engine", "nccl", "-g", "0"],
        "drop -g 0",
    );
    let out = busbw()
        .args(["all_reduce_perf", "--engine", "nccl", "-b", "8", "-e", "8"])
        .env("NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/nonexistent/libnccl.so.2") && err.contains("pip install nvidia-nccl-cu12"),
        "{err}"
    );
    let Some(lib) = nccl_library() else {
        eprintln!("SKIP the NCCL join: no libnccl.so.2 (NCCL_LIBRARY unset, no target/nccl; .ci/run unpacks the nvidia-nccl-cu12 wheel)");
        return;
    };
    if busbw_collectives::cuda::probe().is_ok() {
        eprintln!(
            "SKIP: this host has a CUDA driver; scripts/gpu-check.sh runs --engine nccl on it"
        );
        return;
    }
    let version = busbw_collectives::nccl::Nccl::open_path(&lib)
        .and_then(|n| n.version())
        .expect("the library loads")
        .to_string();
    let err = joining(&lib, "all_reduce_perf", 3);

    assert!(
        err.contains(&format!("busbw: engine: NCCL {version} from {lib}")),
        "{err}"
    );
    // Each rank's own account, with the id it received.
    let digests: Vec<&str> = (0..3)
        .map(|r| {
            let line = err
                .lines()
                .find(|l| l.starts_with(&format!("[rank {r}] busbw: rank {r} on ")))
                .unwrap_or_else(|| panic!("rank {r} says why: {err}"));
            assert!(
                line.contains(&format!(
                    "NCCL {version} could not join the communicator of 3 ranks"
                )),
                "{line}"
            );
            assert!(
                line.contains("ncclCommInitRank failed") && line.contains("NCCL's last error: "),
                "{line}"
            );
            assert!(
                line.contains("no CUDA driver") && line.contains("install the driver"),
                "{line}"
            );
            let at = line.find("unique id ").expect("the id's fingerprint") + "unique id ".len();
            &line[at..at + 16]
        })
        .collect();
    assert!(
        digests
            .iter()
            .all(|d| *d == digests[0] && d.bytes().all(|b| b.is_ascii_hexdigit())),
        "{digests:?}"
    );
    assert!(
        !err.contains("root cause reported by the job"),
        "a setup error is each rank's own: {err}"
    );
    // busbw tiers joins the same way (its groups are then ncclCommSplit of this).
    let err = joining(&lib, "tiers", 2);

    assert!(
        err.contains("could not join the communicator of 2 ranks"),
        "{err}"
    );
}

#[test]
fn a_misspelt_simd_tier_is_a_usage_error() {
    let out = busbw()
        .args(["all_reduce_perf", "-b", "8", "-e", "8"])
        .env("BUSBW_SIMD", "avx9")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("BUSBW_SIMD") && stderr.contains("\"avx9\"") && stderr.contains("avx2"),
        "{stderr}"
    );
}

#[test]
fn launcher_environment_is_checked() {
    let out = busbw()
        .args(["all_reduce_perf", "-b", "8", "-e", "8"])
        .env("RANK", "3")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("RANK"), "{}", text(&out.stderr));
}

/// Starts a long sweep, waits for the first data row, then does `act` to rank `victim`
/// (found by its pid in the device table). Returns (exit code, stderr, seconds after `act`).
fn disrupt(victim: usize, timeout_s: u64, act: fn(i32)) -> (Option<i32>, String, f64) {
    disrupt_job(&["--np", "4"], victim, timeout_s, act)
}

/// [`disrupt`] on the job that `job` (`--np`, `-t`) describes.
fn disrupt_job(
    job: &[&str],
    victim: usize,
    timeout_s: u64,
    act: fn(i32),
) -> (Option<i32>, String, f64) {
    let t = timeout_s.to_string();
    let mut child = busbw()
        .arg("all_reduce_perf")
        .args(job)
        .args([
            "-b", "64K", "-e", "4M", "-f", "2", "-n", "200", "-N", "0", "-T", &t,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut pid = None;
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.starts_with(&format!("#  Rank {victim:>2} ")) {
            let f: Vec<&str> = line.split_whitespace().collect();
            pid = Some(f[6].parse::<i32>().unwrap());
        }
        if !line.starts_with('#') && !line.is_empty() {
            break;
        }
    }
    let pid = pid.expect("victim's pid in the device table");
    act(pid);
    let acted = Instant::now();
    // Drain stdout so rank 0 never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let deadline = acted + Duration::from_secs(timeout_s * 3 + 20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "job still running {}s after the disruption",
                deadline.duration_since(acted).as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let secs = acted.elapsed().as_secs_f64();
    (status.code(), err_thread.join().unwrap(), secs)
}

#[test]
fn killed_rank_ends_the_job_naming_it() {
    let (code, stderr, secs) = disrupt(2, 10, |pid| unsafe {
        libc_kill(pid, 9);
    });
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}\n{stderr}");
    assert!(secs < 10.0, "took {secs:.1}s, more than -T\n{stderr}");
    assert!(stderr.contains("rank 2 (pid"), "{stderr}");
    assert!(stderr.contains("killed by signal 9"), "{stderr}");
    // The survivors say why they stop, pointing at rank 2.
    assert!(
        stderr
            .lines()
            .filter(|l| l.starts_with("[rank") && l.contains("rank 2"))
            .count()
            >= 2,
        "{stderr}"
    );
}

/// Killing a process of two ranks: the launcher names it by its ranks, the survivors name it
/// as the root cause.
#[test]
fn killed_process_of_two_ranks_is_named_by_its_ranks() {
    let (code, stderr, secs) = disrupt_job(&["--np", "2", "-t", "2"], 2, 10, |pid| unsafe {
        libc_kill(pid, 9);
    });
    assert_eq!(code, Some(137), "{stderr}");
    assert!(secs < 10.0, "took {secs:.1}s, more than -T\n{stderr}");
    assert!(
        stderr.contains("busbw: ranks 2-3 (pid") && stderr.contains("killed by signal 9"),
        "{stderr}"
    );
    for r in [0, 1] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with("[ranks 0-1] ")
                    && l.contains(&format!("busbw: rank {r} on "))),
            "rank {r} should say why it stopped\n{stderr}"
        );
    }
}

#[test]
fn stopped_rank_times_out_naming_it() {
    let (code, stderr, secs) = disrupt(1, 3, |pid| unsafe {
        libc_kill(pid, 19); // SIGSTOP: alive but silent, the case only a timeout catches
    });
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}\n{stderr}");
    assert!(secs < 3.0 * 2.0 + 5.0, "took {secs:.1}s\n{stderr}");
    assert!(stderr.contains("no progress for 3 s"), "{stderr}");
    assert!(stderr.contains("rank 1"), "{stderr}");
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
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

fn subcommand_on_all_rank_counts(coll: &str) {
    for np in [1u64, 2, 3, 5, 8] {
        let program = format!("{coll}_perf");
        let nps = np.to_string();
        let out = run(&[
            &program, "--np", &nps, "-b", "8", "-e", "512", "-f", "8", "-n", "1", "-w", "1", "-r",
            "-1", "-d", "double",
        ]);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{coll} np={np}\n{stdout}\n{}",
            text(&out.stderr)
        );
        let rows = rows(&stdout);
        if coll == "hypercube" && !np.is_power_of_two() {
            assert!(rows.is_empty());
            assert!(
                stdout.contains(&format!("\nnRanks {np} is not a power of 2, skipping\n")),
                "{stdout}"
            );
            continue;
        }
        let rooted = matches!(coll, "broadcast" | "reduce" | "scatter" | "gather");
        let roots = if rooted { np } else { 1 };
        assert_eq!(
            rows.len() as u64,
            3 * roots,
            "{coll} np={np}: sizes 8, 64, 512 (x roots)\n{stdout}"
        );
        for (i, r) in rows.iter().enumerate() {
            let want = geometry(coll, [8, 64, 512][i % 3], 8, np);
            assert_eq!((r.size, r.count), want, "{coll} np={np} row {i}");
            let redop = match coll {
                "all_reduce" | "reduce_scatter" | "reduce" | "sendrecv" => "sum",
                _ => "none",
            };
            assert_eq!(r.redop, redop, "{coll}");
            let root = if rooted { (i / 3) as i64 } else { -1 };
            assert_eq!(r.root, root, "{coll} np={np} row {i}");
            assert_eq!(r.oop_wrong, "0", "{coll} np={np}\n{stdout}");
            let in_place = if coll == "alltoall" { "N/A" } else { "0" };
            assert_eq!(r.ip_wrong, in_place, "{coll} np={np}\n{stdout}");
        }
    }
}

macro_rules! subcommand_tests {
    ($($name:ident => $coll:literal),* $(,)?) => {
        $(#[test] fn $name() { subcommand_on_all_rank_counts($coll); })*
    };
}

subcommand_tests! {
    all_reduce_on_1_2_3_5_8 => "all_reduce",
    all_gather_on_1_2_3_5_8 => "all_gather",
    broadcast_on_1_2_3_5_8 => "broadcast",
    reduce_scatter_on_1_2_3_5_8 => "reduce_scatter",
    reduce_on_1_2_3_5_8 => "reduce",
    alltoall_on_1_2_3_5_8 => "alltoall",
    scatter_on_1_2_3_5_8 => "scatter",
    gather_on_1_2_3_5_8 => "gather",
    sendrecv_on_1_2_3_5_8 => "sendrecv",
}

/// Hypercube prints an empty redop column, so its rows have 12 fields.
#[test]
fn hypercube_on_1_2_3_5_8() {
    for np in [1u64, 2, 3, 5, 8] {
        let nps = np.to_string();
        let out = run(&[
            "hypercube_perf",
            "--np",
            &nps,
            "-b",
            "8",
            "-e",
            "512",
            "-f",
            "8",
            "-n",
            "1",
            "-d",
            "double",
        ]);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "np={np}\n{stdout}\n{}",
            text(&out.stderr)
        );
        let data: Vec<&str> = stdout
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .collect();
        if !np.is_power_of_two() {
            assert_eq!(
                data,
                vec![format!("nRanks {np} is not a power of 2, skipping")]
            );
            continue;
        }
        assert_eq!(data.len(), 3, "{stdout}");
        for (i, l) in data.iter().enumerate() {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 12, "{l}");
            let want = geometry("hypercube", [8, 64, 512][i], 8, np);
            assert_eq!(
                (f[0].parse::<u64>().unwrap(), f[1].parse::<u64>().unwrap()),
                want
            );
            assert_eq!((f[2], f[3]), ("double", "-1"));
            assert_eq!((f[7], f[11]), ("0", "0"), "{l}");
            // The redop column is empty but keeps its width.
            assert_eq!(&l[40..46], "      ", "{l:?}");
        }
    }
}

#[test]
fn root_out_of_range_is_a_usage_error() {
    let out = run(&[
        "broadcast_perf",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-r",
        "5",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("-r 5"), "{}", text(&out.stderr));
}

/// The double binary tree validates on every rank count, and `auto` adds its column.
#[test]
fn all_reduce_tree_and_auto() {
    for (np, algo) in [
        ("1", "tree"),
        ("2", "tree"),
        ("3", "tree"),
        ("5", "tree"),
        ("8", "tree"),
        ("2", "rd"),
        ("5", "rd"),
        ("8", "rd"),
    ] {
        let out = run(&[
            "all_reduce_perf",
            "--np",
            np,
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "1",
            "--algo",
            algo,
            "-o",
            "all",
        ]);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "np={np} --algo {algo}\n{stdout}\n{}",
            text(&out.stderr)
        );
        assert!(
            rows(&stdout)
                .iter()
                .all(|r| r.oop_wrong == "0" && r.ip_wrong == "0"),
            "{stdout}"
        );
    }
    let out = run(&[
        "all_reduce_perf",
        "--np",
        "3",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "1",
        "--algo",
        "auto",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("  #wrong    algo\n"), "{stdout}");
    let data: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert_eq!(data.len(), 5);
    for l in data {
        assert!(
            l.ends_with("    ring")
                || l.ends_with("    tree")
                || l.ends_with("      rd")
                || l.ends_with("  direct"),
            "{l}"
        );
        assert_eq!(l.len(), 118 + 8, "{l:?}");
    }
    // NCCL_ALGO is honoured like --algo.
    let out = busbw()
        .args([
            "all_reduce_perf",
            "--np",
            "2",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "1",
        ])
        .env("NCCL_ALGO", "bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("bogus"));
}

/// The direct AllReduce maps its peers' buffers between processes (every operator, in and
/// out of place, validated); where local ranks are asked to talk TCP it runs the ring and
/// the table says so.
#[test]
fn all_reduce_direct_between_processes() {
    for (np, transport, direct) in [("2", "shm", true), ("3", "auto", true), ("2", "tcp", false)] {
        let out = run(&[
            "all_reduce_perf",
            "--np",
            np,
            "--transport",
            transport,
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "32",
            "-n",
            "2",
            "--algo",
            "direct",
            "-o",
            "all",
            "-d",
            "all",
        ]);
        let stdout = text(&out.stdout);
        let case = format!("np={np} --transport {transport}");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{case}\n{stdout}\n{}",
            text(&out.stderr)
        );
        let rows = rows(&stdout);
        assert_eq!(rows.len(), 12 * 6 * 4, "{case}\n{stdout}");
        assert!(
            rows.iter().all(|r| r.oop_wrong == "0" && r.ip_wrong == "0"),
            "{case}\n{stdout}"
        );
        let note = "direct AllReduce: ";
        assert_eq!(!stdout.contains(note), direct, "{case}\n{stdout}");
        if !direct {
            assert!(
                stdout.contains("ran the ring instead: the ranks are not all on one host"),
                "{stdout}"
            );
        }
    }
}

/// Data connections follow --socket-ifname / NCCL_SOCKET_IFNAME; an interface this host lacks
/// is a usage error that names what exists.
#[test]
fn socket_ifname_selects_or_explains() {
    let out = run(&[
        "all_reduce_perf",
        "--np",
        "2",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "--socket-ifname",
        "=lo",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = busbw()
        .args([
            "all_reduce_perf",
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "1",
        ])
        .env("NCCL_SOCKET_IFNAME", "=nosuchif9")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("nosuchif9") && stderr.contains("lo"),
        "{stderr}"
    );
}

/// Every collective over each transport: shared memory, TCP, `--transport shm` (which must
/// refuse nothing on one host), and TCP with helper threads and several sockets per
/// connection (sizes past the 64 KiB split, so long messages travel on the extra sockets).
#[test]
fn every_subcommand_over_each_transport() {
    let colls = [
        "all_reduce",
        "all_gather",
        "broadcast",
        "reduce_scatter",
        "reduce",
        "alltoall",
        "scatter",
        "gather",
        "sendrecv",
    ];
    let lanes = ["--socket-nthreads", "2", "--nsocks-perthread", "2"];
    for (transport, max, extra) in [
        ("tcp", "64K", &[][..]),
        ("shm", "64K", &[]),
        ("auto", "64K", &[]),
        ("tcp", "2M", &lanes),
    ] {
        for coll in colls {
            let program = format!("{coll}_perf");
            let mut args = vec![
                &program[..],
                "--np",
                "3",
                "-b",
                "8",
                "-e",
                max,
                "-f",
                "32",
                "-n",
                "1",
                "-r",
                "-1",
                "--transport",
                transport,
            ];
            args.extend_from_slice(extra);
            let out = run(&args);
            let stdout = text(&out.stdout);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{coll} over {transport}\n{stdout}\n{}",
                text(&out.stderr)
            );
            let via = if transport == "tcp" { "tcp" } else { "shm" };
            assert!(
                stdout.contains(&format!("host memory via {via}\n")),
                "{stdout}"
            );
            for r in rows(&stdout) {
                assert_eq!(r.oop_wrong, "0", "{coll} over {transport}\n{stdout}");
                let ip = if coll == "alltoall" { "N/A" } else { "0" };
                assert_eq!(r.ip_wrong, ip, "{coll} over {transport}\n{stdout}");
            }
        }
    }
}

// Several ranks per process (`-t`, `-g`): each thread a full rank of the job, validated,
// listed in the `Using devices` block with its process's pid, and failing like a rank
// process does.

const THREADS_SWEEP: &[&str] = &["-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-T", "30"];

/// (rank, pid) of every line of the `Using devices` block, in order.
fn device_lines(stdout: &str) -> Vec<(usize, u32)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("#  Rank "))
        .map(|rest| {
            let f: Vec<&str> = rest.split_whitespace().collect();
            (f[0].parse().unwrap(), f[4].parse().unwrap())
        })
        .collect()
}

/// Runs an all_reduce sweep with `extra` flags; asserts it validated with `#wrong` 0 on every
/// row and returns stdout.
fn validated_threads(extra: &[&str]) -> String {
    let mut args = vec!["all_reduce_perf"];
    args.extend_from_slice(extra);
    args.extend_from_slice(THREADS_SWEEP);
    let out = run(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{args:?}\n{stdout}\n{stderr}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    for r in rows {
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!((f[8], f[12]), ("0", "0"), "#wrong in {r:?}");
    }
    assert!(
        stdout.contains("# Out of bounds values : 0 OK\n"),
        "{stdout}"
    );
    stdout
}

#[test]
fn two_processes_of_two_threads_are_four_ranks() {
    let stdout = validated_threads(&["--np", "2", "-t", "2"]);
    assert!(
        stdout.contains("# nThread 2 nGpus 1 minBytes 8 "),
        "{stdout}"
    );
    let lines = device_lines(&stdout);
    let ranks: Vec<usize> = lines.iter().map(|l| l.0).collect();
    assert_eq!(ranks, [0, 1, 2, 3], "{stdout}");
    // Ranks 0 and 1 are process 0's threads, 2 and 3 process 1's (as nccl-tests numbers them).
    let pids: Vec<u32> = lines.iter().map(|l| l.1).collect();
    assert_eq!(pids[0], pids[1], "{stdout}");
    assert_eq!(pids[2], pids[3], "{stdout}");
    assert_ne!(pids[0], pids[2], "{stdout}");
    // One table: only global rank 0 prints.
    assert_eq!(
        stdout.matches("# Collective test concluded").count(),
        1,
        "{stdout}"
    );
}

#[test]
fn three_threads_in_one_process_over_each_transport() {
    for transport in ["auto", "tcp"] {
        let stdout = validated_threads(&["--np", "1", "-t", "3", "--transport", transport]);
        let lines = device_lines(&stdout);
        assert_eq!(lines.len(), 3, "{stdout}");
        assert!(lines.iter().all(|l| l.1 == lines[0].1), "one pid: {stdout}");
        let via = if transport == "auto" { "shm" } else { "tcp" };
        assert!(
            stdout
                .lines()
                .filter(|l| l.starts_with("#  Rank "))
                .all(|l| l.ends_with(&format!("host memory via {via}"))),
            "{stdout}"
        );
    }
}

/// A rank that fails on a thread ends the whole job at once: it names itself, and its
/// siblings in the same process and the ranks in the other process stop naming it.
#[test]
fn a_failing_thread_rank_ends_the_job_naming_it() {
    // Rank 1 shares rank 0's process (the store's); rank 3 is the second thread of process 1.
    for victim in ["1", "3"] {
        let start = Instant::now();
        let out = run(&[
            "all_reduce_perf",
            "--np",
            "2",
            "-t",
            "2",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "2",
            "-n",
            "20",
            "-T",
            "10",
            "--debug-fail-rank",
            victim,
        ]);
        let secs = start.elapsed().as_secs_f64();
        let err = text(&out.stderr);
        let code = out.status.code();
        assert!(code.is_some_and(|c| c != 0 && c != 7), "{code:?}\n{err}");
        assert!(secs < 10.0, "took {secs:.1} s, more than -T\n{err}");
        assert!(
            err.contains(&format!(
                "busbw: rank {victim} on {}",
                busbw_launchers::hostname()
            )) && err.contains("failing on purpose"),
            "{err}"
        );
        // The launcher names each process by the ranks it hosts.
        let process = if victim == "1" {
            "[ranks 0-1] "
        } else {
            "[ranks 2-3] "
        };
        assert!(
            err.lines()
                .any(|l| l.starts_with(process) && l.contains("failing on purpose")),
            "{err}"
        );
        // Every other rank says it stopped and why, pointing at the victim.
        for r in ["0", "1", "2", "3"].into_iter().filter(|r| *r != victim) {
            let line = err
                .lines()
                .find(|l| l.contains(&format!("busbw: rank {r} on ")))
                .unwrap_or_else(|| panic!("rank {r} said nothing\n{err}"));
            let next = err
                .lines()
                .skip_while(|l| *l != line)
                .nth(1)
                .unwrap_or_default();
            assert!(
                line.contains(&format!("rank {victim} on ")) || next.contains("root cause"),
                "rank {r} should name rank {victim}: {line}\n{err}"
            );
        }
    }
}

/// Wrong data on one thread-rank is counted in the job's `#wrong` like any rank's.
#[test]
fn a_thread_ranks_wrong_data_is_counted() {
    let mut args = vec!["all_reduce_perf", "--np", "2", "-t", "2"];
    args.extend_from_slice(THREADS_SWEEP);
    args.extend_from_slice(&["--debug-corrupt-rank", "3"]);
    let out = run(&args);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("# Out of bounds values : 12 FAILED"),
        "{stdout}"
    );
}

#[test]
fn threads_and_gpus_out_of_range_are_usage_errors() {
    usage_error(&["all_reduce_perf", "-t", "0"], "-t 0");
    usage_error(
        &["all_reduce_perf", "-t", "257"],
        "257 ranks in one process",
    );
    usage_error(
        &["all_reduce_perf", "-t", "64", "-g", "8"],
        "512 ranks in one process",
    );
    usage_error(
        &["all_reduce_perf", "-t", "4000000000", "-g", "4000000000"],
        "at most 256 per process",
    );
    usage_error(&["tiers", "-t", "2"], "drop -t");
    if !cfg!(feature = "cuda") {
        // Several GPUs per thread are allowed now, but still need the CUDA build.
        for g in ["2", "8"] {
            usage_error(&["all_reduce_perf", "-g", g], "--features cuda");
            usage_error(&["all_reduce_perf", "-t", "2", "-g", g], "--features cuda");
        }
    }
}

/// Two ranks started by hand (torchrun-style variables) with different `-n` and `-d`: both
/// stop at rendezvous with a usage error (exit 2) that names each flag and its value on both
/// sides, instead of an internal error.
#[test]
fn ranks_with_different_flags_name_the_flags() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let start = |rank: &str, extra: &[&str]| {
        busbw()
            .args(["all_reduce_perf", "-b", "8", "-e", "64", "-T", "30"])
            .args(extra)
            .env("RANK", rank)
            .env("WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let r0 = start("0", &["-n", "20"]);
    let r1 = start("1", &["-n", "50", "-d", "half"]);
    let (o0, o1) = (
        r0.wait_with_output().unwrap(),
        r1.wait_with_output().unwrap(),
    );
    for (rank, out) in [(0, &o0), (1, &o1)] {
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "rank {rank}:\n{err}");
        assert!(
            err.contains("different flags"),
            "rank {rank} says why:\n{err}"
        );
    }
    let err = text(&o0.stderr);
    assert!(
        err.contains("-n/--iters: 20 on rank 0, 50 on rank 1"),
        "rank 0 names -n and both values:\n{err}"
    );
    assert!(
        err.contains("-d/--datatype: float on rank 0, half on rank 1"),
        "rank 0 names -d with nccl-tests' type names:\n{err}"
    );
    assert!(
        !err.contains("-b/--minbytes"),
        "flags that agree are not listed:\n{err}"
    );
}

/// The issue's command line that nccl-tests scripts use (`-I 1 -J`), with `-K`, `-C`, `-S`:
/// per-iteration columns after each placement, `cputime`, a timestamp per row, and `-J`
/// writing `cpu_time` and the skipped iterations.
#[test]
fn per_iteration_timing_flags_run_as_in_nccl_tests() {
    let dir = std::env::temp_dir().join(format!("busbw-cli-per-iter-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let out = busbw()
        .args([
            "all_reduce_perf",
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "16K",
            "-f",
            "4",
        ])
        .args(["-n", "5", "-I", "1", "-K", "1", "-C", "1", "-S", "1", "-q"])
        .arg("-J")
        .arg(&json)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("# Per-Iteration Report: host clock timing; i_* uses max over process rows; summary skips first 1 iterations \n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  cputime   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%")
    );
    let data: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    assert_eq!(data.len(), 3, "{stdout}");
    for l in &data {
        let f: Vec<&str> = l.split_whitespace().collect();
        // 5 preamble fields, 8 per placement, then the date and the time.
        assert_eq!(f.len(), 5 + 8 + 8 + 2, "{l}");
        let (min, max, p99): (f64, f64, f64) = (
            f[9].parse().unwrap(),
            f[10].parse().unwrap(),
            f[11].parse().unwrap(),
        );
        assert!(min > 0.0 && min <= p99 && p99 <= max, "{l}");
        assert!(
            f[21].len() == 10 && f[22].len() == 8,
            "a date and a time: {l}"
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = &v["results"][0];
    assert!(r["in_place"]["cpu_time"].is_f64(), "{r}");
    assert_eq!(r["in_place_per_iter"]["skipped_iterations"], 1, "{r}");
    assert_eq!(
        r["in_place_per_iter"]["times_us"].as_array().map(Vec::len),
        Some(5)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// nccl-tests' cross-checks: `-D` without `-R 2` is an error; a bad `-I` or `-K` is turned
/// off with its message; GPU-only flags get a one-line note and the run goes on.
#[test]
fn nccl_tests_cross_checks_and_gpu_only_flags() {
    let out = busbw()
        .args(["all_reduce_perf", "-b", "8", "-e", "8", "-D", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("requires enabling symmetric memory registration (-R 2)"));
    let out = busbw()
        .args(["all_reduce_perf", "-b", "8", "-e", "8", "-n", "3", "-q"])
        .args([
            "-I", "2", "-K", "5", "-y", "1", "-G", "1", "-R", "2", "-x", "1", "-V", "32",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for note in [
        "per-iteration timing (-I) only supports 0=off or 1=on. Disabling.",
        "per-iteration skip (-K) must be between 0 and 2. Disabling.",
        "-y/--stream_null does not apply to host buffers; ignored",
        "-G/--cudagraph does not apply to host buffers; ignored",
        "-R/--local_register does not apply to host buffers; ignored",
        "-x/--cta_policy does not apply to host buffers; ignored",
        "-V/--device_cta_count does not apply to host buffers; ignored",
    ] {
        assert_eq!(stderr.matches(note).count(), 1, "once: {note}\n{stderr}");
    }
    assert!(!stdout.contains("i_min"), "-I turned off:\n{stdout}");
}

/// Scripts call nccl-tests' binaries by name: a link named `all_reduce_perf` (or an MPI
/// build's `all_reduce_perf_mpi`) runs busbw as that program, local ranks included.
#[test]
fn links_named_after_nccl_tests_programs_run_them() {
    let dir = std::env::temp_dir().join(format!("busbw-multicall-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["all_gather_perf", "all_reduce_perf_mpi"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(BUSBW, &link).unwrap();
        let mut c = Command::new(&link);
        c.env_clear();
        let out = c
            .args(["-b", "1K", "-e", "4K", "-f", "2", "-n", "2", "--np", "2"])
            .output()
            .expect("run the link");
        let stdout = text(&out.stdout);
        let program = name.strip_suffix("_mpi").unwrap_or(name);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}\n{stdout}{}",
            text(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("# Collective test starting: {program}\n")),
            "{name}\n{stdout}"
        );
        assert_eq!(rows(&stdout).len(), 3, "{name}\n{stdout}");
        assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// NCCL_TESTS_SPLIT: the job runs as groups at once, each on its own communicator; the device
/// lines carry each rank's group, the table is rank 0's group (as nccl-tests prints it), one
/// line per group keeps the others' results, and wrong data in any group fails the job.
#[test]
fn split_groups_run_at_once_and_every_group_is_reported() {
    let args = [
        "all_reduce_perf",
        "--np",
        "4",
        "-b",
        "1K",
        "-e",
        "16K",
        "-f",
        "4",
        "-n",
        "3",
    ];
    let out = busbw()
        .env("NCCL_TESTS_SPLIT", "MOD2")
        .args(args)
        .output()
        .expect("run busbw");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let groups: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("#  Rank"))
        .map(|l| l.split_whitespace().nth(4).unwrap_or_default())
        .collect();
    assert_eq!(groups, ["0", "1", "0", "1"], "{stdout}");
    assert_eq!(rows(&stdout).len(), 3, "{stdout}");
    assert!(
        stdout.contains("# Group  0 (2 ranks: 0,2): Avg bus bandwidth ")
            && stdout.contains("# Group  1 (2 ranks: 1,3): Avg bus bandwidth "),
        "{stdout}"
    );
    // Rank 3 (group 1, not in the table) corrupts its result: the job fails, and group 1's
    // line says where.
    let out = busbw()
        .env("NCCL_TESTS_SPLIT_MASK", "0x1")
        .args(args)
        .args(["--debug-corrupt-rank", "3"])
        .output()
        .expect("run busbw");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    let g1 = stdout
        .lines()
        .find(|l| l.starts_with("# Group  1"))
        .unwrap_or_default();
    assert!(!g1.ends_with("out of bounds values 0"), "{stdout}");
    // A split nccl-tests does not know is a usage error.
    let out = busbw()
        .env("NCCL_TESTS_SPLIT", "XOR1")
        .args(args)
        .output()
        .expect("run busbw");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("NCCL_TESTS_SPLIT=XOR1"));
}

/// alltoallv_perf: nccl-tests' generated pattern (distance-weighted by default, uniform with
/// SPREAD=0) and a traffic matrix file, validated; PRINT_SUMMARY's lines come before their
/// row; a matrix smaller than the job is a usage error.
#[test]
fn alltoallv_runs_generated_and_matrix_patterns_validated() {
    let sweep = [
        "alltoallv_perf",
        "--np",
        "4",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "2",
    ];
    for spread in ["1", "0"] {
        let out = busbw()
            .env("NCCL_TESTS_ALLTOALLV_SPREAD", spread)
            .args(sweep)
            .output()
            .expect("run busbw");
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
        let rows = rows(&stdout);
        assert_eq!(rows.len(), 3, "{stdout}");
        // 1 KiB over 4 ranks: 64 floats a peer; distance-weighted, rank 0 sends 0, 1/6, 2/6
        // and 3/6 of 1 KiB, each rounded down to 16 bytes (160 + 336 + 512).
        let want = if spread == "1" { 1008 } else { 1024 };
        assert_eq!((rows[0].size, rows[0].count), (want, 64), "{stdout}");
        for r in &rows {
            assert_eq!(r.oop_wrong, "0", "{stdout}");
            assert_eq!(r.ip_wrong, "N/A", "{stdout}");
        }
    }
    // Wrong data is caught.
    let out = busbw()
        .args(sweep)
        .args(["--debug-corrupt-rank", "2"])
        .output()
        .expect("run busbw");
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stdout));

    let dir = std::env::temp_dir().join(format!("busbw-alltoallv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let matrix = dir.join("traffic.txt");
    std::fs::write(&matrix, "100 200 150\n50 100 75\n300 150 200\n").unwrap();
    let out = busbw()
        .env("NCCL_TESTS_ALLTOALLV_MATRIX_FILE", &matrix)
        .env("NCCL_TESTS_ALLTOALLV_MATRIX_SCALE", "100")
        .env("NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY", "1")
        .args([
            "alltoallv_perf",
            "--np",
            "3",
            "-b",
            "64K",
            "-e",
            "64K",
            "-n",
            "2",
        ])
        .output()
        .expect("run busbw");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let rows = rows(&stdout);
    // The busiest rank: rank 2 sends 30000 + 15000 + 20000 bytes, each rounded to 16.
    assert_eq!((rows[0].size, rows[0].count), (64992, 0), "{stdout}");
    assert_eq!(rows[0].oop_wrong, "0", "{stdout}");
    let summary: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("# NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY: mode=matrix"))
        .take(4)
        .collect();
    assert!(
        summary[0].contains("nranks=3 matrix_dim=3 scale=100.000 time_usec="),
        "{stdout}"
    );
    assert!(
        summary[3].starts_with("#   rank=2 send_bytes=64992 recv_bytes=42480 alg_bw="),
        "{stdout}"
    );
    // Too small a matrix: a usage error on every rank, stated once by rank 0; never "stopping
    // because" (a rank leaving before rank 0 said it used to make the job a peer failure).
    let too_small = |np: &str, split: Option<&str>| {
        let mut cmd = busbw();
        if let Some(s) = split {
            cmd.env("NCCL_TESTS_SPLIT", s);
        }
        let out = cmd
            .env("NCCL_TESTS_ALLTOALLV_MATRIX_FILE", &matrix)
            .args(["alltoallv_perf", "--np", np, "-b", "64K", "-e", "64K"])
            .args(["-n", "1"])
            .output()
            .expect("run busbw");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(!stderr.contains("stopping because"), "{stderr}");
        stderr
    };
    let stderr = too_small("4", None);
    assert!(
        stderr.contains("error: NCCL_TESTS_ALLTOALLV_MATRIX_FILE=")
            && stderr.contains("the job has 4 ranks but the matrix is 3×3"),
        "{stderr}"
    );
    // Split in groups of 4 and 3: only the larger objects, yet every rank stops, and rank 0
    // names who objected.
    let stderr = too_small("7", Some("MOD2"));
    assert!(
        stderr.contains("error: ranks 0, 2, 4, 6: NCCL_TESTS_ALLTOALLV_MATRIX_FILE="),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The image links every nccl-tests program busbw has (k8s/Dockerfile's list), no more.
#[test]
fn the_image_links_every_program() {
    let help = text(&run(&["--help"]).stdout);
    let mut programs: Vec<String> = help
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.ends_with("_perf"))
        .map(|w| w.trim_end_matches("_perf").to_string())
        .collect();
    let docker = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../k8s/Dockerfile"))
        .expect("k8s/Dockerfile");
    let list = docker
        .split_once("for p in ")
        .and_then(|(_, rest)| rest.split_once("; do"))
        .map(|(l, _)| l.replace('\\', " "))
        .expect("the Dockerfile's program list");
    let mut linked: Vec<String> = list.split_whitespace().map(String::from).collect();
    programs.sort();
    linked.sort();
    assert_eq!(programs.len(), 11, "{help}");
    assert_eq!(linked, programs);
}
