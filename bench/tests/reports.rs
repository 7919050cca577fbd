//! Reports end to end: every exporter from a real local run, nccl-tests' JSON read as its
//! analysis tool reads it, crash-safe partial files, compare, report (checked in headless
//! Chromium), history, and the Pushgateway.

mod common;
use common::{busbw, text, BUSBW};

use busbw_reports::export::csv;
use busbw_reports::RunRecord;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run_in(dir: &Path, args: &[&str]) -> Output {
    busbw()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run busbw")
}

/// A fresh directory under the target dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The algorithm is pinned: left to auto, which rows run which algorithm depends on the
/// machine's timings, and so would the records' `algo` and the plots grouped by it.
const SWEEP: [&str; 12] = [
    "all_reduce_perf",
    "--algo",
    "ring",
    "--np",
    "2",
    "-b",
    "8",
    "-e",
    "64K",
    "-f",
    "4",
    "-n",
];

/// Lines of the table that do not depend on timing (everything but data rows and pids).
fn table_skeleton(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| l.starts_with('#') && !l.contains(" Pid ") && !l.starts_with("# Avg bus"))
        .map(String::from)
        .collect()
}

#[test]
fn every_exporter_from_one_run() {
    let d = TempDir::new("exports");
    let mut args = SWEEP.to_vec();
    args.extend([
        "5",
        "--export-json",
        "r.json",
        "-J",
        "n.json",
        "--export-csv",
        "r.csv",
        "--export-markdown",
        "r.md",
        "--export-junit",
        "r.xml",
        "--export-prometheus",
        "r.prom",
        "--prometheus-job",
        "ci",
    ]);
    let out = run_in(&d.0, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // The table is nccl-tests' own; -J only adds nccl-tests' announcement line in front.
    assert!(
        stdout.starts_with("# Writing JSON output to n.json\n# nccl-tests version"),
        "{stdout}"
    );
    let mut plain = SWEEP.to_vec();
    plain.push("5");
    let bare = run_in(&d.0, &plain);
    let mut skeleton = table_skeleton(&stdout);
    skeleton.remove(0);
    assert_eq!(skeleton, table_skeleton(&text(&bare.stdout)));

    let run = RunRecord::load(&d.0.join("r.json")).unwrap();
    assert_eq!(run.rows.len(), 7);
    assert_eq!(run.world.ranks, 2);
    assert_eq!(run.world.devices.len(), 2);
    assert_eq!(
        run.world.transports,
        ["shm"],
        "two ranks of one host talk over shared memory"
    );
    assert!(run.end_time.is_some());
    assert_eq!(run.summary.as_ref().unwrap().out_of_bounds, 0);
    for r in &run.rows {
        for (_, c) in r.cells() {
            let it = c.iterations.as_ref().expect("per-iteration statistics");
            assert_eq!(it.samples, 5);
            assert_eq!(it.per_rank_times_us.len(), 2);
            for (i, t) in it.times_us.iter().enumerate() {
                let m = it
                    .per_rank_times_us
                    .iter()
                    .map(|r| r[i])
                    .fold(0.0, f64::max);
                assert_eq!(*t, m);
            }
            assert!(c.time_min_us <= c.time_max_us);
            assert!(
                c.time_us >= c.time_min_us * 0.999 && c.time_us <= c.time_max_us * 1.001,
                "{c:?}"
            );
            assert!(it.p50_us <= it.p99_us && it.min_us <= it.max_us);
            assert_eq!(c.wrong, Some(0));
        }
    }
    // The table's figures are the record's, to the printed precision.
    let first_row = stdout.lines().find(|l| !l.starts_with('#')).unwrap();
    let f: Vec<&str> = first_row.split_whitespace().collect();
    assert_eq!(f[0], run.rows[0].size.to_string());
    assert_eq!(
        f[5],
        busbw_reports::fmt::float_str(run.rows[0].out_of_place.time_us, 7).trim()
    );

    let csv_text = std::fs::read_to_string(d.0.join("r.csv")).unwrap();
    let csv_rows = csv::parse(&csv_text).unwrap();
    assert_eq!(csv_rows, csv::rows_of(&run));

    let md = std::fs::read_to_string(d.0.join("r.md")).unwrap();
    assert_eq!(
        md.lines()
            .filter(|l| l.starts_with("| ") && l.contains(" float "))
            .count(),
        14
    );
    let xml = std::fs::read_to_string(d.0.join("r.xml")).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 7);
    assert!(xml.contains("failures=\"0\""));
    let prom = std::fs::read_to_string(d.0.join("r.prom")).unwrap();
    assert_eq!(
        prom.matches("busbw_bus_bandwidth_bytes_per_second{")
            .count(),
        14
    );
    assert!(prom.contains("job=\"ci\""));
    assert!(prom.contains("busbw_success{job=\"ci\""));
    // No temporary files are left behind.
    let names: Vec<String> = std::fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("busbw-tmp")), "{names:?}");
}

