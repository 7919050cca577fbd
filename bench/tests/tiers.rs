//! `busbw tiers` end to end. Local jobs (any machine): the node tier, the JSON export, the
//! per-tier gate and bad input. Simulated cluster (root): 8 nodes in 2 network blocks of 2
//! local blocks, each tier's links shaped slower than the one below, once with one node
//! throttled to half rate and once without; the report must give each tier its shaped
//! bandwidth and the verdict must name the throttled node and nobody else.

mod common;
use common::{busbw, can_run_netns, shaped_rate, simcluster, text, within, BUSBW};

use serde_json::Value;
use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn tmp(name: &str) -> std::path::PathBuf {
    common::scratch("tiers", name)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn json(path: &std::path::Path) -> Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", path.display()))
}

#[test]
fn local_job_reports_the_node_tier_and_exports_json() {
    let labels = tmp("labels.yaml");
    std::fs::write(
        &labels,
        format!(
            "{}:\n  oci.oraclecloud.com/rdma.local_block_id: lb1\n  oci.oraclecloud.com/rdma.network_block_id: no-imds-data\n",
            hostname()
        ),
    )
    .unwrap();
    let out_json = tmp("local.json");
    let out_junit = tmp("local.junit.xml");
    let out_csv = tmp("local.csv");
    let out_md = tmp("local.md");
    let out = busbw()
        .args([
            "tiers", "--np", "2", "-b", "64K", "-e", "256K", "-f", "4", "-n", "2",
        ])
        .args(["--min-busbw-tier", "node=0.000001"])
        .arg("--topology-file")
        .arg(&labels)
        .arg("--export-json")
        .arg(&out_json)
        .arg("--export-junit")
        .arg(&out_junit)
        .arg("--export-csv")
        .arg(&out_csv)
        .arg("--export-markdown")
        .arg(&out_md)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    // The main table first, then the tiers and the verdict.
    let footer = stdout
        .find("# Avg bus bandwidth")
        .expect("main table footer");
    let tiers = stdout
        .find("# Topology tiers (preset oci")
        .expect("tier table");
    let verdict = stdout.find("# Verdict: PASS").expect("verdict");
    assert!(footer < tiers && tiers < verdict, "{stdout}");
    assert!(stdout.contains("# node "), "{stdout}");
    let j = json(&out_json);
    // The run record every exporter reads, finished only once the tiers are in.
    assert_eq!(j["schema"], "busbw-run");
    assert_eq!(j["program"], "all_reduce_perf");
    assert!(j["end_time"].is_string(), "{j}");
    assert_eq!(j["rows"].as_array().unwrap().len(), 2);
    assert_eq!(
        j["world"]["labels"][hostname()]["oci.oraclecloud.com/rdma.local_block_id"],
        "lb1"
    );
    assert_eq!(j["tiers"]["tiers"][0]["name"], "node");
    assert_eq!(j["tiers"]["tiers"][0]["rows"].as_array().unwrap().len(), 2);
    assert_eq!(j["tiers"]["tiers"][0]["verdict"]["pass"], true, "{j}");
    assert_eq!(j["verdict"]["pass"], true, "{j}");
    let junit = std::fs::read_to_string(&out_junit).unwrap();
    assert!(junit.contains("name=\"tier node\""), "{junit}");
    assert!(junit.contains("failures=\"0\""), "{junit}");
    let csv = std::fs::read_to_string(&out_csv).unwrap();
    assert_eq!(
        csv.lines().count(),
        5,
        "header, two sizes x two placements: {csv}"
    );
    let md = std::fs::read_to_string(&out_md).unwrap();
    assert!(
        md.contains("### Tiers") && md.contains("Verdict: pass"),
        "{md}"
    );
    // The full report rides along for tools that want every group and link.
    let t = &j["tier_report"];
    assert_eq!(t["preset"], "oci");
    let tiers = t["tiers"].as_array().unwrap();
    let names: Vec<&str> = tiers.iter().map(|t| t["tier"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["node", "host", "local_block", "network_block", "hpc_island"]
    );
    // Both ranks on this host: the node tier is the whole job, two sizes.
    assert_eq!(tiers[0]["ranks_max"], 2);
    assert_eq!(tiers[0]["sizes"].as_array().unwrap().len(), 2);
    assert!(tiers[0]["sizes"][1]["median"].as_f64().unwrap() > 0.0);
    // The placeholder makes the network block (and everything above it) unknown.
    assert_eq!(tiers[3]["unknown_nodes"][0], hostname());
    assert_eq!(t["verdict"]["unknown_nodes"][0], hostname());
    assert!(t["matrix"].is_null(), "one node: no pairs");
    // No temporary file left beside the report.
    let dir: Vec<_> = std::fs::read_dir(out_json.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
        .collect();
    assert!(dir.is_empty(), "{dir:?}");
}

/// A stand-in for the API server and the metadata service on 127.0.0.1: answers every
/// request by path until the test ends; the request lines come back through the channel.
fn stand_in(
    routes: Vec<(&'static str, u16, String)>,
) -> (String, std::sync::mpsc::Receiver<Vec<String>>) {
    use std::io::{BufRead, BufReader};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut req = Vec::new();
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                req.push(line.trim_end().to_string());
            }
            let path = req
                .first()
                .and_then(|l| l.split(' ').nth(1))
                .unwrap_or("")
                .to_string();
            let (status, body) = routes
                .iter()
                .find(|(p, _, _)| *p == path)
                .map(|(_, st, b)| (*st, b.clone()))
                .unwrap_or((404, "not found".into()));
            let _ = tx.send(req);
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (base, rx)
}

#[test]
fn labels_from_the_api_server_and_instance_metadata() {
    let node = r#"{"kind":"Node","metadata":{"name":"gpu-a","labels":{
        "oci.oraclecloud.com/rdma.local_block_id":"no-imds-data",
        "oci.oraclecloud.com/rdma.hpc_island_id":"isl-k8s"}}}"#;
    let imds = r#"{"customerHPCIslandId":"ocid1.hpcisland.oc1..aaaaisland01",
        "customerNetworkBlock":"ocid1.networkblock.oc1..aaaaanblock01",
        "customerLocalBlock":"ocid1.localblock.oc1..aaaaalblock01",
        "customerHostId":"ocid1.host.oc1..aaaaaaahost01"}"#;
    let (base, rx) = stand_in(vec![
        ("/api/v1/nodes/gpu-a", 200, node.to_string()),
        ("/opc/v2/host/rdmaTopologyData", 200, imds.to_string()),
    ]);
    let out_json = tmp("k8s.json");
    let out = busbw()
        .args(["tiers", "--np", "2", "-b", "64K", "-e", "64K", "-n", "1"])
        .args([
            "--topology-source",
            "k8s,oci-imds",
            "--topology-preset",
            "oci",
        ])
        .args(["--topology-k8s-url", &base])
        .args(["--topology-imds-url", &format!("{base}/opc/v2")])
        .env("NODE_NAME", "gpu-a")
        .arg("--export-json")
        .arg(&out_json)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let j = json(&out_json);
    let labels = &j["tier_report"]["nodes"][0]["labels"];
    // The API server's real value is kept; its placeholder is filled from the metadata.
    assert_eq!(
        labels["oci.oraclecloud.com/rdma.hpc_island_id"], "isl-k8s",
        "{j}"
    );
    assert_eq!(
        labels["oci.oraclecloud.com/rdma.local_block_id"], "aaalblock01",
        "{j}"
    );
    assert_eq!(
        labels["oci.oraclecloud.com/rdma.network_block_id"], "aaanblock01",
        "{j}"
    );
    assert!(
        j["tier_report"]["verdict"]["unknown_nodes"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{j}"
    );
    let reqs: Vec<Vec<String>> = rx.try_iter().collect();
    assert_eq!(reqs.len(), 4, "two ranks, two sources each: {reqs:?}");
    let imds_reqs: Vec<&Vec<String>> = reqs
        .iter()
        .filter(|r| r[0].starts_with("GET /opc/v2/host/rdmaTopologyData "))
        .collect();
    assert_eq!(imds_reqs.len(), 2, "{reqs:?}");
    assert!(imds_reqs
        .iter()
        .all(|r| r.iter().any(|l| l == "Authorization: Bearer Oracle")));
}

