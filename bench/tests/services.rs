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

impl Service {
    /// Starts `program` with `args`, its output discarded (the tests read its HTTP side).
    fn start(program: &str, args: &[String]) -> Service {
        Service(
            Command::new(program)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("start {program}: {e}")),
        )
    }
}

/// A Pushgateway on a free loopback port with no persistence file (it starts empty and
/// leaves nothing behind), once it answers `/-/ready` (with `headers`); its address.
fn pushgateway(program: &str, extra: &[String], headers: &[(&str, &str)]) -> (Service, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        format!("--web.listen-address={addr}"),
        "--persistence.file=".to_string(),
    ];
    args.extend_from_slice(extra);
    let mut svc = Service::start(program, &args);
    wait_ready(&format!("http://{addr}/-/ready"), headers, &mut svc);
    (svc, addr)
}

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
fn wait_ready(url: &str, headers: &[(&str, &str)], what: &mut Service) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = busbw_http::get(url, headers, None, T) {
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
    let (_svc, addr) = pushgateway(&gateway, &[], &[]);
    let base = format!("http://{addr}");
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

/// `s` percent-encoded for a URL's query (everything but RFC 3986's unreserved characters).
fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET `path` of Prometheus's HTTP API; its `data`, after checking `status` is success.
fn api(base: &str, path: &str) -> serde_json::Value {
    let url = format!("{base}{path}");
    let r = busbw_http::get(&url, &[], None, T).unwrap_or_else(|e| panic!("{url}: {e}"));
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.status, 200, "{url}: {body}");
    let v: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {e}: {body}"));
    assert_eq!(v["status"], "success", "{url}: {body}");
    v["data"].clone()
}

/// An instant query's result vector.
fn promql(base: &str, expr: &str) -> Vec<serde_json::Value> {
    let data = api(base, &format!("/api/v1/query?query={}", query_escape(expr)));
    assert_eq!(data["resultType"], "vector", "{expr}: {data}");
    data["result"].as_array().cloned().unwrap_or_default()
}

/// (name, text) pairs: a panel's title and PromQL, a variable's name and query.
type Named = Vec<(String, String)>;

/// The committed dashboard's panels as (title, PromQL) and its variables as (name, query).
fn dashboard() -> (Named, Named) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../k8s/grafana/busbw-dashboard.json"
    );
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .expect("the dashboard is JSON");
    fn walk(p: &serde_json::Value, out: &mut Named) {
        for panel in p["panels"].as_array().into_iter().flatten() {
            for t in panel["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    let title = panel["title"].as_str().unwrap_or_default();
                    out.push((title.to_string(), e.to_string()));
                }
            }
            walk(panel, out);
        }
    }
    let mut exprs = Vec::new();
    walk(&d, &mut exprs);
    let vars = d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let q = v["query"].as_str().or(v["query"]["query"].as_str());
            (
                v["name"].as_str().unwrap().to_string(),
                q.unwrap().to_string(),
            )
        })
        .collect();
    (exprs, vars)
}

/// Grafana's `label_values(SELECTOR, LABEL)` through the API Grafana itself calls.
fn label_values(base: &str, query: &str) -> Vec<String> {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    let (selector, label) = inner.rsplit_once(',').unwrap();
    let data = api(
        base,
        &format!(
            "/api/v1/label/{}/values?match[]={}",
            label.trim(),
            query_escape(selector.trim())
        ),
    );
    data.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The three runs a dashboard has to chart, under `job`-prefixed names: a passing sweep, a
/// `busbw tiers` run (tier rows and verdicts) and a run with wrong data (exit 7). `out` adds
/// where the metrics go (`--push-gateway URL` or `--export-prometheus FILE`).
fn dashboard_runs(prefix: &str, out: &dyn Fn(&str) -> Vec<String>) {
    let runs: [(&str, &str, Option<i32>); 3] = [
        (
            "nightly",
            "all_reduce_perf --np 2 -b 8 -e 512 -f 4 -n 2",
            Some(0),
        ),
        (
            "tiers",
            "tiers --np 2 -b 64K -e 256K -f 4 -n 2 --min-busbw-tier node=0.000001",
            Some(0),
        ),
        (
            "broken",
            "all_reduce_perf --np 2 -b 64 -e 256 -f 4 -n 1 --debug-corrupt-rank 1",
            Some(7),
        ),
    ];
    for (name, args, code) in runs {
        let job = format!("{prefix}-{name}");
        let o = busbw()
            .args(args.split(' '))
            .args(["--prometheus-job", &job])
            .args(out(&job))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), code, "{job}: {}", text(&o.stderr));
    }
}