#[test]
fn nccl_tests_json_reads_like_nccl_tests_output() {
    let d = TempDir::new("njson");
    let mut args = SWEEP.to_vec();
    args.extend(["4", "-J", "run.json"]);
    let out = run_in(&d.0, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A second run never overwrites: it writes run.json.0, as nccl-tests does.
    let again = run_in(&d.0, &args);
    assert!(text(&again.stdout).starts_with("# Writing JSON output to run.json.0\n"));
    assert!(d.0.join("run.json.0").is_file());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_nccl_json.py");
    match Command::new("python3")
        .arg(&script)
        .arg(d.0.join("run.json"))
        .output()
    {
        Err(e) => eprintln!("SKIPPED: the analysis-tool check needs python3 ({e})"),
        Ok(o) => {
            assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
            assert!(
                text(&o.stdout).starts_with("OK 7 results, 2 devices"),
                "{}",
                text(&o.stdout)
            );
        }
    }
    // Another extension: ignored as nccl-tests does, but said.
    let mut args = SWEEP.to_vec();
    args.extend(["2", "-J", "run.txt"]);
    let out = run_in(&d.0, &args);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr)
            .contains("-J run.txt: nccl-tests writes JSON only to a name ending in .json"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.0.join("run.txt").exists());
}

#[test]
fn bad_report_flags_are_usage_errors_before_running() {
    let d = TempDir::new("badflags");
    for (extra, needle) in [
        (
            vec!["--export-csv", "no/such/dir/x.csv"],
            "directory no/such/dir does not exist",
        ),
        (
            vec!["--push-gateway", "pgw:9091"],
            "expected http://HOST[:PORT] or https://HOST[:PORT]",
        ),
        (
            vec!["--link-rate", "0"],
            "--link-rate 0: give the link's rate",
        ),
    ] {
        let mut args = SWEEP.to_vec();
        args.push("2");
        args.extend(extra);
        let out = run_in(&d.0, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains(needle),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "nothing ran");
    }
}