#[test]
fn tier_threshold_fails_the_run_with_7() {
    let out = busbw()
        .args(["tiers", "--np", "2", "-b", "64K", "-e", "64K", "-n", "2"])
        .args(["--min-busbw-tier", "node=100000"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("# Verdict: FAIL"), "{stdout}");
    assert!(stdout.contains("tier node below its threshold"), "{stdout}");
    assert!(stdout.contains("no topology labels found"), "{stdout}");
}

#[test]
fn bad_topology_flags_are_usage_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--topology-preset", "azure"],
            "unknown topology preset 'azure'",
        ),
        (&["--topology-preset", "custom"], "--topology-keys"),
        (
            &["--topology-keys", "a,b"],
            "needs --topology-preset custom",
        ),
        (
            &["--topology-source", "env,dns"],
            "unknown topology source 'dns'",
        ),
        (&["--topology-source", "file"], "--topology-file"),
        (&["--min-busbw-tier", "local_block"], "expected tier=GB/s"),
        (
            &["--min-busbw-tier", "local_block=fast"],
            "not a non-negative number",
        ),
        (&["--collective", "nope"], "no such collective"),
        (
            &["--min-busbw-tier", "rack=1"],
            "no such tier; the tiers are node",
        ),
        (&["--topology-source", "k8s"], "KUBERNETES_SERVICE_HOST"),
    ];
    for (args, want) in cases {
        let out = busbw()
            .args(["tiers", "-b", "1K", "-e", "1K", "-n", "1"])
            .args(*args)
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: wanted {want:?} in {err}");
    }
    // A placeholder in BUSBW_TOPOLOGY is unknown, a malformed item is an error.
    let out = busbw()
        .args(["tiers", "-b", "1K", "-e", "1K", "-n", "1"])
        .env("BUSBW_TOPOLOGY", "oci.oraclecloud.com/rdma.local_block_id")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("BUSBW_TOPOLOGY"),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------
