//! busbw against the real services around a job, started by the tests (Debian's packages,
//! installed by `.ci/run`): each test skips, saying what is missing, where its service is not
//! installed.

mod common;
use common::{busbw, text};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// A service process, killed when dropped.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `program`'s path, or None after saying why `test` skips.
fn installed(program: &str, package: &str, test: &str) -> Option<String> {
    let found = common::on_path(program);
    if found.is_none() {
        eprintln!(
            "skipping {test}: {program} is not installed (apt-get install {package}; .ci/run does)"
        );
    }
    found.map(|f| f.display().to_string())
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// GETs `url` until it answers 200, for at most 30 s (a service starting on a loaded machine).
fn wait_ready(url: &str, what: &mut Service) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = busbw_http::get(url, &[], None, T) {
            if r.status == 200 {
                return;
            }
        }
        if let Ok(Some(status)) = what.0.try_wait() {
            panic!("the service exited ({status}) before {url} answered");
        }
        assert!(Instant::now() < deadline, "{url} never answered 200");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The gateway's /metrics lines of `family` in job `job`.
fn series(metrics: &str, family: &str, job: &str) -> Vec<String> {
    let job = format!("job=\"{job}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(&job))
        .map(str::to_string)
        .collect()
}

fn push(url: &str, sizes: &str) {
    let (b, e) = sizes.split_once('-').unwrap();
    let run = format!("all_reduce_perf --np 2 -b {b} -e {e} -f 4 -n 2 --prometheus-job nightly");
    let out = busbw()
        .args(run.split(' '))
        .args(["--push-gateway", url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// Point 3 of issue 21: busbw pushes to a real Pushgateway, which keeps every promised series
/// with its labels under the job/instance grouping key; a second run replaces the group.
#[test]
fn a_real_pushgateway_keeps_the_series_and_a_second_run_replaces_them() {
    let test = "a_real_pushgateway_keeps_the_series_and_a_second_run_replaces_them";
    let Some(gateway) = installed("prometheus-pushgateway", "prometheus-pushgateway", test) else {
        return;
    };
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut svc = Service(
        Command::new(gateway)
            .arg(format!("--web.listen-address={addr}"))
            // No persistence file: the test's gateway starts empty and leaves nothing behind.
            .arg("--persistence.file=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus-pushgateway"),
    );
    let base = format!("http://{addr}");
    wait_ready(&format!("{base}/-/ready"), &mut svc);
    let metrics = || {
        let r = busbw_http::get(&format!("{base}/metrics"), &[], None, T).unwrap();
        assert_eq!(r.status, 200);
        String::from_utf8(r.body).unwrap()
    };

    push(&base, "8-512");
    let m = metrics();
    let bw = series(&m, "busbw_bus_bandwidth_bytes_per_second", "nightly");
    // Sizes 8, 32, 128 and 512 B, out of place and in place.
    assert_eq!(bw.len(), 8, "{bw:#?}");
    for label in [
        "instance=\"",
        "host=\"",
        "collective=\"all_reduce\"",
        "dtype=\"float\"",
        "redop=\"sum\"",
        "placement=\"out_of_place\"",
        "tier=\"world\"",
        "size=\"512\"",
    ] {
        assert!(bw.iter().any(|l| l.contains(label)), "{label}: {bw:#?}");
    }
    for family in [
        "busbw_algorithm_bandwidth_bytes_per_second",
        "busbw_time_seconds",
        "busbw_wrong_elements",
        "busbw_avg_bus_bandwidth_bytes_per_second",
        "busbw_out_of_bounds",
        "busbw_success",
        "busbw_last_run_timestamp_seconds",
    ] {
        assert!(
            !series(&m, family, "nightly").is_empty(),
            "{family} missing from the gateway:\n{m}"
        );
    }
    assert!(series(&m, "busbw_success", "nightly")[0].ends_with(" 1"));

    // The same job and instance again, fewer sizes: the group is replaced, not merged.
    push(&base, "8-32");
    let m = metrics();
    let bw = series(&m, "busbw_bus_bandwidth_bytes_per_second", "nightly");
    assert_eq!(bw.len(), 4, "{bw:#?}");
    assert!(!bw.iter().any(|l| l.contains("size=\"512\"")), "{bw:#?}");
}