/// A rank killed mid-sweep: the export files still hold every row finished before, as a
/// complete document that says the run failed.
#[test]
fn a_crash_keeps_the_rows_done_so_far() {
    let d = TempDir::new("crash");
    let mut child = busbw()
        .current_dir(&d.0)
        .args([
            "all_reduce_perf",
            "--np",
            "3",
            "-b",
            "8",
            "-e",
            "32M",
            "-f",
            "2",
            "-n",
            "50",
            "-T",
            "20",
        ])
        .args([
            "--export-json",
            "r.json",
            "--export-csv",
            "r.csv",
            "-J",
            "n.json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut rows = 0;
    let mut line = String::new();
    while rows < 3 {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "run ended early");
        if !line.starts_with('#') {
            rows += 1;
        }
    }
    let run = RunRecord::load(&d.0.join("r.json")).unwrap();
    let victim = run.world.devices[1].pid as i32;
    unsafe { libc_kill(victim, 9) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "job did not end after a rank was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    let run = RunRecord::load(&d.0.join("r.json")).unwrap();
    assert!(run.rows.len() >= 3, "{} rows", run.rows.len());
    let sum = run.summary.expect("summary with the error");
    assert!(sum.error.is_some(), "{sum:?}");
    assert!(run.end_time.is_some());
    let csv_rows = csv::parse(&std::fs::read_to_string(d.0.join("r.csv")).unwrap()).unwrap();
    assert_eq!(csv_rows.len(), 2 * run.rows.len());
    let n: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.0.join("n.json")).unwrap()).unwrap();
    assert_eq!(n["results"].as_array().unwrap().len(), run.rows.len());
    assert_eq!(n["errors"].as_array().unwrap().len(), 1);
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

fn saved_run(dir: &Path, name: &str) -> PathBuf {
    let mut args = SWEEP.to_vec();
    args.extend(["3", "--export-json", name]);
    let out = run_in(dir, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    dir.join(name)
}

#[test]
fn compare_passes_identical_runs_and_names_a_drop() {
    let d = TempDir::new("compare");
    let base = saved_run(&d.0, "base.json");
    let out = run_in(&d.0, &["compare", "base.json", "base.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("no regression beyond 5%"));

    // The same run with busbw 20% lower at 1 KiB, out-of-place.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    let row = v["rows"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["size"] == 2048)
        .unwrap();
    let bw = row["out_of_place"]["busbw"].as_f64().unwrap();
    row["out_of_place"]["busbw"] = serde_json::json!(bw * 0.8);
    std::fs::write(d.0.join("new.json"), serde_json::to_vec(&v).unwrap()).unwrap();
    let out = run_in(
        &d.0,
        &[
            "compare",
            "base.json",
            "new.json",
            "--threshold",
            "5%",
            "--markdown",
            "diff.md",
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(8), "{stdout}");
    assert!(
        stdout.contains("1 regression(s) beyond 5%: all_reduce float sum ring 2 KiB out-of-place"),
        "{stdout}"
    );
    let md = std::fs::read_to_string(d.0.join("diff.md")).unwrap();
    assert!(
        md.contains("| all_reduce float sum ring 2 KiB out-of-place |")
            && md.contains("**REGRESSION**"),
        "{md}"
    );
    // A looser threshold lets it pass.
    let out = run_in(
        &d.0,
        &["compare", "base.json", "new.json", "--threshold", "25"],
    );
    assert_eq!(out.status.code(), Some(0));

    // Unreadable and invalid files: a clear message, exit 2.
    std::fs::write(d.0.join("junk.json"), "{ not json").unwrap();
    for (file, needle) in [
        ("missing.json", "cannot read missing.json"),
        ("junk.json", "junk.json is not valid JSON"),
    ] {
        let out = run_in(&d.0, &["compare", "base.json", file]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains(needle), "{}", text(&out.stderr));
    }
    let out = run_in(
        &d.0,
        &["compare", "base.json", "base.json", "--threshold", "lots"],
    );
    assert_eq!(out.status.code(), Some(2));
}

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| common::on_path(name))
}

/// Runs headless Chromium on `url`, killing it after a minute so a wedged browser fails the
/// test instead of hanging it.
fn headless(chrome: &Path, profile: &Path, extra: &[String], url: &str) -> Output {
    let mut child = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run chromium");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within 60 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = child.wait_with_output().unwrap();
    out.stdout = reader.join().unwrap();
    out
}

#[test]
fn report_plots_and_an_html_page_that_chromium_renders() {
    let d = TempDir::new("report");
    saved_run(&d.0, "run.json");
    let out = run_in(
        &d.0,
        &[
            "report",
            "run.json",
            "--plot",
            "plots",
            "--html",
            "report.html",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let svg =
        std::fs::read_to_string(d.0.join("plots/busbw-all-reduce-float-sum-ring-2r.svg")).unwrap();
    assert!(svg.contains("<polyline") && svg.contains("out-of-place"));
    let out = run_in(
        &d.0,
        &["report", "run.json", "--plot", "png", "--format", "png"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        std::fs::metadata(d.0.join("png/busbw-all-reduce-float-sum-ring-2r.png"))
            .unwrap()
            .len()
            > 5000
    );
    let out = run_in(&d.0, &["report", "run.json"]);
    assert_eq!(out.status.code(), Some(2));

    let Some(chrome) = chromium() else {
        eprintln!("SKIPPED: rendering check needs Chromium (apt-get install chromium); .ci/run installs it");
        return;
    };
    let url = format!("file://{}", d.0.join("report.html").display());
    let dom = headless(
        &chrome,
        &d.0.join("profile-dom"),
        &["--dump-dom".into()],
        &url,
    );
    let dom = text(&dom.stdout);
    assert!(dom.contains("<h1>all_reduce_perf on 2 rank(s)"), "{dom}");
    assert_eq!(dom.matches("<svg").count(), 1);
    assert!(
        dom.matches("<polyline").count() >= 3,
        "plot lines in the DOM"
    );
    // Screenshot: the plot's two line colours must be on the page in quantity.
    let shot = d.0.join("shot.png");
    let o = headless(
        &chrome,
        &d.0.join("profile-shot"),
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1200,1400".into(),
            // Waits for layout and paint to settle first: on a loaded machine a screenshot
            // taken at the load event alone came out before the plot was painted.
            "--virtual-time-budget=10000".into(),
        ],
        &url,
    );
    assert!(shot.is_file(), "no screenshot: {}", text(&o.stderr));
    let decoder = png::Decoder::new(std::fs::File::open(&shot).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let near = |p: &[u8], c: [u8; 3]| p.iter().zip(c).all(|(a, b)| a.abs_diff(b) < 40);
    let (mut blue, mut orange, mut white) = (0, 0, 0);
    for p in buf[..info.buffer_size()].chunks(channels) {
        blue += usize::from(near(p, [31, 119, 180]));
        orange += usize::from(near(p, [255, 127, 14]));
        white += usize::from(near(p, [255, 255, 255]));
    }
    let total = (info.width * info.height) as usize;
    // The two lines may lie on top of each other (in-place and out-of-place often measure
    // alike), so together they must cover many pixels and each at least its legend swatch.
    assert!(
        blue + orange > 600 && blue > 25 && orange > 25,
        "plot lines not rendered: blue {blue}, orange {orange} of {total} px"
    );
    assert!(white < total, "blank page");
}

#[test]
fn history_plots_a_trend_of_saved_runs() {
    let d = TempDir::new("history");
    std::fs::create_dir_all(d.0.join("runs")).unwrap();
    saved_run(&d.0, "runs/a.json");
    saved_run(&d.0, "runs/b.json");
    let out = run_in(&d.0, &["history", "runs"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.contains("all_reduce_perf"))
            .count(),
        2,
        "{stdout}"
    );
    let svg = std::fs::read_to_string(d.0.join("runs/history.svg")).unwrap();
    assert!(svg.matches("<circle").count() >= 4);
    let out = run_in(&d.0, &["history", "."]);
    assert_eq!(out.status.code(), Some(2), "no records directly in .");
}

#[test]
fn push_gateway_receives_the_metrics() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let (mut head, mut len) = (String::new(), 0usize);
        loop {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        let mut s = s;
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        (head, String::from_utf8(body).unwrap())
    });
    let url = format!("http://127.0.0.1:{port}");
    let d = TempDir::new("push");
    let out = run_in(
        &d.0,
        &[
            "all_reduce_perf",
            "-b",
            "8",
            "-e",
            "1K",
            "-f",
            "4",
            "-n",
            "2",
            "--push-gateway",
            &url,
            "--prometheus-job",
            "nightly",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (head, body) = server.join().unwrap();
    assert!(
        head.starts_with("PUT /metrics/job/nightly/instance/"),
        "{head}"
    );
    assert!(
        body.contains("busbw_bus_bandwidth_bytes_per_second{job=\"nightly\""),
        "{body}"
    );
    assert!(body.contains("busbw_success{"), "{body}");
}

#[test]
fn warnings_go_to_stderr_unless_quiet() {
    let d = TempDir::new("warn");
    let mut args = SWEEP.to_vec();
    args.extend(["3", "--link-rate", "0.000001"]);
    let out = run_in(&d.0, &args);
    assert_eq!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(
        err.contains("Warning: busbw above the link rate of 0.000001 GB/s"),
        "{err}"
    );
    assert!(
        !err.contains("\x1b["),
        "no colour when stderr is not a terminal"
    );
    assert!(
        !text(&out.stdout).contains("Warning"),
        "stdout is the table only"
    );
    for quiet in ["--quiet", "--style=none"] {
        let mut a = args.clone();
        a.push(quiet);
        let out = run_in(&d.0, &a);
        assert!(
            !text(&out.stderr).contains("Warning"),
            "{quiet}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn an_nccl_tests_json_file_can_be_the_baseline() {
    let d = TempDir::new("ntbase");
    let mut args = SWEEP.to_vec();
    args.extend(["3", "--export-json", "r.json", "-J", "n.json"]);
    let out = run_in(&d.0, &args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = run_in(&d.0, &["compare", "n.json", "r.json"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("all_reduce float sum 32 KiB in-place"),
        "{stdout}"
    );
    assert!(stdout.contains("no regression beyond 5%"), "{stdout}");
}

/// On a terminal (a pty from util-linux `script`), rank 0 draws a progress bar on stderr and
/// clears it around every table line, so the table stays whole.
#[test]
fn progress_bar_on_a_terminal_only() {
    let have_script = Command::new("script").arg("--version").output().is_ok();
    if !have_script {
        eprintln!("SKIPPED: the terminal check needs util-linux `script` for a pty");
        return;
    }
    let cmd = format!("{} all_reduce_perf --np 2 -b 8 -e 2K -f 4 -n 3", BUSBW);
    let out = busbw_in_pty(&cmd);
    assert!(out.contains("5/5 rows, last 2 KiB float"), "{out:?}");
    // Every table line arrives whole after the bar was cleared from its line.
    let lines: Vec<&str> = out
        .split(['\r', '\n'])
        .map(|l| l.rsplit("\x1b[2K").next().unwrap_or(l))
        .collect();
    assert!(lines.contains(&"# Out of bounds values : 0 OK"), "{out:?}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.ends_with("float     sum      -1")
                || l.contains("     float     sum      -1 "))
            .count(),
        5,
        "{out:?}"
    );
    // --quiet: no bar even on a terminal.
    let quiet = busbw_in_pty(&format!("{cmd} --quiet"));
    assert!(!quiet.contains(" rows, "), "{quiet:?}");
}

fn busbw_in_pty(cmd: &str) -> String {
    let out = Command::new("script")
        .args(["-q", "-e", "-c", cmd, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .expect("run script");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}