// The simulated cluster (root only).

/// Shaped rates of the tiers, Mbit/s: local block, network block, across network blocks.
const RATES_MBIT: [f64; 3] = [200.0, 100.0, 50.0];

struct Cluster {
    name: String,
}

impl Cluster {
    fn up(tag: &str, throttle: Option<usize>) -> Cluster {
        Cluster::up_blocks(tag, throttle, "2,4")
    }

    /// Local blocks of L nodes in network blocks of N: `blocks` is `L,N`.
    fn up_blocks(tag: &str, throttle: Option<usize>, blocks: &str) -> Cluster {
        let name = format!("bt{}-{tag}", std::process::id());
        let _ = Command::new("bash")
            .args([&simcluster(), "down", &name])
            .output();
        let rates = RATES_MBIT.map(|r| format!("{r}mbit")).join(",");
        let mut c = Command::new("bash");
        c.args([
            &simcluster(),
            "up",
            &name,
            "8",
            "--mtu",
            "9000",
            "--blocks",
            blocks,
        ])
        .args(["--tier-rates", &rates]);
        if let Some(t) = throttle {
            c.args(["--throttle", &t.to_string()]);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "up: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        Cluster { name }
    }

    /// `simcluster.sh CMD NAME ARGS...` on this cluster (`throttle`, `throttle-link`, ...).
    fn shape(&self, cmd: &str, args: &[&str]) {
        let out = Command::new("bash")
            .args([&simcluster(), cmd, &self.name])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd}: {}", text(&out.stderr));
    }

    fn labels(&self) -> String {
        format!("/run/simcluster/{}.labels.json", self.name)
    }

    /// One rank per node, torchrun variables, store on node0.
    fn run(&self, port: u16, out_json: &std::path::Path, extra: &[&str]) -> Vec<Output> {
        self.spawn(port, out_json, extra)
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect()
    }

