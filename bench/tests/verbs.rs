//! The binary and RDMA: `busbw doctor` on fake sysfs trees and on this host, and
//! `--transport verbs` failing fast (or, on a host with a usable RDMA port, running).

mod common;
use common::{busbw, run, text};

use busbw_transports::verbs::sysfs::fake;
use std::io::Write;

use std::time::{Duration, Instant};

/// Whether this busbw has the verbs transport (the doctor says when it has not).
fn built_with_verbs() -> bool {
    let root = fake::tempdir("probe");
    let out = run(&["doctor", "--sysfs-root", root.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(root);
    !text(&out.stdout).contains("built without the `verbs` feature")
}

fn host_has_rdma_devices() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn doctor_reports_a_fake_host() {
    let root = fake::tempdir("bin-doctor");
    fake::roce_port(&root, "mlx5_0", "ens1f0", [10, 9, 8, 7]);
    fake::roce_port(&root, "mlx5_1", "ens1f1", [10, 9, 8, 8]);
    fake::port(&root, "mlx5_2", 1, "Ethernet", "1: DOWN", &[]);
    let out = run(&[
        "doctor",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--local-rank",
        "1",
    ]);
    let t = text(&out.stdout);
    for want in [
        "mlx5_0  node 1: CA",
        "port 1: ACTIVE (LinkUp), link layer Ethernet",
        "3  RoCE v2     ::ffff:10.9.8.7  ens1f0  <- chosen",
        "usable ports: mlx5_0:1, mlx5_1:1",
        "local rank 0 -> mlx5_0:1, local rank 1 -> mlx5_1:1",
        "advice: mlx5_2:1 is DOWN",
    ] {
        assert!(t.contains(want), "missing {want:?}:\n{t}");
    }
    // Usable ports, but this host's libibverbs (or the build) cannot use them.
    if !host_has_rdma_devices() {
        assert_eq!(out.status.code(), Some(1), "{t}");
    }
    let out = run(&[
        "doctor",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--ib-hca",
        "^mlx5_0",
    ]);
    let t = text(&out.stdout);
    assert!(t.contains("usable ports: mlx5_1:1\n"), "{t}");
    assert!(
        t.contains("advice: mlx5_0:1 is excluded by NCCL_IB_HCA"),
        "{t}"
    );
    let out = run(&[
        "doctor",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--ib-hca",
        "mlx5_0:x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not a port number"),
        "{}",
        text(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn doctor_on_this_host() {
    let out = run(&["doctor"]);
    let t = text(&out.stdout);
    if host_has_rdma_devices() {
        // Straight to stderr: the harness captures eprintln!, and a skip must show.
        let _ = writeln!(
            std::io::stderr(),
            "skipping doctor_on_this_host's no-device checks: this host has RDMA devices"
        );
        assert!(t.starts_with("RDMA devices"), "{t}");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "no usable port: exit 1\n{t}");
    assert!(
        t.starts_with("no RDMA devices: /sys/class/infiniband is missing or empty"),
        "{t}"
    );
    if built_with_verbs() {
        assert!(t.contains("libibverbs: "), "{t}");
    } else {
        assert!(t.contains("built without the `verbs` feature"), "{t}");
    }
}

#[test]
fn transport_verbs_fails_fast_or_runs() {
    let start = Instant::now();
    let out = run(&[
        "all_reduce_perf",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "2",
        "--transport",
        "verbs",
        "-T",
        "60",
    ]);
    let took = start.elapsed();
    let stderr = text(&out.stderr);
    let usable = run(&["doctor"]).status.code() == Some(0);
    if usable {
        let _ = writeln!(
            std::io::stderr(),
            "transport_verbs_fails_fast_or_runs: this host has a usable RDMA port, running over verbs"
        );
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        assert!(stdout.contains("host memory via verbs ["), "{stdout}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "a usage/setup error: {stderr}");
    assert!(took < Duration::from_secs(10), "fails fast, took {took:?}");
    assert!(out.stdout.is_empty(), "no table: {}", text(&out.stdout));
    assert!(!stderr.contains("panicked"), "{stderr}");
    let want = if built_with_verbs() {
        if host_has_rdma_devices() {
            "no usable RDMA port"
        } else {
            "ibv_get_device_list failed"
        }
    } else {
        "built without the `verbs` feature"
    };
    assert!(
        stderr.contains("--transport verbs: ") && stderr.contains(want),
        "{want}: {stderr}"
    );
}

#[test]
fn bad_ib_settings_are_usage_errors() {
    let out = run(&[
        "all_reduce_perf",
        "--transport",
        "verbs",
        "--ib-hca",
        "=",
        "-b",
        "8",
        "-e",
        "8",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("names no device"),
        "{}",
        text(&out.stderr)
    );
    let out = busbw()
        .args([
            "all_reduce_perf",
            "--transport",
            "verbs",
            "-b",
            "8",
            "-e",
            "8",
        ])
        .env("NCCL_IB_QPS_PER_CONNECTION", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("NCCL_IB_QPS_PER_CONNECTION=0"),
        "{}",
        text(&out.stderr)
    );
}
