//! What every integration test of the binary needs, in one place: the binary under test with
//! a clean environment, its output as text, scratch files, and the skip line a test that
//! cannot run here prints. Each test file takes what it uses (`mod common;`), so some of
//! this is unused in any one of them.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The binary cargo built for these tests.
pub const BUSBW: &str = env!("CARGO_BIN_EXE_busbw");

/// The binary with an empty environment but `PATH`: the tests must not inherit a launcher
/// environment (a developer's shell under Slurm or in a pod), a bandwidth gate or a token.
pub fn busbw() -> Command {
    let mut c = Command::new(BUSBW);
    c.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        c.env("PATH", path);
    }
    c
}

/// `busbw ARGS`, run to its end.
pub fn run(args: &[&str]) -> Output {
    busbw().args(args).output().expect("run busbw")
}

/// `program` found on PATH, as a shell would find it.
#[allow(dead_code)]
pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `name` in this test process's scratch folder for `suite`, under cargo's scratch space for
/// integration tests (`target/tmp`), not the machine's `/tmp`. Shared by the suite's tests,
/// so no one test may remove it; instead the first use removes the folders earlier runs of
/// the suite left behind (their processes are gone), so at most the last run's stays.
pub fn scratch(suite: &str, name: &str) -> PathBuf {
    static SWEPT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let prefix = format!("busbw-{suite}-");
    let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
    if !swept.contains(&prefix) {
        swept.push(prefix.clone());
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let file = e.file_name();
            let pid = file.to_str().and_then(|n| n.strip_prefix(&prefix));
            if pid.is_some_and(|p| !Path::new("/proc").join(p).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let d = root.join(format!("{prefix}{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create the scratch folder");
    d.join(name)
}

/// One test's own scratch folder, emptied when made: removed when the test passes, kept when
/// it fails (a panic is unwinding), with its path on stderr, for the post-mortem.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(suite: &str, name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("busbw-{suite}-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create the scratch folder");
        Scratch(d)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = writeln!(
                std::io::stderr(),
                "kept for inspection: {}",
                self.0.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Says on the process's stderr that `test` skips and why: the test harness captures
/// `eprintln!`, and a skip must be visible even when the test "passes".
pub fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "skipping {test}: {why}");
}

/// This process's effective user id (0: root).
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() }
}

/// Why this machine cannot simulate a cluster in network namespaces, if it cannot: root,
/// iproute2 (`ip`, `tc`), `unshare --net --uts` and bash are needed.
pub fn netns_unavailable() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        let euid = euid();
        if euid != 0 {
            return Some(format!("euid is {euid}, not 0"));
        }
        let ok = |prog: &str, args: &[&str]| {
            Command::new(prog)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        if !ok("ip", &["netns", "list"]) || !ok("tc", &["-V"]) {
            return Some("iproute2 (ip, tc) is missing".into());
        }
        if !ok("unshare", &["--net", "--uts", "true"]) {
            return Some(
                "`unshare --net --uts` is not permitted here (or util-linux is missing)".into(),
            );
        }
        if !ok("bash", &["-c", "true"]) {
            return Some("bash is missing".into());
        }
        None
    })
    .as_deref()
}

/// Every simulated-cluster test starts with this: false (after saying why) when it cannot run.
pub fn can_run_netns(test: &str) -> bool {
    match netns_unavailable() {
        None => true,
        Some(why) => {
            skip(
                test,
                &format!("needs root for network namespaces and tc ({why})"),
            );
            false
        }
    }
}

/// Whether `measured` is within `frac` of `expected`, either side.
pub fn within(measured: f64, expected: f64, frac: f64) -> bool {
    (measured / expected - 1.0).abs() <= frac
}

/// Whether `measured` is the bandwidth of a link shaped to `shaped`. Never more than 10 %
/// above it: busbw must not overstate a link, however loaded the machine. Below it by more
/// than 10 % only as far as `reference`, the same run's median link of the same tier, is
/// too (within 20 % of it): a loaded machine (another build, another test's guests) starves
/// the eight ranks of CPU and every figure of the run falls below the shaping together,
/// while a wrong figure stands out from its own run's links.
pub fn shaped_rate(measured: f64, shaped: f64, reference: f64) -> bool {
    measured <= shaped * 1.10 && (within(measured, shaped, 0.10) || measured >= reference * 0.80)
}

/// The simulated cluster's script.
pub fn simcluster() -> String {
    format!("{}/tests/simcluster.sh", env!("CARGO_MANIFEST_DIR"))
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