    /// [`Cluster::run`]'s ranks, started: node `i` writes `out_json` with extension
    /// `i.json`, which tells its processes apart.
    fn spawn(&self, port: u16, out_json: &std::path::Path, extra: &[&str]) -> Vec<Child> {
        (0..8)
            .map(|i| {
                let mut c = Command::new("bash");
                c.args([
                    &simcluster(),
                    "exec",
                    &self.name,
                    &i.to_string(),
                    BUSBW,
                    "tiers",
                ])
                .args(["-b", "2M", "-e", "2M", "-n", "4", "-w", "1", "-c", "0"])
                // -T once: a test that wants its own gives it in `extra`.
                .args(if extra.contains(&"-T") {
                    &[][..]
                } else {
                    &["-T", "120"][..]
                })
                .args([
                    "--topology-preset",
                    "oci",
                    "--topology-file",
                    &self.labels(),
                ])
                .args([
                    "--pairwise-size",
                    "1M",
                    "--pairwise-iters",
                    "3",
                    "--transport",
                    "tcp",
                ])
                .args(extra)
                .arg("--export-json")
                .arg(out_json.with_extension(format!("{i}.json")));
                c.env_clear()
                    .env(
                        "PATH",
                        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    )
                    .env("RANK", i.to_string())
                    .env("WORLD_SIZE", "8")
                    .env("MASTER_ADDR", "node0")
                    .env("MASTER_PORT", port.to_string())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                c.spawn().unwrap()
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .args([&simcluster(), "down", &self.name])
            .output();
    }
}

/// The shaped cluster tests one at a time: two shaped clusters at once on two cores would
/// measure each other.
static SHAPED: Mutex<()> = Mutex::new(());

/// GB/s of a shaped rate at MTU 9000 (TCP/IP headers of 66 bytes per 8948 of payload).
fn goodput(mbit: f64) -> f64 {
    mbit * 1e6 / 8.0 / 1e9 * 8948.0 / 9014.0
}

/// The median busbw of the links of `tier` in the report's matrix, leaving out the links of
/// `throttled`.
fn median_link(report: &Value, tier: &str, throttled: Option<&str>) -> f64 {
    let mut bws: Vec<f64> = report["matrix"]["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["tier"] == tier)
        .filter(|l| !throttled.is_some_and(|t| l["a"] == t || l["b"] == t))
        .filter_map(|l| l["busbw"].as_f64())
        .collect();
    assert!(!bws.is_empty(), "no {tier} links in {report}");
    bws.sort_by(f64::total_cmp);
    bws[bws.len() / 2]
}

/// Runs the job; checks the tiers against the shaping (skipping groups with the throttled
/// node) and returns rank 0's exit code, stdout and the report.
fn tiers_job(tag: &str, throttle: Option<usize>, port: u16) -> (Option<i32>, String, Value) {
    let _serial = SHAPED.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up(tag, throttle);
    let out_json = tmp(&format!("{tag}.json"));
    let start = Instant::now();
    // The whole matrix: the checks below read every link.
    let outs = cluster.run(port, &out_json, &["--pairwise", "full"]);
    let secs = start.elapsed().as_secs_f64();
    let _ = writeln!(
        std::io::stderr(),
        "{tag}: the 8-node tiers job took {secs:.1} s"
    );
    let all = outs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            format!(
                "--- node{i} ({:?})\n{}{}",
                o.status.code(),
                text(&o.stdout),
                text(&o.stderr)
            )
        })
        .collect::<String>();
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
    assert!(
        codes.iter().all(|c| *c == codes[0]),
        "every rank exits alike: {codes:?}\n{all}"
    );
    let stdout = text(&outs[0].stdout);
    let report_text = stdout.find("# Topology tiers").map_or("", |i| &stdout[i..]);
    let _ = writeln!(std::io::stderr(), "{tag}: rank 0's report:\n{report_text}");
    let report = json(&out_json.with_extension("0.json"));
    let tiers = report["tier_report"]["tiers"].as_array().unwrap().clone();
    let names: Vec<&str> = tiers.iter().map(|t| t["tier"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["node", "host", "local_block", "network_block", "hpc_island"],
        "{all}"
    );
    let expected = [
        ("local_block", goodput(RATES_MBIT[0]), 4),
        ("network_block", goodput(RATES_MBIT[1]), 2),
        ("hpc_island", goodput(RATES_MBIT[2]), 1),
    ];
    let throttled = throttle.map(|t| format!("node{t}"));
    for (name, want, groups) in expected {
        let t = tiers.iter().find(|t| t["tier"] == name).unwrap();
        assert_eq!(t["groups"], groups, "{name}: {all}");
        let link = median_link(&report["tier_report"], name, throttled.as_deref());
        let mut checked = 0;
        for g in t["group_results"].as_array().unwrap() {
            let nodes: Vec<&str> = g["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap())
                .collect();
            // The island tier's one group holds the throttled node, but its ring's slowest
            // hop is a cross-block link at the same rate either way.
            if name != "hpc_island" && throttled.as_deref().is_some_and(|t| nodes.contains(&t)) {
                continue;
            }
            let bw = g["busbw"][0].as_f64().unwrap();
            assert!(
                shaped_rate(bw, want, link),
                "{name} group {nodes:?}: {bw} GB/s, shaped {want} GB/s, this run's median \
                 {name} link {link} GB/s\n{stdout}"
            );
            if !within(bw, want, 0.10) {
                let _ = writeln!(
                    std::io::stderr(),
                    "{tag}: {name} group {nodes:?} at {bw} GB/s, more than 10 % below its \
                     shaping ({want}) but within 20 % of this run's links ({link}): a loaded \
                     machine"
                );
            }
            checked += 1;
        }
        assert!(checked >= 1, "{name}: no group checked\n{stdout}");
    }
    // Each tier slower than the one below it.
    let median = |name: &str| {
        tiers.iter().find(|t| t["tier"] == name).unwrap()["sizes"][0]["max"]
            .as_f64()
            .unwrap()
    };
    assert!(median("local_block") > median("network_block"), "{stdout}");
    assert!(median("network_block") > median("hpc_island"), "{stdout}");
    // The pairwise matrix: 28 pairs in 7 rounds.
    let m = &report["tier_report"]["matrix"];
    assert_eq!(m["rounds"], 7);
    assert_eq!(m["links"].as_array().unwrap().len(), 28);
    // The text: tier table and verdict after the main table.
    let footer = stdout.find("# Avg bus bandwidth").expect("main table");
    let table = stdout.find("# Topology tiers").expect("tier table");
    let verdict = stdout.find("# Verdict: ").expect("verdict");
    assert!(footer < table && table < verdict, "{stdout}");
    drop(cluster);
    (codes[0], stdout, report["tier_report"].clone())
}

fn port(n: u16) -> u16 {
    30000 + (std::process::id() % 1000) as u16 * 8 + n
}

/// Runs the gate on `cluster` with `extra` flags, expecting every rank to fail it (exit 7):
/// rank 0's stdout and report.
fn failing_gate(cluster: &Cluster, tag: &str, port: u16, extra: &[&str]) -> (String, Value) {
    let out_json = tmp(&format!("{tag}.json"));
    let start = Instant::now();
    let outs = cluster.run(port, &out_json, extra);
    let secs = start.elapsed().as_secs_f64();
    let stdout = text(&outs[0].stdout);
    let all: String = outs
        .iter()
        .map(|o| format!("{}{}", text(&o.stdout), text(&o.stderr)))
        .collect();
    let _ = writeln!(std::io::stderr(), "{tag}: {secs:.1} s\n{stdout}");
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
    assert!(
        codes.iter().all(|c| *c == Some(7)),
        "the gate fails: {codes:?}\n{all}"
    );
    (stdout, json(&out_json.with_extension("0.json")))
}

/// `--pairwise adaptive` (issue 39): one round across the widest tier, then the throttled
/// node's pairs again with nodes measured good: it is named, nobody else is, in a few
/// rounds rather than the round robin's 7.
#[test]
fn adaptive_pairing_names_the_throttled_node_in_a_few_rounds() {
    if !can_run_netns("adaptive_pairing_names_the_throttled_node_in_a_few_rounds") {
        return;
    }
    let _serial = SHAPED.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up("ada", Some(3));
    let (stdout, report) = failing_gate(&cluster, "ada", port(3), &["--pairwise", "adaptive"]);
    let t = &report["tier_report"];
    let suspects: Vec<&str> = t["verdict"]["suspect_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap())
        .collect();
    assert_eq!(suspects, ["node3"], "{stdout}");
    assert!(
        t["verdict"]["slow_links"].as_array().unwrap().is_empty(),
        "{stdout}"
    );
    let rounds = t["matrix"]["rounds"].as_u64().unwrap();
    let links = t["matrix"]["links"].as_array().unwrap().len();
    assert!((2..=4).contains(&rounds), "{rounds} rounds: {stdout}");
    assert!(links < 28, "{links} pairs measured, not all 28: {stdout}");
    drop(cluster);
}

#[test]
fn verdict_names_the_throttled_node_and_nobody_else() {
    if !can_run_netns("verdict_names_the_throttled_node_and_nobody_else") {
        return;
    }
    let (code, stdout, t) = tiers_job("thr", Some(5), port(1));
    let v = &t["verdict"];
    let suspects: Vec<&str> = v["suspect_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap())
        .collect();
    assert_eq!(suspects, ["node5"], "{stdout}");
    assert!(v["slow_links"].as_array().unwrap().is_empty(), "{stdout}");
    let s = &v["suspect_nodes"][0];
    assert_eq!(s["slow_links"], 7, "{stdout}");
    let ratio = s["measured"].as_f64().unwrap() / s["expected"].as_f64().unwrap();
    assert!(
        within(ratio, 0.5, 0.15),
        "node5 at {ratio} of expected\n{stdout}"
    );
    assert!(stdout.contains("# Verdict: FAIL"), "{stdout}");
    assert!(
        stdout.contains("suspect node node5: 7 of 7 links slow"),
        "{stdout}"
    );
    // The groups that hold node5 fell short and were cut in halves, from figures the
    // closer tier had measured (and judged: node5's local block is short among local
    // blocks, though it delivers what a network block should): down to that block.
    assert!(
        stdout.contains("tier network_block group island0/nb1 fell short (")
            && stdout.contains("narrowed to node4, node5 (single nodes are not measured alone)"),
        "{stdout}"
    );
    let nb = &t["tiers"][3];
    assert_eq!(nb["tier"], "network_block");
    let halves = nb["halves"].as_array().unwrap();
    assert!(
        halves
            .iter()
            .all(|h| h["from"] == "local_block" || h["busbw"].is_null()),
        "{halves:?}"
    );
    assert_eq!(code, Some(7), "{stdout}");
}

#[test]
fn verdict_names_nobody_on_a_healthy_fabric() {
    if !can_run_netns("verdict_names_nobody_on_a_healthy_fabric") {
        return;
    }
    let (code, stdout, t) = tiers_job("ok", None, port(2));
    let v = &t["verdict"];
    assert!(
        v["suspect_nodes"].as_array().unwrap().is_empty(),
        "{stdout}"
    );
    assert!(v["slow_links"].as_array().unwrap().is_empty(), "{stdout}");
    assert!(stdout.contains("# Verdict: PASS"), "{stdout}");
    // No group fell short, so none was cut in halves.
    for tier in t["tiers"].as_array().unwrap() {
        assert!(
            tier["halves"].as_array().unwrap().is_empty(),
            "{tier}\n{stdout}"
        );
    }
    // Links match their tier's shaping too.
    for l in t["matrix"]["links"].as_array().unwrap() {
        let want = match l["tier"].as_str().unwrap() {
            "local_block" => goodput(RATES_MBIT[0]),
            "network_block" => goodput(RATES_MBIT[1]),
            "hpc_island" => goodput(RATES_MBIT[2]),
            other => panic!("link tier {other}: {stdout}"),
        };
        let bw = l["busbw"].as_f64().unwrap();
        let tier = l["tier"].as_str().unwrap();
        let link = median_link(&t, tier, None);
        assert!(
            shaped_rate(bw, want, link),
            "{l}: shaped {want}, this run's median {tier} link {link}\n{stdout}"
        );
    }
    assert_eq!(code, Some(0), "{stdout}");
    let _ = Duration::from_secs(0);
}

/// `--budget` (issue 39): a probe prices a round, the adaptive rounds run, and what the sweeps
/// left measures the pairs not yet measured: on 8 nodes all 28, so a link between two healthy
/// nodes, throttled while the cluster runs, is found, measured again, and named alone.
#[test]
fn a_budget_buys_the_whole_matrix_and_a_throttled_link_is_named() {
    if !can_run_netns("a_budget_buys_the_whole_matrix_and_a_throttled_link_is_named") {
        return;
    }
    let _serial = SHAPED.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up("bud", None);
    // node2 and node6 sit in different network blocks (50 Mbit/s): 15 Mbit/s both ways.
    cluster.shape("throttle-link", &["2", "6", "15mbit"]);
    let (stdout, report) = failing_gate(&cluster, "bud", port(4), &["--budget", "90s"]);
    let t = &report["tier_report"];
    let v = &t["verdict"];
    let links: Vec<(String, String)> = v["slow_links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["a"].as_str().unwrap().into(),
                l["b"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = [("node2".to_string(), "node6".to_string())];
    assert!(
        links == want || links == [(want[0].1.clone(), want[0].0.clone())],
        "{links:?}\n{stdout}"
    );
    assert!(
        v["suspect_nodes"].as_array().unwrap().is_empty(),
        "{stdout}"
    );
    assert!(v["stragglers"].as_array().unwrap().is_empty(), "{stdout}");
    let budget = t["matrix"]["budget"].as_str().unwrap_or_default();
    assert!(budget.contains("28 of 28 pairs"), "{budget}\n{stdout}");
    // What the budget bought, under the matrix's header.
    assert!(stdout.contains("#   budget 90 s:"), "{stdout}");
    let findings = &report["verdict"]["findings"];
    assert_eq!(findings[0]["kind"], "slow_link", "{findings}");
    drop(cluster);
}

/// A slow uplink (issue 39's faults of the tier tree): node6 and node7's local block reaches
/// the rest of the fabric at 15 Mbit/s both ways, and itself at full rate. Pair by pair both
/// nodes look slow; the verdict names the block's uplink instead, and no node or link.
#[test]
fn a_block_with_a_slow_uplink_is_named_and_not_its_nodes() {
    if !can_run_netns("a_block_with_a_slow_uplink_is_named_and_not_its_nodes") {
        return;
    }
    let _serial = SHAPED.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up("upl", None);
    cluster.shape("throttle-uplink", &["6", "15mbit"]);
    let (stdout, report) = failing_gate(&cluster, "upl", port(6), &[]);
    let v = &report["tier_report"]["verdict"];
    let up = v["slow_uplinks"].as_array().unwrap();
    assert_eq!(up.len(), 1, "{stdout}");
    assert_eq!(up[0]["tier"], "local_block", "{stdout}");
    assert_eq!(
        up[0]["nodes"],
        serde_json::json!(["node6", "node7"]),
        "{stdout}"
    );
    assert!(
        v["suspect_nodes"].as_array().unwrap().is_empty(),
        "{stdout}"
    );
    assert!(v["slow_links"].as_array().unwrap().is_empty(), "{stdout}");
    assert!(v["stragglers"].as_array().unwrap().is_empty(), "{stdout}");
    assert!(
        stdout.contains("#   slow uplink of local_block"),
        "{stdout}"
    );
    let findings = &report["verdict"]["findings"];
    assert_eq!(findings[0]["kind"], "slow_uplink", "{findings}");
    // The network block holding it fell short; each of its halves (its local blocks)
    // delivers: the fault lies between them.
    assert!(
        stdout.contains("tier network_block group island0/nb1 fell short (")
            && stdout.contains("each half delivers (node4, node5 | node6, node7)"),
        "{stdout}"
    );
    drop(cluster);
}

/// Halving (issue 39): one network block of eight nodes, the whole job, under its
/// `--min-busbw-tier` because node5 sends at 30 Mbit/s. No other group of the tier to
/// compare with, so the threshold says short; its halves are measured at once (new groups,
/// at the largest size), the short one is cut again, down to node5's local block.
#[test]
fn a_group_under_its_threshold_is_cut_in_halves_down_to_the_slow_block() {
    if !can_run_netns("a_group_under_its_threshold_is_cut_in_halves_down_to_the_slow_block") {
        return;
    }
    let _serial = SHAPED.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up_blocks("hlv", None, "2,8");
    cluster.shape("throttle", &["5", "30mbit"]);
    let (stdout, report) = failing_gate(
        &cluster,
        "hlv",
        port(7),
        &["--min-busbw-tier", "network_block=0.011"],
    );
    let t = &report["tier_report"];
    let nb = t["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["tier"] == "network_block")
        .unwrap();
    let halves: Vec<(u64, String, bool, Option<String>)> = nb["halves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            let nodes: Vec<&str> = h["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap())
                .collect();
            (
                h["round"].as_u64().unwrap(),
                nodes.join(","),
                h["short"].as_bool().unwrap(),
                h["from"].as_str().map(String::from),
            )
        })
        .collect();
    let want = [
        (1, "node0,node1,node2,node3".to_string(), false, None),
        (1, "node4,node5,node6,node7".to_string(), true, None),
        (
            2,
            "node4,node5".to_string(),
            true,
            Some("local_block".to_string()),
        ),
        (
            2,
            "node6,node7".to_string(),
            false,
            Some("local_block".to_string()),
        ),
        (3, "node4".to_string(), false, None),
        (3, "node5".to_string(), false, None),
    ];
    assert_eq!(halves, want, "{stdout}");
    assert!(
        stdout.contains("narrowed to node4, node5 (single nodes are not measured alone)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "#   network_block island0/nb0 short, halves (round 1): node0,node1,node2,node3 "
        ),
        "{stdout}"
    );
    let suspects: Vec<&str> = t["verdict"]["suspect_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap())
        .collect();
    assert_eq!(suspects, ["node5"], "{stdout}");
    drop(cluster);
}

/// A node that hangs mid-run (issue 39): its process stopped once the job is up. The gate
/// does not end with the timeout's error: rank 0 gives up on the node within a few `-T`,
/// the rest of the gate runs without it, and the verdict names it unreachable and nothing
/// else. The other ranks exit 7 with the verdict.
#[test]
fn a_node_that_hangs_is_named_unreachable_and_the_rest_is_judged() {
    if !can_run_netns("a_node_that_hangs_is_named_unreachable_and_the_rest_is_judged") {
        return;
    }
    let _serial = SHAPED.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up("hang", None);
    let tag = format!("hang{}", std::process::id());
    let out_json = tmp(&format!("{tag}.json"));
    let start = Instant::now();
    let mut children = cluster.spawn(port(5), &out_json, &["-T", "5"]);
    // Rank 0 writes its report's header once every rank has joined: then node5 stops
    // (its process and the wrapper that started it, all named by its report's path).
    let first = out_json.with_extension("0.json");
    while !first.exists() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let victim = format!("{tag}.5.json");
    let stop = Command::new("pkill")
        .args(["-STOP", "-f", &victim])
        .status()
        .unwrap();
    let stopped_at = start.elapsed().as_secs_f64();
    let mut outs = Vec::new();
    for (i, c) in children.drain(..).enumerate() {
        if i == 5 {
            outs.push(None);
            continue;
        }
        outs.push(Some(c.wait_with_output().unwrap()));
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = Command::new("pkill")
        .args(["-KILL", "-f", &victim])
        .status();
    let all: String = outs
        .iter()
        .flatten()
        .map(|o| format!("{}{}", text(&o.stdout), text(&o.stderr)))
        .collect();
    let stdout = outs[0]
        .as_ref()
        .map(|o| text(&o.stdout))
        .unwrap_or_default();
    let _ = writeln!(
        std::io::stderr(),
        "hang: node5 stopped at {stopped_at:.1} s, verdict at {secs:.1} s\n{all}"
    );
    assert!(
        stop.success(),
        "node5's process was not found to stop\n{all}"
    );
    for (i, o) in outs.iter().enumerate() {
        if let Some(o) = o {
            assert_eq!(o.status.code(), Some(7), "node{i}\n{all}");
        }
    }
    let report = json(&first);
    let v = &report["tier_report"]["verdict"];
    let lost: Vec<&str> = v["unreachable_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["node"].as_str().unwrap())
        .collect();
    assert_eq!(lost, ["node5"], "{stdout}");
    assert!(
        v["suspect_nodes"].as_array().unwrap().is_empty(),
        "{stdout}"
    );
    assert!(v["slow_links"].as_array().unwrap().is_empty(), "{stdout}");
    assert!(stdout.contains("unreachable node node5:"), "{stdout}");
    // The rest was judged without it: its pairs are absent from the matrix, the others'
    // are there.
    let links = report["tier_report"]["matrix"]["links"].as_array().unwrap();
    assert!(!links.is_empty(), "{stdout}");
    assert!(
        links.iter().all(|l| l["a"] != "node5" && l["b"] != "node5"),
        "{stdout}"
    );
    let findings = &report["verdict"]["findings"];
    assert_eq!(findings[0]["kind"], "unreachable_node", "{findings}");
    assert_eq!(findings[0]["subject"], "node5", "{findings}");
    drop(cluster);
}