/// Point 3 of issue 21: a real Prometheus scrapes a real Pushgateway (busbw pushed to it) and
/// the node exporter's textfile collector (busbw wrote `--export-prometheus` files); every
/// PromQL expression of the committed Grafana dashboard, run through Prometheus's HTTP API
/// with the dashboard's variables resolved as Grafana resolves them, returns series from
/// each of the two paths.
#[test]
fn prometheus_scrapes_both_paths_and_every_dashboard_query_returns_series() {
    let test = "prometheus_scrapes_both_paths_and_every_dashboard_query_returns_series";
    let (Some(gateway), Some(exporter), Some(prometheus)) = (
        installed("prometheus-pushgateway", "prometheus-pushgateway", test),
        installed("prometheus-node-exporter", "prometheus-node-exporter", test),
        installed("prometheus", "prometheus", test),
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("busbw-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let textfiles = dir.join("textfile");
    std::fs::create_dir_all(&textfiles).unwrap();
    let (ne, prom) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let (_gw_svc, gw) = pushgateway(&gateway, &[], &[]);
    let push_url = format!("http://{gw}");
    dashboard_runs("push", &|_| vec!["--push-gateway".into(), push_url.clone()]);
    dashboard_runs("file", &|job| {
        let f = textfiles.join(format!("{job}.prom"));
        vec!["--export-prometheus".into(), f.display().to_string()]
    });

    // Only the textfile collector: the test is about busbw's files, not this host.
    let mut ne_svc = Service::start(
        &exporter,
        &[
            format!("--web.listen-address={ne}"),
            "--collector.disable-defaults".into(),
            "--collector.textfile".into(),
            format!("--collector.textfile.directory={}", textfiles.display()),
        ],
    );
    wait_ready(&format!("http://{ne}/metrics"), &[], &mut ne_svc);
    // honor_labels on both: busbw's `job` label (--prometheus-job) is the one the dashboard
    // selects on; without it Prometheus renames it exported_job (docs/kubernetes.md says so).
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n\
             - job_name: pushgateway\n  honor_labels: true\n  static_configs:\n  - targets: ['{gw}']\n\
             - job_name: node\n  honor_labels: true\n  static_configs:\n  - targets: ['{ne}']\n"
        ),
    )
    .unwrap();
    let mut prom_svc = Service::start(
        &prometheus,
        &[
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={prom}"),
        ],
    );
    let base = format!("http://{prom}");
    wait_ready(&format!("{base}/-/ready"), &[], &mut prom_svc);

    // Both targets up and all six runs' success series in: at most 60 s (1 s scrapes).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = promql(&base, "up == 1").len();
        let runs = promql(&base, "busbw_success").len();
        if up == 2 && runs == 6 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus has {up} of 2 targets up and {runs} of 6 runs' busbw_success: {:#?}",
            api(&base, "/api/v1/targets")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The node exporter read every file (a file it cannot parse is reported, not dropped
    // silently: node_textfile_scrape_error).
    let errors = promql(&base, "node_textfile_scrape_error");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0]["value"][1], "0",
        "the textfile collector failed a file"
    );

    let (exprs, vars) = dashboard();
    assert!(exprs.len() >= 10, "{exprs:#?}");
    let var = |name: &str| {
        vars.iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("the dashboard has no variable {name}: {vars:?}"))
            .1
            .clone()
    };
    for source in ["push", "file"] {
        let jobs: Vec<String> = ["nightly", "tiers", "broken"]
            .iter()
            .map(|n| format!("{source}-{n}"))
            .collect();
        // $job: every run is offered; "All" of a multi-value variable is an alternation.
        let offered = label_values(&base, &var("job"));
        for j in &jobs {
            assert!(offered.contains(j), "$job does not offer {j}: {offered:?}");
        }
        let job = format!("({})", jobs.join("|"));
        // $size: the values offered for these jobs, the largest picked (the trend panel).
        let size_query = var("size").replace("$job", &job);
        let sizes = label_values(&base, &size_query);
        let size = sizes
            .iter()
            .max_by_key(|s| s.parse::<u64>().unwrap_or(0))
            .unwrap_or_else(|| panic!("$size offers nothing for {job}"));
        for (title, expr) in &exprs {
            let q = expr.replace("$job", &job).replace("$size", size);
            let result = promql(&base, &q);
            eprintln!("{source}: {title}: {} series", result.len());
            assert!(
                !result.is_empty(),
                "{source}: panel {title:?}: {q} returned no series"
            );
        }
        // And the values say what happened in each run.
        let by_job = |expr: &str| -> Vec<(String, String)> {
            promql(&base, &expr.replace("$job", &job))
                .iter()
                .map(|s| {
                    (
                        s["metric"]["job"].as_str().unwrap_or_default().to_string(),
                        s["value"][1].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        };
        let mut success = by_job("busbw_success{job=~\"$job\"}");
        success.sort();
        assert_eq!(
            success,
            [
                (format!("{source}-broken"), "0".into()),
                (format!("{source}-nightly"), "1".into()),
                (format!("{source}-tiers"), "1".into()),
            ],
            "{source}"
        );
        let wrong = by_job("busbw_wrong_elements{job=~\"$job\"} > 0");
        assert!(
            wrong.iter().all(|(j, _)| j == &format!("{source}-broken")),
            "{source}: only the corrupted run has wrong elements: {wrong:?}"
        );
        let verdicts = by_job("busbw_tier_pass{job=~\"$job\"}");
        assert_eq!(
            verdicts,
            [(format!("{source}-tiers"), "1".into())],
            "{source}"
        );
    }
    drop(prom_svc);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Pushgateway that asks for basic auth (its own `--web.config.file`, bcrypt-hashed
/// password, as its docs set it up): the user from the URL and the password from
/// BUSBW_PUSH_GATEWAY_PASSWORD get in; a wrong password is refused with a message that says
/// what to set, and the run's exit code says the push failed.
#[test]
fn a_pushgateway_with_basic_auth_takes_the_user_from_the_url_and_the_password_from_the_env() {
    let test =
        "a_pushgateway_with_basic_auth_takes_the_user_from_the_url_and_the_password_from_the_env";
    let Some(gateway) = installed("prometheus-pushgateway", "prometheus-pushgateway", test) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("busbw-pgw-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let web = dir.join("web.yml");
    // bcrypt (cost 4) of "push-s3cret".
    std::fs::write(
        &web,
        "basic_auth_users:\n  nightly: $2b$04$wIdmAO22N/4e8KdnKHdj8uhHcywHCiQptGy9ruqA4rcQ99ee9vee2\n",
    )
    .unwrap();
    let auth = busbw_http::basic_auth("nightly", "push-s3cret");
    let headers = [("Authorization", auth.as_str())];
    let extra = [format!("--web.config.file={}", web.display())];
    let (_svc, addr) = pushgateway(&gateway, &extra, &headers);
    // The gateway does ask: no credentials, no metrics.
    let r = busbw_http::get(&format!("http://{addr}/metrics"), &[], None, T).unwrap();
    assert_eq!(r.status, 401);

    let run = |password: &str| {
        busbw()
            .args("all_reduce_perf --np 2 -b 8 -e 64 -f 8 -n 2 --prometheus-job nightly".split(' '))
            .args(["--push-gateway", &format!("http://nightly@{addr}")])
            .env("BUSBW_PUSH_GATEWAY_PASSWORD", password)
            .output()
            .unwrap()
    };
    let out = run("push-s3cret");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = busbw_http::get(&format!("http://{addr}/metrics"), &headers, None, T).unwrap();
    let m = String::from_utf8(r.body).unwrap();
    assert_eq!(
        series(&m, "busbw_bus_bandwidth_bytes_per_second", "nightly").len(),
        4,
        "{m}"
    );

    let out = run("not-the-password-42");
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("HTTP 401")
            && err.contains("user \"nightly\"")
            && err.contains("BUSBW_PUSH_GATEWAY_PASSWORD")
            && !err.contains("not-the-password-42"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
