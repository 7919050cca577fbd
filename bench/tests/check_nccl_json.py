#!/usr/bin/env python3
"""Reads a -J file the way nccl-tests' tools/analyze_perf_json.py does and checks each field it
touches has the type it assumes. Exit 0 and print OK, or exit 1 naming the first problem.

analyze_perf_json.py reads: version; config.iterations, config.aggregated_iterations,
config.devices[].hostname; results[].size; results[].{out_of_place,in_place}_per_iter with
min_us, max_us, avg_us, p99_us, cv_pct (numbers), times_us (list of numbers),
per_process_max_times_us (list of lists; times_us must equal their per-iteration max).
The rest is nccl-tests' util.cu layout: string booleans, padded string root, numbers."""
import json
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def num(v, where):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        fail(f"{where} is {v!r}, not a number")


def main(path):
    with open(path) as f:
        data = json.load(f)
    if data.get("version") != 3:
        fail(f"version {data.get('version')!r} != 3")
    for k in ("start_time", "end_time"):
        if not isinstance(data.get(k), str):
            fail(f"{k} missing or not a string")
    if not isinstance(data.get("args"), list) or not all(isinstance(a, str) for a in data["args"]):
        fail("args is not a list of strings")
    if data.get("env") != []:
        fail("env must be an empty list (no environment dump)")
    cfg = data.get("config")
    if not isinstance(cfg, dict):
        fail("config is not an object")
    for k in ("nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "warmup_iters",
              "iterations", "aggregated_iterations", "validation", "graph", "per_iter_skip"):
        if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool):
            fail(f"config.{k} is {cfg.get(k)!r}, not an integer")
    if ("step_factor" in cfg) == ("step_bytes" in cfg):
        fail("config needs exactly one of step_factor and step_bytes")
    for k in ("blocking_collectives", "per_iter_timing", "parallel_init"):
        if cfg.get(k) not in ("true", "false"):
            fail(f"config.{k} is {cfg.get(k)!r}, not the string true/false")
    devices = cfg.get("devices")
    if not isinstance(devices, list) or not devices:
        fail("config.devices is empty")
    for d in devices:
        for k, t in (("rank", int), ("group", int), ("pid", int), ("hostname", str),
                     ("device", int), ("device_hex", str), ("device_info", str)):
            if not isinstance(d.get(k), t):
                fail(f"device {d!r}: {k} is not {t.__name__}")
    results = data.get("results")
    if not isinstance(results, list) or not results:
        fail("results is empty")
    iters = cfg["iterations"]
    for r in results:
        where = f"result size {r.get('size')!r}"
        for k in ("size", "count", "actual_iterations"):
            if not isinstance(r.get(k), int):
                fail(f"{where}: {k} is not an integer")
        for k in ("type", "redop", "experiment_name"):
            if not isinstance(r.get(k), str):
                fail(f"{where}: {k} is not a string")
        if not isinstance(r.get("root"), str) or len(r["root"]) < 6:
            fail(f"{where}: root {r.get('root')!r} is not nccl-tests' padded string")
        int(r["root"])
        for placement in ("out_of_place", "in_place"):
            m = r.get(placement)
            if not isinstance(m, dict):
                fail(f"{where}: {placement} is not an object")
            for k in ("time", "alg_bw", "bus_bw"):
                num(m.get(k), f"{where}: {placement}.{k}")
            if m.get("nwrong") is not None:
                num(m["nwrong"], f"{where}: {placement}.nwrong")
            per_iter = r.get(placement + "_per_iter", {})
            if not per_iter:
                continue
            for k in ("min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us", "stdev_us", "cv_pct"):
                num(per_iter.get(k), f"{where}: {placement}_per_iter.{k}")
            # The analysis divides by avg_us.
            spike = per_iter["max_us"] / per_iter["avg_us"] if per_iter["avg_us"] > 0 else 0
            num(spike, "spike")
            times = per_iter.get("times_us", [])
            if len(times) != iters:
                fail(f"{where}: {len(times)} times_us for {iters} iterations")
            rows = per_iter.get("per_process_max_times_us", [])
            if rows:
                if len(rows) > len(devices):
                    fail(f"{where}: more process rows than devices")
                n = min(len(t) for t in rows)
                expected = [max(t[i] for t in rows) for i in range(n)]
                if len(times) != len(expected) or any(abs(a - b) >= 0.001 for a, b in zip(times, expected)):
                    fail(f"{where}: times_us is not the max over process rows")
    oob = data.get("out_of_bounds")
    if not isinstance(oob, dict) or not isinstance(oob.get("count"), int) or oob.get("okay") not in ("true", "false"):
        fail(f"out_of_bounds {oob!r}")
    avg = data.get("average_bus_bandwidth")
    if not isinstance(avg, dict) or avg.get("okay") not in ("unchecked", "true", "false"):
        fail(f"average_bus_bandwidth {avg!r}")
    num(avg.get("bandwidth"), "average_bus_bandwidth.bandwidth")
    if not isinstance(data.get("errors"), list):
        fail("errors is not a list")
    print(f"OK {len(results)} results, {len(devices)} devices")


if __name__ == "__main__":
    main(sys.argv[1])
