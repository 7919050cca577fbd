#!/usr/bin/env python3
"""Ring vs double binary tree vs auto AllReduce through the real binary.

Runs `busbw all_reduce_perf --np 8` with --algo ring, tree and auto in alternation (so load
from other processes hits all three alike), repeats, and prints the median out-of-place time
per size and algorithm with the ratios the tree work is judged by: tree/ring (below 1: tree
faster) and auto/best (within 1.10: auto picked well).

Usage: bench/scripts/tree_vs_ring.py [--reps N] [--np N] [--bin PATH]
"""
import argparse
import os
import statistics
import subprocess
import sys

# (first size, last size, -n iterations): small sizes need many iterations for a stable
# time, large ones few (each 64 MiB op on 8 ranks takes a good fraction of a second here).
SWEEPS = [("8", "32K", 100), ("256K", "16M", 5), ("64M", "64M", 2)]
ALGOS = ["ring", "tree", "auto"]


def run(binary, np_, algo, first, last, iters):
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_ALGO", "RANK", "WORLD_SIZE")}
    out = subprocess.run(
        [binary, "all_reduce_perf", "--np", str(np_), "-b", first, "-e", last, "-f", "8",
         "-n", str(iters), "-w", "2", "-c", "0", "--algo", algo],
        check=True, capture_output=True, text=True, env=env,
    ).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        rows[int(f[0])] = (float(f[5]), f[-1] if algo == "auto" else algo)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--np", type=int, default=8)
    ap.add_argument("--bin", default="target/release/busbw")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"{a.bin} not found: run `cargo build --release -p busbw` first")
    times = {}   # (algo, size) -> [us]
    picks = {}   # size -> set of algorithms auto chose
    for rep in range(a.reps):
        for first, last, iters in SWEEPS:
            order = ALGOS[rep % 3:] + ALGOS[:rep % 3]
            for algo in order:
                for size, (t, chosen) in run(a.bin, a.np, algo, first, last, iters).items():
                    times.setdefault((algo, size), []).append(t)
                    if algo == "auto":
                        picks.setdefault(size, set()).add(chosen)
        print(f"# rep {rep + 1}/{a.reps} done", file=sys.stderr)
    sizes = sorted({s for _, s in times})
    print(f"np={a.np}, reps={a.reps}, medians of out-of-place time (us)\n")
    print("| size (B) | ring | tree | auto | tree/ring | auto/best | auto chose |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for s in sizes:
        m = {al: statistics.median(times[(al, s)]) for al in ALGOS}
        best = min(m["ring"], m["tree"])
        print(f"| {s} | {m['ring']:.1f} | {m['tree']:.1f} | {m['auto']:.1f} | "
              f"{m['tree'] / m['ring']:.2f} | {m['auto'] / best:.2f} | {','.join(sorted(picks[s]))} |")


if __name__ == "__main__":
    main()
